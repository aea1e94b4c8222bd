"""Griffe extension: Sphinx roles in delayq's docstrings (``:class:`Queue```, ``:meth:`~a.b```)
render as code on the site instead of as literal text."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj):`~?(?P<target>[^`]+)`")


def plain(text: str) -> str:
    """``:meth:`~delayq.queue.Queue.schedule``` -> ```schedule```; without ``~``, as written."""

    def code(m: re.Match[str]) -> str:
        written = m[0].split("`", 1)[1]
        target = m["target"]
        return f"`{target.rsplit('.', 1)[-1] if written.startswith('~') else target}`"

    return ROLE.sub(code, text)


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
