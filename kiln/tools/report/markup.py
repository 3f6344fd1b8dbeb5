"""HTML pieces every report section uses: escaping, a section, an empty-state sentence, a table,
numbers and user locations shortened for reading. No external resources, no scripts."""
from __future__ import annotations

import html
import os
from typing import Iterable

__all__ = ["empty", "escape", "locations", "num", "section", "short_location", "table"]


def escape(value: object) -> str:
    return html.escape(str(value))


def section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{escape(title)}</h2>{body}</section>'


def empty(text: str) -> str:
    return f'<p class="empty">{escape(text)}</p>'


def table(headers: list[str], rows: list[list[str]], num_cols: Iterable[int] = frozenset()) -> str:
    """Cells are HTML already; columns in `num_cols` are right-aligned numbers."""
    num_cols = set(num_cols)
    head = "".join(f'<th class="num">{escape(h)}</th>' if i in num_cols else f"<th>{escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(_cell(c, i in num_cols) for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    return (f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            "</table></div>")


def _cell(content: str, number: bool) -> str:
    return f'<td class="num">{content}</td>' if number else f"<td>{content}</td>"


def short_location(location: str) -> str:
    """'path/to/file.py:12' shortened for reading: the part after site-packages/ for installed
    code, the path relative to the working directory for files under it."""
    path, sep, line = location.rpartition(":")
    if not sep:
        return location
    if "site-packages/" in path:
        path = path.rsplit("site-packages/", 1)[1]
    elif os.path.isabs(path) and path.startswith(os.getcwd() + os.sep):
        path = os.path.relpath(path)
    return f"{path}:{line}"


def locations(values: Iterable[object] | None) -> str:
    return escape(", ".join(short_location(str(x)) for x in values or ())) or "—"


def num(value: float | None, fmt: str = "{:.3g}", scale: float = 1.0) -> str:
    return "—" if value is None else escape(fmt.format(value * scale))
