"""Multi-level utilization metrics (Table 4.1 of the method) per iteration, layer type and kernel.

Definitions (cycles summed over kernels; SMSP = SM sub-partition, TC = tensor core):

=========================  ===============================================
total time                  duration of the traced iteration
GPU kernel time             aggregate duration of the GPU events
GPU utilization             GPU kernel time / total time
throughput                  batch size / total time
SMSP active utilization     SMSP active cycles / SMSP elapsed cycles
SMSP issue-slot util.       SMSP issue cycles / SMSP elapsed cycles
TC active utilization       TC active cycles / SMSP elapsed cycles
TC issue-slot utilization   TC instructions issued / SMSP elapsed cycles
=========================  ===============================================

Counters exist only while kernels run, so these ratios are "within kernel time". The
``*_of_iteration`` variants multiply them by the fraction of the iteration during which
kernels run, which makes the chain GPU >= SMSP active >= SMSP issue (and SMSP active >=
TC active >= TC issue) comparable on one axis, as in the method's figures. The two bounds
named in the method's text (TC active / active cycles, here at SM level, and TC
instructions / issued instructions) are reported too.

The tensor-pipe active cycles ncu exposes under the ``sm__`` prefix
(``sm__pipe_tensor_op_*_cycles_active``) are summed over the SM's four sub-partitions: on a
real H200 report (ncu 2025.3, tests/fixtures/profile/real) they reach 1.5x
``sm__cycles_elapsed`` for TF32 convolutions, and they equal the ``smsp__`` HMMA counter.  So,
as Table 4.1 defines it, TC active utilization divides them by SMSP elapsed cycles, and the
bound of the method's text divides them by SMSP active cycles (``tc_active_over_smsp_active``;
``tc_active_over_sm_active`` is kept as an alias of it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from gpurec.dataset.store import json_safe
from gpurec.profile.matching import MatchResult, _dims_key, normalize_kernel_name
from gpurec.profile.ncu_parse import TC_ACTIVE_METRICS, TC_INST_METRICS
from gpurec.profile.trace import TraceData, timeline_metrics

COUNTER_COLUMNS = [
    "smsp_cycles_elapsed", "smsp_cycles_active", "smsp_issue_cycles",
    "sm_cycles_elapsed", "sm_cycles_active", "tc_active_cycles", "tc_issue",
]
UTIL_COLUMNS = ["smsp_active_util", "smsp_issue_util", "tc_active_util", "tc_issue_util"]


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name in df.columns:
        return pd.to_numeric(df[name], errors="coerce").astype(float)
    return pd.Series(np.nan, index=df.index, dtype=float)


def _sum_cols(df: pd.DataFrame, names: tuple[str, ...]) -> pd.Series:
    present = [n for n in names if n in df.columns]
    if not present:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return df[present].apply(pd.to_numeric, errors="coerce").sum(axis=1, min_count=1).astype(float)


def _div(a: float, b: float) -> float:
    return float(a) / float(b) if b and math.isfinite(b) and b > 0 and math.isfinite(a) else float("nan")


def ncu_counters(ncu: pd.DataFrame) -> pd.DataFrame:
    """Raw ncu metric columns -> named counters and per-kernel utilizations."""
    out = pd.DataFrame(index=ncu.index)
    out["ncu_id"] = ncu["ncu_id"] if "ncu_id" in ncu.columns else range(len(ncu))
    out["ncu_name"] = ncu["name"] if "name" in ncu.columns else ""
    out["ncu_time_ns"] = _col(ncu, "gpu__time_duration.sum")
    out["smsp_cycles_elapsed"] = _col(ncu, "smsp__cycles_elapsed.sum")
    out["smsp_cycles_elapsed_avg"] = _col(ncu, "smsp__cycles_elapsed.avg")
    out["smsp_cycles_active"] = _col(ncu, "smsp__cycles_active.sum")
    out["smsp_issue_cycles"] = _col(ncu, "smsp__inst_issued.sum")
    sm_el = _col(ncu, "sm__cycles_elapsed.sum")
    out["sm_cycles_elapsed"] = sm_el.fillna(out["smsp_cycles_elapsed"] / 4.0)
    out["sm_cycles_active"] = _col(ncu, "sm__cycles_active.sum")
    out["tc_active_cycles"] = _sum_cols(ncu, TC_ACTIVE_METRICS)
    out["tc_issue"] = _sum_cols(ncu, TC_INST_METRICS)
    out = add_utils(out)
    out["sm_clock_mhz"] = out["smsp_cycles_elapsed_avg"] / out["ncu_time_ns"] * 1e3
    return out


def add_utils(df: pd.DataFrame) -> pd.DataFrame:
    """Per-row utilizations from the counter columns (NaN where a counter is missing)."""
    el = df["smsp_cycles_elapsed"].where(df["smsp_cycles_elapsed"] > 0)
    df["smsp_active_util"] = df["smsp_cycles_active"] / el
    df["smsp_issue_util"] = df["smsp_issue_cycles"] / el
    df["tc_active_util"] = df["tc_active_cycles"] / el
    df["tc_issue_util"] = df["tc_issue"] / el
    return df


def counter_totals(df: pd.DataFrame) -> dict[str, float]:
    """Summed counters and their ratio-of-sums utilizations over the rows of ``df``."""
    tot = {c: float(pd.to_numeric(df[c], errors="coerce").sum(min_count=1)) if c in df.columns
           else float("nan") for c in COUNTER_COLUMNS}
    tot["smsp_active_util"] = _div(tot["smsp_cycles_active"], tot["smsp_cycles_elapsed"])
    tot["smsp_issue_util"] = _div(tot["smsp_issue_cycles"], tot["smsp_cycles_elapsed"])
    tot["tc_active_util"] = _div(tot["tc_active_cycles"], tot["smsp_cycles_elapsed"])
    tot["tc_issue_util"] = _div(tot["tc_issue"], tot["smsp_cycles_elapsed"])
    # The two bounds of the method's text (4.3.2).
    tot["tc_active_over_smsp_active"] = _div(tot["tc_active_cycles"], tot["smsp_cycles_active"])
    tot["tc_active_over_sm_active"] = tot["tc_active_over_smsp_active"]  # old name
    tot["tc_issue_over_smsp_issue"] = _div(tot["tc_issue"], tot["smsp_issue_cycles"])
    return tot


def _launch_key(name: object, grid: object, block: object) -> tuple[object, ...]:
    """(normalised kernel name, grid, block): what ncu's per-launch-config filter keys on."""
    return normalize_kernel_name(str(name or "")), _dims_key(grid), _dims_key(block)


def _short_key(name: object, grid: object, block: object) -> tuple[object, ...]:
    """Like _launch_key with the namespace dropped from the name."""
    full, g, b = _launch_key(name, grid, block)
    return str(full).rsplit("::", 1)[-1], g, b


CYCLE_COLUMNS = [*COUNTER_COLUMNS, "smsp_cycles_elapsed_avg"]


def merge_kernels(trace: TraceData, ncu: pd.DataFrame | None, match: MatchResult | None,
                  impute: bool = False) -> pd.DataFrame:
    """One row per kernel: trace kernels (with counters when matched) then ncu-only kernels.

    With ``impute`` (ncu sampled one launch per configuration), a trace kernel left without
    counters takes them from the profiled launch of the same kernel, grid and block: its
    utilizations are copied and its cycle counts scaled by its own duration over the donor's.
    Such rows have ``source == "imputed"``; donors are not listed again as ncu-only kernels.
    """
    k = trace.kernels.copy()
    k["source"] = "trace"
    k["time_ms"] = k["dur_us"] / 1e3
    k["match_score"] = np.nan
    if ncu is None or match is None:
        for c in ["ncu_id", "ncu_name", "ncu_time_ns", "smsp_cycles_elapsed_avg", "sm_clock_mhz",
                  *COUNTER_COLUMNS, *UTIL_COLUMNS]:
            k[c] = np.nan
        return k
    ncu = ncu.reset_index(drop=True)
    counters = ncu_counters(ncu)
    k = k.reset_index(drop=True)
    cols = list(counters.columns)
    for c in cols:
        k[c] = np.nan if c != "ncu_name" else None
    for ti, nj, score in match.pairs:
        for c in cols:
            k.at[ti, c] = counters.at[nj, c]
        k.at[ti, "match_score"] = score
        k.at[ti, "source"] = "both"
    donors_used: set[int] = set()
    if impute:
        # Donors keyed by the trace's own names (the tools spell namespaces and template
        # arguments differently): the matched first launch of each configuration, then, for
        # configurations whose first launch went unmatched, the ncu row by its short name.
        donors: dict[tuple[object, ...], int] = {}
        for ti, nj, _ in match.pairs:
            donors.setdefault(_launch_key(k.at[ti, "name"], k.at[ti, "grid"], k.at[ti, "block"]), nj)
        by_short: dict[tuple[object, ...], int] = {}
        for j in range(len(ncu)):
            by_short.setdefault(_short_key(ncu.at[j, "name"], ncu.at[j, "grid"], ncu.at[j, "block"]), j)
        for ti in k.index[k["source"] == "trace"]:
            j = donors.get(_launch_key(k.at[ti, "name"], k.at[ti, "grid"], k.at[ti, "block"]))
            if j is None:
                j = by_short.get(_short_key(k.at[ti, "name"], k.at[ti, "grid"], k.at[ti, "block"]))
            donor_ns = counters.at[j, "ncu_time_ns"] if j is not None else float("nan")
            if j is None or not (donor_ns > 0):
                continue
            scale = float(k.at[ti, "dur_us"]) * 1e3 / float(donor_ns)
            for c in cols:
                value = counters.at[j, c]
                k.at[ti, c] = value * scale if c in CYCLE_COLUMNS or c == "ncu_time_ns" else value
            k.at[ti, "source"] = "imputed"
            donors_used.add(j)
    extra = counters.loc[[j for j in match.unmatched_ncu if j not in donors_used]].copy()
    if not extra.empty:
        extra["source"] = "ncu"
        extra["name"] = extra["ncu_name"]
        extra["time_ms"] = extra["ncu_time_ns"] / 1e6
        extra["layer"] = "(unmatched ncu kernel)"
        extra["layer_type"] = "(unmatched)"
        extra["op"] = ""
        extra["phase"] = "unknown"
        extra["trace_idx"] = -1
        k = pd.concat([k, extra], ignore_index=True, sort=False)
    return k


def iteration_metrics(
    trace: TraceData,
    kernels: pd.DataFrame,
    ncu: pd.DataFrame | None,
    batch_size: int,
    untraced_iteration_ms: float | None = None,
    bubble_min_us: float = 2.0,
) -> dict[str, float]:
    """High-level (trace) and low-level (ncu, all kernels of the report) iteration metrics."""
    m: dict[str, float] = dict(timeline_metrics(trace, bubble_min_us))
    total_ms = m["total_time_ms"]
    m["gpu_utilization"] = _div(m["gpu_busy_time_ms"], total_ms)
    m["gpu_kernel_utilization"] = _div(m["gpu_kernel_busy_time_ms"], total_ms)
    m["throughput_samples_per_s"] = _div(batch_size, total_ms / 1e3)
    m["n_kernels_trace"] = float(len(trace.kernels))
    if untraced_iteration_ms:
        m["untraced_iteration_ms"] = float(untraced_iteration_ms)
        m["untraced_throughput_samples_per_s"] = _div(batch_size, untraced_iteration_ms / 1e3)
    if ncu is not None and len(ncu):
        counters = ncu_counters(ncu)
        # Totals over the kernel table: every ncu kernel once (matched or not) when all were
        # profiled, plus the imputed trace kernels when ncu sampled one launch per configuration.
        has_counters = kernels["smsp_cycles_elapsed"].notna() if "smsp_cycles_elapsed" in kernels else None
        tot = counter_totals(kernels[has_counters] if has_counters is not None and has_counters.any()
                             else counters)
        m.update(tot)
        m["n_kernels_ncu"] = float(len(counters))
        m["ncu_kernel_time_ms"] = float(counters["ncu_time_ns"].sum()) / 1e6
        m["sm_clock_mhz_weighted"] = _div(
            float(counters["smsp_cycles_elapsed_avg"].sum()), float(counters["ncu_time_ns"].sum()) / 1e3)
        frac = m["gpu_kernel_utilization"]
        for u in UTIL_COLUMNS:
            m[f"{u}_of_iteration"] = m[u] * frac if m[u] == m[u] else float("nan")
        with_counters = kernels[kernels["source"] == "both"]
        trace_time = float(kernels.loc[kernels["source"] != "ncu", "time_ms"].sum())
        m["matched_time_share"] = _div(float(with_counters["time_ms"].sum()), trace_time)
        m["imputed_time_share"] = _div(float(kernels.loc[kernels["source"] == "imputed", "time_ms"].sum()),
                                       trace_time)
    return m


def group_metrics(kernels: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per-group (layer_type, phase, layer...) time share and ratio-of-sums utilizations.

    Time comes from the trace (ncu-only kernels use ncu time); counters only from kernels
    that have them, and ``counter_time_share`` says how much of the group's time that is.
    """
    rows = []
    total = float(kernels["time_ms"].sum()) or float("nan")
    for key, g in kernels.groupby(by, dropna=False, sort=False):
        with_c = g[g["smsp_cycles_elapsed"].notna()] if "smsp_cycles_elapsed" in g else g.iloc[0:0]
        tot = counter_totals(with_c) if len(with_c) else {u: float("nan") for u in UTIL_COLUMNS}
        time_ms = float(g["time_ms"].sum())
        rows.append({
            by: key,
            "n_kernels": int(len(g)),
            "time_ms": time_ms,
            "time_share": time_ms / total,
            "counter_time_share": _div(float(with_c["time_ms"].sum()), time_ms) if len(with_c) else 0.0,
            **{u: tot[u] for u in UTIL_COLUMNS},
        })
    out = pd.DataFrame.from_records(rows)
    if out.empty:
        return pd.DataFrame(columns=[by, "n_kernels", "time_ms", "time_share", "counter_time_share",
                                     *UTIL_COLUMNS])
    return out.sort_values("time_ms", ascending=False).reset_index(drop=True)


def tc_issue_cdf(kernels: pd.DataFrame) -> pd.DataFrame:
    """Kernels sorted by TC issue-slot utilization with the cumulative share of GPU time."""
    k = kernels[kernels["tc_issue_util"].notna() & (kernels["time_ms"] > 0)]
    k = k.sort_values("tc_issue_util", kind="stable")
    total = float(k["time_ms"].sum())
    return pd.DataFrame({
        "tc_issue_util": k["tc_issue_util"].to_numpy(float),
        "cum_time_share": (k["time_ms"].cumsum() / total).to_numpy(float) if total > 0 else np.array([]),
    })


def frame_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame -> JSON-safe list of row dicts."""
    return [json_safe(r) for r in df.to_dict(orient="records")]
