"""Merge raw JSON-lines shards into the shipped Parquet tables (raw files are kept).

Layout per GPU (``datasets/<tag>/``):
  raw/rows-*.jsonl, raw/provenance-*.json   as measured (never rewritten)
  operations.parquet                        one row per measured (operation, mode)
  networks.parquet                          one row per measured (model-input set, mode)
  repeats.parquet                           re-measurements (repeatability)
  idle.parquet                              idle power readings

An unreadable raw line fails the build (CorruptShardError names file and line) unless
``allow_corrupt`` is passed; either way nothing is left out without being counted in the
summary the build returns.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

from gpurec.dataset.store import BadLine, atomic_write_parquet, count_torn_fragments, read_jsonl


def _provenance(raw: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted(raw.glob("provenance-*.json")):
        d = json.loads(p.read_text())
        out[d.get("run_id", p.stem.replace("provenance-", ""))] = d
    return out


def _damage_summary(raw: Path, bad: list[BadLine]) -> dict[str, Any]:
    """What the build could not read: skipped corrupt lines, torn last lines of shards still being
    written, and torn fragments that an earlier resume moved aside into ``*.torn`` files."""
    torn_kept = count_torn_fragments(raw)
    return {"corrupt_lines_skipped": sum(b.kind == "corrupt" for b in bad),
            "torn_last_lines": sum(b.kind == "torn_tail" for b in bad),
            "torn_fragments_kept_aside": sum(torn_kept.values()),
            "bad_lines": [b.describe() for b in bad]
            + [f"{raw / name}: {n} torn fragment(s) kept aside" for name, n in torn_kept.items()]}


def build_gpu_dataset(gpu_dir: Path | str, *, allow_corrupt: bool = False) -> dict[str, Any]:
    """(Re)build the Parquet tables of one GPU directory from its raw shards.

    Returns the row count of each table written, plus what could not be read (see
    ``_damage_summary``).  Raises CorruptShardError at the first unreadable line that is not a
    torn last line, unless ``allow_corrupt`` (then such lines are skipped and counted).
    """
    import pandas as pd

    gpu_dir = Path(gpu_dir)
    raw = gpu_dir / "raw"
    rows: list[dict[str, Any]] = []
    bad: list[BadLine] = []
    for p in sorted(glob.glob(str(raw / "rows-*.jsonl"))):
        for r in read_jsonl(p, allow_corrupt=allow_corrupt, bad_lines=bad):
            r["source_file"] = Path(p).name
            rows.append(r)
    damage = _damage_summary(raw, bad)
    prov = _provenance(raw)
    df = pd.DataFrame(rows)
    if df.empty:
        return damage
    for col, key in (("driver", ("gpu", "driver_version")), ("torch", ("torch",)), ("host_cpu", ("host_cpu",)),
                     ("cuda_runtime", ("cuda_runtime",)), ("date", ("date",)),
                     ("cudnn_allow_tf32", ("cudnn_allow_tf32",)), ("cuda_matmul_allow_tf32", ("cuda_matmul_allow_tf32",))):
        def look(run_id: Any, key: tuple[str, ...] = key) -> Any:
            d: Any = prov.get(run_id, {})
            for k in key:
                d = d.get(k, {}) if isinstance(d, dict) else {}
            return d if d != {} else None

        df[col] = df["run_id"].map(look)
    if "model_sets" in df:  # absent when a shard holds only idle readings so far
        df["model_sets"] = df["model_sets"].map(lambda v: json.dumps(v) if isinstance(v, list) else v)
    counts: dict[str, Any] = {}
    is_repeat = df.get("repeat", pd.Series(False, index=df.index)).fillna(False).astype(bool)
    idle = df[df["item"] == "idle"]
    main = df[~is_repeat & (df["item"] != "idle")]
    # A row measured twice (e.g. re-run after a failure) keeps its latest successful value.
    # (ok rows sort after failed ones, so a later failure never replaces a success)
    if len(main):
        ok_last = main["status"].eq("ok") if "status" in main else pd.Series(True, index=main.index)
        main = (main.assign(_ok=ok_last).sort_values(["_ok", "t_unix"], kind="stable")
                .drop_duplicates("id", keep="last").drop(columns="_ok"))
    for name, part in (("operations", main[main["item"] == "op"]), ("networks", main[main["item"] == "network"]),
                       ("repeats", df[is_repeat & (df["item"] != "idle")]), ("idle", idle)):
        part = part.dropna(axis=1, how="all")
        atomic_write_parquet(gpu_dir / f"{name}.parquet", part)
        counts[name] = int(len(part))
    return {**counts, **damage}


def build_all(root: Path | str = "datasets", *, allow_corrupt: bool = False) -> dict[str, dict[str, Any]]:
    """Rebuild every ``<root>/<gpu>/`` that has a ``raw/`` directory; {gpu dir: build summary}."""
    return {p.parent.name: build_gpu_dataset(p.parent, allow_corrupt=allow_corrupt)
            for p in sorted(Path(root).glob("*/raw"))}
