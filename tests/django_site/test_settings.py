"""settings.DELAYQ, queue()/aqueue(), discovery of the tasks modules, and the checks."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
import redis
import shop.tasks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import Client, override_settings

import delayq.contrib.django as dq
from delayq import AsyncQueue, Queue
from delayq.contrib.django import declare


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"URL": "x", "QUEUE": {}}, r"unknown key\(s\) in settings.DELAYQ: 'QUEUE'"),
        ({"QUEUES": {}}, r"settings.DELAYQ\['QUEUES'\] is empty"),
        ({"QUEUES": {"a": {"shrads": 2}}}, r"settings.DELAYQ\['QUEUES'\]\['a'\]: 'shrads'"),
        ({"QUEUES": {"a": {"shards": 0}}}, r"DELAYQ\['QUEUES'\]\['a'\]\['shards'\]: shards"),
        ({"QUEUES": []}, r"settings.DELAYQ\['QUEUES'\] must be a dict"),
        ({"URL": ""}, r"settings.DELAYQ\['URL'\] must be a non-empty string"),
        ({"TASKS_MODULE": "my tasks"}, r"TASKS_MODULE'\] must be a module name"),
        ({"WORKER": {"concurency": 2}}, r"DELAYQ\['WORKER'\]: 'concurency'"),
        ({"EAGER": "yes"}, r"DELAYQ\['EAGER'\] must be True or False"),
        ("redis://x", r"settings.DELAYQ must be a dict"),
    ],
)
def test_a_misconfiguration_is_refused_naming_the_setting(setting: Any, message: str) -> None:
    with override_settings(DELAYQ=setting), pytest.raises(ImproperlyConfigured, match=message):
        dq.queue("a")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"WORKER": {"concurrency": 0}}, r"settings.DELAYQ\['WORKER'\]\['concurrency'\]: "),
        ({"WORKER": {"lease": "x"}}, r"settings.DELAYQ\['WORKER'\]\['lease'\]: lease must"),
        ({"QUEUES": {"a": {"shards": 0}}}, r"DELAYQ\['QUEUES'\]\['a'\]\['shards'\]: shards"),
        ({"URL": "http://x"}, r"settings.DELAYQ\['URL'\]: unsupported Redis URL scheme 'http'"),
        (
            {"QUEUES": {"a": {"URL": "postgres://x"}}},
            r"settings.DELAYQ\['QUEUES'\]\['a'\]\['URL'\]: unsupported Redis URL scheme",
        ),
    ],
)
def test_the_check_names_the_key_of_a_refused_option(
    settings: Any, setting: dict[str, Any], message: str
) -> None:
    from delayq.contrib.django.checks import check_setting

    settings.DELAYQ = {**settings.DELAYQ, **setting}
    errors = check_setting()
    assert [m.id for m in errors] == ["delayq.E001"], errors
    assert re.search(message, errors[0].msg), errors[0].msg


def test_queue_names_the_queues_there_are(settings: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"no queue 'nope'.*'default', 'emails'"):
        dq.queue("nope")
    settings.DELAYQ = {"URL": settings.DELAYQ["URL"], "QUEUES": {"orders": {}}}
    assert dq.queue().name == "orders"  # the only one


def test_a_queue_is_made_once_and_remade_when_the_setting_changes(
    settings: Any, delayq_url: str
) -> None:
    first = dq.queue("emails")
    assert isinstance(first, Queue) and dq.queue("emails") is first
    assert first.url == delayq_url and dq.queue() is dq.queue("default")  # None: "default"
    first.schedule("k", task_id="t")
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"emails": {"shards": 2}}}
    again = dq.queue("emails")
    assert again is not first and len(again.shards.cores) == 2


def test_aqueue_is_one_async_queue_per_event_loop() -> None:
    async def two() -> tuple[AsyncQueue, AsyncQueue]:
        return dq.aqueue("emails"), dq.aqueue("emails")

    a, b = asyncio.run(two())
    c, _ = asyncio.run(two())
    assert isinstance(a, AsyncQueue) and a is b and c is not a
    with pytest.raises(RuntimeError):
        dq.aqueue("emails")  # no running loop


def test_an_async_view_under_wsgi_leaves_no_queue_nor_connection_per_request(
    client: Client, delayq_url: str
) -> None:
    from delayq.contrib.django.queues import registry

    dq.queue().schedule("note.add", task_id="known", delay=60)
    with redis.Redis.from_url(delayq_url) as r:

        def connections() -> int:
            return len(r.client_list())

        before = connections()
        for _ in range(50):  # each on a new event loop (async_to_sync), as a WSGI server
            response = client.get("/task/known")
            assert response.content == b"scheduled"
        assert client.get("/task/other").content == b"none"
        assert connections() - before <= 1, (before, connections())
    assert len(registry.by_loop) == 0  # each loop's queue closed and forgotten


def test_discovery_finds_the_tasks_modules_in_order() -> None:
    found = [(d.method, d.args, d.queue) for d in declare.discover()]
    assert found == [
        ("handler", ("note.add",), None),
        ("handler", ("note.skip",), None),
        ("handler", ("note.async_add",), None),
        ("handler", ("mail.send",), "emails"),
        ("every", (), "default"),
        ("cron", ("0 2 * * *",), "default"),
        ("on_expire", ("cart:*",), "default"),
        ("handler", (shop.tasks.add_note_typed,), None),
    ]
    decl = declare.discover()[4]
    assert decl.options == {"hours": 1, "name": "hourly"}
    # The decorator returns the function itself: still callable as a function.
    assert shop.tasks.add_note.__name__ == "add_note" and callable(shop.tasks.add_note)


def test_tasks_module_names_another_module(settings: Any) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "TASKS_MODULE": "jobs"}
    assert [(d.args, d.fn.__module__) for d in declare.discover()] == [
        (("job.run",), "jobs_app.jobs")
    ]


def test_a_tasks_package_declares_its_handlers_in_the_submodules_it_imports(
    settings: Any,
) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "TASKS_MODULE": "pkg_tasks"}
    assert [(d.args, d.fn.__module__) for d in declare.discover()] == [
        (("pkg.mail",), "jobs_app.pkg_tasks.mail")
    ]
    assert "pkg.mail" in dq.make_worker(["emails"]).lanes[0].registry.kinds()


def test_a_tasks_module_no_app_has_is_refused_naming_the_setting(settings: Any) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "TASKS_MODULE": "taks"}
    typo = r"settings.DELAYQ\['TASKS_MODULE'\] is 'taks', and no installed app has"
    with pytest.raises(ImproperlyConfigured, match=typo):
        declare.discover()
    with pytest.raises(SystemCheckError, match=r"delayq.E001.*" + typo):
        call_command("check")
    with pytest.raises(CommandError, match=typo):
        call_command("delayq_worker")


def test_the_worker_command_refuses_to_start_without_handlers(settings: Any) -> None:
    # "jobs" declares only a handler of queue "default": a worker of "emails" has none.
    settings.DELAYQ = {**settings.DELAYQ, "TASKS_MODULE": "jobs"}
    with pytest.raises(
        CommandError,
        match=r"no handler is declared for queue\(s\) 'emails' in the installed apps' "
        r"'jobs' modules \(settings.DELAYQ\['TASKS_MODULE'\]\)",
    ):
        call_command("delayq_worker", "--queue", "emails")
    assert dq.make_worker(["emails"]).queues[0].name == "emails"  # a test's drain may


def test_the_worker_gets_every_declaration_of_its_queues() -> None:
    both = dq.make_worker()
    assert [q.name for q in both.queues] == ["default", "emails"]
    default, emails = (lane.registry for lane in both.lanes)
    assert {"note.add", "note.skip", "note.async_add", "cron:hourly", "cron:nightly"} <= set(
        default.kinds()
    )
    assert "mail.send" not in default.kinds()
    assert "mail.send" in emails.kinds() and "note.add" in emails.kinds()  # queue=None: all
    assert default.get("note.add").max_attempts == 2  # type: ignore[union-attr]
    assert default.get("note.typed").max_attempts == 3  # type: ignore[union-attr]
    only = dq.make_worker(["emails"])  # manage.py delayq_worker --queue emails
    assert [q.name for q in only.queues] == ["emails"]
    kinds = only.lanes[0].registry.kinds()
    assert "mail.send" in kinds and "cron:hourly" not in kinds


def test_a_refused_declaration_names_its_function(settings: Any) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "TASKS_MODULE": "broken"}
    with pytest.raises(ImproperlyConfigured, match=r"@delayq.contrib.django.cron of jobs_app"):
        dq.make_worker()
    # manage.py check finds it before any worker starts.
    with pytest.raises(SystemCheckError, match=r"delayq.E001.*bad_hour.*invalid cron"):
        call_command("check")


def test_a_declaration_of_an_unknown_queue_is_refused() -> None:
    def fn(task: Any) -> None:
        pass

    decl = declare.Declaration("handler", ("k",), "nope", fn)
    with pytest.raises(ImproperlyConfigured, match="no queue 'nope'"):
        dq.make_worker(declarations=[decl])
    with pytest.raises(ImproperlyConfigured, match="decorates a function"):
        dq.handler("k")(print)  # type: ignore[type-var]


def test_the_check_warns_of_kept_connections_without_health_checks(settings: Any) -> None:
    from delayq.contrib.django.checks import check_setting

    assert check_setting() == []  # clean as configured
    db = settings.DATABASES["default"]
    saved = db.get("CONN_MAX_AGE", 0), db.get("CONN_HEALTH_CHECKS", False)
    db["CONN_MAX_AGE"] = 60  # (overriding DATABASES itself warns, and warnings are errors)
    try:
        assert [m.id for m in check_setting()] == ["delayq.W001"]
        db["CONN_HEALTH_CHECKS"] = True
        assert check_setting() == []
    finally:
        db["CONN_MAX_AGE"], db["CONN_HEALTH_CHECKS"] = saved
