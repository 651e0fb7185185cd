"""Validation log from the whole-network measurements collected on real GPUs.

For every network row in ``datasets/<gpu>/networks.parquet`` (measured by
``gpurec collect`` on the GPU it names, with the same method as ``gpurec validate``), compare
the measurement with the shipped predictor and with the sum of the measured operations,
through the same code path as ``gpurec validate`` (``gpurec.validate.validate`` with the
measurement given).  Writes datasets/validation/validation_log.jsonl and a plot.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gpurec.collect.plan import TEST_ARCHS, ModelInputSet
from gpurec.dataset import load_dataset
from gpurec.dataset.store import JsonlShard
from gpurec.model import load_predictor
from gpurec.validate import plot_log, validate

OUT = Path("datasets/validation")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / "validation_log.jsonl"
    if log.exists():
        log.unlink()  # derived file: regenerated from the measured rows every time
    p = load_predictor()
    nets = load_dataset(table="networks")
    with JsonlShard(log) as fh:
        for r in nets.sort_values(["gpu", "set_key", "mode"]).to_dict("records"):
            fh.append(_record(p, r))
    plot_log(log, OUT / "predicted_vs_measured.png")
    print(f"wrote {log}")
    return 0


def _record(p: Any, r: dict[str, Any]) -> dict[str, Any]:
    """One validation record for one measured network row."""
    s = ModelInputSet.parse(r["set_key"])
    meas = {k: r.get(k) for k in ("gpu", "time_ms", "energy_mj", "power_w", "sm_clock_mhz", "driver", "torch",
                                  "host_cpu")}
    rec = validate(s.arch, s.batch, s.resolution, r["mode"], log_path=None, predictor=p, measurement=meas)
    rec["unseen_architecture"] = s.arch in TEST_ARCHS
    rec["measurement_source"] = f"gpurec collect network row {r['id']} (run {r['run_id']})"
    return rec


if __name__ == "__main__":
    sys.exit(main())
