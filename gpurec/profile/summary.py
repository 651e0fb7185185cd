"""One line per profiled run (``gpurec profile-summary RESULT.json...``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _pct(v: Any) -> str:
    return f"{100 * v:5.1f}" if isinstance(v, (int, float)) and math.isfinite(v) else "  n/a"


def summarize(paths: list[str | Path]) -> str:
    """Multi-level utilization of several runs side by side (from their result.json)."""
    head = (f"{'run':34} {'iter ms':>8} {'samp/s':>9} {'GPU%':>5} {'SMact':>5} {'SMiss':>5} {'TCact':>5} "
            f"{'TCiss':>5} {'ovh ms':>7} {'bubbles':>7} {'match':>11}  (SM/TC % of iteration)")
    lines = [head]
    for p in paths:
        try:
            d = json.loads(Path(p).read_text())
        except (OSError, ValueError) as exc:
            lines.append(f"{str(p)[:34]:34} unreadable: {exc}")
            continue
        m, it, mt = d.get("meta", {}), d.get("iteration", {}), d.get("matching") or {}
        name = f"{m.get('model')} bs{m.get('batch_size')} {m.get('mode')}"
        match = f"{mt.get('n_matched')}/{mt.get('n_trace')}/{mt.get('n_ncu')}" if mt else "no ncu"
        lines.append(
            f"{name[:34]:34} {it.get('total_time_ms') or float('nan'):8.2f} "
            f"{it.get('throughput_samples_per_s') or float('nan'):9.1f} {_pct(it.get('gpu_utilization'))} "
            f"{_pct(it.get('smsp_active_util_of_iteration'))} {_pct(it.get('smsp_issue_util_of_iteration'))} "
            f"{_pct(it.get('tc_active_util_of_iteration'))} {_pct(it.get('tc_issue_util_of_iteration'))} "
            f"{it.get('framework_overhead_ms') or float('nan'):7.2f} {int(it.get('bubble_count') or 0):7d} "
            f"{match:>11}" + (f"  ncu: {d['ncu_error'][:60]}" if d.get("ncu_error") else ""))
    return "\n".join(lines)
