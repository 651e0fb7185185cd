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
    batch_size: int = typer.Option(32, "--batch-size", "-b"),
    resolution: int = typer.Option(224, "--resolution", "-r"),
    mode: str = typer.Option("inference", "--mode", help="inference or training"),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json or csv"),
    list_models: bool = typer.Option(False, "--list-models", help="list the torchvision models and exit"),
) -> None:
    """List the operations a network executes, with their analytic features and totals."""
    _check_format(fmt)
    from gpurec.ops import classification_models, extract_operations, network_totals

    if list_models:
        typer.echo("\n".join(classification_models()))
        return
    if not model:
        _fail("--model is required (see --list-models)")
    shape = _check_shape(batch_size, resolution)
    _check_mode(mode)
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
    _table([{**asdict(s), "alias": s.short_name} for s in specs],
           [("nvml_name", "NVML name"), ("alias", "alias"), ("architecture", "arch"), ("sm_count", "SMs"),
            ("max_sm_clock_mhz", "max MHz"), ("fp32_tflops", "FP32 TF"), ("tf32_tflops", "TF32 TF"),
            ("bf16_tflops", "BF16 TF"), ("memory_gb", "GB"), ("memory_bandwidth_gbs", "GB/s"),
            ("l2_cache_mb", "L2 MB"), ("tdp_w", "TDP W")])


@app.command(context_settings=PASSTHROUGH)
def collect(ctx: typer.Context) -> None:
    """Measure per-operation and whole-network time and energy on this machine's GPUs.

    Options: --models --batch-sizes --resolutions --modes --out [--min-run-time S]
    [--min-window S] [--shard i/n] [--devices 0,1] [--plan-only] [--what all|ops|networks]
    [--sm-clocks MHz,... --i-own-this-gpu]; `gpurec collect --help` shows them all.
    """
    from gpurec.collect.__main__ import main as collect_main

    raise typer.Exit(_guard(collect_main, list(ctx.args)) or 0)


@app.command("measure-network", context_settings=PASSTHROUGH)
def measure_network(ctx: typer.Context) -> None:
    """Whole-network measurements (ground truth for validation): `collect --what networks`."""
    from gpurec.collect.__main__ import main as collect_main

    raise typer.Exit(_guard(collect_main, ["--what", "networks", *ctx.args]) or 0)


SKIP_CORRUPT_HELP = "leave out unreadable raw lines (counted in the output) instead of failing"


def _note_bad_lines(by_gpu: dict[str, list[str]]) -> None:
    """Unreadable raw lines go to stderr too, so a person sees them without reading the JSON."""
    for gpu, lines in by_gpu.items():
        for line in lines:
            typer.echo(f"gpurec: {gpu}: {line}", err=True)


@dataset_app.command("build")
def dataset_build(root: Path = typer.Option(Path("datasets"), "--root"),
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
    gpu_index: int = typer.Option(0, "--gpu-index"),
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
    budget_s: float = typer.Option(300.0, "--budget-s"),
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
    model: str = typer.Option(..., "--model", "-m"),
    batch_size: int = typer.Option(64, "--batch-size", "-b"),
    resolution: int = typer.Option(224, "--resolution", "-r"),
    mode: str = typer.Option("inference", "--mode"),
    out: Path = typer.Option(None, "--out", help="directory for trace, counters, JSON and plots"),
    gpu_index: int = typer.Option(0, "--gpu-index"),
    no_ncu: bool = typer.Option(False, "--no-ncu", help="framework trace only (no hardware counters)"),
    ncu_sampling: str = typer.Option(
        "all", "--ncu-sampling",
        help="all: count every kernel; per-config: one launch per (kernel, grid, block), repeats imputed"),
    precision: str = typer.Option("fp32", "--precision", help="fp32, tf32, bf16 or fp16"),
    device: str = typer.Option(None, "--device", help="override, e.g. 'cpu' for a dry run with --no-ncu"),
    trace_timeout_s: float = typer.Option(600.0, "--trace-timeout-s"),
    ncu_timeout_s: float = typer.Option(1200.0, "--ncu-timeout-s"),
    max_warmup_iters: int = typer.Option(40, "--max-warmup-iters"),
    max_warmup_s: float = typer.Option(20.0, "--max-warmup-s"),
    no_plots: bool = typer.Option(False, "--no-plots"),
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


@app.command()
def train(
    data: Path = typer.Option(Path("datasets"), "--data"),
    out: Path = typer.Option(Path("models"), "--out"),
    trials: int = typer.Option(20, "--trials", help="Optuna trials per target"),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Train the per-operation predictors and the whole-network corrections."""
    from gpurec.model import train as run_train

    report = _guard(run_train, data, out, tune_trials=trials, seed=seed)
    _print_json(report)


def _predictor() -> Any:
    from gpurec.model import load_predictor

    return _guard(load_predictor)


@app.command()
def predict(
    model: str = typer.Option(..., "--model", "-m"),
    batch_size: int = typer.Option(32, "--batch-size", "-b"),
    resolution: int = typer.Option(224, "--resolution", "-r"),
    mode: str = typer.Option("inference", "--mode"),
    gpu: str = typer.Option("H100", "--gpu"),
    fmt: str = typer.Option("table", "--format", "-f"),
) -> None:
    """Predict a network's time, energy and power on one GPU."""
    _check_format(fmt, ("table", "json"))
    shape = _check_shape(batch_size, resolution)
    _check_mode(mode)
    from gpurec.catalog import resolve_gpu

    spec = _guard(resolve_gpu, gpu)
    p = _predictor()
    est = _guard(p.predict, model, input_shape=shape, mode=mode, gpu=spec.nvml_name)
    per_op = est.per_op
    if fmt == "json":
        _print_json({"model": model, "input_shape": list(shape), "mode": mode, "gpu": spec.nvml_name,
                     "measured_gpu": bool(getattr(est, "measured_gpu", False)), "time_ms": est.time_ms,
                     "energy_mj": est.energy_mj, "power_w": est.power_w,
                     "per_op": per_op.to_dict("records") if per_op is not None else [],
                     "uncovered": _records(getattr(est, "uncovered", None))})
        return
    typer.echo(f"{model} {list(shape)} {mode} on {spec.nvml_name} "
               f"({'measured' if getattr(est, 'measured_gpu', False) else 'extrapolated'} GPU)")
    typer.echo(f"  time {est.time_ms:.3f} ms   energy {est.energy_mj:.1f} mJ   power {est.power_w:.0f} W")
    if per_op is not None and len(per_op) and "time_share" in per_op:
        top = per_op.groupby("kind", as_index=False)[["time_share", "energy_share"]].sum()
        top = top.sort_values("time_share", ascending=False).head(5)
        typer.echo("  where the time goes: " + ", ".join(
            f"{r.kind} {r.time_share * 100:.0f}%" for r in top.itertuples()))
    _report_uncovered(getattr(est, "uncovered", None))


def _records(df: Any) -> list[dict[str, Any]]:
    return df.to_dict("records") if df is not None and hasattr(df, "to_dict") else []


def _report_uncovered(unc: Any) -> None:
    """Operations outside what the models were trained on: predicted anyway, never dropped."""
    if unc is None or not len(unc):
        return
    kinds = ", ".join(sorted({str(k) for k in unc["kind"]})) if "kind" in unc else "?"
    flops = float(unc["flops_share"].sum()) * 100 if "flops_share" in unc else float("nan")
    time_share = float(unc["time_share"].sum()) * 100 if "time_share" in unc else float("nan")
    typer.echo(f"  not covered by the training data (predicted anyway, less trustworthy): {len(unc)} operations "
               f"[{kinds}], {flops:.1f}% of FLOPs, {time_share:.1f}% of the predicted operation time")


@app.command()
def recommend(
    model: str = typer.Option(..., "--model", "-m"),
    batch_size: int = typer.Option(32, "--batch-size", "-b"),
    resolution: int = typer.Option(224, "--resolution", "-r"),
    mode: str = typer.Option("inference", "--mode"),
    objective: str = typer.Option("energy", "--objective", help="time, energy or edp"),
    gpus_opt: str = typer.Option(None, "--gpus", help="comma-separated GPUs (default: all the predictor covers)"),
    host_cpu: str = typer.Option(None, "--host-cpu", help="your host CPU model (default: this machine's)"),
    fmt: str = typer.Option("table", "--format", "-f"),
) -> None:
    """Rank GPUs for a network by time, energy or energy-delay product."""
    _check_format(fmt, ("table", "json"))
    shape = _check_shape(batch_size, resolution)
    from gpurec.catalog import resolve_gpu
    from gpurec.recommend import check_objective, to_json
    from gpurec.recommend import recommend as run_recommend

    _guard(check_objective, objective)
    gpu_list = [g.strip() for g in gpus_opt.split(",") if g.strip()] if gpus_opt else None
    for g in gpu_list or []:
        _guard(resolve_gpu, g)
    _check_mode(mode)
    from gpurec.ops.extract import _check_name

    _guard(_check_name, model)
    df = _guard(run_recommend, model, shape, mode=mode, objective=objective, gpus=gpu_list,
                predictor=_predictor(), host_cpu=host_cpu)
    if fmt == "json":
        _print_json(to_json(df, model))
        return
    rows = df.to_dict("records")
    for r in rows:
        r["kind"] = "measured" if r["measured"] else "extrapolated"
        r["band"] = f"{_fmt(r['low'])} – {_fmt(r['high'])}"
        r["vs_best"] = "best" if r["rank"] == 1 else f"+{r['vs_best_pct']:.1f}%"
    unit = {"time": "ms", "energy": "mJ", "edp": "mJ·ms"}[objective]
    _table(rows, [("rank", "#"), ("short_name", "GPU"), ("kind", "data"), ("time_ms", "time ms"),
                  ("energy_mj", "energy mJ"), ("power_w", "power W"), ("vs_best", f"vs best ({objective})"),
                  ("band", f"band ({unit})")],
           title=f"{model} {list(shape)} {mode}, ranked by {objective}")
    measured = [r["short_name"] for r in rows if r["measured"]]
    if len(measured) < len(rows):
        typer.echo(f"Extrapolated rows are predicted from catalogue specifications by models trained on "
                   f"{len(measured)} measured GPU(s) ({', '.join(measured)}); their bands are wide and GPUs "
                   "of other architectures are far outside the measured range: treat them as rough.")
    hosts = df.attrs.get("host_cpus_measured") or []
    if host_cpu and hosts and host_cpu not in hosts:
        typer.echo(f"Host CPU '{host_cpu}' was not measured (measured: {', '.join(hosts)}); host overhead is "
                   "taken from the measured host(s).")
    diffs = df.attrs.get("differences") or []
    if diffs:
        typer.echo(f"Operations behind most of the difference between {rows[0]['short_name']} "
                   f"and {rows[1]['short_name']}:")
        for d in diffs:
            key = next(k for k in d if k.startswith("delta_"))
            what = f"{d['op_kind']} x{d.get('count', 1)}" if d.get("count", 1) > 1 else str(d["op_kind"])
            where = f"  e.g. {d['example']}" if d.get("example") else ""
            typer.echo(f"  {what:<28} {d[key]:+.3f} {'ms' if key.endswith('_ms') else 'mJ'} "
                       f"({d['share_of_difference'] * 100:.0f}% of the difference){where}")
    _report_uncovered(df.attrs.get("uncovered"))


@app.command()
def validate(
    model: str = typer.Option(None, "--model", "-m"),
    batch_size: int = typer.Option(32, "--batch-size", "-b"),
    resolution: int = typer.Option(224, "--resolution", "-r"),
    mode: str = typer.Option("inference", "--mode"),
    gpu_index: int = typer.Option(0, "--gpu-index"),
    log: Path = typer.Option(Path("datasets/validation/validation_log.jsonl"), "--log"),
    fmt: str = typer.Option("table", "--format", "-f"),
    complete: Path = typer.Option(None, "--complete", help="add predictions to a log measured without xgboost"),
) -> None:
    """Measure a whole network on this GPU and compare with the prediction and the op sum."""
    _check_format(fmt, ("table", "json"))
    if complete is not None:
        from gpurec.validate import complete_log

        typer.echo(f"added predictions to {_guard(complete_log, complete)} records of {complete}")
        return
    if not model:
        _fail("--model is required (or --complete LOG)")
    _check_shape(batch_size, resolution)
    _check_mode(mode)
    from gpurec.ops.extract import _check_name
    from gpurec.validate import render
    from gpurec.validate import validate as run_validate

    _guard(_check_name, model)
    record = _guard(run_validate, model, batch_size, resolution, mode, gpu_index, log)
    if fmt == "json":
        _print_json(record)
    else:
        typer.echo(render(record))


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
def tools_plan(out: Path = typer.Option(Path("datasets/plans/main.json"), "--out")) -> None:
    """Write the collection plan (work order) with the local torch."""
    from gpurec.tools.plan import write_main_plan

    _print_json(_guard(write_main_plan, out))


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
    root: Path = typer.Option(Path("datasets"), "--root"),
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
