"""Text that crosses to Redis is valid UTF-8 and bounded, by construction. Pure: no I/O.

Python strings may hold lone surrogates (``os.fsdecode`` of a file name that is not UTF-8
gives ``"\\udcff"``), which no UTF-8 encoder accepts: a client sending one raises
``UnicodeEncodeError`` in the middle of a write. So text the user gives (kinds, ids,
payloads) is checked at the edge with :func:`check`, and text delayq writes itself (error
texts, reasons) is escaped with :func:`escape`, which cannot fail.
"""

from __future__ import annotations

from delayq.errors import InvalidTaskError

# An error text (a traceback, most often) kept per failed task: enough for any real
# traceback's head and tail, and a task that fails with a 100 MB message costs 64 KiB.
MAX_ERROR_CHARS = 64 * 1024
_CUT = "\n... [{n} characters cut] ...\n"


def escape(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` as valid UTF-8, lone surrogates written as ``\\udcff``, at most about
    ``limit`` characters (the head and the tail kept, where a traceback's news is)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        half = limit // 2
        text = text[:half] + _CUT.format(n=len(text) - 2 * half) + text[-half:]
    return text


def check(value: str, what: str) -> str:
    """Refuse text that cannot be sent as UTF-8 (InvalidTaskError names where it is)."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidTaskError(
            f"{what} {value!r} is not valid Unicode text: it holds the lone surrogate "
            f"{value[e.start]!r} at position {e.start} (often a file name decoded with "
            "os.fsdecode); pass text that encodes as UTF-8, e.g. decode the bytes with "
            "errors='replace'"
        ) from None
    return value
