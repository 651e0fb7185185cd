"""Which kernels nn.RMSNorm launches on CUDA, and how long they take beside nn.LayerNorm's (session 37).

Why: gpurec has measured rows for LayerNorm, none for RMSNorm (Llama-style decoders).  If torch runs
RMSNorm as one fused kernel per pass, as LayerNorm, LayerNorm's rows can stand for it; if it runs it
as a chain of elementwise kernels, they cannot.  Run on the GPU machine:

    PYTHONPATH=. python3 scripts/norm_kernel_probe.py OUT.json

For each shape, dtype and mode it records the CUDA kernels the profiler saw in one step and the
median step time over CUDA-event-timed blocks (no CUDA graph; each step is tens of microseconds or more).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable

import torch
from torch import nn

SHAPES = [(8192, 768), (16384, 1024), (4096, 4096), (32768, 2048)]


def step_fn(norm: nn.Module, x: torch.Tensor, training: bool) -> Callable[[], None]:
    grad = torch.randn_like(x)

    def step() -> None:
        y = norm(x)
        if training:
            y.backward(grad)
            x.grad = None
            norm.zero_grad(set_to_none=True)
    return step


def kernels(step: Callable[[], None]) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA" and "Memset" not in e.name]


def median_ms(step: Callable[[], None], calls: int = 50, blocks: int = 7) -> float:
    for _ in range(5):
        step()
    times = []
    for _ in range(blocks):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def main(out_path: str) -> None:
    rows = []
    for rows_, d in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            for training in (False, True):
                for name, norm in (("RMSNorm", nn.RMSNorm(d)), ("LayerNorm", nn.LayerNorm(d))):
                    norm = norm.to("cuda", dtype)
                    x = torch.randn(rows_, d, device="cuda", dtype=dtype, requires_grad=training)
                    with torch.inference_mode(not training):
                        step = step_fn(norm, x, training)
                        row = {"module": name, "rows": rows_, "d": d, "dtype": str(dtype).replace("torch.", ""),
                               "mode": "training" if training else "inference", "kernels": kernels(step),
                               "time_ms": median_ms(step)}
                    rows.append(row)
                    print(row, flush=True)
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    with open(out_path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
