"""Fixed-width tables for the CLI: columns of (title, row key, width, number format)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# (title, row key, width, number format; "" = text, left-aligned)
Column = tuple[str, str, int, str]


def cell(v: Any, width: int, fmt: str) -> str:
    """Text left-aligned; a number right-aligned; a missing number a dash as wide (a missing
    value never shifts the columns after it)."""
    if not fmt:
        return f"{v!s:<{width}}"
    if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)):
        return f"{v:>{width}{fmt}}"
    return "-".rjust(width)


def render(columns: Sequence[Column], rows: Sequence[Mapping[str, Any]]) -> str:
    """The header and one line per row."""
    header = "".join(f"{title:<{w}}" if not fmt else f"{title:>{w}}" for title, _, w, fmt in columns)
    return "\n".join([header, *("".join(cell(r[key], w, fmt) for _, key, w, fmt in columns) for r in rows)])
