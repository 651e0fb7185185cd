"""Prediction speed, measured (against the speed targets of docs/speed.md; a benchmark, not a timed test):

* one ``vit_b_16`` estimate <= 50 ms after the first call;
* ``predict_many`` >= 50 candidates/s when every candidate is a distinct, never-seen
  MobileNet-sized ``nn.Module`` (random widths, kernels and depths, as a search produces them).

    from gpurec.model.bench import run_benchmarks
    run_benchmarks()          # {"vit_b_16_ms": ..., "fresh_modules_per_s": ..., ...}
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any


def random_mobilenet(seed: int) -> Any:
    """A MobileNetV2-like network with random widths, kernel sizes, expansion and depth."""
    import random

    from torch import nn

    rng = random.Random(seed)

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int) -> None:
            super().__init__()
            mid = cin * expand
            self.use_res = stride == 1 and cin == cout
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU6(inplace=True),
                nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid),
                nn.ReLU6(inplace=True), nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            y = self.body(x)
            return x + y if self.use_res else y

    width = rng.choice([16, 24, 32])
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU6()]
    cin = width
    for stage in range(rng.randint(4, 6)):
        cout = max(8, int(cin * rng.choice([1.0, 1.25, 1.5, 2.0])) // 8 * 8)
        for i in range(rng.randint(1, 4)):
            layers.append(Block(cin, cout, rng.choice([3, 5, 7]), 2 if i == 0 and stage % 2 == 0 else 1,
                                rng.choice([3, 4, 6])))
            cin = cout
    layers += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6(), nn.AdaptiveAvgPool2d(1),
               nn.Flatten(), nn.Linear(1280, 1000)]
    return nn.Sequential(*layers)


def _timed(fn: Any, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def run_benchmarks(predictor: Any = None, n_fresh: int = 50, repeat: int = 7, gpu: str = "H100",
                   seed: int = 1000, fresh_lists: int = 3) -> dict[str, Any]:
    """Measure both targets with ``predictor`` (default: the shipped models).

    ``fresh_lists`` lists of ``n_fresh`` new candidates each (seeds never reused, so no list
    repeats a structure of another); the rate reported is their median, with every list's rate
    and the load average before and after (the machine may be shared).
    """
    import torch

    if predictor is None:
        from gpurec.model import load_predictor

        predictor = load_predictor(check_data=False)
    load_before = os.getloadavg()[0]
    shape = (32, 3, 224, 224)
    first = _timed(lambda: predictor.predict("vit_b_16", shape, gpu=gpu), 1)[0]
    vit = _timed(lambda: predictor.predict("vit_b_16", shape, gpu=gpu), repeat)
    rates, seconds, ops = [], [], []
    for k in range(max(1, fresh_lists)):
        mods = [random_mobilenet(seed + k * n_fresh + i) for i in range(n_fresh)]
        t0 = time.perf_counter()
        ests = predictor.predict_many([(m, (8, 3, 224, 224)) for m in mods], mode="inference", gpu=gpu)
        seconds.append(time.perf_counter() - t0)
        rates.append(n_fresh / seconds[-1])
        ops.extend(e.n_ops for e in ests)
    return {
        "vit_b_16_first_ms": first, "vit_b_16_ms_median": statistics.median(vit), "vit_b_16_ms_min": min(vit),
        "vit_b_16_target_ms": 50.0,
        "fresh_modules": n_fresh, "fresh_lists": len(rates), "fresh_modules_s": statistics.median(seconds),
        "fresh_modules_per_s": statistics.median(rates), "fresh_modules_per_s_each": rates,
        "fresh_modules_target_per_s": 50.0, "fresh_ops_mean": statistics.mean(ops),
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "load_avg_1min": load_before, "load_avg_1min_after": os.getloadavg()[0],
        "torch_threads": torch.get_num_threads(),
    }
