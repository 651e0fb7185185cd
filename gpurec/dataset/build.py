"""Merge raw JSON-lines shards into the shipped Parquet tables (raw files are kept).

Layout per GPU (``datasets/<tag>/``):
  raw/rows-*.jsonl, raw/provenance-*.json   as measured (never rewritten)
  operations.parquet                        one row per measured (operation, mode)
  networks.parquet                          one row per measured (model-input set, mode)
  in_network.parquet                        per (network row, position): kernel and host time of
                                            each operation inside the real step (issue 12)
  peaks.parquet                             per (model-input set, mode): the step's peak device memory
  repeats.parquet                           re-measurements (repeatability)
  idle.parquet                              idle power readings

Rows measured by the host-free method (``schema`` 2: ``gpu_time_ms``, ``gpu_power_w``,
``gpu_energy_mj``, ``host_ms``, ``captured``) take precedence over eager-only rows (schema 1)
of the same (operation, mode); the eager-only row's figures stay beside them as ``v1_*``
columns, and every raw line stays in ``raw/``.

An unreadable raw line fails the build (CorruptShardError names file and line) unless
``allow_corrupt`` is passed; either way nothing is left out without being counted in the
summary the build returns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpurec.dataset.store import (
    BadLine,
    atomic_write_parquet,
    count_torn_fragments,
    raw_row_files,
    read_jsonl,
)


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
    for p in raw_row_files(raw):
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
    if "schema" not in df:
        df["schema"] = 1
    df["schema"] = df["schema"].fillna(1).astype(int)
    main = df[~is_repeat & (df["item"] != "idle")]
    v1 = _v1_columns(main, pd)
    if len(main):
        ok_last = main["status"].eq("ok") if "status" in main else pd.Series(True, index=main.index)
        main = (main.assign(_ok=ok_last).sort_values(["_ok", "schema", "t_unix"], kind="stable")
                .drop_duplicates("id", keep="last").drop(columns="_ok"))
        if v1 is not None:
            main = main.merge(v1, on="id", how="left")
    nets = main[main["item"] == "network"]
    in_network = _in_network_table(nets, pd)
    if "in_network" in nets:
        nets = nets.drop(columns="in_network")
    for name, part in (("operations", main[main["item"] == "op"]), ("networks", nets),
                       ("peaks", main[main["item"] == "peak"]),
                       ("in_network", in_network),
                       ("repeats", df[is_repeat & (df["item"] != "idle")]), ("idle", idle)):
        if "in_network" in part:
            part = part.drop(columns="in_network")
        part = part.dropna(axis=1, how="all")
        atomic_write_parquet(gpu_dir / f"{name}.parquet", part)
        counts[name] = int(len(part))
    return {**counts, **damage}


V1_COLUMNS = ("time_ms", "energy_mj", "power_w", "dynamic_energy_mj", "time_iqr_ms")


def _v1_columns(main: Any, pd: Any) -> Any:
    """The latest successful eager-only (schema 1) figures of each id, as ``v1_*`` columns."""
    old = main[(main["schema"] == 1) & (main.get("status", "ok") == "ok")] if len(main) else main
    if not len(old) or not (main["schema"] >= 2).any():
        return None
    cols = [c for c in V1_COLUMNS if c in old]
    old = old.sort_values("t_unix", kind="stable").drop_duplicates("id", keep="last")
    return old[["id", *cols]].rename(columns={c: f"v1_{c}" for c in cols})


IN_NETWORK_KEYS = ("gpu", "gpu_uuid", "set_key", "mode", "run_id", "id")


def _in_network_table(nets: Any, pd: Any) -> Any:
    """One row per (network row, position) from the network rows' column-wise ``in_network``."""
    if "in_network" not in nets:
        return pd.DataFrame()
    frames = []
    for _, r in nets.iterrows():
        cols = r["in_network"]
        if not isinstance(cols, dict) or not cols:
            continue
        f = pd.DataFrame(cols)
        for k in IN_NETWORK_KEYS:
            if k in r:
                f[k] = r[k]
        frames.append(f.rename(columns={"id": "network_id"}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def build_all(root: Path | str = "datasets", *, allow_corrupt: bool = False) -> dict[str, dict[str, Any]]:
    """Rebuild every ``<root>/<gpu>/`` that has a ``raw/`` directory; {gpu dir: build summary}."""
    return {p.parent.name: build_gpu_dataset(p.parent, allow_corrupt=allow_corrupt)
            for p in sorted(Path(root).glob("*/raw"))}
