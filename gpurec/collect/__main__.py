"""``python -m gpurec.collect``: the collection entry point (``gpurec collect`` wraps it).

It runs where only torch, numpy, pandas and nvidia-ml-py exist (the GPU machines), so it
uses argparse and nothing heavier.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpurec.collect.measure import WindowConfig
from gpurec.collect.plan import (
    DATASET_ARCHS,
    DATASET_BATCH_SIZES,
    MODES,
    WorkItem,
    build_plan,
    model_input_sets,
    parse_shard,
    shard_items,
)
from gpurec.collect.runner import CollectConfig, launch_devices, run_worker
from gpurec.dataset.store import atomic_write_json
from gpurec.device.clocks import parse_clock_list


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpurec collect", description=__doc__)
    p.add_argument("--models", default=",".join(DATASET_ARCHS))
    p.add_argument("--batch-sizes", default=",".join(map(str, DATASET_BATCH_SIZES)))
    p.add_argument("--resolutions", default="224")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--plan", type=Path, default=None, help="precomputed plan JSON (skips planning)")
    p.add_argument("--what", choices=["all", "ops", "networks"], default="all")
    p.add_argument("--min-window", type=float, default=0.3, help="energy window, seconds")
    p.add_argument("--target-replay-ms", type=float, default=2.0, help="GPU time of one graph replay")
    p.add_argument("--no-capture", action="store_true", help="eager only (no CUDA graphs)")
    p.add_argument("--no-in-network", action="store_true", help="skip the profiler attribution pass")
    p.add_argument("--max-instances", type=int, default=4)
    p.add_argument("--time-budget-s", type=float, default=None)
    p.add_argument("--repeat-every", type=int, default=40)
    p.add_argument("--shard", default=None, help="i/n (also honours RANK/WORLD_SIZE and Slurm arrays)")
    p.add_argument("--devices", default=None, help="one worker per local GPU, e.g. 0,1,2,3")
    p.add_argument("--plan-only", action="store_true")
    p.add_argument("--retry-failed", action="store_true", help="measure again the rows that failed before")
    p.add_argument("--sm-clocks", default=None, help="lock the SM clock at each value in turn (owned GPUs only)")
    p.add_argument("--i-own-this-gpu", action="store_true", help="confirm clock locking is allowed here")
    p.add_argument("--device", default="cuda:0", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def load_or_build_plan(args: argparse.Namespace) -> list[WorkItem]:
    if args.plan is not None and args.plan.exists():
        data = json.loads(args.plan.read_text())
        return [WorkItem(**d) for d in data["items"]]
    sets = model_input_sets(_csv(args.models), [int(b) for b in _csv(args.batch_sizes)],
                            [int(r) for r in _csv(args.resolutions)])
    return build_plan(sets, _csv(args.modes), networks=args.what in ("all", "networks"),
                      operations=args.what in ("all", "ops"))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    if args.devices and not args.worker:
        plan_path = args.plan or (args.out / "plan.json")
        if not plan_path.exists():
            items = load_or_build_plan(args)
            atomic_write_json(plan_path, {"items": [w.as_dict() for w in items]})
        rest = _drop_option(_drop_option(argv, "--devices"), "--plan") + ["--plan", str(plan_path)]
        return launch_devices([int(d) for d in _csv(args.devices)], rest)
    items = load_or_build_plan(args)
    index, count = parse_shard(args.shard)
    mine = shard_items(items, index, count)
    if args.plan_only:
        kinds: dict[str, int] = {}
        for w in mine:
            kinds[w.kind] = kinds.get(w.kind, 0) + 1
        print(json.dumps({"items": len(mine), "of": len(items), "shard": f"{index}/{count}", "kinds": kinds}, indent=1))
        return 0
    cfg = CollectConfig(
        window=WindowConfig(min_window_s=args.min_window, target_replay_ms=args.target_replay_ms,
                            capture=not args.no_capture),
        max_instances=args.max_instances, time_budget_s=args.time_budget_s, repeat_every=args.repeat_every,
        retry_failed=args.retry_failed, in_network=not args.no_in_network,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    clocks = parse_clock_list(args.sm_clocks)
    if not clocks:
        run_worker(mine, args.out, cfg, shard_name=f"{index}of{count}", device=args.device)
        return 0
    return clock_sweep(mine, args, cfg, clocks, f"{index}of{count}")


def clock_sweep(items: list[WorkItem], args: argparse.Namespace, cfg: CollectConfig, clocks: list[int],
                shard_name: str) -> int:
    """Measure ``items`` once per locked SM clock, into ``out/sm<MHz>/``; always restores."""
    from gpurec.collect.runner import _match_nvml_index
    from gpurec.device import open_gpu
    from gpurec.device.clocks import locked_sm_clock

    gpu = open_gpu(_match_nvml_index(0) if args.device.startswith("cuda") else 0)
    for mhz in clocks:
        with locked_sm_clock(gpu, mhz, owned=args.i_own_this_gpu):
            run_worker(items, args.out / f"sm{mhz}", cfg, shard_name=shard_name, device=args.device)
    return 0


def _drop_option(argv: list[str], name: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == name:
            skip = True
            continue
        if a.startswith(name + "="):
            continue
        out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
