"""The offline half of validation (CPU core): a measured network against its prediction, field
by field, and against the sum of its measured operations; the validation log (complete, render,
plot).  Measuring on the GPU at hand is ``gpurec.validate.run``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpurec.ops.precision import DEFAULT_PRECISION

if TYPE_CHECKING:
    from gpurec.results import StepCost

DEFAULT_LOG = Path("datasets") / "validation" / "validation_log.jsonl"


def sum_operations(ops: Iterable[tuple[str, float]], measured: Mapping[str, Sequence[float]],
                   tiny_ms: float = 0.02) -> dict[str, Any]:
    """Sum of measured per-call figures over a network's operations, counted with multiplicity.

    ``ops``: (signature, FLOPs) per executed operation; ``measured``: signature -> (time_ms,
    energy_mj, dynamic_energy_mj) of that GPU and mode.  Returns the sums over the measured
    operations and how much is measured (operations, FLOPs), plus the share of the summed time
    in operations under ``tiny_ms`` (launch-bound).  The sums are the network's only when
    ``coverage`` is 1."""
    n = covered = 0
    flops = covered_flops = t = e = d = tiny = 0.0
    for sig, f in ops:
        n += 1
        flops += f
        v = measured.get(sig)
        if v is None:
            continue
        covered += 1
        covered_flops += f
        t += float(v[0])
        e += float(v[1])
        d += float(v[2]) if len(v) > 2 else float("nan")
        if v[0] < tiny_ms:
            tiny += float(v[0])
    return {"ops": n, "covered_ops": covered, "coverage": covered / max(1, n),
            "flops_coverage": covered_flops / flops if flops else float("nan"),
            "sum_time_ms": t, "sum_energy_mj": e, "sum_dynamic_energy_mj": d,
            "tiny_time_share": tiny / t if t else float("nan")}


def sum_of_measured_ops(model: str, input_shape: tuple[int, ...], mode: str, gpu: str,
                        root: Path | None = None, precision: str = DEFAULT_PRECISION) -> dict[str, Any]:
    """Sum of per-operation measurements (with multiplicity) for one network on one GPU.

    Host-free rows give ``sum_gpu_time_ms`` and ``sum_gpu_energy_mj`` (compare with the step as
    one CUDA graph); every row gives ``sum_time_ms`` (eager, host included) and, where the rows
    have eager energy, ``sum_energy_mj``.  The sums are present only when every operation of the
    set is measured."""
    from gpurec.dataset import load_dataset
    from gpurec.ops import extract_operations
    from gpurec.ops.precision import rows_at_precision

    ops = extract_operations(model, input_shape, mode=mode, keep_sources=False, precision=precision)
    try:
        df = load_dataset(gpu=gpu, root=root)
    except FileNotFoundError:
        return {"ops": len(ops), "covered_ops": 0, "coverage": 0.0}
    df = rows_at_precision(df, precision)  # a row's identity is (gpu, precision, id)
    df = df[df["mode"] == mode].drop_duplicates("op_signature")
    out: dict[str, Any] = {}
    columns = {"time": ("time_ms", "energy_mj"), "gpu_time": ("gpu_time_ms", "gpu_energy_mj")}
    for name, (t_col, e_col) in columns.items():
        if t_col not in df.columns:
            continue
        have = df[df[t_col].notna()]
        energy = have[e_col] if e_col in have.columns else [float("nan")] * len(have)
        measured = {str(sig): (t, e) for sig, t, e in zip(have["op_signature"], have[t_col], energy, strict=True)}
        sums = sum_operations(((op.signature, float(op.flops_total)) for op in ops), measured)
        if name == "time" or not out:
            out.update({k: sums[k] for k in ("ops", "covered_ops", "coverage")})
        if sums["covered_ops"] == sums["ops"]:
            out[f"sum_{t_col}"] = sums["sum_time_ms"]
            if sums["sum_energy_mj"] == sums["sum_energy_mj"]:  # not NaN: every row had this energy
                out[f"sum_{e_col}"] = sums["sum_energy_mj"]
    return out or {"ops": len(ops), "covered_ops": 0, "coverage": 0.0}


def set_key_of(model: str, input_shape: Sequence[int]) -> str:
    """The model-input set key (gpurec.sets) of a named model on an input: ``arch:bB:sS`` for token
    ids (batch, seq_len), ``arch:bB:rR`` for an image batch."""
    from gpurec.sets import ModelInputSet, SequenceInputSet

    if len(input_shape) == 2:
        return SequenceInputSet(model, int(input_shape[0]), int(input_shape[1])).key
    return ModelInputSet(model, int(input_shape[0]), int(input_shape[-1])).key


def input_of(model: str, batch_size: int, resolution: int = 224, seq_len: int | None = None) -> tuple[int, ...]:
    """The input a named model takes: (batch, seq_len) token ids for one of gpurec's sequence
    models (gpurec.sets), else a (batch, 3, resolution, resolution) image batch."""
    from gpurec.sets import is_sequence_arch

    if is_sequence_arch(model):
        if not seq_len:
            raise ValueError(f"{model} is a sequence model: give its sequence length (seq_len)")
        return (int(batch_size), int(seq_len))
    return (int(batch_size), 3, int(resolution), int(resolution))


def record_input(record: Mapping[str, Any]) -> tuple[tuple[int, ...], str, str]:
    """A log record's (input shape, precision, set key).  Records of older code carry neither a
    sequence length nor a precision: fp32 image batches."""
    from gpurec.ops.precision import precision_or_default

    shape = input_of(record["model"], record["batch_size"], record.get("resolution") or 224, record.get("seq_len"))
    return shape, precision_or_default(record.get("precision")), set_key_of(record["model"], shape)


def measured_fields(meas: dict[str, Any]) -> dict[str, Any]:
    """The host-free figures of a measurement and the bound they imply (absent on old records),
    as ``measured_*`` log fields of its ``StepCost``."""
    from gpurec.results import StepCost

    out: dict[str, Any] = {}
    for k in ("gpu_time_ms", "gpu_energy_mj", "gpu_power_w", "host_ms", "captured"):
        if meas.get(k) is not None:
            out[f"measured_{k}"] = meas[k]
    bound = StepCost.measured(meas).bound if meas.get("gpu_time_ms") else None
    if bound is not None:
        out["measured_bound"] = bound
    if meas.get("in_network_kernel_sum_ms") is not None:
        out["measured_kernel_sum_ms"] = meas["in_network_kernel_sum_ms"]
    if meas.get("peak_memory_bytes") is not None:
        out["measured_peak_memory_gb"] = meas["peak_memory_bytes"] / 1e9
    return out


def measured_cost(record: dict[str, Any]) -> StepCost:
    """The measured ``StepCost`` of a log record (its ``measured_*`` fields)."""
    from gpurec.results import StepCost

    return StepCost.measured({"time_ms": record["measured_time_ms"], "energy_mj": record["measured_energy_mj"],
                              "power_w": record.get("measured_power_w"),
                              "gpu_time_ms": record.get("measured_gpu_time_ms"),
                              "gpu_energy_mj": record.get("measured_gpu_energy_mj"),
                              "host_ms": record.get("measured_host_ms"),
                              "captured": record.get("measured_captured")})


def host_of(record: dict[str, Any]) -> Any:
    """The measuring host's profile (None: the reference host, for records without one)."""
    if not record.get("host_bench"):
        return None
    from gpurec.host import HostProfile

    return HostProfile.from_dict(record["host_bench"])


def prediction_fields(est: Any, measured_time_ms: float, measured_energy_mj: float,
                      measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """A prediction and its error against a measurement, field by field, as a log record stores
    them (errors are (predicted - measured) / measured, in per cent; ``gpurec.results.compare``
    on the two ``StepCost``s)."""
    from gpurec.results import StepCost, compare

    out = {"predicted_time_ms": est.time_ms, "predicted_energy_mj": est.energy_mj,
           "predicted_power_w": est.power_w, "gpu_measured_in_training": bool(est.measured_gpu),
           "predicted_gpu_time_ms": est.gpu_time_ms, "predicted_gpu_energy_mj": est.gpu_energy_mj,
           "predicted_host_time_ms": est.host_time_ms, "predicted_bound": est.bound, "predicted_host": est.host}
    m = measured or {}
    meas = measured_cost({**m, "measured_time_ms": measured_time_ms, "measured_energy_mj": measured_energy_mj})
    # the bound as the record states it (records of older code may lack the host-free figures),
    # none for a step that was not captured (older code stated one from its eager fallback)
    stated = m.get("measured_bound") if m.get("measured_captured") is not False else None
    meas = StepCost(**{**meas.to_dict(), "bound": stated or None})
    errors = compare(StepCost.of(est), meas)
    # the log keeps the errors it always kept: eager time and energy, host-free time and energy
    out.update({k: errors[k] for k in ("time_error_pct", "energy_error_pct", "gpu_time_error_pct",
                                       "gpu_energy_error_pct", "bound_right") if k in errors})
    if m.get("in_network"):
        out["per_op_error"] = per_op_errors(est, m["in_network"])
    return out


def per_op_errors(est: Any, in_network: dict[str, list[Any]], top: int | None = 10) -> list[dict[str, Any]]:
    """The operations that carry the GPU-time error: predicted GPU time against the kernel time
    the in-network pass measured for the same position, largest absolute difference first
    (``top`` of them; None: every position)."""
    per_op = est.per_op
    n = min(len(per_op), len(in_network.get("kernel_ms", [])))
    rows = []
    for i in range(n):
        pred, meas = float(per_op["time_ms"].iloc[i]), float(in_network["kernel_ms"][i])
        rows.append({"position": i, "kind": str(per_op["kind"].iloc[i]), "predicted_ms": pred, "measured_ms": meas,
                     "diff_ms": pred - meas, "same_operation": per_op["signature"].iloc[i]
                     == in_network["op_signature"][i]})
    rows.sort(key=lambda r: -abs(r["diff_ms"]))
    return rows if top is None else rows[:top]


def predict_record(predictor: Any, record: Mapping[str, Any], network: tuple[Any, Any] | None = None) -> Any:
    """The predictor's estimate for a log record's network, input, precision, GPU and measuring
    host (fp32 is predicted as it always was, without naming a precision); a record of a
    checkpointed step (``checkpoint_blocks``) is predicted with the same blocks checkpointed.
    ``network``: the record's ``record_network``, where the caller has it already."""
    shape, precision, _ = record_input(record)
    extra = {} if precision == DEFAULT_PRECISION else {"precision": precision}
    model, dtype = network if network is not None else record_network(record, shape)
    if dtype is not None:
        extra["dtype"] = dtype
    return predictor.predict(model, input_shape=shape, mode=record["mode"], gpu=record["gpu"],
                             host=host_of(record), **extra)


def record_network(record: Mapping[str, Any], shape: Sequence[int]) -> tuple[Any, Any]:
    """What a record measured, to predict: its model's name, or, for a checkpointed step, that
    model built on meta with its repeated blocks checkpointed (and the input dtype, token ids for
    a (batch, seq_len) input)."""
    if not record.get("checkpoint_blocks"):
        return record["model"], None
    import torch

    from gpurec.ops.checkpointing import checkpointed

    return checkpointed(record["model"])[0], (torch.long if len(shape) == 2 else None)


def predicted_fields(predictor: Any, record: Mapping[str, Any]) -> dict[str, Any]:
    """A measured record's prediction and errors (``prediction_fields``) and its peak memory
    (``memory_fields``), the record's network built once for both."""
    network = record_network(record, record_input(record)[0])
    est = predict_record(predictor, record, network)
    return {**prediction_fields(est, record["measured_time_ms"], record["measured_energy_mj"], record),
            **memory_fields(predictor, record, network)}


def memory_fields(predictor: Any, record: Mapping[str, Any], network: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """The step's estimated peak memory (gpurec.ops.memory with the predictor's fitted terms) and
    its error against the measured peak, for a record that measured one."""
    if record.get("measured_peak_memory_gb") is None:
        return {}
    from gpurec.recommend.ranking import step_memory_of

    shape, precision, _ = record_input(record)
    model, dtype = network if network is not None else record_network(record, shape)
    gb = float(step_memory_of(model, tuple(shape), record["mode"], dtype, precision=precision,
                              fit=getattr(predictor, "memory_fit", None)).memory_gb)
    return {"predicted_peak_memory_gb": gb,
            "peak_memory_error_pct": (gb / record["measured_peak_memory_gb"] - 1.0) * 100.0}


def load_predictor_or_none() -> Any:
    """The shipped predictor, or None where xgboost is missing (GPU machines without it still
    measure; ``complete_log`` adds the predictions later on any machine)."""
    try:
        import xgboost  # noqa: F401
    except ImportError:
        return None
    from gpurec.model import load_predictor

    return load_predictor()


def complete_log(path: Path | str, predictor: Any = None) -> int:
    """Add predictions to log records measured where xgboost was missing; returns how many."""
    from gpurec.dataset.store import atomic_write_text

    recs = load_log(path)
    pending = [r for r in recs if "prediction" in r and "predicted_time_ms" not in r]
    if not pending:
        return 0
    if predictor is None:
        from gpurec.model import load_predictor

        predictor = load_predictor()
    for r in pending:
        r.pop("prediction")
        r.update(predicted_fields(predictor, r))
    atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in recs))
    return len(pending)


def render(record: dict[str, Any]) -> str:
    """A record for people: measured, predicted, host-free and the sum of measured operations (a
    module's record, validate_module's, has no operation sum: its operations were not measured)."""
    from gpurec.ops.precision import precision_or_default

    if record.get("module"):
        precision = precision_or_default(record.get("precision"))
        head = f"{record['model']} inputs {record['input_shapes']}, {record['mode']}"
    else:
        shape, precision, _ = record_input(record)
        what = f"sequence length {shape[1]}, " if len(shape) == 2 else ""
        head = f"{record['model']} batch {record['batch_size']}, {what}{record['mode']}"
        if record.get("checkpoint_blocks"):
            head += ", repeated blocks checkpointed"
    at = "" if precision == DEFAULT_PRECISION else f" at {precision}"
    lines = [f"{head}{at} on {record['gpu']}",
             f"  measured : {record['measured_time_ms']:.3f} ms  {record['measured_energy_mj']:.1f} mJ  "
             f"{record['measured_power_w']:.0f} W"]
    if "predicted_time_ms" in record:
        lines.append(f"  predicted: {record['predicted_time_ms']:.3f} ms  {record['predicted_energy_mj']:.1f} mJ  "
                     f"({record['time_error_pct']:+.1f}% time, {record['energy_error_pct']:+.1f}% energy)")
        if "measured_gpu_time_ms" in record and "predicted_gpu_time_ms" in record:
            lines.append(f"  host-free: measured {record['measured_gpu_time_ms']:.3f} ms, predicted "
                         f"{record['predicted_gpu_time_ms']:.3f} ms ({record.get('gpu_time_error_pct', 0):+.1f}%); "
                         f"bound measured {record.get('measured_bound')}, predicted {record.get('predicted_bound')}")
    else:
        lines.append(f"  predicted: {record['prediction']}" + ("" if record.get("module") else
                                                               "; run `gpurec validate --complete LOG` where it is"))
    if "predicted_peak_memory_gb" in record:
        lines.append(f"  peak memory: measured {record['measured_peak_memory_gb']:.3f} GB, predicted "
                     f"{record['predicted_peak_memory_gb']:.3f} GB ({record['peak_memory_error_pct']:+.1f}%)")
    if record.get("module"):
        return "\n".join(lines)
    if record.get("checkpoint_blocks"):
        lines.append("  sum of measured operations: none (the rows are the plain network's, without the recomputation)")
    elif "opsum_gpu_time_error_pct" in record:
        lines.append(f"  sum of host-free operations: {record['opsum_sum_gpu_time_ms']:.3f} ms "
                     f"({record['opsum_gpu_time_error_pct']:+.1f}% against the graph)"
                     + (f", {record['opsum_sum_gpu_energy_mj']:.1f} mJ ({record['opsum_gpu_energy_error_pct']:+.1f}%)"
                        if "opsum_gpu_energy_error_pct" in record else ""))
    elif "opsum_time_error_pct" in record:
        lines.append(f"  sum of measured operations: {record['opsum_sum_time_ms']:.3f} ms "
                     f"({record['opsum_time_error_pct']:+.1f}%)"
                     + (f", {record['opsum_sum_energy_mj']:.1f} mJ ({record['opsum_energy_error_pct']:+.1f}%)"
                        if "opsum_energy_error_pct" in record else ""))
    else:
        lines.append(f"  sum of measured operations: {record.get('opsum_covered_ops', 0)}/{record.get('opsum_ops', 0)} "
                     "operations measured on this GPU, not comparable")
    return "\n".join(lines)


def load_log(path: Path | str = DEFAULT_LOG) -> list[dict[str, Any]]:
    from gpurec.dataset.store import read_jsonl

    return list(read_jsonl(path))


def plot_log(path: Path | str, out_png: Path | str) -> None:
    """Predicted against measured eager time, host-free GPU time (records that have it) and
    eager energy for every completed record in the log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in load_log(path) if "predicted_time_ms" in r]  # pending records have nothing to plot
    panels = [("measured_time_ms", "predicted_time_ms", "eager time, ms"),
              ("measured_gpu_time_ms", "predicted_gpu_time_ms", "GPU time (graph), ms"),
              ("measured_energy_mj", "predicted_energy_mj", "eager energy, mJ")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4))
    for ax, (m, p, label) in zip(axes, panels, strict=True):
        pairs = [(r[m], r[p]) for r in recs if r.get(m) and r.get(p)]
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted")
        if not pairs:
            continue
        xs, ys = zip(*pairs, strict=True)
        ax.loglog(xs, ys, "o", ms=4)
        lo, hi = min(xs + ys), max(xs + ys)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)


__all__ = ["DEFAULT_LOG", "complete_log", "host_of", "load_log", "measured_fields", "per_op_errors", "plot_log",
           "prediction_fields", "render", "sum_of_measured_ops", "sum_operations"]
