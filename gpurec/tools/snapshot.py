"""Snapshot of what extraction gives for every torchvision classifier, to check that a change
to gpurec.ops leaves the operation lists as they were.

    gpurec tools snapshot write before.json   # on the old code
    gpurec tools snapshot write after.json    # on the new code
    gpurec tools snapshot compare before.json after.json

Each classifier (299 px for Inception, else 224, batch 2) in both modes, by name and as a fresh
nn.Module (the prediction fast path): kind, signature, FLOPs (forward, backward,
element-wise), parameters and bytes of every operation, in order.  About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpurec.dataset.store import atomic_write_text


def _rows(ops: list[Any]) -> list[list[Any]]:
    return [[o.kind, o.signature, o.flops, o.flops_bwd, o.flops_elementwise, o.params, o.bytes_read,
             o.bytes_written] for o in ops]


def snapshot(models: list[str] | None = None,
             progress: Callable[[str], None] | None = None) -> dict[str, list[list[Any]]]:
    """``"<model>|<mode>|name"`` and ``"...|module"`` -> that extraction's operation rows."""
    import torch
    import torchvision

    from gpurec.ops import classification_models, extract_operations

    out: dict[str, list[list[Any]]] = {}
    names = list(models) if models else list(classification_models())
    for i, name in enumerate(names):
        if progress:
            progress(f"[{i + 1}/{len(names)}] {name}")
        res = 299 if name.startswith("inception") else 224
        for mode in ("inference", "training"):
            out[f"{name}|{mode}|name"] = _rows(extract_operations(name, (2, 3, res, res), mode=mode,
                                                                  keep_sources=False))
            try:
                with torch.device("meta"):
                    module = torchvision.models.get_model(name)
            except Exception:  # RegNets initialise with data-dependent ops
                module = torchvision.models.get_model(name)
            out[f"{name}|{mode}|module"] = _rows(extract_operations(module, (2, 3, res, res), mode=mode,
                                                                    keep_sources=False))
    return out


def write(path: Path | str, models: list[str] | None = None,
          progress: Callable[[str], None] | None = None) -> int:
    """Write a snapshot to ``path``; returns how many operation lists it holds."""
    snap = snapshot(models, progress)
    atomic_write_text(path, json.dumps(snap))
    return len(snap)


def compare(a_path: Path | str, b_path: Path | str) -> tuple[int, int, list[str]]:
    """(lists in a, lists in b, keys whose operation lists differ or exist on one side only)."""
    a, b = (json.loads(Path(p).read_text()) for p in (a_path, b_path))
    return len(a), len(b), sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
