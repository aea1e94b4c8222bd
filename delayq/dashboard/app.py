"""The dashboard's pages and actions. Server-rendered with Jinja2 (autoescaped), one small
script for live counts and confirmations, no build step.

Pages only read, through :class:`~delayq.admin.Admin`; actions are POSTs that carry the
CSRF token and go through :mod:`delayq.admin.operate`, like the CLI's. Page handlers are plain
functions, so Starlette runs them (and their blocking Redis calls) in its thread pool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import URL, FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from delayq.admin import operate
from delayq.admin.inspect import Admin, PageState
from delayq.admin.metrics import QueueCollector
from delayq.admin.present import (
    controls_text,
    first_line,
    human_seconds,
    one_line,
    payload_text,
    preview,
    relative,
    timestamp,
)
from delayq.dashboard.auth import (
    CSRF_FIELD,
    CSRF_HEADER,
    Secrets,
    TokenAuth,
    local_path,
    same_origin,
)
from delayq.dashboard.charts import (
    HISTORY_WINDOWS,
    WINDOWS,
    history_charts,
    late_text,
    lateness_chart,
    timeline_chart,
)
from delayq.errors import ConnectionFailed, DelayqError, InvalidTaskError
from delayq.queue import Queue
from delayq.task import TaskInfo

PAGE = 50
NAMES_TTL = 10.0  # seconds a discovered queue list is reused


class Dashboard:
    def __init__(self, admin: Admin, secrets: Secrets, read_only: bool) -> None:
        self.admin = admin
        self.secrets = secrets
        self.read_only = read_only
        self.env = Environment(
            loader=PackageLoader("delayq.dashboard", "templates"),
            autoescape=select_autoescape(default=True),
        )
        self.env.filters.update(
            human=human_seconds,
            preview=preview,
            pretty=payload_text,
            one_line=one_line,
            reason=first_line,
            ts=timestamp,
            late=late_text,
        )
        self.env.globals.update(controls_text=controls_text)
        self.registry = CollectorRegistry()
        self.registry.register(QueueCollector(admin, self.names))
        self._names: tuple[float, list[str]] = (0.0, [])
        self._lock = threading.Lock()

    # -- helpers -------------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The queues shown: those given at start, else those found (cached briefly)."""
        if self.admin.explicit:
            return list(self.admin.explicit)
        with self._lock:
            at, names = self._names
            if time.monotonic() - at > NAMES_TTL:
                names = self.admin.discover()
                self._names = (time.monotonic(), names)
            return list(names)

    def queue(self, name: str) -> Queue:
        if self.admin.explicit and name not in self.admin.explicit:
            raise HTTPException(404, f"queue {name!r} is not shown by this dashboard")
        try:
            return self.admin.queue(name)
        except ValueError:
            raise HTTPException(404, "no such queue") from None

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> HTMLResponse:
        now = context.get("now")
        html = self.env.get_template(template).render(
            request=request,
            read_only=self.read_only,
            csrf=self.secrets.csrf,
            where=self.admin.where,
            msg=request.query_params.get("msg", ""),
            here=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            rel=(lambda when: relative(when, now)) if now is not None else (lambda when: "-"),
            **context,
        )
        return HTMLResponse(html, status_code=status)

    @staticmethod
    def _offset(request: Request) -> int:
        try:
            return max(0, int(request.query_params.get("offset", "0")))
        except ValueError:
            return 0

    # -- pages -------------------------------------------------------------------------------------

    def overview(self, request: Request) -> HTMLResponse:
        overviews = self.admin.overviews(self.names())
        now = overviews[0].stats.now if overviews else None
        return self.render(request, "overview.html", title="Queues", overviews=overviews, now=now)

    def api_queues(self, request: Request) -> JSONResponse:
        """Live counts for the overview's script: display strings, formatted here."""
        out = []
        for ov in self.admin.overviews(self.names()):
            s = ov.stats
            out.append(
                {
                    "queue": ov.name,
                    "scheduled": str(s.scheduled),
                    "due": str(s.due),
                    "active": str(s.active),
                    "dead": str(s.dead),
                    "oldest": human_seconds(s.oldest_due_age) if s.due else "-",
                    "next": relative(s.next_due_at, s.now),
                    "workers": str(len(ov.live_workers)),
                    "controls": controls_text(ov.paused, ov.rate_limit, ov.throttle_backlog),
                }
            )
        return JSONResponse(out)

    def queue_page(self, request: Request) -> HTMLResponse:
        q = self.queue(request.path_params["name"])
        window = request.query_params.get("window", "1h")
        if window not in WINDOWS:
            window = "1h"
        ov = self.admin.overview(q.name)
        timeline = self.admin.timeline(q.name, *WINDOWS[window])
        late, summary = lateness_chart(self.admin.finished(q.name, 500))
        past = request.query_params.get("history", "1h")
        if past not in HISTORY_WINDOWS:
            past = "1h"
        outcomes, lateness, whole = history_charts(self.admin.history(q.name), past)
        upcoming = self.admin.tasks(q.name, "scheduled", 0, 10)
        # Kinds no live worker has a handler for: workers hand their tasks back until their
        # unknown_kind_grace ends, then bury them (docs/concepts.md).
        handled = {k for w in ov.live_workers for k in w.kinds}
        unhandled = sorted({t.kind for t in upcoming} - handled) if ov.live_workers else []
        return self.render(
            request,
            "queue.html",
            title=q.name,
            ov=ov,
            s=ov.stats,
            now=ov.stats.now,
            windows=list(WINDOWS),
            window=window,
            timeline=timeline_chart(timeline),
            later=timeline.later,
            late=late,
            summary=summary,
            histories=list(HISTORY_WINDOWS),
            past=past,
            outcomes=outcomes,
            lateness=lateness,
            whole=whole,
            upcoming=upcoming,
            unhandled=unhandled,
            handed_back=ov.stats.counters.get("unknown_kind", 0),
        )

    def api_history(self, request: Request) -> JSONResponse:
        """The queue's per-minute history (every shard's summed): each minute that had
        outcomes, oldest first, with its counts and start lateness p50/p99 in seconds."""
        q = self.queue(request.path_params["name"])
        return JSONResponse({"queue": q.name, **self.admin.history(q.name).as_dict()})

    def _page(
        self, request: Request, name: str, state: str
    ) -> tuple[list[TaskInfo], int, str | None, str | None]:
        """(tasks, offset, cursor of this page, cursor of the next): keyset paging by the
        ``after`` cursor; an old ``?offset=`` link still reads by offset."""
        offset = self._offset(request)
        after = request.query_params.get("after") or None
        if offset and after is None and state != "aborted":  # (no offset link ever had it)
            if state == "dead":
                return self.admin.dead(name, offset, PAGE), offset, None, None
            running: PageState = "active" if state == "active" else "scheduled"
            return self.admin.tasks(name, running, offset, PAGE), offset, None, None
        page = self.admin.page(name, state, PAGE, after)
        return page.tasks, 0, after, page.next

    def tasks_page(self, request: Request) -> HTMLResponse:
        """Waiting, running or aborted tasks (the last part of the path says which)."""
        q = self.queue(request.path_params["name"])
        state = request.url.path.rsplit("/", 1)[-1]
        ov = self.admin.overview(q.name)
        tasks, offset, after, next_after = self._page(request, q.name, state)
        total = getattr(ov.stats, state)
        return self.render(
            request,
            "tasks.html",
            title=f"{q.name}: {state}",
            ov=ov,
            state=state,
            tasks=tasks,
            total=total,
            offset=offset,
            page=PAGE,
            after=after,
            next_after=next_after,
            now=ov.stats.now,
        )

    def dead_page(self, request: Request) -> HTMLResponse:
        q = self.queue(request.path_params["name"])
        stats = q.stats()
        tasks, offset, after, next_after = self._page(request, q.name, "dead")
        return self.render(
            request,
            "dead.html",
            title=f"{q.name}: dead",
            queue=q.name,
            tasks=tasks,
            total=stats.dead,
            offset=offset,
            page=PAGE,
            after=after,
            next_after=next_after,
            now=stats.now,
        )

    def cron_page(self, request: Request) -> HTMLResponse:
        q = self.queue(request.path_params["name"])
        schedules = q.schedules()
        stats = q.stats()
        return self.render(
            request,
            "cron.html",
            title=f"{q.name}: cron",
            queue=q.name,
            schedules=schedules,
            now=stats.now,
        )

    def task_page(self, request: Request) -> HTMLResponse:
        task_id = request.query_params.get("id", "").strip()
        queue = request.query_params.get("queue", "")
        names = self.names()
        found, error = [], ""
        if task_id:
            try:
                found = self.admin.find_task(task_id, [self.queue(queue).name] if queue else names)
            except InvalidTaskError as e:
                error = str(e)
            if not found and not error:
                error = "no task with this id" + (f" in {queue}" if queue else " in any queue")
        now = self.admin.queue(found[0].queue).stats().now if found else None
        return self.render(
            request,
            "task.html",
            title="Task lookup",
            names=names,
            task_id=task_id,
            queue=queue,
            found=found,
            error=error,
            now=now,
            status=404 if error else 200,
        )

    def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    # -- actions -------------------------------------------------------------------------------

    async def _act(
        self, request: Request, work: Callable[[Queue, list[str], FormData], str]
    ) -> Response:
        if self.read_only:
            return PlainTextResponse("403 this dashboard is read-only\n", status_code=403)
        form = await request.form()
        token = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
        if not same_origin(request) or not self.secrets.is_csrf(
            token if isinstance(token, str) else None
        ):
            return PlainTextResponse(
                "403 missing or wrong CSRF token; reload the page\n", status_code=403
            )
        q = self.queue(request.path_params["name"])
        ids = [i for i in form.getlist("id") if isinstance(i, str) and i]
        try:
            message = await run_in_threadpool(work, q, ids, form)
        except InvalidTaskError as e:
            message = str(e)
        return RedirectResponse(
            _back(form.get("next"), f"/queues/{q.name}", message), status_code=303
        )

    async def replay(self, request: Request) -> Response:
        def work(q: Queue, ids: list[str], form: FormData) -> str:
            if not ids and form.get("all") != "1":
                return "nothing selected"
            n = operate.replay_dead(q, ids or None)
            return f"replayed {n} task(s)"

        return await self._act(request, work)

    async def purge(self, request: Request) -> Response:
        def work(q: Queue, ids: list[str], form: FormData) -> str:
            if not ids and form.get("all") != "1":
                return "nothing selected"
            n = operate.purge_dead(q, ids or None)
            return f"deleted {n} dead task(s)"

        return await self._act(request, work)

    async def pause(self, request: Request) -> Response:
        return await self._act(request, lambda q, _ids, _f: _paused(q, True))

    async def resume(self, request: Request) -> Response:
        return await self._act(request, lambda q, _ids, _f: _paused(q, False))

    async def cancel(self, request: Request) -> Response:
        return await self._act(
            request, lambda q, ids, _f: "; ".join(operate.cancel(q, i).message for i in ids)
        )

    async def abort(self, request: Request) -> Response:
        return await self._act(
            request, lambda q, ids, _f: "; ".join(operate.abort(q, i).message for i in ids)
        )

    async def run_now(self, request: Request) -> Response:
        return await self._act(
            request, lambda q, ids, _f: "; ".join(operate.run_now(q, i).message for i in ids)
        )


def _paused(q: Queue, pause: bool) -> str:
    changed = q.pause() if pause else q.resume()
    state = "paused" if pause else "resumed"
    return f"queue {q.name} {state}" if changed else f"queue {q.name} was already {state}"


def _back(target: Any, default: str, message: str) -> str:
    """Where to go after an action: a path of this site only (``auth.local_path``)."""
    url = URL(local_path(target) or default).remove_query_params("msg")
    return str(url.include_query_params(msg=message))


def create_app(admin: Admin, *, token: str, read_only: bool = False) -> Starlette:
    """The dashboard as an ASGI app (all of it, /metrics included, behind the token)."""
    secrets = Secrets(token)
    dash = Dashboard(admin, secrets, read_only)

    async def unreachable(request: Request, exc: Exception) -> Response:
        return dash.render(
            request, "error.html", status=503, title="Redis unreachable", error=str(exc)
        )

    async def failed(request: Request, exc: Exception) -> Response:
        return dash.render(request, "error.html", status=500, title="Error", error=str(exc))

    async def bad_request(request: Request, exc: Exception) -> Response:
        """A request the page cannot answer (a bad page cursor, say): the user's, not ours."""
        return dash.render(request, "error.html", status=400, title="Bad request", error=str(exc))

    async def not_found(request: Request, exc: Exception) -> Response:
        detail = exc.detail if isinstance(exc, HTTPException) else "not found"
        code = exc.status_code if isinstance(exc, HTTPException) else 404
        return dash.render(request, "error.html", status=code, title="Not found", error=detail)

    routes = [
        Route("/", dash.overview),
        Route("/api/queues", dash.api_queues),
        Route("/api/queues/{name}/history", dash.api_history),
        Route("/task", dash.task_page),
        Route("/metrics", dash.metrics),
        Route("/favicon.ico", lambda _request: Response(status_code=204)),
        Route("/queues/{name}", dash.queue_page),
        Route("/queues/{name}/scheduled", dash.tasks_page),
        Route("/queues/{name}/active", dash.tasks_page),
        Route("/queues/{name}/aborted", dash.tasks_page),
        Route("/queues/{name}/dead", dash.dead_page),
        Route("/queues/{name}/cron", dash.cron_page),
        Route("/queues/{name}/dead/replay", dash.replay, methods=["POST"]),
        Route("/queues/{name}/dead/purge", dash.purge, methods=["POST"]),
        Route("/queues/{name}/task/cancel", dash.cancel, methods=["POST"]),
        Route("/queues/{name}/task/run-now", dash.run_now, methods=["POST"]),
        Route("/queues/{name}/pause", dash.pause, methods=["POST"]),
        Route("/queues/{name}/resume", dash.resume, methods=["POST"]),
        Route("/queues/{name}/task/abort", dash.abort, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[("delayq.dashboard", "static")]), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(TokenAuth, secrets=secrets)],
        exception_handlers={
            ConnectionFailed: unreachable,
            InvalidTaskError: bad_request,
            DelayqError: failed,
            HTTPException: not_found,
        },
    )
    app.state.dashboard = dash
    return app
