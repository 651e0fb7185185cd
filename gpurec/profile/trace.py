"""Read a torch.profiler (Kineto) chrome trace: the profiled iteration, its GPU kernels,
and for each kernel the layer and operation that launched it.

Attribution goes kernel -> launch correlation id -> runtime/driver launch event on a CPU
thread -> the CPU ranges open on that thread at launch time. Forward kernels sit inside
``module::<qualified name>::<type>`` ranges opened by the worker's module hooks. Backward
kernels run on the autograd thread where no module range is open; they are attributed
through the autograd sequence number that links a backward node to the forward op that
created it.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

ITER_PREFIX = "gpurec_iter#"
MODULE_PREFIX = "module::"
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
OPTIMIZER_PREFIX = "Optimizer.step#"
ZERO_GRAD_PREFIX = "Optimizer.zero_grad#"

CPU_CATS = {"cpu_op", "user_annotation"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
# Event args worth keeping when the trace is trimmed for storage.
KEEP_ARGS = {
    "External id", "Sequence number", "Fwd thread id", "correlation", "grid", "block",
    "registers per thread", "shared memory", "stream", "device", "Input Dims", "bytes",
}


def load_trace_events(path: str | Path) -> dict[str, Any]:
    """Load a chrome trace (``.json`` or ``.json.gz``) as a dict with ``traceEvents``."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as fh:  # type: ignore[operator]
        data = json.load(fh)
    if isinstance(data, list):  # bare event list is valid chrome-trace JSON too
        data = {"traceEvents": data}
    return data


def trim_trace(data: dict[str, Any]) -> dict[str, Any]:
    """Keep only the events and args the analysis reads (traces shrink ~5-10x)."""
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X"]
    gpu_corr = {
        (e.get("args") or {}).get("correlation") for e in events if e.get("cat") in GPU_CATS
    }
    kept = []
    for e in events:
        cat = e.get("cat")
        if cat not in CPU_CATS | LAUNCH_CATS | GPU_CATS:
            continue
        args = e.get("args") or {}
        if cat in LAUNCH_CATS and args.get("correlation") not in gpu_corr:
            continue
        slim = {k: e[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur") if k in e}
        slim["args"] = {k: v for k, v in args.items() if k in KEEP_ARGS}
        kept.append(slim)
    out = {k: v for k, v in data.items() if k != "traceEvents"}
    out["traceEvents"] = kept
    return out


def write_trace(data: dict[str, Any], path: str | Path) -> Path:
    """Write a (trimmed) trace as gzip JSON when the name ends in .gz, else plain JSON."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "wt") as fh:  # type: ignore[operator]
        json.dump(data, fh, separators=(",", ":"))
    return p


@dataclass
class Interval:
    """One CPU range (op or annotation) on one thread, times in µs."""

    cat: str
    name: str
    ts: float
    end: float
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceData:
    """The profiled iteration of one trace, its kernels (annotated) and all GPU activity."""

    iteration_name: str
    iter_start_us: float
    iter_end_us: float
    kernels: pd.DataFrame
    gpu_events: pd.DataFrame

    @property
    def total_time_ms(self) -> float:
        return (self.iter_end_us - self.iter_start_us) / 1e3


def find_iteration(events: list[dict[str, Any]], prefix: str = ITER_PREFIX) -> dict[str, Any]:
    """The profiled iteration range: the last ``gpurec_iter#N`` CPU range in the trace."""
    ranges = [
        e for e in events
        if e.get("ph") == "X" and e.get("cat") in CPU_CATS and str(e.get("name", "")).startswith(prefix)
    ]
    if not ranges:
        raise ValueError(f"no '{prefix}N' range in the trace; was it recorded by gpurec.profile.worker?")
    return max(ranges, key=lambda e: float(e["ts"]))


def _thread_key(e: dict[str, Any]) -> tuple[str, str]:
    return str(e.get("pid")), str(e.get("tid"))


def _stacks_at(
    intervals: list[Interval], queries: list[tuple[float, Any]]
) -> dict[Any, list[Interval]]:
    """For each (time, key) query: the ranges open at that time, outermost first."""
    items = sorted(intervals, key=lambda iv: (iv.ts, -(iv.end - iv.ts)))
    out: dict[Any, list[Interval]] = {}
    stack: list[Interval] = []
    i = 0
    for t, key in sorted(queries, key=lambda q: q[0]):
        while i < len(items) and items[i].ts <= t:
            while stack and stack[-1].end < items[i].ts:
                stack.pop()
            stack.append(items[i])
            i += 1
        while stack and stack[-1].end < t:
            stack.pop()
        out[key] = [iv for iv in stack if iv.end >= t]
    return out


def _parse_module(name: str) -> tuple[str, str]:
    body = name[len(MODULE_PREFIX):]
    qname, _, mtype = body.rpartition("::")
    return (qname or body), (mtype or "")


def _innermost_module(stack: list[Interval]) -> tuple[int, Interval] | None:
    for idx in range(len(stack) - 1, -1, -1):
        iv = stack[idx]
        if iv.cat == "user_annotation" and iv.name.startswith(MODULE_PREFIX):
            return idx, iv
    return None


def _is_forward_op(iv: Interval, stack: list[Interval]) -> bool:
    fwd_tid = iv.args.get("Fwd thread id")
    if fwd_tid not in (None, 0):
        return False
    return not any(s.name.startswith(BACKWARD_PREFIX) for s in stack)


def annotate_stack(
    stack: list[Interval], seq_to_module: dict[int, tuple[str, str]]
) -> dict[str, str]:
    """Layer, layer type, op and phase for something launched under ``stack``."""
    for iv in stack:
        if iv.name.startswith(OPTIMIZER_PREFIX) or iv.name.startswith(ZERO_GRAD_PREFIX):
            opt = iv.name.split("#", 1)[1].split(".", 1)[0] if "#" in iv.name else "optimizer"
            inner = [s.name for s in stack if s.cat == "cpu_op"]
            return {"layer": "optimizer", "layer_type": f"Optimizer({opt})",
                    "op": inner[0] if inner else iv.name, "phase": "optimizer"}
    bwd = next((s for s in stack if s.cat == "cpu_op" and s.name.startswith(BACKWARD_PREFIX)), None)
    if bwd is not None:
        node = bwd.name[len(BACKWARD_PREFIX):]
        seq = bwd.args.get("Sequence number")
        layer, layer_type = seq_to_module.get(int(seq), ("(backward)", node)) if seq is not None else (
            "(backward)", node)
        return {"layer": layer, "layer_type": layer_type, "op": node, "phase": "backward"}
    found = _innermost_module(stack)
    if found is not None:
        idx, mod = found
        layer, layer_type = _parse_module(mod.name)
        ops = [s.name for s in stack[idx + 1:] if s.cat == "cpu_op"]
        return {"layer": layer, "layer_type": layer_type, "op": ops[0] if ops else "", "phase": "forward"}
    ops = [s.name for s in stack if s.cat == "cpu_op"]
    return {"layer": "(unattributed)", "layer_type": ops[0] if ops else "(unattributed)",
            "op": ops[-1] if ops else "", "phase": "other"}


def extract(data: dict[str, Any], iteration_prefix: str = ITER_PREFIX) -> TraceData:
    """Kernels of the profiled iteration with their layer attribution, plus GPU activity.

    A GPU event belongs to the iteration when its launch call starts inside the iteration
    range (the same rule ncu's cudaProfilerStart/Stop window applies), sorted by launch.
    """
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X"]
    it = find_iteration(events, iteration_prefix)
    t0 = float(it["ts"])
    t1 = t0 + float(it.get("dur", 0.0))

    by_thread: dict[tuple[str, str], list[Interval]] = defaultdict(list)
    launches: dict[Any, dict[str, Any]] = {}
    ext_ops: dict[Any, tuple[tuple[str, str], float]] = {}  # External id -> (thread, op start)
    gpu: list[dict[str, Any]] = []
    for e in events:
        cat = e.get("cat")
        args = e.get("args") or {}
        if cat in CPU_CATS:
            ts = float(e["ts"])
            by_thread[_thread_key(e)].append(Interval(cat, str(e.get("name", "")), ts,
                                                      ts + float(e.get("dur", 0.0)), args))
            if cat == "cpu_op" and args.get("External id") is not None:
                ext_ops.setdefault(args["External id"], (_thread_key(e), ts))
        elif cat in LAUNCH_CATS and "correlation" in args:
            launches[args["correlation"]] = e
        elif cat in GPU_CATS:
            gpu.append(e)

    # Stacks at every launch and at every forward op carrying an autograd sequence number.
    queries: dict[tuple[str, str], list[tuple[float, Any]]] = defaultdict(list)
    for corr, e in launches.items():
        queries[_thread_key(e)].append((float(e["ts"]), ("launch", corr)))
    # GPU events whose launch call was not recorded: fall back to the op with their External id.
    for e in gpu:
        args = e.get("args") or {}
        ext = args.get("External id")
        if args.get("correlation") not in launches and ext in ext_ops:
            tkey, ts = ext_ops[ext]
            queries[tkey].append((ts, ("ext", ext)))
    for tkey, ivs in by_thread.items():
        for n, iv in enumerate(ivs):
            if iv.cat == "cpu_op" and iv.args.get("Sequence number") is not None:
                queries[tkey].append((iv.ts, ("op", tkey, n)))
    stacks: dict[Any, list[Interval]] = {}
    for tkey, qs in queries.items():
        stacks.update(_stacks_at(by_thread.get(tkey, []), qs))

    # Autograd sequence number -> module of the forward op that created the node: the
    # latest-starting forward op with that number (ops before it only peeked the counter).
    seq_best: dict[int, tuple[float, tuple[str, str]]] = {}
    for tkey, ivs in by_thread.items():
        for n, iv in enumerate(ivs):
            key = ("op", tkey, n)
            if key not in stacks:
                continue
            stack = stacks[key]
            if not _is_forward_op(iv, stack):
                continue
            found = _innermost_module(stack)
            if found is None:
                continue
            seq = int(iv.args["Sequence number"])
            if seq < 0:
                continue
            if seq not in seq_best or iv.ts >= seq_best[seq][0]:
                seq_best[seq] = (iv.ts, _parse_module(found[1].name))
    seq_to_module = {seq: mod for seq, (_, mod) in seq_best.items()}

    rows = []
    for e in gpu:
        args = e.get("args") or {}
        corr = args.get("correlation")
        launch = launches.get(corr)
        ext = args.get("External id")
        if launch is not None:
            launch_ts, stack = float(launch["ts"]), stacks.get(("launch", corr), [])
        elif ext in ext_ops:
            launch_ts, stack = ext_ops[ext][1], stacks.get(("ext", ext), [])
        else:
            launch_ts, stack = float(e["ts"]), []
        if not (t0 <= launch_ts <= t1):
            continue
        ann = annotate_stack(stack, seq_to_module)
        grid = args.get("grid")
        block = args.get("block")
        rows.append({
            "cat": e.get("cat"),
            "name": str(e.get("name", "")),
            "correlation": corr if corr is not None else -1,
            "launch_ts_us": launch_ts,
            "ts_us": float(e["ts"]),
            "dur_us": float(e.get("dur", 0.0)),
            "grid": tuple(int(v) for v in grid) if isinstance(grid, list) and len(grid) == 3 else None,
            "block": tuple(int(v) for v in block) if isinstance(block, list) and len(block) == 3 else None,
            "registers": args.get("registers per thread"),
            "stream": args.get("stream"),
            **ann,
        })
    cols = ["cat", "name", "correlation", "launch_ts_us", "ts_us", "dur_us", "grid", "block",
            "registers", "stream", "layer", "layer_type", "op", "phase"]
    gdf = pd.DataFrame.from_records(rows, columns=cols)
    if not gdf.empty:
        gdf = gdf.sort_values(["launch_ts_us", "correlation"], kind="stable").reset_index(drop=True)
    kernels = gdf[gdf["cat"] == "kernel"].reset_index(drop=True)
    kernels.insert(0, "trace_idx", range(len(kernels)))
    return TraceData(str(it.get("name")), t0, t1, kernels, gdf)


def load_trace(path: str | Path, iteration_prefix: str = ITER_PREFIX) -> TraceData:
    """Load and extract a trace file (``.json`` or ``.json.gz``)."""
    return extract(load_trace_events(path), iteration_prefix)


def merge_intervals(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of [start, end) spans, sorted."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def timeline_metrics(trace: TraceData, bubble_min_us: float = 2.0) -> dict[str, float]:
    """GPU busy time, idle time and idle bubbles within the iteration window.

    Framework overhead = the CPU time not hidden by GPU work = iteration time during which
    no GPU event runs (leading idle + bubbles between GPU events + trailing idle).
    Bubbles are gaps between consecutive GPU events longer than ``bubble_min_us``.
    """
    t0, t1 = trace.iter_start_us, trace.iter_end_us
    total_us = max(t1 - t0, 0.0)

    def clip(df: pd.DataFrame) -> list[tuple[float, float]]:
        spans = []
        for s, d in zip(df["ts_us"], df["dur_us"], strict=True):
            a, b = max(float(s), t0), min(float(s) + float(d), t1)
            if b > a:
                spans.append((a, b))
        return spans

    busy = merge_intervals(clip(trace.gpu_events)) if not trace.gpu_events.empty else []
    kern = merge_intervals(clip(trace.kernels)) if not trace.kernels.empty else []
    busy_us = sum(b - a for a, b in busy)
    kernel_union_us = sum(b - a for a, b in kern)
    gaps = [busy[i + 1][0] - busy[i][1] for i in range(len(busy) - 1)]
    bubbles = [g for g in gaps if g > bubble_min_us]
    leading_us = (busy[0][0] - t0) if busy else total_us
    trailing_us = (t1 - busy[-1][1]) if busy else 0.0
    return {
        "total_time_ms": total_us / 1e3,
        "gpu_kernel_time_ms": float(trace.kernels["dur_us"].sum()) / 1e3 if not trace.kernels.empty else 0.0,
        "gpu_kernel_busy_time_ms": kernel_union_us / 1e3,
        "gpu_busy_time_ms": busy_us / 1e3,
        "framework_overhead_ms": (total_us - busy_us) / 1e3,
        "leading_idle_ms": leading_us / 1e3,
        "trailing_idle_ms": trailing_us / 1e3,
        "bubble_count": float(len(bubbles)),
        "bubble_time_ms": sum(bubbles) / 1e3,
        "bubble_min_us": bubble_min_us,
        "small_gap_time_ms": (sum(gaps) - sum(bubbles)) / 1e3,
    }
