"""The ``DELAYQ`` setting, read and checked: a mistake raises ``ImproperlyConfigured`` naming
the setting's key and what it takes.

::

    DELAYQ = {
        "URL": env("REDIS_URL"),              # default: $DELAYQ_REDIS_URL, $REDIS_URL, local
        "QUEUES": {"orders": {"shards": 1}},  # name -> Queue options; default {"default": {}}
        "TASKS_MODULE": "tasks",              # the module of each app that declares handlers
        "WORKER": {"concurrency": 16},        # Worker options for manage.py delayq_worker
        "EAGER": False,                       # schedule_on_commit runs the handler at once
        "DASHBOARD_URL": None,                # the admin's link to `delayq dashboard`
        "OUTBOX": False,                      # schedule_on_commit(..., outbox=True)
        "OUTBOX_EVERY": 1.0,                  # seconds between the worker's relays
    }
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from delayq.connection import resolve_url
from delayq.errors import ConfigurationError

SETTING = "DELAYQ"
DEFAULT_QUEUE = "default"
# Queue(...) options a queue's entry may give; "URL" is the queue's own server.
QUEUE_OPTIONS = frozenset(
    {
        "URL",
        "shards",
        "prefix",
        "codec",
        "max_payload",
        "dedupe_window",
        "durable_timeout",
        "durable_replicas",
    }
)
WORKER_OPTIONS = frozenset(
    {"concurrency", "lease", "grace", "lookahead", "max_wait", "configure_notifications"}
)
KEYS = frozenset(
    {"URL", "QUEUES", "TASKS_MODULE", "WORKER", "EAGER", "DASHBOARD_URL", "OUTBOX", "OUTBOX_EVERY"}
)


@dataclass(frozen=True)
class QueueConfig:
    name: str
    url: str | None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    queues: dict[str, QueueConfig]
    tasks_module: str = "tasks"
    tasks_module_given: bool = False  # set in the setting (so one found nowhere is a typo)
    worker: dict[str, Any] = field(default_factory=dict)
    eager: bool = False
    dashboard_url: str | None = None
    outbox: bool = False
    outbox_every: float = 1.0

    def queue(self, name: str | None) -> QueueConfig:
        """The configured queue ``name`` (None: the only one, or ``"default"``)."""
        if name is None:
            if len(self.queues) == 1:
                return next(iter(self.queues.values()))
            name = DEFAULT_QUEUE
        try:
            return self.queues[name]
        except KeyError:
            raise ImproperlyConfigured(
                f"no queue {name!r} in settings.DELAYQ['QUEUES'] (it has "
                f"{', '.join(map(repr, self.queues))}): add it, or name one of those"
            ) from None


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(f"settings.{where} must be a dict, got {value!r}")
    return value


def _unknown(given: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(set(given) - known)
    if unknown:
        raise ImproperlyConfigured(
            f"unknown key(s) in settings.{where}: {', '.join(map(repr, unknown))} "
            f"(it takes {', '.join(sorted(known))})"
        )


def _optional_str(value: Any, where: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ImproperlyConfigured(f"settings.{where} must be a non-empty string, got {value!r}")
    return value


def _url(value: Any, where: str) -> str | None:
    """A Redis URL of the setting, its scheme and form checked (nothing is connected)."""
    url = _optional_str(value, where)
    if url is not None:
        try:
            resolve_url(url)
        except ConfigurationError as e:
            raise ImproperlyConfigured(f"settings.{where}: {e}") from None
    return url


def refused(where: str, options: Mapping[str, Any], error: Exception) -> ImproperlyConfigured:
    """``error``, raised by ``Queue(...)`` or ``Worker(...)`` for the options of
    ``settings.<where>``, as the ImproperlyConfigured naming the option's key (its message
    begins with the option's name) or else the entry."""
    text = str(error)
    key = next((k for k in options if text.startswith(f"{k} ")), None)
    here = f"settings.{where}" if key is None else f"settings.{where}[{key!r}]"
    return ImproperlyConfigured(f"{here}: {text}")


def _queues(raw: Any, url: str | None) -> dict[str, QueueConfig]:
    where = f"{SETTING}['QUEUES']"
    queues = _mapping(raw, where)
    if not queues:
        raise ImproperlyConfigured(
            f"settings.{where} is empty: name at least one queue, e.g. {{'orders': {{}}}}"
        )
    out = {}
    for name, options in queues.items():
        here = f"{where}[{name!r}]"
        if not isinstance(name, str) or not name:
            raise ImproperlyConfigured(f"settings.{where} has a queue name {name!r}: use a string")
        options = dict(_mapping(options, here))
        _unknown(options, QUEUE_OPTIONS, here)
        own_url = _url(options.pop("URL", None), f"{here}['URL']")
        out[name] = QueueConfig(name, own_url or url, options)
    return out


def read() -> Config:
    """``settings.DELAYQ``, checked (absent: one queue, ``default``, on the default URL)."""
    raw = _mapping(getattr(settings, SETTING, {}), SETTING)
    _unknown(raw, KEYS, SETTING)
    url = _url(raw.get("URL"), f"{SETTING}['URL']")
    module = raw.get("TASKS_MODULE", "tasks")
    if not isinstance(module, str) or not module.replace(".", "").replace("_", "").isalnum():
        raise ImproperlyConfigured(
            f"settings.{SETTING}['TASKS_MODULE'] must be a module name relative to each app, "
            f"such as 'tasks' or 'delayq_tasks', got {module!r}"
        )
    worker = dict(_mapping(raw.get("WORKER", {}), f"{SETTING}['WORKER']"))
    _unknown(worker, WORKER_OPTIONS, f"{SETTING}['WORKER']")
    eager, outbox = raw.get("EAGER", False), raw.get("OUTBOX", False)
    for key, value in (("EAGER", eager), ("OUTBOX", outbox)):
        if not isinstance(value, bool):
            raise ImproperlyConfigured(f"settings.{SETTING}['{key}'] must be True or False")
    every = raw.get("OUTBOX_EVERY", 1.0)
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not 0.1 <= every <= 3600:
        raise ImproperlyConfigured(
            f"settings.{SETTING}['OUTBOX_EVERY'] is seconds from 0.1 to 3600, got {every!r}"
        )
    return Config(
        queues=_queues(raw.get("QUEUES", {DEFAULT_QUEUE: {}}), url),
        tasks_module=module,
        tasks_module_given="TASKS_MODULE" in raw,
        worker=worker,
        eager=eager,
        dashboard_url=_optional_str(raw.get("DASHBOARD_URL"), f"{SETTING}['DASHBOARD_URL']"),
        outbox=outbox,
        outbox_every=float(every),
    )
