"""datasets/README.md and its plots (datasets/img/*.png), from the measured data.

Every number in the README is computed here from ``datasets/<gpu>/`` (Parquet tables, raw
provenance, probe) and the plan; nothing is typed in by hand.  Missing tables or columns
shrink the affected section instead of failing.  The tables are read as they are; the README
warns when they hold fewer rows than the raw shards (``gpurec dataset build`` rebuilds them).

Each ``section_*`` function renders one section, so a section can be added without touching
the others; ``generate`` puts them in order.  Run through ``gpurec report dataset``.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpurec.dataset.store import atomic_write_text, raw_row_files, read_jsonl
from gpurec.reports.markdown import table

TINY_MS = 0.02  # ops faster than 20 us per call are launch-bound
HOST_MS = 0.3  # below this, training ops are mostly autograd/host time (see the repeatability section)
WITHIN = 0.03  # repeatability threshold (3%)
TABLES = ("operations", "networks", "repeats", "idle", "in_network")
PLOTS = ("coverage.png", "repeatability.png", "probe.png", "sum_vs_network.png", "power_clocks.png")

# (unit, meaning) of the main columns; only those present in the data are listed.
COLUMN_DOCS: dict[str, tuple[str, str]] = {
    "id": ("—", "row key: `op:<signature>:<mode>`, `network:<set>:<mode>`; repeats end in `:rep`"),
    "item": ("—", "`op`, `network` or `idle`"),
    "mode": ("—", "`inference` (forward under inference_mode) or `training` (forward + backward)"),
    "op_kind": ("—", "layer type (Conv2d, Linear, add, …) or `network`"),
    "op_signature": ("—", "16-hex hash of kind, settings, input shapes, dtype, requires-grad"),
    "set_key": ("—", "model-input set the row was extracted from, `arch:b<batch>:r<res>`"),
    "model_sets": ("JSON list", "every planned model-input set that contains the operation"),
    "instances": ("count", "independently initialised copies cycled through (weights not all in L2)"),
    "backward": ("bool", "a backward pass was timed too (training rows with a differentiable output)"),
    "setup_ms": ("ms", "building the unit on the GPU (not part of the measurement)"),
    "first_call_ms": ("ms", "first call (cuDNN/cuBLAS heuristics, allocation)"),
    "time_ms": ("ms / call", "median per call (torch.utils.benchmark blocked_autorange)"),
    "time_iqr_ms": ("ms", "inter-quartile range of the Timer blocks"),
    "time_mean_ms": ("ms / call", "mean per call"),
    "power_w": ("W", "average board power over the energy-counter window"),
    "energy_mj": ("mJ / call", "power_w × time_ms"),
    "idle_power_w": ("W", "idle board power of the run (CUDA context alive)"),
    "dynamic_power_w": ("W", "power_w − idle_power_w"),
    "dynamic_energy_mj": ("mJ / call", "dynamic_power_w × time_ms"),
    "window_s": ("s", "length of the energy window (between two counter updates)"),
    "window_energy_mj": ("mJ", "counter difference over the whole window"),
    "window_ticks": ("count", "counter updates inside the window"),
    "tick_power_cv": ("—", "coefficient of variation of the per-update power inside the window"),
    "sampled_power_w": ("W", "mean of the instantaneous NVML power readings (cross-check)"),
    "sm_clock_mhz": ("MHz", "mean SM clock sampled during the window"),
    "sm_clock_min_mhz": ("MHz", "lowest SM clock sampled during the window"),
    "mem_clock_mhz": ("MHz", "mean memory clock during the window"),
    "temperature_c": ("°C", "highest GPU temperature during the window"),
    "throttle_reasons": ("—", "clock-event reasons seen during the window (comma list; empty = none)"),
    "row_wall_ms": ("ms", "GPU-machine wall time spent on the row, setup included"),
    "status": ("—", "`ok` or `failed`"),
    "error": ("—", "failure reason (failed rows only)"),
    "repeat": ("bool", "re-measurement of an earlier row (repeats table)"),
    "gpu": ("—", "NVML device name"),
    "gpu_uuid": ("—", "NVML UUID of the board"),
    "run_id": ("—", "collection run (matches raw/provenance-<run_id>.json)"),
    "driver": ("—", "NVIDIA driver version (from provenance)"),
    "torch": ("—", "torch version on the GPU machine"),
    "cuda_runtime": ("—", "CUDA runtime torch was built with"),
    "host_cpu": ("—", "host CPU model"),
    "date": ("ISO 8601", "start of the run"),
    "t_unix": ("s", "UNIX time the row started"),
}

EXTRA_DIRS = {
    "probe": "window-length and instance-count sweep that justifies the collection defaults",
    "calibration": "hardware calibration (micro-benchmarks) of this GPU",
    "counters": "Nsight Compute counters of sampled operations",
    "counters_bf16_mixed": "Nsight Compute counters of the bf16-mixed twins of profiled fp32 operations",
    "counters_seq": "Nsight Compute counters of sequence-model operations (recurrent layers, matrix products)",
    "profile": "profiling runs (kernel traces)",
}


# ----------------------------------------------------------------------------- helpers
def _nan(x: Any) -> bool:
    try:
        return x is None or (isinstance(x, float) and math.isnan(x)) or bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def fnum(x: Any, digits: int = 2) -> str:
    return "—" if _nan(x) else f"{float(x):.{digits}f}"


def fsig(x: Any, sig: int = 3) -> str:
    if _nan(x):
        return "—"
    x = float(x)
    if x != 0 and (abs(x) >= 10 ** sig or abs(x) < 1e-3):
        return f"{x:.{sig - 1}e}"
    return f"{x:.{sig}g}"


def fpct(x: Any, digits: int = 1) -> str:
    return "—" if _nan(x) else f"{100 * float(x):.{digits}f}%"


def col(df: pd.DataFrame, name: str, default: Any = np.nan) -> pd.Series:
    """A column, or a constant Series when the table lacks it."""
    if df is not None and name in df.columns:
        return df[name]
    return pd.Series(default, index=df.index if df is not None else None, dtype=object if default is None else None)


def scol(df: pd.DataFrame, name: str) -> pd.Series:
    """A text column with '' for missing values (or for a missing column)."""
    return col(df, name, None).astype(object).where(col(df, name, None).notna(), "").astype(str)


def num(df: pd.DataFrame, name: str) -> pd.Series:
    return pd.to_numeric(col(df, name), errors="coerce")


def ok(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty or "status" not in df.columns:
        return df
    return df[df["status"] == "ok"]


def q(s: pd.Series, p: float) -> float:
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.quantile(p)) if len(s) else float("nan")


def share_true(mask_of: pd.Series, cond: Callable[[pd.Series], pd.Series]) -> float:
    """Share of the non-missing values of ``mask_of`` for which ``cond`` holds (NaN when none)."""
    v = pd.to_numeric(mask_of, errors="coerce").dropna()
    return float(cond(v).mean()) if len(v) else float("nan")


def parse_set(key: str) -> tuple[str, int, int] | None:
    try:
        arch, b, r = str(key).split(":")
        return arch, int(b[1:]), int(r[1:])
    except (ValueError, IndexError):
        return None


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


# ----------------------------------------------------------------------------- data
@dataclass
class GpuData:
    tag: str
    path: Path
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    prov: list[dict[str, Any]] = field(default_factory=list)
    probe: dict[str, Any] | None = None
    raw_ids: dict[str, set[str]] = field(default_factory=dict)

    def t(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame())

    @property
    def name(self) -> str:
        for t in ("networks", "operations"):
            g = col(self.t(t), "gpu").dropna()
            if len(g):
                return str(g.mode().iloc[0])
        for p in self.prov:
            n = (p.get("gpu") or {}).get("name")
            if n:
                return str(n)
        return self.tag

    def power_limit_w(self) -> float:
        vals = [(p.get("gpu") or {}).get("power_limit_w") for p in self.prov]
        vals = [float(v) for v in vals if v is not None]
        return max(vals) if vals else float("nan")

    def max_sm_clock(self) -> float:
        vals = [(p.get("gpu") or {}).get("max_sm_clock_mhz") for p in self.prov]
        vals = [float(v) for v in vals if v is not None]
        return max(vals) if vals else float("nan")


def load_gpu(path: Path) -> GpuData:
    g = GpuData(tag=path.name, path=path)
    for name in TABLES:
        f = path / f"{name}.parquet"
        try:
            g.tables[name] = pd.read_parquet(f) if f.exists() else pd.DataFrame()
        except Exception:  # a corrupt table must not stop the report
            g.tables[name] = pd.DataFrame()
    raw = path / "raw"
    for p in sorted(raw.glob("provenance-*.json")) if raw.exists() else []:
        try:
            d = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        d.setdefault("run_id", p.stem.replace("provenance-", ""))
        g.prov.append(d)
    g.prov.sort(key=lambda d: str(d.get("date", "")))
    ids: dict[str, set[str]] = {"op": set(), "network": set()}
    for p in raw_row_files(raw) if raw.exists() else []:
        for r in read_jsonl(p):
            if r.get("item") in ids and not r.get("repeat"):
                ids[r["item"]].add(str(r.get("id")))
    g.raw_ids = ids
    probe = path / "probe" / "probe.json"
    if probe.exists():
        try:
            g.probe = json.loads(probe.read_text())
        except (OSError, json.JSONDecodeError):
            g.probe = None
    return g


def load_all(root: Path) -> list[GpuData]:
    if not root.exists():
        return []
    dirs = [p for p in sorted(root.iterdir()) if p.is_dir()
            and ((p / "raw").exists() or any((p / f"{t}.parquet").exists() for t in TABLES))]
    return [load_gpu(p) for p in dirs]


def load_plan(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not Path(path).exists():
        return []
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return list(d.get("items", [])) if isinstance(d, dict) else list(d)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path, tight: bool = True) -> bool:
    """Write a small PNG; a plot that cannot be drawn (e.g. no positive data on a log axis) is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if tight:
            fig.tight_layout()
        fig.savefig(path, dpi=80)
        return True
    except Exception as exc:  # the report must not fail on a plot
        warnings.warn(f"plot {path.name} skipped: {exc}", stacklevel=2)
        path.unlink(missing_ok=True)
        return False
    finally:
        _plt().close(fig)


def _img(path: Path, out_dir: Path, alt: str, saved: bool) -> list[str]:
    return [f"![{alt}]({_rel(path, out_dir)})", ""] if saved else []


# ----------------------------------------------------------------------------- sections
def section_overview(gpus: list[GpuData], plan: list[dict[str, Any]]) -> str:
    from gpurec.sets import DATASET_ARCHS, DATASET_BATCH_SIZES, TEST_ARCHS, TEST_BATCH_SIZES

    n_ops = sum(len(ok(g.t("operations"))) for g in gpus)
    n_net = sum(len(ok(g.t("networks"))) for g in gpus)
    planned_ops = sum(1 for i in plan if i.get("item") == "op")
    planned_net = sum(1 for i in plan if i.get("item") == "network")
    gl = ", ".join(f"`{g.tag}` ({g.name})" for g in gpus) or "none yet"
    lines = [
        "## What this is",
        "",
        "Time and energy per call of the operations (one layer type with its settings on one input "
        "shape, in inference or training mode) that torchvision classification networks execute, "
        "measured one by one on real NVIDIA GPUs, plus whole-network measurements of the same "
        "networks by the same method.  gpurec trains its per-GPU predictors on the operation rows and "
        "checks them against the network rows.",
        "",
        f"* GPUs measured: {gl}.",
        f"* Rows measured (status ok): {n_ops} operation rows and {n_net} whole-network rows in all.",
        f"* Training sets: {len(DATASET_ARCHS)} architectures × batch sizes "
        f"{', '.join(map(str, DATASET_BATCH_SIZES))} at 224×224 "
        f"({len(DATASET_ARCHS) * len(DATASET_BATCH_SIZES)} model-input sets), both modes; "
        f"unseen test architectures ({len(TEST_ARCHS)}: {', '.join(TEST_ARCHS)}) at batch sizes "
        f"{', '.join(map(str, TEST_BATCH_SIZES))} are only ever measured as whole networks.",
        f"* The plan (`datasets/plans/main.json`) lists {planned_ops} distinct (operation, mode) rows and "
        f"{planned_net} network rows per GPU.",
        "* Method: each row runs the step repeatedly; the board's energy counter (NVML total energy, "
        "updated every ~100 ms) is read at two of its own updates, so average power is exact over a "
        "window of several updates; time per call is the median of torch.utils.benchmark's "
        "`blocked_autorange`; energy per call = power × time.  Clocks are the defaults (observed, not "
        "locked); fp32 with TF32 off for matmul (see provenance).",
    ]
    return "\n".join(lines)


def section_layout(gpus: list[GpuData]) -> str:
    lines = [
        "## File layout",
        "",
        "```",
        "datasets/",
        "  README.md                 this file (generated)",
        "  img/                      plots of this file",
        "  plans/main.json           work order: every (operation, mode) and (set, mode) to measure",
        "  <gpu>/raw/rows-*.jsonl    rows as measured, one JSON object per line (append-only, never rewritten)",
        "  <gpu>/raw/provenance-*.json  one per run: GPU, driver, torch, CUDA, host CPU, date, settings",
        "  <gpu>/operations.parquet  one row per measured (operation, mode); latest successful value",
        "  <gpu>/networks.parquet    one row per measured (model-input set, mode)",
        "  <gpu>/repeats.parquet     re-measurements of earlier rows (id ends with :rep)",
        "  <gpu>/idle.parquet        idle power readings taken during the runs",
        "```",
        "",
    ]
    rows = []
    for g in gpus:
        raw = g.path / "raw"
        n_rows = len(raw_row_files(raw)) if raw.exists() else 0
        sizes = ", ".join(f"{t} {len(g.t(t))}" for t in TABLES)
        extra = [p.name for p in sorted(g.path.iterdir()) if p.is_dir() and p.name != "raw"]
        extra_s = "; ".join(f"`{e}/` ({EXTRA_DIRS.get(e, 'other material')})" for e in extra) or "—"
        rows.append([f"`{g.tag}`", g.name, n_rows, len(g.prov), sizes, extra_s])
    if rows:
        lines += [table(["dir", "GPU (NVML)", "raw shards", "runs", "table rows (all statuses)", "other folders"],
                        rows), ""]
    stale = []
    for g in gpus:
        for item, tname in (("op", "operations"), ("network", "networks")):
            have = set(col(g.t(tname), "id").dropna().astype(str))
            missing = g.raw_ids.get(item, set()) - have
            if missing:
                stale.append(f"`{g.tag}/{tname}.parquet` lacks {len(missing)} row ids found in raw shards")
    if stale:
        lines += ["**Tables older than the raw shards:** " + "; ".join(stale) + ". Rebuild with "
                  "`gpurec dataset build`.", ""]
    else:
        lines += ["The Parquet tables hold every row id of the raw shards (rebuild with `gpurec dataset build`).", ""]
    return "\n".join(lines)


def section_columns(gpus: list[GpuData]) -> str:
    present: dict[str, list[str]] = {}
    for tname in TABLES:
        for g in gpus:
            for c in g.t(tname).columns:
                if tname not in present.setdefault(c, []):
                    present[c].append(tname)
    rows = [[f"`{c}`", unit, desc, ", ".join(present[c])] for c, (unit, desc) in COLUMN_DOCS.items()
            if c in present]
    other = sorted(c for c in present if c not in COLUMN_DOCS)
    lines = ["## Columns", ""]
    if rows:
        lines += [table(["column", "unit", "meaning", "tables"], rows), ""]
    if other:
        lines += ["Other columns: " + ", ".join(f"`{c}`" for c in other) + " (idle readings, Timer details, "
                  "provenance flags).", ""]
    return "\n".join(lines)


def section_loading() -> str:
    return "\n".join([
        "## Loading",
        "",
        "```python",
        "import gpurec",
        "ops = gpurec.load_dataset()                          # operations, every GPU, status == 'ok'",
        "h200 = gpurec.load_dataset(gpu='H200')               # one GPU (any catalogue spelling)",
        "nets = gpurec.load_dataset(table='networks')         # whole-network rows",
        "reps = gpurec.load_dataset(table='repeats', status=None)   # re-measurements, failed rows kept",
        "```",
        "",
        "`root=` or `$GPUREC_DATASETS` points elsewhere; plain `pandas.read_parquet` works too.",
        "",
    ])


def section_provenance(gpus: list[GpuData]) -> str:
    lines = ["## Provenance", ""]
    rows = []
    for g in gpus:
        counts = Counter()
        for t in ("operations", "networks"):
            counts.update(col(ok(g.t(t)), "run_id").dropna().astype(str))
        for p in g.prov:
            gi = p.get("gpu") or {}
            st = p.get("settings") or {}
            w = st.get("window") or {}
            cuda = p.get("cuda_runtime") or ""
            if gi.get("cuda_driver_version"):
                cuda = f"{cuda} (driver {gi['cuda_driver_version']})"
            rows.append([f"`{g.tag}`", f"`{p.get('run_id', '')}`", str(p.get("date", ""))[:19].replace("T", " "),
                         gi.get("name", "—"), gi.get("driver_version", "—"), cuda or "—", p.get("torch", "—"),
                         f"{p.get('host_cpu', '—')} ({p.get('host_cores', '?')} cores)",
                         fnum(gi.get("power_limit_w"), 0), w.get("min_window_s", "—"), w.get("min_run_time_s", "—"),
                         w.get("warmup_s", "—"), st.get("max_instances", "—"), counts.get(str(p.get("run_id")), 0)])
    if rows:
        lines += [table(["dir", "run", "date (UTC)", "GPU (NVML)", "driver", "CUDA", "torch", "host CPU",
                         "power limit W", "min window s", "min run time s", "warm-up s", "max instances",
                         "rows kept"], rows), ""]
        lines += ["Rows kept = ok operation + network rows of that run in the tables (a row re-measured "
                  "later keeps only its latest value).  Runs with different window settings are mixed "
                  "in one table; `run_id` tells them apart.", ""]
    else:
        lines += ["No provenance files found.", ""]
    return "\n".join(lines)


def _planned_ops(plan: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [i for i in plan if i.get("item") == "op"]
    if not rows:
        return pd.DataFrame(columns=["key", "mode", "set_key", "arch", "batch"])
    df = pd.DataFrame(rows)
    parsed = df["set_key"].map(parse_set)
    df["arch"] = parsed.map(lambda p: p[0] if p else None)
    df["batch"] = parsed.map(lambda p: p[1] if p else None)
    return df


def _membership(p: pd.DataFrame) -> pd.DataFrame:
    """One row per (planned row, model-input set containing it), with arch and batch of that set."""
    sets = p.apply(lambda r: r["model_sets"] if isinstance(r.get("model_sets"), list) and r["model_sets"]
                   else [r["set_key"]], axis=1) if len(p) else pd.Series(dtype=object)
    m = p.assign(member=sets).explode("member")
    parsed = m["member"].map(parse_set)
    m["arch"] = parsed.map(lambda x: x[0] if x else None)
    m["batch"] = parsed.map(lambda x: x[1] if x else None)
    return m.dropna(subset=["arch"])


def section_rows(gpus: list[GpuData], plan: list[dict[str, Any]], img: Path, out_dir: Path) -> str:
    lines = ["## Rows, coverage and GPU time", ""]
    rows = []
    for g in gpus:
        for tname in ("operations", "networks"):
            t = g.t(tname)
            for mode in sorted(set(col(t, "mode").dropna())):
                s = col(t[col(t, "mode") == mode], "status")
                rows.append([f"`{g.tag}`", tname, mode, int((s == "ok").sum()), int((s != "ok").sum())])
    if rows:
        lines += [table(["GPU", "table", "mode", "ok", "failed"], rows), ""]

    planned = _planned_ops(plan)
    planned_net = [i for i in plan if i.get("item") == "network"]
    if len(planned) and gpus:
        cov_rows = []
        by_arch: dict[str, pd.Series] = {}
        by_batch: dict[str, pd.Series] = {}
        heat: dict[str, pd.DataFrame] = {}
        for g in gpus:
            got = set(zip(col(ok(g.t("operations")), "op_signature").astype(str),
                          col(ok(g.t("operations")), "mode").astype(str), strict=False))
            m = planned.apply(lambda r, got=got: (str(r["key"]), str(r["mode"])) in got, axis=1)
            p = planned.assign(measured=m)
            net_got = set(zip(col(ok(g.t("networks")), "set_key").astype(str),
                              col(ok(g.t("networks")), "mode").astype(str), strict=False))
            n_net = sum((i["key"], i["mode"]) in net_got for i in planned_net)
            per_mode = " / ".join(f"{md} {fpct(p[p['mode'] == md]['measured'].mean())}"
                                  for md in sorted(p["mode"].unique()))
            cov_rows.append([f"`{g.tag}`", f"{int(m.sum())} / {len(p)}", fpct(m.mean()), per_mode,
                             f"{n_net} / {len(planned_net)}"])
            # Membership: a planned row belongs to every set (arch, batch) whose network contains it.
            mem = _membership(p)
            by_arch[g.tag] = mem.drop_duplicates(["key", "mode", "arch"]).groupby("arch")["measured"].mean()
            by_batch[g.tag] = mem.drop_duplicates(["key", "mode", "batch"]).groupby("batch")["measured"].mean()
            heat[g.tag] = mem.drop_duplicates(["key", "mode", "arch", "batch"]).pivot_table(
                index="arch", columns="batch", values="measured", aggfunc="mean")
        lines += ["### Coverage of the plan", "",
                  table(["GPU", "(op, mode) rows measured / planned", "share", "by mode", "network rows"], cov_rows),
                  ""]
        arch_df = pd.DataFrame(by_arch)
        batch_df = pd.DataFrame(by_batch)
        mem_all = _membership(planned.assign(measured=False))
        n_arch = mem_all.drop_duplicates(["key", "mode", "arch"]).groupby("arch").size()
        n_batch = mem_all.drop_duplicates(["key", "mode", "batch"]).groupby("batch").size()
        lines += ["Below, a planned (op, mode) row counts for every architecture / batch size whose networks "
                  "contain it (the plan's `model_sets`).  The plan takes the same number of new rows from every "
                  "(architecture, batch, mode) group per round and interleaves operation kinds, so a run stopped "
                  "early holds a balanced sample: the share is even across batch sizes, while architectures with "
                  "few distinct operations fill up first.  Share measured per batch size:", "",
                  table(["batch", "planned rows"] + [f"`{t}`" for t in batch_df.columns],
                        [[b, int(n_batch.get(b, 0))] + [fpct(v) for v in batch_df.loc[b]] for b in batch_df.index]),
                  ""]
        spread = []
        for t in arch_df.columns:
            s = arch_df[t].dropna()
            if len(s):
                spread.append(f"`{t}`: {fpct(s.min())} ({s.idxmin()}) to {fpct(s.max())} ({s.idxmax()}), "
                              f"median {fpct(s.median())}")
        lines += ["Per architecture (" + str(len(arch_df)) + " architectures) — " + "; ".join(spread) + ":", "",
                  table(["architecture", "planned rows"] + [f"`{t}`" for t in arch_df.columns],
                        [[a, int(n_arch.get(a, 0))] + [fpct(v) for v in arch_df.loc[a]] for a in arch_df.index]), ""]
        plt = _plt()
        fig, axes = plt.subplots(1, len(heat), figsize=(3.2 * len(heat) + 0.6, 5.2), squeeze=False)
        for ax, (tag, h) in zip(axes[0], heat.items(), strict=False):
            im = ax.imshow(h.values.astype(float), vmin=0, vmax=1, cmap="viridis", aspect="auto")
            ax.set_xticks(range(len(h.columns)), [str(c) for c in h.columns], fontsize=7)
            ax.set_yticks(range(len(h.index)), list(h.index), fontsize=6)
            ax.set_xlabel("batch", fontsize=8)
            ax.set_title(f"{tag}: share of planned op rows", fontsize=8)
        fig.subplots_adjust(left=0.2, right=0.88, bottom=0.08, top=0.95, wspace=0.9)
        fig.colorbar(im, cax=fig.add_axes([0.91, 0.3, 0.015, 0.4]))
        path = img / "coverage.png"
        lines += _img(path, out_dir, "coverage", _save(fig, path, tight=False))
    elif not plan:
        lines += ["No plan found, so coverage against the plan is not computed.", ""]

    # GPU time
    trows = []
    for g in gpus:
        parts = {t: num(g.t(t), "row_wall_ms") for t in ("operations", "networks", "repeats")}
        total = sum(float(s.sum()) for s in parts.values())
        idle_s = float(num(g.t("idle"), "idle_window_s").sum())
        trows.append([f"`{g.tag}`", fnum(total / 3.6e6, 2), fnum(total / 6e4, 1),
                      fnum(parts["operations"].mean() / 1000, 2), fnum(parts["networks"].mean() / 1000, 2),
                      fnum(parts["repeats"].mean() / 1000, 2), fnum(idle_s, 1)])
    if trows:
        lines += ["### GPU time spent", "",
                  "Sum of `row_wall_ms` (setup, warm-up, Timer and energy window of every row, repeats "
                  "included; failed rows included), and the mean per row:", "",
                  table(["GPU", "total GPU h", "total GPU min", "s / op row", "s / network row",
                         "s / repeat row", "idle readings s"], trows), ""]

    # failures
    frows = []
    for g in gpus:
        for tname in ("operations", "networks", "repeats"):
            t = g.t(tname)
            bad = t[col(t, "status") != "ok"] if "status" in t.columns else t.iloc[0:0]
            if bad.empty:
                continue
            reasons = scol(bad, "error").replace("", "(no message)").map(lambda e: e.split(":")[0][:60])
            for reason, n in reasons.value_counts().items():
                ex = scol(bad, "error")[reasons == reason].iloc[0][:120]
                kinds = ", ".join(sorted(set(col(bad[reasons == reason], "op_kind").dropna().astype(str))))[:80]
                frows.append([f"`{g.tag}`", tname, reason, n, kinds or "—", ex or "—"])
    lines += ["### Failures", ""]
    if frows:
        lines += [table(["GPU", "table", "reason", "rows", "kinds", "example"], frows), ""]
    else:
        lines += ["No failed rows in any table" + (" (every measured row has status ok)." if gpus else "."), ""]
    return "\n".join(lines)


def repeat_pairs(g: GpuData) -> pd.DataFrame:
    """Each ':rep' row next to its original (looked up by id in the main tables)."""
    reps = ok(g.t("repeats"))
    if reps.empty or "id" not in reps.columns:
        return pd.DataFrame()
    main = pd.concat([ok(g.t("operations")), ok(g.t("networks"))], ignore_index=True)
    if main.empty or "id" not in main.columns:
        return pd.DataFrame()
    main = main.drop_duplicates("id", keep="last").set_index("id")
    out = []
    for _, r in reps.iterrows():
        rid = str(r["id"])
        oid = rid[:-4] if rid.endswith(":rep") else rid
        if oid not in main.index:
            continue
        o = main.loc[oid]
        rec = {"id": oid, "item": r.get("item", o.get("item")), "mode": r.get("mode"),
               "same_run": str(o.get("run_id")) == str(r.get("run_id"))}
        for c in ("time_ms", "energy_mj", "power_w", "gpu_time_ms", "gpu_energy_mj"):
            a, b = pd.to_numeric(o.get(c), errors="coerce"), pd.to_numeric(r.get(c), errors="coerce")
            rec[f"{c}_orig"] = a
            rec[f"{c}_rep"] = b
            rec[f"d_{c}"] = abs(a - b) / ((a + b) / 2) if (a + b) else np.nan
        out.append(rec)
    return pd.DataFrame(out)


def _repeat_reading(tag: str, p: pd.DataFrame, limit_w: float) -> str:
    """One data-derived sentence per GPU: where the 3% goal holds and what breaks it."""
    ops = p[p["item"] == "op"]
    big = ops[ops["time_ms_orig"] >= HOST_MS]
    small = ops[(ops["time_ms_orig"] >= TINY_MS) & (ops["time_ms_orig"] < HOST_MS)]
    if big.empty:
        return f"`{tag}`: no repeated operation of {HOST_MS * 1000:.0f} µs or more yet."
    e_miss = big[big["d_energy_mj"] > WITHIN]
    same_time = e_miss[e_miss["d_time_ms"] <= WITHIN]
    power_moves = same_time[same_time["d_power_w"] > WITHIN]
    high = same_time[same_time[["power_w_orig", "power_w_rep"]].max(axis=1) >= 0.8 * limit_w]
    slow = small[small["d_time_ms"] > 0.1]
    return (f"`{tag}`: operations of {HOST_MS * 1000:.0f} µs or more repeat within 3% in "
            f"{fpct(share_true(big['d_time_ms'], lambda x: x <= WITHIN), 0)} of pairs for time and "
            f"{fpct(share_true(big['d_energy_mj'], lambda x: x <= WITHIN), 0)} for energy ({len(big)} pairs); "
            f"of the {len(e_miss)} energy misses there, {len(same_time)} kept their time within 3% while power "
            f"moved ({len(power_moves)} by more than 3%, {len(high)} of them at ≥ {0.8 * limit_w:.0f} W, i.e. near "
            f"the {limit_w:.0f} W limit, where clocks follow the power cap).  Between 20 and "
            f"{HOST_MS * 1000:.0f} µs, {len(slow)} of {len(small)} pairs changed time by more than 10% "
            f"seconds apart in the same run ({fpct((slow['mode'] == 'training').mean() if len(slow) else None, 0)} of "
            "them training steps, whose time at this size is mostly the autograd engine and kernel launches on "
            "the CPU): host-bound rows follow the host's state, not the GPU's.")


def section_repeatability(gpus: list[GpuData], img: Path, out_dir: Path) -> str:
    lines = ["## Repeatability", "",
             "Every 40th row the collector re-measures an earlier row of the same run (repeats table, id "
             f"ending `:rep`).  Each repeat is paired with its original by id; |Δ|/mean is the absolute "
             f"difference over the mean of the two.  Buckets: launch-bound operations (< {TINY_MS * 1000:.0f} "
             f"µs per call, by the original's time), operations up to {HOST_MS * 1000:.0f} µs (most of them "
             "small training steps whose time is autograd and launch work on the host), larger operations, "
             "whole networks.", ""]
    rows = []
    pairs_all = {}
    for g in gpus:
        p = repeat_pairs(g)
        if p.empty:
            continue
        pairs_all[g.tag] = p
        is_op = p["item"] == "op"
        buckets = [("all", p), (f"ops < {TINY_MS * 1000:.0f} µs", p[is_op & (p["time_ms_orig"] < TINY_MS)]),
                   (f"ops {TINY_MS * 1000:.0f}–{HOST_MS * 1000:.0f} µs",
                    p[is_op & (p["time_ms_orig"] >= TINY_MS) & (p["time_ms_orig"] < HOST_MS)]),
                   (f"ops ≥ {HOST_MS * 1000:.0f} µs", p[is_op & (p["time_ms_orig"] >= HOST_MS)]),
                   ("networks", p[p["item"] == "network"])]
        for name, b in buckets:
            if b.empty:
                rows.append([f"`{g.tag}`", name, 0] + ["—"] * 6)
                continue
            rows.append([f"`{g.tag}`", name, len(b), fpct(b["d_energy_mj"].median()), fpct(q(b["d_energy_mj"], 0.9)),
                         fpct(share_true(b["d_energy_mj"], lambda x: x <= WITHIN), 0), fpct(b["d_time_ms"].median()),
                         fpct(q(b["d_time_ms"], 0.9)), fpct(share_true(b["d_time_ms"], lambda x: x <= WITHIN), 0)])
    if not rows:
        lines += ["No repeat pairs yet.", ""]
        return "\n".join(lines)
    lines += [table(["GPU", "bucket", "pairs", "energy: median |Δ|/mean", "energy: p90", "energy: within 3%",
                     "time: median", "time: p90", "time: within 3%"], rows), ""]
    cross = {t: int((~p["same_run"]).sum()) for t, p in pairs_all.items()}
    if any(cross.values()):
        lines += ["Pairs whose original was kept from an earlier run (the table keeps the latest value of a "
                  "re-measured row): " + ", ".join(f"`{t}` {n}" for t, n in cross.items()) + ".", ""]
    worst = []
    for t, p in pairs_all.items():
        w = p.sort_values("d_energy_mj", ascending=False).head(3)
        for _, r in w.iterrows():
            worst.append([f"`{t}`", f"`{r['id']}`", fsig(r["time_ms_orig"]), fsig(r["time_ms_rep"]),
                          fsig(r["energy_mj_orig"]), fsig(r["energy_mj_rep"]), fpct(r["d_energy_mj"])])
    lines += ["Largest energy differences:", "",
              table(["GPU", "row", "time ms (orig)", "time ms (rep)", "energy mJ (orig)", "energy mJ (rep)",
                     "|Δ|/mean"], worst), ""]
    limits = {g.tag: g.power_limit_w() for g in gpus}
    lines += ["**Reading.** " + " ".join(_repeat_reading(t, p, limits[t]) for t, p in pairs_all.items()), ""]
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for i, (t, p) in enumerate(pairs_all.items()):
        x = (p["time_ms_orig"] + p["time_ms_rep"]) / 2
        for item, mk in (("op", "o"), ("network", "s")):
            m = p["item"] == item
            for ax, c in zip(axes, ("d_energy_mj", "d_time_ms"), strict=False):
                ax.scatter(x[m], 100 * p[c][m].clip(lower=1e-4), s=10, marker=mk, color=f"C{i}", alpha=0.7,
                           label=f"{t} {item}")
    for ax, title in zip(axes, ("energy per call", "time per call"), strict=False):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axhline(100 * WITHIN, color="grey", lw=0.8, ls="--")
        ax.axvline(TINY_MS, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("time per call (ms)", fontsize=8)
        ax.set_ylabel("|Δ|/mean (%)", fontsize=8)
        ax.set_title(f"repeat vs original: {title}", fontsize=9)
        ax.tick_params(labelsize=7)
    axes[0].legend(fontsize=6)
    path = img / "repeatability.png"
    lines += _img(path, out_dir, "repeatability", _save(fig, path))
    return "\n".join(lines)


def _op_label(op: Any) -> str:
    if isinstance(op, (list, tuple)) and len(op) >= 4:
        return f"{op[0]} b{op[1]} {op[2]} {op[3]}" + (f" #{op[4]}" if len(op) > 4 else "")
    return str(op)


def section_probe(gpus: list[GpuData], img: Path, out_dir: Path) -> str:
    lines = ["## Why these collection settings (probe)", ""]
    probes = [(g, g.probe) for g in gpus if g.probe]
    if not probes:
        lines += ["No probe (`<gpu>/probe/probe.json`) found.", ""]
        return "\n".join(lines)
    latest = {}
    for g in gpus:
        if g.prov:
            latest = g.prov[-1].get("settings") or {}
    win = (latest.get("window") or {}).get("min_window_s")
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for g, pr in probes:
        tick = pr.get("tick_period_s")
        idle = (pr.get("idle") or {}).get("idle_power_w")
        lines += [f"Measured on `{g.tag}` ({(pr.get('gpu') or {}).get('name', g.name)}, torch {pr.get('torch', '?')}): "
                  f"energy-counter update period {fnum(1000 * tick if tick else None, 1)} ms, idle power "
                  f"{fnum(idle, 1)} W.", ""]
        ws = pd.DataFrame(pr.get("window_sweep") or [])
        if not ws.empty and {"op", "min_window_s", "energy_mj"} <= set(ws.columns):
            ws["label"] = ws["op"].map(_op_label)
            agg = ws.groupby(["label", "min_window_s"]).agg(
                e_cv=("energy_mj", lambda s: s.std(ddof=0) / s.mean() if len(s) > 1 and s.mean() else np.nan),
                t_cv=("time_ms", lambda s: s.std(ddof=0) / s.mean() if len(s) > 1 and s.mean() else np.nan),
                gpu_s=("gpu_time_s", "mean") if "gpu_time_s" in ws else ("energy_mj", lambda s: np.nan),
                win_s=("window_s", "mean") if "window_s" in ws else ("energy_mj", lambda s: np.nan),
                n=("energy_mj", "size")).reset_index()
            windows = sorted(agg["min_window_s"].unique())
            rows = []
            for lab in sorted(agg["label"].unique()):
                a = agg[agg["label"] == lab].set_index("min_window_s")
                rows.append([lab] + [f"{fpct(a.loc[w, 'e_cv'])} ({fnum(a.loc[w, 'gpu_s'], 2)} s)" if w in a.index
                                     else "—" for w in windows])
            med = agg.groupby("min_window_s")["e_cv"].median()
            mx = agg.groupby("min_window_s")["e_cv"].max()
            mwin = agg.groupby("min_window_s")["win_s"].mean()
            rows.append(["**median over ops**"] + [f"**{fpct(med.get(w))}**" for w in windows])
            rows.append(["worst op"] + [fpct(mx.get(w)) for w in windows])
            rows.append(["mean window achieved (s)"] + [fnum(mwin.get(w), 2) for w in windows])
            reps = int(agg["n"].median())
            lines += [f"**Window sweep** — energy per call, coefficient of variation over {reps} repeats per op "
                      "and minimum window length (mean GPU seconds per measurement in brackets):", "",
                      table(["operation"] + [f"min window {w} s" for w in windows], rows), ""]
            for j, lab in enumerate(sorted(agg["label"].unique())):
                a = agg[agg["label"] == lab]
                axes[0].plot(a["min_window_s"], 100 * a["e_cv"], "o-", ms=3, color=f"C{j}", label=lab)
            axes[0].plot(med.index, 100 * med.values, "k--", lw=1.5, label="median")
            if win:
                axes[0].axvline(float(win), color="grey", ls=":", lw=1)
            axes[0].set_xlabel("min window (s)", fontsize=8)
            axes[0].set_ylabel("energy CV over repeats (%)", fontsize=8)
            axes[0].set_title(f"{g.tag}: window sweep", fontsize=9)
            axes[0].legend(fontsize=5)
            axes[0].tick_params(labelsize=7)
            lo = [w for w in windows if w < 0.3]
            hi = [w for w in windows if w >= 0.3]
            if lo and hi:
                lines += [f"Windows under 0.3 s give a median energy CV of {fpct(med[lo].median())} "
                          f"(worst {fpct(mx[lo].max())}); 0.3 s and longer give {fpct(med[hi].median())} "
                          f"(worst {fpct(mx[hi].max())}), at {fnum(agg[agg['min_window_s'].isin(hi)]['gpu_s'].mean(), 2)} "
                          f"s instead of {fnum(agg[agg['min_window_s'].isin(lo)]['gpu_s'].mean(), 2)} s per row.  With "
                          f"{reps} repeats per cell the CVs themselves are noisy, so the sweep bounds rather than "
                          f"pins the choice.  The collector uses a minimum window of {win} s: the window opens on "
                          "a counter update and closes on the first update at least that long after it, i.e. "
                          f"after four updates of ~{fnum(1000 * tick if tick else None, 0)} ms (just under "
                          "0.4 s so timing jitter does not push it to five); longer windows cost GPU time.", ""]
        inst = pd.DataFrame(pr.get("instance_sweep") or [])
        if not inst.empty and {"op", "instances", "time_ms"} <= set(inst.columns):
            inst["label"] = inst["op"].map(_op_label)
            counts = sorted(inst["instances"].unique())
            rows = []
            spreads = []
            rel4 = []
            rhos = []
            beyond = []
            for j, lab in enumerate(inst["label"].unique()):
                a = inst[inst["label"] == lab].set_index("instances")
                base = a["time_ms"].get(1, np.nan)
                spreads.append(a["time_ms"].max() / a["time_ms"].min() - 1)
                if 4 in a.index and base:
                    rel4.append(a["time_ms"][4] / base - 1)
                if 4 in a.index and (a.index > 4).any() and a["time_ms"][4]:
                    beyond.append(a["time_ms"][a.index > 4].median() / a["time_ms"][4] - 1)
                if len(a) > 2 and a["time_ms"].nunique() > 1:
                    rhos.append(pd.Series(a.index, dtype=float).corr(pd.Series(a["time_ms"].values), method="spearman"))
                rows.append([lab, fsig(a["param_bytes"].iloc[0] / 1e6 if "param_bytes" in a else np.nan)]
                            + [fsig(a["time_ms"].get(n, np.nan) * 1000) for n in counts]
                            + [fpct(spreads[-1])])
                axes[1].plot(a.index, a["time_ms"] / base, "o-", ms=3, color=f"C{j}", label=lab)
            lines += ["**Instance sweep** — time per call (µs) against the number of independently initialised "
                      "copies cycled through:", "",
                      table(["operation", "weights MB"] + [f"{n}" for n in counts] + ["max/min − 1"], rows), ""]
            max_inst = latest.get("max_instances")
            lines += [f"Across {len(rows)} operations the spread over instance counts is median "
                      f"{fpct(float(np.median(spreads)))} (largest {fpct(float(np.max(spreads)))}); 4 instances vs 1 "
                      f"changes time by a median {fpct(float(np.median(rel4)) if rel4 else np.nan)} (range "
                      f"{fpct(min(rel4) if rel4 else np.nan)} to {fpct(max(rel4) if rel4 else np.nan)}), and more than 4 "
                      f"vs 4 by a median {fpct(float(np.median(beyond)) if beyond else np.nan)}; the rank "
                      f"correlation between instance count and time is median "
                      f"{fnum(float(np.median(rhos)) if rhos else np.nan)} over the operations (time does not "
                      "grow with the count).  So the collector caps the automatic instance count (enough copies that "
                      f"the weights exceed L2) at {max_inst} to bound memory and setup time.", ""]
            axes[1].set_xscale("log", base=2)
            axes[1].set_xlabel("instances", fontsize=8)
            axes[1].set_ylabel("time / time at 1 instance", fontsize=8)
            axes[1].set_title(f"{g.tag}: instance sweep", fontsize=9)
            axes[1].legend(fontsize=5)
            axes[1].tick_params(labelsize=7)
        break  # one probe plot (the first GPU with a probe)
    path = img / "probe.png"
    lines += _img(path, out_dir, "probe", _save(fig, path))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- validation
def _extract_default(arch: str, shape: tuple[int, ...], mode: str) -> list[tuple[str, float]]:
    from gpurec.ops import extract_operations

    ops = extract_operations(arch, shape, mode=mode, keep_sources=False)
    return [(o.signature, float(o.flops_total)) for o in ops]


def _extract_job(args: tuple[str, tuple[int, ...], str]) -> list[tuple[str, float]]:
    return _extract_default(*args)


def extract_sets(jobs: list[tuple[str, int, int, str]], extract: Callable[..., Any] | None,
                 workers: int | None = None) -> dict[tuple[str, int, int, str], list[tuple[str, float]] | None]:
    """(arch, batch, res, mode) -> [(signature, flops)] with multiplicity; None when extraction failed."""
    out: dict[tuple[str, int, int, str], list[tuple[str, float]] | None] = {}
    args = [(a, (b, 3, r, r), m) for a, b, r, m in jobs]
    if extract is None and len(jobs) > 4 and (workers or os.cpu_count() or 1) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(8, workers or os.cpu_count() or 1)) as ex:
            futs = [ex.submit(_extract_job, a) for a in args]
            for j, f in zip(jobs, futs, strict=False):
                try:
                    out[j] = f.result()
                except Exception:
                    out[j] = None
        return out
    fn = extract or _extract_default
    for j, a in zip(jobs, args, strict=False):
        try:
            out[j] = [(str(s), float(f)) for s, f in fn(*a)]
        except Exception:
            out[j] = None
    return out


def validation_table(gpus: list[GpuData], plan: list[dict[str, Any]], extract: Callable[..., Any] | None,
                     min_coverage: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(distinct coverage per GPU/set/mode from the plan, op-sum vs network per extracted GPU/set/mode)."""
    planned = _planned_ops(plan)
    measured = {g.tag: set(zip(col(ok(g.t("operations")), "op_signature").astype(str),
                               col(ok(g.t("operations")), "mode").astype(str), strict=False)) for g in gpus}
    # distinct planned ops per (set, mode), from the plan's model_sets
    members: dict[tuple[str, str], set[str]] = {}
    for _, r in planned.iterrows():
        ms = r.get("model_sets")
        for s in ms if isinstance(ms, list) and ms else [r["set_key"]]:
            members.setdefault((str(s), str(r["mode"])), set()).add(str(r["key"]))
    if members:
        sets = sorted(members)
    else:  # no plan: every measured network set
        sets = sorted({(str(s), str(m)) for g in gpus for s, m in
                       zip(col(ok(g.t("networks")), "set_key"), col(ok(g.t("networks")), "mode"), strict=False)})
    dist_rows = []
    for s, m in sets:
        sigs = members.get((s, m))
        for g in gpus:
            if sigs:
                cov = sum((k, m) in measured[g.tag] for k in sigs) / len(sigs)
            else:
                cov = np.nan
            dist_rows.append({"gpu": g.tag, "set": s, "mode": m, "distinct": len(sigs) if sigs else np.nan,
                              "distinct_cov": cov})
    dist = pd.DataFrame(dist_rows)
    if dist.empty:
        return dist, pd.DataFrame()
    cand = dist[(dist["distinct_cov"] >= min_coverage) | dist["distinct_cov"].isna()][["set", "mode"]].drop_duplicates()
    jobs = []
    for s, m in cand.itertuples(index=False):
        p = parse_set(s)
        if p:
            jobs.append((p[0], p[1], p[2], m))
    ops_of = extract_sets(jobs, extract)
    from gpurec.validate.compare import sum_operations

    rows = []
    for g in gpus:
        o = ok(g.t("operations"))
        look: dict[str, dict[str, tuple[float, float, float]]] = {}  # mode -> signature -> measured
        if not o.empty and "op_signature" in o.columns:
            for r in o.itertuples(index=False):
                look.setdefault(str(r.mode), {})[str(r.op_signature)] = (
                    float(getattr(r, "time_ms", np.nan)), float(getattr(r, "energy_mj", np.nan)),
                    float(getattr(r, "dynamic_energy_mj", np.nan)) if hasattr(r, "dynamic_energy_mj") else np.nan)
        n = ok(g.t("networks"))
        nets = {}
        if not n.empty and {"set_key", "mode"} <= set(n.columns):
            nets = {(str(a), str(b)): r for (a, b), r in
                    zip(zip(n["set_key"], n["mode"], strict=False), n.to_dict("records"), strict=False)}
        for (a, b, r, m), ops in ops_of.items():
            s = f"{a}:b{b}:r{r}"
            if not ops:
                continue
            su = sum_operations(ops, look.get(m, {}), tiny_ms=TINY_MS)
            st, se = su["sum_time_ms"], su["sum_energy_mj"]
            net = nets.get((s, m), {})
            rows.append({
                "gpu": g.tag, "set": s, "arch": a, "batch": b, "mode": m, "ops": len(ops),
                "distinct_ops": len({sig for sig, _ in ops}),
                "cov_ops": su["coverage"], "cov_flops": su["flops_coverage"],
                "sum_time_ms": st, "sum_energy_mj": se, "sum_dyn_mj": su["sum_dynamic_energy_mj"],
                "tiny_share": su["tiny_time_share"],
                "net_time_ms": net.get("time_ms", np.nan), "net_energy_mj": net.get("energy_mj", np.nan),
                "net_dyn_mj": net.get("dynamic_energy_mj", np.nan), "net_power_w": net.get("power_w", np.nan),
                "net_throttle": net.get("throttle_reasons", ""),
                "ops_power_w": se / st if st else np.nan,
            })
    v = pd.DataFrame(rows)
    if not v.empty:
        v["r_time"] = v["sum_time_ms"] / v["net_time_ms"]
        v["r_energy"] = v["sum_energy_mj"] / v["net_energy_mj"]
        v["r_dyn"] = v["sum_dyn_mj"] / v["net_dyn_mj"]
        v["full"] = v["cov_ops"] >= 1.0 - 1e-12
    return dist, v


def section_validation(gpus: list[GpuData], plan: list[dict[str, Any]], img: Path, out_dir: Path,
                       extract: Callable[..., Any] | None, min_coverage: float) -> str:
    lines = ["## First validation: sum of operations vs whole network", "",
             "For a model-input set and mode, the operations a network executes (from "
             "`gpurec.ops.extract_operations(arch, (b, 3, r, r), mode=mode, keep_sources=False)`, repeated "
             "operations counted by multiplicity) are looked up by signature in that GPU's operations "
             "table.  Where every operation is measured, Σ time and Σ energy per call are compared with the "
             "whole-network row of the same set and mode (ratio = sum / network; 1 is perfect additivity).  "
             "This is the eager view: Σ uses each row's eager `time_ms`.  Host-free rows (schema 2) measure no "
             "eager energy per operation, so Σ energy is blank wherever one enters; the host-free sum against "
             "the host-free network is in *The GPU apart from the host* below.", ""]
    dist, v = validation_table(gpus, plan, extract, min_coverage)
    if dist.empty:
        lines += ["Nothing to validate yet (no plan and no network rows).", ""]
        return "\n".join(lines)
    rows = []
    for g in gpus:
        for m in sorted(dist["mode"].unique()):
            d = dist[(dist["gpu"] == g.tag) & (dist["mode"] == m)]
            vv = v[(v["gpu"] == g.tag) & (v["mode"] == m)] if not v.empty else v
            full = int(vv["full"].sum()) if not vv.empty else 0
            p90 = int(((vv["cov_ops"] >= 0.9) & ~vv["full"]).sum()) if not vv.empty else 0
            rows.append([f"`{g.tag}`", m, len(d), fpct(d["distinct_cov"].median(), 0),
                         int((d["distinct_cov"] >= min_coverage).sum()), p90, full])
    lines += [f"Coverage per set (sets with any operation in the plan; distinct operations from the plan's "
              f"`model_sets`; sets with ≥ {fpct(min_coverage, 0)} distinct coverage on some GPU are extracted "
              "to count op instances):", "",
              table(["GPU", "mode", "sets", "median distinct-op coverage", f"sets ≥ {fpct(min_coverage, 0)} distinct",
                     "≥ 90% of op instances (partial)", "fully covered"], rows), ""]
    if v.empty:
        lines += ["No set reaches the extraction threshold yet, so no sum can be compared.", ""]
        return "\n".join(lines)
    full = v[v["full"] & v["net_time_ms"].notna()].sort_values(["gpu", "mode", "arch", "batch"])
    if full.empty:
        lines += ["**No set is fully covered on any GPU yet**, so the additivity check cannot be computed "
                  "in full; the partial table below gives lower bounds.", ""]
    else:
        lines += ["### Fully covered sets", "",
                  table(["GPU", "set", "mode", "ops (distinct)", "Σ time ms", "network ms", "time ratio",
                         "Σ energy mJ", "network mJ", "energy ratio", "dyn. energy ratio",
                         f"share of Σ time in ops < {TINY_MS * 1000:.0f} µs", "network power W",
                         "network throttle"],
                        [[f"`{r.gpu}`", r.set, r.mode, f"{r.ops} ({r.distinct_ops})", fsig(r.sum_time_ms),
                          fsig(r.net_time_ms), fnum(r.r_time), fsig(r.sum_energy_mj), fsig(r.net_energy_mj),
                          fnum(r.r_energy), fnum(r.r_dyn), fpct(r.tiny_share, 0), fnum(r.net_power_w, 0),
                          r.net_throttle if isinstance(r.net_throttle, str) and r.net_throttle else "—"]
                         for r in full.itertuples()]), ""]
        srows = []
        for (gt, m), f in full.groupby(["gpu", "mode"]):
            srows.append([f"`{gt}`", m, len(f), fnum(f["r_time"].median()),
                          f"{fnum(f['r_time'].min())}–{fnum(f['r_time'].max())}", fnum(f["r_energy"].median()),
                          f"{fnum(f['r_energy'].min())}–{fnum(f['r_energy'].max())}",
                          fpct(share_true(f["r_energy"], lambda x: abs(x - 1) <= 0.1), 0)])
        lines += [table(["GPU", "mode", "sets", "median time ratio", "range", "median energy ratio", "range",
                         "energy within ±10%"], srows), ""]
        archs = sorted(full["arch"].unique())
        lines += [f"Fully covered so far: {len(full)} (GPU, set, mode) combinations, from {len(archs)} "
                  f"architecture(s) ({', '.join(archs)}) out of {len(dist['set'].unique())} sets: a first check, "
                  "not yet evidence for the sets in general.", ""]
        for m, f in full.groupby("mode"):
            b0 = int(f["batch"].min())
            small, rest = f[f["batch"] == b0], f[f["batch"] > b0]
            over = int((f["r_time"] > 1).sum())
            msg = (f"{m}: Σ time exceeds the network in {over} of {len(f)} fully covered sets; at batch {b0} the "
                   f"time ratio is {fnum(small['r_time'].median())}")
            if len(rest):
                msg += f", at larger batches median {fnum(rest['r_time'].median())}"
            lines += [msg + ".", ""]
    part = v[(v["cov_ops"] >= 0.9) & ~v["full"] & v["net_time_ms"].notna()].sort_values(["gpu", "mode", "arch", "batch"])
    if not part.empty:
        lines += ["### Partly covered sets (≥ 90% of op instances measured)", "",
                  "Σ over the measured operations only, so the ratios are lower bounds of the full sum; "
                  "the FLOP share says how much of the arithmetic the measured operations carry.", "",
                  table(["GPU", "set", "mode", "op instances covered", "FLOPs covered", "Σ time / network (≥)",
                         "Σ energy / network (≥)"],
                        [[f"`{r.gpu}`", r.set, r.mode, fpct(r.cov_ops, 0), fpct(r.cov_flops, 1), fnum(r.r_time),
                          fnum(r.r_energy)] for r in part.itertuples()]), ""]
    missing = [g.tag for g in gpus if v[(v["gpu"] == g.tag) & v["full"]].empty]
    if missing:
        lines += ["No fully covered set yet on: " + ", ".join(f"`{t}`" for t in missing) + " (the collection "
                  "there stopped early; the check runs as soon as a set's operations are all in).", ""]
    lines += [
        "**Where sum and network can differ.**  (1) Launch-bound operations: a measured operation runs "
        "back-to-back with itself, so its time per call is host/launch overhead when the kernel is shorter "
        "than the launch path; inside a network the GPU may overlap that overhead with the previous kernel "
        "(sum > network) or idle in gaps between different kernels that isolated calls never see "
        "(sum < network).  This matters at small batches, where most operations are short.  (2) Power "
        "capping and clocks: heavy sets run near the power limit for the whole network, so clocks drop "
        "(network throttle column) while a single operation's window may not; energy ratios then differ from "
        "time ratios.  (3) Caching: an isolated operation reuses its inputs and (up to the instance count) "
        "its weights, so they can stay in L2; inside a network activations come from the previous layer and "
        "weights are evicted by other layers.  (4) Training: each measured operation pays its own "
        "`torch.autograd.backward` call (engine start, gradient-buffer set-up and reset), which a network "
        "pays once per step; where the GPU waits on the host (small batches, small layers) this makes the "
        "sum exceed the network.  Which of these dominates is not separated by these data yet.", ""]
    shown = v[(v["full"] | (v["cov_ops"] >= 0.9)) & v["net_time_ms"].notna()]
    if shown.empty:
        return "\n".join(lines)
    plt = _plt()
    tags = [g.tag for g in gpus if not shown[shown["gpu"] == g.tag].empty]
    modes = sorted(shown["mode"].unique())
    fig, axes = plt.subplots(1, len(tags) + 1, figsize=(3.3 * (len(tags) + 1) + 0.4, 3.2), squeeze=False)
    for i, tag in enumerate(tags):
        ax = axes[0][i]
        for j, m in enumerate(modes):
            for full_sel, lab in ((True, "full"), (False, "≥90%, lower bound")):
                d = shown[(shown["gpu"] == tag) & (shown["mode"] == m) & (shown["full"] == full_sel)]
                if d.empty:
                    continue
                ax.scatter(d["net_energy_mj"], d["sum_energy_mj"], s=16, marker="o" if full_sel else "^",
                           facecolors=f"C{j}" if full_sel else "none", edgecolors=f"C{j}", label=f"{m}, {lab}")
                rx = axes[0][-1]
                rx.scatter(d["batch"] * (1.08 ** i), d["r_time"], s=16, marker="o" if full_sel else "^",
                           facecolors=f"C{j}" if full_sel else "none", edgecolors=f"C{j}",
                           label=f"{tag} {m}, {lab}")
        lim = shown[shown["gpu"] == tag][["net_energy_mj", "sum_energy_mj"]].replace(0, np.nan).stack().dropna()
        lo, hi = lim.min() / 1.5, lim.max() * 1.5
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.7)
        ax.plot([lo, hi], [lo * 1.1, hi * 1.1], "k:", lw=0.5)
        ax.plot([lo, hi], [lo / 1.1, hi / 1.1], "k:", lw=0.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("network energy per call (mJ)", fontsize=8)
        ax.set_ylabel("Σ operations (mJ)", fontsize=8)
        ax.set_title(f"{tag}: energy", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    rx = axes[0][-1]
    rx.axhline(1, color="k", lw=0.7)
    rx.axhspan(1 / 1.1, 1.1, color="grey", alpha=0.15)
    rx.set_xscale("log", base=2)
    rx.set_xlabel("batch size", fontsize=8)
    rx.set_ylabel("Σ time / network time", fontsize=8)
    rx.set_title("time ratio by batch", fontsize=9)
    rx.tick_params(labelsize=7)
    path = img / "sum_vs_network.png"
    if _save(fig, path):
        lines += [f"![sum vs network]({_rel(path, out_dir)})", "",
              "(Filled: fully covered; hollow triangles: ≥ 90% of op instances, a lower bound.  Left: energy per "
              "call, solid line equality, dotted ±10%.  Right: time ratio against batch size, band ±10%.)", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- power and clocks
def section_power(gpus: list[GpuData], img: Path, out_dir: Path) -> str:
    lines = ["## Power, clocks and throttling", ""]
    rows, crows, trows, irows = [], [], [], []
    for g in gpus:
        lim = g.power_limit_w()
        smax = g.max_sm_clock()
        for tname in ("operations", "networks"):
            t = ok(g.t(tname))
            if t.empty:
                continue
            p = num(t, "power_w")
            over = p > lim if not math.isnan(lim) else pd.Series(False, index=t.index)
            thr = scol(t, "throttle_reasons")
            over_capped = (thr[over].str.contains("power_cap")).mean() if over.any() else np.nan
            rows.append([f"`{g.tag}`", tname, len(t), fnum(q(p, 0.05), 0), fnum(q(p, 0.5), 0), fnum(q(p, 0.95), 0),
                         fnum(p.max(), 0), fnum(lim, 0), f"{int(over.sum())} ({fpct(over.mean())})",
                         fpct(over_capped, 0), fnum((num(t, "sampled_power_w") / p).median(), 2),
                         fnum(num(t, "tick_power_cv").median(), 3),
                         int((num(t, "tick_power_cv") > 0.2).sum())])
            sm = num(t, "sm_clock_mhz")
            smin = num(t, "sm_clock_min_mhz")
            mem = num(t, "mem_clock_mhz").round()
            crows.append([f"`{g.tag}`", tname, fnum(smax, 0), fpct((sm >= smax - 0.5).mean() if not math.isnan(smax)
                                                                else np.nan, 0),
                          fnum(q(sm, 0.05), 0), fnum(sm.min(), 0), fnum(smin.min(), 0),
                          ", ".join(str(int(x)) for x in sorted(mem.dropna().unique())[:4]) or "—",
                          fnum(num(t, "temperature_c").max(), 0)])
            reasons = Counter()
            for s in thr:
                for r in filter(None, (x.strip() for x in s.split(","))):
                    reasons[r] += 1
            none = int((thr.str.strip() == "").sum())
            trows.append([f"`{g.tag}`", tname, f"{none} ({fpct(none / len(t), 0)})",
                          ", ".join(f"{k} {v} ({fpct(v / len(t), 1)})" for k, v in reasons.most_common()) or "—"])
        idle = g.t("idle")
        if not idle.empty:
            ip = num(idle, "idle_power_w")
            irows.append([f"`{g.tag}`", len(idle), fnum(ip.median(), 1), f"{fnum(ip.min(), 1)}–{fnum(ip.max(), 1)}",
                          fnum(num(idle, "idle_sm_clock_mhz").median(), 0),
                          fnum(num(idle, "idle_temperature_c").median(), 0)])
    if rows:
        lines += ["Average board power over each row's energy window (W):", "",
                  table(["GPU", "table", "rows", "p5", "median", "p95", "max", "power limit", "rows above limit",
                         "of those with sw_power_cap", "median sampled / counter power", "median tick-power CV", "rows with tick CV > 0.2"], rows), "",
                  "A window average above the board's power limit is possible: the limit is enforced by a "
                  "controller over its own averaging period, and the energy counter reports what the board "
                  "drew.  The column \"of those with sw_power_cap\" gives how many of these rows saw the "
                  "software power-cap clock reason during their window.  \"sampled / counter\" compares the mean of "
                  "instantaneous NVML power readings with the counter average: the readings are a cross-check "
                  "only (they sample part of the time), `power_w` comes from the counter.", ""]
        lines += ["SM clock (MHz; default application clocks, not locked) and memory clock:", "",
                  table(["GPU", "table", "max SM clock", "rows at max (mean)", "p5 of mean", "lowest mean",
                         "lowest sample", "memory clock", "max temp °C"], crows), ""]
        lines += ["Clock-event (throttle) reasons seen during the windows:", "",
                  table(["GPU", "table", "no reason", "reasons (rows)"], trows), ""]
    if irows:
        lines += ["Idle power (board idle with the CUDA context alive, read every ~2 minutes during runs):", "",
                  table(["GPU", "readings", "median W", "range W", "SM clock MHz", "temp °C"], irows), "",
                  "`dynamic_energy_mj` subtracts the run's idle power from each row's power.", ""]
    plot_g = [g for g in gpus if not ok(g.t("operations")).empty or not ok(g.t("networks")).empty]
    if plot_g:
        plt = _plt()
        fig, axes = plt.subplots(1, 2, figsize=(8, 3.1))
        for i, g in enumerate(plot_g):
            t = pd.concat([ok(g.t("operations")), ok(g.t("networks"))], ignore_index=True)
            p = num(t, "power_w").dropna()
            axes[0].hist(p, bins=40, histtype="step", color=f"C{i}", label=f"{g.tag} (n={len(p)})")
            lim = g.power_limit_w()
            if not math.isnan(lim):
                axes[0].axvline(lim, color="grey", ls="--", lw=0.8)
            thr = scol(t, "throttle_reasons").str.contains("power_cap")
            axes[1].scatter(num(t, "power_w")[~thr], num(t, "sm_clock_mhz")[~thr], s=4, color=f"C{i}", alpha=0.4,
                            label=f"{g.tag}")
            axes[1].scatter(num(t, "power_w")[thr], num(t, "sm_clock_mhz")[thr], s=10, marker="x", color=f"C{i}",
                            label=f"{g.tag} sw_power_cap")
        axes[0].set_xlabel("power_w (W)", fontsize=8)
        axes[0].set_ylabel("rows", fontsize=8)
        axes[0].set_title("window-average power, ops + networks", fontsize=9)
        axes[1].set_xlabel("power_w (W)", fontsize=8)
        axes[1].set_ylabel("mean SM clock (MHz)", fontsize=8)
        axes[1].set_title("clock vs power", fontsize=9)
        for ax in axes:
            ax.legend(fontsize=6)
            ax.tick_params(labelsize=7)
        path = img / "power_clocks.png"
        lines += _img(path, out_dir, "power and clocks", _save(fig, path))
    if not (rows or irows):
        lines += ["No rows yet.", ""]
    return "\n".join(lines)


def networks_across_table(gpus: list[GpuData]) -> list[dict[str, Any]]:
    """Whole networks measured on two GPUs, one record per (GPU pair, mode, architecture group):
    the median second/first time and energy ratios and how often the second GPU wins."""
    from gpurec.sets import TEST_ARCHS

    nets = {g.tag: ok(g.t("networks")) for g in gpus}
    nets = {t: n for t, n in nets.items() if not n.empty and {"set_key", "mode", "time_ms", "energy_mj"} <= set(n.columns)}
    tags = list(nets)
    out: list[dict[str, Any]] = []
    for i in range(len(tags)):
        for j in range(i + 1, len(tags)):
            a, b = tags[i], tags[j]
            m = nets[a].merge(nets[b], on=["set_key", "mode"], suffixes=("_a", "_b"))
            if m.empty:
                continue
            m["test"] = m["set_key"].map(lambda s: (parse_set(s) or ("",))[0] in TEST_ARCHS)
            for (mode, test), d in m.groupby(["mode", "test"]):
                rt = d["time_ms_b"] / d["time_ms_a"]
                re_ = d["energy_mj_b"] / d["energy_mj_a"]
                out.append({"first": a, "second": b, "mode": mode, "test_archs": bool(test), "sets": len(d),
                            "median_time_ratio": float(rt.median()), "second_faster_share": float((rt < 1).mean()),
                            "median_energy_ratio": float(re_.median()),
                            "second_less_energy_share": float((re_ < 1).mean())})
    return out


def section_networks_across(gpus: list[GpuData]) -> str:
    """Whole networks measured on two GPUs: which one is faster / uses less energy."""
    recs = networks_across_table(gpus)
    if not recs:
        return ""
    rows = [[f"`{r['second']}` / `{r['first']}`", r["mode"], "test archs" if r["test_archs"] else "training archs",
             r["sets"], fnum(r["median_time_ratio"]), fpct(r["second_faster_share"], 0),
             fnum(r["median_energy_ratio"]), fpct(r["second_less_energy_share"], 0)] for r in recs]
    lines = ["## Whole networks on more than one GPU", "",
             "Same (set, mode) measured on two GPUs; ratio = second / first per set, then the median:", ""]
    lines += [table(["ratio", "mode", "architectures", "sets", "median time ratio", "sets where 2nd is faster",
                     "median energy ratio", "sets where 2nd uses less energy"], rows), ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the same networks on more cards
def _run_name(file: str) -> str:
    """A cards/ row file's run label: ``rows-recard-s33b-0of1.jsonl.gz`` -> ``recard-s33b``."""
    m = re.fullmatch(r"rows-(.+?)(?:-\d+of\d+)?\.jsonl(?:\.gz)?", file)
    return m.group(1) if m else file


def recard_runs(g: GpuData) -> list[tuple[Path, pd.DataFrame, list[float]]]:
    """Each row file of ``g``'s ``cards/`` (networks measured again on another card of the same
    GPU) with its network rows paired with the committed row of the same id (one record per
    network: card, set key, mode, precision, family, new/committed host-free time, energy and power,
    the committed row's card) and the file's idle power readings (W).  Repeat rows are the
    repeatability check, not the measurement, and are left out; a file without a paired row too."""
    from gpurec.sets import SEQ_DATASET_ARCHS, SEQ_TEST_ARCHS

    seq = {*SEQ_DATASET_ARCHS, *SEQ_TEST_ARCHS}
    cards = g.path / "cards"
    nets = ok(g.t("networks"))
    if not cards.exists() or nets.empty or "gpu_energy_mj" not in nets:
        return []
    ref = nets.drop_duplicates("id", keep="last").set_index("id")
    out = []
    for f in raw_row_files(cards):
        rows = list(read_jsonl(f))
        idle = [float(r["idle_power_w"]) for r in rows if r.get("item") == "idle" and "idle_power_w" in r]
        recs = []
        for r in rows:
            if r.get("item") != "network" or r.get("repeat") or r.get("status") != "ok" or r["id"] not in ref.index:
                continue
            o = ref.loc[r["id"]]
            precision = o.get("precision")
            recs.append({"card": str(r.get("gpu_uuid", ""))[:12], "set_key": str(o["set_key"]), "mode": r["mode"],
                         "precision": precision if isinstance(precision, str) and precision else "fp32",
                         "family": "sequence" if r["set_key"].split(":")[0] in seq else "CNN",
                         "time": r["gpu_time_ms"] / o["gpu_time_ms"], "energy": r["gpu_energy_mj"] / o["gpu_energy_mj"],
                         "power": r["gpu_power_w"] / o["gpu_power_w"], "first_card": str(o.get("gpu_uuid", ""))[:12]})
        if recs:
            out.append((f, pd.DataFrame(recs), idle))
    return out


def recard_table(gpus: list[GpuData]) -> list[dict[str, Any]]:
    """Networks measured again on another card of the same GPU (``<gpu>/cards/rows-*``), against
    the committed row of the same id: one record per (card, family, mode) with the median
    new/committed ratio of host-free time, energy and power.  Why: each family was first measured
    on its own cards, so a family's energy offset in the cross-GPU ratio is card or family; on
    one card both families share the card."""
    out: list[dict[str, Any]] = []
    for g in gpus:
        for f, d, idle in recard_runs(g):
            for (card, fam, mode), x in d.groupby(["card", "family", "mode"]):
                out.append({"gpu": g.tag, "file": f.name, "run": _run_name(f.name), "card": card, "family": fam,
                            "mode": mode, "networks": len(x),
                            "first_cards": int(x["first_card"].nunique()),
                            "median_time_ratio": float(x["time"].median()),
                            "median_energy_ratio": float(x["energy"].median()),
                            "median_power_ratio": float(x["power"].median()),
                            "idle_power_w": float(np.median(idle)) if idle else float("nan")})
    return out


def section_cards(gpus: list[GpuData]) -> str:
    """The same networks measured again on other cards: how much a card moves energy."""
    recs = recard_table(gpus)
    if not recs:
        return ""
    rows = [[r["gpu"], f"`{r['card']}`", f"`{r['run']}`", r["family"], r["mode"], r["networks"],
             r["first_cards"],
             fnum(r["median_time_ratio"], 3), fnum(r["median_energy_ratio"], 3), fnum(r["median_power_ratio"], 3),
             fnum(r["idle_power_w"], 1)] for r in recs]
    lines = ["## The same networks on other cards", "",
             "Networks measured again on another card of the same GPU (`<gpu>/cards/`, kept out of the "
             "dataset: same ids), against the committed row of the same id (its first card differs by "
             "family); ratio = new card / committed, host-free time, energy and average power, median:", ""]
    lines += [table(["GPU", "new card", "run", "family", "mode", "networks", "first cards", "time ratio", "energy ratio",
                     "power ratio", "new card idle W"], rows), ""]
    by = (pd.DataFrame(recs).groupby(["gpu", "card", "run", "family"])["median_energy_ratio"].median()
          .unstack("family"))
    if {"CNN", "sequence"} <= set(by.columns):
        gaps = [f"`{card}` ({run}) {100 * (row['CNN'] - row['sequence']):+.1f} pp"
                for (_, card, run), row in by.iterrows()]
        lines += ["On one card, per run, CNN energy ratio minus sequence energy ratio: " + ", ".join(gaps) +
                  ". A gap that repeats on every new card is how much more, relative to a common card, the "
                  "sequence networks' first cards drew than the CNN networks' first cards; two runs on one card "
                  "show how far a card repeats itself.", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- driver
@dataclass
class Context:
    """What every section may read: the loaded GPU folders, the plan, where plots go."""

    gpus: list[GpuData]
    plan: list[dict[str, Any]]
    img: Path
    out_dir: Path
    extract: Callable[..., Any] | None = None
    validation: bool = True
    min_coverage: float = 0.5


# ----------------------------------------------------------------------------- host-free rows
def _hf(df: pd.DataFrame) -> pd.DataFrame:
    """Successful rows measured host-free (schema 2)."""
    df = ok(df)
    return df[num(df, "schema") >= 2] if len(df) else df


def _gm(values: Any) -> float:
    v = [float(x) for x in values if x and float(x) > 0]
    return float(np.exp(np.mean(np.log(v)))) if v else float("nan")


def host_free_counts_table(gpus: list[GpuData], plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per GPU: host-free operation rows against the plan, graph-captured share, host-free
    network rows, training (set, mode) pairs with in-network attribution, runs with host_bench."""
    planned = sum(1 for w in plan if w.get("item") == "op")
    train_sets = {(w["key"], w["mode"]) for w in plan if w.get("item") == "network"}
    out: list[dict[str, Any]] = []
    for g in gpus:
        ops, nets, inn = _hf(g.t("operations")), _hf(g.t("networks")), g.t("in_network")
        covered = {(k, m) for k, m in zip(col(inn, "set_key"), col(inn, "mode"), strict=False)} if len(inn) else set()
        out.append({"gpu": g.tag, "operation_rows": len(ops), "planned_operations": planned,
                    "planned_share": len(ops) / planned if planned else None,
                    "captured_share": float(col(ops, "captured", False).astype(bool).mean()) if len(ops) else None,
                    "network_rows": len(nets), "attributed_training_sets": len(covered & train_sets),
                    "training_sets": len(train_sets),
                    "runs_with_host_bench": sum(1 for p in g.prov if p.get("host_bench"))})
    return out


def _hf_counts(gpus: list[GpuData], plan: list[dict[str, Any]]) -> list[str]:
    rows = [[r["gpu"], f"{r['operation_rows']:,}", f"{r['planned_operations']:,}", fpct(r["planned_share"], 0),
             fpct(r["captured_share"], 1), f"{r['network_rows']}",
             f"{r['attributed_training_sets']} / {r['training_sets']}", f"{r['runs_with_host_bench']}"]
            for r in host_free_counts_table(gpus, plan)]
    return ["| GPU | host-free operation rows | planned | share | captured as a graph | host-free network rows "
            "| training (set, mode) with in-network attribution | runs with host_bench |",
            "|---|---|---|---|---|---|---|---|", *("| " + " | ".join(r) + " |" for r in rows)]


def _bucket(ms: float) -> str:
    return "< 20 µs" if ms < TINY_MS else ("20-300 µs" if ms < HOST_MS else "≥ 300 µs")


def _hf_repeat_pairs(g: GpuData) -> pd.DataFrame:
    reps = _hf(g.t("repeats"))
    main = pd.concat([_hf(g.t("operations")), _hf(g.t("networks"))], ignore_index=True)
    if reps.empty or main.empty:
        return pd.DataFrame()
    main = main.drop_duplicates("id", keep="last").set_index("id")
    out = []
    for _, r in reps.iterrows():
        oid = str(r["id"])[:-4] if str(r["id"]).endswith(":rep") else str(r["id"])
        if oid not in main.index:
            continue
        o = main.loc[oid]
        rec = {"item": o.get("item"), "bucket": _bucket(float(o.get("gpu_time_ms", np.nan)))}
        for c in ("gpu_time_ms", "gpu_energy_mj", "time_ms", "host_ms"):
            a, b = pd.to_numeric(o.get(c), errors="coerce"), pd.to_numeric(r.get(c), errors="coerce")
            rec[c] = abs(a - b) / ((a + b) / 2) if (a + b) else np.nan
        out.append(rec)
    return pd.DataFrame(out)


def host_free_repeatability_tables(gpus: list[GpuData]) -> dict[str, list[dict[str, Any]]]:
    """Repeat pairs of host-free operation rows per GPU and GPU-time bucket (median relative
    difference and share within 3%), and per GPU the networks' eager time on two machines and
    host-free time over the in-network kernel sum."""
    ops_out: list[dict[str, Any]] = []
    for g in gpus:
        p = _hf_repeat_pairs(g)
        if p.empty:
            continue
        p = p[p["item"] == "op"]
        for b in ("< 20 µs", "20-300 µs", "≥ 300 µs"):
            x = p[p["bucket"] == b]
            if x.empty:
                continue
            ops_out.append({"gpu": g.tag, "bucket": b, "pairs": len(x),
                            "gpu_time_median": float(x["gpu_time_ms"].median()),
                            "gpu_time_within": share_true(x["gpu_time_ms"], lambda v: v <= WITHIN),
                            "gpu_energy_median": float(x["gpu_energy_mj"].median()),
                            "gpu_energy_within": share_true(x["gpu_energy_mj"], lambda v: v <= WITHIN),
                            "eager_time_median": float(x["time_ms"].median()),
                            "eager_time_within": share_true(x["time_ms"], lambda v: v <= WITHIN),
                            "host_time_median": float(x["host_ms"].median())})
    nets_out: list[dict[str, Any]] = []
    for g in gpus:
        n = _hf(g.t("networks"))
        if n.empty:
            continue
        a, b = num(n, "time_ms"), num(n, "v1_time_ms")
        d = (a - b).abs() / ((a + b) / 2)
        r = num(n, "gpu_time_ms") / num(n, "in_network_kernel_sum_ms")
        nets_out.append({"gpu": g.tag, "network_rows": len(n), "eager_two_machines_median": float(d.median()),
                         "eager_two_machines_max": float(d.max()), "host_free_over_kernel_sum_median": float(r.median()),
                         "host_free_over_kernel_sum_p10": q(r, 0.1), "host_free_over_kernel_sum_p90": q(r, 0.9)})
    return {"operations": ops_out, "networks": nets_out}


def _hf_repeatability(gpus: list[GpuData]) -> list[str]:
    t = host_free_repeatability_tables(gpus)
    lines = ["### Repeatability: host-free against eager", "",
             "Pairs of the same row measured twice in one run, seconds to minutes apart "
             "(`repeats.parquet`, host-free rows only).  |Δ| is the difference over the pair's mean.", "",
             "| GPU | operation GPU time | pairs | median \\|Δ\\| host-free time | within 3% | median \\|Δ\\| "
             "host-free energy | within 3% | median \\|Δ\\| eager time | within 3% | median \\|Δ\\| host time |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in t["operations"]:
        lines.append(f"| {r['gpu']} | {r['bucket']} | {r['pairs']} | {fpct(r['gpu_time_median'])} | "
                     f"{fpct(r['gpu_time_within'], 0)} | {fpct(r['gpu_energy_median'])} | "
                     f"{fpct(r['gpu_energy_within'], 0)} | {fpct(r['eager_time_median'])} | "
                     f"{fpct(r['eager_time_within'], 0)} | {fpct(r['host_time_median'])} |")
    lines += ["", "Networks, eager time against the eager time an earlier session measured on another machine "
              "of the same kind (`v1_time_ms`), and the host-free time against the CUPTI kernel sum of the "
              "in-network pass on the same machine:", "",
              "| GPU | network rows | median \\|Δ\\| eager, two machines | max | median host-free / kernel sum "
              "| 10th-90th percentile |", "|---|---|---|---|---|---|"]
    for r in t["networks"]:
        lines.append(f"| {r['gpu']} | {r['network_rows']} | {fpct(r['eager_two_machines_median'])} | "
                     f"{fpct(r['eager_two_machines_max'])} | {fnum(r['host_free_over_kernel_sum_median'], 3)} | "
                     f"{fnum(r['host_free_over_kernel_sum_p10'], 3)}-{fnum(r['host_free_over_kernel_sum_p90'], 3)} |")
    return lines


def _isolated_gpu_time(ops: pd.DataFrame) -> pd.Series:
    """Isolated host-free GPU time per (op_signature, mode), to join with in-network rows."""
    return ops.drop_duplicates(["op_signature", "mode"]).set_index(["op_signature", "mode"])["gpu_time_ms"]


def sum_vs_network_table(gpus: list[GpuData]) -> list[dict[str, Any]]:
    """Per GPU, mode and batch: the isolated host-free GPU times of a network's operations summed
    over the network's host-free time (networks whose operations with a host-free row hold at
    least 90% of the in-network kernel time; ``full`` ones have every operation).  A GPU with the
    tables but no such network gets one record with ``networks`` 0 and no mode."""
    out: list[dict[str, Any]] = []
    for g in gpus:
        ops, nets, inn = _hf(g.t("operations")), _hf(g.t("networks")), g.t("in_network")
        if ops.empty or nets.empty or inn.empty:
            continue
        t = _isolated_gpu_time(ops)
        net_t = nets.drop_duplicates("id").set_index("id")
        j = inn.join(t, on=["op_signature", "mode"], how="left")
        recs = []
        for nid, part in j.groupby("network_id"):
            if nid not in net_t.index:
                continue
            have = part["gpu_time_ms"].notna()
            k_all = float(part["kernel_ms"].sum())
            share = float(part.loc[have, "kernel_ms"].sum()) / k_all if k_all > 0 else 0.0
            if share < 0.9:
                continue
            total = float(part.loc[have, "gpu_time_ms"].sum() + part.loc[~have, "kernel_ms"].sum())
            ps = parse_set(str(net_t.loc[nid, "set_key"]))
            recs.append({"mode": net_t.loc[nid, "mode"], "batch": ps[1] if ps else None, "full": bool(have.all()),
                         "ratio": total / float(net_t.loc[nid, "gpu_time_ms"])})
        df = pd.DataFrame(recs)
        for (mode, batch), x in (df.groupby(["mode", "batch"]) if len(df) else []):
            f = x[x["full"]]
            out.append({"gpu": g.tag, "mode": mode, "batch": batch, "full_networks": len(f),
                        "full_median_ratio": float(f["ratio"].median()) if len(f) else float("nan"),
                        "networks": len(x), "median_ratio": float(x["ratio"].median()),
                        "p10_ratio": q(x["ratio"], 0.1), "p90_ratio": q(x["ratio"], 0.9)})
        if df.empty:
            out.append({"gpu": g.tag, "mode": None, "batch": None, "full_networks": 0,
                        "full_median_ratio": float("nan"), "networks": 0, "median_ratio": float("nan"),
                        "p10_ratio": float("nan"), "p90_ratio": float("nan")})
    return out


def _hf_sum_vs_network(gpus: list[GpuData]) -> list[str]:
    lines = ["### Host-free operation sum against the host-free network", "",
             "For each network row, the isolated host-free GPU times of its operations (in the order the "
             "in-network pass lists them) are summed and divided by the network's host-free time.  *Full*: "
             "every operation of the step has a host-free row.  *≥ 90%*: operations holding at least 90% of "
             "the step's in-network kernel time have one; the rest enter at their in-network kernel time, so "
             "this column leans towards 1.", "",
             "| GPU | mode | batch | networks, full | median sum / network, full | networks, ≥ 90% | "
             "median, ≥ 90% | 10th-90th percentile, ≥ 90% |", "|---|---|---|---|---|---|---|---|"]
    for r in sum_vs_network_table(gpus):
        if r["mode"] is None:
            lines.append(f"| {r['gpu']} | — | — | 0 | — | 0 | — | — |")
            continue
        lines.append(f"| {r['gpu']} | {r['mode']} | {r['batch']} | {r['full_networks']} | "
                     f"{fnum(r['full_median_ratio'], 3)} | {r['networks']} | {fnum(r['median_ratio'], 3)} | "
                     f"{fnum(r['p10_ratio'], 3)}-{fnum(r['p90_ratio'], 3)} |")
    return lines


def in_network_vs_isolated_table(gpus: list[GpuData]) -> list[dict[str, Any]]:
    """Per GPU and operation kind (the 15 kinds with most pairs): an operation's in-network
    kernel time over its isolated host-free GPU time (median and quartiles)."""
    out: list[dict[str, Any]] = []
    for g in gpus:
        ops, inn = _hf(g.t("operations")), g.t("in_network")
        if ops.empty or inn.empty:
            continue
        j = inn.join(_isolated_gpu_time(ops), on=["op_signature", "mode"], how="inner")
        j = j[(j["gpu_time_ms"] > 0) & (j["kernels"] > 0)]
        j = j.assign(r=j["kernel_ms"] / j["gpu_time_ms"])
        for kind, x in sorted(j.groupby("op_kind"), key=lambda kv: -len(kv[1]))[:15]:
            out.append({"gpu": g.tag, "kind": kind, "pairs": len(x), "median_ratio": float(x["r"].median()),
                        "p25_ratio": q(x["r"], 0.25), "p75_ratio": q(x["r"], 0.75)})
    return out


def _hf_in_network_vs_isolated(gpus: list[GpuData]) -> list[str]:
    lines = ["### In-network kernel time against isolated host-free time, per operation kind", "",
             "Each operation inside a real network step (CUPTI kernel sum of that operation) over the same "
             "(operation, mode) measured alone as a CUDA graph.  Isolated runs rotate several weight copies "
             "so weights come from DRAM; inside a network the previous layer's output may still sit in L2.", "",
             "| GPU | kind | pairs | median in-network / isolated | 25th-75th percentile |", "|---|---|---|---|---|"]
    for r in in_network_vs_isolated_table(gpus):
        lines.append(f"| {r['gpu']} | {r['kind']} | {r['pairs']} | {fnum(r['median_ratio'], 3)} | "
                     f"{fnum(r['p25_ratio'], 3)}-{fnum(r['p75_ratio'], 3)} |")
    return lines


def _hf_host_bench(gpus: list[GpuData]) -> list[str]:
    lines = ["### The host benchmark across and within runs", "",
             "`host_bench` is measured at each run's start and `host_bench_end` at its end (`gpurec host-bench`): "
             "tiny-kernel launch cost, a pure-Python loop, and the geometric mean of the dispatch costs of "
             "the fixed call set (CPU tensors and, on these GPU hosts, CUDA tensors).", "",
             "| GPU | run | launch µs start → end | Python loop µs start → end | CPU dispatch gm µs | "
             "CUDA dispatch gm µs start → end |", "|---|---|---|---|---|---|"]
    for g in gpus:
        for p in g.prov:
            a, b = p.get("host_bench") or {}, p.get("host_bench_end") or {}
            if not a.get("dispatch_cpu_us"):
                continue
            lines.append(
                f"| {g.tag} | {p.get('run_id')} | {fnum(a.get('launch_us'))} → {fnum(b.get('launch_us'))} | "
                f"{fnum(a.get('python_loop_us'), 1)} → {fnum(b.get('python_loop_us'), 1)} | "
                f"{fnum(_gm((a.get('dispatch_cpu_us') or {}).values()))} | "
                f"{fnum(_gm((a.get('dispatch_cuda_us') or {}).values()))} → "
                f"{fnum(_gm((b.get('dispatch_cuda_us') or {}).values()))} |")
    return lines


def section_host_free(c: Context) -> str:
    lines = ["## The GPU apart from the host (host-free rows)", "",
             "Rows of `schema` 2 measure each step three ways: eager (`time_ms`, and `host_ms`, the CPU time to "
             "enqueue one call with no synchronisation), host-free (`gpu_time_ms`, `gpu_power_w`, "
             "`gpu_energy_mj`: the step captured once as a CUDA graph and replayed, timed with CUDA events over "
             "several blocks, inside an energy window aligned to the counter's updates), and for networks an "
             "in-network pass under `torch.profiler` that attributes every kernel and every operation's host "
             "time (`gpurec.load_dataset(table=\"in_network\")`).  A window whose power is outside [idle, power "
             "limit] is measured again over a window three times as long and flagged `gpu_power_out_of_range` "
             "if it stays outside.  `gpu_nvml_power_1s_avg_w` is NVML's instantaneous reading, which on Hopper "
             "is a one-second average: kept for diagnosis, never used for energy.", "",
             *_hf_counts(c.gpus, c.plan), ""]
    for g in c.gpus:
        ops = _hf(g.t("operations"))
        if len(ops):
            flag = col(ops, "gpu_power_out_of_range", False).fillna(False).astype(bool)
            lines.append(f"`{g.tag}`: {int(flag.sum())} of {len(ops):,} host-free operation rows stayed outside "
                         f"[idle, power limit] after the longer window ({fpct(flag.mean(), 2)}); "
                         f"{int(col(ops, 'gpu_window_retried', False).fillna(False).astype(bool).sum())} were "
                         "measured again.")
    lines += ["", *_hf_repeatability(c.gpus), "", *_hf_sum_vs_network(c.gpus), "",
              *_hf_in_network_vs_isolated(c.gpus), "", *_hf_host_bench(c.gpus), ""]
    return "\n".join(lines)


SEQUENCE_KINDS_TARGET = 3000  # host-free H100 operation rows of SEQUENCE_KINDS that issue 22 asks for


def sequence_kind_counts(gpus: list[GpuData]) -> pd.DataFrame:
    """Host-free operation rows of gpurec.sets.SEQUENCE_KINDS per GPU, kind and precision (fp32
    where unset)."""
    from gpurec.sets import SEQUENCE_KINDS

    parts = []
    for g in gpus:
        ops = _hf(g.t("operations"))
        if not len(ops):
            continue
        ops = ops[scol(ops, "op_kind").isin(SEQUENCE_KINDS)]
        parts.append(pd.DataFrame({"gpu": g.tag, "op_kind": scol(ops, "op_kind"),
                                   "precision": col(ops, "precision", "fp32").fillna("fp32").astype(str)}))
    if not parts:
        return pd.DataFrame(columns=["gpu", "op_kind", "precision", "rows"])
    return pd.concat(parts).groupby(["gpu", "op_kind", "precision"]).size().rename("rows").reset_index()


def section_sequence_kinds(c: Context) -> str:
    from gpurec.sets import SEQUENCE_KINDS

    counts = sequence_kind_counts(c.gpus)
    lines = ["## Operation kinds of sequence models", "",
             "Host-free operation rows of the kinds transformers and recurrent networks run and the torchvision "
             f"sets do not ({', '.join(f'`{k}`' for k in SEQUENCE_KINDS)}), per GPU and precision.  Target "
             f"(issue 22): at least {SEQUENCE_KINDS_TARGET:,} on the H100.", ""]
    if not len(counts):
        return "\n".join([*lines, "None collected yet.", ""])
    wide = counts.pivot_table(index="op_kind", columns=["gpu", "precision"], values="rows", fill_value=0)
    wide = wide.reindex([k for k in SEQUENCE_KINDS if k in wide.index])
    heads = [f"{g} {p}" for g, p in wide.columns]
    lines += ["| kind | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    lines += [f"| `{k}` | " + " | ".join(f"{int(v):,}" for v in r) + " |" for k, r in wide.iterrows()]
    lines.append("| all | " + " | ".join(f"{int(v):,}" for v in wide.sum(axis=0)) + " |")
    h100 = int(counts.loc[counts["gpu"] == "h100", "rows"].sum())
    met = "met" if h100 >= SEQUENCE_KINDS_TARGET else "NOT met"
    lines += ["", f"H100: {h100:,} rows of these kinds, every precision — target **{met}**.", ""]
    return "\n".join(lines)


def _validation(c: Context) -> str:
    if not c.validation:
        return "## First validation: sum of operations vs whole network\n\nSkipped (`validation=False`).\n"
    return section_validation(c.gpus, c.plan, c.img, c.out_dir, c.extract, c.min_coverage)


# The README's sections in order: (name, renderer).  A new section is one function returning
# Markdown (or "" to leave it out) and one entry here.
SECTIONS: list[tuple[str, Callable[[Context], str]]] = [
    ("overview", lambda c: section_overview(c.gpus, c.plan) + "\n"),
    ("layout", lambda c: section_layout(c.gpus)),
    ("columns", lambda c: section_columns(c.gpus)),
    ("loading", lambda c: section_loading()),
    ("provenance", lambda c: section_provenance(c.gpus)),
    ("rows", lambda c: section_rows(c.gpus, c.plan, c.img, c.out_dir)),
    ("repeatability", lambda c: section_repeatability(c.gpus, c.img, c.out_dir)),
    ("probe", lambda c: section_probe(c.gpus, c.img, c.out_dir)),
    ("validation", _validation),
    ("power", lambda c: section_power(c.gpus, c.img, c.out_dir)),
    ("networks_across", lambda c: section_networks_across(c.gpus)),
    ("cards", lambda c: section_cards(c.gpus)),
    ("host_free", section_host_free),
    ("sequence_kinds", section_sequence_kinds),
]


def generate(root: Path | str = "datasets", out: Path | str | None = None, img: Path | str | None = None,
             plan_path: Path | str | None = None, extract: Callable[..., Any] | None = None,
             validation: bool = True, min_coverage: float = 0.5,
             progress: Callable[[str], None] | None = None) -> str:
    """Write the README (and plots) for the datasets under ``root``; return its text.
    ``progress`` hears the name of each section as it starts."""
    root = Path(root)
    out = Path(out) if out is not None else root / "README.md"
    img = Path(img) if img is not None else out.parent / "img"
    plan_path = Path(plan_path) if plan_path is not None else root / "plans" / "main.json"
    ctx = Context(load_all(root), load_plan(plan_path), img, out.parent, extract, validation, min_coverage)
    for name in PLOTS:  # never leave a plot of an earlier run that this run did not redraw
        (img / name).unlink(missing_ok=True)
    parts = [
        "# gpurec dataset",
        "",
        "<!-- Generated by `gpurec report dataset`; do not edit by hand. -->",
        "_Generated by `gpurec report dataset` from the files below; every number is computed from the data._",
        "",
    ]
    for name, render in SECTIONS:
        if progress:
            progress(f"  dataset section {name}")
        parts.append(render(ctx))
    text = "\n".join(p for p in parts if p is not None).rstrip() + "\n"
    atomic_write_text(out, text)
    return text
