"""The exception tree, and the one table that maps script status codes to exceptions."""

from __future__ import annotations

import re
from typing import Any


class DelayqError(Exception):
    """Base class of every error delayq raises."""


class ConfigurationError(DelayqError, ValueError):
    """A setting or URL is wrong; the message says which and how to fix it."""


class ProtocolVersionError(ConfigurationError):
    """The queue speaks a delayq protocol this delayq cannot (another major version): it
    was written by a newer (or much older) delayq. The message names both versions and
    what to do; ``stored`` is the queue's version, ``ours`` this delayq's."""

    def __init__(self, message: str, *, queue: str = "", stored: str = "", ours: str = "") -> None:
        super().__init__(message)
        self.queue, self.stored, self.ours = queue, stored, ours


class InvalidTaskError(DelayqError, ValueError):
    """A task was refused before anything was written (bad payload, delay, id ...)."""


class PayloadTooLarge(InvalidTaskError):
    """The encoded payload exceeds the queue's ``max_payload``."""


class ConnectionFailed(DelayqError, ConnectionError):
    """Redis could not be reached; the message names the URL tried.

    From ``schedule_many``: ``scheduled`` lists the ids confirmed before the failure and
    ``unconfirmed`` those whose round trip failed (each task is written whole or not at all).
    Calling again with the same task ids is safe: ids already waiting are left as they are.
    """

    scheduled: list[str]
    unconfirmed: list[str]

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.scheduled, self.unconfirmed = [], []

    def partial(self, scheduled: list[str], unconfirmed: list[str]) -> ConnectionFailed:
        err = ConnectionFailed(
            f"{self}; {len(scheduled)} task(s) were scheduled before it (.scheduled), "
            f"{len(unconfirmed)} may or may not be (.unconfirmed): schedule them again with "
            "the same task ids, which leaves any already waiting as they are"
        )
        err.scheduled, err.unconfirmed = list(scheduled), list(unconfirmed)
        return err


class DurabilityError(DelayqError):
    """``durable=True`` could not be confirmed: the server lacks WAITAOF or AOF, or the fsync
    was not confirmed in time. The message says whether the task was written."""


class ScriptError(DelayqError):
    """A delayq Lua script failed on the server (a bug or an incompatible server).

    ``script`` names it (``"claim"``; the file is ``lua/claim.lua``) when known: given by
    the caller, or else found from the SHA1 the server quotes in its message. The message
    ends with the file's name."""

    script: str | None

    def __init__(self, message: str, script: str | None = None) -> None:
        script = script or _script_of(message)
        if script is not None:
            file = _file_of(script)
            if file not in message:
                message = f"{message} (script {file})"
        super().__init__(message)
        self.script = script


_SHA_RE = re.compile(r"\b[0-9a-f]{40}\b")


def _script_of(message: str) -> str | None:
    """The delayq script whose SHA1 a server's error message quotes ("... script: <sha>,
    on @user_script:12." on Redis 7 and Valkey), if any."""
    from delayq.scripts import SCRIPTS  # (scripts.py loads every script: not at import)

    shas = set(_SHA_RE.findall(message))
    return next((name for name, s in SCRIPTS.items() if s.sha in shas), None) if shas else None


def _file_of(script: str) -> str:
    from delayq.scripts import file_of

    return file_of(script)


class LeaseLost(DelayqError):
    """The worker no longer holds the task's lease: it expired or was taken over."""


class TaskNotFound(DelayqError, KeyError):
    """``queue.wait``: the queue holds no task of this id (never scheduled, cancelled, or
    forgotten after its dedupe window)."""

    def __str__(self) -> str:  # (KeyError's repr()s its argument)
        return str(self.args[0]) if self.args else ""


class TaskAborted(DelayqError):
    """Raised by ``task.raise_if_aborted()`` in a handler whose task was aborted
    (``queue.abort``): the attempt is over, and whatever the handler does next is discarded."""


class WorkerFailed(DelayqError):
    """A background loop of the worker kept failing, and the worker stopped. The message
    names the loop and its last error; the log has every traceback."""


class ServerNotFound(DelayqError):
    """No Redis/Valkey server binary was found to start an embedded server."""


class MissingExtra(DelayqError, ImportError):
    """A feature whose optional dependencies (a pip extra) are not installed. The message is
    one line naming the command that installs them."""

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(f"{feature} needs the {extra} extra: pip install 'delayq[{extra}]'")
        self.feature = feature
        self.extra = extra


# Outcome exceptions a handler raises. They are control flow, not failures of delayq,
# so they derive from Exception directly and carry what the worker needs.


class Retry(Exception):
    """Run the task again later: ``raise Retry(after=10)``; counts as an attempt."""

    def __init__(self, after: float | None = None, reason: str = "") -> None:
        super().__init__(reason or f"retry requested (after={after})")
        self.after = after
        self.reason = reason


class Discard(Exception):
    """Finish the task without running it again: the business state moved on."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class Defer(Exception):
    """Put the task back for later without counting the attempt (used to re-arm a watched
    key whose TTL was extended by other code)."""

    def __init__(self, after_ms: int) -> None:
        super().__init__(f"deferred by {after_ms} ms")
        self.after_ms = after_ms


class Fail(Exception):
    """Send the task to the dead set at once (retrying cannot help), firing ``on_dead``."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


# -- script status codes -----------------------------------------------------------------------
# The one table from a script's status reply to the exception it means: (script, status) ->
# (exception class, message template, formatted with the call's context). Scripts answer a
# refusal with a status, never an error reply, so the caller chooses to raise; when it does,
# it raises through raise_for, and the text users see is spelled here only.

STATUS_ERRORS: dict[tuple[str, int | str], tuple[type[Exception], str]] = {
    # shards.lua: the count's record carries a move under way (delayq reshard).
    ("shards", -1): (
        ConfigurationError,
        "queue {queue!r} is being resharded (the key {key} has a 'moving' field): finish it "
        "with `delayq reshard`, then open the queue with the new shard count",
    ),
    # settings.lua: the same, for `delayq settings` and Queue.update_settings.
    ("settings", -1): (
        ConfigurationError,
        "queue {queue!r} is being resharded (the key {key} has a 'moving' field): finish it "
        "with `delayq reshard`, then set its settings",
    ),
    # cron/next.lua: the occurrence's lease expired or was taken over before it started.
    ("cron_next", "lost"): (LeaseLost, "lease of occurrence {id} was lost before it started"),
    # expire/confirm.lua: a set, touch or delete revoked the claim ahead (or the lease ended).
    ("expire_confirm", "lost"): (
        Discard,
        "the expiry of {key!r} was superseded before its deadline",
    ),
}


def error_for(script: str, status: Any, **context: Any) -> Exception | None:
    """The exception a script's status reply means (see STATUS_ERRORS), or None when the
    status is not a refusal. ``status`` as replied: bytes and numbers are read as the
    table's keys."""
    if isinstance(status, bytes):
        status = status.decode()
    if isinstance(status, str) and re.fullmatch(r"-?[0-9]+", status):
        status = int(status)
    entry = STATUS_ERRORS.get((script, status))
    if entry is None:
        return None
    cls, template = entry
    return cls(template.format(**context))


def raise_for(script: str, status: Any, **context: Any) -> None:
    """Raise the exception a script's status reply means, if it is a refusal."""
    err = error_for(script, status, **context)
    if err is not None:
        raise err
