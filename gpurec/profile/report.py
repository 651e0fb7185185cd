"""Text table and plots for a ProfileResult (matplotlib through the Agg canvas only, so
the caller's global backend is never changed)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from gpurec.profile.metrics import tc_issue_cdf

if TYPE_CHECKING:
    from gpurec.profile.analysis import ProfileResult

LEVELS = [
    ("GPU", "gpu_kernel_utilization", None),
    ("SMSP active", "smsp_active_util_of_iteration", "smsp_active_util"),
    ("SMSP issue slot", "smsp_issue_util_of_iteration", "smsp_issue_util"),
    ("TC active", "tc_active_util_of_iteration", "tc_active_util"),
    ("TC issue slot", "tc_issue_util_of_iteration", "tc_issue_util"),
]


def _ok(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(float(v))


def _pct(v: Any) -> str:
    return f"{100.0 * float(v):6.1f} %" if _ok(v) else "     n/a"


def _num(v: Any, fmt: str = "{:,.0f}") -> str:
    return fmt.format(float(v)) if _ok(v) else "n/a"


def _short(name: str, width: int = 60) -> str:
    from gpurec.profile.matching import normalize_kernel_name

    s = normalize_kernel_name(name) or name
    return s if len(s) <= width else s[: width - 3] + "..."


def _frame_table(df: pd.DataFrame, columns: list[tuple[str, str, str]], max_rows: int) -> str:
    """columns: (column, header, kind) with kind in {"s", "int", "ms", "pct", "f"}."""
    if df is None or df.empty:
        return "  (none)\n"
    rows = []
    for _, r in df.head(max_rows).iterrows():
        cells = []
        for col, _, kind in columns:
            v = r.get(col)
            if kind == "s":
                cells.append(str(v))
            elif kind == "int":
                cells.append(_num(v, "{:,.0f}"))
            elif kind == "ms":
                cells.append(_num(v, "{:.3f}"))
            elif kind == "pct":
                cells.append(_pct(v).strip())
            else:
                cells.append(_num(v, "{:.3g}"))
        rows.append(cells)
    headers = [h for _, h, _ in columns]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    lines = ["  " + "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True)))]
    for row in rows:
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    if len(df) > max_rows:
        lines.append(f"  ... {len(df) - max_rows} more")
    return "\n".join(lines) + "\n"


def render_table(result: ProfileResult, max_rows: int = 15) -> str:
    """Human-readable report: Table 4.1 for the iteration, then per layer type, phase, kernel."""
    m, it = result.meta, result.iteration
    has_ncu = _ok(it.get("smsp_cycles_elapsed"))
    out = []
    out.append(
        f"gpurec profile: {m.get('model')}  batch {m.get('batch_size')}  {m.get('resolution')}px  "
        f"{m.get('mode')}  {m.get('precision', 'fp32')}  on {m.get('device_name', '?')}\n"
        f"profiled iteration #{m.get('profiled_iteration')} (first stable: "
        f"{'yes' if m.get('stable_found') else 'no, limit reached'}; warm-up "
        f"{len(m.get('warmup_times_ms') or [])} iterations)\n"
    )
    out.append("Iteration (Table 4.1)\n")
    rows: list[tuple[str, str]] = [
        ("Total execution time", f"{_num(it.get('total_time_ms'), '{:.3f}')} ms"),
        ("GPU kernel exec. time", f"{_num(it.get('gpu_kernel_time_ms'), '{:.3f}')} ms "
                                  f"(GPU busy incl. copies {_num(it.get('gpu_busy_time_ms'), '{:.3f}')} ms)"),
        ("GPU utilization", _pct(it.get("gpu_utilization")).strip()),
        ("Achieved throughput", f"{_num(it.get('throughput_samples_per_s'), '{:,.1f}')} samples/s "
                                f"(untraced: {_num(it.get('untraced_throughput_samples_per_s'), '{:,.1f}')})"),
        ("Framework overhead", f"{_num(it.get('framework_overhead_ms'), '{:.3f}')} ms GPU idle = leading "
                               f"{_num(it.get('leading_idle_ms'), '{:.3f}')} + bubbles "
                               f"{_num(it.get('bubble_time_ms'), '{:.3f}')} (n={_num(it.get('bubble_count'))}) "
                               f"+ short gaps {_num(it.get('small_gap_time_ms'), '{:.3f}')} + trailing "
                               f"{_num(it.get('trailing_idle_ms'), '{:.3f}')}"),
    ]
    if has_ncu:
        def both(u: str) -> str:
            return f"{_pct(it.get(u)).strip()} of kernel time, {_pct(it.get(u + '_of_iteration')).strip()} of iteration"

        rows += [
            ("SMSP elapsed cycles", _num(it.get("smsp_cycles_elapsed"))),
            ("SMSP active cycles", _num(it.get("smsp_cycles_active"))),
            ("SMSP active utilization", both("smsp_active_util")),
            ("SMSP issue cycles", _num(it.get("smsp_issue_cycles"))),
            ("SMSP issue slot utilization", both("smsp_issue_util")),
            ("TC active cycles (SMSP sum)", _num(it.get("tc_active_cycles"))),
            ("TC active utilization", both("tc_active_util")),
            ("TC issue cycles (instr.)", _num(it.get("tc_issue"))),
            ("TC issue slot utilization", both("tc_issue_util")),
            ("TC active / SMSP active", _pct(it.get("tc_active_over_smsp_active",
                                                      it.get("tc_active_over_sm_active"))).strip()),
            ("TC instr. / issued instr.", _pct(it.get("tc_issue_over_smsp_issue")).strip()),
            ("SM clock (from counters)", f"{_num(it.get('sm_clock_mhz_weighted'))} MHz"),
        ]
        if result.meta.get("ncu_sampling") == "per-config":
            rows.append(("Counter sampling", "one launch per (kernel, grid, block); repeats imputed: "
                                             f"{_pct(it.get('imputed_time_share')).strip()} of kernel time"))
    else:
        rows.append(("Hardware counters", "not collected" + (f": {result.ncu_error}" if result.ncu_error else "")))
    width = max(len(k) for k, _ in rows)
    out.extend(f"  {k.ljust(width)}  {v}\n" for k, v in rows)

    mt = result.matching
    if mt:
        out.append(
            f"\nKernel matching: {mt.get('n_trace')} in trace, {mt.get('n_ncu')} in ncu, "
            f"{mt.get('n_matched')} matched; unmatched trace {len(mt.get('unmatched_trace', []))}, "
            f"unmatched ncu {len(mt.get('unmatched_ncu', []))}\n"
        )
        for side in ("unmatched_trace", "unmatched_ncu"):
            for k in mt.get(side, [])[:5]:
                out.append(f"  {side}: #{k.get('index')} {_short(str(k.get('name', '')))} "
                           f"grid={k.get('grid')} block={k.get('block')}\n")

    util_cols = [("smsp_active_util", "SMSP act", "pct"), ("smsp_issue_util", "SMSP iss", "pct"),
                 ("tc_active_util", "TC act", "pct"), ("tc_issue_util", "TC iss", "pct")]
    group_cols = [("n_kernels", "kernels", "int"), ("time_ms", "time ms", "ms"), ("time_share", "share", "pct"),
                  ("counter_time_share", "counted", "pct")] + (util_cols if has_ncu else [])
    out.append("\nPer layer type (utilizations within kernel time)\n")
    out.append(_frame_table(result.layer_types, [("layer_type", "layer type", "s"), *group_cols], max_rows))
    out.append("\nPer phase\n")
    out.append(_frame_table(result.phases, [("phase", "phase", "s"), *group_cols], max_rows))
    k = result.kernels.sort_values("time_ms", ascending=False).copy() if not result.kernels.empty else result.kernels
    if not k.empty:
        k["short"] = [_short(str(n), 48) for n in k["name"]]
    out.append(f"\nTop {max_rows} kernels by time\n")
    out.append(_frame_table(k, [("short", "kernel", "s"), ("layer", "layer", "s"), ("phase", "phase", "s"),
                                ("time_ms", "time ms", "ms")] + (util_cols if has_ncu else []), max_rows))
    return "".join(out)


def save_plots(result: ProfileResult, out_dir: str | Path) -> dict[str, str]:
    """Utilization per level, cumulative GPU time vs TC issue-slot utilization, layer types."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    it = result.iteration
    title = f"{result.meta.get('model')} bs{result.meta.get('batch_size')} {result.meta.get('mode')}"

    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(111)
    labels = [name for name, _, _ in LEVELS]
    of_iter = [100 * float(it[k]) if _ok(it.get(k)) else 0.0 for _, k, _ in LEVELS]
    in_kern = [100.0 if k is None else (100 * float(it[k]) if _ok(it.get(k)) else 0.0) for _, _, k in LEVELS]
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], of_iter, width=0.4, label="% of iteration time")
    ax.bar([x + 0.2 for x in xs], in_kern, width=0.4, label="% of kernel time")
    for x, v in zip(xs, of_iter, strict=True):
        ax.text(x - 0.2, v + 1, f"{v:.1f}", ha="center", fontsize=8)
    ax.set_xticks(list(xs), labels)
    ax.set_ylim(0, 105)
    ax.set_ylabel("utilization (%)")
    ax.set_title(f"Multi-level utilization: {title}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "utilization_levels.png"
    fig.savefig(path, dpi=110)
    files["utilization_levels"] = str(path)

    cdf = tc_issue_cdf(result.kernels) if "tc_issue_util" in result.kernels else pd.DataFrame()
    if not cdf.empty:
        fig = Figure(figsize=(6, 4))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(111)
        ax.step(100 * cdf["tc_issue_util"], 100 * cdf["cum_time_share"], where="post")
        ax.set_xlabel("TC issue-slot utilization of kernel (%)")
        ax.set_ylabel("cumulative share of GPU kernel time (%)")
        ax.set_ylim(0, 101)
        ax.grid(alpha=0.3)
        ax.set_title(f"Kernels sorted by TC issue-slot utilization: {title}", fontsize=9)
        fig.tight_layout()
        path = out / "tc_issue_cdf.png"
        fig.savefig(path, dpi=110)
        files["tc_issue_cdf"] = str(path)

    lt = result.layer_types.head(10)
    if not lt.empty:
        fig = Figure(figsize=(8, 4.5))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(111)
        names = [str(n)[:24] for n in lt["layer_type"]]
        ys = range(len(names))
        ax.barh(list(ys), 100 * lt["time_share"], color="0.7", label="share of GPU time")
        for i, (col, lab) in enumerate([("smsp_issue_util", "SMSP issue slot"), ("tc_issue_util", "TC issue slot")]):
            if col in lt:
                vals = [100 * float(v) if _ok(v) else 0.0 for v in lt[col]]
                ax.barh([y + 0.25 * (i + 1) - 0.125 for y in ys], vals, height=0.22, label=lab)
        ax.set_yticks(list(ys), names)
        ax.invert_yaxis()
        ax.set_xlabel("%")
        ax.set_title(f"Per layer type: {title}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / "layer_types.png"
        fig.savefig(path, dpi=110)
        files["layer_types"] = str(path)
    return files
