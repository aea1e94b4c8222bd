"""The HTTP API's routes, the token, the handlers, and :func:`create_app`.

Every handler uses the public Python API (one :class:`~delayq.queue.AsyncQueue` per queue
name, see ``queues.py``); whatever it refuses comes back as a problem (``problems.py``).
Routing on the raw path and reading bodies with a cap are in ``wire.py``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import replace as replace_spec
from datetime import datetime
from typing import Any

import redis.asyncio as aredis
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from delayq.admin.inspect import overview_of, overview_ops
from delayq.admin.present import task_dict
from delayq.connection import RETRIES, async_client, resolve_url
from delayq.errors import (
    ConfigurationError,
    ConnectionFailed,
    DelayqError,
    InvalidTaskError,
)
from delayq.expiring.ops import validate_key
from delayq.http import batch, idempotency, schemas, typed, wire
from delayq.http.coalesce import Coalescer
from delayq.http.docs import Docs
from delayq.http.openapi import document
from delayq.http.problems import Problem, field_error, from_error, invalid
from delayq.http.queues import Queues, protocol_version
from delayq.http.wire import Handler, Reply, Request
from delayq.keys import DEFAULT_PREFIX
from delayq.queue import AsyncQueue
from delayq.spec import TaskType, new_task_ids, validate_task_id
from delayq.task import Scheduled, TaskInfo
from delayq.timing import ms_to_datetime
from delayq.web.tokens import Token

log = logging.getLogger("delayq.http")

MIN_TOKEN = 16
MAX_BODY = 1024 * 1024  # bytes of a request body (a batch: MAX_BATCH_BODY)
MAX_BATCH_BODY = 16 * 1024 * 1024


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


class Api:
    """The routes and their handlers (see :func:`create_app`)."""

    def __init__(
        self,
        queues: Queues,
        token: str | Token,
        *,
        max_body: int = MAX_BODY,
        max_batch_body: int = MAX_BATCH_BODY,
        task_types: typed.Types | None = None,
    ) -> None:
        self.queues = queues
        self.task_types = task_types or {}
        self.coalescer = Coalescer()
        self._token = token if isinstance(token, Token) else _token(token)
        self.max_body = max_body
        self.max_batch_body = max_batch_body
        self._openapi = wire.encode(document(self.task_types))
        self.docs = Docs()
        # (segments with {params}, method -> handler, needs the token, body limit)
        q = "{queue}"
        self.routes: list[tuple[tuple[str, ...], dict[str, Handler], bool, int]] = [
            (("healthz",), {"GET": self.healthz}, False, 0),
            (("openapi.json",), {"GET": self.openapi}, False, 0),
            (("readyz",), {"GET": self.readyz}, True, 0),
            (("v1", "queues", q), {"GET": self.stats}, True, 0),
            (("v1", "queues", q, "tasks"), {"POST": self.schedule}, True, max_body),
            (
                ("v1", "queues", q, "tasks", "batch"),
                {"POST": self.schedule_batch},
                True,
                max_batch_body,
            ),
            (
                ("v1", "queues", q, "tasks", "{id}"),
                {"GET": self.get, "DELETE": self.cancel, "PATCH": self.reschedule},
                True,
                max_body,
            ),
            (
                ("v1", "queues", q, "expiring", "{key}"),
                {"PUT": self.set_key, "DELETE": self.delete_key},
                True,
                max_body,
            ),
            (
                ("v1", "queues", q, "expiring", "{key}", "touch"),
                {"POST": self.touch_key},
                True,
                max_body,
            ),
            # Last: no request of the API's own routes looks at them (docs.py).
            (("docs",), {"GET": self.docs_page}, False, 0),
            (("docs", "{name}"), {"GET": self.docs_file}, False, 0),
            (("docs", "{folder}", "{name}"), {"GET": self.docs_vendor}, False, 0),
        ]

    # -- the ASGI side --------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":  # served on its own (delayq api)
                await self.lifespan(receive, send)
            return  # (no websockets here)
        try:
            reply = await self.dispatch(scope, receive)
        except Problem as p:
            reply = self.problem(p)
        except Exception as e:
            reply = self.problem(_problem_of(e, scope))
        headers = [(b"content-length", str(len(reply.body)).encode())]
        if reply.body:
            headers.append((b"content-type", reply.media))
        if reply.headers:
            headers += [(k.encode(), v.encode()) for k, v in reply.headers.items()]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        # HEAD: the GET's headers (its Content-Length too), without the body (RFC 9110 9.3.2).
        body = b"" if scope["method"] == "HEAD" else reply.body
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def problem(p: Problem) -> Reply:
        reply = Reply(p.status)
        reply.body = p.encode()
        reply.media = wire.PROBLEM_MEDIA
        reply.headers = p.headers
        return reply

    async def dispatch(self, scope: Scope, receive: Receive) -> Reply:
        try:
            segments = wire.split_path(scope)
        except UnicodeDecodeError:  # (/tasks/%FF: refused, once the token is checked)
            segments = wire.split_path(scope, errors="surrogateescape")
            if segments[:1] == ["v1"]:
                self.authorize(scope)
            raise wire.not_utf8(scope, segments, [r[0] for r in self.routes]) from None
        under_v1 = bool(segments) and segments[0] == "v1"
        if under_v1:
            self.authorize(scope)
        for pattern, methods, private, limit in self.routes:
            params = wire.match(pattern, segments)
            if params is None:
                continue
            method = scope["method"]
            handler = methods.get("GET" if method == "HEAD" else method)
            if handler is None:
                allowed = ", ".join([*methods, "HEAD"] if "GET" in methods else methods)
                raise Problem(
                    "method-not-allowed",
                    f"{scope['method']} is not allowed on {scope['path']}: use {allowed}",
                    headers={"allow": allowed},
                )
            if private and not under_v1:
                self.authorize(scope)
            body = await wire.read_body(scope, receive, limit) if limit else b""
            return await handler(Request(scope, params, body))
        raise Problem(
            "not-found",
            f"no route {scope['path']}: the API serves /v1/queues/{{queue}}/..., /healthz, "
            "/readyz, /openapi.json and /docs (the interactive page)",
        )

    def authorize(self, scope: Scope) -> None:
        given = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        if given is None:
            raise Problem(
                "unauthorized",
                "no token: send the header 'Authorization: Bearer TOKEN' with the token the "
                "API was started with (delayq api --token or --token-file)",
                headers={"www-authenticate": 'Bearer realm="delayq"'},
            )
        if not self._token.matches_header(given):
            raise Problem(
                "unauthorized",
                "wrong token: send 'Authorization: Bearer TOKEN' with the token the API was "
                "started with (delayq api --token or --token-file)",
                headers={"www-authenticate": 'Bearer realm="delayq", error="invalid_token"'},
            )

    async def queue(self, request: Request) -> AsyncQueue:
        name = request.params["queue"]
        if not self.queues.valid(name):
            if self.queues.allowed is not None:
                raise Problem("not-found", f"queue {name!r} is not served by this API")
            raise invalid(
                [
                    field_error(
                        "",
                        f"invalid queue name {name!r}: use 1-100 characters from letters, "
                        "digits and '_.:-'",
                    )
                ]
            )
        try:
            return await self.queues.get(name)
        except ConfigurationError as e:
            raise from_error(e) from None

    async def run(self, request: Request, work: Callable[[AsyncQueue], Awaitable[Reply]]) -> Reply:
        """``work`` on the request's queue; a refusal of the queue's shard count (it was
        resharded since it was opened) makes the next request read it again."""
        q = await self.queue(request)
        try:
            return await work(q)
        except ConfigurationError as e:
            self.queues.forget(q.name)
            raise from_error(e) from None

    # -- handlers -------------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Reply:
        return Reply(200, {"status": "ok"})

    async def openapi(self, request: Request) -> Reply:
        reply = Reply(200)
        reply.body = self._openapi
        return reply

    async def docs_page(self, request: Request) -> Reply:
        return self.docs.page()

    async def docs_file(self, request: Request) -> Reply:
        return self.docs.asset(request.params["name"])

    async def docs_vendor(self, request: Request) -> Reply:
        return self.docs.vendor(request.params["folder"], request.params["name"])

    async def readyz(self, request: Request) -> Reply:
        await self.queues.ping()
        out: dict[str, Any] = {"status": "ready"}
        name = request.query_param("queue")
        if name is not None:
            request.params["queue"] = name
            q = await self.queue(request)
            out["queue"] = q.name
            out["protocol_version"] = await protocol_version(q)
        return Reply(200, out)

    async def stats(self, request: Request) -> Reply:
        async def work(q: AsyncQueue) -> Reply:
            replies = await q.runner.run_many(overview_ops(q.shards))
            return Reply(200, overview_of(q.shards, replies).as_dict())

        return await self.run(request, work)

    async def schedule(self, request: Request) -> Reply:
        raw = idempotency.key_of(request.scope)
        if raw is not None:
            return await self.idempotent(request, raw, "tasks", self._schedule)
        return await self._schedule(request, request.json(), None)

    async def schedule_batch(self, request: Request) -> Reply:
        raw = idempotency.key_of(request.scope)
        if raw is not None:
            return await self.idempotent(request, raw, "batch", self._schedule_batch)
        return await self._schedule_batch(request, request.json(), None)

    async def idempotent(
        self,
        request: Request,
        raw: bytes,
        route: str,
        handle: Callable[[Request, Any, str | None], Awaitable[Reply]],
    ) -> Reply:
        """A POST with an ``Idempotency-Key`` (``idempotency.py``)."""
        key = idempotency.check_key(raw, request.scope)
        data = request.json()
        q = await self.queue(request)
        return await idempotency.answer(q, key, route, data, lambda: handle(request, data, key))

    async def _schedule(self, request: Request, data: Any, key: str | None) -> Reply:
        f = schemas.check_fields(data, schemas.TASK)
        tid = f.get("id") or (
            idempotency.task_id(request.params["queue"], key) if key else new_task_ids(1)[0]
        )
        spec = schemas.spec_of(f, tid)
        typed.check([spec], self.task_types, batch=False)

        async def work(q: AsyncQueue) -> Reply:
            try:
                s = await self.coalescer.schedule(
                    q,
                    spec,
                    replace=f.get("replace", False),
                    durable=f.get("durable", False),
                )
            except (InvalidTaskError, ConnectionFailed) as e:
                raise from_error(e, "/payload", id=tid) from None
            (result,) = await _results(q, [s])
            return wire.encoded(201 if s.status == "created" else 200, result)

        return await self.run(request, work)

    async def _schedule_batch(self, request: Request, data: Any, key: str | None) -> Reply:
        try:
            specs, replace, durable = schemas.batch_specs(data)
        except Problem as p:  # its fields: the payloads too large are errors as well
            raise await self._batch_problem(request, data, p) from None
        typed.check(specs, self.task_types, batch=True)
        if key is not None:  # a task sent without an id: its id is the key's and its index's
            queue = request.params["queue"]
            for i, task in enumerate(data["tasks"]):
                if "id" not in task:
                    specs[i] = replace_spec(specs[i], task_id=idempotency.task_id(queue, key, i))
        ids = [str(s.task_id) for s in specs]

        async def work(q: AsyncQueue) -> Reply:
            try:
                done = await q.schedule_many(specs, replace=replace, durable=durable)
            except InvalidTaskError as e:  # a payload: find every one refused, by index
                raise batch.refused_payloads(q, specs, e) from None
            except ConnectionFailed as e:
                where = {tid: i for i, tid in enumerate(ids)}
                raise from_error(
                    e,
                    scheduled=[{"index": where[t], "id": str(t)} for t in e.scheduled],
                    unconfirmed=[{"index": where[t], "id": str(t)} for t in e.unconfirmed],
                ) from None
            results = await _results(q, done)
            return wire.encoded(200, b'{"tasks":[' + b",".join(results) + b"]}")

        return await self.run(request, work)

    async def _batch_problem(self, request: Request, data: Any, p: Problem) -> Problem:
        if p.errors is None:
            return p
        try:
            q = await self.queue(request)
        except Problem:
            return p
        return batch.with_large_payloads(q, data, p)

    async def get(self, request: Request) -> Reply:
        tid = _task_id(request)

        async def work(q: AsyncQueue) -> Reply:
            info = await q.get(tid)
            if info is None:
                raise _no_task(tid, q)
            return Reply(200, task_dict(info))

        return await self.run(request, work)

    async def cancel(self, request: Request) -> Reply:
        tid = _task_id(request)

        async def work(q: AsyncQueue) -> Reply:
            if await q.cancel(tid):
                return Reply(204)
            raise await _why_not(q, tid, "cancelled")

        return await self.run(request, work)

    async def reschedule(self, request: Request) -> Reply:
        tid = _task_id(request)
        f = schemas.check_fields(request.json(), schemas.RESCHEDULE)
        if "delay" not in f and "at" not in f:
            raise invalid(
                [
                    field_error(
                        "", "send delay (seconds, or a duration: 15m) or at (an RFC 3339 time)"
                    )
                ]
            )

        async def work(q: AsyncQueue) -> Reply:
            op = q.shards.of(tid).reschedule_due(tid, delay=f.get("delay"), at=f.get("at"))
            due = await q.execute(op)  # the due time the script stored, as get reads it
            if due is not None:
                return Reply(200, {"id": tid, "due_at": _iso(ms_to_datetime(due))})
            raise await _why_not(q, tid, "rescheduled")

        return await self.run(request, work)

    async def set_key(self, request: Request) -> Reply:
        key = _key(request)
        f = schemas.check_fields(request.json(), schemas.EXPIRING_SET)

        async def work(q: AsyncQueue) -> Reply:
            try:
                deadline = await q.expiring.set(key, f.get("value"), f["ttl"])
            except InvalidTaskError as e:
                raise from_error(e, "/value") from None
            return Reply(200, {"key": key, "deadline": _iso(deadline)})

        return await self.run(request, work)

    async def touch_key(self, request: Request) -> Reply:
        key = _key(request)
        f = schemas.check_fields(request.json(), schemas.EXPIRING_TOUCH)

        async def work(q: AsyncQueue) -> Reply:
            try:
                touched = await q.expiring.touch(key, f["ttl"])
            except InvalidTaskError as e:
                raise from_error(e, "/ttl") from None
            if not touched:
                raise _no_key(key, q)
            return Reply(200, {"key": key, "touched": True})

        return await self.run(request, work)

    async def delete_key(self, request: Request) -> Reply:
        key = _key(request)

        async def work(q: AsyncQueue) -> Reply:
            if await q.expiring.delete(key):
                return Reply(204)
            raise _no_key(key, q)

        return await self.run(request, work)

    owns_client = False

    async def aclose(self) -> None:
        """Close the API's Redis connections, when it made its own client."""
        if self.owns_client:
            await self.queues.client.aclose()

    async def lifespan(self, receive: Receive, send: Send) -> None:
        """ASGI lifespan, when the API is served without its Starlette app around it."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _problem_of(e: Exception, scope: Scope) -> Problem:
    """The problem an exception of the Python API means; anything else is a bug (500)."""
    if isinstance(e, DelayqError):
        try:
            return from_error(e)
        except DelayqError:
            pass
    log.error("the HTTP API failed on %s %s", scope["method"], scope["path"], exc_info=e)
    return Problem(
        "internal",
        "the API failed on this request; its log has the traceback. Report it with the "
        "request that caused it",
    )


async def _results(q: AsyncQueue, done: list[Scheduled]) -> list[bytes]:
    """What each schedule did, as a JSON object: ``{"id", "due_at", "created", "status"}``.
    A task created or moved is due when the script stored it (``Scheduled.due_at``: what
    ``GET`` answers, to the microsecond); for one left as it was (its id exists), its own
    due time is read back, all in one round trip. (Encoded here: a batch's tasks repeat
    their due times and statuses, so what follows the id is encoded once for each pair.)"""
    kept = [i for i, s in enumerate(done) if s.status in ("unchanged", "running")]
    infos: dict[int, TaskInfo | None] = {}
    if kept:
        ops = [q.shards.of(done[i]).get(done[i]) for i in kept]
        infos = dict(zip(kept, await q.runner.run_many(ops), strict=True))
    tails: dict[tuple[str | None, str], bytes] = {}
    out = []
    for i, s in enumerate(done):
        if i in infos:
            info = infos[i]
            due = _iso(info.due_at) if info is not None else None
        else:
            due = _iso(s.due_at)
        status = s.status
        tail = tails.get((due, status))
        if tail is None:  # ("due_at", "created", "status", after "id": a dict's order)
            rest = {"due_at": due, "created": status == "created", "status": status}
            tail = tails[(due, status)] = b"," + wire.encode(rest)[1:]
        out.append(b'{"id":' + wire.encode_str(s) + tail)
    return out


def _task_id(request: Request) -> str:
    try:
        return validate_task_id(request.params["id"])
    except InvalidTaskError as e:
        raise invalid([field_error("", str(e))]) from None


def _key(request: Request) -> str:
    try:
        return validate_key(request.params["key"])
    except InvalidTaskError as e:
        raise invalid([field_error("", str(e))]) from None


def _no_task(tid: str, q: AsyncQueue) -> Problem:
    return Problem(
        "not-found",
        f"no task {tid!r} in queue {q.name!r}: check the id and the queue (a finished task "
        "is kept only for the queue's dedupe window)",
    )


def _no_key(key: str, q: AsyncQueue) -> Problem:
    return Problem(
        "not-found",
        f"key {key!r} is not watched in queue {q.name!r}: it was never set through delayq, "
        "or it expired (its callback runs) or was deleted; set it again with PUT",
    )


async def _why_not(q: AsyncQueue, tid: str, what: str) -> Problem:
    """Why a task could not be cancelled or rescheduled: unknown (404), or not waiting (and
    how it can be scheduled again)."""
    info = await q.get(tid)
    if info is None:
        return _no_task(tid, q)
    again = {"active": "", "cancelled": "; schedule it again (its id is free)"}
    fix = again.get(info.state, "; schedule it again with replace=true")
    text = f"task {tid!r} is {info.state}: only a waiting task can be {what}{fix}"
    return Problem("conflict", text, state=info.state)


def _token(token: object) -> Token:
    """The API's token, checked (spaces around it dropped: no header can carry them)."""
    return Token(token, least=MIN_TOKEN, what="the API token")


def create_app(
    url: str | None = None,
    *,
    token: str,
    client: aredis.Redis | None = None,
    prefix: str = DEFAULT_PREFIX,
    queues: list[str] | None = None,
    max_body: int = MAX_BODY,
    max_batch_body: int = MAX_BATCH_BODY,
    task_types: Iterable[TaskType[Any, Any]] = (),
) -> Starlette:
    """The HTTP API as a Starlette app, to serve (``delayq api``) or mount in your own
    Starlette or FastAPI app (``app.mount("/delayq", create_app(token=...))``).

    Args:
        url: Redis URL; default ``DELAYQ_REDIS_URL``, else ``REDIS_URL``, else localhost.
        token: the bearer token every request under /v1 and /readyz must carry (at least
            16 characters; spaces around it are dropped, since no header can carry them).
        client: a ``redis.asyncio`` client (``decode_responses=False``) instead of ``url``;
            the app does not close it.
        prefix: the key prefix of the queues.
        queues: serve only these queues (default: any).
        max_body, max_batch_body: the largest request bodies read, in bytes.
        task_types: :class:`~delayq.TaskType` objects: the OpenAPI document gives each
            one's payload schema, and a payload of its kind that does not match is a 422.

    The app's ``state.api`` is the :class:`Api` (itself an ASGI app, what ``delayq api``
    serves); ``await app.state.api.aclose()`` closes the connections it opened (the app's
    lifespan does so when it is served on its own).
    """
    checked = _token(token)
    owned = client is None
    if client is None:
        client = async_client(resolve_url(url), retries=RETRIES)
    allowed = frozenset(queues) if queues else None
    api = Api(
        Queues(client, prefix=prefix, allowed=allowed),
        checked,
        max_body=max_body,
        max_batch_body=max_batch_body,
        task_types=typed.by_kind(task_types),
    )
    api.owns_client = owned

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await api.aclose()

    app = Starlette(lifespan=lifespan)
    # Every request goes to the API's own router (no route of Starlette's matches first:
    # its patterns see the decoded path, where an id's %2F or %0A would misroute it).
    app.router.default = api
    app.state.api = api
    return app
