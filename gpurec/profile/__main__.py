"""``python -m gpurec.profile``: profile one network until the CLI wires ``gpurec profile``.

Prints the table; writes result.json, table.txt and plots into --out. Exit status: 0 when
the trace worked (a failed ncu run is reported in the table and JSON), 1 when the network
could not be traced, 2 when ncu is missing.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from gpurec.profile.api import ProfileError, profile_network
from gpurec.profile.ncu_io import SAMPLING_MODES, NcuNotFound
from gpurec.profile.report import render_table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpurec.profile", description=__doc__)
    p.add_argument("--model", required=True, help="torchvision model name, e.g. resnet50")
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--mode", choices=["inference", "training"], default="inference")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16", "fp16"], default="fp32")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: a temp folder)")
    p.add_argument("--gpu-index", type=int, default=0)
    p.add_argument("--device", default=None, help="override, e.g. 'cpu' for a dry run with --no-ncu")
    p.add_argument("--no-ncu", action="store_true", help="skip hardware counters (no Nsight Compute)")
    p.add_argument("--ncu-sampling", choices=list(SAMPLING_MODES), default="all",
                   help="per-config: profile one launch per (kernel, grid, block), impute repeats")
    p.add_argument("--trace-timeout-s", type=float, default=600.0)
    p.add_argument("--ncu-timeout-s", type=float, default=1200.0)
    p.add_argument("--max-warmup-iters", type=int, default=40)
    p.add_argument("--max-warmup-s", type=float, default=20.0)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    args = p.parse_args(argv)
    # SIGTERM (e.g. from `timeout`) -> SystemExit, so the child process groups get killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = profile_network(
            args.model, args.batch_size, args.resolution, args.mode, args.out, args.gpu_index,
            ncu=not args.no_ncu, precision=args.precision, device=args.device,
            trace_timeout_s=args.trace_timeout_s, ncu_timeout_s=args.ncu_timeout_s, plots=not args.no_plots,
            max_warmup_iters=args.max_warmup_iters, max_warmup_s=args.max_warmup_s,
            ncu_sampling=args.ncu_sampling)
    except NcuNotFound as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except ProfileError as exc:
        print(f"profile failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_json(), indent=1) if args.json else render_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
