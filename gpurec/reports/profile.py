"""`gpurec profile` device runs -> docs/profile_results.md (+ docs/img/profile_h100_*.png).

    gpurec report profile

Inputs (all in the repository): datasets/h100/profile/{profile_results.tar.gz,profile_log.txt}
(the 12 H100 profile runs: resnet50, vit_b_16, convnext_tiny x batch 8, 64 x inference,
training), datasets/h200/profile/ (the earlier batch-8 H200 runs, a secondary comparison), and the
full ncu profiles that check the per-config sampling: tests/fixtures/profile/real/ (H200) and
datasets/h100/profile/full_profile_results.tar.gz (+ full_profile_log.txt).
Tarballs are extracted to a temporary folder and every run is re-analysed with the current
gpurec.profile.analyze; nothing in the document is typed in by hand.

Writes docs/profile_results.md, docs/img/profile_h100_*.png and
datasets/h100/profile/runs/<run>.json (each H100 run's result without the per-kernel rows).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import tarfile
import tempfile
from pathlib import Path
from statistics import mean
from typing import Any

from gpurec.dataset.store import atomic_write_text
from gpurec.profile.analysis import ProfileResult, analyze
from gpurec.profile.ncu_parse import first_launch_per_config
from gpurec.profile.report import save_plots
from gpurec.reports.markdown import table

# Inputs, relative to the repository root given to generate().
FIXTURE = Path("tests") / "fixtures" / "profile" / "real"
FULL_TAR = Path("datasets") / "h100" / "profile" / "full_profile_results.tar.gz"  # profiled with --ncu-sampling all
FULL_LOG = Path("datasets") / "h100" / "profile" / "full_profile_log.txt"
MODELS = ("resnet50", "vit_b_16", "convnext_tiny")
LABEL = {"resnet50": "ResNet-50", "vit_b_16": "ViT-B/16", "convnext_tiny": "ConvNeXt-T"}
ORDER = [(m, b, mode) for b in (8, 64) for mode in ("inference", "training") for m in MODELS]
UTILS = ("smsp_active_util", "smsp_issue_util", "tc_active_util", "tc_issue_util")
UTIL_NAME = {"smsp_active_util": "SMSP active", "smsp_issue_util": "SMSP issue slot",
             "tc_active_util": "TC active", "tc_issue_util": "TC issue slot"}
PLOT_RUN = ("resnet50", 64, "training")           # per-run plots from gpurec.profile.save_plots
LAYER_RUNS = [("resnet50", 64, "training"), ("vit_b_16", 64, "training")]
# cuBLAS/CUTLASS FP32 (non-tensor-core) matrix-product kernels, by name
FP32_GEMM = re.compile(r"sgemm|gemm_f32f32|gemmSN", re.IGNORECASE)
SEED_ISSUE_BOUND = 0.50   # seed: average SMSP issue-slot utilization below 50 %
SEED_TC_BOUND = 0.052     # seed: TC issue-slot utilization below 5.2 % of issue opportunities

Key = tuple[str, int, str]


# -- formatting ----------------------------------------------------------------------------------

def ok(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def f(x: Any, spec: str = ".1f", na: str = "n/a") -> str:
    return format(float(x), spec) if ok(x) else na


def pct(x: Any, digits: int = 1) -> str:
    return f"{100 * float(x):.{digits}f} %" if ok(x) else "n/a"


def rng(values: list[float], digits: int = 1) -> str:
    """'a–b %' of a list of fractions (one value: 'a %')."""
    v = [x for x in values if ok(x)]
    if not v:
        return "n/a"
    lo, hi = min(v), max(v)
    return pct(lo, digits) if f"{100 * lo:.{digits}f}" == f"{100 * hi:.{digits}f}" else \
        f"{100 * lo:.{digits}f}–{100 * hi:.{digits}f} %"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def holds(b: bool) -> str:
    return "**holds**" if b else "**does not hold**"


def lab(k: Key) -> str:
    return f"{LABEL[k[0]]} bs{k[1]} {k[2]}"


def run_name(k: Key) -> str:
    return f"{k[0]}_bs{k[1]}_{k[2]}"


def finite(x: Any) -> Any:
    """NaN/inf -> None, so the run JSON is strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


# -- loading -------------------------------------------------------------------------------------

def load_runs(root: Path, gpu: str, tmp: Path, write_json: bool) -> dict[Key, dict[str, Any]]:
    """Re-analyse every run in <root>/datasets/<gpu>/profile/profile_results.tar.gz."""
    tar_path = root / "datasets" / gpu / "profile" / "profile_results.tar.gz"
    out: dict[Key, dict[str, Any]] = {}
    if not tar_path.exists():
        return out
    dest = tmp / gpu
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar_path) as tf:
        tf.extractall(dest, filter="data")
    runs_dir = root / "datasets" / gpu / "profile" / "runs"
    for k in ORDER:
        d = dest / run_name(k)
        if not (d / "trace.json.gz").exists():
            continue
        old = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else {}
        meta = json.loads((d / "worker_trace.json").read_text())
        # ncu_sampling is set by profile_network after the trace worker wrote worker_trace.json
        if (old.get("meta") or {}).get("ncu_sampling"):
            meta["ncu_sampling"] = old["meta"]["ncu_sampling"]
        ncu = d / "ncu.csv"
        r = analyze(d / "trace.json.gz", ncu if ncu.exists() else None, meta)
        r.ncu_error = r.ncu_error or old.get("ncu_error")
        src = r.kernels["source"].value_counts().to_dict()
        wn = d / "worker_ncu.json"
        ncu_wall_ms = json.loads(wn.read_text()).get("profiled_step_wall_ms") if wn.exists() else None
        run = {"key": k, "dir": d, "result": r, "it": r.iteration, "meta": r.meta, "mt": r.matching,
               "has_ncu": bool(r.matching), "sources": {str(a): int(b) for a, b in src.items()},
               "ncu_wall_s": ncu_wall_ms / 1e3 if ncu_wall_ms else None,
               "sampling": (r.meta.get("ncu_sampling") or "all") if r.matching else None}
        out[k] = run
        if write_json:
            j = r.to_json()
            slim = {a: b for a, b in j.items() if a not in ("kernels", "files")}
            if run["sampling"] == "per-config":
                # unmatched trace kernels are mostly the imputed repeats: list only those left without counters
                kept = set(r.kernels.index[r.kernels["source"] == "trace"])
                m = dict(slim["matching"])
                m["n_unmatched_trace_imputed"] = sum(1 for e in m["unmatched_trace"] if e["index"] not in kept)
                m["unmatched_trace"] = [e for e in m["unmatched_trace"] if e["index"] in kept]
                slim["matching"] = m
            slim["kernel_sources"] = run["sources"]
            slim["ncu_profiled_iteration_wall_s"] = run["ncu_wall_s"]
            slim["source"] = (f"{tar_path.relative_to(root).as_posix()}:{d.name}/ re-analysed with "
                              "gpurec.profile.analyze by `gpurec report profile` (per-kernel rows left out)")
            atomic_write_text(runs_dir / f"{d.name}.json", json.dumps(finite(slim), indent=1, allow_nan=False) + "\n")
    return out


def _per_config_check(label: str, trace: Path, ncu: Path, meta: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """One full profile vs its first-launch-per-configuration subset, imputed."""
    text = gzip.open(ncu, "rt").read() if ncu.suffix == ".gz" else ncu.read_text()
    full = analyze(trace, ncu, meta)
    sampled_csv = tmp / f"per_config_{len(list(tmp.glob('per_config_*')))}.csv"
    sampled_csv.write_text(first_launch_per_config(text))
    sampled = analyze(trace, sampled_csv, {**meta, "ncu_sampling": "per-config"})
    rows = {u: (full.iteration[u], sampled.iteration[u]) for u in UTILS}
    return {"label": label, "meta": meta, "full": full, "sampled": sampled, "rows": rows,
            "max_rel": max(abs(s - fu) / fu for fu, s in rows.values() if fu)}


def sampling_checks(root: Path, tmp: Path) -> list[dict[str, Any]]:
    """Every full ncu profile in the repository against its per-config subset: the H200 test
    fixture (inference) and the H100 full-sampling runs (training) of full_profile_results.tar.gz."""
    checks = []
    fixture, full_tar = root / FIXTURE, root / FULL_TAR
    ncu = next((p for p in (fixture / "ncu.csv", fixture / "ncu.csv.gz") if p.is_file()), None)
    if (fixture / "trace.json.gz").is_file() and ncu is not None and (fixture / "meta.json").is_file():
        checks.append(_per_config_check("`tests/fixtures/profile/real/`", fixture / "trace.json.gz", ncu,
                                        json.loads((fixture / "meta.json").read_text()), tmp))
    if full_tar.exists():
        dest = tmp / "full"
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(full_tar) as tf:
            tf.extractall(dest, filter="data")
        for k in ORDER:
            d = dest / run_name(k)
            if (d / "trace.json.gz").exists() and (d / "ncu.csv").exists():
                checks.append(_per_config_check(f"`{FULL_TAR.as_posix()}`", d / "trace.json.gz",
                                                d / "ncu.csv", json.loads((d / "worker_trace.json").read_text()),
                                                tmp) | {"key": k})
    return checks


def log_facts(log: str) -> dict[str, Any]:
    """Software versions, clocks and per-call run lines from profile_log.txt."""
    facts: dict[str, Any] = {}
    m = re.search(r"^python (\S+) torch (\S+) torchvision (\S+) cuda (\S+) gpu (.+)$", log, re.M)
    if m:
        facts.update(python=m.group(1), torch=m.group(2), torchvision=m.group(3), cuda=m.group(4), gpu=m.group(5))
    m = re.search(r"^Version (\S+) \(build", log, re.M)
    facts["ncu"] = m.group(1) if m else None
    m = re.search(r"^[^,\n]+, \d+ MHz, (\d+) MHz, [\d.]+ W, \d+$", log, re.M)
    facts["max_sm_mhz"] = int(m.group(1)) if m else None
    facts["n_calls"] = len(re.findall(r"^### device call", log, re.M))
    # per run: (ncu on/off, iteration ms, GPU %) of every time it ran, in log order
    repeats: dict[str, list[tuple[bool, float, float]]] = {}
    for block in re.split(r"\n(?=\[[\d:]+ \+\d+s\] \[\d+/\d+\] \S+: start)", log):
        s = re.match(r"\[[\d:]+ \+\d+s\] \[\d+/\d+\] (\w+?)_bs(\d+)_(\w+): start \((ncu on|ncu --no-ncu)", block)
        if not s:
            continue
        row = re.search(rf"^{s.group(1)} bs{s.group(2)} {s.group(3)}\s+([\d.]+)\s+[\d.]+\s+([\d.]+)", block, re.M)
        if row:
            repeats.setdefault(f"{s.group(1)}_bs{s.group(2)}_{s.group(3)}", []).append(
                (s.group(4) == "ncu on", float(row.group(1)), float(row.group(2))))
    facts["repeats"] = repeats
    # the card (NVML UUID) of each device call, and the card of each run's last call
    card_of_run: dict[str, str] = {}
    for call in re.split(r"^(?=### device call)", log, flags=re.M):
        uuid = re.search(r"\(UUID: (GPU-[0-9a-f-]+)\)", call)
        for name in re.findall(r"\] (\w+_bs\d+_\w+): start", call):
            card_of_run[name] = uuid.group(1) if uuid else "?"
    facts["card_of_run"] = card_of_run
    return facts


# -- plots ---------------------------------------------------------------------------------------

LEVELS = [("GPU", "gpu_utilization"), ("SMSP active", "smsp_active_util_of_iteration"),
          ("SMSP issue", "smsp_issue_util_of_iteration"), ("TC active", "tc_active_util_of_iteration"),
          ("TC issue", "tc_issue_util_of_iteration")]


def levels_plot(runs: dict[Key, dict[str, Any]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 1, sharey=True)
    colors = ["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974"]
    width = 0.8 / len(LEVELS)
    for ax, mode in zip(axes, ("inference", "training"), strict=True):
        keys = [(m, b, mode) for m in MODELS for b in (8, 64)]
        for i, (name, key) in enumerate(LEVELS):
            ys = [100 * float(runs[k]["it"][key]) if k in runs and ok(runs[k]["it"].get(key)) else 0.0 for k in keys]
            xs = [j + (i - 2) * width for j in range(len(keys))]
            ax.bar(xs, ys, width, label=name, color=colors[i])
            if i >= 3:  # the small tensor-core bars get their value written on top
                for x, y in zip(xs, ys, strict=True):
                    if y > 0:
                        ax.text(x, y + 1.5, f"{y:.1f}", ha="center", fontsize=6, rotation=90)
        for j, k in enumerate(keys):
            if k in runs and not runs[k]["has_ncu"]:
                ax.text(j + 0.1, 8, "no counters\n(trace only)", ha="center", fontsize=7, color="0.3")
        ax.set_xticks(range(len(keys)), [f"{LABEL[m]} bs{b}" for m, b, _ in keys], fontsize=8)
        ax.set_ylabel("% of iteration time")
        ax.set_ylim(0, 105)
        ax.set_title(mode, fontsize=9, loc="left")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=5, loc="upper left")
    gpu = next(iter(runs.values()))["meta"].get("device_name", "")
    fig.suptitle(f"Multi-level utilization of one iteration, {gpu}, fp32 (SMSP/TC = within-kernel ratio "
                 "x GPU kernel utilization)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def batch_plot(runs: dict[Key, dict[str, Any]], path: Path) -> None:
    """GPU utilization and framework overhead at batch 8 vs 64, traced and untraced."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8))
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    pairs = [(m, mode) for mode in ("inference", "training") for m in MODELS]
    xs = range(len(pairs))
    w = 0.2
    for i, (b, hatch) in enumerate(((8, ""), (64, "//"))):
        util = [100 * float(runs[(m, b, mode)]["it"]["gpu_utilization"]) if (m, b, mode) in runs else 0.0
                for m, mode in pairs]
        unt = [100 * untraced_util(runs[(m, b, mode)]) if (m, b, mode) in runs else 0.0 for m, mode in pairs]
        ax1.bar([x + (2 * i - 1.5) * w for x in xs], util, w, hatch=hatch, color="#4c72b0",
                label=f"bs{b} traced")
        ax1.bar([x + (2 * i - 0.5) * w for x in xs], unt, w, hatch=hatch, color="#dd8452",
                label=f"bs{b} untraced (est.)")
        share = [100 * float(runs[(m, b, mode)]["it"]["framework_overhead_ms"]) /
                 float(runs[(m, b, mode)]["it"]["total_time_ms"]) if (m, b, mode) in runs else 0.0
                 for m, mode in pairs]
        ax2.bar([x + (i - 0.5) * 2 * w for x in xs], share, 2 * w, hatch=hatch, color="#c44e52", label=f"bs{b}")
    for ax in (ax1, ax2):
        ax.set_xticks(list(xs), [f"{LABEL[m]}\n{mode}" for m, mode in pairs], fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_ylim(0, 128)
        ax.set_yticks(range(0, 101, 20))
        ax.legend(fontsize=7, ncol=2, loc="upper center")
    ax1.set_ylabel("GPU utilization (%)")
    ax2.set_ylabel("framework overhead (% of traced iteration)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- derived numbers -----------------------------------------------------------------------------

def untraced_util(run: dict[str, Any]) -> float:
    """GPU busy time over the iteration time measured without the profiler (capped at 1)."""
    it = run["it"]
    u = float(run["meta"].get("untraced_iteration_ms") or math.nan)
    return min(1.0, float(it["gpu_busy_time_ms"]) / u) if ok(u) and u > 0 else math.nan


def layer_row(run: dict[str, Any], layer_type: str) -> dict[str, Any]:
    lt = run["result"].layer_types
    sel = lt[lt["layer_type"] == layer_type]
    return sel.iloc[0].to_dict() if len(sel) else {}


def fp32_gemm_share(run: dict[str, Any], layer_type: str = "Linear") -> float:
    k = run["result"].kernels
    k = k[k["layer_type"] == layer_type]
    tot = float(k["time_ms"].sum())
    return float(k.loc[k["name"].astype(str).str.contains(FP32_GEMM), "time_ms"].sum()) / tot if tot else math.nan


def phase_row(run: dict[str, Any], phase: str) -> dict[str, Any]:
    ph = run["result"].phases
    sel = ph[ph["phase"] == phase]
    return sel.iloc[0].to_dict() if len(sel) else {}


# -- document ------------------------------------------------------------------------------------

def header(L: list[str], runs: dict[Key, dict[str, Any]], facts: dict[str, Any],
           checks: list[dict[str, Any]]) -> None:
    w = L.append
    any_run = next(iter(runs.values()))
    meta = any_run["meta"]
    gpu = meta.get("device_name", "?")
    with_ncu = [k for k in ORDER if k in runs and runs[k]["has_ncu"]]
    no_ncu = [k for k in ORDER if k in runs and not runs[k]["has_ncu"]]
    missing = [k for k in ORDER if k not in runs]
    samplings = sorted({runs[k]["sampling"] for k in with_ncu})
    ncu_cmd = next((runs[k]["dir"] / "ncu.log" for k in with_ncu if (runs[k]["dir"] / "ncu.log").exists()), None)
    cmd = ncu_cmd.read_text().splitlines()[0] if ncu_cmd else ""
    clock_ctl = re.search(r"--clock-control (\S+)", cmd)
    clocks = [float(runs[k]["it"]["sm_clock_mhz_weighted"]) for k in with_ncu if ok(runs[k]["it"].get("sm_clock_mhz_weighted"))]
    cv = meta.get("cudnn_version")
    cudnn = f"{cv // 10000}.{cv % 10000 // 100}.{cv % 100}" if isinstance(cv, int) and cv >= 10000 else cv

    w(f"# `gpurec profile` results on the {gpu.replace('NVIDIA ', '')} vs the seed's takeaways\n")
    w("_Generated by `gpurec report profile` from `datasets/h100/profile/` "
      "(`profile_results.tar.gz`, `profile_log.txt`); every run is re-analysed with the current "
      "`gpurec.profile.analyze` and written, without per-kernel rows, to `datasets/h100/profile/runs/<run>.json`. "
      "The batch-8 H200 runs of `datasets/h200/profile/` are compared at the end._\n")
    w(f"**Setup.** {gpu}, python {facts.get('python', meta.get('python'))}, torch {meta.get('torch_version')}, "
      f"torchvision {meta.get('torchvision_version')}, CUDA {meta.get('cuda_version')}, cuDNN {cudnn}, "
      f"Nsight Compute {facts.get('ncu') or '?'}; precision {meta.get('precision')} with PyTorch's default flags "
      "(cuDNN may use TF32 for convolutions, matrix products stay FP32: `allow_tf32=False`), 224 px inputs. "
      f"Clocks not locked (`--clock-control {clock_ctl.group(1) if clock_ctl else '?'}`): the SM clock "
      f"read from the counters was {f(min(clocks), ',.0f')}–{f(max(clocks), ',.0f')} MHz (max. "
      f"{facts.get('max_sm_mhz') or '?'} MHz). The runs came from {facts.get('n_calls')} device calls; the "
      "tarball holds the last result of each run" + cards_note(runs, facts) + ".\n")
    w(f"**What ran.** {len(runs)} of the 12 runs, {len(with_ncu)} with hardware counters"
      + (", " + ", ".join(lab(k) for k in no_ncu) + " trace-only: the device time ran out before its ncu pass "
         "(its log lines say `ncu --no-ncu`), so it has GPU utilization and overhead but no SMSP/TC numbers"
         if no_ncu else "")
      + (". Missing: " + ", ".join(lab(k) for k in missing) if missing else "") + ".\n")
    imp = [float(runs[k]["it"]["imputed_time_share"]) for k in with_ncu if ok(runs[k]["it"].get("imputed_time_share"))]
    n_prof = sum(int(runs[k]["mt"]["n_ncu"]) for k in with_ncu)
    n_tr = sum(int(runs[k]["mt"]["n_trace"]) for k in with_ncu)
    w(f"**Counter sampling: `{', '.join(samplings)}`.** " + (
        "ncu profiled only the first launch of each distinct (kernel, grid, block) launch configuration "
        "(`--filter-mode per-launch-config --launch-count 1`); the counters of the repeated launches are "
        "imputed offline from that launch (utilizations copied, cycle counts scaled by duration; "
        "`gpurec/profile/metrics.py::merge_kernels`). "
        f"Over the {len(with_ncu)} runs ncu profiled {n_prof} of {n_tr} kernels ({pct(n_prof / n_tr, 0)}); the "
        f"imputed share of kernel time is {rng(imp, 0)} per run (column *imputed*)." if "per-config" in samplings
        else "every kernel of the iteration was profiled.") + "\n")
    if checks:
        sampling_section(L, runs, checks, facts)


def sampling_section(L: list[str], runs: dict[Key, dict[str, Any]], checks: list[dict[str, Any]],
                     facts: dict[str, Any]) -> None:
    """Per-config sampling against full profiles: the same iteration reduced, then separate device runs."""
    w = L.append

    def who(m: dict[str, Any]) -> str:
        return f"{LABEL.get(m.get('model'), m.get('model'))} bs{m.get('batch_size')} {m.get('mode')}"

    rows, rels = [], []
    for c in checks:
        cells = []
        for a, b in c["rows"].values():
            rels.append((b - a) / a if a else math.nan)
            cells.append(f"{pct(a, 2)} → {pct(b, 2)} ({100 * (b - a) / a:+.1f} %)" if a else "n/a")
        rows.append([who(c["meta"]), str(c["meta"].get("device_name", "?")).replace("NVIDIA ", ""), c["label"],
                     f"{c['full'].matching['n_ncu']} → {c['sampled'].matching['n_ncu']}",
                     pct(c["sampled"].iteration["imputed_time_share"], 0), *cells])
    worst = max(checks, key=lambda c: c["max_rel"])
    n_up = sum(1 for r in rels if r > 0)
    w(f"**Check against full profiles.** {plural(len(checks), 'run')} profiled every kernel "
      "(`--ncu-sampling all`); each is reduced offline to the first launch of each (kernel, grid, block) "
      "and its repeats imputed, which isolates the sampling from run-to-run variation. Within kernel "
      "time, full profile → per-config + imputed:\n")
    w(table(["run", "GPU", "source", "kernels profiled", "imputed time",
             *[UTIL_NAME[u] for u in UTILS]], rows) + "\n")
    w(f"The largest relative difference is {pct(worst['max_rel'])} ({who(worst['meta'])}), "
      + ("within the 10 % that `tests/test_profile.py::test_per_config_sampling_imputes_repeats_close_to_full_profile` "
         "allows on the two committed fixtures" if worst["max_rel"] <= 0.10 else "outside the test's 10 %")
      + f". The imputed value is higher in {n_up} of {len(rels)} cells, so on these runs per-config sampling "
      "reads slightly high, most in relative terms for the small tensor-core numbers.\n")
    pairs = [(c, runs[c["key"]]) for c in checks
             if c.get("key") in runs and runs[c["key"]]["sampling"] == "per-config"]
    if pairs:
        cells = []
        for c, r in pairs:
            d = [(u, float(r["it"][u]), float(c["full"].iteration[u])) for u in UTILS]
            cells.append(f"{who(c['meta'])}: " + ", ".join(
                f"{UTIL_NAME[u]} {pct(b, 2)} vs {pct(a, 2)} ({100 * (a - b) / b:+.1f} %)" for u, a, b in d))
        full_card = re.search(r"\(UUID: (GPU-[0-9a-f-]+)\)", facts.get("full_log", ""))
        cards = {facts.get("card_of_run", {}).get(run_name(c["key"]), "?") for c, _ in pairs}
        where = (f"per-config on `{', '.join(sorted(x[:12] + '…' for x in cards))}`, full on "
                 f"`{full_card.group(1)[:12]}…`" if full_card else "another device call")
        w(f"Against the separate per-config device runs of the table below (another iteration; {where}), "
          "full profile vs per-config run: " + "; ".join(cells) + ".\n")


def cards_note(runs: dict[Key, dict[str, Any]], facts: dict[str, Any]) -> str:
    """Which physical card (NVML UUID in the log) ran the kept result of each run, when there were several."""
    by_card: dict[str, list[Key]] = {}
    for k in ORDER:
        if k in runs:
            by_card.setdefault(facts.get("card_of_run", {}).get(run_name(k), "?"), []).append(k)
    if len(by_card) < 2:
        return ""
    parts = [f"`{card[:12]}…`: {', '.join(lab(k) for k in ks) if len(ks) < 4 else plural(len(ks), 'run')}"
             for card, ks in sorted(by_card.items(), key=lambda kv: -len(kv[1]))]
    return f", on {len(by_card)} different cards of the same model ({'; '.join(parts)})"


def runs_table(L: list[str], runs: dict[Key, dict[str, Any]]) -> None:
    w = L.append
    w("## The 12 runs\n")
    w("*Traced* is the profiled iteration (with torch.profiler and module hooks), *untraced* the same "
      "iteration timed without them; samples/s, GPU utilization, framework overhead (time in the iteration with "
      "no GPU event) and *bubbles* (GPU idle gaps > 2 µs) come from the traced one. SMSP/TC columns are "
      "*within kernel time* (ratios of summed counters, Table 4.1); the plot below multiplies them by the GPU "
      "kernel utilization. *matched* = kernels matched / in the trace / in the ncu report; *without counters* = "
      "trace kernels neither matched nor imputed / ncu kernels left unmatched (their counters still count in "
      "the totals).\n")
    rows = []
    for k in ORDER:
        if k not in runs:
            rows.append([LABEL[k[0]], k[1], k[2], "missing"] + [""] * 13)
            continue
        r = runs[k]
        it, mt, src = r["it"], r["mt"], r["sources"]
        c = r["has_ncu"]
        rows.append([
            LABEL[k[0]], k[1], k[2], f(it.get("total_time_ms"), ".2f"), f(r["meta"].get("untraced_iteration_ms"), ".2f"),
            f(it.get("throughput_samples_per_s"), ",.0f"), pct(it.get("gpu_utilization")),
            f(it.get("framework_overhead_ms"), ".2f"), int(it.get("bubble_count") or 0),
            *([pct(it.get(u), 2 if u == "tc_issue_util" else 1) for u in UTILS] if c else ["n/a"] * 4),
            pct(it.get("imputed_time_share"), 0) if c else "–",
            f"{mt['n_matched']}/{mt['n_trace']}/{mt['n_ncu']}" if c else "no counters",
            f"{src.get('trace', 0)} / {src.get('ncu', 0)}" if c else "–",
        ])
    w(table(["model", "batch", "mode", "iteration ms traced", "untraced ms", "samples/s", "GPU util",
             "framework overhead ms", "bubbles", "SMSP active", "SMSP issue", "TC active", "TC issue", "imputed",
             "matched", "without counters"], rows) + "\n")
    w("![utilization levels per run, % of iteration](img/profile_h100_utilization.png)\n")


def takeaways(L: list[str], runs: dict[Key, dict[str, Any]]) -> None:
    w = L.append
    it = {k: r["it"] for k, r in runs.items()}
    with_ncu = [k for k in ORDER if k in runs and runs[k]["has_ncu"]]
    w("## Against the seed's takeaways\n")

    # 1. SMSP issue-slot utilization below 50 %
    issue = {k: float(it[k]["smsp_issue_util"]) for k in with_ncu}
    issue_it = {k: float(it[k]["smsp_issue_util_of_iteration"]) for k in with_ncu}
    over = [k for k in with_ncu if issue[k] >= SEED_ISSUE_BOUND]
    over_it = [k for k in with_ncu if issue_it[k] >= SEED_ISSUE_BOUND]
    avg = mean(issue.values())
    per_model = []
    for m in MODELS:
        ks = [k for k in with_ncu if k[0] == m]
        if not ks:
            continue
        bad = [k for k in ks if k in over]
        verdict = ("below 50 % in every run" if not bad else "above 50 % in every run" if len(bad) == len(ks)
                   else "above 50 % only in " + ", ".join(f"bs{k[1]} {k[2]}: {pct(issue[k])}" for k in bad))
        per_model.append(f"{LABEL[m]} {rng([issue[k] for k in ks])} ({verdict})")
    verdict = holds(not over) if not over else (
        "**does not hold**" if len(over) == len(with_ncu) else f"**holds for {len(with_ncu) - len(over)} of "
        f"{len(with_ncu)} runs**")
    text = (f"- **Average SMSP issue-slot utilization under 50 %** (seed: ≤ 40 % on A100, < 50 % overall): {verdict}. "
            f"Taken literally, as the average over the {len(with_ncu)} runs with counters, it "
            f"{'holds' if avg < SEED_ISSUE_BOUND else 'does not hold'}: {pct(avg)} within kernel time "
            f"({pct(mean(issue_it.values()))} of the iteration). Per model, within kernel time: "
            + "; ".join(per_model) + ". As a share of the whole iteration "
            + ("every run stays below 50 %" if not over_it else
               "above 50 %: " + ", ".join(f"{lab(k)} {pct(issue_it[k])}" for k in over_it)) + ".")
    over_models = sorted({k[0] for k in over}, key=MODELS.index)
    if over_models:
        parts = []
        for m in over_models:
            k = max((k for k in with_ncu if k[0] == m), key=lambda k: (k[1], k[2] == "training"))
            lin = layer_row(runs[k], "Linear")
            if lin:
                parts.append(f"in {lab(k)}, `nn.Linear` takes {pct(lin['time_share'], 0)} of the kernel time, "
                             f"{pct(fp32_gemm_share(runs[k]), 0)} of it in FP32 GEMM kernels, at "
                             f"{pct(lin['smsp_issue_util'])} SMSP issue and {pct(lin['tc_active_util'])} TC active")
        text += (" Why " + " and ".join(LABEL[m] for m in over_models) + (" exceeds" if len(over_models) == 1
                 else " exceed") + " it: in fp32 with PyTorch's default `allow_tf32=False` the matrix products run "
                 "on the FP32 pipes (cuBLAS/CUTLASS SIMT kernels such as `cutlass_80_simt_sgemm_*` and "
                 "`sm80_xmma_gemm_f32f32_*`), which issue an instruction on most cycles; "
                 + "; ".join(parts) + ". The seed's workloads ran in mixed precision, where the same products "
                 "are a few tensor-core instructions.")
    w(text)

    # 2. TC issue-slot utilization of a few per cent
    tc = {k: float(it[k]["tc_issue_util"]) for k in with_ncu}
    tca = {k: float(it[k]["tc_active_util"]) for k in with_ncu}
    kmax = max(tc, key=tc.get)
    conv = [layer_row(runs[k], "Conv2d") for k in with_ncu if k[0] == "resnet50"]
    lin = [layer_row(runs[k], "Linear") for k in with_ncu]
    lin_tc = [float(x["tc_active_util"]) for x in lin if x and ok(x.get("tc_active_util"))]
    lin_share = [float(layer_row(runs[k], "Linear").get("time_share", math.nan)) for k in with_ncu
                 if k[0] in ("vit_b_16", "convnext_tiny")]
    w(f"- **Tensor-core issue-slot utilization a few per cent** (seed: < 5.2 % of issue opportunities; full "
      f"precision < 1 %): {holds(max(tc.values()) < SEED_TC_BOUND)} — at most {pct(tc[kmax], 2)} ({lab(kmax)}), "
      + ("below 1 % in every run" if max(tc.values()) < 0.01 else
         f"above 1 % in {plural(sum(v >= 0.01 for v in tc.values()), 'run')}")
      + "; per model " + ", ".join(f"{LABEL[m]} {rng([tc[k] for k in with_ncu if k[0] == m], 2)}" for m in MODELS)
      + ". TC *active* utilization: " + ", ".join(f"{LABEL[m]} {rng([tca[k] for k in with_ncu if k[0] == m])}"
                                                for m in MODELS)
      + ". In fp32 only cuDNN's TF32 convolutions use the tensor cores (ResNet-50's Conv2d layers: "
      + rng([float(c["tc_active_util"]) for c in conv if c]) + " TC active), while `nn.Linear`, which carries "
      + rng(lin_share, 0) + " of the ViT's and ConvNeXt-T's kernel time, reaches at most "
      + (pct(max(lin_tc)) if lin_tc else "n/a")
      + ". With TF32 or bf16 (`precision=` of `gpurec profile`) these numbers would change completely.")

    # 3. batch size: GPU utilization grows, framework overhead dominates small batches
    pairs = [(m, mode) for mode in ("inference", "training") for m in MODELS
             if (m, 8, mode) in runs and (m, 64, mode) in runs]
    gu = {k: float(r["it"]["gpu_utilization"]) for k, r in runs.items()}
    grows = [p for p in pairs if gu[(p[0], 64, p[1])] > gu[(p[0], 8, p[1])]]
    ov_share = {k: float(r["it"]["framework_overhead_ms"]) / float(r["it"]["total_time_ms"]) for k, r in runs.items()}
    small = [k for k in ORDER if k in runs and k[1] == 8]
    dominated = [k for k in small if ov_share[k] > 0.5]
    dominated_unt = [k for k in small if 1 - untraced_util(runs[k]) > 0.5]
    big = [k for k in ORDER if k in runs and k[1] == 64]
    thr = {p: float(runs[(p[0], 64, p[1])]["meta"]["untraced_iteration_ms"]) for p in pairs}
    speed = {p: (64 / thr[p]) / (8 / float(runs[(p[0], 8, p[1])]["meta"]["untraced_iteration_ms"])) for p in pairs}
    w(f"- **GPU utilization grows with batch size**: {holds(len(grows) == len(pairs))}"
      + ("" if len(grows) == len(pairs) else f" for {len(grows)} of {len(pairs)} (model, mode) pairs")
      + " — batch 8 → 64: " + "; ".join(
          f"{LABEL[m]} {mode} {pct(gu[(m, 8, mode)])} → {pct(gu[(m, 64, mode)])}" for m, mode in pairs)
      + f". Every batch-64 run keeps the GPU busy at least {pct(min(gu[k] for k in big))} of the traced iteration. "
      f"Throughput without the profiler grows {min(speed.values()):.1f}–{max(speed.values()):.1f}× from batch 8 "
      "to 64 (" + ", ".join(f"{LABEL[m]} {mode} {speed[(m, mode)]:.1f}×" for m, mode in pairs) + ").")
    def verdict_n(n: int, of: int) -> str:
        return holds(n == of) if n in (0, of) else f"**holds for {n} of {of} batch-8 runs**"

    w("- **Framework overhead dominates small batches** (more than half the iteration without GPU work): "
      + verdict_n(len(dominated), len(small)) + " on the traced iteration, "
      + verdict_n(len(dominated_unt), len(small)).replace("**", "") + " on the untraced timing"
      + " — framework overhead (GPU idle time) is " + ", ".join(
          f"{lab(k)} {f(it[k]['framework_overhead_ms'], '.1f')} ms = {pct(ov_share[k], 0)}" for k in small)
      + " of the traced iteration"
      + (("; the exceptions are " + " and ".join(lab(k) for k in small if k not in dominated)
          + ", whose few long kernels keep the GPU busy") if dominated and len(dominated) < len(small) else "")
      + f". At batch 64 it falls to {rng([ov_share[k] for k in big], 0)}. Timed without the profiler "
      "(GPU busy time over the untraced iteration; see the caveat below) the idle share at batch 8 is smaller: "
      + ", ".join(f"{lab(k)} ~{pct(1 - untraced_util(runs[k]), 0)}" for k in small)
      + (f" — more than half the iteration for {', '.join(lab(k) for k in dominated_unt)}"
         if dominated_unt else " — below half the iteration in every run") + ".")

    # 4. training vs inference
    tpairs = [(m, b) for b in (8, 64) for m in MODELS if (m, b, "inference") in runs and (m, b, "training") in runs]
    both_c = [p for p in tpairs if runs[(p[0], p[1], "inference")]["has_ncu"] and runs[(p[0], p[1], "training")]["has_ncu"]]
    d_issue = [abs(issue[(m, b, "training")] - issue[(m, b, "inference")]) for m, b in both_c]
    d_act = [abs(float(it[(m, b, "training")]["smsp_active_util"]) - float(it[(m, b, "inference")]["smsp_active_util"]))
             for m, b in both_c]
    higher = [p for p in tpairs if gu[(p[0], p[1], "training")] > gu[(p[0], p[1], "inference")]]
    train = [k for k in ORDER if k in runs and k[2] == "training" and runs[k]["has_ncu"]]
    bw = {k: phase_row(runs[k], "backward") for k in train}
    fw = {k: phase_row(runs[k], "forward") for k in train}
    opt = {k: phase_row(runs[k], "optimizer") for k in train}
    alike = max(d_issue) < 0.1 and max(d_act) < 0.1
    w("- **Training vs inference** (the seed profiled both): per kernel the two "
      + ("look alike (within 10 points)" if alike else "differ") + " — over the "
      f"{len(both_c)} (model, batch) pairs with counters in both modes, SMSP issue differs by at most "
      f"{f(100 * max(d_issue), '.1f')} points and SMSP active by at most {f(100 * max(d_act), '.1f')} points "
      "within kernel time. Backward kernels take " + rng([float(bw[k]["time_share"]) for k in train if bw[k]], 0)
      + " of a training iteration's kernel time (optimizer " + rng([float(opt[k]["time_share"]) for k in train if opt[k]], 1)
      + "), with SMSP issue " + ", ".join(
          f"{lab(k)} fwd {pct(fw[k].get('smsp_issue_util'), 0)} / bwd {pct(bw[k].get('smsp_issue_util'), 0)}"
          for k in train if bw[k] and fw[k])
      + f". GPU utilization is higher in training for {len(higher)} of {len(tpairs)} pairs ("
      + ", ".join(f"{LABEL[m]} bs{b} {pct(gu[(m, b, 'inference')])} → {pct(gu[(m, b, 'training')])}" for m, b in tpairs)
      + ", inference → training).")

    # caveat: traced vs untraced
    k0 = ("resnet50", 8, "inference")
    ovh = {k: float(r["it"]["total_time_ms"]) - float(r["meta"]["untraced_iteration_ms"]) for k, r in runs.items()}
    w("- **Caveat on the overhead numbers**: the traced iteration includes the profiler's and the module hooks' "
      "own CPU cost, which is large when the GPU work is small. Traced / untraced iteration: "
      + ", ".join(f"{lab(k)} {f(it[k]['total_time_ms'], '.1f')} / {f(runs[k]['meta']['untraced_iteration_ms'], '.1f')} ms"
                  for k in ORDER if k in runs)
      + f". The profiler adds {f(min(ovh[k] for k in small), '.1f')}–{f(max(ovh[k] for k in small), '.1f')} ms at "
      f"batch 8 and {f(min(ovh[k] for k in big), '.1f')}–{f(max(ovh[k] for k in big), '.1f')} ms at batch 64. "
      + (f"Without it, ResNet-50 bs8 inference's GPU would be busy about {pct(untraced_util(runs[k0]), 0)} of the "
         f"iteration instead of {pct(gu[k0], 0)} (same GPU time, shorter iteration): framework overhead still "
         f"costs about {pct(1 - untraced_util(runs[k0]), 0)} of its iteration, less than the traced "
         f"{pct(ov_share[k0], 0)} suggest." if k0 in runs else "")
      + "\n")


def layer_section(L: list[str], runs: dict[Key, dict[str, Any]], img: Path) -> None:
    w = L.append
    w("## Per layer type\n")
    for k in LAYER_RUNS:
        if k not in runs or not runs[k]["has_ncu"]:
            continue
        lt = runs[k]["result"].layer_types.head(5)
        w(f"**{lab(k)}** (top 5 layer types by kernel time; utilizations within kernel time):\n")
        w(table(["layer type", "kernels", "time ms", "share", "with counters", "SMSP active", "SMSP issue",
                 "TC active", "TC issue"],
                [[r.layer_type, int(r.n_kernels), f(r.time_ms, ".2f"), pct(r.time_share), pct(r.counter_time_share, 0),
                  pct(r.smsp_active_util), pct(r.smsp_issue_util), pct(r.tc_active_util), pct(r.tc_issue_util, 2)]
                 for r in lt.itertuples()]) + "\n")
        top = lt.iloc[0]
        lts = runs[k]["result"].layer_types
        tc_top = lts[~lts["layer_type"].astype(str).str.startswith("(")].sort_values(
            "tc_active_util", ascending=False).iloc[0]
        w(f"{top.layer_type} takes {pct(top.time_share, 0)} of the kernel time at {pct(top.smsp_issue_util)} SMSP "
          f"issue and {pct(top.tc_active_util)} TC active"
          + ("; it is also the layer type with the most tensor-core activity" if tc_top.layer_type == top.layer_type
             else f"; the layer type with the most tensor-core activity is {tc_top.layer_type} "
                  f"({pct(tc_top.tc_active_util)} TC active, {pct(tc_top.time_share)} of the time)")
          + f". The next {min(4, len(lt) - 1)} types take {pct(float(lt['time_share'].iloc[1:].sum()), 0)} of the "
          f"kernel time at {rng([float(x) for x in lt['smsp_issue_util'].iloc[1:]])} SMSP issue.\n")
    k = PLOT_RUN
    if k in runs:
        w(f"Per-run plots of {lab(k)} (`gpurec.profile.save_plots`):\n")
        for name, title in (("utilization_levels", "utilization levels"), ("layer_types", "layer types"),
                            ("tc_issue_cdf", "cumulative GPU time vs TC issue-slot utilization")):
            p = img / f"profile_h100_{run_name(k)}_{name}.png"
            if p.exists():
                w(f"![{lab(k)}: {title}](img/{p.name})\n")


def matching_section(L: list[str], runs: dict[Key, dict[str, Any]], facts: dict[str, Any],
                     checks: list[dict[str, Any]]) -> None:
    w = L.append
    with_ncu = [k for k in ORDER if k in runs and runs[k]["has_ncu"]]
    w("## Counters: cost and matching\n")
    rows = []
    for k in with_ncu:
        r = runs[k]
        mt, wall = r["mt"], r["ncu_wall_s"]
        per = wall / mt["n_ncu"] if wall else math.nan
        rows.append([lab(k), mt["n_trace"], mt["n_ncu"], f"{mt['n_trace'] / mt['n_ncu']:.1f}×", f(wall, ".1f"),
                     f(per, ".2f"), f(per * mt["n_trace"], ".0f"), pct(r["it"].get("imputed_time_share"), 0)])
    w("ncu time of the profiled iteration (wall time of the ncu worker's profiled step, `worker_ncu.json`) and "
      "what profiling every kernel at the same cost per kernel would take:\n")
    w(table(["run", "kernels in trace", "kernels profiled", "fewer", "ncu s", "s per profiled kernel",
             "all kernels, est. s", "imputed time"], rows) + "\n")
    left_trace = {k: runs[k]["result"].kernels.query("source == 'trace'") for k in with_ncu}
    n_left = sum(len(v) for v in left_trace.values())
    n_mangled = sum(int(v["name"].astype(str).str.startswith("_Z").sum()) for v in left_trace.values())
    share = max((float(v["time_ms"].sum()) / float(runs[k]["it"]["gpu_kernel_time_ms"]) for k, v in left_trace.items()),
                default=0.0)
    ncu_only = {k: runs[k]["result"].kernels.query("source == 'ncu'") for k in with_ncu}
    n_ncu_only = sum(len(v) for v in ncu_only.values())
    same_count = all(len(left_trace[k]) == len(ncu_only[k]) for k in with_ncu)
    t_trace = sum(float(v["time_ms"].sum()) for v in left_trace.values())
    t_ncu = sum(float(v["time_ms"].sum()) for v in ncu_only.values())
    mangled = ("all" if n_mangled == n_left else f"{n_mangled} of the")
    w(("**Matching.** Every trace kernel got counters (matched or imputed), and no ncu kernel was left "
       "unmatched. " if n_left == 0 and n_ncu_only == 0 else
       f"**Matching.** Every trace kernel got counters (matched or imputed) except {n_left} in "
       f"{sum(1 for v in left_trace.values() if len(v))} runs (at most {pct(share, 2)} of a run's kernel time), "
       f"against {n_ncu_only} ncu kernels left unmatched. ")
      + (f"{mangled.capitalize()} {n_left} carry a mangled name in the trace (`_Z…`; here cuDNN's CUTLASS "
         "implicit-GEMM convolutions) that the name normalisation of `gpurec/profile/matching.py` does not "
         "demangle, while ncu reports the demangled name"
         + (f"; each run has as many ncu-only kernels as trace kernels without counters, with "
            f"{f(t_ncu / t_trace, '.2f')}× their duration in sum, so they are most likely the same launches: their "
            "counters are in the iteration totals as ncu-only rows, but not in their layer type"
            if same_count and t_trace > 0 else "") + "." if n_left and n_mangled else "") + "\n")
    rep = {name: v for name, v in facts.get("repeats", {}).items() if len(v) > 1}
    if rep:
        w("**Repeatability.** Runs that ran in more than one device call (the tarball keeps the last): "
          + "; ".join(f"{name}: " + ", ".join(f"{ms:.2f} ms / GPU {gp:.1f} %" for _, ms, gp in v)
                      for name, v in rep.items())
          + " (traced iteration / GPU utilization, from `profile_log.txt`).\n")
    again = [(c["key"], c["full"].iteration) for c in checks if c.get("key") in runs]
    if again:
        w("The full-profile runs repeat their trace phase in another device call: "
          + "; ".join(f"{lab(k)} traced {f(it['total_time_ms'], '.2f')} ms / GPU {pct(it['gpu_utilization'])}, "
                      f"untraced {f(it.get('untraced_iteration_ms'), '.2f')} ms (kept run: "
                      f"{f(runs[k]['it']['total_time_ms'], '.2f')} / {pct(runs[k]['it']['gpu_utilization'])}, "
                      f"{f(runs[k]['meta'].get('untraced_iteration_ms'), '.2f')} ms)" for k, it in again)
          + ". At batch 8 the traced iteration is mostly the profiler's and the hooks' CPU time, so it moves "
          "more between device calls than the untraced one.\n")


def side_by_side(a: dict[str, Any], b: dict[str, Any], key: str, digits: int = 1) -> str:
    """'H100 / H200' cell: milliseconds for *_ms keys, per cent otherwise (n/a without counters)."""
    def one(r: dict[str, Any]) -> str:
        if key.endswith("_ms"):
            return f(r["it"].get(key, r["meta"].get(key)), ".2f")
        if key in UTILS and not r["has_ncu"]:
            return "n/a"
        return pct(r["it"].get(key), digits)
    return f"{one(a)} / {one(b)}"


def h200_section(L: list[str], runs: dict[Key, dict[str, Any]], h200: dict[Key, dict[str, Any]]) -> None:
    w = L.append
    common = [k for k in ORDER if k in runs and k in h200]
    if not common:
        return
    g1 = runs[common[0]]["meta"].get("device_name", "H100").replace("NVIDIA ", "")
    g2 = h200[common[0]]["meta"].get("device_name", "H200").replace("NVIDIA ", "")
    w(f"## Same runs on the {g2} (earlier batch-8 runs)\n")
    w(f"`datasets/h200/profile/` holds {len(h200)} runs ({', '.join(lab(k) for k in ORDER if k in h200)}) with the "
      "same software; its inference runs profiled every kernel (no sampling), its training runs have no counters "
      f"(ncu timed out). Same run, {g1} / {g2}:\n")
    rows = []
    for k in common:
        a, b = runs[k], h200[k]
        rows.append([lab(k), side_by_side(a, b, "total_time_ms"), side_by_side(a, b, "untraced_iteration_ms"),
                     side_by_side(a, b, "gpu_utilization"),
                     *[side_by_side(a, b, u, 2 if u == "tc_issue_util" else 1) for u in UTILS],
                     f"{a['sampling'] or '–'} / {b['sampling'] or '–'}"])
    w(table(["run", "traced ms", "untraced ms", "GPU util", "SMSP active", "SMSP issue", "TC active", "TC issue",
             "ncu sampling"], rows) + "\n")
    both = [k for k in common if runs[k]["has_ncu"] and h200[k]["has_ncu"]]
    ratio = [float(runs[k]["meta"]["untraced_iteration_ms"]) / float(h200[k]["meta"]["untraced_iteration_ms"])
             for k in common]
    txt = (f"Untraced, the H100 iteration takes {f(min(ratio), '.2f')}–{f(max(ratio), '.2f')}× the H200's. ")
    if both:
        d = {u: max(abs(float(runs[k]["it"][u]) - float(h200[k]["it"][u])) for k in both) for u in UTILS}
        txt += (f"Where both have counters ({', '.join(lab(k) for k in both)}), the within-kernel utilizations "
                "differ by at most " + ", ".join(f"{f(100 * v, '.1f')} points ({UTIL_NAME[u]})" for u, v in d.items())
                + f" between the two GPUs, though the {g1} side is sampled per configuration and the {g2} side fully "
                "profiled. ")
        same = all((float(runs[k]["it"]["smsp_issue_util"]) < SEED_ISSUE_BOUND)
                   == (float(h200[k]["it"]["smsp_issue_util"]) < SEED_ISSUE_BOUND)
                   and (float(runs[k]["it"]["tc_issue_util"]) < SEED_TC_BOUND)
                   == (float(h200[k]["it"]["tc_issue_util"]) < SEED_TC_BOUND) for k in both)
        txt += ("On these runs the two counter-based takeaways (SMSP issue < 50 %, TC issue < 5.2 %) come out the "
                "same on both GPUs." if same else "The counter-based takeaways differ between the GPUs on some of "
                "these runs.")
    w(txt + "\n")


def generate(root: Path | str = ".") -> str:
    """docs/profile_results.md, docs/img/profile_h100_*.png and datasets/h100/profile/runs/*.json
    under the repository ``root``, re-analysing every committed run; returns the text."""
    root = Path(root)
    img = root / "docs" / "img"
    img.mkdir(parents=True, exist_ok=True)
    log_path = root / "datasets" / "h100" / "profile" / "profile_log.txt"
    log = log_path.read_text() if log_path.exists() else ""
    with tempfile.TemporaryDirectory(prefix="gpurec-prof-report-") as tmp_s:
        tmp = Path(tmp_s)
        runs = load_runs(root, "h100", tmp, write_json=True)
        if not runs:
            raise FileNotFoundError(f"no runs in {root / 'datasets/h100/profile/profile_results.tar.gz'}: "
                                    "run scripts/device_profile.sh on an H100 and commit its archive there")
        h200 = load_runs(root, "h200", tmp, write_json=False)
        checks = sampling_checks(root, tmp)
        levels_plot(runs, img / "profile_h100_utilization.png")
        batch_plot(runs, img / "profile_h100_batch.png")
        if PLOT_RUN in runs:
            r: ProfileResult = runs[PLOT_RUN]["result"]
            for name, p in save_plots(r, tmp / "plots").items():
                (img / f"profile_h100_{run_name(PLOT_RUN)}_{name}.png").write_bytes(Path(p).read_bytes())
        facts = log_facts(log)
        full_log = root / FULL_LOG
        facts["full_log"] = full_log.read_text() if full_log.exists() else ""
        L: list[str] = []
        header(L, runs, facts, checks)
        runs_table(L, runs)
        takeaways(L, runs)
        L.append("![GPU utilization and framework overhead, batch 8 vs 64](img/profile_h100_batch.png)\n")
        layer_section(L, runs, img)
        matching_section(L, runs, facts, checks)
        h200_section(L, runs, h200)
    text = "\n".join(L).rstrip() + "\n"
    atomic_write_text(root / "docs" / "profile_results.md", text)
    return text
