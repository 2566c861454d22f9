"""Small HTML building blocks of the report: tables, inline figures, sections."""

from __future__ import annotations

import base64
import html
from collections.abc import Collection, Iterable, Sequence
from typing import Any

e = html.escape


def num(v: Any, digits: int = 4) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return e(str(v))
    if float(v).is_integer() and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:.{digits}g}"


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Collection[int] | None = None,
          row_class: Sequence[str] | None = None) -> str:
    """Cells are HTML already; ``numeric``: right-aligned column indexes (default: all but the first)."""
    numeric_cols = set(range(1, len(columns))) if numeric is None else set(numeric)
    head = "".join(f'<th class="{"num" if i in numeric_cols else ""}">{e(c)}</th>' for i, c in enumerate(columns))
    body = []
    for n, row in enumerate(rows):
        cls = f' class="{row_class[n]}"' if row_class and row_class[n] else ""
        cells = "".join(f'<td class="{"num" if i in numeric_cols else ""}">{c}</td>' for i, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    if not body:
        return '<p class="empty">No rows.</p>'
    return f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def figure(png: bytes | None, alt: str, caption: str, empty: str) -> str:
    if png is None:
        return f'<p class="empty">{e(empty)}</p>'
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{e(alt)}">'
            f"<figcaption>{caption}</figcaption></figure>")


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{e(title)}</h2>{body}</section>'
