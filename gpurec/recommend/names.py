"""GPU names a person types: a comma-separated list, and names that fit several catalogue GPUs.

``A100`` fits four catalogued A100s. The catalogue resolves it to one (its alias owner); this
module says so in a note, so a user sees which variant was used and how to pick another.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce"})


def split_gpus(gpus: str | Sequence[Any] | None) -> list[Any] | None:
    """``"H100,H200"`` or ``["H100", "H200"]`` as a list of names (None: every GPU)."""
    if gpus is None:
        return None
    if isinstance(gpus, str):
        return [g.strip() for g in gpus.split(",") if g.strip()]
    if not isinstance(gpus, Iterable):
        raise TypeError(f"gpus must be a comma-separated string or a list of GPU names, not {type(gpus).__name__}")
    return [g.strip() if isinstance(g, str) else g for g in gpus if not (isinstance(g, str) and not g.strip())]


def _tokens(text: str) -> set[str]:
    return {t for t in re.split(r"[^0-9a-z]+", text.lower()) if t}


def variants(name: str) -> list[Any]:
    """Catalogue GPUs whose names or aliases hold every word of ``name`` (vendor words aside)."""
    from gpurec.catalog import load_catalog

    words = _tokens(name) - _VENDOR_WORDS
    if not words:
        return []
    out = []
    for spec in load_catalog():
        have = _tokens(spec.nvml_name).union(*(_tokens(a) for a in spec.aliases))
        if words <= have:
            out.append(spec)
    return out


def resolve_noted(name: Any) -> tuple[Any, str | None]:
    """(the catalogue GPU for ``name``, a note when the name fits several GPUs, else None).

    Raises the catalogue's UnknownGPU (a ValueError listing the choices) for unknown names.
    """
    from gpurec.catalog import resolve_gpu

    spec = resolve_gpu(name)
    if not isinstance(name, str):
        return spec, None
    others = [s for s in variants(name) if s.nvml_name != spec.nvml_name]
    if not others:
        return spec, None
    alts = ", ".join(s.short_name for s in others)
    return spec, (f"'{name}' fits {len(others) + 1} catalogue GPUs: used {spec.short_name} ({spec.nvml_name}); "
                  f"name one of {alts} to choose another.")
