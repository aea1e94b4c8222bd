"""Griffe extension: the API reference reads like the user's API.

- A default that names a module constant shows the constant's value:
  ``max_payload: int = 64 * 1024``, not ``= DEFAULT_MAX_PAYLOAD``, which a reader would have
  to look up.
- ``AsyncQueue``'s coroutines that have no docstring of their own (they are ``Queue``'s
  methods, awaited) say so and link to ``Queue``'s, so that each one is documented.

``tests/unit/test_docs.py`` loads the package through this extension and checks both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import griffe

PACKAGE = "delayq"
SYNC, ASYNC = "delayq.queue.Queue", "delayq.queue.AsyncQueue"


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)  # type: ignore[arg-type]


def constant_value(default: Any, collection: griffe.ModulesCollection) -> Any:
    """The value expression of the module constant a default names, or None."""
    if not isinstance(default, griffe.ExprName):
        return None
    path = default.canonical_path
    if not path.startswith(f"{PACKAGE}."):
        return None
    try:
        target = collection.get_member(path)
    except (KeyError, ValueError, griffe.AliasResolutionError):
        return None
    if isinstance(target, griffe.Alias):
        try:
            target = target.final_target
        except griffe.AliasResolutionError:
            return None
    if isinstance(target, griffe.Attribute) and target.value is not None:
        return target.value
    return None


def async_docstring(name: str, labels: set[str]) -> str:
    link = f"[`Queue.{name}`][delayq.Queue.{name}]"
    if "async" in labels:
        return f"The coroutine of {link}: the same arguments, result and errors, awaited."
    return f"As {link}, for asyncio code."


class ApiReference(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != PACKAGE:
            return
        for obj in _objects(pkg):
            if isinstance(obj, griffe.Function):
                for param in obj.parameters:
                    value = constant_value(param.default, pkg.modules_collection)
                    if value is not None:
                        param.default = value
        sync, coroutines = pkg.modules_collection[SYNC], pkg.modules_collection[ASYNC]
        for name, member in coroutines.members.items():
            if name.startswith("_") or member.is_alias or member.docstring is not None:
                continue
            if name in sync.all_members and sync.all_members[name].docstring is not None:
                text = async_docstring(name, set(member.labels))
                member.docstring = griffe.Docstring(text, parent=member)
