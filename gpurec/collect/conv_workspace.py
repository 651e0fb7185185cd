"""cuDNN's workspace per convolution in inference, on the GPU at hand (GPU side).

Why: a convolution's workspace lifts a CNN's inference peak (VGG-16 at batch 128 holds one of its
input plus output size), and cuDNN does not document which algorithm takes how much.  With
PyTorch's defaults (``cudnn.benchmark`` off) each configuration of a grid is built, called once
(plans, heuristics), then called again under ``reset_peak_memory_stats``: the peak allocated
during that call, minus what was allocated before and minus the output, is its workspace.

    python -m gpurec.collect.conv_workspace OUT.jsonl BUDGET_S [main|narrow]

One JSON line per configuration (a failure is a line with ``error``), after a first line of
provenance.  Nothing is changed on the card.
"""
from __future__ import annotations

import itertools
import json
import sys
import time


def _grid(name: str) -> list[tuple[str, int, int, int, int, int, int, int]]:
    """(precision, batch, in channels, out channels, size, kernel, stride, groups) of a grid: "main"
    (square layers of 64-512 channels and RGB stems, 1x1 to 7x7, depthwise or not, fp32 and
    bf16-mixed) or "narrow" (fp32 layers of 3-96 channels, grouped by 2 or 4 or not)."""
    configs = []
    if name == "main":
        for prec, b, c, hw, k, s, dw in itertools.product(("fp32", "bf16-mixed"), (8, 32, 128), (3, 64, 128, 256, 512),
                                                          (224, 112, 56, 28, 14, 7), (1, 3, 5, 7), (1, 2),
                                                          (False, True)):
            if c == 3 and (dw or k == 1):
                continue
            configs.append((prec, b, c, 64 if c == 3 else c, hw, k, s, c if dw else 1))
    elif name == "narrow":
        for b, c, cout, hw, k, s, g in itertools.product((32, 128), (3, 16, 24, 32, 48, 96), (16, 32, 64, 96),
                                                         (224, 112, 56), (1, 3), (1, 2), (1, 2, 4)):
            if c % g or cout % g:
                continue
            configs.append(("fp32", b, c, cout, hw, k, s, g))
    else:
        raise ValueError(f"unknown grid {name!r}: main or narrow")
    return [cfg for cfg in configs
            if cfg[1] * (cfg[2] * cfg[4] ** 2 + cfg[3] * ((cfg[4] + 2 * (cfg[5] // 2) - cfg[5]) // cfg[6] + 1) ** 2) * 4
            <= 12e9]


def main() -> None:
    import torch
    import torch.nn as nn

    out_path = sys.argv[1]
    deadline = time.time() + float(sys.argv[2])
    dev = torch.device("cuda", 0)
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "cudnn_benchmark": torch.backends.cudnn.benchmark}
    configs = _grid(sys.argv[3] if len(sys.argv) > 3 else "main")
    with open(out_path, "w") as f:
        f.write(json.dumps({"meta": meta, "configs": len(configs)}) + "\n")
        for prec, b, c, cout, hw, k, s, groups in configs:
            if time.time() > deadline:
                break
            config = {"precision": prec, "batch": b, "cin": c, "cout": cout, "hw": hw, "kernel": k, "stride": s,
                      "groups": groups, "depthwise": groups > 1 and groups == c}
            try:
                conv = nn.Conv2d(c, cout, k, stride=s, padding=k // 2, groups=groups, bias=False).to(dev).eval()
                x = torch.randn(b, c, hw, hw, device=dev)
                ctx = torch.autocast("cuda", dtype=torch.bfloat16) if prec == "bf16-mixed" else torch.autocast("cuda", enabled=False)
                with torch.inference_mode(), ctx:
                    y = conv(x)
                    del y
                    torch.cuda.synchronize()
                    before = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    y = conv(x)
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated()
                    out_bytes = y.numel() * y.element_size()
                    del y
                row = {**config, "input_bytes": x.numel() * 4, "output_bytes": out_bytes,
                       "peak_above_before_bytes": peak - before, "workspace_bytes": peak - before - out_bytes}
                del x, conv
            except Exception as exc:  # recorded, never dropped
                row = {**config, "error": f"{type(exc).__name__}: {exc}"[:200]}
                torch.cuda.empty_cache()
            f.write(json.dumps(row) + "\n")
    print("done", sum(1 for _ in open(out_path)) - 1, "of", len(configs))


if __name__ == "__main__":
    main()
