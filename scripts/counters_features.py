"""Per-operation ncu counters -> features: datasets/<gpu>/counters/op_features.parquet.

For each profiled (op_signature, mode) in counters.jsonl (gpurec.collect.counters: kernels of
one step summed), the raw summed counters plus the features of
gpurec.calibrate.features.memory_energy_features with that GPU's calibration: memory-energy
lower bound per level and in total (mJ per call), its share of the measured dynamic energy
(joined on op_signature + mode with operations.parquet), SMSP active / issue-slot and
tensor-core active / issue-slot utilization.

    PYTHONPATH=. python scripts/counters_features.py            # h200
    PYTHONPATH=. python scripts/counters_features.py --gpu h100 # once datasets/h100/counters exists
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(gpu_dir: Path, calibration: Path | None = None):  # noqa: ANN201 - a DataFrame
    import pandas as pd

    from gpurec.calibrate.features import op_feature_table

    counters_path = gpu_dir / "counters" / "counters.jsonl"
    cal_path = calibration or gpu_dir / "calibration" / "calibration.json"
    counters = pd.read_json(counters_path, lines=True, dtype=False)
    cal = json.loads(cal_path.read_text())
    ops_path = gpu_dir / "operations.parquet"
    ops = pd.read_parquet(ops_path) if ops_path.exists() else None
    if ops is not None and "status" in ops:
        ops = ops[ops["status"] == "ok"]
    table = op_feature_table(counters, cal, ops)
    table["calibration_file"] = str(cal_path.relative_to(ROOT) if cal_path.is_relative_to(ROOT) else cal_path)
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--gpu", default="h200", help="datasets/<gpu>/ folder")
    p.add_argument("--root", type=Path, default=ROOT / "datasets")
    p.add_argument("--calibration", type=Path, default=None, help="default: datasets/<gpu>/calibration/calibration.json")
    p.add_argument("--out", type=Path, default=None, help="default: datasets/<gpu>/counters/op_features.parquet")
    a = p.parse_args(argv)
    gpu_dir = a.root / a.gpu
    table = build(gpu_dir, a.calibration)
    out = a.out or gpu_dir / "counters" / "op_features.parquet"
    table.to_parquet(out, index=False)
    share = table.get("mem_share_of_dynamic")
    print(f"wrote {out}: {len(table)} rows ({table['op_kind'].nunique()} kinds); "
          f"median memory-energy share of dynamic energy {share.median():.2f}" if share is not None else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
