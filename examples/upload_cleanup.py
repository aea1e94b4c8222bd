"""Upload sessions that clean up after themselves: expiring keys with a guaranteed callback.

A client uploads a large file in chunks. The app opens an upload session, and the chunks
go to a temporary object (here a file under ``tmp/`` in a directory that stands in for
object storage). Each session is the Redis key ``upload_session:<id>``, holding
``{"object_key": "tmp/<id>.part", "bytes": <declared size>}`` with a TTL:

    the client            the app calls                        the temporary object
    keeps uploading       queue.expiring.touch(key, ttl=TTL)   stays; the TTL starts again
    finishes              queue.expiring.delete(key)           becomes the object; no callback
    goes away             nothing: the key expires             @worker.on_expire deletes it

The callback gets the session's last value after the key is gone, and runs even when no
worker was up at the deadline (as soon as one starts); the plain ``SETEX`` plus
keyspace-notification recipe gives neither (docs/expiring.md). Like any task it may run
more than once, so a file that is already gone counts as deleted.

Run it (an embedded server unless ``--url``, ``DELAYQ_REDIS_URL`` or ``REDIS_URL`` names one;
three sessions with a one-second TTL):

    python examples/upload_cleanup.py

In production, run the worker with

    UPLOAD_STORAGE=/srv/uploads delayq worker examples.upload_cleanup:make_worker

and give the app an :class:`UploadSessions` on the same queue.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from delayq import Expired, Fail, Queue, Worker
from delayq.embedded import EmbeddedServer
from delayq.timing import Clock

log = logging.getLogger("upload_cleanup")

SESSION_PATTERN = "upload_session:*"
SESSION_TTL = 30 * 60.0  # an upload idle for this long is abandoned
_UPLOAD_ID = re.compile(r"[0-9a-f]{16}")


def session_key(upload_id: str) -> str:
    if not _UPLOAD_ID.fullmatch(upload_id):  # it comes from the client: keep it out of paths
        raise ValueError(f"not an upload id: {upload_id!r}")
    return f"upload_session:{upload_id}"


def temp_key(upload_id: str) -> str:
    return f"tmp/{upload_id}.part"


class SessionExpired(Exception):
    """The session is gone (expired and cleaned up, or finished): the client starts over."""


# -- the app's side ------------------------------------------------------------------------------


class UploadSessions:
    """What an upload API calls from its request handlers.

    Args:
        queue: the queue whose worker runs :func:`make_worker`'s callback.
        storage: the object store's root (a directory here).
        ttl: seconds a session may stay idle before it is abandoned.
    """

    def __init__(self, queue: Queue, storage: str | Path, ttl: float = SESSION_TTL) -> None:
        self.queue = queue
        self.storage = Path(storage)
        self.ttl = ttl
        (self.storage / "tmp").mkdir(parents=True, exist_ok=True)
        (self.storage / "objects").mkdir(parents=True, exist_ok=True)

    def start(self, size: int) -> str:
        """Open a session for an upload of ``size`` bytes; returns its id."""
        upload_id = secrets.token_hex(8)
        value = {"object_key": temp_key(upload_id), "bytes": size}
        # The session first, then the object: if the app dies in between, the callback finds
        # no file and is done. The other order could leave a file that nothing deletes.
        self.queue.expiring.set(session_key(upload_id), value, ttl=self.ttl)
        (self.storage / temp_key(upload_id)).touch()
        return upload_id

    def receive(self, upload_id: str, chunk: bytes) -> int:
        """Append a chunk and keep the session alive; returns the bytes received so far."""
        # touch first: once it succeeds the callback cannot run for another TTL. False means
        # the session expired (its callback has run or is running) or was finished.
        if not self.queue.expiring.touch(session_key(upload_id), ttl=self.ttl):
            raise SessionExpired(upload_id)
        with (self.storage / temp_key(upload_id)).open("ab") as f:
            f.write(chunk)
            return f.tell()

    def finish(self, upload_id: str) -> Path:
        """Make the upload an object and end the session without a callback."""
        temp = self.storage / temp_key(upload_id)
        final = self.storage / "objects" / upload_id
        try:
            # Atomic: a callback racing this deletes the whole temporary file or nothing.
            os.replace(temp, final)
        except FileNotFoundError:
            raise SessionExpired(upload_id) from None  # expired, and cleaned up first
        # Moved first, then delete: a crash in between leaves a session whose callback finds
        # nothing to delete. delete() is False only if the session expired meanwhile, and
        # then its callback finds nothing either.
        self.queue.expiring.delete(session_key(upload_id))
        return final


# -- the worker's side ---------------------------------------------------------------------------

CleanupHook = Callable[[Expired, int | None], None]


def make_worker(
    storage: str | Path | None = None,
    *,
    queue: str = "uploads",
    redis_url: str | None = None,
    on_cleanup: CleanupHook | None = None,
    clock: Clock | None = None,
) -> Worker:
    """The worker that deletes abandoned uploads (``delayq worker`` calls it with no
    arguments).

    Args:
        storage: the object store's root (default: ``UPLOAD_STORAGE``).
        on_cleanup: called after each abandoned session is handled, with the
            :class:`Expired` and the bytes deleted (None if the file was already gone).
        clock: for tests, a ``delayq.testing.VirtualClock`` (docs/testing.md).
    """
    root = Path(storage or os.environ["UPLOAD_STORAGE"]).resolve()
    worker = Worker(Queue(queue, url=redis_url, clock=clock), concurrency=8)

    @worker.on_expire(SESSION_PATTERN)
    def remove_abandoned_upload(expired: Expired) -> None:
        # A sync callback: it runs in the worker's thread pool, so blocking file calls are
        # fine. An exception here (storage down) is retried with the default backoff.
        if expired.value is None:
            # A matching key that some other program set (expired.guaranteed is False):
            # delayq never saw its value, so there is no object to delete.
            log.warning("unknown session %s expired; nothing to clean up", expired.key)
            return
        temp = (root / expired.value["object_key"]).resolve()
        if not temp.is_relative_to(root / "tmp"):
            raise Fail(f"session {expired.key} names {temp}, outside {root / 'tmp'}")
        try:
            removed: int | None = temp.stat().st_size
            temp.unlink()
        except FileNotFoundError:
            removed = None  # an earlier run deleted it, or the upload was finished: done
        log.info(
            "upload session %s abandoned (%s of %s bytes): %s",
            expired.key,
            "?" if removed is None else removed,
            expired.value["bytes"],
            "deleted" if removed is not None else "already gone",
        )
        if on_cleanup is not None:
            on_cleanup(expired, removed)

    return worker


# -- running this file: three sessions, three endings ------------------------------------------


def describe(
    storage: Path, upload_id: str, cleaned: dict[str, list[tuple[Expired, int | None]]]
) -> tuple[int | None, list[str]]:
    """An upload's object size (None if none; its temporary file must be gone either way) and
    a line per callback run."""
    if (storage / temp_key(upload_id)).exists():
        return None, ["TEMPORARY FILE LEFT BEHIND"]
    final = storage / "objects" / upload_id
    runs = [
        f"got {e.value}, deleted {'nothing' if n is None else f'{n} bytes'} ({e.via})"
        for e, n in cleaned.get(session_key(upload_id), [])
    ]
    return (final.stat().st_size if final.exists() else None), runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Three upload sessions with a 1 s TTL.")
    parser.add_argument(
        "--url",
        default=os.environ.get("DELAYQ_REDIS_URL") or os.environ.get("REDIS_URL"),
        help="Redis URL (default: $DELAYQ_REDIS_URL, $REDIS_URL, else an embedded server)",
    )
    args = parser.parse_args(argv)
    logging.getLogger("delayq").setLevel(logging.CRITICAL)  # the table below says it all
    ttl = 1.0

    with ExitStack() as stack:
        url = args.url or stack.enter_context(EmbeddedServer(appendonly=False)).url
        storage = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="uploads-")))
        queue = stack.enter_context(Queue(f"upload-cleanup-{os.getpid()}", url=url))
        sessions = UploadSessions(queue, storage, ttl=ttl)
        cleaned: dict[str, list[tuple[Expired, int | None]]] = {}  # key -> callback runs
        worker = make_worker(
            storage,
            queue=queue.name,
            redis_url=url,
            on_cleanup=lambda e, removed: cleaned.setdefault(e.key, []).append((e, removed)),
        )
        runner = threading.Thread(target=lambda: asyncio.run(worker.serve()), daemon=True)
        runner.start()

        data = os.urandom(3000)
        abandoned = sessions.start(len(data))  # sends a third, then goes away
        sessions.receive(abandoned, data[:1000])
        finished = sessions.start(len(data))  # sends everything at once
        sessions.receive(finished, data)
        sessions.finish(finished)
        slow = sessions.start(len(data))  # a chunk every 0.4 s: 1.2 s in all, more than the TTL
        for i in range(3):
            sessions.receive(slow, data[i * 1000 : (i + 1) * 1000])
            time.sleep(0.4)
        sessions.finish(slow)
        deadline = time.monotonic() + 10  # the abandoned one expired long ago: wait for it
        while session_key(abandoned) not in cleaned and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(ttl + 0.5)  # long enough for a callback the others must not get
        worker.stop()
        runner.join(30)
        try:
            sessions.receive(abandoned, data[1000:])
            late_chunk = "accepted"
        except SessionExpired:
            late_chunk = "refused"

        rows = [("abandoned", abandoned), ("slow", slow), ("finished", finished)]
        outcomes = {label: describe(storage, upload_id, cleaned) for label, upload_id in rows}
        print(f"{'session':<10} {'object':<14} callback")
        for label, (size, runs) in outcomes.items():
            shown = "none" if size is None else f"{size} bytes"
            print(f"{label:<10} {shown:<14} {'; '.join(runs) or 'never ran'}")
        print(f"a chunk for the abandoned session after it expired: {late_chunk}")
        ok = late_chunk == "refused" and all(
            (size, len(runs)) == expected
            for (size, runs), expected in zip(
                outcomes.values(), [(None, 1), (len(data), 0), (len(data), 0)], strict=True
            )
        )
        print("every session ended as expected" if ok else "SOME SESSIONS DID NOT END AS EXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
