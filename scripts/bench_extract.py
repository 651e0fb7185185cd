"""Extraction speed: how long ``gpurec.ops.extract_operations`` takes on this machine.

For vit_b_16 at batch 32 (target: under 1 s on a 2-core CPU machine), mobilenet_v3_large
and resnet50, in both modes: the first call in a fresh process (``cold``: builds the model
on the meta device and traces it) and the best of ``--repeat`` later calls (``warm``: the
traced graph is cached per model and mode, so this is the interpretation on meta).

    PYTHONPATH=. python scripts/bench_extract.py [--repeat 5] [--batch 32]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = ("vit_b_16", "mobilenet_v3_large", "resnet50")
TARGET_S = 1.0  # vit_b_16, batch 32, warm


def bench(model: str, batch: int, mode: str, repeat: int) -> dict[str, float]:
    from gpurec.ops import extract_operations

    shape = (batch, 3, 224, 224)
    t0 = time.perf_counter()
    ops = extract_operations(model, shape, mode=mode)
    cold = time.perf_counter() - t0
    warm = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        extract_operations(model, shape, mode=mode)
        warm = min(warm, time.perf_counter() - t0)
    return {"cold_s": cold, "warm_s": warm, "ops": len(ops), "distinct": len({op.signature for op in ops})}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=5, help="warm calls; the best is reported")
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args(argv)

    t0 = time.perf_counter()
    import torch
    import torchvision  # noqa: F401  (import cost is not extraction cost)

    import_s = time.perf_counter() - t0
    print(f"torch {torch.__version__}, {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
          f"torch threads {torch.get_num_threads()}; importing torch+torchvision took {import_s:.2f} s")
    print(f"batch {a.batch}, 224x224; cold = first call (build on meta + trace + interpret), "
          f"warm = best of {a.repeat}\n")
    header = f"{'model':<20} {'mode':<10} {'ops':>5} {'distinct':>8} {'cold s':>8} {'warm s':>8}"
    print(header)
    print("-" * len(header))
    results = {}
    for model in MODELS:
        for mode in ("inference", "training"):
            r = bench(model, a.batch, mode, a.repeat)
            results[(model, mode)] = r
            print(f"{model:<20} {mode:<10} {r['ops']:>5} {r['distinct']:>8} {r['cold_s']:>8.3f} {r['warm_s']:>8.3f}")
    vit = max(results[("vit_b_16", m)]["warm_s"] for m in ("inference", "training"))
    verdict = "meets" if vit < TARGET_S else "MISSES"
    print(f"\nvit_b_16 batch {a.batch} warm: {vit:.3f} s ({verdict} the < {TARGET_S:.0f} s target)")
    return 0 if vit < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
