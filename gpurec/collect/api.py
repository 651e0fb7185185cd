"""``gpurec collect``: plan, shard, and measure on this machine's GPUs (one worker per board).

``cli.py`` parses the command line into :class:`CollectOptions` and calls :func:`collect`.
With several devices, each worker is a child process started with a spec file
(``python -m gpurec.collect SPEC.json``), so no argument strings are rewritten; a worker
whose CUDA context was lost exits with :data:`CONTEXT_LOST_EXIT` and is restarted, resuming
where it stopped, while budget remains.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpurec.sets import DATASET_ARCHS, DATASET_BATCH_SIZES, MODES

CONTEXT_LOST_EXIT = 3
WHAT = ("all", "ops", "networks")


@dataclass
class CollectOptions:
    """Everything one collection run needs (times in seconds)."""

    out: str
    models: list[str] = field(default_factory=lambda: list(DATASET_ARCHS))
    batch_sizes: list[int] = field(default_factory=lambda: list(DATASET_BATCH_SIZES))
    resolutions: list[int] = field(default_factory=lambda: [224])
    modes: list[str] = field(default_factory=lambda: list(MODES))
    plan: str | None = None
    what: str = "all"
    min_window_s: float = 0.3
    target_replay_ms: float = 2.0
    capture: bool = True
    in_network: bool = True
    max_instances: int = 4
    time_budget_s: float | None = None
    repeat_every: int = 40
    shard: str | None = None
    devices: list[int] | None = None
    plan_only: bool = False
    retry_failed: bool = False
    sm_clocks: list[int] | None = None
    i_own_this_gpu: bool = False
    device: str = "cuda:0"
    precision: str = "fp32"  # of a plan built here (a plan file's items carry their own)
    parent_pid: int | None = None  # set on a --devices worker: its parent holds the output's lock

    def __post_init__(self) -> None:
        from gpurec.ops.precision import check_precision

        check_precision(self.precision)
        if self.what not in WHAT:
            raise ValueError(f"--what must be one of {', '.join(WHAT)}, not '{self.what}'")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"unknown mode(s) {bad}: choose from {', '.join(MODES)}")

    def write(self, path: Path) -> Path:
        from gpurec.dataset.store import atomic_write_json

        atomic_write_json(path, asdict(self))
        return path

    @classmethod
    def read(cls, path: Path | str) -> CollectOptions:
        from gpurec.dataset.store import read_spec

        return read_spec(cls, path, "collect option")


def load_or_build_plan(opts: CollectOptions) -> list[Any]:
    from gpurec.collect.plan import WorkItem, build_plan, model_input_sets

    if opts.plan is not None:
        _check_plan(opts)
        data = json.loads(Path(opts.plan).read_text())
        return [WorkItem(**d) for d in data["items"]]
    sets = model_input_sets(opts.models, opts.batch_sizes, opts.resolutions)
    return build_plan(sets, opts.modes, networks=opts.what in ("all", "networks"),
                      operations=opts.what in ("all", "ops"), precision=opts.precision)


def _check_plan(opts: CollectOptions) -> None:
    if opts.plan is not None and not Path(opts.plan).is_file():
        raise FileNotFoundError(f"--plan {opts.plan} does not exist; pass an existing plan JSON (`gpurec tools plan` "
                                "writes datasets/plans/main.json) or leave --plan out to plan from --models")


def collect(opts: CollectOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run (or, with ``plan_only``, describe) this machine's part of the plan.

    Returns the plan summary, one worker's summary, or the workers' exit codes.  A run holds
    the output directory's lock (``--devices`` workers share their parent's; each also locks
    its own shard), so a second run on the same output raises CollectionInProgress at once."""
    from gpurec.collect.plan import parse_shard, shard_items
    from gpurec.collect.runner import output_lock

    _check_plan(opts)
    out = Path(opts.out)
    if opts.devices and not opts.plan_only:
        with output_lock(out):
            plan_path = Path(opts.plan) if opts.plan else out / "plan.json"
            if not plan_path.exists():
                from gpurec.dataset.store import atomic_write_json

                atomic_write_json(plan_path, {"items": [w.as_dict() for w in load_or_build_plan(opts)]})
            codes = launch_devices(opts.devices, replace(opts, plan=str(plan_path), devices=None,
                                                         parent_pid=os.getpid()), log)
        return {"workers": codes, "worst_exit": max(codes.values()) if codes else 0}
    items = load_or_build_plan(opts)
    index, count = parse_shard(opts.shard)
    mine = shard_items(items, index, count)
    if opts.plan_only:
        kinds: dict[str, int] = {}
        for w in mine:
            kinds[w.kind] = kinds.get(w.kind, 0) + 1
        return {"items": len(mine), "of": len(items), "shard": f"{index}/{count}", "kinds": kinds}
    shard_name = f"{index}of{count}"
    with contextlib.ExitStack() as locks:
        if opts.parent_pid is None:
            locks.enter_context(output_lock(out))
        locks.enter_context(output_lock(out, f".lock-rows-{shard_name}"))
        return run(mine, opts, shard_name, log)


def _config(opts: CollectOptions) -> Any:
    from gpurec.collect.measure import WindowConfig
    from gpurec.collect.runner import CollectConfig

    return CollectConfig(
        window=WindowConfig(min_window_s=opts.min_window_s, target_replay_ms=opts.target_replay_ms,
                            capture=opts.capture),
        max_instances=opts.max_instances, time_budget_s=opts.time_budget_s, repeat_every=opts.repeat_every,
        retry_failed=opts.retry_failed, in_network=opts.in_network)


def run(items: list[Any], opts: CollectOptions, shard_name: str, log: Callable[[str], None]) -> dict[str, Any]:
    """One worker: measure ``items`` on ``opts.device`` (once per locked clock when asked,
    on owned GPUs only; every lock is released on the way out)."""
    from gpurec.collect.runner import run_worker

    cfg = _config(opts)
    out = Path(opts.out)
    if not opts.sm_clocks:
        return run_worker(items, out, cfg, shard_name=shard_name, device=opts.device, log=log)
    from gpurec.collect.runner import match_nvml_index
    from gpurec.device import open_gpu
    from gpurec.device.clocks import locked_sm_clock

    gpu = open_gpu(match_nvml_index(0) if opts.device.startswith("cuda") else 0)
    summaries = {}
    for mhz in opts.sm_clocks:
        with locked_sm_clock(gpu, mhz, owned=opts.i_own_this_gpu):
            summaries[str(mhz)] = run_worker(items, out / f"sm{mhz}", cfg, shard_name=shard_name,
                                             device=opts.device, log=log)
    return {"clocks": summaries}


def launch_devices(devices: list[int], opts: CollectOptions, log: Callable[[str], None] = print,
                   poll_s: float = 0.5) -> dict[int, int]:
    """One worker process per local GPU, each its own shard and spec file; {worker: exit code}."""
    n = len(devices)
    t0 = time.time()
    out = Path(opts.out)

    def start(i: int, dev: int, budget_s: float | None) -> subprocess.Popen[bytes]:
        spec = replace(opts, shard=f"{i}/{n}", device="cuda:0", time_budget_s=budget_s)
        path = spec.write(out / f"worker-{i}of{n}.json")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(dev), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        cmd = [sys.executable, "-m", "gpurec.collect", str(path)]
        log(f"worker {i}/{n} on GPU {dev}: {' '.join(cmd)}")
        return subprocess.Popen(cmd, env=env)

    procs = {i: start(i, dev, opts.time_budget_s) for i, dev in enumerate(devices)}
    codes: dict[int, int] = {}
    while procs:
        time.sleep(poll_s)
        for i, p in list(procs.items()):
            rc = p.poll()
            if rc is None:
                continue
            del procs[i]
            left = None if opts.time_budget_s is None else opts.time_budget_s - (time.time() - t0)
            if rc == CONTEXT_LOST_EXIT and (left is None or left > 30):
                log(f"worker {i}/{n}: CUDA context lost; restarting (it resumes)")
                procs[i] = start(i, devices[i], left)
            else:
                codes[i] = rc
    return codes
