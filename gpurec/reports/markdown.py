"""Markdown helpers shared by the reports (docs/*.md, datasets/README.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def row(cells: Iterable[Any]) -> str:
    """One table row; a cell's own "|" and line breaks are escaped so a value can never split it."""
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def rule(n: int, align: str | None = None) -> str:
    """The header rule of an ``n``-column table; ``align`` has one letter per column
    (``l`` plain, ``r`` right-aligned)."""
    return "|" + "|".join("---:" if align and align[i] == "r" else "---" for i in range(n)) + "|"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub-flavoured Markdown table."""
    return "\n".join([row(header), rule(len(header), align), *(row(r) for r in rows)])
