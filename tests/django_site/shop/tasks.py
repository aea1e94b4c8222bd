"""The handlers the tests discover (the default TASKS_MODULE, ``tasks``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection, connections

import delayq.contrib.django as dq
from delayq import Discard, Expired, Task, TaskType
from shop.models import Note

# What the handlers saw, for the tests: (kind or name, payload, the connection wrapper).
seen: list[tuple[str, Any, Any]] = []

if os.environ.get("SHOP_QUERY_AT_IMPORT") == "1":  # a module that reads at import
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


@dq.handler("note.add", max_attempts=2)
def add_note(task: Task) -> None:
    Note.objects.create(text=task.payload["text"])
    seen.append(("note.add", task.payload, connections["default"]))


@dq.handler("note.skip")
def skip(task: Task) -> None:
    raise Discard("nothing to do")


@dq.handler("note.async_add")
async def add_note_async(task: Task) -> None:
    await sync_to_async(Note.objects.create)(text=task.payload["text"])
    conn = await sync_to_async(lambda: connections["default"])()
    seen.append(("note.async_add", task.payload, conn))


@dq.handler("mail.send", queue="emails")
def send_mail(task: Task) -> None:
    seen.append(("mail.send", task.payload, None))


@dq.every(hours=1, name="hourly", queue="default")
def hourly(task: Task) -> None:
    seen.append(("hourly", task.payload, None))


@dq.cron("0 2 * * *", tz="Europe/Paris", name="nightly", queue="default")
def nightly(task: Task) -> None:
    seen.append(("nightly", task.payload, None))


@dq.on_expire("cart:*", queue="default")
def cart_expired(expired: Expired) -> None:
    seen.append(("cart", expired.value, None))


@dataclass
class AddNote:
    text: str
    times: int = 1


# A typed task: its handler gets an AddNote, and its options are the handler's defaults.
add_note_typed = TaskType("note.typed", AddNote, max_attempts=3)


@dq.handler(add_note_typed)
def add_typed_note(task: Task[AddNote]) -> None:
    Note.objects.create(text=task.payload.text * task.payload.times)
    seen.append(("note.typed", task.payload, None))
