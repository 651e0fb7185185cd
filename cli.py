"""The ``gpurec`` command: a thin shell over library functions that return data.

Each subcommand parses, calls one library function and renders a table (people) or JSON
(programs).  Heavy imports happen inside the commands, so ``gpurec --help`` is instant.
Bad input exits with code 2 and one line; a missing GPU is a message, not a traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Which GPU runs your PyTorch network fastest or with the least energy.")
dataset_app = typer.Typer(no_args_is_help=True, help="Build and merge measured datasets.")
app.add_typer(dataset_app, name="dataset")

FORMATS = ("table", "json", "csv")
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


def _fail(msg: str, code: int = 2) -> None:
    typer.echo(f"gpurec: error: {msg}", err=True)
    raise typer.Exit(code)


def _guard(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a library call, turning expected errors into one-line messages."""
    from gpurec.device.errors import NVMLError

    try:
        return fn(*args, **kwargs)
    except NVMLError as exc:
        _fail(str(exc), 1)
    except (UsageError, ValueError, LookupError) as exc:
        _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 2)
    except FileNotFoundError as exc:
        _fail(str(exc), 1)


def _check_format(fmt: str, allowed: tuple[str, ...] = FORMATS) -> None:
    if fmt not in allowed:
        raise typer.BadParameter(f"'{fmt}' is not one of {', '.join(allowed)}", param_hint="--format")


def _check_shape(batch_size: int, resolution: int) -> tuple[int, int, int, int]:
    if batch_size < 1:
        _fail(f"--batch-size must be at least 1, got {batch_size}")
    if resolution < 1:
        _fail(f"--resolution must be positive, got {resolution}")
    return (batch_size, 3, resolution, resolution)


def _check_mode(mode: str) -> None:
    from gpurec.sets import MODES

    if mode not in MODES:
        _fail(f"--mode must be inference or training, not '{mode}'")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=lambda o: _clean(o) if isinstance(o, float) else str(o)))


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_lines=False)
    for _, header in columns:
        t.add_column(header, overflow="fold")
    for r in rows:
        t.add_row(*[_fmt(r.get(k)) for k, _ in columns])
    Console(width=200).print(t)


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1e6:
            return f"{v:.3g}"
        if a >= 1000:  # about four significant digits everywhere else
            return f"{v:,.0f}"
        if a >= 1:
            return f"{v:.{3 - (a >= 10) - (a >= 100)}f}"
        return f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return "" if v is None else str(v)


# ---------------------------------------------------------------------------------------------
@app.command()
def ops(
    model: str = typer.Option(None, "--model", "-m", help="torchvision classification model name"),
    batch_size: int = typer.Option(32, "--batch-size", "-b", help="images per step"),
    resolution: int = typer.Option(224, "--resolution", "-r", help="image height and width in pixels"),
    mode: str = typer.Option("inference", "--mode", help="inference (forward) or training (forward + backward)"),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json or csv"),
    list_models: bool = typer.Option(False, "--list-models", help="list the torchvision models and exit"),
) -> None:
    """List the operations a network executes, with their analytic features and totals."""
    _check_format(fmt)
    if list_models:
        from gpurec.ops import classification_models

        typer.echo("\n".join(classification_models()))
        return
    if not model:
        _fail("--model is required (see --list-models)")
    shape = _check_shape(batch_size, resolution)
    _check_mode(mode)
    _check_model_name(model)
    from gpurec.ops import extract_operations, network_totals

    with _Progress() as say:
        say(f"extracting the operations of {model}")
        op_list = _guard(extract_operations, model, shape, mode=mode, keep_sources=False)
    totals = network_totals(op_list)
    records = [op.to_record() for op in op_list]
    if fmt == "json":
        _print_json({"model": model, "input_shape": list(shape), "mode": mode,
                     "operations": [{"kind": r["op_kind"], "signature": r["op_signature"], "name": r["name"],
                                     "flops": int(r["flops"]), "flops_elementwise": int(r["flops_elementwise"]),
                                     "flops_bwd": int(r["flops_bwd"]), "bytes": int(r["bytes_total"]),
                                     "bytes_read": int(r["bytes_read"]), "bytes_written": int(r["bytes_written"]),
                                     "arithmetic_intensity": r["arithmetic_intensity"], "params": int(r["params"]),
                                     "output_elements": int(r["output_elements"]),
                                     "input_shapes": json.loads(r["input_shapes"]),
                                     "output_shapes": json.loads(r["output_shapes"]),
                                     "input_requires_grad": json.loads(r["input_requires_grad"]),
                                     "settings": json.loads(r["settings"])} for r in records],
                     "totals": totals})
    elif fmt == "csv":
        import pandas as pd

        typer.echo(pd.DataFrame(records).to_csv(index=False), nl=False)
    else:
        rows = [{**r, "params": int(r["params"])} for r in records]
        _table(rows, [("name", "layer"), ("op_kind", "kind"), ("input_shapes", "input"), ("flops", "FLOPs"),
                      ("bytes_total", "bytes"), ("arithmetic_intensity", "FLOP/B"), ("params", "params"),
                      ("op_signature", "signature")],
               title=f"{model} {list(shape)} {mode}: {totals['operations']} operations, "
                     f"{totals['distinct_operations']} distinct, {totals['flops'] / 1e9:.2f} GFLOPs forward")


@app.command()
def gpus(fmt: str = typer.Option("table", "--format", "-f", help="table or json")) -> None:
    """List the GPU catalogue (datasheet figures with their sources)."""
    _check_format(fmt, ("table", "json"))
    from dataclasses import asdict

    from gpurec.catalog import load_catalog

    specs = load_catalog()
    if fmt == "json":
        _print_json([asdict(s) for s in specs])
        return
    def idle(s: Any) -> str:
        w = s.power_bounds_w()[0]
        return f"{w:.0f}" if s.idle_power_w is not None else f"~{w:.0f} (est.)"

    _table([{**asdict(s), "alias": s.short_name, "source": "\n".join(s.sources), "idle": idle(s),
             "limit": f"{s.power_bounds_w()[1]:.0f}"} for s in specs],
           [("nvml_name", "NVML name"), ("alias", "alias"), ("architecture", "arch"), ("sm_count", "SMs"),
            ("max_sm_clock_mhz", "max MHz"), ("fp32_tflops", "FP32 TF"), ("tf32_tflops", "TF32 TF"),
            ("bf16_tflops", "BF16 TF"), ("memory_gb", "GB"), ("memory_bandwidth_gbs", "GB/s"),
            ("l2_cache_mb", "L2 MB"), ("tdp_w", "TDP W"), ("idle", "idle W"), ("limit", "limit W"),
            ("source", "sources")])


def _csv_list(text: str | None, kind: type = str, option: str = "") -> list[Any] | None:
    if text is None:
        return None
    try:
        return [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"{option} takes a comma-separated list of {kind.__name__}s, not '{text}'")
    return None


def _collect_options(out: Path, models: str | None, batch_sizes: str | None, resolutions: str, modes: str | None,
                     **kw: Any) -> Any:
    from gpurec.collect.api import CollectOptions
    from gpurec.sets import DATASET_ARCHS, DATASET_BATCH_SIZES, MODES

    return _guard(CollectOptions, out=str(out),
                  models=_csv_list(models, str, "--models") or list(DATASET_ARCHS),
                  batch_sizes=_csv_list(batch_sizes, int, "--batch-sizes") or list(DATASET_BATCH_SIZES),
                  resolutions=_csv_list(resolutions, int, "--resolutions"),
                  modes=_csv_list(modes, str, "--modes") or list(MODES), **kw)


def _run_collect(opts: Any) -> None:
    from gpurec.collect.api import collect as run_collect
    from gpurec.collect.runner import ContextLost

    try:
        result = _guard(run_collect, opts, log=_progress)
    except ContextLost as exc:
        _fail(f"{exc}; run the same command again: it resumes after this row", 1)
    _print_json(result)
    if int((result or {}).get("worst_exit", 0) or 0):
        raise typer.Exit(1)


OUT_HELP = "output folder: rows-*.jsonl shards and provenance (an existing one is resumed)"
MODELS_HELP = "comma-separated torchvision names (default: the 24 dataset architectures)"
BATCH_HELP = "comma-separated batch sizes (default 1,8,32,128)"
DEVICES_HELP = "one worker per local GPU, e.g. 0,1,2,3 (each its own shard)"
SHARD_HELP = "this machine's share of the plan, i/n"
BUDGET_HELP = "stop starting new rows after this many seconds"
PLAN_HELP = "a precomputed plan JSON (skips planning; datasets/plans/main.json is the shipped one)"


@app.command()
def collect(
    out: Path = typer.Option(..., "--out", help=OUT_HELP),
    models: str = typer.Option(None, "--models", help=MODELS_HELP),
    batch_sizes: str = typer.Option(None, "--batch-sizes", help=BATCH_HELP),
    resolutions: str = typer.Option("224", "--resolutions", help="comma-separated input resolutions"),
    modes: str = typer.Option(None, "--modes", help="inference,training (default both)"),
    plan: Path = typer.Option(None, "--plan", help=PLAN_HELP),
    what: str = typer.Option("all", "--what", help="all, ops or networks"),
    min_window: float = typer.Option(0.3, "--min-window", help="shortest energy window, seconds"),
    target_replay_ms: float = typer.Option(2.0, "--target-replay-ms", help="GPU time of one CUDA-graph replay"),
    no_capture: bool = typer.Option(False, "--no-capture", help="eager only: no CUDA graphs"),
    no_in_network: bool = typer.Option(False, "--no-in-network", help="skip the profiler attribution pass"),
    max_instances: int = typer.Option(4, "--max-instances", help="most weight copies rotated per operation"),
    time_budget_s: float = typer.Option(None, "--time-budget-s", help=BUDGET_HELP),
    repeat_every: int = typer.Option(40, "--repeat-every", help="re-measure an earlier row every N rows"),
    shard: str = typer.Option(None, "--shard", help=SHARD_HELP),
    devices: str = typer.Option(None, "--devices", help=DEVICES_HELP),
    plan_only: bool = typer.Option(False, "--plan-only", help="print this shard's plan summary and stop"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="measure again the rows that failed before"),
    sm_clocks: str = typer.Option(None, "--sm-clocks", help="lock the SM clock at each MHz in turn (owned GPUs "
                                  "only, with --i-own-this-gpu)"),
    i_own_this_gpu: bool = typer.Option(False, "--i-own-this-gpu", help="confirm clock locking is allowed here"),
) -> None:
    """Measure per-operation and whole-network time, power and energy on this machine's GPUs:
    eager, host-free (CUDA graphs) and in-network. Resumable; progress on stderr."""
    opts = _collect_options(out, models, batch_sizes, resolutions, modes, plan=str(plan) if plan else None,
                            what=what, min_window_s=min_window, target_replay_ms=target_replay_ms,
                            capture=not no_capture, in_network=not no_in_network, max_instances=max_instances,
                            time_budget_s=time_budget_s, repeat_every=repeat_every, shard=shard,
                            devices=_csv_list(devices, int, "--devices"), plan_only=plan_only,
                            retry_failed=retry_failed, sm_clocks=_csv_list(sm_clocks, int, "--sm-clocks"),
                            i_own_this_gpu=i_own_this_gpu)
    _run_collect(opts)


@app.command("measure-network")
def measure_network(
    out: Path = typer.Option(..., "--out", help=OUT_HELP),
    models: str = typer.Option(None, "--models", help=MODELS_HELP),
    batch_sizes: str = typer.Option(None, "--batch-sizes", help=BATCH_HELP),
    resolutions: str = typer.Option("224", "--resolutions", help="comma-separated input resolutions"),
    modes: str = typer.Option(None, "--modes", help="inference,training (default both)"),
    devices: str = typer.Option(None, "--devices", help=DEVICES_HELP),
    shard: str = typer.Option(None, "--shard", help=SHARD_HELP),
    time_budget_s: float = typer.Option(None, "--time-budget-s", help=BUDGET_HELP),
    plan_only: bool = typer.Option(False, "--plan-only", help="print this shard's plan summary and stop"),
) -> None:
    """Whole-network measurements only (eager, host-free and in-network): the ground truth
    that validation compares with."""
    opts = _collect_options(out, models, batch_sizes, resolutions, modes, what="networks",
                            devices=_csv_list(devices, int, "--devices"), shard=shard,
                            time_budget_s=time_budget_s, plan_only=plan_only)
    _run_collect(opts)


SKIP_CORRUPT_HELP = "leave out unreadable raw lines (counted in the output) instead of failing"


def _note_bad_lines(by_gpu: dict[str, list[str]]) -> None:
    """Unreadable raw lines go to stderr too, so a person sees them without reading the JSON."""
    for gpu, lines in by_gpu.items():
        for line in lines:
            typer.echo(f"gpurec: {gpu}: {line}", err=True)


@dataset_app.command("build")
def dataset_build(root: Path = typer.Option(Path("datasets"), "--root",
                                           help="dataset root with one directory per GPU"),
                  skip_corrupt_lines: bool = typer.Option(False, "--skip-corrupt-lines", help=SKIP_CORRUPT_HELP)
                  ) -> None:
    """Rebuild the Parquet tables of every GPU directory from its raw shards."""
    from gpurec.dataset.build import build_all

    result = _guard(build_all, root, allow_corrupt=skip_corrupt_lines)
    _print_json(result)
    _note_bad_lines({gpu: summary.get("bad_lines", []) for gpu, summary in result.items()})


@dataset_app.command("merge")
def dataset_merge(shards: list[Path] = typer.Argument(..., help="shard directories or rows-*.jsonl files"),
                  out: Path = typer.Option(..., "--out", help="GPU dataset directory, e.g. datasets/h100"),
                  skip_corrupt_lines: bool = typer.Option(False, "--skip-corrupt-lines", help=SKIP_CORRUPT_HELP)
                  ) -> None:
    """Merge shards into OUT/raw row by row (new rows only; conflicts reported) and rebuild OUT's tables."""
    from gpurec.dataset.merge import merge_shards

    result = _guard(merge_shards, shards, out, allow_corrupt=skip_corrupt_lines)
    _print_json(result)
    _note_bad_lines({out.name: result["bad_lines"] + result["tables"].get("bad_lines", [])})
    if result["conflicts"]:
        _fail(f"{len(result['conflicts'])} row(s) or file(s) differ from what {out} already holds under the same "
              "identity; kept the existing ones (see 'conflicts' above)", 1)


@contextlib.contextmanager
def _sigterm_raises(exc: type[BaseException], *args: Any) -> Iterator[None]:
    """While a slow command runs, SIGTERM (e.g. from ``timeout``) raises ``exc`` so partial
    results are written and child process groups are killed on the way out."""
    import signal

    def handler(signum: int, frame: Any) -> None:
        raise exc(*args)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _log_to(logger_name: str, log_file: Path | None = None) -> None:
    """Progress of a slow library call on stderr (and into ``log_file``), with timestamps."""
    import logging

    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S")
    logger = logging.getLogger(logger_name)
    logger.setLevel(logging.INFO)
    for h in [h for h in logger.handlers if getattr(h, "_gpurec_cli", False)]:
        logger.removeHandler(h)
        h.close()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_file))
    for h in handlers:
        h.setFormatter(fmt)
        h._gpurec_cli = True  # type: ignore[attr-defined]
        logger.addHandler(h)


def _stderr(msg: str) -> None:
    typer.echo(msg, err=True)


def _int_list(text: str, option: str) -> list[int]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not all(v.isdigit() for v in values):
        _fail(f"{option} takes comma-separated positive integers, such as 256,32,4, not '{text}'")
    return [int(v) for v in values]


@app.command()
def calibrate(
    out: Path = typer.Option(..., "--out", help="directory for calibration.json, calibrate.log, plots/ and ncu/"),
    gpu_index: int = typer.Option(0, "--gpu-index", help="local CUDA index of the GPU to calibrate"),
    budget_s: float = typer.Option(300.0, "--budget-s", help="time budget of the whole calibration"),
    quick: bool = typer.Option(False, "--quick", help="saturated configurations only, 0.5 s windows"),
    arch: str = typer.Option(None, "--arch", help="nvcc -arch (sm_90, 90, native; default sm_90)"),
    no_ncu: bool = typer.Option(False, "--no-ncu", help="skip the Nsight Compute checks"),
    window_s: float = typer.Option(None, "--window-s", help="energy window per point (default 1.0)"),
    levels: str = typer.Option("l1,shared,l2,dram", "--levels", help="comma-separated levels, in priority order"),
    threads: str = typer.Option(None, "--threads", help="threads-per-block sweep after the saturated (1024) runs, "
                                "in priority order (default 256,32,4,1,128,512,64,16,8,2)"),
    no_div: bool = typer.Option(False, "--no-div", help="skip the LOAD+DIV cross-validation"),
) -> None:
    """Memory-energy calibration with CUDA microbenchmarks (needs nvcc, a GPU and, for the checks, ncu).

    Clocks are never locked.  Progress goes to stderr and OUT/calibrate.log.  Exit codes: 0 done
    (calibration.json always written), 1 calibration error, 2 nvcc missing or bad input,
    3 no GPU / NVML, 130 interrupted (partial results kept).
    """
    from gpurec.calibrate.errors import CalibrationError, ToolNotFound
    from gpurec.calibrate.microbench import LEVELS
    from gpurec.device.errors import NVMLError

    level_list = [x for x in levels.split(",") if x]
    bad = [x for x in level_list if x not in LEVELS]
    if bad:
        _fail(f"unknown level(s) {', '.join(bad)} in --levels; choose from {', '.join(LEVELS)}")
    from gpurec.calibrate.build import DEFAULT_ARCH
    from gpurec.calibrate.calibrate import THREAD_SWEEP, log, run_calibration

    thread_list = _int_list(threads, "--threads") if threads else list(THREAD_SWEEP)
    _log_to("gpurec.calibrate", out / "calibrate.log")
    try:
        with _sigterm_raises(KeyboardInterrupt, "SIGTERM"):
            res = run_calibration(gpu_index, out, budget_s, quick, arch or DEFAULT_ARCH, not no_ncu, window_s,
                                  levels=level_list, thread_sweep=thread_list, div=not no_div)
    except KeyboardInterrupt:
        log.error("interrupted")
        raise typer.Exit(130) from None
    except ToolNotFound as exc:
        log.error("%s", exc)
        raise typer.Exit(2) from None
    except NVMLError as exc:
        log.error("%s", exc)
        raise typer.Exit(3) from None
    except CalibrationError as exc:
        log.error("%s", exc)
        raise typer.Exit(1) from None
    lv = {k: (round(v["pj_per_sector"], 1) if v.get("pj_per_sector") is not None else None)
          for k, v in res["levels"].items()}
    log.info("pJ per sector: %s; DIV: %s nJ; ncu checks passed: %s", lv, res["div_nj"],
             res["ncu_checks"].get("passed"))


@app.command("calibrate-build")
def calibrate_build(
    arch: str = typer.Option(None, "--arch", help="nvcc -arch (sm_90, 90, native; default sm_90)"),
    force: bool = typer.Option(False, "--force", help="rebuild even if the cached build is current"),
    exe: bool = typer.Option(False, "--exe", help="also build the standalone membench CLI"),
) -> None:
    """Build the memory microbenchmarks (cuda/membench.cu) with nvcc; prints the built paths."""
    from gpurec.calibrate.build import DEFAULT_ARCH, build_executable, build_library
    from gpurec.calibrate.errors import BuildError, ToolNotFound

    arch = arch or DEFAULT_ARCH
    try:
        typer.echo(str(build_library(arch, force)))
        if exe:
            typer.echo(str(build_executable(arch, force)))
    except (ToolNotFound, BuildError) as exc:
        _fail(str(exc), 1)


@app.command()
def counters(
    plan: Path = typer.Option(..., "--plan", help="the work order, e.g. datasets/plans/main.json"),
    out: Path = typer.Option(..., "--out", help="directory for counters.jsonl (resumed if present)"),
    budget_s: float = typer.Option(300.0, "--budget-s", help="stop starting new chunks after this many seconds"),
    chunk: int = typer.Option(80, "--chunk", help="operations per ncu run"),
    shard: str = typer.Option("0/1", "--shard", help="i/n: profile only this shard of the plan"),
) -> None:
    """Nsight Compute counters per planned operation (needs ncu and a GPU; clocks are not locked).

    Prints a JSON summary; progress goes to stderr.
    """
    from gpurec.collect.counters import drive
    from gpurec.collect.plan import parse_shard

    i, n = _guard(parse_shard, shard)
    if not plan.is_file():
        _fail(f"--plan {plan} does not exist (scripts/make_plan.py writes datasets/plans/main.json)", 1)
    _print_json(_guard(drive, plan, out, budget_s, chunk, (i, n), log=_stderr))


@app.command()
def probe(out: Path = typer.Option(..., "--out", help="directory for the probe's JSON")) -> None:
    """Measure the energy-counter period, window-length repeatability and instance count on this GPU.

    Prints one JSON line per window-sweep row; progress goes to stderr.
    """
    from gpurec.collect.probe import run_probe

    out.mkdir(parents=True, exist_ok=True)
    res = _guard(run_probe, out, log=_stderr)
    for row in res["summary"]["window"]:
        typer.echo(json.dumps(row))


@app.command()
def profile(
    model: str = typer.Option(..., "--model", "-m", help="torchvision classification model name"),
    batch_size: int = typer.Option(64, "--batch-size", "-b", help="images per step"),
    resolution: int = typer.Option(224, "--resolution", "-r", help="image height and width in pixels"),
    mode: str = typer.Option("inference", "--mode", help="inference (forward) or training (forward + backward)"),
    out: Path = typer.Option(None, "--out", help="directory for trace, counters, JSON and plots"),
    gpu_index: int = typer.Option(0, "--gpu-index", help="CUDA index of the GPU to profile"),
    no_ncu: bool = typer.Option(False, "--no-ncu", help="framework trace only (no hardware counters)"),
    ncu_sampling: str = typer.Option(
        "all", "--ncu-sampling",
        help="all: count every kernel; per-config: one launch per (kernel, grid, block), repeats imputed"),
    precision: str = typer.Option("fp32", "--precision", help="fp32, tf32, bf16 or fp16"),
    device: str = typer.Option(None, "--device", help="override, e.g. 'cpu' for a dry run with --no-ncu"),
    trace_timeout_s: float = typer.Option(600.0, "--trace-timeout-s", help="kill the trace worker after this"),
    ncu_timeout_s: float = typer.Option(1200.0, "--ncu-timeout-s", help="kill the ncu run after this"),
    max_warmup_iters: int = typer.Option(40, "--max-warmup-iters", help="most warm-up iterations before tracing"),
    max_warmup_s: float = typer.Option(20.0, "--max-warmup-s", help="most warm-up seconds before tracing"),
    no_plots: bool = typer.Option(False, "--no-plots", help="skip the PNG plots"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """Multi-level GPU utilization of one iteration (framework trace + Nsight Compute).

    Exit codes: 0 when the trace worked (a failed ncu run is reported in the table and JSON),
    1 when the network could not be traced, 2 for bad input or a missing ncu.
    """
    _check_format(fmt, ("table", "json"))
    from gpurec.profile.ncu_io import SAMPLING_MODES

    if ncu_sampling not in SAMPLING_MODES:
        _fail(f"--ncu-sampling must be one of {', '.join(SAMPLING_MODES)}, not '{ncu_sampling}'")
    if precision not in ("fp32", "tf32", "bf16", "fp16"):
        _fail(f"--precision must be one of fp32, tf32, bf16, fp16, not '{precision}'")
    _check_shape(batch_size, resolution)
    _check_mode(mode)
    _check_model_name(model)
    if device is None or str(device).startswith("cuda"):
        _require_gpu("profile", gpu_index)
    from gpurec.device.errors import NcuNotFound
    from gpurec.profile import ProfileError, render_table
    from gpurec.profile import profile_network as run_profile

    try:
        with _sigterm_raises(SystemExit, 143):
            result = _guard(run_profile, model, batch_size, resolution, mode, out, gpu_index, not no_ncu,
                            precision=precision, device=device, trace_timeout_s=trace_timeout_s,
                            ncu_timeout_s=ncu_timeout_s, plots=not no_plots, max_warmup_iters=max_warmup_iters,
                            max_warmup_s=max_warmup_s, ncu_sampling=ncu_sampling)
    except NcuNotFound as exc:
        _fail(str(exc), 2)
    except ProfileError as exc:
        _fail(f"profile failed: {exc}", 1)
    if fmt == "json":
        _print_json(result.to_json())
    else:
        typer.echo(render_table(result))


@app.command("profile-summary")
def profile_summary(results: list[Path] = typer.Argument(..., help="result.json files of gpurec profile runs")) -> None:
    """One line per profiled run: time, throughput and SM / tensor-core utilization side by side."""
    from gpurec.profile.summary import summarize

    typer.echo(summarize(list(results)))


def _require_gpu(command: str, gpu_index: int = 0) -> None:
    """One line and exit 2 when there is no usable CUDA GPU (instead of torch's traceback)."""
    import torch

    if not torch.cuda.is_available():
        _fail(f"`gpurec {command}` needs an NVIDIA GPU with a working driver, and torch finds none here; "
              "`gpurec predict` and `gpurec recommend` work without one.")
    if not 0 <= gpu_index < torch.cuda.device_count():
        _fail(f"--gpu-index {gpu_index} is not one of this machine's {torch.cuda.device_count()} GPU(s)")


@app.command()
def train(
    data: Path = typer.Option(Path("datasets"), "--data", help="dataset root with one directory per GPU"),
    out: Path = typer.Option(Path("models"), "--out", help="directory to write the trained models to"),
    trials: int = typer.Option(20, "--trials", help="Optuna trials per target"),
    seed: int = typer.Option(0, "--seed", help="random seed for tuning and cross-validation"),
    reuse_tuning: Path = typer.Option(None, "--reuse-tuning",
                                      help="a report.json whose tuned hyper-parameters are reused instead of "
                                           "tuning again (same data and features: the same boosters, minutes "
                                           "sooner)"),
) -> None:
    """Train the per-operation predictors and the whole-network corrections."""
    from gpurec.model import train as run_train

    extra = {"reuse_tuning": str(reuse_tuning)} if reuse_tuning is not None else {}
    report = _guard(run_train, data, out, tune_trials=trials, seed=seed, **extra)
    _print_json(report)


MODELS_UNUSABLE = 3  # exit code whenever the trained models cannot be loaded (missing, damaged, incompatible)
MODELS_HELP = "trained model directory (default: $GPUREC_MODELS, else models/ of this checkout)"
HOST_HELP = ("host that issues the kernels: a `gpurec host-bench` JSON file, 'local' (measure this machine's CPU), "
             "or omitted for the reference host")
GRAPHS_HELP = "the step runs as one CUDA graph: report and rank by host-free GPU time and energy"


def _predictor(models: Path | None = None) -> Any:
    """The trained predictors, or one line and exit code 3 saying how to get usable ones."""
    from gpurec.model import load_predictor

    try:
        return load_predictor(models)
    except Exception as exc:  # missing, empty, truncated or incompatible: one exit code for all
        where = models if models is not None else "the default models/"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        _fail(f"cannot use the trained models in {where}: {first} Train them with `gpurec train --out DIR` and "
              "pass --models DIR (or set GPUREC_MODELS).", MODELS_UNUSABLE)


def _check_host(host: str | None) -> str | None:
    if host is None or host == "local":
        return host
    if not Path(host).is_file():
        _fail(f"--host must be a `gpurec host-bench` JSON file or 'local', not '{host}' (no such file)")
    return host


class _Progress:
    """Sign of life on stderr for slow steps: a spinner on a terminal, nothing in pipes."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self._status: Any = None

    def __enter__(self) -> _Progress:
        if getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console

            self._status = Console(file=self.stream).status("starting")
            self._status.start()
        return self

    def __call__(self, message: str) -> None:
        if self._status is not None:
            self._status.update(f"gpurec: {message}")

    def __exit__(self, *exc: Any) -> None:
        if self._status is not None:
            self._status.stop()


def _check_gpus(gpus_opt: str | None) -> list[str] | None:
    from gpurec.catalog import resolve_gpu

    if not gpus_opt:
        return None
    names: list[str] = []
    for g in (g.strip() for g in gpus_opt.split(",")):
        if g:
            name = _guard(resolve_gpu, g).nvml_name
            if name not in names:
                names.append(name)
    return names


@app.command()
def predict(
    model: str = typer.Option(..., "--model", "-m", help="torchvision classification model name"),
    batch_size: int = typer.Option(32, "--batch-size", "-b", help="images per step"),
    resolution: int = typer.Option(224, "--resolution", "-r", help="image height and width in pixels"),
    mode: str = typer.Option("inference", "--mode", help="inference (forward) or training (forward + backward)"),
    gpu: str = typer.Option("H100", "--gpu", help="GPU short name or NVML name (see `gpurec gpus`)"),
    host: str = typer.Option(None, "--host", help=HOST_HELP),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help=GRAPHS_HELP),
    models: Path = typer.Option(None, "--models", help=MODELS_HELP),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """Predict one step's time, energy and power on one GPU, with its uncertainty band."""
    _check_format(fmt, ("table", "json"))
    shape = _check_shape(batch_size, resolution)
    _check_mode(mode)
    _check_model_name(model)
    host = _check_host(host)
    from gpurec.catalog import resolve_gpu
    from gpurec.recommend import band_description, estimate_fields, predict_step

    spec = _guard(resolve_gpu, gpu)
    with _Progress() as say:
        say("loading the predictors")
        p = _predictor(models)
        say(f"predicting {model} on {spec.short_name}")
        est = _guard(predict_step, p, model, shape, mode, spec.nvml_name, host)
    f = estimate_fields(est)
    per_op = est.per_op
    unc = _records(getattr(est, "uncovered", None))
    if fmt == "json":
        _print_json({"model": model, "input_shape": list(shape), "mode": mode, "gpu": spec.nvml_name,
                     "cuda_graphs": cuda_graphs, "energy_per": "step (one batch)", "band": band_description(p), **f,
                     "per_op": per_op.to_dict("records") if per_op is not None else [], "uncovered": unc})
        return
    g = "gpu_" if cuda_graphs else ""
    typer.echo(f"{model} {list(shape)} {mode} on {spec.nvml_name} "
               f"({'measured' if f['measured_gpu'] else 'extrapolated'} GPU), host {f['host'] or host or 'reference'}"
               f"{', as one CUDA graph' if cuda_graphs else ''}")
    typer.echo(f"  time   {_fmt(f[g + 'time_ms'])} ms      band {_fmt(f[g + 'time_low_ms'])} – "
               f"{_fmt(f[g + 'time_high_ms'])} ms")
    typer.echo(f"  energy {_fmt(f[g + 'energy_mj'])} mJ per step (one batch)   band {_fmt(f[g + 'energy_low_mj'])} – "
               f"{_fmt(f[g + 'energy_high_mj'])} mJ")
    typer.echo(f"  power  {_fmt(f['power_w'])} W")
    if f["bound"] is not None:
        typer.echo(f"  bound  {f['bound']} (GPU alone {_fmt(f['gpu_time_ms'])} ms, host issue "
                   f"{_fmt(f['host_time_ms'])} ms)")
    typer.echo(f"  bands: {band_description(p)}")
    if per_op is not None and len(per_op) and "time_share" in per_op:
        top = per_op.groupby("kind", as_index=False)[["time_share", "energy_share"]].sum()
        top = top.sort_values("time_share", ascending=False).head(5)
        typer.echo("  where the time goes: " + ", ".join(
            f"{r.kind} {r.time_share * 100:.0f}%" for r in top.itertuples()))
    _report_uncovered(unc, f["coverage"])


def _records(df: Any) -> list[dict[str, Any]]:
    return df.to_dict("records") if df is not None and hasattr(df, "to_dict") else list(df or [])


def _report_uncovered(unc: list[dict[str, Any]], coverage: float = 1.0) -> None:
    """Operations outside what the models were trained on: predicted anyway, never dropped."""
    if coverage < LOW_COVERAGE:
        typer.echo(f"WARNING: only {coverage * 100:.1f}% of the FLOPs are in operations the models were trained "
                   "on; the totals are not trustworthy.", err=True)
    if not unc:
        return
    kinds = ", ".join(sorted({str(u.get("kind")) for u in unc}))
    flops = sum(float(u.get("flops_share", 0.0)) for u in unc) * 100
    time_share = sum(float(u.get("time_share", 0.0)) for u in unc) * 100
    typer.echo(f"  not covered by the training data (predicted anyway, less trustworthy): {len(unc)} operations "
               f"[{kinds}], {flops:.1f}% of FLOPs, {time_share:.1f}% of the predicted operation time")


LOW_COVERAGE = 0.9


def _check_model_name(model: str) -> None:
    """Reject an unknown name before torch is imported (a fraction of a second, not seconds)."""
    from gpurec.ops.names import unknown_model_message

    message = unknown_model_message(model)
    if message is not None:
        _fail(message)


@app.command()
def recommend(
    model: str = typer.Option(..., "--model", "-m", help="torchvision classification model name"),
    batch_size: int = typer.Option(32, "--batch-size", "-b", help="images per step"),
    resolution: int = typer.Option(224, "--resolution", "-r", help="image height and width in pixels"),
    mode: str = typer.Option("inference", "--mode", help="inference (forward) or training (forward + backward)"),
    objective: str = typer.Option("energy", "--objective",
                                  help="time, energy (per step) or edp (energy x time)"),
    gpus_opt: str = typer.Option(None, "--gpus", help="comma-separated GPUs (default: every catalogue GPU)"),
    host: str = typer.Option(None, "--host", help=HOST_HELP),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help=GRAPHS_HELP),
    models: Path = typer.Option(None, "--models", help=MODELS_HELP),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """Rank GPUs for one step of a network by time, energy or energy-delay product."""
    _check_format(fmt, ("table", "json"))
    shape = _check_shape(batch_size, resolution)
    _check_mode(mode)
    _check_model_name(model)
    host = _check_host(host)
    from gpurec.recommend import check_objective
    from gpurec.recommend import recommend as run_recommend

    _guard(check_objective, objective)
    gpu_list = _check_gpus(gpus_opt)
    with _Progress() as say:
        say("loading the predictors")
        predictor = _predictor(models)
        ranking = _guard(run_recommend, model, shape, mode=mode, objective=objective, gpus=gpu_list,
                         predictor=predictor, host=host, cuda_graphs=cuda_graphs, progress=say)
    if fmt == "json":
        _print_json(ranking.to_json())
        return
    _render_ranking(ranking)


def _render_ranking(r: Any) -> None:
    g = "gpu_" if r.cuda_graphs else ""
    rows = []
    for row in r.rows:
        d = row.to_dict()
        d["kind"] = "measured" if row.measured else "extrapolated"
        d["band"] = f"{_fmt(row.low)} – {_fmt(row.high)}"
        d["vs_best"] = "best" if row.rank == 1 else (f"+{row.vs_best_pct:.1f}%" + (" (tie)" if row.tie_with_best
                                                                                      else ""))
        d["fits_text"] = "yes" if row.fits else f"NO ({_fmt(row.memory_capacity_gb)} GB)"
        rows.append(d)
    _table(rows, [("rank", "#"), ("short_name", "GPU"), ("kind", "data"), ("fits_text", "fits"),
                  (g + "time_ms", "time ms"), ("gpu_time_ms" if not r.cuda_graphs else "time_ms",
                                               "graph ms" if not r.cuda_graphs else "eager ms"),
                  (g + "energy_mj", "energy mJ/step"), ("power_w", "power W"), ("bound", "bound"),
                  ("vs_best", f"vs best ({r.objective})"), ("band", f"{r.objective} band ({r.unit})")],
           title=f"{r.model} {list(r.input_shape)} {r.mode}, ranked by {r.objective}"
                 f"{' with CUDA graphs' if r.cuda_graphs else ' (eager)'}, host {r.host}")
    typer.echo(f"Bands: {r.band}. Energy is per step (one batch). '(tie)': the band overlaps the best's over "
               "at least half of the narrower width.")
    typer.echo(f"Peak memory of the step: about {_fmt(r.memory_gb)} GB (parameters"
               f"{', gradients, activations kept for backward' if r.mode == 'training' else ', live activations'}; "
               "no optimizer state)." + (" GPUs that cannot hold it rank last." if not all(x.fits for x in r.rows)
                                          else ""))
    extrapolated = [x.short_name for x in r.rows if not x.measured]
    if extrapolated:
        from gpurec.catalog import resolve_gpu

        names = ", ".join(resolve_gpu(n).short_name for n in r.measured_gpus) or "none"
        typer.echo(f"Extrapolated rows ({', '.join(extrapolated)}) are predicted from catalogue specifications by "
                   f"models trained on {len(r.measured_gpus)} measured GPU(s) ({names}); their bands are wide: "
                   "treat them as rough.")
    if r.advice is not None:
        typer.echo(r.advice.sentence())
    _report_uncovered(list(r.uncovered), r.coverage)


@app.command()
def validate(
    model: str = typer.Option(None, "--model", "-m",
                              help="torchvision classification model name (required unless --complete)"),
    batch_size: int = typer.Option(32, "--batch-size", "-b", help="images per step"),
    resolution: int = typer.Option(224, "--resolution", "-r", help="image height and width in pixels"),
    mode: str = typer.Option("inference", "--mode", help="inference (forward) or training (forward + backward)"),
    gpu_index: int = typer.Option(0, "--gpu-index", help="CUDA index of the GPU to measure on"),
    log: Path = typer.Option(Path("datasets/validation/validation_log.jsonl"), "--log",
                             help="JSON-lines file the record is appended to"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
    complete: Path = typer.Option(None, "--complete", help="add predictions to a log measured without xgboost"),
    models: Path = typer.Option(None, "--models", help=MODELS_HELP + " (with --complete)"),
) -> None:
    """Measure a whole network on this GPU and compare with the prediction and the op sum."""
    _check_format(fmt, ("table", "json"))
    if complete is not None:
        from gpurec.validate import complete_log

        typer.echo(f"added predictions to {_guard(complete_log, complete, predictor=_predictor(models))} records "
                   f"of {complete}")
        return
    if not model:
        _fail("--model is required (or --complete LOG)")
    _check_shape(batch_size, resolution)
    _check_mode(mode)
    _check_model_name(model)
    from gpurec.validate import render
    from gpurec.validate import validate as run_validate

    record = _guard(run_validate, model, batch_size, resolution, mode, gpu_index, log)
    if fmt == "json":
        _print_json(record)
    else:
        typer.echo(render(record))


@app.command("host-bench")
def host_bench(
    no_gpu: bool = typer.Option(False, "--no-gpu", help="measure the CPU-side parts only, even where a GPU is "
                                "visible (a host without a GPU always does)"),
    out: Path = typer.Option(None, "--out", help="write the host profile JSON here (for --host of predict "
                             "and recommend)"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """Characterise this host in a few seconds: Python speed, dispatch cost of a fixed set of
    module calls, and (with a GPU) tiny-kernel launch cost. Predictions rescale host work with it."""
    _check_format(fmt, ("table", "json"))
    _progress("host-bench: measuring (a few seconds) ...")
    from gpurec.dataset.store import atomic_write_json
    from gpurec.host import run_host_bench

    profile = _guard(run_host_bench, use_gpu=False if no_gpu else None)
    data = profile.to_dict()
    if out is not None:
        atomic_write_json(out, data)
        _progress(f"host-bench: wrote {out}")
    if fmt == "json":
        _print_json(data)
        return
    typer.echo(f"host: {profile.name}")
    typer.echo(f"python loop: {profile.python_loop_us:.1f} us (spread {profile.spread.get('python_loop', 0):.0%})")
    if profile.launch_us is not None:
        typer.echo(f"tiny-kernel launch on {profile.gpu}: {profile.launch_us:.2f} us")
    rows = sorted(profile.dispatch_cpu_us)
    typer.echo(f"{'call':<24}{'CPU dispatch us':>16}{'GPU dispatch us':>17}")
    for key in rows:
        gpu_us = (profile.dispatch_cuda_us or {}).get(key)
        typer.echo(f"{key:<24}{profile.dispatch_cpu_us[key]:>16.2f}{'' if gpu_us is None else f'{gpu_us:.2f}':>17}")


# -- generated documents and developer tools ----------------------------------------------------
tools_app = typer.Typer(no_args_is_help=True, help="Developer tools: plan, extraction snapshot, counter features, "
                                                    "validation log.")
app.add_typer(tools_app, name="tools")
REPORT_CHOICES = ("dataset", "accuracy", "calibration", "profile", "validation", "speed", "coverage", "all")


def _progress(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command()
def report(
    what: str = typer.Argument("all", help=f"one of {', '.join(REPORT_CHOICES)}"),
    root: Path = typer.Option(Path("."), "--root", help="repository root (datasets/, models/, docs/)"),
    measure: bool = typer.Option(False, "--measure", help="speed, coverage: re-run the benchmark on this machine "
                                 "first (minutes) and rewrite its benchmarks/*.json"),
    no_analytic: bool = typer.Option(False, "--no-analytic", help="calibration: skip re-extracting the profiled "
                                     "operations (~40 s)"),
) -> None:
    """Regenerate docs/*.md and datasets/README.md (with their plots) from the committed data and models."""
    import time

    from gpurec.reports import REPORTS, generate

    if what not in REPORT_CHOICES:
        _fail(f"unknown report '{what}': choose one of {', '.join(REPORT_CHOICES)}")
    for name in REPORTS if what == "all" else (what,):
        _progress(f"report {name} ...")
        t0 = time.perf_counter()
        path = _guard(generate, name, root, measure=measure, analytic=not no_analytic, progress=_progress)
        _progress(f"report {name}: wrote {path} ({time.perf_counter() - t0:.0f} s)")


@tools_app.command("plan")
def tools_plan(out: Path = typer.Option(None, "--out",
                                       help="where to write the plan JSON (default datasets/plans/main.json, "
                                            "or targeted.json with --targeted)"),
               targeted: bool = typer.Option(False, "--targeted",
                                             help="the plan of the hand-written architectures and operation sweeps "
                                                  "(gpurec.sets SYNTH_ARCHS, SWEEP_ARCHS)")) -> None:
    """Write the collection plan (work order) with the local torch."""
    from gpurec.tools.plan import write_main_plan, write_targeted_plan

    if targeted:
        _print_json(_guard(write_targeted_plan, out or Path("datasets/plans/targeted.json")))
    else:
        _print_json(_guard(write_main_plan, out or Path("datasets/plans/main.json")))


@tools_app.command("unseen-snapshot")
def tools_unseen_snapshot(
    models: Path = typer.Option(Path("models"), "--models", help="the trained models to describe"),
    out: Path = typer.Option(Path("benchmarks/unseen_before.json"), "--out", help="where to write the snapshot"),
    data: Path = typer.Option(None, "--data", help="dataset root (default: datasets/)"),
) -> None:
    """Record the unseen-architecture errors of a set of models (per-kind in-network time error,
    host-free MAPE per mode), which docs/accuracy.md shows beside the shipped models' (minutes)."""
    from gpurec.dataset.store import atomic_write_json
    from gpurec.model.kind_errors import snapshot

    snap = _guard(snapshot, models, data)
    atomic_write_json(out, snap)
    _print_json(snap["unseen"])


@tools_app.command("gpu-time-sources")
def tools_gpu_time_sources(
    data: Path = typer.Option(Path("datasets"), "--data", help="dataset root with one directory per GPU"),
    out: Path = typer.Option(Path("benchmarks/gpu_time_sources.json"), "--out", help="where to write the result"),
    trials: int = typer.Option(0, "--trials", help="Optuna trials per target in each training"),
) -> None:
    """Train on in-network vs isolated GPU-time targets and record the errors that decide (minutes)."""
    from gpurec.tools.gpu_time_sources import write

    _print_json(_guard(write, data, out, tune_trials=trials, log=_progress))


@tools_app.command("snapshot")
def tools_snapshot(
    action: str = typer.Argument(..., help="write PATH, or compare A B"),
    paths: list[Path] = typer.Argument(..., help="snapshot file(s)"),
    models: str = typer.Option("", "--models", help="write: comma-separated subset (default: every classifier)"),
) -> None:
    """Operation lists of every torchvision classifier, to check that a change to gpurec.ops keeps them.
    Compare exits 1 when any list differs."""
    from gpurec.tools import snapshot

    if action == "write" and len(paths) == 1:
        n = _guard(snapshot.write, paths[0], [m for m in models.split(",") if m] or None, _progress)
        typer.echo(f"wrote {paths[0]}: {n} operation lists")
    elif action == "compare" and len(paths) == 2:
        na, nb, differ = _guard(snapshot.compare, *paths)
        typer.echo(f"{na} vs {nb} operation lists; {len(differ)} differ" + (": " + ", ".join(differ[:20])
                                                                          if differ else ""))
        raise typer.Exit(1 if differ else 0)
    else:
        _fail("use `gpurec tools snapshot write PATH` or `gpurec tools snapshot compare A B`")


@tools_app.command("counters-features")
def tools_counters_features(
    gpu: str = typer.Option("h200", "--gpu", help="datasets/<gpu>/ folder"),
    root: Path = typer.Option(Path("datasets"), "--root", help="dataset root with one directory per GPU"),
    calibration: Path = typer.Option(None, "--calibration", help="default: datasets/<gpu>/calibration/calibration.json"),
    out: Path = typer.Option(None, "--out", help="default: datasets/<gpu>/counters/op_features.parquet"),
) -> None:
    """Per-operation ncu counters -> memory-energy and utilization features (op_features.parquet)."""
    from gpurec.tools.counters import write

    path, table = _guard(write, root / gpu, calibration, out, root.resolve().parent)
    share = table["mem_share_of_dynamic"].median() if "mem_share_of_dynamic" in table else None
    _print_json({"out": str(path), "rows": len(table), "kinds": int(table["op_kind"].nunique()),
                 "median_mem_share_of_dynamic": share})


@tools_app.command("validation-log")
def tools_validation_log(root: Path = typer.Option(Path("."), "--root", help="repository root")) -> None:
    """Rewrite datasets/validation/validation_log.jsonl: the shipped predictor against every collected
    whole-network row (needs xgboost)."""
    from gpurec.tools.validation_log import write_log

    typer.echo(f"wrote {_guard(write_log, root)}")


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
