"""Merge raw JSON-lines shards into the shipped Parquet tables (raw files are kept).

Layout per GPU (``datasets/<tag>/``):
  raw/rows-*.jsonl, raw/provenance-*.json   as measured (never rewritten)
  operations.parquet                        one row per measured (operation, mode)
  networks.parquet                          one row per measured (model-input set, mode)
  repeats.parquet                           re-measurements (repeatability)
  idle.parquet                              idle power readings
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

from gpurec.dataset.store import atomic_write_parquet, read_jsonl


def _provenance(raw: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for p in sorted(raw.glob("provenance-*.json")):
        d = json.loads(p.read_text())
        out[d.get("run_id", p.stem.replace("provenance-", ""))] = d
    return out


def build_gpu_dataset(gpu_dir: Path | str) -> dict[str, int]:
    """(Re)build the Parquet tables of one GPU directory from its raw shards."""
    import pandas as pd

    gpu_dir = Path(gpu_dir)
    raw = gpu_dir / "raw"
    rows: list[dict[str, Any]] = []
    for p in sorted(glob.glob(str(raw / "rows-*.jsonl"))):
        for r in read_jsonl(p):
            r["source_file"] = Path(p).name
            rows.append(r)
    prov = _provenance(raw)
    df = pd.DataFrame(rows)
    if df.empty:
        return {}
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
    counts = {}
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
    return counts


def build_all(root: Path | str = "datasets") -> dict[str, dict[str, int]]:
    return {p.parent.name: build_gpu_dataset(p.parent) for p in sorted(Path(root).glob("*/raw"))}
