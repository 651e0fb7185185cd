"""The offline half of a profile (CPU core): a worker trace and an ncu raw CSV combined into a
``ProfileResult``, from paths, so recorded runs (and test fixtures) are re-analysed on any
machine.  Running the network is ``gpurec.profile.api`` (GPU layer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gpurec.dataset.store import json_safe
from gpurec.profile import ncu_parse
from gpurec.profile.matching import MatchResult, match_kernels, normalize_kernel_name
from gpurec.profile.metrics import frame_records, group_metrics, iteration_metrics, merge_kernels
from gpurec.profile.trace import load_trace

TRACE_FILE = "trace.json.gz"
META_FILE = "worker_trace.json"
NCU_CSV = "ncu.csv"


class ProfileError(RuntimeError):
    """The network could not be run or traced (the worker log is named in the message)."""


@dataclass
class ProfileResult:
    """Everything one profile produced: run facts, Table 4.1 metrics, groups and kernels."""

    meta: dict[str, Any]
    iteration: dict[str, float]
    layer_types: pd.DataFrame
    phases: pd.DataFrame
    kernels: pd.DataFrame
    matching: dict[str, Any] = field(default_factory=dict)
    ncu_metrics: list[str] = field(default_factory=list)
    ncu_error: str | None = None
    files: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Strict-JSON dict (NaN -> null) of the whole result."""
        kernels = self.kernels.drop(columns=[c for c in ("cat",) if c in self.kernels.columns])
        return json_safe({
            "meta": self.meta,
            "iteration": self.iteration,
            "layer_types": frame_records(self.layer_types),
            "phases": frame_records(self.phases),
            "kernels": frame_records(kernels),
            "matching": self.matching,
            "ncu_metrics": self.ncu_metrics,
            "ncu_error": self.ncu_error,
            "files": self.files,
        })


def _kernel_brief(df: pd.DataFrame, idx: int, extra: dict[str, Any]) -> dict[str, Any]:
    r = df.iloc[idx]
    return json_safe({"index": int(idx), "name": str(r.get("name", "")),
                      "short_name": normalize_kernel_name(str(r.get("name", ""))),
                      "grid": r.get("grid"), "block": r.get("block"), **extra})


def _matching_summary(trace_k: pd.DataFrame, ncu_k: pd.DataFrame, match: MatchResult) -> dict[str, Any]:
    scores = [s for _, _, s in match.pairs]
    return {
        "n_trace": len(trace_k),
        "n_ncu": len(ncu_k),
        "n_matched": match.n_matched,
        "mean_score": sum(scores) / len(scores) if scores else None,
        "n_exact_name": int(sum(
            normalize_kernel_name(str(trace_k.iloc[i]["name"])) == normalize_kernel_name(str(ncu_k.iloc[j]["name"]))
            for i, j, _ in match.pairs)),
        "unmatched_trace": [
            _kernel_brief(trace_k, i, {"layer": str(trace_k.iloc[i].get("layer", "")),
                                       "time_ms": float(trace_k.iloc[i]["dur_us"]) / 1e3})
            for i in match.unmatched_trace],
        "unmatched_ncu": [_kernel_brief(ncu_k, j, {"ncu_id": int(ncu_k.iloc[j]["ncu_id"])})
                          for j in match.unmatched_ncu],
    }


def analyze(
    trace_path: str | Path,
    ncu_csv: str | Path | None = None,
    meta: dict[str, Any] | str | Path | None = None,
    batch_size: int | None = None,
    bubble_min_us: float = 2.0,
) -> ProfileResult:
    """Combine a worker trace (and optionally an ncu raw CSV) into a ProfileResult.

    ``meta`` is the worker's ``worker_trace.json`` (dict or path); ``batch_size`` overrides it.
    ``meta["ncu_sampling"] == "per-config"`` marks a report of one launch per configuration,
    whose counters are then imputed to the repeated launches.
    """
    if isinstance(meta, (str, Path)):
        meta = json.loads(Path(meta).read_text())
    meta = dict(meta or {})
    if batch_size is not None:
        meta["batch_size"] = batch_size
    bs = int(meta.get("batch_size") or 0)
    trace = load_trace(trace_path)
    ncu_df = ncu_parse.parse_ncu_csv(Path(ncu_csv)) if ncu_csv is not None else None
    ncu_error = None
    if ncu_df is not None and ncu_df.empty:
        ncu_error, ncu_df = "ncu report holds no kernels", None
    match = match_kernels(trace.kernels, ncu_df) if ncu_df is not None else None
    kernels = merge_kernels(trace, ncu_df, match, impute=meta.get("ncu_sampling") == "per-config")
    it = iteration_metrics(trace, kernels, ncu_df, bs, meta.get("untraced_iteration_ms"), bubble_min_us)
    return ProfileResult(
        meta=meta,
        iteration=it,
        layer_types=group_metrics(kernels, "layer_type"),
        phases=group_metrics(kernels, "phase"),
        kernels=kernels,
        matching=_matching_summary(trace.kernels, ncu_df, match) if match is not None and ncu_df is not None else {},
        ncu_metrics=[c for c in (ncu_df.columns if ncu_df is not None else []) if "__" in c],
        ncu_error=ncu_error,
    )


def write_outputs(result: ProfileResult, out_dir: Path | str, plots: bool = True) -> None:
    """result.json, table.txt and (optionally) the PNG plots into out_dir."""
    from gpurec.profile.report import render_table, save_plots

    out = Path(out_dir)
    if plots:
        try:
            result.files.update(save_plots(result, out))
        except Exception as exc:  # noqa: BLE001 - plots must never lose the numbers
            result.meta["plot_error"] = repr(exc)
    result.files["result"] = str(out / "result.json")
    result.files["table"] = str(out / "table.txt")
    (out / "table.txt").write_text(render_table(result))
    (out / "result.json").write_text(json.dumps(result.to_json(), indent=1))
