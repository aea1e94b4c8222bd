"""The exception tree, and the one table that maps script status codes to exceptions."""

from __future__ import annotations


class DelayqError(Exception):
    """Base class of every error delayq raises."""


class ConfigurationError(DelayqError, ValueError):
    """A setting or URL is wrong; the message says which and how to fix it."""


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
    """A delayq Lua script failed on the server (a bug or an incompatible server)."""


class LeaseLost(DelayqError):
    """The worker no longer holds the task's lease: it expired or was taken over."""


class WorkerFailed(DelayqError):
    """A background loop of the worker kept failing, and the worker stopped. The message
    names the loop and its last error; the log has every traceback."""


class ServerNotFound(DelayqError):
    """No Redis/Valkey server binary was found to start an embedded server."""


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
