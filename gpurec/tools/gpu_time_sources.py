"""Which GPU-time target to train on: in-network kernel time where the in-network
pass attributes it (isolated host-free time elsewhere), or isolated host-free time only.

Trains once per source on the same data and writes the errors that decide between them to a
JSON file that ``gpurec report accuracy`` renders (``benchmarks/gpu_time_sources.json``)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("benchmarks/gpu_time_sources.json")


def write(data_root: Path | str, out: Path | str = DEFAULT_OUT, work_dir: Path | str | None = None,
          tune_trials: int = 0, log: Any = None) -> dict[str, Any]:
    """Run the comparison (two trainings; minutes) and write it with its provenance."""
    import tempfile

    from gpurec.dataset.store import atomic_write_json
    from gpurec.model.fitting.data import current_data_hash
    from gpurec.model.fitting.evaluate import compare_gpu_time_sources
    from gpurec.reports.machine import machine_info

    with tempfile.TemporaryDirectory(prefix="gpurec_sources_") as tmp:
        result = compare_gpu_time_sources(data_root, Path(work_dir or tmp), log=log, tune_trials=tune_trials,
                                          baselines=False)
    doc = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "tune_trials": tune_trials,
           "data_sha256": current_data_hash(data_root), "machine": machine_info(), "sources": result}
    atomic_write_json(out, doc)
    return doc
