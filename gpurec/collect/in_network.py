"""In-network attribution: every kernel of a real network step, and every operation's host
dispatch time, assigned to the operation (as :func:`gpurec.ops.extract_operations` lists
them) that issued it.

The network is traced with the same fx tracer as extraction, so its nodes carry the same
names as the operations' ``node`` field.  One step is run node by node with a
``module::<node>::<kind>`` profiler range around each node and recorded by
``torch.profiler`` (CUPTI).  :func:`gpurec.profile.trace.extract` then attributes each
kernel to the range open when it was launched; backward kernels follow the autograd
sequence number back to the forward node that created them.

Host time per operation is the duration of its forward range plus the duration of the
autograd ``evaluate_function`` events of its backward nodes.  It is taken under the
profiler, which adds a few microseconds per ATen call, so it reads somewhat high; the eager
``host_ms`` of isolated operations has no profiler.  Kernels launched outside every
operation (by fx bookkeeping nodes, or with no recorded sequence number) are summed as
``unattributed`` on the network row, never dropped.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from gpurec.profile.trace import BACKWARD_PREFIX, MODULE_PREFIX, extract

ITER_NAME = "gpurec_iter#0"


def _node_kind(node: Any, modules: dict[str, Any]) -> str:
    if node.op == "call_module":
        return type(modules[node.target]).__name__
    return str(getattr(node.target, "__name__", node.target))


def annotated_step(model: Any, x: Any, grads: list[Any] | None) -> Any:
    """A callable running one step of ``model`` node by node, each node in its own range."""
    import torch
    from torch.autograd.profiler import record_function
    from torch.utils._pytree import tree_flatten

    from gpurec.ops import ModuleTracer

    graph = ModuleTracer().trace(model)
    gm = torch.fx.GraphModule(model, graph)
    modules = dict(model.named_modules())

    class _Annotated(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            if n.op in ("call_module", "call_function", "call_method"):
                with record_function(f"{MODULE_PREFIX}{n.name}::{_node_kind(n, modules)}"):
                    return super().run_node(n)
            return super().run_node(n)

    interp = _Annotated(gm)

    def step() -> None:
        out = interp.run(x)
        if grads is not None:
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            torch.autograd.backward(outs, grads)
            model.zero_grad(set_to_none=True)

    return step


def host_times_us(events: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """Forward and backward host microseconds per node name, from chrome-trace events."""
    ranges: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    fwd: dict[str, float] = defaultdict(float)
    for e in events:
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and name.startswith(MODULE_PREFIX):
            node = name[len(MODULE_PREFIX):].rpartition("::")[0]
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
            ranges[(e.get("pid"), e.get("tid"))].append((ts, ts + dur, node))
            fwd[node] += dur
    starts = {k: sorted(v) for k, v in ranges.items()}
    keys = {k: [r[0] for r in v] for k, v in starts.items()}
    seq_node: dict[int, tuple[float, str]] = {}
    bwd_events = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "cpu_op":
            continue
        args = e.get("args") or {}
        seq = args.get("Sequence number")
        if seq is None:
            continue
        name = str(e.get("name", ""))
        if name.startswith(BACKWARD_PREFIX):
            bwd_events.append((int(seq), float(e.get("dur", 0.0))))
            continue
        if args.get("Fwd thread id") not in (None, 0):
            continue
        tkey = (e.get("pid"), e.get("tid"))
        if tkey not in starts:
            continue
        ts = float(e["ts"])
        i = bisect.bisect_right(keys[tkey], ts) - 1
        if i >= 0 and starts[tkey][i][1] >= ts:
            if int(seq) not in seq_node or ts >= seq_node[int(seq)][0]:
                seq_node[int(seq)] = (ts, starts[tkey][i][2])
    bwd: dict[str, float] = defaultdict(float)
    for seq, dur in bwd_events:
        if seq in seq_node:
            bwd[seq_node[seq][1]] += dur
        else:
            bwd["(unattributed)"] += dur
    return dict(fwd), dict(bwd)


def attribute(trace_data: dict[str, Any], ops: Sequence[Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-operation rows and a network summary from one recorded step."""
    td = extract(trace_data, "gpurec_iter#")
    kernels = td.kernels
    fwd_us, bwd_us = host_times_us(trace_data.get("traceEvents", []))
    node_pos = {getattr(op, "node", ""): i for i, op in enumerate(ops)}
    k_ms: dict[str, float] = defaultdict(float)
    k_n: dict[str, int] = defaultdict(int)
    for layer, dur in zip(kernels["layer"], kernels["dur_us"], strict=True):
        k_ms[str(layer)] += float(dur) / 1e3
        k_n[str(layer)] += 1
    rows = []
    for i, op in enumerate(ops):
        node = getattr(op, "node", "")
        rows.append({
            "position": i, "op_signature": op.signature, "op_kind": op.kind, "node": node,
            "kernel_ms": k_ms.get(node, 0.0), "kernels": int(k_n.get(node, 0)),
            "host_ms": (fwd_us.get(node, 0.0) + bwd_us.get(node, 0.0)) / 1e3,
            "host_fwd_ms": fwd_us.get(node, 0.0) / 1e3, "host_bwd_ms": bwd_us.get(node, 0.0) / 1e3,
        })
    unattributed = {k: v for k, v in k_ms.items() if k not in node_pos}
    other = td.gpu_events[td.gpu_events["cat"] != "kernel"] if len(td.gpu_events) else td.gpu_events
    summary = {
        "kernel_sum_ms": float(kernels["dur_us"].sum() / 1e3) if len(kernels) else 0.0,
        "kernel_count": int(len(kernels)),
        "attributed_kernel_ms": float(sum(v for k, v in k_ms.items() if k in node_pos)),
        "unattributed_kernel_ms": float(sum(unattributed.values())),
        "unattributed_kernels": int(sum(k_n[k] for k in unattributed)),
        "unattributed_by": json.dumps({k: round(v, 6) for k, v in sorted(unattributed.items())}),
        "memcpy_memset_ms": float(other["dur_us"].sum() / 1e3) if len(other) else 0.0,
        "profiled_step_ms": td.total_time_ms,
        "profiled_host_fwd_ms": sum(fwd_us.values()) / 1e3,
        "profiled_host_bwd_ms": sum(bwd_us.values()) / 1e3,
        "ops_without_kernels": int(sum(1 for r in rows if r["kernels"] == 0)),
    }
    return rows, summary


def columnar(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Rows as one list per column (a network row stores hundreds of these; keys once)."""
    cols: dict[str, list[Any]] = {}
    for r in rows:
        for k, v in r.items():
            cols.setdefault(k, []).append(round(v, 6) if isinstance(v, float) else v)
    return cols


def profile_network(model: Any, x: Any, grads: list[Any] | None, ops: Sequence[Any], inference: bool,
                    warmup: int = 2) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Record one annotated step under torch.profiler and attribute it to ``ops``."""
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    step = annotated_step(model, x, grads)
    ctx = torch.inference_mode if inference else torch.enable_grad
    with ctx():
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function(ITER_NAME):
                step()
            torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="gpurec_trace_")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            data = json.load(fh)
    finally:
        os.unlink(path)
    if isinstance(data, list):
        data = {"traceEvents": data}
    return attribute(data, ops)
