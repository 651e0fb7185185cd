"""Validation log from the whole-network measurements collected on real GPUs.

For every network row in ``datasets/<gpu>/networks.parquet`` (measured by ``gpurec collect``
on the GPU it names, with the same method as ``gpurec validate``), compare the measurement
with the shipped predictor and with the sum of the measured operations, through the same
code path as ``gpurec validate`` (``gpurec.validate.validate`` with the measurement given).
Writes datasets/validation/validation_log.jsonl and its plot; run through
``gpurec tools validation-log``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_log(root: Path | str = ".") -> Path:
    """(Re)write <root>/datasets/validation/validation_log.jsonl (a derived file) and its plot."""
    from gpurec.dataset import load_dataset
    from gpurec.dataset.store import JsonlShard
    from gpurec.model import load_predictor
    from gpurec.validate import plot_log

    root = Path(root)
    out = root / "datasets" / "validation"
    out.mkdir(parents=True, exist_ok=True)
    log = out / "validation_log.jsonl"
    tmp = out / "validation_log.jsonl.tmp"
    tmp.unlink(missing_ok=True)
    p = load_predictor(root / "models", data_root=root / "datasets")
    nets = load_dataset(table="networks", root=root / "datasets")
    with JsonlShard(tmp) as fh:
        for r in nets.sort_values(["gpu", "set_key", "mode"]).to_dict("records"):
            fh.append(_record(p, r))
    tmp.replace(log)
    plot_log(log, out / "predicted_vs_measured.png")
    return log


def _record(p: Any, r: dict[str, Any]) -> dict[str, Any]:
    """One validation record for one measured network row."""
    from gpurec.sets import TEST_ARCHS, ModelInputSet
    from gpurec.validate import validate

    s = ModelInputSet.parse(r["set_key"])
    meas = {k: r.get(k) for k in ("gpu", "time_ms", "energy_mj", "power_w", "sm_clock_mhz", "driver", "torch",
                                  "host_cpu")}
    rec = validate(s.arch, s.batch, s.resolution, r["mode"], log_path=None, predictor=p, measurement=meas)
    rec["unseen_architecture"] = s.arch in TEST_ARCHS
    rec["measurement_source"] = f"gpurec collect network row {r['id']} (run {r['run_id']})"
    return rec
