"""Handlers declared in each app's ``tasks.py``, and the worker that runs them.

``@handler("order.close", queue="orders", max_attempts=3)`` (and ``cron``, ``every``,
``on_expire``) takes the arguments of the ``Worker`` method of the same name. It registers
nothing anywhere: it records the declaration on the function itself and returns the
function unchanged (noting only which module declared it), so a ``tasks.py`` can be
imported by a web process (or a test) without side effects. :func:`discover` imports
``<app>.<TASKS_MODULE>`` of every installed app and collects the declared functions it finds
there, in ``INSTALLED_APPS`` order and in the order each module defines them, then those
declared in its submodules (a tasks *package* whose ``__init__`` imports them); a
``TASKS_MODULE`` set in the setting that no installed app has is refused (a typo would
otherwise find nothing). :func:`make_worker` builds a ``Worker`` of the configured queues
and registers them on it, each wrapped by :func:`delayq.contrib.django.db.managed`.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

from delayq.contrib.django import conf, db
from delayq.contrib.django.queues import registry
from delayq.errors import ConfigurationError
from delayq.spec import TaskType
from delayq.task import Task
from delayq.worker.worker import Worker

F = TypeVar("F", bound=Callable[..., Any])
P = TypeVar("P")  # a typed task's payload type
T = TypeVar("T")  # what its handler returns
Method = Literal["handler", "cron", "every", "on_expire"]
Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]
ATTR = "__delayq_declarations__"
# module name -> the declarations of its functions, in the order they were made
_BY_MODULE: dict[str, list[Declaration]] = {}


@dataclass(frozen=True)
class Declaration:
    """One ``@handler``/``@cron``/``@every``/``@on_expire`` of a function: the ``Worker``
    method, its arguments, and the configured queue it names (None: as the Worker's default)."""

    method: Method
    args: tuple[Any, ...]
    queue: str | None
    fn: Callable[..., Any]
    options: dict[str, Any] = field(default_factory=dict)

    def where(self) -> str:
        name = f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"
        return f"@delayq.contrib.django.{self.method} of {name}"


def _declare(
    method: Method, args: tuple[Any, ...], queue: str | None, options: dict[str, Any]
) -> Callable[[F], F]:
    if queue is not None and not isinstance(queue, str):
        raise ImproperlyConfigured(
            f"@delayq.contrib.django.{method}(queue=...) takes the name of a queue of "
            f"settings.DELAYQ['QUEUES'], got {queue!r}"
        )

    def declare(fn: F) -> F:
        if not isinstance(fn, types.FunctionType):
            raise ImproperlyConfigured(
                f"@delayq.contrib.django.{method} decorates a function (def or async def) "
                f"at the top of a tasks module, got {fn!r}"
            )
        found: list[Declaration] = fn.__dict__.setdefault(ATTR, [])
        declaration = Declaration(method, args, queue, fn, dict(options))
        found.append(declaration)
        _BY_MODULE.setdefault(fn.__module__, []).append(declaration)
        return fn

    return declare


@overload
def handler(
    kind: TaskType[P, Any], *, queue: str | None = None, **options: Any
) -> Callable[[Callable[[Task[P]], T]], Callable[[Task[P]], T]]: ...


@overload
def handler(kind: str, *, queue: str | None = None, **options: Any) -> Callable[[F], F]: ...


def handler(kind: Any, *, queue: str | None = None, **options: Any) -> Callable[[F], F]:
    """Declare the decorated function the handler of ``kind`` (sync or async), with the
    options of ``Worker.handler`` (``max_attempts``, ``backoff``, ``jitter``, ``timeout``,
    ``concurrency``). ``kind``: a kind, or a :class:`~delayq.TaskType`, whose handler is
    given ``task.payload`` as its payload type (and whose options are the defaults of
    these). ``queue``: a configured queue's name (default: every queue the worker
    serves)."""
    return _declare("handler", (kind,), queue, options)


def cron(expression: str, *, queue: str | None = None, **options: Any) -> Callable[[F], F]:
    """Declare a cron schedule (``Worker.cron``): ``@cron("0 2 * * *", tz="Europe/Paris")``."""
    return _declare("cron", (expression,), queue, options)


def every(*interval: Any, queue: str | None = None, **options: Any) -> Callable[[F], F]:
    """Declare an interval schedule (``Worker.every``): ``@every(minutes=5, name="sweep")``."""
    return _declare("every", interval, queue, options)


def on_expire(pattern: str, *, queue: str | None = None, **options: Any) -> Callable[[F], F]:
    """Declare an expiring key's callback (``Worker.on_expire``): ``@on_expire("cart:*")``."""
    return _declare("on_expire", (pattern,), queue, options)


def declarations_of(module: types.ModuleType) -> list[Declaration]:
    """The declarations of the functions a module holds, in its order."""
    out: list[Declaration] = []
    for value in list(vars(module).values()):
        if isinstance(value, types.FunctionType):
            out.extend(value.__dict__.get(ATTR, ()))
    return out


def declared_under(name: str) -> list[Declaration]:
    """The declarations made by the module ``name`` and its submodules (those imported so
    far), in the order they were made."""
    return [
        declaration
        for module, found in list(_BY_MODULE.items())
        if module == name or module.startswith(f"{name}.")
        for declaration in found
    ]


def discover(module: str | None = None) -> list[Declaration]:
    """Import ``<app>.<module>`` (default: ``settings.DELAYQ["TASKS_MODULE"]``, ``tasks``)
    of every installed app that has one, and return the declarations found there (the
    functions it holds, then those its submodules declared), each once (a function imported
    into two tasks modules is declared once).

    Raises:
        ImproperlyConfigured: ``module``, or a ``TASKS_MODULE`` the setting gives, is found
            in no installed app.
    """
    config = conf.read()
    name = module or config.tasks_module
    out: list[Declaration] = []
    seen: set[int] = set()
    found_in = 0
    for app in apps.get_app_configs():
        if not module_has_submodule(app.module, name):
            continue
        found_in += 1
        full = f"{app.name}.{name}"
        tasks = importlib.import_module(full)
        for declaration in [*declarations_of(tasks), *declared_under(full)]:
            if id(declaration) not in seen:
                seen.add(id(declaration))
                out.append(declaration)
    if not found_in and (module is not None or config.tasks_module_given):
        given = "settings.DELAYQ['TASKS_MODULE'] is" if module is None else "discover() got"
        raise ImproperlyConfigured(
            f"{given} {name!r}, and no installed app has a "
            f"module {name!r} (<app>/{name.replace('.', '/')}.py or a package): correct the "
            "name, or remove the key for the default, 'tasks'"
        )
    return out


def make_worker(
    queues: Sequence[str] | None = None,
    *,
    declarations: Sequence[Declaration] | None = None,
    wrap: Wrap = db.managed,
    relay: bool = False,
    require: bool = False,
    **options: Any,
) -> Worker:
    """A ``Worker`` of the configured ``queues`` (default: all of them) with the discovered
    declarations registered on it (those naming another queue are left to its worker).
    ``options``: ``Worker(...)`` arguments over ``settings.DELAYQ["WORKER"]``'s. ``wrap``:
    what each function is registered as (``db.managed``: closed or checked connections).
    ``relay``: with ``DELAYQ["OUTBOX"]``, also relay the outbox every ``OUTBOX_EVERY``
    seconds (``manage.py delayq_worker`` does; a test calls ``outbox.relay()`` itself).
    ``require``: refuse a worker given no declaration for its queues (``manage.py
    delayq_worker`` does: it would claim and bury every task).

    Raises:
        ImproperlyConfigured: an unknown queue, a bad ``WORKER`` option, a declaration the
            worker refuses (the message names the function), or none at all (``require``).
    """
    config = conf.read()
    names = list(queues) if queues else list(config.queues)
    for name in names:
        config.queue(name)  # an unknown name is refused by name
    qs = [registry.queue(name) for name in names]
    worker_options = {**config.worker, **options}
    try:
        worker = Worker(qs[0] if len(qs) == 1 else qs, **worker_options)
    except ConfigurationError as e:
        raise conf.refused("DELAYQ['WORKER']", worker_options, e) from None
    found = list(discover() if declarations is None else declarations)
    if require and not any(d.queue is None or d.queue in names for d in found):
        raise ImproperlyConfigured(
            f"no handler is declared for queue(s) {', '.join(map(repr, names))} in the "
            f"installed apps' {config.tasks_module!r} modules (settings.DELAYQ"
            "['TASKS_MODULE']): the worker would bury every task. Declare them with "
            f"@delayq.contrib.django.handler in <app>/{config.tasks_module}.py, or set "
            "DELAYQ['TASKS_MODULE'] to the module that declares them"
        )
    if relay and config.outbox:
        from delayq.contrib.django import outbox  # its model needs the apps loaded

        found.append(
            Declaration(
                "every",
                (config.outbox_every,),
                names[0],
                outbox.relay_occurrence,
                {"name": outbox.RELAY_SCHEDULE},
            )
        )
    for declaration in found:
        if declaration.queue is not None:
            config.queue(declaration.queue)
            if declaration.queue not in names:
                continue  # another worker's (manage.py delayq_worker --queue ...)
        register(worker, declaration, wrap)
    return worker


def register(worker: Worker, declaration: Declaration, wrap: Wrap = db.managed) -> None:
    """Register one declaration on ``worker``, the function wrapped by ``wrap``."""
    options = dict(declaration.options)
    if declaration.queue is not None:
        options["queue"] = declaration.queue
    method = getattr(worker, declaration.method)
    try:
        method(*declaration.args, **options)(wrap(declaration.fn))
    except (ConfigurationError, TypeError) as e:
        raise ImproperlyConfigured(f"{declaration.where()}: {e}") from None


def find_handler(queue: str, kind: str) -> Declaration | None:
    """The discovered ``@handler`` of ``kind`` on the configured ``queue`` (eager mode)."""
    for declaration in discover():
        if declaration.method != "handler" or declaration.queue not in (None, queue):
            continue
        declared = declaration.args[0]
        if getattr(declared, "kind", declared) == kind:  # a kind, or a typed task's
            return declaration
    return None
