"""Load the shipped measurements."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from gpurec.ops.precision import rows_at_precision

DATASET_DIR_ENV = "GPUREC_DATASETS"


def default_root() -> Path:
    """``datasets/`` beside the package (a source checkout), or $GPUREC_DATASETS."""
    import os

    if os.environ.get(DATASET_DIR_ENV):
        return Path(os.environ[DATASET_DIR_ENV])
    here = Path(str(resources.files("gpurec"))).parent
    return here / "datasets"


def _gpu_dirs(root: Path, gpu: str | None) -> list[Path]:
    dirs = [p for p in sorted(root.iterdir()) if (p / "operations.parquet").exists() or (p / "networks.parquet").exists()]
    if gpu is None:
        return dirs
    from gpurec.catalog import canonical_name

    want = canonical_name(gpu)
    out = []
    for d in dirs:
        import pandas as pd

        f = d / "networks.parquet" if (d / "networks.parquet").exists() else d / "operations.parquet"
        names = set(pd.read_parquet(f, columns=["gpu"])["gpu"])
        if want in names:
            out.append(d)
    return out


def fp32_rows(df: Any) -> Any:
    """The rows measured at PyTorch's default precision (rows from before precision was a
    column are fp32): what predictions without a ``precision=`` are compared against."""
    if "precision" not in df:
        return df
    return rows_at_precision(df).reset_index(drop=True)


def load_dataset(gpu: str | None = None, root: Path | str | None = None, table: str = "operations",
                 status: str | None = "ok", source: str = "gpurec") -> Any:
    """Per-operation measurements (``table='networks'`` for whole networks) as a DataFrame.

    Columns include gpu (NVML name), op_kind, op_signature, mode, time_ms, energy_mj,
    dynamic_energy_mj, power_w, sm_clock_mhz, model_sets and provenance (driver, torch,
    host_cpu, date, run_id).  ``status=None`` keeps failed rows too.

    ``source='neusight'`` reads NeuSight's public measurements instead (tables ``operations``,
    ``models``, ``nodes``; gpurec.dataset.external): they are never mixed into this project's rows.
    """
    import pandas as pd

    if source == "neusight":
        from gpurec.dataset.external import load_neusight

        df = load_neusight(root, table)
        if gpu is not None:
            from gpurec.catalog import canonical_name

            df = df[df["gpu"] == canonical_name(gpu)].reset_index(drop=True)
        return df
    if source != "gpurec":
        raise ValueError(f"source must be 'gpurec' (this project's measurements) or 'neusight', not {source!r}")

    root = Path(root) if root is not None else default_root()
    if not root.exists():
        raise FileNotFoundError(f"no datasets directory at {root}; set ${DATASET_DIR_ENV} or pass root=")
    frames = [pd.read_parquet(d / f"{table}.parquet") for d in _gpu_dirs(root, gpu) if (d / f"{table}.parquet").exists()]
    if not frames:
        raise FileNotFoundError(f"no {table} data for gpu={gpu!r} under {root}")
    df = pd.concat(frames, ignore_index=True)
    if status is not None and "status" in df:
        df = df[df["status"] == status].reset_index(drop=True)
    return df


BOARD_REPEAT_COLUMNS = ("gpu_time_ms", "gpu_energy_mj", "gpu_power_w", "time_ms", "peak_memory_bytes")


def board_repeats(root: Path | str | None = None, columns: tuple[str, ...] = BOARD_REPEAT_COLUMNS) -> Any:
    """The same row identity (GPU kind, precision, id) measured successfully on two boards of one
    GPU kind (different ``gpu_uuid``), by the same method (schema 2): one record per identity,
    the earliest and the latest board's figures side by side (``first_<col>``, ``second_<col>``).

    The tables keep only the latest measurement of an identity; the raw shards keep both, and
    their spread is the floor no model of one GPU kind can beat (boards, hosts, days differ)."""
    import pandas as pd

    from gpurec.dataset.store import raw_row_files, read_jsonl

    root = Path(root) if root is not None else default_root()
    by_identity: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for gpu_dir in sorted(p for p in root.iterdir() if (p / "raw").is_dir()):
        for path in raw_row_files(gpu_dir / "raw"):
            for r in read_jsonl(path):
                if (r.get("repeat") or r.get("item") == "idle" or r.get("status") != "ok"
                        or int(r.get("schema", 1)) < 2 or not r.get("gpu_uuid")):
                    continue
                key = (r.get("gpu", ""), r.get("precision") or "fp32", r["id"])
                by_identity.setdefault(key, []).append(r)
    records = []
    for (gpu, precision, row_id), rows in by_identity.items():
        rows = sorted(rows, key=lambda r: r.get("t_unix", 0.0))
        first = rows[0]
        second = next((r for r in reversed(rows) if r["gpu_uuid"] != first["gpu_uuid"]), None)
        if second is None:
            continue
        rec = {"gpu": gpu, "precision": precision, "id": row_id, "item": first["item"], "mode": first.get("mode"),
               "first_gpu_uuid": first["gpu_uuid"], "second_gpu_uuid": second["gpu_uuid"]}
        for c in columns:
            rec[f"first_{c}"] = first.get(c)
            rec[f"second_{c}"] = second.get(c)
        records.append(rec)
    return pd.DataFrame.from_records(records)
