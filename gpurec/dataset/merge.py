"""Combine shards from several processes or hosts into one GPU dataset directory."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpurec.dataset.build import build_gpu_dataset


def merge_shards(shards: Iterable[Path | str], out: Path | str) -> dict[str, Any]:
    """Copy ``rows-*.jsonl`` / ``provenance-*.json`` from ``shards`` (files or directories)
    into ``out/raw`` unchanged, then rebuild ``out``'s tables.  A shard already present
    under the same name is kept as is (measured data is never overwritten)."""
    out = Path(out)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    copied, skipped = [], []
    files: list[Path] = []
    for s in map(Path, shards):
        if s.is_dir():
            files += sorted(s.glob("rows-*.jsonl")) + sorted(s.glob("provenance-*.json"))
        elif s.exists():
            files.append(s)
        else:
            raise FileNotFoundError(f"shard {s} does not exist")
    for f in files:
        dest = raw / f.name
        if dest.exists():
            skipped.append(f.name)
            continue
        shutil.copy2(f, dest)
        copied.append(f.name)
    return {"copied": copied, "skipped_existing": skipped, "tables": build_gpu_dataset(out)}
