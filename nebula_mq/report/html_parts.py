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


def json_tables(doc: Any) -> str:
    """Any JSON document as HTML: its scalars and small objects as key/value lines, and each
    list of objects as a table (a benchmark's result file, whatever its shape)."""
    tables = {k: v for k, v in doc.items() if _is_rows(v)} if isinstance(doc, dict) else {}
    if _is_rows(doc):
        tables = {"": doc}
    scalars = {k: v for k, v in doc.items() if not isinstance(v, (list, dict))} if isinstance(doc, dict) else {}
    info = {k: v for k, v in doc.items() if isinstance(v, dict)} if isinstance(doc, dict) else {}
    parts = []
    for k, v in {**scalars, **info}.items():
        shown = ", ".join(f"{a}={b}" for a, b in v.items()) if isinstance(v, dict) else v
        parts.append(f'<p class="kv"><b>{e(k)}</b>: {e(str(shown))}</p>')
    for key, rows in tables.items():
        cols = list(dict.fromkeys(c for r in rows for c in r))
        numeric = [i for i, c in enumerate(cols) if all(isinstance(r[c], (int, float)) for r in rows if c in r)]
        parts.append((f"<h4>{e(key)}</h4>" if key else "") +
                     table(cols, ([num(r.get(c, "–")) for c in cols] for r in rows), numeric))
    if not tables and not scalars and not info:
        parts.append('<p class="empty">No tabular content.</p>')
    return "".join(parts)


def _is_rows(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(r, dict) for r in v)
