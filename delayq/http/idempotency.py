"""``Idempotency-Key`` on the API's POSTs: a request sent again answers what the first did.

A request with the header takes the key in one script call (``idem_begin``) before it runs,
and leaves its answer there when it is done (``idem_end``). The key's record
(``QueueKeys.idempotency``, on the queue's shard-0 tag) holds the request's digest, the SHA-256
of the route and the body as parsed JSON (so a resend whose object keys come in another
order, as a Java ``Map`` may send them, is the same request), and once answered the answer
itself; it is kept for the queue's dedupe window, and an unanswered one for
:data:`PENDING_MS` at most (an API process that died mid-request frees the key by then). The
digest lives in that record, not in the task's: a task record is what every worker and
producer reads, and a batch's tasks would each carry the same digest.

A task sent without an ``id`` gets one derived from the key (:func:`task_id`), so the key
also dedupes through the tasks themselves: a resend after its record expired or was freed
(a failed answer frees it) still finds its tasks, within the dedupe window, and leaves them
as they are; and the id routes the task to its shard as any id does.

Requests without the header pay one scan of the headers (:func:`key_of`), nothing else.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Scope

from delayq.core import Op, QueueCore
from delayq.errors import DelayqError
from delayq.http import wire
from delayq.http.problems import Problem, field_error, invalid
from delayq.queue import AsyncQueue
from delayq.scripts import SCRIPTS

HEADER = b"idempotency-key"
REPLAYED = "idempotent-replayed"
MAX_KEY = 255
PENDING_MS = 60_000  # how long a request that never answers holds its key

log = logging.getLogger("delayq.http")

SCRIPTS["idem_begin"].reply.require_head("state", "answer")


def key_of(scope: Scope) -> bytes | None:
    """The request's ``Idempotency-Key`` header, unchecked; None without one."""
    for name, value in scope["headers"]:
        if name == HEADER:
            return value  # type: ignore[no-any-return]
    return None


def check_key(raw: bytes, scope: Scope) -> str:
    """The key: 1-255 visible ASCII characters, bare or as a quoted string (the IETF
    draft's form, ``"8e03978e-..."``), in one header; anything else is a 422 naming the
    header."""
    sent = [value for name, value in scope["headers"] if name == HEADER]
    if len(sent) > 1:
        keys = ", ".join(repr(v.decode("latin-1")[:40]) for v in sent)
        raise invalid(
            [
                field_error(
                    "",
                    f"Idempotency-Key is sent {len(sent)} times ({keys}): send it once, with "
                    "one key",
                )
            ]
        )
    text = raw.decode("latin-1").strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    if not 0 < len(text) <= MAX_KEY or not all("!" <= c <= "~" for c in text):
        raise invalid(
            [
                field_error(
                    "",
                    f"Idempotency-Key {text[:40]!r} is not 1-{MAX_KEY} visible ASCII characters: "
                    "send a new random one for each request (a UUID), the same one when you "
                    "send that request again",
                )
            ]
        )
    return text


def digest(route: str, data: Any) -> str:
    """What makes two requests with one key the same: the route and the parsed body, its
    numbers by value (``60`` and ``60.0`` are one number in JSON)."""
    canonical = json.dumps(
        _by_value(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(f"{route}\n{canonical}".encode()).hexdigest()


def _by_value(data: Any) -> Any:
    """``data`` with each whole float as an int (60.0 -> 60)."""
    if type(data) is float:
        return int(data) if data.is_integer() else data
    if type(data) is dict:
        return {k: _by_value(v) for k, v in data.items()}
    if type(data) is list:
        return [_by_value(v) for v in data]
    return data


def task_id(queue: str, key: str, index: int | None = None) -> str:
    """The id of a task sent with ``key`` and no ``id`` (``index``: its place in a batch)."""
    where = f"{queue}\n{key}" if index is None else f"{queue}\n{key}\n{index}"
    return "ik:" + hashlib.sha256(where.encode()).hexdigest()[:32]


def _record(core: QueueCore, key: str) -> dict[str, str]:
    return {"record": core.keys.idempotency(hashlib.sha256(key.encode()).hexdigest())}


def _begin_reply(reply: Any) -> tuple[str, bytes]:
    state, answer = reply  # idem_begin's head, checked above
    return (state.decode() if isinstance(state, bytes) else str(state)), bytes(answer)


def begin_op(core: QueueCore, key: str, hashed: str) -> Op[tuple[str, bytes]]:
    """Take ``key`` for a request of digest ``hashed``, or learn why not (idem_begin)."""
    args: dict[str, Any] = {"hash": hashed, "pending_ms": PENDING_MS}
    return core.op("idem_begin", args, [], _begin_reply, dynamic=_record(core, key))


def end_op(core: QueueCore, key: str, hashed: str, answer: bytes) -> Op[int]:
    """Keep the answer for the dedupe window, or free the key (``answer`` b"")."""
    args: dict[str, Any] = {"hash": hashed, "answer": answer, "window_ms": core.dedupe_ms}
    return core.op("idem_end", args, [], int, dynamic=_record(core, key))


def refusal(state: str, key: str) -> Problem:
    """Why a request with this key is not run: another body (422), or still running (409)."""
    if state == "mismatch":
        return Problem(
            "invalid",
            f"Idempotency-Key {key!r} was already used with another request (another body or "
            "route) within the queue's dedupe window: send this request with a new key, or "
            "send the first request's body unchanged to get its answer again",
            errors=[field_error("", "Idempotency-Key reused with another body")],
            idempotency_key=key,
        )
    return Problem(
        "in-flight",
        f"a request with Idempotency-Key {key!r} is still being answered: wait for it and "
        "send this one again, which then answers the first one's result (Idempotent-Replayed: "
        "true)",
        headers={"retry-after": "1"},
        idempotency_key=key,
    )


async def answer(
    q: AsyncQueue, key: str, route: str, data: Any, handle: Callable[[], Awaitable[wire.Reply]]
) -> wire.Reply:
    """``handle()``'s reply, or the first answer again for the same key and request (with
    ``Idempotent-Replayed: true``); 422 for another request, 409 while the first runs. Only
    a 2xx answer is kept: after a refusal or a failure the key is freed, to be sent again."""
    hashed = digest(route, data)
    state, first = await q.runner.run(begin_op(q.core, key, hashed))
    if state == "done":
        return wire.encoded(int(first[:3]), first[3:], {REPLAYED: "true"})
    if state != "new":
        raise refusal(state, key)
    kept = b""
    try:
        reply = await handle()
        if 200 <= reply.status < 300:
            kept = str(reply.status).encode() + reply.body
        return reply
    finally:
        try:
            await q.runner.run(end_op(q.core, key, hashed, kept))
        except DelayqError as e:  # (the key frees itself after PENDING_MS)
            log.warning("could not record Idempotency-Key %r's answer: %s", key, e)
