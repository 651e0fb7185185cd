"""What backs each GPU's prediction, and how wide its band is for it.

Four levels, strongest first:

- ``measured: host-free``: this project's rows of that GPU include host-free (CUDA graph)
  GPU time and energy;
- ``measured: eager``: only eager rows (time and energy with the host's dispatch inside);
- ``public per-operation data (time)``: published per-operation latencies (NeuSight's
  table under ``datasets/external/neusight/``); no energy;
- ``specifications only``: the catalogue's datasheet figures.

Which GPU has which level comes from the data present (``datasets/<gpu>/`` and the public
table), never from a hand-written list. The band rule: the predictor's band for a GPU it was
trained on is its cross-validated band; where the evidence behind a figure is weaker, the
band's width in log space is multiplied (see :func:`band_exponent`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST_FREE = "measured: host-free"
EAGER = "measured: eager"
PUBLIC = "public per-operation data (time)"
SPECS = "specifications only"
LEVELS = (HOST_FREE, EAGER, PUBLIC, SPECS)
UNMEASURED_WIDENING = 3.0  # the predictor's own widening for GPUs it has no rows of (log space)


@dataclass(frozen=True)
class EvidenceSets:
    """NVML names of the GPUs with each kind of data, and where that was read."""

    host_free: frozenset[str] = frozenset()
    eager: frozenset[str] = frozenset()
    public: frozenset[str] = frozenset()
    source: str = "no data found"


def evidence_of(gpu: str, sets: EvidenceSets) -> str:
    """The strongest evidence level behind ``gpu`` (an NVML name)."""
    if gpu in sets.host_free:
        return HOST_FREE
    if gpu in sets.eager:
        return EAGER
    if gpu in sets.public:
        return PUBLIC
    return SPECS


def band_exponent(level: str, figure: str, widening: float = UNMEASURED_WIDENING, measured_gpu: bool = True) -> float:
    """How many times wider (in log space) than the predictor's band a figure's band is.

    ``figure`` is "time", "energy" (eager: the host's dispatch inside), "gpu_time" or
    "gpu_energy" (host-free).  For a GPU the models have rows of (``measured_gpu``), the
    predictor's band is the host-free measured one: a figure measured the way it is reported
    keeps it (1); one backed only by specifications gets the predictor's widening for
    unmeasured GPUs (``widening``, 3); figures in between (the host-free figures of an eager-only
    GPU, the time of a GPU with public per-operation times) get the geometric middle,
    sqrt(widening).  For a GPU without rows, the predictor's band already compounds the measured
    band with the cross-GPU model's validated error (gpurec.model.bands): public per-operation
    times back its time (1); its energy, and every figure of a GPU with specifications only,
    rest on nothing measured of that GPU (sqrt(widening)).  A stated rule, not a measured one:
    no GPU has every kind of data to calibrate it.
    """
    mid = math.sqrt(widening)
    if not measured_gpu:
        if level in (HOST_FREE, EAGER) or (level == PUBLIC and figure in ("time", "gpu_time")):
            return 1.0
        return mid
    if level == HOST_FREE:
        return 1.0
    if level == EAGER:
        return 1.0 if figure in ("time", "energy") else mid
    if level == PUBLIC:
        return mid if figure in ("time", "gpu_time") else widening
    return widening


def widen(value: float, low: float, high: float, exponent: float) -> tuple[float, float]:
    """The band ``low``-``high`` around ``value`` with its log-space width multiplied by ``exponent``."""
    if exponent == 1.0 or not (value > 0 and low > 0 and high > 0):
        return low, high
    return value * (low / value) ** exponent, value * (high / value) ** exponent


# -- reading what exists ------------------------------------------------------------------------
def _gpu_names(path: Path) -> set[str]:
    import pyarrow.parquet as pq

    return {str(g) for g in pq.read_table(path, columns=["gpu"]).column("gpu").unique().to_pylist() if g}


def _has_host_free(path: Path) -> set[str]:
    """GPUs of a table with at least one host-free GPU time."""
    import pyarrow.parquet as pq

    if "gpu_time_ms" not in pq.read_schema(path).names:
        return set()
    df = pq.read_table(path, columns=["gpu", "gpu_time_ms"]).to_pandas()
    return {str(g) for g in df.loc[df["gpu_time_ms"].notna(), "gpu"].unique()}


def _public_gpus(root: Path) -> set[str]:
    """GPUs of the public per-operation table (NeuSight), however it was stored; none if absent."""
    try:  # the loader, where this gpurec has one
        from gpurec.dataset.load import load_dataset

        df = load_dataset(root=root, source="neusight")  # type: ignore[call-arg]
        return {str(g) for g in df["gpu"].unique()}
    except (TypeError, FileNotFoundError):  # no loader, or not the loader's layout: read the files themselves
        pass
    except (KeyError, ValueError):
        return set()
    folder = root / "external" / "neusight"
    names: set[str] = set()
    if folder.is_dir():
        import pandas as pd

        for path in sorted(folder.rglob("*")):
            if path.suffix == ".parquet":
                names |= _gpu_names(path) if "gpu" in _columns(path) else set()
            elif path.suffix == ".csv":
                head = pd.read_csv(path, nrows=0)
                if "gpu" in head.columns:
                    names |= {str(g) for g in pd.read_csv(path, usecols=["gpu"])["gpu"].unique()}
    return names


def _columns(path: Path) -> list[str]:
    import pyarrow.parquet as pq

    return list(pq.read_schema(path).names)


def load_evidence(root: Path | str | None = None, manifest: dict[str, Any] | None = None) -> EvidenceSets:
    """The evidence sets from the data present under ``root`` (default: the datasets directory).

    Own GPUs: every ``<root>/<gpu>/operations.parquet`` (host-free when any row has
    ``gpu_time_ms``, else eager). Public GPUs: the NeuSight table, when it is there. Without a
    datasets directory (an installed package), the trained models' manifest says which GPUs
    were measured and how (``target_sources``).
    """
    from gpurec.dataset.load import default_root

    base = Path(root) if root is not None else default_root()
    host_free: set[str] = set()
    eager: set[str] = set()
    if base.is_dir():
        for d in sorted(p for p in base.iterdir() if p.is_dir()):
            table = d / "operations.parquet"
            if not table.exists():
                continue
            gpus = _gpu_names(table)
            hf = _has_host_free(table)
            host_free |= hf
            eager |= gpus - hf
        public = _public_gpus(base)
        if host_free or eager or public:
            return EvidenceSets(frozenset(host_free), frozenset(eager), frozenset(public),
                                f"the datasets in {base}")
    if manifest:
        return _from_manifest(manifest)
    return EvidenceSets()


def _from_manifest(manifest: dict[str, Any]) -> EvidenceSets:
    """GPUs the models were trained on: host-free where their networks were trained on host-free
    targets, else eager."""
    measured = set(manifest.get("gpus_measured", []))
    hf = set()
    if manifest.get("target_sources", {}).get("networks") == "host_free":
        hf = measured & set(manifest.get("gpus_networks_measured", []))
    return EvidenceSets(frozenset(hf), frozenset(measured - hf), frozenset(),
                        "the trained models' manifest (no datasets directory)")


def level_counts(levels: Iterable[str]) -> dict[str, int]:
    """How many GPUs have each level, strongest first (for a one-line summary)."""
    levels = list(levels)
    return {lv: levels.count(lv) for lv in LEVELS if lv in levels}
