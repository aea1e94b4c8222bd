"""MkDocs hook: the home page is the README, and links to repository files outside docs/.

- ``index.md`` is replaced by ``README.md``, its ``docs/x.md`` links pointed at the pages.
- A link that leaves docs/ for a file of the repository (``../examples/x.py``) works on
  GitHub but has no page on the site: the file must exist (a missing one is a warning, so
  ``mkdocs build --strict`` fails), and it is shown as its path in the repository, linked
  to ``repo_url`` when mkdocs.yml sets one.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.repo_files")

LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _outside_links(markdown: str, fix: Any) -> str:
    """Apply ``fix(match)`` to every link outside fenced code blocks."""
    out, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
        out.append(line if fenced else LINK.sub(fix, line))
    return "".join(out)


def readme_as_index(readme: str) -> str:
    """The README, its links rebased from the repository root onto docs/."""

    def rebase(m: re.Match[str]) -> str:
        target = m["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            return m[0]
        target = target.removeprefix("docs/") if target.startswith("docs/") else "../" + target
        return f"[{m['text']}]({target}{m['anchor'] or ''})"

    return _outside_links(readme, rebase)


def repo_links(markdown: str, page_path: Path, docs_dir: Path, root: Path, repo_url: str) -> str:
    """Links from a page to repository files outside docs/, as repository paths."""

    def fix(m: re.Match[str]) -> str:
        target = m["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or not target.startswith("../"):
            return m[0]
        path = (page_path.parent / target).resolve()
        if path.is_relative_to(docs_dir) or not path.is_relative_to(root):
            return m[0]
        rel = path.relative_to(root).as_posix()
        if not path.exists():
            log.warning(
                "Doc file '%s' links to '%s', which is not in the repository",
                page_path.relative_to(docs_dir).as_posix(),
                rel,
            )
            return m[0]
        text = m["text"]
        if repo_url:
            kind = "tree" if path.is_dir() else "blob"
            return f"[{text}]({repo_url.rstrip('/')}/{kind}/main/{rel})"
        if text.strip("`") in (rel, path.name, target):
            return f"`{rel}`"
        return f"{text} (`{rel}`)"

    return _outside_links(markdown, fix)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = Path(config["config_file_path"]).resolve().parent
    if page.file.src_uri == "index.md":
        markdown = readme_as_index((root / "README.md").read_text(encoding="utf-8"))
    page_path = docs_dir / page.file.src_uri
    return repo_links(markdown, page_path, docs_dir, root, config.get("repo_url") or "")
