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

# rich_markup_mode=None: click's help, where flags show as flags (typer's rich help shows them as <bool>)
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Which GPU runs your PyTorch network fastest or with the least energy.")
dataset_app = typer.Typer(no_args_is_help=True, help="Build and merge measured datasets.")
app.add_typer(dataset_app, name="dataset")

FORMATS = ("table", "json", "csv")
PRECISION_HELP = "fp32 (default), tf32, bf16-mixed, fp16-mixed (torch.autocast), bf16 or fp16 (module cast)"
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


def _check_format(fmt: str, allowed: tuple[str, ...] = FORMATS) -> str:
    """The format, lower-cased: choices ignore case."""
    if fmt.lower() not in allowed:
        raise typer.BadParameter(f"'{fmt}' is not one of {', '.join(allowed)}", param_hint="--format")
    return fmt.lower()


MODEL_HELP = ("a torchvision classifier, one of gpurec's sequence models (`gpurec ops --list-models`), or your own "
              "network as FILE.py:NAME (a module the file makes, a module class or a function returning one; it takes "
              "the image batch, or token ids with --seq-len)")
SEQ_LEN_HELP = ("tokens per sequence, for gpurec's sequence models (BERT-, GPT-, LSTM- and GRU-like; "
                "`gpurec ops --list-models`); default 128")
DEFAULT_SEQ_LEN = 128
CHECKPOINT_HELP = ("run every repeated block (a ResNet's bottlenecks, a transformer's layers) inside "
                   "torch.utils.checkpoint, as gradient checkpointing does: training time and energy with the "
                   "recomputation, memory without the blocks' activations")


def _check_input(model: str, batch_size: int, resolution: int, seq_len: int | None) -> tuple[int, ...]:
    """The model's name checked, then the input it takes: (batch, seq_len) token ids for one of
    gpurec's sequence models (and your own network given --seq-len), else a (batch, 3, resolution,
    resolution) image batch."""
    from gpurec.ops.user_module import is_user_module

    user = is_user_module(model)
    if not user:
        _check_model_name(model)
    if batch_size < 1:
        _fail(f"--batch-size must be at least 1, got {batch_size}")
    from gpurec.sets import is_sequence_arch

    if not (is_sequence_arch(model) or (user and seq_len is not None)):
        if seq_len is not None:
            _fail(f"--seq-len is for sequence models; {model} takes images (--resolution)")
        if resolution < 1:
            _fail(f"--resolution must be positive, got {resolution}")
        return (batch_size, 3, resolution, resolution)
    seq_len = DEFAULT_SEQ_LEN if seq_len is None else seq_len
    if seq_len < 1:
        _fail(f"--seq-len must be at least 1, got {seq_len}")
    return (batch_size, seq_len)


def _network(model: str, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """What to predict for ``--model`` and its input dtype: a name as it is, or the nn.Module a
    FILE.py:NAME builds (token ids, torch.long, for a (batch, seq_len) input)."""
    from gpurec.ops.user_module import is_user_module, load_user_module

    if not is_user_module(model):
        return model, None
    import torch

    return _guard(load_user_module, model), (torch.long if len(shape) == 2 else None)


def _checkpointed(net: Any, shape: tuple[int, ...], dtype: Any) -> tuple[Any, Any, list[str]]:
    """``--checkpoint-blocks``: the network (a name is built on meta) with every repeated block run
    inside torch.utils.checkpoint (gpurec.ops.checkpointing), its input dtype and the blocks."""
    import torch

    from gpurec.ops.checkpointing import checkpointed

    module, blocks = _guard(checkpointed, net)
    return module, (torch.long if len(shape) == 2 else dtype), blocks


def _check_precision(precision: str) -> str:
    """The precision, lower-cased, if gpurec knows it."""
    from gpurec.ops.precision import PRECISIONS

    if precision.lower() not in PRECISIONS:
        _fail(f"--precision must be one of {', '.join(PRECISIONS)}, not '{precision}'")
    return precision.lower()


def _check_mode(mode: str) -> str:
    """The mode, lower-cased: choices ignore case."""
    from gpurec.sets import MODES

    if mode.lower() not in MODES:
        _fail(f"--mode must be inference or training, not '{mode}'")
    return mode.lower()


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=lambda o: _clean(o) if isinstance(o, float) else str(o)))


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]], title: str | None = None,
           wrap: tuple[str, ...] | None = None) -> None:
    """A table as wide as the terminal (80 in a pipe). Columns in ``wrap`` (default: all) may
    wrap; the others (figures) never break inside a number."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_lines=False, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for key, header in columns:
        folds = wrap is None or key in wrap
        longest = max((len(_fmt(r.get(key))) for r in rows), default=0) if wrap and len(wrap) == 1 and folds else 0
        t.add_column(header, overflow="fold", no_wrap=not folds, min_width=min(longest, 15) or None)
    for r in rows:
        t.add_row(*[_fmt(r.get(k)) for k, _ in columns])
    Console().print(t)


def _terminal_width() -> int:
    from rich.console import Console

    return Console().width


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1000:  # about four significant digits, never scientific notation in a table
            return f"{v:,.0f}"
        if a >= 1:
            return f"{v:.{3 - (a >= 10) - (a >= 100)}f}"
        return f"{v:.3g}" if a >= 1e-4 else f"{v:.6f}"
    if isinstance(v, int):
        return f"{v:,}"
    return "" if v is None else str(v)


# ---------------------------------------------------------------------------------------------
@app.command()
def ops(
    model: str = typer.Option(None, "--model", "-m", help=MODEL_HELP),
    batch_size: int = typer.Option(32, "--batch-size", "-b", help="images (or sequences) per step"),
    resolution: int = typer.Option(224, "--resolution", "-r", help="image height and width in pixels"),
    mode: str = typer.Option("inference", "--mode", help="inference (forward) or training (forward + backward)"),
    fmt: str = typer.Option("table", "--format", "-f", help="table, json or csv"),
    list_models: bool = typer.Option(False, "--list-models", help="list the model names and exit"),
    precision: str = typer.Option("fp32", "--precision", help=PRECISION_HELP),
    seq_len: int = typer.Option(None, "--seq-len", "-s", help=SEQ_LEN_HELP),
) -> None:
    """List the operations a network executes, with their analytic features and totals."""
    fmt = _check_format(fmt)
    if list_models:
        from gpurec.ops import classification_models
        from gpurec.sets import SEQ_DATASET_ARCHS, SEQ_TEST_ARCHS

        typer.echo("\n".join(classification_models()))
        typer.echo("\n".join(sorted((*SEQ_DATASET_ARCHS, *SEQ_TEST_ARCHS))))
        return
    if not model:
        _fail("--model is required (see --list-models)")
    shape = _check_input(model, batch_size, resolution, seq_len)
    mode = _check_mode(mode)
    from gpurec.ops import extract_operations, network_totals

    with _Progress() as say:
        net, dtype = _network(model, shape)
        say(f"extracting the operations of {model}")
        op_list = _guard(extract_operations, net, shape, mode=mode, keep_sources=False, precision=precision,
                         **({"dtype": dtype} if dtype is not None else {}))
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
        training = mode == "training"
        # training: the step's FLOPs, forward + backward (the forward alone in the title too)
        rows = [{**r, "params": int(r["params"]), "step_flops": int(r["flops"]) + (int(r["flops_bwd"]) if training
                                                                                     else 0)} for r in records]
        step = totals["flops"] + (totals["flops_bwd"] if training else 0)
        flops_text = (f"{step / 1e9:.2f} GFLOPs forward + backward ({totals['flops'] / 1e9:.2f} forward)" if training
                      else f"{step / 1e9:.2f} GFLOPs forward")
        extra = [("params", "params"), ("op_signature", "signature")] if _terminal_width() >= 120 else []
        _table(rows, [("name", "layer"), ("op_kind", "kind"), ("input_shapes", "input"),
                      ("step_flops", "FLOPs fwd+bwd" if training else "FLOPs"),
                      ("bytes_total", "bytes"), ("arithmetic_intensity", "FLOP/B"), *extra],
               title=f"{model} {list(shape)} {mode}: {_plural(totals['operations'], 'operation')}, "
                     f"{totals['distinct_operations']} distinct, {flops_text}",
               wrap=("name", "op_kind", "input_shapes", "op_signature"))


@app.command()
def gpus(fmt: str = typer.Option("table", "--format", "-f", help="table or json")) -> None:
    """List the GPU catalogue (datasheet figures with their sources)."""
    fmt = _check_format(fmt, ("table", "json"))
    from dataclasses import asdict

    from gpurec.catalog import load_catalog

    specs = load_catalog()
    if fmt == "json":
        _print_json([asdict(s) for s in specs])
        return
    wide = _terminal_width() >= 160

    def idle(s: Any) -> str:
        w = s.power_bounds_w()[0]
        return f"{w:.0f}" if s.idle_power_w is not None else f"~{w:.0f} (est.)"

    _table([{**asdict(s), "alias": s.short_name, "source": "\n".join(s.sources), "idle": idle(s),
             "limit": f"{s.power_bounds_w()[1]:.0f}"} for s in specs],
           [("nvml_name", "NVML name"), ("alias", "alias"), ("architecture", "arch"), ("sm_count", "SMs"),
            *([("max_sm_clock_mhz", "max MHz")] if wide else []), ("fp32_tflops", "FP32 TF"),
            *([("tf32_tflops", "TF32 TF")] if wide else []), ("bf16_tflops", "BF16 TF"), ("memory_gb", "GB"),
            ("memory_bandwidth_gbs", "GB/s"), *([("l2_cache_mb", "L2 MB")] if wide else []), ("tdp_w", "TDP W"),
            ("idle", "idle W"), ("limit", "limit W"), *([("source", "sources")] if wide else [])],
           wrap=("nvml_name", "alias", "architecture", "source"))
    if not wide:  # the sources below the table, one GPU a line (every figure and `--format json` has them)
        typer.echo("sources:")
        for spec in specs:
            typer.echo(f"  {spec.short_name}: {' '.join(spec.sources)}")


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
    from gpurec.collect.runner import CollectionInProgress, ContextLost

    try:
        result = _guard(run_collect, opts, log=_progress)
    except ContextLost as exc:
        _fail(f"{exc}; run the same command again: it resumes after this row", 1)
    except CollectionInProgress as exc:
        _fail(str(exc), 1)
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
    precision: str = typer.Option("fp32", "--precision", help=PRECISION_HELP + " (of a plan built here; "
                                  "a --plan file's items carry their own)"),
) -> None:
    """Measure per-operation and whole-network time, power and energy on this machine's GPUs:
    eager, host-free (CUDA graphs) and in-network. Resumable; progress on stderr."""
    opts = _collect_options(out, models, batch_sizes, resolutions, modes, plan=str(plan) if plan else None,
                            what=what, min_window_s=min_window, target_replay_ms=target_replay_ms,
                            capture=not no_capture, in_network=not no_in_network, max_instances=max_instances,
                            time_budget_s=time_budget_s, repeat_every=repeat_every, shard=shard,
                            devices=_csv_list(devices, int, "--devices"), plan_only=plan_only,
                            retry_failed=retry_failed, sm_clocks=_csv_list(sm_clocks, int, "--sm-clocks"),
                            i_own_this_gpu=i_own_this_gpu, precision=precision)
    if not plan_only:
        _require_gpu("collect")
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
    if not plan_only:
        _require_gpu("measure-network")
    _run_collect(opts)


SKIP_CORRUPT_HELP = "leave out unreadable raw lines (counted in the output) instead of failing"


def _note_bad_lines(by_gpu: dict[str, list[str]]) -> None:
    """Unreadable raw lines go to stderr too, so a person sees them without reading the JSON."""
    for gpu, lines in by_gpu.items():
        for line in lines:
            typer.echo(f"gpurec: {gpu}: {line}", err=True)


SKIP_INVALID_HELP = ("leave out raw rows that fail validation (no id, a non-finite or non-positive time, another "
                     "GPU, ...; counted and listed in the output) instead of failing")


@dataset_app.command("build")
def dataset_build(root: Path = typer.Option(None, "--root", help="dataset root with one directory per GPU "
                                            "(default: $GPUREC_DATASETS, else datasets/ of the checkout)"),
                  skip_corrupt_lines: bool = typer.Option(False, "--skip-corrupt-lines", help=SKIP_CORRUPT_HELP),
                  skip_invalid_rows: bool = typer.Option(False, "--skip-invalid-rows", help=SKIP_INVALID_HELP),
                  ) -> None:
    """Rebuild the Parquet tables of every GPU directory from its raw shards."""
    from gpurec.dataset.build import build_all

    result = _guard(build_all, root, allow_corrupt=skip_corrupt_lines, skip_invalid=skip_invalid_rows)
    _print_json(result)
    _note_bad_lines({gpu: summary.get("bad_lines", []) for gpu, summary in result.items()})


@dataset_app.command("external")
def dataset_external(source: str = typer.Argument(..., help="which public data set: neusight"),
                     src: Path = typer.Option(..., "--src", help="the artifact's copy, e.g. ../shared/external/neusight"),
                     root: Path = typer.Option(Path("datasets"), "--root", help="dataset root (writes ROOT/external/SOURCE)")
                     ) -> None:
    """Rebuild a public data set's derived tables (with its licence and source) under ROOT/external/."""
    if source != "neusight":
        _fail(f"unknown public data set {source!r}; choices: neusight", 2)
    from dataclasses import asdict

    from gpurec.dataset.external import ingest_neusight

    summary = _guard(ingest_neusight, src, root)
    _print_json({k: str(v) if isinstance(v, Path) else v for k, v in asdict(summary).items()})


@dataset_app.command("merge")
def dataset_merge(shards: list[Path] = typer.Argument(..., help="shard directories or rows-*.jsonl files"),
                  out: Path = typer.Option(..., "--out", help="GPU dataset directory, e.g. datasets/h100"),
                  skip_corrupt_lines: bool = typer.Option(False, "--skip-corrupt-lines", help=SKIP_CORRUPT_HELP),
                  skip_invalid_rows: bool = typer.Option(False, "--skip-invalid-rows", help=SKIP_INVALID_HELP),
                  ) -> None:
    """Merge shards into OUT/raw row by row (new rows only; conflicts reported) and rebuild OUT's tables."""
    from gpurec.dataset.merge import merge_shards

    result = _guard(merge_shards, shards, out, allow_corrupt=skip_corrupt_lines, skip_invalid=skip_invalid_rows)
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
    kinds: str = typer.Option(None, "--kinds", help="comma-separated operation kinds to profile (default: all), "
                                                   "e.g. Linear,matmul,bmm,LSTM,GRU"),
) -> None:
    """Nsight Compute counters per planned operation (needs ncu and a GPU; clocks are not locked).

    Prints a JSON summary; progress goes to stderr.
    """
    from gpurec.collect.counters import drive
    from gpurec.collect.plan import parse_shard

    i, n = _guard(parse_shard, shard)
    if not plan.is_file():
        _fail(f"--plan {plan} does not exist (scripts/make_plan.py writes datasets/plans/main.json)", 1)
    wanted = {k.strip() for k in kinds.split(",") if k.strip()} if kinds else None
    _print_json(_guard(drive, plan, out, budget_s, chunk, (i, n), log=_stderr, kinds=wanted))


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
    fmt = _check_format(fmt, ("table", "json"))
    from gpurec.profile.ncu_io import SAMPLING_MODES

    ncu_sampling, precision = ncu_sampling.lower(), precision.lower()
    if ncu_sampling not in SAMPLING_MODES:
        _fail(f"--ncu-sampling must be one of {', '.join(SAMPLING_MODES)}, not '{ncu_sampling}'")
    if precision not in ("fp32", "tf32", "bf16", "fp16"):
        _fail(f"--precision must be one of fp32, tf32, bf16, fp16, not '{precision}'")
    from gpurec.ops.user_module import is_user_module

    if is_user_module(model):
        _fail(f"profile takes torchvision classifiers by name, not {model}")
    if len(_check_input(model, batch_size, resolution, None)) != 4:
        _fail(f"profile takes torchvision classifiers; {model} is a sequence model")
    mode = _check_mode(mode)
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


@app.command("train-crossgpu")
def train_crossgpu(
    data: Path = typer.Option(Path("datasets"), "--data", help="dataset root (own GPUs and external/neusight)"),
    out: Path = typer.Option(Path("models"), "--out", help="directory holding the trained models"),
    cache: Path = typer.Option(None, "--cache", help="directory to keep extracted model-input sets between runs"),
    validate: bool = typer.Option(True, "--validate/--no-validate",
                                  help="also leave each GPU out and write crossgpu_report.json (minutes)"),
    tiles: bool = typer.Option(False, "--tiles/--no-tiles",
                               help="tile structure for matmul-like GEMMs and spec-dependent efficiencies (experimental)"),
    residual: bool = typer.Option(True, "--residual/--no-residual",
                                  help="a boosted-tree residual over the roofline (monotone through the lower "
                                       "envelope over the catalogue)"),
) -> None:
    """Fit the cross-GPU operation time model (OUT/crossgpu.json) on every GPU with data."""
    from gpurec.model.fitting.crossgpu_fit import fit_and_save

    model = _guard(fit_and_save, data, out, str(cache) if cache is not None else None, validate,
                   log=lambda msg: typer.echo(msg, err=True), tiles=tiles, residual=residual)
    _print_json(model.info)


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
        import os

        from gpurec.model.persist import MODELS_ENV, default_model_dir

        where = (f"{models}" if models is not None else
                 f"{default_model_dir()} (from ${MODELS_ENV})" if os.environ.get(MODELS_ENV) else
                 f"{default_model_dir()}")
        first = (str(exc).splitlines()[0] if str(exc) else type(exc).__name__).strip()
        first = first if first.endswith((".", "!", "?", ")")) else first + "."
        advice = ("" if "gpurec train" in first else
                  " Train them with `gpurec train --out DIR` and pass --models DIR (or set GPUREC_MODELS).")
        _fail(f"cannot use the trained models in {where}: {first}{advice}", MODELS_UNUSABLE)


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
    """The names as typed (so the library can note ambiguous ones), each checked against the catalogue."""
    from gpurec.catalog import resolve_gpu

    if not gpus_opt:
        return None
    names = [g.strip() for g in gpus_opt.split(",") if g.strip()]
    for g in names:
        _guard(resolve_gpu, g)
    return names


@app.command()
def predict(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    batch_size: int = typer.Option(32, "--batch-size", "-b", help="images (or sequences) per step"),
    resolution: int = typer.Option(224, "--resolution", "-r", help="image height and width in pixels"),
    mode: str = typer.Option("inference", "--mode", help="inference (forward) or training (forward + backward)"),
    gpu: str = typer.Option("H100-SXM", "--gpu", help="GPU short name or NVML name (see `gpurec gpus`)"),
    host: str = typer.Option(None, "--host", help=HOST_HELP),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help=GRAPHS_HELP),
    models: Path = typer.Option(None, "--models", help=MODELS_HELP),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
    precision: str = typer.Option("fp32", "--precision", help=PRECISION_HELP),
    seq_len: int = typer.Option(None, "--seq-len", "-s", help=SEQ_LEN_HELP),
    checkpoint: bool = typer.Option(False, "--checkpoint-blocks", help=CHECKPOINT_HELP),
) -> None:
    """Predict one step's time, energy and power on one GPU, with its uncertainty band."""
    fmt = _check_format(fmt, ("table", "json"))
    shape = _check_input(model, batch_size, resolution, seq_len)
    mode = _check_mode(mode)
    host = _check_host(host)
    from gpurec.catalog import resolve_gpu
    from gpurec.recommend.ranking import predict_on

    spec = _guard(resolve_gpu, gpu)
    with _Progress() as say:
        say("loading the predictors")
        p = _predictor(models)
        net, dtype = _network(model, shape)
        blocks: list[str] | None = None
        if checkpoint:
            net, dtype, blocks = _checkpointed(net, shape, dtype)
        say(f"predicting {model} on {spec.short_name}")
        f = _guard(predict_on, net, shape, mode, gpu, p, host, cuda_graphs, dtype=dtype,
                   precision=None if precision == "fp32" else precision)
    est = f.pop("estimate")
    per_op = est.per_op
    unc = _records(getattr(est, "uncovered", None))
    unaligned = _records(getattr(est, "unaligned_products", None))
    if fmt == "json":
        _print_json({"model": model, "input_shape": list(shape), "mode": mode, "energy_per": "step (one batch)",
                     **({"checkpointed_blocks": blocks} if blocks is not None else {}), **f,
                     "per_op": per_op.to_dict("records") if per_op is not None else [], "uncovered": unc,
                     "unaligned_products": unaligned})
        return
    g = "gpu_" if cuda_graphs else ""
    typer.echo(f"{model} {list(shape)} {mode}{'' if precision == 'fp32' else ' at ' + precision} "
               f"on {spec.nvml_name} ({f['evidence']}), "
               + ("host-free: the step as one CUDA graph" if cuda_graphs
                  else f"eager on host {f['host'] or host or 'reference'}"))
    if f["note"]:
        typer.echo(f"  note: {f['note']}")
    if not getattr(est, "precision_measured", True):
        typer.echo(f"WARNING: the predictors were trained on no {precision} measurements: these figures extrapolate "
                   "through the precision's peak rates and are not trustworthy yet.", err=True)
    typer.echo(f"  time   {_fmt(f[g + 'time_ms'])} ms      band {_fmt(f[g + 'time_low_ms'])}–"
               f"{_fmt(f[g + 'time_high_ms'])} ms")
    typer.echo(f"  energy {_fmt(f[g + 'energy_mj'])} mJ per step (one batch)   band {_fmt(f[g + 'energy_low_mj'])}–"
               f"{_fmt(f[g + 'energy_high_mj'])} mJ")
    typer.echo(f"  power  {_fmt(f[g + 'power_w'])} W" + (" (host-free: GPU energy / GPU time)" if cuda_graphs else ""))
    fit = "fits" if f["fits"] else "DOES NOT FIT"
    typer.echo(f"  memory about {_fmt(f['memory_gb'])} GB at its peak: {fit} the {spec.short_name}'s "
               f"{_fmt(f['memory_capacity_gb'])} GB")
    if f["bound"] is not None and not cuda_graphs:
        typer.echo(f"  bound  {f['bound']}: the eager step takes {_fmt(f['time_ms'])} ms, "
                   f"{f['time_ms'] / f['gpu_time_ms']:.3f}x the GPU's own {_fmt(f['gpu_time_ms'])} ms "
                   f"(host issue {_fmt(f['host_time_ms'])} ms); rule: {f['bound_rule']}")
    if blocks is not None:
        typer.echo(f"  --checkpoint-blocks: {len(blocks)} blocks run inside torch.utils.checkpoint "
                   f"({blocks[0]} ... {blocks[-1]})")
    if f.get("recomputed_ops"):
        typer.echo(f"  checkpointing: backward runs the forward of {f['recomputed_ops']} checkpointed operations "
                   f"again, {_fmt(f['recompute_gpu_time_ms'])} ms of the GPU time (memory counts their inputs only)")
    typer.echo(f"  bands: {f['band']}")
    if per_op is not None and len(per_op) and "time_share" in per_op:
        top = per_op.groupby("kind", as_index=False)[["time_share", "energy_share"]].sum()
        top = top.sort_values("time_share", ascending=False).head(5)
        typer.echo("  where the time goes: " + ", ".join(
            f"{r.kind} {r.time_share * 100:.0f}%" for r in top.itertuples()))
    if unaligned:
        from gpurec.model.gemm import unaligned_note

        typer.echo(f"  note: {unaligned_note(unaligned)}")
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
    typer.echo("  not covered by the training data (predicted anyway, less trustworthy): "
               f"{_plural(len(unc), 'operation')} [{kinds}], {flops:.1f}% of FLOPs, {time_share:.1f}% of the predicted operation time")


LOW_COVERAGE = 0.9


def _check_model_name(model: str) -> None:
    """Reject an unknown name before torch is imported (a fraction of a second, not seconds)."""
    from gpurec.ops.names import TORCHVISION_CLASSIFIERS, unknown_model_message
    from gpurec.sets import SEQ_DATASET_ARCHS, SEQ_TEST_ARCHS

    message = unknown_model_message(model, (*TORCHVISION_CLASSIFIERS, *SEQ_DATASET_ARCHS, *SEQ_TEST_ARCHS))
    if message is not None:
        _fail(message)


@app.command()
def recommend(
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    batch_size: int = typer.Option(32, "--batch-size", "-b", help="images (or sequences) per step"),
    resolution: int = typer.Option(224, "--resolution", "-r", help="image height and width in pixels"),
    mode: str = typer.Option("inference", "--mode", help="inference (forward) or training (forward + backward)"),
    objective: str = typer.Option("energy", "--objective",
                                  help="time, energy (per step) or edp (energy x time)"),
    gpus_opt: str = typer.Option(None, "--gpus", help="comma-separated GPUs (default: every catalogue GPU)"),
    host: str = typer.Option(None, "--host", help=HOST_HELP),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help=GRAPHS_HELP),
    models: Path = typer.Option(None, "--models", help=MODELS_HELP),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
    precision: str = typer.Option("fp32", "--precision", help=PRECISION_HELP),
    seq_len: int = typer.Option(None, "--seq-len", "-s", help=SEQ_LEN_HELP),
    checkpoint: bool = typer.Option(False, "--checkpoint-blocks", help=CHECKPOINT_HELP),
) -> None:
    """Rank GPUs for one step of a network by time, energy or energy-delay product."""
    fmt = _check_format(fmt, ("table", "json"))
    shape = _check_input(model, batch_size, resolution, seq_len)
    mode = _check_mode(mode)
    host = _check_host(host)
    from gpurec.recommend import check_objective
    from gpurec.recommend import recommend as run_recommend

    objective = _guard(check_objective, objective)
    gpu_list = _check_gpus(gpus_opt)
    with _Progress() as say:
        say("loading the predictors")
        predictor = _predictor(models)
        net, dtype = _network(model, shape)
        blocks: list[str] | None = None
        if checkpoint:
            net, dtype, blocks = _checkpointed(net, shape, dtype)
        ranking = _guard(run_recommend, net, shape, mode=mode, objective=objective, gpus=gpu_list,
                         predictor=predictor, host=host, cuda_graphs=cuda_graphs, progress=say, precision=precision,
                         dtype=dtype)
    if fmt == "json":
        _print_json({**ranking.to_dict(), **({"checkpointed_blocks": blocks} if blocks is not None else {})})
        return
    _render_ranking(ranking)
    if blocks is not None:
        typer.echo(f"--checkpoint-blocks: {len(blocks)} blocks run inside torch.utils.checkpoint "
                   f"({blocks[0]} ... {blocks[-1]}); times include their recomputation, memory keeps their inputs only.")


EVIDENCE_SHORT = {"measured: host-free": "host-free", "measured: eager": "eager",
                  "public per-operation data (time)": "public", "specifications only": "specs"}


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _vs_best(row: Any, fits_any: bool) -> str:
    if row.rank == 1:
        return "best" if fits_any else "-"
    if not math.isfinite(row.vs_best_pct):
        return "-"
    text = f"{row.vs_best_pct:+.0f}%" if abs(row.vs_best_pct) >= 100 else f"{row.vs_best_pct:+.1f}%"
    return text + (" tie" if row.tie_with_best else "")


def _band_pct(value: float, low: float, high: float) -> str:
    """The band relative to the figure: '-21%/+54%' (compact, for narrow terminals)."""
    if not (value > 0 and math.isfinite(low) and math.isfinite(high)):
        return "-"

    def pct(x: float) -> str:
        d = (x / value - 1.0) * 100.0
        return f"{d:+.0f}%" if abs(d) < 1000 else f"x{x / value:.0f}"
    return f"{pct(low)}/{pct(high)}"


def _render_ranking(r: Any) -> None:
    wide = _terminal_width() >= 110
    rows = []
    for row in r.rows:
        d = row.to_dict()
        d["data"] = EVIDENCE_SHORT.get(row.evidence, row.evidence)
        d["band"] = f"{_fmt(row.low)}–{_fmt(row.high)}" if wide else _band_pct(row.value, row.low, row.high)
        d["vs_best"] = _vs_best(row, r.fits_any)
        d["fits_text"] = "yes" if row.fits else f"NO {_fmt(row.memory_capacity_gb)}GB"
        rows.append(d)
    if r.cuda_graphs:  # host-free figures only: the step as one CUDA graph, no host in it
        figures = [("gpu_time_ms", "ms"), ("gpu_energy_mj", "mJ"), ("gpu_power_w", "W")]
    elif wide:
        figures = [("time_ms", "ms"), ("gpu_time_ms", "GPU ms"), ("energy_mj", "mJ"), ("power_w", "W"),
                   ("bound", "bound")]
    else:  # narrow: a host-bound step is marked on its time instead of a bound column
        for d in rows:
            d["time_text"] = _fmt(d["time_ms"]) + ("*" if d["bound"] == "host" else "")
        figures = [("time_text", "ms"), ("energy_mj", "mJ")]
    band_head = f"{r.objective} band" + (f" {r.unit}" if wide else "")
    _table(rows, [("rank", "#"), ("short_name", "GPU"), ("data", "data"), ("fits_text", "fits"), *figures,
                  ("vs_best", "vs best"), ("band", band_head)],
           title=f"{r.model} {list(r.input_shape)} {r.mode} at {r.precision}, by {r.objective} per step"
                 f"{', host-free (one CUDA graph)' if r.cuda_graphs else f', eager on host {r.host}'}",
           wrap=("short_name",))
    for note in r.notes:
        typer.echo(f"Note: {note}")
    if not r.fits_any:
        typer.echo(f"No GPU here can hold the step: it needs about {_fmt(r.memory_gb)} GB and the largest has "
                   f"{_fmt(max((x.memory_capacity_gb for x in r.rows), default=0.0))} GB; none is marked best "
                   "(try a smaller --batch-size).")
    typer.echo(f"Energy is per step (one batch). Bands: {r.band}. "
               f"{'GPU ms: the same step as one CUDA graph. ' if not r.cuda_graphs and wide else ''}"
               f"'tie': {r.tie_rule}")
    typer.echo("data: what backs each GPU: host-free = measured: host-free, eager = measured: eager (eager rows "
               "only), public = public per-operation data (time), specs = specifications only"
               f" (read from {r.evidence_source}).")
    if not r.cuda_graphs:
        from gpurec.recommend import bound_rule

        typer.echo(f"bound{'' if wide else ' (* on ms: host-bound)'}: {bound_rule()}.")
    if not r.precision_measured:
        typer.echo(f"WARNING: the predictors were trained on no {r.precision} measurements: these figures extrapolate "
                   "through the precision's peak rates and are not trustworthy yet.", err=True)
    typer.echo(f"Peak memory of the step: about {_fmt(r.memory_gb)} GB (parameters"
               f"{', gradients, activations kept for backward' if r.mode == 'training' else ', live activations'}; "
               "no optimizer state)." + (" GPUs that cannot hold it rank last." if r.fits_any and
                                          not all(x.fits for x in r.rows) else ""))
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
    batch_size: int = typer.Option(32, "--batch-size", "-b", help="images (or sequences) per step"),
    resolution: int = typer.Option(224, "--resolution", "-r", help="image height and width in pixels"),
    mode: str = typer.Option("inference", "--mode", help="inference (forward) or training (forward + backward)"),
    gpu_index: int = typer.Option(0, "--gpu-index", help="CUDA index of the GPU to measure on"),
    log: Path = typer.Option(Path("datasets/validation/validation_log.jsonl"), "--log",
                             help="JSON-lines file the record is appended to"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
    complete: Path = typer.Option(None, "--complete", help="add predictions to a log measured without xgboost"),
    models: Path = typer.Option(None, "--models", help=MODELS_HELP + " (with --complete)"),
    seq_len: int = typer.Option(None, "--seq-len", "-s", help=SEQ_LEN_HELP),
    precision: str = typer.Option("fp32", "--precision", help=PRECISION_HELP),
    checkpoint: bool = typer.Option(False, "--checkpoint-blocks", help=CHECKPOINT_HELP),
) -> None:
    """Measure a whole network on this GPU and compare with the prediction and the op sum."""
    fmt = _check_format(fmt, ("table", "json"))
    if complete is not None:
        from gpurec.validate import complete_log

        typer.echo(f"added predictions to {_guard(complete_log, complete, predictor=_predictor(models))} records "
                   f"of {complete}")
        return
    if not model:
        _fail("--model is required (or --complete LOG)")
    shape = _check_input(model, batch_size, resolution, seq_len)
    mode = _check_mode(mode)
    precision = _check_precision(precision)
    _require_gpu("validate", gpu_index)
    from gpurec.ops.user_module import is_user_module
    from gpurec.validate import render, validate_module
    from gpurec.validate import validate as run_validate

    if is_user_module(model):  # your own network: measured and compared, not logged (the log is re-made by name)
        import torch

        net, dtype = _network(model, shape)
        if checkpoint:
            net, dtype, _ = _checkpointed(net, shape, dtype)
        inputs = torch.zeros(shape, dtype=dtype) if dtype is not None else torch.randn(shape)
        record = _guard(validate_module, net, (inputs,), mode, gpu_index, precision=precision, label=model)
    else:
        record = _guard(run_validate, model, batch_size, resolution, mode, gpu_index, log,
                        seq_len=shape[1] if len(shape) == 2 else None, precision=precision,
                        checkpoint_blocks=checkpoint)
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
    refuse_if_busy: bool = typer.Option(False, "--refuse-if-busy", help="exit 1 without a profile when the machine "
                                        "is loaded or the figures unsteady (default: warn)"),
) -> None:
    """Characterise this host in a few seconds: Python speed, dispatch cost of a fixed set of
    module calls, and (with a GPU) tiny-kernel launch cost. Predictions rescale host work with it."""
    fmt = _check_format(fmt, ("table", "json"))
    _progress("host-bench: measuring (a few seconds) ...")
    from gpurec.dataset.store import atomic_write_json
    from gpurec.host import HostBusy, checked_host_bench

    try:
        profile, warnings = _guard(checked_host_bench, use_gpu=False if no_gpu else None,
                                   refuse_if_busy=refuse_if_busy)
    except HostBusy as exc:
        _fail(f"host-bench refused: {exc}", 1)
    for w in warnings:
        _progress(f"host-bench: WARNING: {w}")
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


# -- trained models ------------------------------------------------------------------------------
models_app = typer.Typer(no_args_is_help=True, help="Check the trained models.")
app.add_typer(models_app, name="models")


@models_app.command("check")
def models_check(
    models: Path = typer.Option(None, "--models", help="the trained models (default: $GPUREC_MODELS, else models/)"),
    data: Path = typer.Option(None, "--data", help="dataset root (default: datasets/)"),
    fmt: str = typer.Option("table", "--format", help="table or json"),
) -> None:
    """Whether the models were trained on the data on disk (hashes the dataset; loading a predictor
    does not). Exit code 1 when they differ: retrain (`gpurec train`) to use the new rows."""
    from gpurec.model.fitting.data import check_models

    fmt = _check_format(fmt, ("table", "json"))
    res = _guard(check_models, models, data)
    if fmt == "json":
        _print_json(res)
    else:
        typer.echo(f"{res['models']}: trained {res['created']} on data {str(res['model_data_sha256'])[:12]}…; "
                   f"data on disk {res['data_sha256'][:12]}…: "
                   + ("the same data" if res["match"] else "DIFFERENT data: retrain (`gpurec train`) to use it"))
        if res.get("lookup_refreshed"):
            typer.echo(f"measured-operation lookup rebuilt {res['lookup_refreshed']} from "
                       + ("the data on disk" if res["lookup_matches_data"] else
                          "other data: `gpurec tools refresh-lookup` looks the new rows up without a retrain"))
    raise typer.Exit(0 if res["match"] else 1)


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

    what = what.lower()
    if what not in REPORT_CHOICES:
        _fail(f"unknown report '{what}': choose one of {', '.join(REPORT_CHOICES)}")
    for name in REPORTS if what == "all" else (what,):
        _progress(f"report {name} ...")
        t0 = time.perf_counter()
        path = _guard(generate, name, root, measure=measure, analytic=not no_analytic, progress=_progress)
        _progress(f"report {name}: wrote {path} ({time.perf_counter() - t0:.0f} s)")


@tools_app.command("plan")
def tools_plan(out: Path = typer.Option(None, "--out",
                                       help="where to write the plan JSON (default datasets/plans/<sets>.json)"),
               sets: str = typer.Option("main", "--sets",
                                        help="main: the torchvision sets; seq: the sequence-model sets; "
                                             "targeted: the hand-written architectures and operation sweeps "
                                             "(gpurec.sets SYNTH_ARCHS, SWEEP_ARCHS); rnn-sweep: the LSTM and GRU "
                                             "operation sweeps (SEQ_SWEEP_ARCHS); peaks: one peak-memory "
                                             "item per network of the main plan; peaks-networks: one per "
                                             "network of the seq, targeted, precision and main plans; "
                                             "counter-twins: the operations at --precision (default bf16-mixed) "
                                             "of the layers already profiled with ncu in fp32; recard: the main and seq "
                                             "plans' batch-32 and batch-128 networks, to measure again on another card"),
               precision: str = typer.Option("fp32", "--precision", help=PRECISION_HELP + "; the main plan's "
                                             "sets and modes at that precision"),
               preset: str = typer.Option(None, "--preset", help="a plan of several precisions: "
                                          "'precision' (the round's precision collection), "
                                          "'precision-networks' (bf16-mixed networks only, unseen test "
                                          "architectures first), 'bf16-mixed-operations', 'seq-bf16-mixed' "
                                          "(the sequence models at bf16-mixed: held-out networks, then the "
                                          "training sets' operations and networks), 'seq-kinds-fp16-mixed' "
                                          "(the held-out sequence networks and the sequence training sets' "
                                          "attention, embedding and recurrent operations at fp16-mixed), 'lm-heads' "
                                          "(the language-model head sweep's heads at bf16-mixed and fp32)"),
               subset_of: Path = typer.Option(None, "--subset-of", help="a committed plan to copy the items of "
                                              "--archs from, verbatim (needs --out): a short lease measures "
                                              "them first and the full plan skips them when it resumes"),
               archs: str = typer.Option(None, "--archs", help="with --subset-of: comma-separated "
                                         "architectures, e.g. sweepfewgroups")) -> None:
    """Write the collection plan (work order) with the local torch."""
    from gpurec.tools.plan import (
        DEFAULT_PLAN,
        NETWORK_PEAKS_PLAN,
        PEAKS_PLAN,
        RECARD_PLAN,
        RNN_SWEEP_PLAN,
        SEQ_PLAN,
        TARGETED_PLAN,
        write_main_plan,
        write_network_peaks_plan,
        write_peaks_plan,
        write_preset_plan,
        write_recard_plan,
        write_rnn_sweep_plan,
        write_seq_plan,
        write_targeted_plan,
    )

    if subset_of is not None:
        if out is None or not archs:
            _fail("--subset-of needs --out (where to write the plan) and --archs", 2)
        from gpurec.tools.plan import write_arch_subset_plan

        _print_json(_guard(write_arch_subset_plan, out, subset_of, [a.strip() for a in archs.split(",") if a.strip()]))
        return
    if preset is not None:
        if out is None:
            _fail("--preset needs --out (where to write the plan)", 2)
        _print_json(_guard(write_preset_plan, preset, out, progress=_progress))
        return
    if sets == "main":
        _print_json(_guard(write_main_plan, out or DEFAULT_PLAN, precision=precision))
        return
    if sets == "counter-twins":
        from gpurec.tools.plan import COUNTER_TWINS_PLAN, write_counter_twins_plan

        _print_json(_guard(write_counter_twins_plan, out or COUNTER_TWINS_PLAN,
                           precision="bf16-mixed" if precision == "fp32" else precision))
        return
    if precision != "fp32":
        _fail(f"--precision applies to the main sets only (or use --preset); not to --sets {sets}", 2)
    writers = {"seq": (write_seq_plan, SEQ_PLAN), "targeted": (write_targeted_plan, TARGETED_PLAN),
               "rnn-sweep": (write_rnn_sweep_plan, RNN_SWEEP_PLAN), "peaks": (write_peaks_plan, PEAKS_PLAN),
               "peaks-networks": (write_network_peaks_plan, NETWORK_PEAKS_PLAN),
               "recard": (write_recard_plan, RECARD_PLAN)}
    if sets not in writers:
        _fail(f"--sets must be one of main, {', '.join(writers)}, not {sets!r}", 2)
    write, default = writers[sets]
    _print_json(_guard(write, out or default))


@tools_app.command("fit-memory")
def tools_fit_memory(
    models: Path = typer.Option(Path("models"), "--models", help="where to write memory.json"),
    data: Path = typer.Option(None, "--data", help="dataset root (default: datasets/)"),
) -> None:
    """Fit the peak-memory terms (workspace floor, scratch space, cuDNN RNN reserve) on the
    training architectures' trusted measured peaks and write MODELS/memory.json (a few minutes)."""
    from gpurec.model.fitting.memory_fit import write_memory_fit

    _print_json(_guard(write_memory_fit, models, data)["terms"])


@tools_app.command("memory-eval")
def tools_memory_eval(
    models: Path = typer.Option(Path("models"), "--models", help="where memory.json is"),
    data: Path = typer.Option(None, "--data", help="dataset root (default: datasets/)"),
    refit: bool = typer.Option(False, "--refit", help="refit the coefficients in memory (nothing written)"),
    arch: str = typer.Option("", "--arch", help="also list every trusted peak of architectures with this prefix"),
) -> None:
    """The peak-memory estimate against the trusted measured peaks, per group (extracts every
    measured network: minutes)."""
    from gpurec.model.fitting.memory_eval import TARGET_PCT, evaluate_memory

    res = _guard(evaluate_memory, models, data, refit)
    if refit:
        _print_json(res["coefficients"])
    if arch:
        rows = [{**r, "measured_gb": f"{r['measured_bytes'] / 1e9:.3f}", "estimated_gb": f"{r['estimated_bytes'] / 1e9:.3f}",
                 "error": f"{r['error_pct']:+.1f}%", "rnn_gb": f"{r['rnn_term_bytes'] / 1e9:.3f}"}
                for r in res["rows"] if r["arch"].startswith(arch)]
        _table(rows, [("set_key", "set"), ("mode", "mode"), ("precision", "precision"), ("measured_gb", "measured GB"),
                      ("estimated_gb", "estimated GB"), ("error", "error"), ("rnn_gb", "RNN term GB")],
               wrap=("set_key",))
    groups = [{**g, "mae": f"{g['mean_abs_error_pct']:.1f}%"} for g in res["groups"]]
    _table(groups, [("split", "split"), ("family", "family"), ("mode", "mode"), ("precision", "precision"),
                    ("rows", "rows"), ("within", f"within {TARGET_PCT:g}%"), ("mae", "mean abs error")], wrap=("family",))
    for split in ("training", "held-out"):
        gs = [g for g in res["groups"] if g["split"] == split]
        typer.echo(f"{split}: {sum(g['within'] for g in gs)} of {sum(g['rows'] for g in gs)} within {TARGET_PCT:g}%")


@tools_app.command("peak-breakdown")
def tools_peak_breakdown(
    set_keys: str = typer.Argument(..., help="comma-separated set keys, e.g. gru_lm_2x256:b8:s128"),
    mode: str = typer.Option("inference", "--mode", help="inference or training"),
    precision: str = typer.Option("fp32", "--precision", help="fp32, tf32, bf16-mixed, fp16-mixed, bf16, fp16"),
    top: int = typer.Option(12, "--top", help="groups of live blocks shown per step"),
    out: Path = typer.Option(None, "--out", help="also write every breakdown here (JSON)"),
    stacks: str = typer.Option("python", "--stacks", help="python, or all: C++ frames too (what backward allocated)"),
) -> None:
    """Needs a GPU. What the allocator holds at each step's peak, grouped by the Python frame
    that allocated it, beside the estimate and its parts (seconds per set)."""
    from gpurec.collect.peak_breakdown import peak_breakdown
    from gpurec.dataset.store import atomic_write_json
    from gpurec.model.memory import load_memory_fit
    from gpurec.ops import extract_operations
    from gpurec.ops.memory import step_memory
    from gpurec.sets import parse_set_key

    mode = mode.lower()
    if mode not in ("inference", "training"):
        raise typer.BadParameter(f"'{mode}' is not one of inference, training", param_hint="--mode")
    results = []
    for key in [k.strip() for k in set_keys.split(",") if k.strip()]:
        res = _guard(peak_breakdown, key, mode, precision.lower(), stacks=stacks.lower())
        s = parse_set_key(res["set_key"])
        est = step_memory(extract_operations(s.arch, s.input_shape, mode=mode, keep_sources=False,
                                             precision=res["precision"]), mode, load_memory_fit(Path("models")))
        res["estimated_bytes"] = est.total_bytes
        results.append(res)
        typer.echo(f"{res['set_key']} {mode} {res['precision']} on {res['gpu']}: peak {res['peak_bytes'] / 1e9:.3f} GB "
                   f"replayed, {res['measured_peak_bytes'] / 1e9:.3f} GB max_memory_allocated, "
                   f"{res['baseline_bytes'] / 1e9:.3f} GB held before the call; estimated {est.total_bytes / 1e9:.3f} GB "
                   f"(parameters {(est.params_bytes + est.grads_bytes) / 1e9:.3f}, activations "
                   f"{est.activations_bytes / 1e9:.3f}, floor {est.floor_bytes / 1e9:.3f}, workspaces "
                   f"{est.workspace_bytes / 1e9:.3f})")
        rows = [{"where": g["where"], "gb": f"{g['bytes'] / 1e9:.4f}", "blocks": g["blocks"],
                 "largest": ", ".join(f"{b / 1e6:.1f}" for b in g.get("largest", [])[:4])}
                for g in res["groups"][:top]]
        _table(rows, [("where", "allocated at"), ("gb", "GB"), ("blocks", "blocks"), ("largest", "largest MB")],
               wrap=("where",))
    if out is not None:
        atomic_write_json(out, {"breakdowns": results})


@tools_app.command("error-sources")
def tools_error_sources(
    models: Path = typer.Option(Path("models"), "--models", help="the trained models to judge"),
    data: Path = typer.Option(None, "--data", help="dataset root (default: datasets/)"),
    archs: str = typer.Option("", "--archs", help="comma-separated architectures (default: the unseen test ones)"),
    top: int = typer.Option(3, "--top", help="operations listed per network"),
) -> None:
    """Per measured network, worst first: predicted against in-network kernel time and the
    operations that carry the miss (a minute or two)."""
    from gpurec.model import load_predictor
    from gpurec.model.fitting.kind_errors import network_error_sources

    predictor = _guard(load_predictor, models, data_root=data, check_data=False)
    _print_json(_guard(network_error_sources, predictor, data, [a for a in archs.split(",") if a] or None, top))


@tools_app.command("unseen-snapshot")
def tools_unseen_snapshot(
    models: Path = typer.Option(Path("models"), "--models", help="the trained models to describe"),
    out: Path = typer.Option(Path("benchmarks/unseen_before.json"), "--out", help="where to write the snapshot"),
    data: Path = typer.Option(None, "--data", help="dataset root (default: datasets/)"),
) -> None:
    """Record the unseen-architecture errors of a set of models (per-kind in-network time error,
    host-free MAPE per mode), which docs/accuracy.md shows beside the shipped models' (minutes)."""
    from gpurec.dataset.store import atomic_write_json
    from gpurec.model.fitting.kind_errors import snapshot

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


@tools_app.command("fit-recurrent")
def tools_fit_recurrent(
    models: Path = typer.Option(Path("models"), "--models", help="trained model directory to add them to"),
    data: Path = typer.Option(Path("datasets"), "--data", help="dataset root with one directory per GPU"),
    half_only: bool = typer.Option(False, "--half-only",
                                   help="fit only the half-precision factors, keeping the models' fp32 forms"),
) -> None:
    """Fit the LSTM/GRU time, power and host models into trained models (seconds, no boosters
    retrained) and print the held-out sequence networks' errors before and after."""
    from gpurec.tools.recurrent import fit_into

    _print_json(_guard(fit_into, models, data, half_only=half_only))


@tools_app.command("fit-gemm-floor")
def tools_fit_gemm_floor(
    models: Path = typer.Option(Path("models"), "--models", help="trained model directory to add it to"),
    data: Path = typer.Option(Path("datasets"), "--data", help="dataset root with one directory per GPU"),
) -> None:
    """Fit the throughput floor of half-precision products with an unaligned weight (a 50,257-word
    LM head) and the roofline of wide ones (a 50,304-word head) into trained models (seconds, no
    boosters retrained) and print the held-out sequence networks' errors before and after."""
    from gpurec.tools.gemm import fit_gemm_floor_into

    _print_json(_guard(fit_gemm_floor_into, models, data))


@tools_app.command("public-band")
def tools_public_band(
    models: Path = typer.Option(Path("models"), "--models", help="model directory with crossgpu.json and its report"),
) -> None:
    """Write the band of the public whole models' held-out-GPU errors (crossgpu_report.json) into
    crossgpu.json, where the predictor widens extrapolated GPUs' bands to it (`gpurec
    train-crossgpu` does this itself; this serves cross-GPU models fitted before it did)."""
    from gpurec.model.fitting.crossgpu_fit import store_public_band

    _print_json(_guard(store_public_band, models))


@tools_app.command("correction-floors")
def tools_correction_floors(
    models: Path = typer.Option(Path("models"), "--models", help="trained model directory"),
) -> None:
    """Record the op sums the network time correction was fitted on into models trained before
    `gpurec train` recorded them (from the models' own report), so it is not extrapolated below."""
    from gpurec.tools.correction import floors_into

    _print_json(_guard(floors_into, models))


@tools_app.command("correction-nonrecurrent")
def tools_correction_nonrecurrent(
    models: Path = typer.Option(Path("models"), "--models", help="trained model directory"),
) -> None:
    """Fit the network time correction of networks without recurrent layers into models trained
    before `gpurec train` fitted it (chosen and fitted on the models' own report, seconds)."""
    from gpurec.tools.correction import nonrecurrent_into

    _print_json(_guard(nonrecurrent_into, models))


@tools_app.command("correction-measured-gap")
def tools_correction_measured_gap(
    models: Path = typer.Option(Path("models"), "--models", help="trained model directory"),
    data: Path = typer.Option(Path("datasets"), "--data", help="dataset root with one directory per GPU"),
) -> None:
    """Fit the gap between kernels that each looked-up operation adds to a network replayed as one
    CUDA graph into models trained before `gpurec train` fitted it (seconds, from the committed
    network and in-network tables)."""
    from gpurec.tools.correction import measured_gap_into

    _print_json(_guard(measured_gap_into, models, data))


@tools_app.command("refresh-lookup")
def tools_refresh_lookup(
    models: Path = typer.Option(Path("models"), "--models", help="trained model directory"),
    data: Path = typer.Option(Path("datasets"), "--data", help="dataset root with one directory per GPU"),
) -> None:
    """Rebuild the models' measured-operation lookup from every usable row on disk of the GPUs they
    were trained on, so operations measured since training are looked up, not predicted (the
    boosters and corrections stay as trained; a retrain does both; seconds)."""
    from gpurec.tools.lookup import refresh_lookup_into

    _print_json(_guard(refresh_lookup_into, models, data))


@tools_app.command("fp16-twins")
def tools_fp16_twins(
    models: Path = typer.Option(Path("models"), "--models", help="trained model directory"),
    data: Path = typer.Option(Path("datasets"), "--data", help="dataset root the models were trained on"),
) -> None:
    """Record which operation kinds the models' training rows held at bf16 and never at fp16, so
    their fp16 operations are read as bf16 twins on GPUs with equal fp16 and bf16 peaks (for
    models trained before `gpurec train` recorded it; seconds)."""
    from gpurec.tools.precision_twins import fp16_twins_into

    _print_json(_guard(fp16_twins_into, models, data))


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


@tools_app.command("probe-rnn")
def tools_probe_rnn(
    action: str = typer.Argument(..., help="measure or validate (on a GPU machine), compare or complete (here)"),
    path: Path = typer.Argument(..., help="JSON-lines file: appended to by measure/validate, read by compare/complete"),
    only: str = typer.Option("", "--only", help="comma-separated networks (default: all of gpurec.tools.probes)"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """Recurrent networks as users write them (packed batches, LSTMCell/GRUCell loops) measured live
    and compared with the shipped models (datasets/probes/; not training data)."""
    fmt = _check_format(fmt, ("table", "json"))
    from gpurec.tools import probes

    names = [n for n in only.split(",") if n] or None
    if action in ("measure", "validate"):
        run = probes.measure_rnn if action == "measure" else probes.validate_rnn
        rows = _guard(run, path, names, log=_progress)
        typer.echo(f"appended {len(rows)} rows to {path}")
        return
    if action not in ("compare", "complete"):
        _fail("use measure, validate, compare or complete")
    rows = _guard(probes.compare_rnn if action == "compare" else probes.complete_rnn, path)
    if fmt == "json":
        _print_json(rows)
        return
    shown = [{**r, "network": r.get("network", r.get("model"))} for r in rows]
    _table(shown, [("network", "network"), ("mode", "mode"), ("measured_time_ms", "eager ms"),
                   ("time_error_pct", "eager error %"), ("gpu_time_error_pct", "host-free error %"),
                   ("gpu_energy_error_pct", "host-free energy error %"), ("error", "failure")],
           title=f"{path}: predicted against measured" + (" (this machine's host profile)" if action == "complete"
                                                          else " (reference host)"))


@tools_app.command("probe-norms")
def tools_probe_norms(out: Path = typer.Argument(..., help="JSON file to write")) -> None:
    """nn.RMSNorm's CUDA kernels and time beside nn.LayerNorm's (GPU machine)."""
    from gpurec.tools import probes

    result = _guard(probes.probe_norms, out)
    typer.echo(f"wrote {out}: {len(result['rows'])} rows on {result['meta']['gpu']}")


@tools_app.command("probe-small")
def tools_probe_small(
    action: str = typer.Argument(..., help="validate (on a GPU machine) or complete (here)"),
    path: Path = typer.Argument(..., help="JSON-lines file: appended to by validate, read by complete"),
    budget_s: float = typer.Option(480.0, "--budget-s", help="validate: start no network after this many seconds"),
    fmt: str = typer.Option("table", "--format", "-f", help="table or json"),
) -> None:
    """Networks far smaller than any measured whole (MLPs, CNNs on 32x32 images, one Linear)
    measured live through validate_module and compared with the shipped models (datasets/probes/)."""
    fmt = _check_format(fmt, ("table", "json"))
    from gpurec.tools import probes

    if action == "validate":
        rows = _guard(probes.validate_small, path, budget_s, log=_progress)
        typer.echo(f"appended {len(rows)} records to {path}")
        return
    if action != "complete":
        _fail("use validate or complete")
    rows = _guard(probes.complete_small, path)
    if fmt == "json":
        _print_json(rows)
        return
    _table(rows, [("model", "network"), ("mode", "mode"), ("measured_gpu_time_ms", "host-free ms"),
                  ("op_sum_gpu_time_ms", "op sum ms"), ("predicted_gpu_time_ms", "predicted ms"),
                  ("gpu_time_error_pct", "error %"), ("as_trained_gpu_time_ms", "as trained ms"),
                  ("error", "failure")], title=f"{path}: predicted against measured (this machine's host profile)")


_FLAG_VALUES = {"true": True, "yes": True, "1": True, "on": True, "false": False, "no": False, "0": False,
                "off": False}


def fold_flag_values(args: list[str]) -> list[str]:
    """``--cuda-graphs true`` as ``--cuda-graphs`` and ``--cuda-graphs false`` as nothing: flags
    take no value, but people write one. Only the options that are flags are touched."""
    group: Any = typer.main.get_command(app)
    flags: set[str] = set()
    for a in args:
        sub = getattr(group, "commands", {}).get(a)
        if sub is not None:
            group = sub
            flags |= {o for p in sub.params if getattr(p, "is_flag", False) for o in p.opts}
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        nxt = args[i + 1].lower() if i + 1 < len(args) else None
        if a in flags and nxt in _FLAG_VALUES:
            if _FLAG_VALUES[nxt]:
                out.append(a)
            i += 2
            continue
        if a.startswith("--") and "=" in a and a.split("=", 1)[0] in flags:
            name, value = a.split("=", 1)
            if value.lower() in _FLAG_VALUES:
                out.extend([name] if _FLAG_VALUES[value.lower()] else [])
                i += 1
                continue
        out.append(a)
        i += 1
    return out


def main() -> None:
    """Console-script entry point."""
    try:
        app(args=fold_flag_values(sys.argv[1:]))
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
