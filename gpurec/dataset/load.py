"""Load the shipped measurements."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

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
    return df[df["precision"].fillna("fp32") == "fp32"].reset_index(drop=True)


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
