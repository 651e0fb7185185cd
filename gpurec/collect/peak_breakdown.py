"""What the allocator holds at a network step's peak, block by block (GPU side).

Why: ``peak_memory_bytes`` is one number; where an estimate misses it (a GRU language model
at 1,024 tokens reads 20% low, VGG's convolutions hold their inputs plus outputs again), the
miss can only be explained by what is alive at that moment.  :func:`peak_breakdown` runs the
step as collection's peak rows do (a first call, then one recorded call) with PyTorch's
allocator history on, and :func:`live_at_peak` replays that history to the moment the
allocated bytes peak, grouping the live blocks by the Python frame that allocated them.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Sequence
from typing import Any

_TORCH_PATHS = ("/torch/", "\\torch\\")


def _short_native(name: str) -> str:
    """A C++ frame's function without its arguments or templates' noise (first 90 characters)."""
    return name.split("(", 1)[0][:90]


def _where(frames: Sequence[dict[str, Any]]) -> str:
    """The allocating call, as ``module-level frame > first torch frame`` (file:line name); where no
    Python frame allocated it (autograd's backward thread) and C++ frames were recorded (``stacks="all"``),
    the autograd node and the ATen function that did."""
    if not frames:
        return "(no Python frame)"
    py = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    if not py:
        names = [str(f.get("name", "")) for f in frames]
        node = next((n for n in names if "Backward" in n), None)
        op = next((n for n in names if "at::native::" in n), None)
        parts = [_short_native(n) for n in (node, op) if n]
        return ("(C++) " + " > ".join(parts)) if parts else "(no Python frame)"
    torch_frame = next((f for f in py if any(p in str(f.get("filename", "")) for p in _TORCH_PATHS)), None)
    user_frame = next((f for f in py if not any(p in str(f.get("filename", "")) for p in _TORCH_PATHS)), None)
    parts = [f"{str(f.get('filename', '?')).rsplit('/', 1)[-1]}:{f.get('line', '?')} {f.get('name', '?')}"
             for f in (user_frame, torch_frame) if f is not None]
    return " > ".join(parts)


def live_at_peak(snapshot: dict[str, Any], baseline_bytes: int, device: int = 0) -> dict[str, Any]:
    """Replay ``snapshot``'s allocation trace (``torch.cuda.memory._snapshot()``) on top of
    ``baseline_bytes`` (what was allocated when recording began) and return the peak in bytes,
    the trace index where it happens, and the blocks alive there grouped by where they were
    allocated (``groups``: bytes and count, largest first).  A free counts when requested, as
    ``torch.cuda.max_memory_allocated`` counts it."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        raise ValueError(f"the snapshot has no trace for device {device} (has {len(traces)}): record the history "
                         "with torch.cuda.memory._record_memory_history before the step")
    live: dict[int, tuple[int, str]] = {}
    allocated = peak = int(baseline_bytes)
    peak_at, peak_live = -1, {}
    for i, event in enumerate(traces[device]):
        action, addr, size = event.get("action"), int(event.get("addr", 0)), int(event.get("size", 0))
        if action == "alloc":
            live[addr] = (size, _where(event.get("frames") or []))
            allocated += size
            if allocated > peak:
                peak, peak_at, peak_live = allocated, i, dict(live)
        elif action == "free_requested" and addr in live:
            allocated -= live.pop(addr)[0]
    groups: dict[str, list[int]] = {}
    for size, where in peak_live.values():
        groups.setdefault(where, []).append(size)
    return {"peak_bytes": peak, "baseline_bytes": int(baseline_bytes), "peak_event": peak_at,
            "groups": [{"where": w, "bytes": sum(sizes), "blocks": len(sizes), "largest": sorted(sizes)[::-1][:8]}
                       for w, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1]))]}


def peak_breakdown(set_key: str, mode: str = "inference", precision: str = "fp32", device: Any = "cuda",
                   seed: int = 0, stacks: str = "python") -> dict[str, Any]:
    """One network step's peak on the GPU at hand, broken down (:func:`live_at_peak`), beside
    ``torch.cuda.max_memory_allocated`` over the same call (``measured_peak_bytes``).  ``stacks="all"``
    records C++ frames too, which name what backward allocated (slower to record)."""
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
    import torch

    from gpurec.collect.plan import parse_set_key
    from gpurec.collect.runner import NetworkUnit

    if not torch.cuda.is_available():
        from gpurec.device.errors import NVMLUnavailable

        raise NVMLUnavailable("peak-breakdown needs a CUDA GPU: run it on a GPU machine")
    s = parse_set_key(set_key)
    gc.collect()
    before = int(torch.cuda.memory_allocated())
    unit = NetworkUnit(s.arch, s.input_shape, mode, device, seed=seed, precision=precision)
    grad = torch.inference_mode() if mode == "inference" else torch.enable_grad()
    with unit.scope(), grad:
        unit.step()  # first call: library workspaces, cuDNN plans
        torch.cuda.synchronize()
        baseline = int(torch.cuda.memory_allocated())
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(stacks=stacks, max_entries=1_000_000)
        try:
            unit.step()
            torch.cuda.synchronize()
            snapshot = torch.cuda.memory._snapshot()
        finally:
            with contextlib.suppress(Exception):
                torch.cuda.memory._record_memory_history(enabled=None)
        measured = int(torch.cuda.max_memory_allocated())
    index = torch.device(device).index or 0
    out = live_at_peak(snapshot, baseline, index)
    out.update({"set_key": s.key, "mode": mode, "precision": precision, "measured_peak_bytes": measured,
                "allocated_before_bytes": before, "gpu": torch.cuda.get_device_name(index),
                "torch": torch.__version__, "stacks": stacks})
    return out
