"""docs/accuracy.md (+ docs/img/accuracy_*.png) from a trained model's report.json.

Every number names its GPU, mode and how many rows it rests on.  The cross-validation that
produced the numbers runs at training time (``gpurec train`` writes ``models/report.json``);
this module only renders it, so ``gpurec report accuracy`` is cheap and reproducible.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpurec.dataset.store import atomic_write_text
from gpurec.reports.markdown import row, rule

TARGET_MAPE = 5.0
PUBLISHED = [
    ("Habitat (Yu et al., USENIX ATC 2021)", "11.8% average error predicting training iteration time across GPUs",
     "time, cross-GPU"),
    ("NeuSight (Lee et al., ASPLOS 2025)", "~6% error on a held-out H100 (GPT-class training and inference)",
     "time, unseen GPU"),
    ("NeuralPower (Cai et al., ACML 2017)", "88.2% accuracy for runtime and 97.2% for energy of whole CNNs "
     "(i.e. ~11.8% and ~2.8% error)", "time and energy, per network"),
    ("nn-Meter (Zhang et al., MobiSys 2021)", "99.0% of models within ±10% latency error (edge CPUs/GPUs/VPUs)",
     "latency, unseen models"),
]
MODELS = ("xgboost", "random_forest", "roofline_linear")
LABEL = {"xgboost": "XGBoost", "random_forest": "RandomForest", "roofline_linear": "roofline + linear"}


def kernel_free_note(b: dict[str, Any]) -> str:
    """Which rows the per-operation scores leave out (reports trained before the rule: none)."""
    kf = b.get("kernel_free_rows")
    if not kf:
        return " Every operation row is scored, kernel-free ones (views) included."
    med = kf.get("median_measured_ms")
    return (f" Scored on operations that launch a kernel: {kf['n']} kernel-free rows (views, reshapes; median "
            f"measured {1e3 * med:.2f} µs, the timer's floor) are left out, since the predictor gives them no "
            "GPU time by rule." if med is not None else " Every operation row launches a kernel.")


def variant_text(v: Any) -> str:
    """A chosen correction variant: one for every mode (older model files) or one per mode."""
    if isinstance(v, dict):
        return "; ".join(f"`{m}` `{x}`" for m, x in sorted(v.items()))
    return f"`{v}`"


def pct(x: Any, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}%"


def share(x: Any) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def short(gpu: str) -> str:
    try:
        from gpurec.catalog import short_name

        return short_name(gpu)
    except Exception:
        return gpu


HEAD = ["rows", "time MAPE", "time ±10%", "energy MAPE", "energy ±10%", "power MAPE"]


def error_cells(t: dict[str, Any]) -> dict[str, Any]:
    """One error summary of report.json as a record (MAPEs in percent, within-10% as shares)."""
    return {"rows": t.get("n", 0), "time_mape_pct": t["time"].get("mape"),
            "time_within10": t["time"].get("within10"), "energy_mape_pct": t["energy"].get("mape"),
            "energy_within10": t["energy"].get("within10"), "power_mape_pct": t["power"].get("mape")}


def breakdown_table(label: dict[str, str], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Overall (gpu and mode "all"), then one record per GPU+mode, each with its own row count."""
    out = [{**label, "gpu": "all", "mode": "all", **error_cells(b["overall"])}]
    for key, t in sorted(b.get("by_gpu_mode", {}).items()):
        gpu, mode = key.split("|")
        out.append({**label, "gpu": gpu, "mode": mode, **error_cells(t)})
    return out


def render_error_rows(records: list[dict[str, Any]], label_keys: tuple[str, ...]) -> list[str]:
    """Table lines for ``breakdown_table`` records: the label columns, GPU, mode, the error cells."""
    out = []
    for r in records:
        if r.get("skipped"):
            out.append(row([*(r[k] for k in label_keys[:1]), "—", r["skipped"], "", "", "", "", "", "", "", ""]))
            continue
        gpu = "all" if r["gpu"] == "all" else short(r["gpu"])
        out.append(row([*(r[k] for k in label_keys), gpu, r["mode"], str(r["rows"]), pct(r["time_mape_pct"]),
                        share(r["time_within10"]), pct(r["energy_mape_pct"]), share(r["energy_within10"]),
                        pct(r["power_mape_pct"])]))
    return out


def error_tables(rep: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The accuracy report's error tables as records, from a trained model's report.json:
    ``unseen`` (test architectures), ``per_operation`` (grouped k-fold and leave-one-family-out),
    ``whole_network`` (leave-one-family-out) and ``leave_one_gpu_out``."""
    ts = rep.get("test_set", {})
    unseen: list[dict[str, Any]] = []
    if ts.get("available"):
        first = ("measured ops looked up + models, corrected" if ts.get("measured_lookup")
                 else "summed ops + correction")
        unseen += breakdown_table({"estimate": first}, ts["corrected"])
        unseen += breakdown_table({"estimate": "same, before the network correction"}, ts["raw"])
        if "corrected_model_only" in ts:
            unseen += breakdown_table({"estimate": "models only (no lookup), corrected"}, ts["corrected_model_only"])
            unseen += breakdown_table({"estimate": "models only, before the network correction"},
                                      ts["raw_model_only"])
    per_op: list[dict[str, Any]] = []
    for m in MODELS:
        if m in rep["grouped_kfold"]:
            per_op += breakdown_table({"validation": f"k-fold ({rep['grouped_kfold']['folds']})", "model": LABEL[m]},
                                      rep["grouped_kfold"][m])
    for m in MODELS:
        e = rep["leave_one_family_out"].get(m, {})
        if "per_op" in e:
            per_op += breakdown_table({"validation": "leave-one-family-out", "model": LABEL[m]}, e["per_op"])
    network: list[dict[str, Any]] = []
    for m in MODELS:
        e = rep["leave_one_family_out"].get(m, {})
        if "network_raw" in e:
            network += breakdown_table({"estimate": "sum of ops", "model": LABEL[m]}, e["network_raw"])
    lx = rep["leave_one_family_out"].get("xgboost", {})
    if "network_corrected" in lx:
        network += breakdown_table({"estimate": "sum + correction", "model": LABEL["xgboost"]},
                                   lx["network_corrected"])
    logo: list[dict[str, Any]] = []
    logo_rep = rep.get("leave_one_gpu_out", {})
    for g, e in (logo_rep.get("gpus", {}).items() if logo_rep.get("available") else []):
        held = f"held out {short(g)}"
        if e.get("skipped"):
            logo.append({"validation": held, "held_out_gpu": g, "skipped": e["skipped"]})
            continue
        for m in MODELS:
            if "per_op" in e.get(m, {}):
                logo += breakdown_table({"validation": held, "model": LABEL[m], "level": "per op",
                                         "held_out_gpu": g}, e[m]["per_op"])
        for key, level in (("network_train_archs_raw", "networks (training archs), sum"),
                           ("network_train_archs_corrected", "networks (training archs), corrected"),
                           ("network_test_archs_raw", "networks (unseen archs), sum"),
                           ("network_test_archs_corrected", "networks (unseen archs), corrected")):
            if key in e.get("xgboost", {}):
                logo += breakdown_table({"validation": held, "model": "XGBoost", "level": level,
                                         "held_out_gpu": g}, e["xgboost"][key])
    return {"unseen": unseen, "per_operation": per_op, "whole_network": network, "leave_one_gpu_out": logo}


def table(header: list[str], lines: list[str]) -> list[str]:
    """A table of rows already rendered with ``row``, as a list of lines."""
    return [row(header), rule(len(header)), *lines]


def plots(rep: dict[str, Any], img: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    made = []
    # 1. measured vs predicted whole networks
    lofo = rep["leave_one_family_out"].get("xgboost", {}).get("network_records", [])
    test = rep.get("test_set", {}).get("records", [])
    if lofo or test:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
        for ax, (what, m_key) in zip(axes, (("time (ms)", "t"), ("energy (mJ)", "e")), strict=True):
            allv: list[float] = []
            for recs, label, marker in ((lofo, "leave-one-family-out", "o"), (test, "unseen test archs", "^")):
                for gpu in sorted({r["gpu"] for r in recs}):
                    sel = [r for r in recs if r["gpu"] == gpu]
                    if m_key == "t":
                        xs = [r["measured_time_ms"] for r in sel]
                        ys = [r["pred_time_ms"] for r in sel]
                    else:
                        xs = [r["measured_time_ms"] * r["measured_power_w"] for r in sel]
                        ys = [r["pred_time_ms"] * r["pred_power_w"] for r in sel]
                    allv += xs + ys
                    ax.scatter(xs, ys, label=f"{label}, {short(gpu)} ({len(sel)})", marker=marker, alpha=0.6, s=18)
            lo, hi = min(allv) / 1.5, max(allv) * 1.5
            xs = [lo, hi]
            ax.plot(xs, xs, "k-", lw=0.8)
            ax.plot(xs, [x * 1.1 for x in xs], "k:", lw=0.6)
            ax.plot(xs, [x / 1.1 for x in xs], "k:", lw=0.6)
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(f"measured {what}")
            ax.set_ylabel(f"predicted {what}")
            ax.set_title(f"whole networks: {what.split()[0]} (dotted: ±10%)")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(img / "accuracy_networks.png", dpi=110)
        plt.close(fig)
        made.append("accuracy_networks.png")
    # 2. MAPE per validation
    bars: list[tuple[str, float | None, float | None]] = []
    gk = rep["grouped_kfold"]
    for m in MODELS:
        if m in gk:
            o = gk[m]["overall"]
            bars.append((f"op k-fold\n{LABEL[m]}", o["time"].get("mape"), o["energy"].get("mape")))
    lx = rep["leave_one_family_out"].get("xgboost", {})
    if "per_op" in lx:
        o = lx["per_op"]["overall"]
        bars.append(("op LOFO\nXGBoost", o["time"].get("mape"), o["energy"].get("mape")))
    for key, label in (("network_raw", "net LOFO\nsum"), ("network_corrected", "net LOFO\ncorrected")):
        if key in lx:
            o = lx[key]["overall"]
            bars.append((label, o["time"].get("mape"), o["energy"].get("mape")))
    ts = rep.get("test_set", {})
    if ts.get("available"):
        for key, label in (("raw", "net test\nsum"), ("corrected", "net test\ncorrected")):
            o = ts[key]["overall"]
            bars.append((label, o["time"].get("mape"), o["energy"].get("mape")))
    if bars:
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(bars)), 4))
        xs = range(len(bars))
        ax.bar([x - 0.2 for x in xs], [b[1] or 0 for b in bars], width=0.4, label="time")
        ax.bar([x + 0.2 for x in xs], [b[2] or 0 for b in bars], width=0.4, label="energy")
        ax.axhline(TARGET_MAPE, color="k", ls="--", lw=0.8, label=f"target {TARGET_MAPE:g}%")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([b[0] for b in bars], fontsize=8)
        ax.set_ylabel("MAPE (%)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
        ax.set_title("mean absolute percentage error by validation")
        fig.tight_layout()
        fig.savefig(img / "accuracy_mape.png", dpi=110)
        plt.close(fig)
        made.append("accuracy_mape.png")
    # 3. per-family LOFO per-op error
    fam = lx.get("per_op", {}).get("by_family", {})
    if fam:
        names = sorted(fam)
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(names)), 4))
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [fam[n]["time"].get("mape") or 0 for n in names], width=0.4, label="time")
        ax.bar([x + 0.2 for x in xs], [fam[n]["energy"].get("mape") or 0 for n in names], width=0.4, label="energy")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{n}\n({fam[n]['n']})" for n in names], fontsize=7, rotation=45)
        ax.set_ylabel("per-operation MAPE (%)")
        ax.set_title("leave-one-family-out, XGBoost, per held-out family (rows)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(img / "accuracy_families.png", dpi=110)
        plt.close(fig)
        made.append("accuracy_families.png")
    return made


def by_batch_table(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Unseen-architecture error by batch size and mode: small batches are launch-bound, and a
    launch-bound network's measured time itself moves between machines (docs/validation.md)."""
    groups: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for r in records:
        m = re.search(r":b(\d+):", str(r.get("set_key", "")))
        try:
            t_err = abs(r["pred_time_ms"] / r["measured_time_ms"] - 1) * 100
            e_err = abs(r["pred_time_ms"] * r["pred_power_w"] / (r["measured_time_ms"] * r["measured_power_w"]) - 1) * 100
        except (KeyError, TypeError, ZeroDivisionError):
            continue
        if m:
            groups.setdefault((int(m.group(1)), str(r.get("mode"))), []).append((t_err, e_err))
    return [{"batch": batch, "mode": mode, "networks": len(errs),
             "time_mape_pct": sum(e[0] for e in errs) / len(errs),
             "energy_mape_pct": sum(e[1] for e in errs) / len(errs),
             "time_within10": sum(e[0] <= 10 for e in errs) / len(errs)}
            for (batch, mode), errs in sorted(groups.items())]


def by_batch_lines(records: list[dict[str, Any]]) -> list[str]:
    """The ``by_batch_table`` rendered, with its lead-in line (nothing when no record has a batch)."""
    recs = by_batch_table(records)
    if not recs:
        return []
    lines = [row([r["batch"], r["mode"], r["networks"], pct(r["time_mape_pct"]), pct(r["energy_mape_pct"]),
                  share(r["time_within10"])]) for r in recs]
    return ["By batch size (the corrected estimate above, from `report.json`'s per-network records):", "",
            *table(["batch", "mode", "networks", "time MAPE", "energy MAPE", "time ±10%"], lines)]


def _datasets(data_root: Path | None, gpus: list[Any] | None) -> list[Any]:
    """The per-GPU datasets (gpurec.reports.dataset.load_all): ``gpus`` when the caller loaded
    them already (``write`` reads them once for every section), else read from ``data_root``."""
    if gpus is not None:
        return gpus
    from gpurec.dataset.load import default_root
    from gpurec.reports.dataset import load_all

    return load_all(data_root or default_root())


def _mean_median(differences: Any) -> str:
    """"mean / median" of percent differences; "—" where no pair has both readings (operations are
    measured host-free, so their repeats carry no eager power), not "nan%"."""
    d = differences.dropna()
    return "—" if d.empty else f"{pct(d.mean())} / {pct(d.median())}"


def repeatability_section(data_root: Path | None = None, gpus: list[Any] | None = None) -> list[str]:
    """Measurement noise floor: re-measured rows (datasets/*/repeats.parquet) against their first
    value, paired as the dataset report pairs them (``gpurec.reports.dataset.repeat_pairs``)."""
    try:
        import numpy as np

        from gpurec.reports.dataset import repeat_pairs

        lines = []
        for g in _datasets(data_root, gpus):
            pairs = repeat_pairs(g)
            if pairs.empty:
                continue
            pairs = pairs.dropna(subset=["time_ms_orig"])
            for item, part in pairs.groupby("item"):
                et = np.abs(part["time_ms_rep"] / part["time_ms_orig"] - 1) * 100
                ep = np.abs(part["power_w_rep"] / part["power_w_orig"] - 1) * 100
                lines.append(row([short(g.name), "operation" if item == "op" else str(item), len(part),
                                  _mean_median(et), _mean_median(ep)]))
        if not lines:
            return []
        return ["## Measurement repeatability (noise floor)", "",
                "Rows measured twice in the same run (`repeats.parquet`): no predictor can beat the measurement's "
                "own repeatability. Heavy tails (a few re-measurements differ by up to 2x) make the mean far "
                "above the median.", "",
                *table(["GPU", "item", "pairs", "time: mean / median difference", "power: mean / median"], lines), ""]
    except Exception as exc:  # informative only
        return [f"(repeatability not computed: {exc})", ""]


def _f(x: Any, digits: int = 1, unit: str = "%") -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "—"
    return "—" if v != v else f"{v:.{digits}f}{unit}"


def _host_side(hd: dict[str, Any]) -> list[str]:
    """How the host side was learnt: per-operation dispatch, then its calibration inside networks."""
    L = ["### The host side", ""]
    if "grouped_kfold" in hd:
        L += [f"Per-operation dispatch (`host_ms` of {hd.get('rows', 0):,} operation rows, on the reference host): "
              f"grouped-CV MAPE {_f(hd['grouped_kfold'].get('mape'))}, against "
              f"{_f(hd.get('prior_error', {}).get('mape'))} for the `host-bench` prior alone.", ""]
    cal = hd.get("network_calibration", {})
    rows = [m for m in ("inference", "training") if "eager_mape_uncalibrated" in cal.get(m, {})]
    if not rows:
        return L + [f"Inside networks: {cal.get('note', 'not calibrated')}.", ""]
    L += ["Inside a network, the isolated rows do not simply add up: a module call adds Python work per "
          "operation, and in training one backward pass serves every operation where each isolated row paid "
          "a backward call of its own (a scale above 1 below says the plain sum fell short, below 1 that it "
          "overshot).  So per mode the dispatch is calibrated on the "
          "training architectures' eager network times through the step simulation (`NetworkCalibration`): "
          "(scale × per-operation dispatch + a cost per operation) × host-bench dispatch ratio ^ host "
          "exponent, and kept only where leave-one-family-out beats the plain sum.", "",
          "| mode | networks | scale | per operation | host exponent | eager MAPE, plain sum | calibrated, in sample "
          "| calibrated, leave one family out | kept |", "|---|---|---|---|---|---|---|---|---|"]
    for m in rows:
        c = cal[m]
        L.append(f"| {m} | {c['n']} | {c['scale']:.2f} | {1000 * c['per_op_ms']:.0f} µs | {c['host_exponent']:g} | "
                 f"{_f(c['eager_mape_uncalibrated'])} | {_f(c['eager_mape_calibrated_in_sample'])} | "
                 f"{_f(c['eager_mape_calibrated_lofo'])} | {'yes' if c['kept'] else 'no'} |")
    L += ["", "A host exponent below 1 means the `host-bench` profile of the measuring machine explained only part of "
          "how its steps' host time differed from the other machines' (`docs/validation.md` shows the same sets on "
          "three H100 hosts)."]
    return L


def _sequence_section(rows: list[dict[str, Any]]) -> list[str]:
    """Sequence networks of the unseen sequence architectures against their targets (met or not
    on the H100, where the targets are set; the other GPUs shown beside)."""
    from gpurec.model.fitting.evaluate import SEQUENCE_TARGETS_PCT as T

    L = ["### Sequence models, unseen sequence architectures", "",
         f"Targets on the H100: host-free time ≤ {T['time']:.0f}% and energy ≤ {T['energy']:.0f}% MAPE, eager time "
         f"≤ {T['eager_time']:.0f}%, every LSTM language model within {T['lstm_lm_each']:.0f}% in host-free time "
         "and energy. Every measured fp32 network of "
         + ", ".join(sorted({a for r in rows for a in r["archs"]})) + " (never trained on).", ""]
    if not rows:
        return L + ["No measured network of an unseen sequence architecture.", ""]
    return L + _sequence_table(rows, judge=True) + [""]


def _sequence_table(rows: list[dict[str, Any]], judge: bool) -> list[str]:
    """gpurec.model.fitting.evaluate.sequence_accuracy's rows as a table; with ``judge``, the H100's
    overall row against SEQUENCE_TARGETS_PCT (the targets are set on fp32)."""
    from gpurec.model.fitting.evaluate import SEQUENCE_TARGETS_PCT as T

    lines = []
    for r in rows:
        w = r["worst"]
        lm = f"{r['lstm_lm_within']} of {r['lstm_lm_networks']}" if r["lstm_lm_networks"] else "—"
        verdict = "—"
        if judge and "H100" in r["gpu"] and r["family"] == "all":
            ok = (r["gpu_time_mape"] <= T["time"] and r["gpu_energy_mape"] <= T["energy"]
                  and r["eager_time_mape"] <= T["eager_time"] and r["lstm_lm_within"] == r["lstm_lm_networks"])
            verdict = "met" if ok else "**not met**"
        lines.append(row([short(r["gpu"]), r["family"], str(r["n"]), _f(r["gpu_time_mape"]),
                          _f(r["gpu_energy_mape"]), _f(r["eager_time_mape"]),
                          f"{w['set_key']} {w['mode']}: time {w['time_error_pct']:+.1f}%, energy "
                          f"{w['energy_error_pct']:+.1f}%" if w else "—", lm, verdict]))
    return table(["GPU", "family", "networks", "host-free time MAPE", "host-free energy MAPE", "eager time MAPE",
                  "worst network", "LSTM LMs within target", "targets"], lines)


def host_gpu_section(tables: dict[str, Any] | None, rep: dict[str, Any],
                     sources: dict[str, Any] | None = None) -> list[str]:
    """The GPU's work and the host's work predicted apart, on the unseen test
    architectures, each figure next to the noise floor of the same measurement."""
    L = ["## GPU work and host work apart", ""]
    t = rep.get("targets", {})
    L += [f"Targets: operations `{t.get('operations', '?')}`, networks `{t.get('networks', '?')}`, GPU-time source "
          f"`{t.get('gpu_time_source', '?')}` (rows by source: "
          + (", ".join(f"{k} {v}" for k, v in (t.get("operation_rows_by_source") or {}).items()) or "none")
          + f"; eager rows of at least {t.get('eager_proxy_min_ms')} ms stand in for host-free ones on GPUs without "
          "host-free data).  The in-network kernel time is the GPU-time target where it exists because it is "
          "measured inside the real step (caches, ordering); `datasets/README.md` compares it with isolated "
          "host-free time per operation kind.", ""]
    if sources:
        L += ["Which GPU-time target, measured (`gpurec tools gpu-time-sources`: the same data trained twice, "
              f"{sources.get('tune_trials')} Optuna trials, {sources.get('created', '?')}):", "",
              "| GPU-time source | unseen test networks: time / energy MAPE | leave one family out, networks: "
              "time / energy | grouped K-fold per operation: time / energy |", "|---|---|---|---|"]
        for name, r in sources.get("sources", {}).items():
            cells = [f"{_f(r[k].get('time_mape'))} / {_f(r[k].get('energy_mape'))} ({r[k].get('n')})"
                     for k in ("test_archs_network", "lofo_network", "kfold_per_op")]
            L.append(f"| {name} | " + " | ".join(cells) + " |")
        L += [""]
    if tables is None:
        return L + ["Not available: no trained predictor could be loaded.", ""]
    L += ["### Host-free time and energy, unseen test architectures (target ≤ 5% each)", "",
          "| GPU | mode | host-free time MAPE | rows | host-free energy MAPE | rows |", "|---|---|---|---|---|---|"]
    for r in tables["host_free"]:
        L.append(f"| {short(r['gpu'])} | {r['mode']} | {_f(r['gpu_time_mape'])} | {r['n_time']} | "
                 f"{_f(r['gpu_energy_mape'])} | {r['n_energy']} |")
    if any(r["n_time"] == 0 for r in tables["host_free"]):
        L += ["", "Rows are 0 where the GPU has no host-free measurement of an unseen test architecture's network "
              "yet (`datasets/<gpu>/raw/logs/README.md` says what each GPU's collection measured)."]
    L += [""]
    L += ["### Leave one GPU out, host-free (target ≤ 8%)", ""]
    logo = tables["leave_one_gpu_out"]
    if logo:
        L += ["| held-out GPU | architectures | mode | rows | time MAPE | energy MAPE | targets |",
              "|---|---|---|---|---|---|---|"]
        L += [f"| {short(r['held_out_gpu'])} | {r['archs']} | {r['mode']} | {r['n']} | {_f(r['time_mape'])} | "
              f"{_f(r['energy_mape'])} | {r['targets']} |" for r in logo]
    else:
        L += ["No network-level figure yet: it needs host-free network rows on two GPUs, and only the H100 has "
              "them."]
    for gpu, entry in rep.get("leave_one_gpu_out", {}).get("gpus", {}).items():
        per_op = entry.get("xgboost", {}).get("per_op", {}).get("overall")
        if entry.get("skipped"):
            L.append(f"* {short(gpu)} held out: skipped, {entry['skipped']}.")
        elif per_op:
            L.append(f"* {short(gpu)} held out, per operation ({per_op.get('n')} rows, trained on the other GPUs' "
                     f"{entry.get('train_ops')}): time {_f(per_op['time']['mape'])}, energy "
                     f"{_f(per_op['energy']['mape'])}.")
    L += ["", "### Eager time on the measuring host's profile, unseen test architectures", "",
          "| GPU | mode | measured bound | eager time MAPE | rows | rows predicted with their run's host profile |",
          "|---|---|---|---|---|---|"]
    L += [f"| {short(r['gpu'])} | {r['mode']} | {r['measured_bound']} | {_f(r['time_mape'])} | {r['n']} | "
          f"{r['with_run_host_profile']} |" for r in tables["eager"]]
    L += ["", *_sequence_section(tables.get("sequence", []))]
    L += ["", *_host_side(rep.get("host_dispatch", {}))]
    b = tables["bound"]
    o = b.get("overall", {})
    L += ["", "### Bound verdict (target ≥ 90% right where the verdict is clear)", "",
          f"Networks whose measured eager / host-free ratio lies more than {b.get('clear_margin')} away from 1.2, "
          f"all architectures: {_f((o.get('right') or float('nan')) * 100, 0)} right of {o.get('n', 0)} "
          f"({o.get('measured_host_bound', 0)} measured host-bound).", "",
          "| GPU | mode | clear networks | right | measured host-bound |", "|---|---|---|---|---|"]
    L += [f"| {short(k.split('|')[0])} | {k.split('|')[1]} | {v['n']} | {_f(v['right'] * 100, 0)} | "
          f"{v['measured_host_bound']} |" for k, v in b.get("by_gpu_mode", {}).items()]
    L += ["", "### Host share of each network's eager time, unseen test architectures", "",
          "| GPU | mode | rows | measured share (mean) | predicted share (mean) | mean \\|difference\\| |",
          "|---|---|---|---|---|---|"]
    L += [f"| {short(r['gpu'])} | {r['mode']} | {r['n']} | {_f(r['measured_share_mean'] * 100, 0)} | "
          f"{_f(r['pred_share_mean'] * 100, 0)} | {_f(r['abs_diff_pp'], 1, ' pp')} |" for r in tables["host_share"]]
    rec = tables["records"]
    L += ["", "### Noise floor of the same measurements", ""]
    if len(rec) and "measured_time_ms" in rec:
        import numpy as np

        eag = rec.get("measured_eager_other_machine")
        if eag is not None:
            d = (np.abs(rec["measured_time_ms"] / eag - 1) * 100).dropna()
            L += [f"* Eager network time, the same (set, mode) on two H100 machines: mean |Δ| {_f(d.mean())} "
                  f"({len(d)} rows)."]
    boards = tables.get("board_noise") or []
    if boards:
        L += ["* The same row (identity, method) measured on two boards of one GPU kind, on different machines and "
              "days (the tables keep the later one; the raw shards keep both): |second / first - 1|.", "",
              "| GPU | item | figure | rows | mean | median | 90th percentile |", "|---|---|---|---|---|---|---|"]
        L += [f"| {short(r['gpu'])} | {r['item']} | {r['column']} | {r['n']} | {_f(r['mean_pct'])} | "
              f"{_f(r['median_pct'])} | {_f(r['p90_pct'])} |" for r in boards]
        L += [""]
    L += ["* Host-free operation time repeated within a run, and host-free network time against the CUPTI kernel "
          "sum of the same step: `datasets/README.md`, section *The GPU apart from the host*.", ""]
    for r in tables["noise_floor"]:
        L.append(f"* {short(r['gpu'])} {r['mode']}: repeated networks "
                 + ", ".join(f"{c.replace('_noise_pct', '')} {_f(r[c])} ({r[c.replace('_noise_pct', '_groups')]} groups)"
                             for c in r if c.endswith("_noise_pct")) + ".")
    return L + [""]


CROSS_TARGETS = {"per_op_mape": 0.10, "public_model_ape": 0.08, "ratio_pp": 3.0}


def crossgpu_tables(cross: dict[str, Any]) -> dict[str, Any]:
    """The cross-GPU tables as data: per GPU and kind group (leave that GPU out), whole public
    models, H200 networks, H200/H100 ratio; each with its target and whether it is met."""
    per_op = cross.get("per_op", [])
    groups = sorted({r["group"] for r in per_op})
    gpus = [r["gpu"] for r in cross.get("per_gpu", [])]
    cell = {(r["gpu"], r["group"]): r for r in per_op}
    gpu_rows = []
    for g in cross.get("per_gpu", []):
        gpu_rows.append({**g, "met": g["mape"] <= CROSS_TARGETS["per_op_mape"],
                         "by_group": {k: cell.get((g["gpu"], k)) for k in groups}})
    public = cross.get("public_models", [])
    by_gpu: dict[str, list[float]] = {}
    for r in public:
        if r.get("ape") is not None:
            by_gpu.setdefault(r["gpu"], []).append(r["ape"])
    public_gpu = [{"gpu": g, "models": len(v), "mape": sum(v) / len(v),
                   "met": sum(v) / len(v) <= CROSS_TARGETS["public_model_ape"]} for g, v in sorted(by_gpu.items())]
    nets = [r for r in cross.get("h200_networks", []) if r.get("pred_ratio") is not None]
    ratio_pp = [abs(r["ratio_error_pp"]) for r in nets]
    summary = []
    parts = [("all networks measured on both", nets)]
    host_free = [r for r in nets if r.get("basis") == "host_free"]
    if host_free:  # reports from before the H200's host-free rows have no basis column
        eager = [r for r in nets if r not in host_free]
        parts += [("host-free on both", host_free)] + ([("eager, GPU-bound on both", eager)] if eager else [])
    parts += [("held-out architectures only", [r for r in nets if r.get("held_out_arch")])]
    for label, part in parts:
        time_pp = [abs(r["ratio_error_pp"]) for r in part]
        energy_pp = [abs(r["energy_ratio_error_pp"]) for r in part if r.get("energy_ratio_error_pp") is not None]
        product_pp = [abs(r["product_ratio_error_pp"]) for r in part if r.get("product_ratio_error_pp") is not None]
        summary.append({"label": label, "networks": len(part),
                        "product_pp": sum(product_pp) / len(product_pp) if product_pp else None,
                        "time_pp": sum(time_pp) / len(time_pp) if time_pp else None,
                        "time_bias_pp": sum(r["ratio_error_pp"] for r in part) / len(part) if part else None,
                        "energy_pp": sum(energy_pp) / len(energy_pp) if energy_pp else None,
                        "energy_networks": len(energy_pp)})
    for r in summary:
        r["time_met"] = r["time_pp"] is not None and r["time_pp"] <= CROSS_TARGETS["ratio_pp"]
        r["energy_met"] = r["energy_pp"] is not None and r["energy_pp"] <= CROSS_TARGETS["ratio_pp"]
    logo = [abs(r["ratio_error_pp"]) for r in cross.get("h200_networks_leave_h200_out", [])
            if r.get("ratio_error_pp") is not None]
    return {"groups": groups, "gpus": gpus, "per_gpu": gpu_rows, "public": public, "public_gpu": public_gpu,
            "h200_networks": nets, "h200_summary": summary,
            "by_precision": {p: _precision_pairs(rows) for p, rows in cross.get("h200_networks_by_precision", {}).items()},
            "leave_h200_out_pp": sum(logo) / len(logo) if logo else None,
            "h200_mape": sum(r["ape"] for r in nets) / len(nets) if nets else None,
            "h200_direct_mape": (sum(r["direct_ape"] for r in nets) / len(nets)
                                 if nets and all(r.get("direct_ape") is not None for r in nets) else None),
            "ratio_pp_mean": sum(ratio_pp) / len(ratio_pp) if ratio_pp else None,
            "ratio_bias_pp": sum(r["ratio_error_pp"] for r in nets) / len(nets) if nets else None}


def _energy_per_byte(cross: dict[str, Any]) -> str:
    """The fitted DRAM energy per byte, as words."""
    info = cross.get("model_info", {})
    v, by_type = info.get("memory_energy_pj_per_byte"), info.get("memory_energy_by_type_pj_per_byte")
    if v is None:
        return "not fitted, so the H200 keeps its own power model's power"
    if not by_type:
        return f"{v:.1f} pJ/byte, fitted on the training architectures' networks below"
    types = ", ".join(f"{k} {e:.1f}" for k, e in sorted(by_type.items()))
    return (f"{types} pJ/byte, fitted on the training architectures' networks below: one value for both "
            f"({v:.1f} pJ/byte), then one per memory type from it")


def network_energy_repeatability(data_root: Path | None = None, time_agreement: float = 0.02,
                                 gpus: list[Any] | None = None) -> list[dict[str, Any]]:
    """Per GPU and basis (``eager``: time_ms/energy_mj; ``host-free``: gpu_time_ms/gpu_energy_mj), how
    far the energy of a network re-measured on the same GPU lies from its first measurement (mean
    |relative difference|), over re-measurements whose time agrees within ``time_agreement`` (the
    step ran the same way): the noise floor of a measured energy ratio."""
    import numpy as np

    from gpurec.reports.dataset import repeat_pairs

    out = []
    for g in _datasets(data_root, gpus):
        pairs = repeat_pairs(g)
        if pairs.empty:
            continue
        for basis, prefix in (("eager", ""), ("host-free", "gpu_")):
            cols = [f"{prefix}time_ms_orig", f"{prefix}time_ms_rep", f"{prefix}energy_mj_orig", f"{prefix}energy_mj_rep"]
            if not set(cols) <= set(pairs.columns):
                continue
            nets = pairs[(pairs["item"] == "network")].dropna(subset=cols)
            nets = nets[np.abs(nets[cols[1]] / nets[cols[0]] - 1) <= time_agreement]
            if nets.empty:
                continue
            d = np.abs(nets[cols[3]] / nets[cols[2]] - 1)
            out.append({"gpu": g.name, "basis": basis, "pairs": int(len(nets)), "mean_pct": float(100 * d.mean()),
                        "median_pct": float(100 * d.median())})
    return out


def energy_error_by_card(nets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per H200 card (NVML UUID) of the pairs in ``nets`` (crossgpu_tables' h200_networks): how
    many, the mean energy-ratio error (pp, signed) and its mean magnitude.  A card's own power
    level shows as an offset that no GPU-level prediction can follow."""
    by: dict[str, list[float]] = {}
    for r in nets:
        card, err = r.get("h200_gpu_uuid"), r.get("energy_ratio_error_pp")
        if card and err is not None:
            by.setdefault(str(card), []).append(float(err))
    return [{"card": c, "pairs": len(v), "bias_pp": sum(v) / len(v), "mean_abs_pp": sum(abs(x) for x in v) / len(v)}
            for c, v in sorted(by.items())]


def _recard_energies(name: str, gpus: list[Any] | None, data_root: Path | None
                     ) -> tuple[dict[tuple[str, str, str], list[float]], dict[tuple[str, str, str], str], int, set[str]]:
    """GPU ``name``'s networks measured again on other cards (its ``cards/``,
    gpurec.reports.dataset.recard_runs): per (set key, mode, precision) each new card's energy /
    the committed row's, the network's family, the number of runs and the cards."""
    from gpurec.reports.dataset import recard_runs

    ratios: dict[tuple[str, str, str], list[float]] = {}
    families: dict[tuple[str, str, str], str] = {}
    runs, cards = 0, set()
    for g in _datasets(data_root, gpus):
        if g.name != name:
            continue
        for _, d, _ in recard_runs(g):
            runs += 1
            cards.update(d["card"])
            for k, fam, e in zip(zip(d["set_key"], d["mode"], d["precision"], strict=True), d["family"], d["energy"],
                                 strict=True):
                ratios.setdefault(k, []).append(float(e))
                families[k] = fam
    return ratios, families, runs, cards


def card_averaged_energy_errors(nets: list[dict[str, Any]], gpus: list[Any] | None = None,
                                data_root: Path | None = None, other: str | None = None,
                                anchor: str | None = None) -> dict[str, Any] | None:
    """The energy-ratio error of the host-free pairs in ``nets`` (crossgpu_tables' h200_networks)
    whose network was measured again on other cards of ``other`` (default the H200; its
    ``cards/``, gpurec.reports.dataset.recard_runs), with that side averaged over every card that
    measured it: the measured energy ratio times the mean over cards of energy / the committed
    row's (the committed card counting 1).  Mean |error| and mean signed error (pp), as measured
    and card-averaged, over those pairs and per family (CNN, sequence).  Where the ``anchor``
    (default the H100) measured the network again too, ``both_*`` divide by its mean over cards
    as well: both sides averaged.  Why: one card is some points off the typical card that a
    prediction is for; averaged over cards, what stays of a family's bias is the model's or the
    cards' that measured the network once.  None without such pairs."""
    import numpy as np

    from gpurec.model.fitting.crossgpu_fit import H100, H200

    other, anchor = other or H200, anchor or H100
    ratios, families, runs, cards = _recard_energies(other, gpus, data_root)
    a_ratios, _, a_runs, a_cards = _recard_energies(anchor, gpus, data_root)
    rows = []
    for r in nets:
        k = (r.get("set_key"), r.get("mode"), r.get("precision", "fp32"))
        if (k in ratios and r.get("basis") == "host_free" and r.get("energy_ratio_error_pp") is not None
                and r.get("measured_energy_ratio")):
            mean_card = (1.0 + sum(ratios[k])) / (1 + len(ratios[k]))
            a_cards_k = a_ratios.get(k, [])
            mean_anchor = (1.0 + sum(a_cards_k)) / (1 + len(a_cards_k))
            rows.append((families[k], len(ratios[k]) + 1, float(r["energy_ratio_error_pp"]),
                         100 * (r["pred_energy_ratio"] - r["measured_energy_ratio"] * mean_card),
                         100 * (r["pred_energy_ratio"] - r["measured_energy_ratio"] * mean_card / mean_anchor),
                         len(a_cards_k) + 1))
    if not rows:
        return None

    def summary(part: list[tuple[str, int, float, float, float, int]]) -> dict[str, Any]:
        measured, averaged, both = (np.array([x[i] for x in part]) for i in (2, 3, 4))
        return {"pairs": len(part), "measured_pp": float(np.abs(measured).mean()), "measured_bias_pp": float(measured.mean()),
                "averaged_pp": float(np.abs(averaged).mean()), "averaged_bias_pp": float(averaged.mean()),
                "both_pp": float(np.abs(both).mean()), "both_bias_pp": float(both.mean())}

    return {"gpu": other, "runs": runs, "cards": len(cards), "cards_per_pair": float(np.mean([x[1] for x in rows])),
            "anchor": anchor, "anchor_runs": a_runs, "anchor_cards": len(a_cards),
            "anchor_cards_per_pair": float(np.mean([x[5] for x in rows])), **summary(rows),
            "by_family": {f: summary([x for x in rows if x[0] == f]) for f in sorted({x[0] for x in rows})}}


def _card_averaged_text(avg: dict[str, Any] | None) -> list[str]:
    """The paragraph on the energy-ratio error with the H200 side (and, where the H100 measured the
    networks again, both sides) averaged over cards (empty without)."""
    if not avg:
        return []
    fams = "; ".join(f"{f} {v['measured_bias_pp']:+.1f} -> {v['averaged_bias_pp']:+.1f} pp mean "
                     f"({v['measured_pp']:.1f} -> {v['averaged_pp']:.1f} pp mean |error|, {v['pairs']} pairs)"
                     for f, v in avg["by_family"].items())
    other, anchor = short(avg["gpu"]), short(avg["anchor"])
    lines = [f"The {other} side averaged over cards. {avg['pairs']} of the pairs' networks were measured "
             f"again, host-free, on other {other} cards ({avg['runs']} runs on {avg['cards']} cards, "
             f"`datasets/h200/cards/`; {avg['cards_per_pair']:.1f} measurements per network with the committed one). With each such "
             f"network's {other} energy the mean over those cards, the mean |energy ratio error| on "
             f"them goes from {avg['measured_pp']:.1f} pp (the committed card) to {avg['averaged_pp']:.1f} pp, and "
             f"by family the mean error goes: {fams}. A family bias that stays or grows when the "
             f"{other}'s cards are averaged is not that card's noise: it is the model's, or the {anchor} "
             "cards'."]
    if avg["anchor_runs"]:
        both = "; ".join(f"{f} {v['both_bias_pp']:+.1f} pp mean ({v['both_pp']:.1f} pp mean |error|)"
                         for f, v in avg["by_family"].items())
        lines[-1] += (f" The {anchor} side measured them again too ({avg['anchor_runs']} run(s) on "
                      f"{avg['anchor_cards']} card(s), `datasets/h100/cards/`; {avg['anchor_cards_per_pair']:.1f} "
                      f"measurements per network): with both sides the mean over their cards, the mean |energy ratio "
                      f"error| is {avg['both_pp']:.1f} pp, by family {both}; the part of a family bias that this moves "
                      f"is the {anchor} cards' that measured the family once.")
    else:
        lines[-1] += f" (The {anchor} measured each network once.)"
    lines[-1] += (" These pairs are training architectures' (the re-card plan), so this is a diagnostic of the "
                  "measurement, not a held-out score; the target stays on the committed rows.")
    return lines + [""]


CARD_MIN_NETWORKS = 5  # a card's mean power difference over fewer networks is not compared


def card_temperatures(data_root: Path | None = None, gpus: list[Any] | None = None) -> dict[tuple[str, ...], float]:
    """Each network row's card temperature (°C) as NVML reported it with the measurement, keyed by
    (GPU name, set key, mode, basis, precision): basis ``host_free`` the CUDA-graph replay's,
    ``eager`` the eager step's."""
    import numpy as np

    out: dict[tuple[str, ...], float] = {}
    for g in _datasets(data_root, gpus):
        n = g.t("networks")
        if n.empty or not {"set_key", "mode"} <= set(n.columns):
            continue
        precision = n["precision"].fillna("fp32") if "precision" in n.columns else ["fp32"] * len(n)
        for basis, col in (("host_free", "gpu_temperature_c"), ("eager", "temperature_c")):
            if col in n.columns:
                for key, mode, prec, t in zip(n["set_key"], n["mode"], precision, n[col], strict=True):
                    if t is not None and np.isfinite(t):
                        out[(g.name, str(key), str(mode), basis, str(prec))] = float(t)
    return out


TEMPERATURE_BINS_C = (-4.0, -2.0, 0.0, 2.0, 4.0)  # edges of the H200-minus-H100 temperature bins


def temperature_power_shift(nets: list[dict[str, Any]], temps: dict[tuple[str, ...], float],
                            anchor: str | None = None, other: str | None = None) -> dict[str, Any] | None:
    """How the two cards' temperature difference moves a measured H200/H100 power ratio.

    Least squares of log(measured power ratio) on the temperature difference (H200 minus H100, °C)
    over the training architectures' pairs; the energy-ratio error per bin of that difference; and
    the error against each measured ratio brought to equal temperature by that slope.  A warmer
    card leaks more, so a measured ratio carries the two cards' thermal conditions, which a
    prediction per GPU model cannot know.  None with fewer than 10 pairs of known temperatures.
    ``anchor`` and ``other`` default to the GPUs the pairs were made of (crossgpu_fit's H100, H200)."""
    import numpy as np

    from gpurec.model.fitting.crossgpu_fit import H100, H200

    anchor, other = anchor or H100, other or H200

    def key(gpu: str, r: dict[str, Any]) -> tuple[str, ...]:
        return gpu, r["set_key"], r["mode"], r.get("basis", "eager"), r.get("precision", "fp32")

    rows = [(r, temps[key(other, r)] - temps[key(anchor, r)]) for r in nets
            if r.get("energy_ratio_error_pp") is not None and r.get("measured_energy_ratio")
            and key(other, r) in temps and key(anchor, r) in temps]
    train = [(r, d) for r, d in rows if not r.get("held_out_arch")]
    if len(train) < 10:
        return None
    d_t = np.array([d for _, d in train])
    y = np.log([r["measured_energy_ratio"] / r["measured_ratio"] for r, _ in train])
    intercept, slope = np.linalg.lstsq(np.c_[np.ones(len(d_t)), d_t], y, rcond=None)[0]
    edges = (-np.inf, *TEMPERATURE_BINS_C, np.inf)
    bins = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        err = [r["energy_ratio_error_pp"] for r, d in rows if lo < d <= hi]
        if err:
            bins.append({"low_c": float(lo), "high_c": float(hi), "pairs": len(err), "bias_pp": float(np.mean(err))})

    def equal_temperature(part: list[tuple[dict[str, Any], float]]) -> float | None:
        e = [100 * (r["pred_energy_ratio"] - r["measured_energy_ratio"] * np.exp(-slope * d)) for r, d in part]
        return float(np.mean(np.abs(e))) if e else None

    return {"pairs": len(rows), "fit_pairs": len(train), "slope_pct_per_c": float(100 * (np.exp(slope) - 1)),
            "equal_temperature_power_ratio": float(np.exp(intercept)), "mean_difference_c": float(np.mean([d for _, d in rows])),
            "bins": bins, "raw_pp": float(np.mean([abs(r["energy_ratio_error_pp"]) for r, _ in rows])),
            "equal_temperature_pp": equal_temperature(rows),
            "held_out_equal_temperature_pp": equal_temperature([(r, d) for r, d in rows if r.get("held_out_arch")]),
            "held_out_pairs": sum(bool(r.get("held_out_arch")) for r, _ in rows)}


def _temperature_text(shift: dict[str, Any] | None) -> list[str]:
    """The card-temperature paragraph of the H200/H100 section (empty without temperatures)."""
    if not shift:
        return []

    def edge(lo: float, hi: float) -> str:
        return f"≤ {hi:+.0f} °C" if lo == float("-inf") else f"> {lo:+.0f} °C" if hi == float("inf") \
            else f"{lo:+.0f} to {hi:+.0f} °C"

    held = shift["held_out_equal_temperature_pp"]
    return [f"Card temperature. Over the {shift['fit_pairs']} training architectures' pairs, the measured H200/H100 "
            f"power ratio moves {shift['slope_pct_per_c']:+.2f}% per °C that the H200's card ran warmer than the "
            f"H100's (least squares on the temperatures NVML reported with each measurement; at equal temperature "
            f"the ratio is {shift['equal_temperature_power_ratio']:.3f}); over all {shift['pairs']} pairs the H200's card "
            f"ran {abs(shift['mean_difference_c']):.1f} °C {'cooler' if shift['mean_difference_c'] < 0 else 'warmer'} "
            f"on average. Energy ratio error by the H200-minus-H100 difference: "
            + "; ".join(f"{edge(b['low_c'], b['high_c'])}: {b['bias_pp']:+.1f} pp mean ({b['pairs']} networks)"
                        for b in shift["bins"])
            + f". Against each measured ratio brought to equal temperature by that slope (a diagnostic, not the "
              f"target, which stays on the measured ratios), the mean |energy ratio error| is "
              f"{shift['equal_temperature_pp']:.1f} pp (measured: {shift['raw_pp']:.1f} pp)"
            + (f", {held:.1f} pp on the {shift['held_out_pairs']} held-out architectures' pairs" if held is not None else "")
            + (". The leases' cards run at the temperatures their hosts give them and a recommendation is for a "
               f"typical card, so about {shift['raw_pp'] - shift['equal_temperature_pp']:.1f} pp of the error is the "
               "measuring cards' thermal conditions (as far as one linear slope tells), not the model."
               if shift["equal_temperature_pp"] < shift["raw_pp"] else
               ". Bringing the ratios to equal temperature does not shrink the error here: the cards' temperatures "
               "do not explain it."), ""]


def card_power_differences(data_root: Path | None = None, time_agreement: float = 0.02,
                           gpu_bound: float = 0.9, gpus: list[Any] | None = None) -> list[dict[str, Any]]:
    """Per GPU and card: networks measured eager on an earlier lease (``v1_*``, kept beside the
    host-free rows that superseded them) and eager again on this card, GPU-bound (host-free /
    eager time >= ``gpu_bound``) with times within ``time_agreement``: the mean power difference
    (%, this card against the earlier one).  The same eager step on two cards of one model; the
    earlier rows were measured by the schema-1 method, so the differences between this GPU's cards,
    not each card's level, tell how far cards differ in power."""
    import numpy as np

    out = []
    for g in _datasets(data_root, gpus):
        n = g.t("networks")
        need = {"v1_time_ms", "v1_energy_mj", "time_ms", "energy_mj", "gpu_time_ms", "gpu_uuid"}
        if n.empty or not need <= set(n.columns):
            continue
        n = n.dropna(subset=sorted(need - {"gpu_uuid"}))
        n = n[(n["gpu_time_ms"] / n["time_ms"] >= gpu_bound) & (np.abs(n["time_ms"] / n["v1_time_ms"] - 1) <= time_agreement)]
        for card, part in n.groupby("gpu_uuid"):
            d = 100 * ((part["energy_mj"] / part["time_ms"]) / (part["v1_energy_mj"] / part["v1_time_ms"]) - 1)
            out.append({"gpu": g.name, "card": str(card), "networks": int(len(part)), "mean_pct": float(d.mean()),
                        "mean_abs_pct": float(d.abs().mean())})
    return out


def _card_text(t: dict[str, Any], cards: list[dict[str, Any]] | None) -> list[str]:
    """The card-to-card paragraph of the H200/H100 section (empty without card data)."""
    by_card = energy_error_by_card(t["h200_networks"])
    L: list[str] = []
    if len(by_card) > 1:
        L += ["Cards of one model differ. The energy ratio error by the H200 card that measured the network "
              "(its NVML UUID; the H100 side spreads over many cards): "
              + "; ".join(f"{c['card'][:12]}: {c['bias_pp']:+.1f} pp mean, {c['mean_abs_pp']:.1f} pp mean |error| "
                          f"({c['pairs']} networks)" for c in by_card) + "."]
    if cards:
        spans = []
        for gpu in sorted({c["gpu"] for c in cards}):
            level = [c["mean_pct"] for c in cards if c["gpu"] == gpu and c["networks"] >= CARD_MIN_NETWORKS]
            if len(level) > 1:
                spans.append(f"{max(level) - min(level):.1f} points between the {short(gpu)}'s {len(level)} cards")
        L += ["The same GPU-bound networks measured eager on an earlier lease of the same GPU model (the rows the "
              "host-free ones superseded, `v1_*`) and eager again on these cards (time within 2%) draw "
              + "; ".join(f"{c['mean_pct']:+.1f}% power on {short(c['gpu'])} card {c['card'][:12]} "
                          f"({c['networks']} networks)" for c in cards)
              + ". The earlier rows were measured another way (schema 1), so only the differences between cards "
                "of one GPU carry meaning: "
              + ("; ".join(spans) if spans else "too few networks per card to say")
              + ". A card's own power level moves a measured energy ratio by points, which a prediction per GPU "
                "model cannot follow; the fit's pairs come from several cards, so it predicts their average."]
    return L + [""] if L else []


def _residual_text(info: dict[str, Any]) -> str:
    """The fitted model's boosted-tree residual, as words (empty for a model fitted without one)."""
    res = info.get("residual")
    if not res:
        return ""
    return (f" On top of the roofline, a boosted-tree residual ({res.get('rounds')} trees of depth "
            f"{res.get('params', {}).get('max_depth')}, fitted on every GPU's log residual with the same weights) "
            "multiplies each operation's time by a learnt factor, from the operation's own features and three that "
            "relate it to the GPU's compute die (output tiles per SM, the last wave's fill, bytes over L2; never "
            "the memory bandwidth, so an H100 and an H200 share it and their ratio stays the roofline's). The "
            "residual is not monotone in the specifications, so a GPU's time is the least over it and every "
            "catalogue GPU it is no better than in any specification (the lower envelope).")


def _tile_text(info: dict[str, Any]) -> str:
    """The tile structure and specification-dependent efficiencies of the fitted model, as words
    (empty for a model fitted without them)."""
    out = ""
    if info.get("gemm_tiles"):
        out += (" Matmul-like operations (linear, matmul, bmm, attention) take a tile structure instead, after "
                "NeuSight: for each candidate output tile (" + ", ".join(f"{a}x{b}" for a, b in info["gemm_tiles"])
                + ") the FLOPs padded to whole tiles run at the compute rate times that tile's learnt efficiency, "
                "the SMs also load each tile's input panels, and the fastest tile wins. Partial last waves are not "
                "charged: under the monotone rule (the best over any SM count up to the GPU's) they never are.")
    if info.get("spec_terms"):
        out += (" The efficiencies of GEMM-like operations (convolutions, matmuls) also depend on the GPU's "
                "specifications (" + ", ".join(info["spec_terms"]) + "; never its identity), through weights held "
                "where a better specification never lowers the rate.")
    return out


def _anchored_section(rows: list[dict[str, Any]]) -> list[str]:
    """Leave one GPU out, anchored on another GPU's measurement of the same operation (the path
    ``predict`` takes to a GPU it has not measured), as a report section; none for older reports."""
    if not rows:
        return []
    L = ["### Leave one GPU out, anchored on another GPU's measurement", "",
         "`predict` reaches a GPU without measurements of its own from an anchor GPU's time (the H100's) times "
         "the cross-GPU model's ratio of the two GPUs, so what decides its accuracy is the ratio, not the "
         "model's absolute time. Here each held-out GPU's operations are predicted that way from the same "
         "operation measured on each other GPU, by the model fitted without the held-out GPU: the anchor's "
         "measured time × predicted(held-out) / predicted(anchor). The same floor as above applies to both rows "
         "of a pair. Beside it, the fold model's own (specification-only) MAPE on the same operations. 'Same "
         "die': the same SMs, clocks, peaks and board power (the H100 SXM and the H200).", ""]
    lines = []
    for r in sorted(rows, key=lambda r: (r["gpu"], r["mape"])):
        groups = ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(r.get("by_group", {}).items()))
        lines.append(f"| {short(r['gpu'])} | {short(r['anchor'])} | {'yes' if r.get('same_die') else ''} | "
                     f"{r['rows']} | {100 * r['mape']:.1f}% | {100 * r['median_ape']:.1f}% | "
                     f"{100 * r['spec_only_mape']:.1f}% | {groups} |")
    L += table(["held-out GPU", "anchor GPU", "same die", "operations", "anchored MAPE", "median APE",
                "specification-only MAPE", "anchored MAPE by kind group"], lines) + [""]
    best = {}
    for r in rows:
        if r["gpu"] not in best or r["mape"] < best[r["gpu"]]["mape"]:
            best[r["gpu"]] = r
    L += ["Best anchor per held-out GPU (chosen after the fact, so an upper bound on what a rule that picks "
          "the anchor could reach): " + "; ".join(
              f"{short(g)} from {short(r['anchor'])} {100 * r['mape']:.1f}%" for g, r in sorted(best.items()))
          + ". The ≤ 10% target above is judged on the specification-only predictions; this table is not "
            "counted towards it.", ""]
    return L


def _scored_floor_text(cross: dict[str, Any]) -> str:
    """The kernel-time floor below which leave-one-GPU-out rows are not scored, as words."""
    floor_ms = cross.get("scored_min_gpu_ms")
    if floor_ms is None:
        return ""
    left = ", ".join(f"{short(g['gpu'])} {g['rows_below_floor']}" for g in cross.get("per_gpu", [])
                     if g.get("rows_below_floor"))
    unseen = [g for g in cross.get("per_gpu", []) if g.get("rows_kind_unseen")]
    apart = ("" if not unseen else
             " Rows of a kind group that no other GPU measured have nothing to transfer from and are scored apart: "
             + "; ".join(f"{short(g['gpu'])} {g['rows_kind_unseen']} rows ({', '.join(g.get('kinds_unseen') or [])}; "
                         f"MAPE {100 * g['kind_unseen_mape']:.0f}%)" if g.get("kind_unseen_mape") is not None else
                         f"{short(g['gpu'])} {g['rows_kind_unseen']} rows" for g in unseen) + ".")
    return (f" Only rows whose measured GPU time is at least {1000 * floor_ms:g} µs are scored, the same rule on "
            "every GPU: operations that launch no kernel or a tiny one (views, data movement) measure about 0 ms "
            "and their relative error says nothing about the GPU. Rows left out by it: " + (left or "none") + "."
            + apart)


def _precision_pairs(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One precision's H200/H100 network pairs (crossgpu_fit.h200_network_errors_at): the mean |error|
    and bias of the predicted time and energy ratios on all networks and on the held-out architectures'
    (each against CROSS_TARGETS' ratio target), per architecture, and how many the predictor could not
    estimate (counted, never dropped silently)."""
    def mean(v: list[float]) -> float | None:
        return sum(v) / len(v) if v else None

    scored = [r for r in rows if r.get("product_ratio_error_pp") is not None
              and r.get("energy_ratio_error_pp") is not None]
    summary = []
    for label, part in (("all networks measured on both", scored),
                        ("held-out architectures only", [r for r in scored if r.get("held_out_arch")])):
        t = [r["product_ratio_error_pp"] for r in part]
        e = [r["energy_ratio_error_pp"] for r in part]
        summary.append({"label": label, "networks": len(part), "time_pp": mean([abs(x) for x in t]),
                        "time_bias_pp": mean(t), "energy_pp": mean([abs(x) for x in e]), "energy_bias_pp": mean(e)})
    for r in summary:
        r["time_met"] = r["time_pp"] is not None and r["time_pp"] <= CROSS_TARGETS["ratio_pp"]
        r["energy_met"] = r["energy_pp"] is not None and r["energy_pp"] <= CROSS_TARGETS["ratio_pp"]
    archs: dict[str, list[dict[str, Any]]] = {}
    for r in scored:
        archs.setdefault(r["set_key"].split(":")[0], []).append(r)
    per_arch = [{"arch": a, "held_out_arch": bool(part[0].get("held_out_arch")), "networks": len(part),
                 **{k: mean([r[k] for r in part]) for k in ("measured_ratio", "product_ratio",
                                                            "measured_energy_ratio", "pred_energy_ratio")}}
                for a, part in sorted(archs.items())]
    return {"summary": summary, "per_arch": per_arch, "pairs": len(rows), "unscored": len(rows) - len(scored)}


def _precision_text(t: dict[str, Any], cross: dict[str, Any],
                    temps: dict[tuple[str, ...], float] | None = None) -> list[str]:
    """The H200/H100 subsections at precisions other than fp32 (empty when none was paired)."""
    L: list[str] = []
    for precision, pp in t["by_precision"].items():
        held_out_count = sum(r["networks"] for r in pp["summary"] if r["label"] == "held-out architectures only")
        L += [f"### H200 against H100 at {precision} (target ≤ 3 pp, time and energy)", "",
              f"The {pp['pairs']} {precision} networks measured on both GPUs (basis as above; every one host-free "
              "where both were replayed as CUDA graphs). Predicted: what `gpurec predict --precision "
              f"{precision}` answers on each GPU, the ratio of its GPU times and of its GPU energies. The "
              "cross-GPU model's network pairs are fp32 alone, but its operation rows include both GPUs' "
              f"{precision} operations of the training architectures, so the held-out architectures (no model "
              "trained on any of their rows) are the honest check"
              + (f"; none of these {pp['pairs']} networks is of a held-out architecture, so they check the "
                 "training architectures only." if not held_out_count else ".")
              + (f" {pp['unscored']} networks the predictor could not estimate are left out of the means."
                 if pp["unscored"] else ""), ""]
        lines = [f"| {r['label']} | {r['networks']} | {_fmt(r['time_pp'], '.1f')} | {_fmt(r['time_bias_pp'], '+.1f')} | "
                 f"{_verdict(r, 'time_met')} | {_fmt(r['energy_pp'], '.1f')} | "
                 f"{_fmt(r['energy_bias_pp'], '+.1f')} | {_verdict(r, 'energy_met')} |"
                 for r in pp["summary"]]
        L += table(["networks", "count", "mean |time ratio error| pp", "bias pp", "≤ 3 pp?",
                    "mean |energy ratio error| pp", "bias pp", "≤ 3 pp?"], lines) + [""]
        lines = [f"| {r['arch']} | {'yes' if r['held_out_arch'] else ''} | {r['networks']} | "
                 f"{r['measured_ratio']:.3f} | {r['product_ratio']:.3f} | "
                 f"{r['measured_energy_ratio']:.3f} | {r['pred_energy_ratio']:.3f} |" for r in pp["per_arch"]]
        L += table(["architecture", "held-out arch", "networks", "measured time ratio", "predicted",
                    "measured energy ratio", "predicted"], lines) + [""]
        rows = cross.get("h200_networks_by_precision", {}).get(precision, [])
        L += _temperature_text(temperature_power_shift(rows, temps) if temps else None)
    return L


def _in_sample_section(left_out: list[dict[str, Any]], in_sample: list[dict[str, Any]]) -> list[str]:
    """Leave-one-GPU-out error beside the error of the model fitted with every GPU (empty without the latter)."""
    fitted = {r["gpu"]: r for r in in_sample}
    rows = [(g, fitted[g["gpu"]]) for g in left_out if g["gpu"] in fitted]
    if not rows:
        return []
    L = ["What limits it: the same rows predicted by the model fitted with every GPU (in sample: every GPU in "
         "the fit, its NeuSight rows a sample per operation as above, every row scored), scored the same way, "
         "and again with each GPU and kind group's median error "
         "taken out (the most that better specification terms, which move a GPU's kind group as a whole, "
         "could gain). Where the in-sample error is about the left-out error, the GPU transfers as well as the "
         "form fits; the rest is scatter between operations of one GPU that the operation features do not "
         "explain.", ""]
    lines = [f"| {short(g['gpu'])} | {100 * g['mape']:.1f}% | {100 * f['mape']:.1f}% | "
             f"{100 * f['mape_offset_removed']:.1f}% | {f['rows']} |" for g, f in rows]
    return L + table(["GPU", "left out", "fitted with every GPU", "same, each kind group's median error removed",
                      "rows"], lines) + [""]


def _verdict(row: dict[str, Any], key: str) -> str:
    """'met', '**not met**', or 'no networks' where the row scored none (nothing to judge)."""
    if not row.get("networks"):
        return "no networks"
    return "met" if row[key] else "**not met**"


def _fmt(v: Any, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def uncertainty_section(unc: dict[str, Any], cross: dict[str, Any] | None) -> list[str]:
    """The bands estimates carry: measured GPUs', and what an extrapolated GPU's compounds
    (gpurec.model.bands.extrapolated, as the predictor does)."""
    from gpurec.model.bands import extrapolated_from, measured_bands
    from gpurec.model.fitting.crossgpu_fit import public_model_band

    b = unc.get("measured_gpu", {})
    u = unc.get("unmeasured_gpu", {})

    def fmt(r: Sequence[float]) -> str:
        return "[" + ", ".join(f"{x:.2f}" for x in r) + "]"

    measured = measured_bands(unc)
    public = public_model_band((cross or {}).get("public_models", []))
    found = extrapolated_from(unc, public)
    text = (f"`Estimate.low/high` = estimate × measured/predicted ratio quantiles {b.get('quantiles')}. "
            f"Measured GPUs, from {unc.get('source')}: time ×{fmt(measured[0])}, energy ×{fmt(measured[1])}. ")
    if found is None:
        text += f"GPUs without operation measurements: {u.get('source', 'the measured band widened')}."
    else:
        (band_t, band_e), (cross_t, cross_e) = found
        sources = [f"{u['source']} (time ×{fmt(u['time_ratio'])}, energy ×{fmt(u['energy_ratio'])})"
                   if "time_ratio" in u else None,
                   f"{public['models']} {public['source']} (time ×{fmt(public['time_ratio'])})" if public else None]
        text += ("GPUs without operation measurements (the H100's estimate times the cross-GPU ratio): the measured "
                 "band compounded with the ratio's error (log half-widths as independent errors), the widest of "
                 + " and ".join(x for x in sources if x) + f", time ×{fmt(cross_t)}, energy ×{fmt(cross_e)}: "
                 f"time ×{fmt(band_t)}, energy ×{fmt(band_e)}; recommendations widen them where nothing measured "
                 "of that GPU backs the figure (README, \"Bands\").")
    return ["## Uncertainty band", "", text, ""]


def crossgpu_section(cross: dict[str, Any] | None, energy_noise: list[dict[str, Any]] | None = None,
                     cards: list[dict[str, Any]] | None = None,
                     temps: dict[tuple[str, ...], float] | None = None,
                     datasets: list[Any] | None = None) -> list[str]:
    """docs/accuracy.md's cross-GPU section from models/crossgpu_report.json (``datasets``, the
    per-GPU datasets, for the paragraph on networks measured on several cards; none: left out)."""
    L = ["## Across GPUs: the cross-GPU operation model", ""]
    if not cross:
        return L + ["No `models/crossgpu_report.json`: fit it with `gpurec train-crossgpu`.", ""]
    t = crossgpu_tables(cross)
    info = cross.get("model_info", {})
    src = info.get("sources", {})
    h200_eager_rows = sum(v for k, v in src.items() if k.startswith("h200_eager|"))
    L += ["Every catalogue GPU but the H100 (the cross-GPU anchor) - the H200 included, although its host-free "
          "rows enter the fit below - takes the H100's GPU time - its measured "
          "operations and its "
          "whole-network correction included - times, per operation, the ratio of a physical model's times "
          "(`gpurec/model/crossgpu.py`): a roofline over the FP32 peak or the tensor-core peak of the "
          "operation's math (TF32 for FP32 convolutions, FP16/BF16 for GEMM-like operations in those types, so "
          "a V100's missing BF16 tensor cores show), DRAM bandwidth and the SMs' own load/store rate, combined "
          "by a soft maximum whose sharpness (how far compute and memory overlap) is learnt per operation, with "
          "a power-headroom factor, wave quantisation and efficiencies bounded in (0, 1) learnt from the "
          "operation's features only, per group of the work an operation does (autocast's dtype casts with the "
          "elementwise operations, embedding lookups with data movement: `physical_group`)." + _tile_text(info)
          + _residual_text(info) + " It is monotone by construction: a GPU no worse in any "
          "specification (FP32 and tensor-core peaks, bandwidth, L2, SMs, clock, board power) is never predicted slower "
          "(tested over every such catalogue pair, `tests/test_crossgpu.py`).", "",
          "Fitted by `gpurec train-crossgpu` on the rows with data: " + ", ".join(
              f"{k.split('|')[0]} {short(k.split('|')[1])} {v}" for k, v in sorted(src.items()))
          + f" (the fit samples at most {info.get('neusight_cap_per_op')} NeuSight rows per GPU, operation and "
            f"split, {info.get('rows')} rows in all; the evaluation below uses every row).",
          "",
          "* **NeuSight rows** (public, MIT, `datasets/external/neusight`; FP32, TF32 off) are timed around one "
          "Python call, so the host's dispatch is inside each number. The host floor is **excluded**: per GPU "
          "and operation the smallest latency is taken as the floor, rows below 3× it are host-dominated and "
          "left out, and the floor is subtracted from the rest (`gpurec/dataset/external.py`).",
          "* **H200 host-free rows** (from session 11): timed as CUDA-graph replays like the H100's; their target "
          "is the measured GPU time.",
          ("* **H200 eager rows** (2026-11-26, where no host-free row of the operation exists) count where the GPU "
           "dominates: the same operation on the H100 has host-free / "
           f"eager ≥ {info.get('gpu_dominated_h200', {}).get('h100_host_free_over_eager_min')} and the H200's "
           f"eager time is ≥ {info.get('gpu_dominated_h200', {}).get('h200_eager_over_h100_host_ms_min')}× the "
           "H100 host's issue time (eager back-to-back time is about max(host, GPU)). Their target is the eager "
           "time times the same operation's H100 host-free / eager time: back-to-back eager calls leave gaps "
           "between kernels even where the GPU dominates, and the H200 runs the same kernels."
           if h200_eager_rows else
           "* **H200 eager rows** (2026-11-26): none is used; every one of those operations has a host-free row "
           "now, which takes its place."),
          f"* **H200/H100 network pairs**: {info.get('network_pairs', 0)} networks of the training architectures, "
          "host-free on both or GPU-bound on both (rule below), enter the fit through their measured time ratio "
          "against the "
          "model's summed operation times (left out of the leave-the-H100-out and leave-the-H200-out folds).",
          ""]
    L += ["### Leave one GPU out, per operation kind (target ≤ 10% MAPE)", "",
          "Each GPU's rows predicted by the model fitted without that GPU; rows that are not host-dominated "
          "(H100: host-free rows; H200: host-free rows, and GPU-dominated eager rows of operations without one). "
          "MAPE, with rows in brackets."
          + _scored_floor_text(cross), ""]
    head = ["GPU", "all rows", "median APE", *t["groups"], "≤ 10%?"]
    lines = []
    for g in t["per_gpu"]:
        cells = [f"{100 * c['mape']:.0f}% ({c['rows']})" if c else "" for c in g["by_group"].values()]
        lines.append("| " + " | ".join([short(g["gpu"]), f"{100 * g['mape']:.1f}% ({g['rows']})",
                                         f"{100 * g['median_ape']:.1f}%", *cells,
                                         "met" if g["met"] else "**not met**"]) + " |")
    L += table(head, lines) + [""]
    L += _in_sample_section(t["per_gpu"], cross.get("per_gpu_in_sample", []))
    L += _anchored_section(cross.get("anchored", []))
    L += ["### Leave one GPU out, whole public transformer models (target ≤ 8%)", "",
          "NeuSight's full-depth models predicted on the held-out GPU from their one-layer traces: each traced "
          "node mapped to an operation (linear/addmm, matmul, softmax, layer norm, GELU, elementwise, embedding; "
          "views, shape queries and inference dropout launch no modelled work), layer-0 nodes counted "
          "`num_layer` times, GPU time only, against the measured end-to-end latency.", ""]
    lines = [f"| {short(r['gpu'])} | {r['model']} | {r['mode']} | {r['seq_len']} | {r['batch']} | "
             f"{r['measured_ms']:.1f} | {r['pred_ms']:.1f} | {100 * r['ape']:.1f}% |" for r in t["public"]]
    L += table(["GPU", "model", "mode", "seq", "batch", "measured ms", "predicted ms", "APE"], lines) + [""]
    lines = [f"| {short(r['gpu'])} | {r['models']} | {100 * r['mape']:.1f}% | {'met' if r['met'] else '**not met**'} |"
             for r in t["public_gpu"]]
    L += table(["GPU", "models", "MAPE", "≤ 8%?"], lines) + [""]
    L += ["### H200 against H100 on collected networks GPU-bound on both (target ≤ 3 pp, time and energy)", "",
          "Networks (fp32) measured on both GPUs. Basis `host_free`: both timed as CUDA-graph replays (GPU time "
          "and GPU energy of the step; the host is in neither number), measured ratio H200 / H100 of those. Basis "
          "`eager` (H200 networks measured eager only): the H100's host-free / eager time ≥ 0.9 and the H200's "
          "eager time ≥ 1.25× the H100 step's host time, measured ratio H200 eager / H100 eager, in time and "
          "in energy. Predicted time ratio: the "
          "cross-GPU model's summed operation times, the model fitted with the H200's rows and network pairs of "
          "the training architectures, so networks of the held-out test architectures (`gpurec.sets.TEST_ARCHS`, "
          "marked 'yes') are the honest check. Predicted energy ratio: the predictor's GPU energy on each GPU "
          "(its times, with this cross-GPU model, times its power; the H200 shares the H100's compute die, so "
          "its network power is the H100's predicted power over idle on the H200's own idle floor, plus each "
          "memory type's DRAM energy per byte × the network's bytes over each GPU's time, the H200's minus the "
          "H100's; a recurrent layer's bytes count its weights once per step, as cuDNN reads them: "
          f"{_energy_per_byte(cross)}). Predicted H200 time: the H100's "
          "host-free network time × the time ratio, against the H200's time on the pair's basis (GPU time, or "
          "eager time of a GPU-bound step, about its GPU time).", ""]
    if t["h200_networks"]:
        lines = [f"| {r['set_key']} | {r['mode']} | {'yes' if r.get('held_out_arch') else ''} | "
                 f"{r.get('basis', 'eager')} | "
                 f"{r['measured_ratio']:.3f} | {r['pred_ratio']:.3f} | {r['ratio_error_pp']:+.1f} | "
                 f"{_fmt(r.get('measured_energy_ratio'), '.3f')} | {_fmt(r.get('pred_energy_ratio'), '.3f')} | "
                 f"{_fmt(r.get('energy_ratio_error_pp'), '+.1f')} | "
                 f"{r.get('h200_basis_time_ms', r['h200_time_ms']):.2f} | {r['pred_h200_ms']:.2f} | {100 * r['ape']:.1f}% |"
                 for r in t["h200_networks"]]
        L += table(["network", "mode", "held-out arch", "basis", "measured ratio", "predicted ratio", "error pp",
                    "measured energy ratio", "predicted energy ratio", "energy error pp", "H200 ms",
                    "predicted ms", "APE"], lines) + [""]
        lines = [f"| {r['label']} | {r['networks']} | {_fmt(r['time_pp'], '.1f')} | {_fmt(r['time_bias_pp'], '+.1f')} | "
                 f"{'met' if r['time_met'] else '**not met**'} | {_fmt(r['energy_pp'], '.1f')} | "
                 f"{'met' if r['energy_met'] else '**not met**'} |" for r in t["h200_summary"]]
        L += table(["networks", "count", "mean |time ratio error| pp", "bias pp", "≤ 3 pp?",
                    "mean |energy ratio error| pp", "≤ 3 pp?"], lines) + [""]
        if energy_noise:
            L += ["Noise floor of a measured energy ratio: a network re-measured on the same GPU (`repeats.parquet`, "
                  "time within 2% of the first measurement) differs in energy by "
                  + "; ".join(f"{r['mean_pct']:.1f}% on average ({r['median_pct']:.1f}% median, {r['pairs']} pairs) "
                              f"on the {short(r['gpu'])}" + (f", {r['basis']}" if r.get("basis") else "")
                              for r in energy_noise)
                  + ". A measured H200/H100 ratio holds one such measurement of each GPU, so a perfect prediction "
                    "would still be off by about that much.", ""]
        L += _card_text(t, cards)
        if datasets is not None:
            L += _card_averaged_text(card_averaged_energy_errors(t["h200_networks"], gpus=datasets))
        L += _temperature_text(temperature_power_shift(t["h200_networks"], temps) if temps else None)
        product = [r for r in t["h200_summary"] if r["product_pp"] is not None]
        if product:
            L += ["What the predictor itself answers (the H100's per-operation times, measured ones included, "
                  "times the per-operation ratios): mean |time ratio error| "
                  + ", ".join(f"{r['product_pp']:.1f} pp on {r['label']}" for r in product) + ".", ""]
        L += [f"H200 time MAPE {100 * t['h200_mape']:.1f}% as the H100's time × the ratio"
              + (f", against {100 * t['h200_direct_mape']:.1f}% for the model's own summed times"
                 + (": transferring from the H100 anchor is the more accurate, and the predictor does so."
                    if t["h200_direct_mape"] > t["h200_mape"] else
                    ": here the model's own times are the more accurate, yet the predictor transfers from the "
                    "H100 anchor (its measured operations and network correction).")
                 if t["h200_direct_mape"] is not None else ".")
              + (f" For reference, the leave-the-H200-out model (no H200 data at all) is off by "
                 f"{t['leave_h200_out_pp']:.1f} pp on average in time." if t["leave_h200_out_pp"] is not None else ""),
              ""]
    else:
        L += ["No network is GPU-bound on both GPUs.", ""]
    return L + _precision_text(t, cross, temps)


def write(rep: dict[str, Any], manifest: dict[str, Any], out: Path, data_root: Path | None = None,
          host_gpu: dict[str, Any] | None = None, sources: dict[str, Any] | None = None,
          cross: dict[str, Any] | None = None, energy: dict[str, Any] | None = None,
          memory_fit: Any = None, precision: dict[str, Any] | None = None) -> str:
    """Render the report (and its plots next to ``out``); return the Markdown text."""
    img = out.parent / "img"
    made = plots(rep, img)
    tabs = error_tables(rep)
    gpus = rep.get("gpus_measured", [])
    rows = rep["rows"]
    L: list[str] = ["# Prediction accuracy", ""]
    c = rep.get("config", {})
    L += [f"Generated by `gpurec report accuracy` from the `report.json` of a model trained "
          f"{rep.get('created', '?')} by `gpurec train` (Optuna trials {c.get('tune_trials')}, "
          f"{c.get('n_folds')} folds, seed {c.get('seed')}; data sha256 `{rep.get('data_sha256', '?')[:12]}…`). "
          "Re-run after retraining. MAPE = mean absolute percentage error; ±10% = share of rows within 10% of "
          "the measurement; `rows` = how many measurements each number rests on.", ""]
    L += ["## Data behind these numbers", ""]
    L += [f"* GPUs with per-operation measurements: {', '.join(f'{short(g)} (`{g}`)' for g in gpus) or 'none'}."]
    for g, pv in rep.get("provenance", {}).items():
        n = pv.get("rows", {})
        bits = [f"{k} {', '.join(v)}" for k, v in pv.items() if v and k not in ("gpu_uuid", "rows")]
        boards = len(pv.get("gpu_uuid", []))
        L += [f"  * {short(g)} (`{g}`): {n.get('operations', 0)} operation rows, {n.get('networks', 0)} network "
              f"rows; {'; '.join(bits)}" + (f"; {boards} board(s)" if boards else "") + "."]
    per = ", ".join(f"{short(k.split('|')[0])} {k.split('|')[1]}: {v}" for k, v in rows["by_gpu_mode"].items())
    L += [f"* Operation rows trained and validated on: {rows['operations']} ({per})."]
    L += [f"* Whole-network rows: {rows['networks_train_archs']} of training architectures, "
          f"{rows['networks_test_archs']} of unseen test architectures (never trained on)."]
    dropped = {k: v for k, v in rep.get("dropped_rows", {}).items() if v}
    if dropped:
        L += [f"* Rows left out: {', '.join(f'{v} {k}' for k, v in dropped.items())}."]
    tuning = rep.get("tuning", {})
    if tuning:
        L += ["* XGBoost hyper-parameters: Optuna, " + "; ".join(
            f"{t}: {v.get('trials', 0)} trials"
            + (f", grouped-CV RMSE(log) {v['default_cv_rmse_log']:.3f} → {v['best_cv_rmse_log']:.3f}"
               if v.get("trials") else "") for t, v in tuning.items())
            + ". Tuning sees all training rows, so the cross-validated numbers below are slightly optimistic "
              "about hyper-parameters (never about data)."]
    L += [""]

    # headline
    ts = rep.get("test_set", {})
    L += ["## Headline: unseen architectures", ""]
    L += [f"Target: whole-network MAPE ≤ {TARGET_MAPE:g}% for time and energy on unseen architectures on a "
          "measured GPU.", ""]
    if ts.get("available"):
        o = ts["corrected"]["overall"]
        ok_t = (o["time"].get("mape") or 1e9) <= TARGET_MAPE
        ok_e = (o["energy"].get("mape") or 1e9) <= TARGET_MAPE
        L += [f"**Result: time {pct(o['time'].get('mape'))}, energy {pct(o['energy'].get('mape'))} over "
              f"{o['n']} networks of {len(ts.get('archs', []))} unseen architectures "
              f"({', '.join(ts.get('archs', []))}) — target {'met' if ok_t and ok_e else 'NOT met'}"
              f"{'' if o['n'] >= 10 else ' (too few networks to be conclusive)'}.**", ""]
        L += table(["estimate", "GPU", "mode", *HEAD], render_error_rows(tabs["unseen"], ("estimate",)))
        if any("H100" not in str(r.get("gpu", "")) for r in ts.get("records", [])):
            L += ["", "Rows of a GPU other than the H100 score the trained models' own estimate for that GPU "
                  "(its rows in the boosters). `predict` and `recommend` give every GPU but the H100 the H100's "
                  "time times the cross-GPU ratio instead (\"Across GPUs\" below); what a user gets on those "
                  "networks is in \"Host-free time and energy, unseen test architectures\"."]
        L += ["", *by_batch_lines(ts.get("records", []))]
        refit = manifest.get("network_correction", {}).get("nonrecurrent_fitted_after_training")
        if refit:
            L += ["", "The network time correction of networks without recurrent layers was fitted after "
                  "training (`gpurec tools correction-nonrecurrent`: chosen and fitted on this report's "
                  "leave-one-family-out network sums, as `gpurec train` now does; \"What each correction term "
                  "buys\" below). The table above is training's, with one correction for every network; the "
                  "sections that predict with the shipped models (\"Host-free time and energy, unseen test "
                  "architectures\", the sequence models, the validation logs) use the refit."]
        if manifest.get("network_correction", {}).get("measured_gap_fitted_after_training"):
            L += ["", "The gap between kernels that each looked-up operation adds to a step replayed as one CUDA "
                  "graph was fitted after training (`gpurec tools correction-measured-gap`, from the committed "
                  "network and in-network tables, as `gpurec train` now does). The table above is training's, "
                  "without it; the sections that predict with the shipped models (\"Host-free time and energy, "
                  "unseen test architectures\" first) include it."]
        if ts.get("measured_lookup"):
            L += ["", f"{100 * ts.get('lookup_hit_share_ops', 0):.0f}% of the test networks' operations were "
                  "measured as part of training architectures (same signature, GPU and mode); the default "
                  "predictor uses those measurements and predicts the rest."]
        from gpurec.model.persist import REFRESH_KEY

        refreshed = manifest.get(REFRESH_KEY)
        if refreshed:
            L += ["", f"The measured-operation lookup was rebuilt after training ({refreshed.get('refreshed', '?')}, "
                  f"`gpurec tools refresh-lookup`: {refreshed.get('rows', 0):,} rows, every usable row of the "
                  "committed tables, with training's targets; the boosters and corrections as trained). The table "
                  "above is training's, with the lookup of its own rows; the sections that predict with the "
                  "shipped models use the rebuilt one. The unseen test architectures' rows never enter it."]
    else:
        L += [f"Not available: {ts.get('reason', 'no test networks')}."]
    L += [""]

    # published figures
    L += ["## Beside published figures", "",
          "Different hardware, workloads and error definitions: these are orientation, not a like-for-like "
          "comparison.", ""]
    L += table(["work", "reported", "kind"], [row(list(p)) for p in PUBLISHED])
    lx = rep["leave_one_family_out"].get("xgboost", {})
    mine = []
    if "network_corrected" in lx:
        o = lx["network_corrected"]["overall"]
        mine.append(f"leave-one-family-out whole networks: time {pct(o['time'].get('mape'))} "
                    f"({share(o['time'].get('within10'))} within ±10%), energy {pct(o['energy'].get('mape'))} "
                    f"({share(o['energy'].get('within10'))} within ±10%), {o['n']} networks")
    if ts.get("available"):
        o = ts["corrected"]["overall"]
        mine.append(f"unseen test architectures: time {pct(o['time'].get('mape'))} "
                    f"({share(o['time'].get('within10'))} within ±10%), energy {pct(o['energy'].get('mape'))}, "
                    f"{o['n']} networks")
    logo = rep.get("leave_one_gpu_out", {})
    if logo.get("available"):
        for g, e in logo["gpus"].items():
            x = e.get("xgboost", {})
            if "per_op" in x:
                o = x["per_op"]["overall"]
                mine.append(f"held-out GPU {short(g)}: per-operation time {pct(o['time'].get('mape'))}, "
                            f"energy {pct(o['energy'].get('mape'))} ({o['n']} rows)")
            for key, what in (("network_train_archs_corrected", "networks"),
                              ("network_test_archs_corrected", "unseen-architecture networks")):
                if key in x:
                    o = x[key]["overall"]
                    mine.append(f"held-out GPU {short(g)} {what}: time {pct(o['time'].get('mape'))}, "
                                f"energy {pct(o['energy'].get('mape'))} ({o['n']} networks)")
    else:
        mine.append(f"cross-GPU: {logo.get('reason', 'not available')} — no number comparable to Habitat/NeuSight")
    L += ["", "gpurec here: " + "; ".join(mine) + ".", ""]

    # validations
    L += ["## Per-operation error", "",
          "Grouped K-fold by operation signature (no operation in both train and test folds); "
          "energy = predicted power × predicted time, compared with measured energy per call."
          + kernel_free_note(rep.get("grouped_kfold", {}).get("xgboost", {})), ""]
    L += table(["validation", "model", "GPU", "mode", *HEAD],
               render_error_rows(tabs["per_operation"], ("validation", "model")))
    L += ["", "Leave-one-family-out takes every operation that occurs in any model of the held-out family "
          "out of training (families: " + ", ".join(rep["leave_one_family_out"].get("families", [])) + "); "
          "rows shared by several families are tested once per family.", ""]

    L += ["## Whole-network error (leave-one-family-out)", "",
          "Predicted = sum of per-operation predictions (models trained without the family), then the learned "
          "network correction, itself fitted without the family (second-level leave-one-family-out).", ""]
    lines = render_error_rows(tabs["whole_network"], ("estimate", "model"))
    L += table(["estimate", "model", "GPU", "mode", *HEAD], lines) if lines else ["No network rows."]
    L += [""]

    nc = rep.get("network_correction", {})
    if nc.get("available"):
        serving = nc.get("mape_by_serving_mode") or {}
        L += ["### What each correction term buys", "",
              f"Cross-validated MAPE over {nc['n_networks']} networks in {nc['n_families']} families "
              "(lower is better). Each serving mode (the correction mode whose coefficients a network gets: its "
              "own precision's with enough networks, else its sibling's or its step mode's) chooses its own "
              "variant on the networks it serves, the simplest within 1% of the best (**bold**).", ""]
        def by_size(d: dict[str, list[str]]) -> list[str]:
            return sorted(d, key=lambda v: (len(d[v]), v))

        def chosen_in(kind: str, v: str, mode: str | None) -> bool:
            c = nc["chosen"][kind]
            return c == v if isinstance(c, str) else mode is not None and c.get(mode) == v

        def cells(kind: str, v: str) -> list[str]:
            out = [pct(nc["mape_by_variant"][kind][v])]
            out[0] += " **chosen**" if not serving and chosen_in(kind, v, None) else ""
            for m, d in sorted(serving.items()):
                cell = pct(d[kind][v])
                out.append(f"**{cell}**" if chosen_in(kind, v, m) else cell)
            return out

        tl = [row([f"time: {v}", ", ".join(nc["time_variants"][v]) or "(none)", *cells("time", v)])
              for v in by_size(nc["time_variants"])]
        # networks without recurrent layers choose a time variant of their own, where the sums knew them
        if any("nonrecurrent_time" in d for d in serving.values()):
            own = nc["chosen"].get("nonrecurrent_time", {})

            def own_cell(m: str, d: dict[str, Any], v: str) -> str:
                if "nonrecurrent_time" not in d:
                    return "—"
                cell = pct(d["nonrecurrent_time"][v])
                return f"**{cell}**" if own.get(m) == v else cell

            tl += [row([f"time, networks without recurrent layers: {v}", ", ".join(nc["time_variants"][v]) or "(none)",
                        "—", *(own_cell(m, d, v) for m, d in sorted(serving.items()))])
                   for v in by_size(nc["time_variants"])]
        pl = [row([f"power: {v}", ", ".join(nc["power_variants"][v]) or "(none)", *cells("power", v)])
              for v in by_size(nc["power_variants"])]
        en = nc["mape_by_variant"]["energy"]
        blank = [""] * len(serving)
        el = [row(["energy: none", "—", pct(en.get("none")), *blank]),
              row(["energy: chosen", "—", pct(en.get("chosen")), *blank])]
        L += table(["variant", "fitted terms", "MAPE, all",
                    *(f"`{m}` ({d['n']})" for m, d in sorted(serving.items()))], tl + pl + el)
        per_mode = nc.get("by_correction_mode") or {}
        if per_mode:
            L += ["", "Per correction mode (step mode, and the precision where not fp32: a precision gets a "
                  "correction of its own from 30 networks on, else its sibling's (fp16-mixed takes bf16-mixed's) "
                  "or its step mode's fp32 one), the same leave-one-family-out networks before (op sum) and "
                  "after the chosen correction. The tables above and below keep to fp32 networks.", ""]
            L += table(["correction mode", "networks", "time, op sum", "time, corrected", "energy, op sum",
                        "energy, corrected"],
                       [row([f"`{m}`", str(d["n"]), pct(d["raw_time_mape"]), pct(d.get("corrected_time_mape")),
                             pct(d["raw_energy_mape"]), pct(d.get("corrected_energy_mape"))])
                        for m, d in sorted(per_mode.items())])
        coef = manifest.get("network_correction", {})
        refit = (coef.get("nonrecurrent_fitted_after_training") or {}).get("mape_by_mode") or {}
        if refit:
            L += ["", "Networks without recurrent layers, fitted after training on the same leave-one-family-out "
                  "sums (`gpurec tools correction-nonrecurrent`; the recurrent families' held-out error no longer "
                  "sets their intercept): cross-validated time MAPE of each variant on those networks alone, "
                  "the chosen one in bold.", ""]
            own = coef.get("nonrecurrent_time_variant") or {}
            L += table(["variant", *(f"`{m}` ({d.get('n')})" for m, d in sorted(refit.items()))],
                       [row([v, *(f"**{pct(d['nonrecurrent_time'][v])}**" if own.get(m) == v
                                  else pct(d["nonrecurrent_time"][v]) for m, d in sorted(refit.items()))])
                        for v in by_size(nc["time_variants"])])
        L += ["", "Coefficients kept (per GPU+mode where ≥ the minimum networks, else pooled per mode `*`; "
              "`time_floor_ms`: the smallest op sum the time coefficients were fitted on, below which the "
              "intercept shrinks with the sum, so the correction is not extrapolated; a precision key without "
              "one takes its step mode's):", "",
              "```", json.dumps({"time": coef.get("time_coef"), "power": coef.get("power_coef"),
                                 "rows": coef.get("n_rows"), "time_floor_ms": coef.get("time_floor_ms"),
                                 **({"time, networks without recurrent layers": coef["nonrecurrent_time_coef"],
                                     "time_floor_ms, networks without recurrent layers":
                                         coef.get("nonrecurrent_time_floor_ms")}
                                    if coef.get("nonrecurrent_time_coef") else {})}, indent=1), "```", ""]

    L += ["## Leave-one-GPU-out", ""]
    if logo.get("available"):
        L += ["Models trained on the other GPUs' operation rows; network correction pooled from the other GPUs' "
              "networks. A GPU measured only as whole networks is the realistic case of a GPU without "
              "operation measurements (every estimate is a cross-GPU extrapolation).", ""]
        L += table(["validation", "model", "level", "GPU", "mode", *HEAD],
                   render_error_rows(tabs["leave_one_gpu_out"], ("validation", "model", "level")))
    else:
        L += [f"{logo.get('reason', 'not available')}. Predictions for catalogue GPUs without measurements "
              "extrapolate through the hardware features and the roofline margin and are unvalidated; their "
              "uncertainty band is widened."]
    L += [""]
    datasets = _datasets(data_root, None)  # read once: the sections below all look at it
    L += crossgpu_section(cross, network_energy_repeatability(gpus=datasets), card_power_differences(gpus=datasets),
                          card_temperatures(gpus=datasets), datasets)
    unc = manifest.get("uncertainty", {})
    if unc:
        L += uncertainty_section(unc, cross)
    L += host_gpu_section(host_gpu, rep, sources)
    L += precision_section(precision)
    L += memory_section(data_root, memory_fit)
    L += energy_section(energy, manifest)
    L += repeatability_section(gpus=datasets)
    L += ["## Speed", "",
          "Prediction speed is measured by `gpurec report speed --measure` and reported in "
          "[speed.md](speed.md).", ""]
    if made:
        L += ["## Plots", ""] + [f"![{m}](img/{m})" for m in made] + [""]
    text = "\n".join(L)
    atomic_write_text(out, text)
    return text


MEMORY_TARGET_PCT = 15.0  # target: the peak-memory estimate within 15% of the measured peak


def memory_rows(data_root: Path | str | None = None, fit: Any = None,
                extract: Any = None) -> list[dict[str, Any]]:
    """Estimated against measured peak memory for every row that carries a measured peak
    (gpurec.model.fitting.memory_fit.peak_table: trusted or marked ``leftover_suspect``), with the
    analytic part alone and, given ``fit``, with the fitted terms."""
    from gpurec.model.fitting.memory_fit import peak_table, terms_for
    from gpurec.ops.memory import analytic_memory

    try:
        table = peak_table(data_root)
    except FileNotFoundError:
        return []
    if not len(table):
        return []
    out: list[dict[str, Any]] = []
    for r, t in zip(table.to_dict("records"), terms_for(table, extract), strict=True):
        analytic = analytic_memory(t).total_bytes
        est = fit.apply(t).total_bytes if fit is not None else analytic
        m = r["measured_bytes"]
        out.append({**r, "estimated_gb": est / 1e9, "analytic_gb": analytic / 1e9, "measured_gb": m / 1e9,
                    "error_pct": (est / m - 1.0) * 100.0 if m > 0 else float("nan"),
                    "analytic_error_pct": (analytic / m - 1.0) * 100.0 if m > 0 else float("nan")})
    return out


def _within(rows: list[dict[str, Any]], key: str = "error_pct") -> int:
    return sum(abs(r[key]) <= MEMORY_TARGET_PCT for r in rows)


def _suspect_reasons(suspect: list[dict[str, Any]]) -> list[str]:
    """Why peaks are suspect, one line per reason; the many amounts still allocated after a
    collection (``allocated_before_bytes`` above the limit) are one reason with their range."""
    reasons: dict[str, int] = {}
    before_mib: list[float] = []
    for r in suspect:
        before = r.get("allocated_before_bytes")
        if before is not None and "allocated before" in r["leftover_suspect"]:
            before_mib.append(before / 2**20)
        else:
            reasons[r["leftover_suspect"]] = reasons.get(r["leftover_suspect"], 0) + 1
    out = [f"{n}: {why}" for why, n in sorted(reasons.items())]
    if before_mib:
        out.append(f"{len(before_mib)}: {min(before_mib):.0f}–{max(before_mib):.0f} MiB still allocated before the "
                   "step, after a garbage collection")
    return out


def memory_section(data_root: Path | str | None = None, fit: Any = None, extract: Any = None) -> list[str]:
    """Peak memory: the estimate (gpurec.ops.memory with the fitted terms of models/memory.json)
    against the measured peaks, trusted peaks and leftover-suspect ones apart, by split
    (training / held-out architectures), family and mode."""
    L = ["## Peak memory", "",
         "`gpurec.ops.memory` estimates a step's peak memory without running it; `recommend` and `predict` use it "
         "for `fits`. The analytic part is parameters and the most memory alive at once: in inference the "
         "activations alive at once; in training the step's timeline, forward keeping what autograd saves "
         "(inputs of convolutions and matmuls, outputs of ReLU, sigmoid and tanh, a copy of the input of an "
         "in-place activation whose backward needs it, the input and output of an LSTM or GRU), then backward "
         "freeing each saved tensor after its last "
         "backward user while activation and parameter gradients appear, with the step's result and its "
         "gradient alive throughout; a batch-first LSTM or GRU copies its input during each call and its "
         "output's gradient during backward (PyTorch's `_cudnn_rnn`); max pooling computes int64 argmax indices "
         "(held during the call in inference, kept for backward in training); under autocast each weight's "
         "low-precision copy lives through the layer it was made for, a cast keeps nothing for backward, and "
         "Swin's attention scores are float32; a tensor made like another (`ones_like`) keeps nothing of it, "
         "and in inference the scores a softmax reads stay alive while its output is read (a Python local "
         "holds them), and so does a container module's argument until its call returns (the caller holds it); "
         "in training a Linear's bias gradient summed over many rows holds ATen's staging buffer of partial sums "
         "during its backward (its launch heuristic reproduced, with the H100's and H200's SM count). "
         "Each tensor takes the allocator's 512-byte "
         "blocks. The fitted terms add "
         "what the analytic part cannot say: a fixed floor per mode (cuBLAS and cuDNN workspaces), how far "
         "each convolution's workspace (in inference its inputs plus outputs during its call, for the "
         "convolutions cuDNN gives one: none for depthwise, 1x1 stride-1 and RGB-stem convolutions, as "
         "measured per convolution on an H200) lifts the peak, scratch space proportional to the largest "
         "matmul's inputs plus outputs (in training also the largest convolution's), and what cuDNN's RNN "
         "buffers add above the peak where they live: the workspace during each call (two layers' gates per "
         "token plus 2,600 tokens' worth of every layer's) and, in training, the reserve space from the forward "
         "to the RNN's backward (5 hidden-sized vectors per token, layer and direction for an LSTM, 7 for a GRU); "
         "cuDNN does not document these sizes, so they were read off the training architectures' peaks. Their "
         "coefficients are fitted on the training architectures' trusted peaks only (`gpurec tools fit-memory`, "
         "`models/memory.json`). Network rows record the allocator's peak over one step after warm-up "
         "(`peak_memory_bytes`, `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`). "
         f"Target: within {MEMORY_TARGET_PCT:g}% of the measured peak. Family torchvision includes the "
         "hand-written CNNs of `gpurec.sets.SYNTH_ARCHS` (training architectures).", ""]
    rows = memory_rows(data_root, fit, extract)
    if not rows:
        return L + ["No measured peaks yet: no collected network row carries `peak_memory_bytes` (collection "
                    "records it from now on), so this estimate is not validated here.", ""]
    if fit is None:
        L += ["No fitted memory terms (`models/memory.json`): the estimate below is the analytic part alone.", ""]
    else:
        L += ["Fitted terms (bytes per byte of the term; floor in MB):", ""]
        names = ("floor_bytes", "activations", "largest", "conv_io", "matmul_io", "rnn")
        lines = [row([mode, f"{c['floor_bytes'] / 1e6:.1f}", *(f"{c[n]:.3f}" for n in names[1:])])
                 for mode, c in sorted(fit.terms.items())]
        L += table(["mode", "floor MB", "activations", "largest activation", "largest conv in+out",
                    "largest matmul in+out", "cuDNN RNN"], lines) + [""]
        prov = fit.provenance
        fitted = "; ".join(f"{mode}: {v['rows']} rows ({', '.join(f'{k} {n}' for k, n in v['by_family'].items())})"
                           for mode, v in sorted(prov.get("rows", {}).items()))
        empty = {m: v for m, v in prov.get("terms_without_rows", {}).items() if v}
        L += [f"Fitted on {fitted}, {prov.get('date', '')}."
              + ("".join(f" No trusted {m} row exercises {', '.join(v)}: "
                         "its coefficient stays 0 until such peaks are collected." for m, v in sorted(empty.items()))),
              ""]
    from gpurec.model.fitting.memory_fit import LEFTOVER_MARGIN_BYTES

    trusted = [r for r in rows if not r["leftover_suspect"]]
    suspect = [r for r in rows if r["leftover_suspect"]]
    L += [f"{len(rows)} rows with a measured peak: {len(trusted)} trusted, {len(suspect)} that may include memory "
          "left allocated by earlier rows of the same process"
          + (" (" + "; ".join(_suspect_reasons(suspect)) + ")" if suspect else "")
          + ". Leftover-suspect rows are never fitted on and are judged apart; collection now starts every network "
            "and peak row after a garbage collection and records `memory_allocated_before_bytes`; a row counts "
            "as trusted when that is at most its GPU's library floor (the least any of its rows found allocated) "
            f"plus {LEFTOVER_MARGIN_BYTES // 2**20} MiB.", ""]

    def groups(rs: list[dict[str, Any]]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
        g: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for r in rs:
            g.setdefault((str(r["split"]), r["family"], r["mode"], r["precision"]), []).append(r)
        return dict(sorted(g.items()))

    if trusted:
        L += ["### Trusted peaks", ""]
        for split in ("training", "held-out"):
            part = [r for r in trusted if r["split"] == split]
            if part:
                L += [f"* {split} architectures: {_within(part)} of {len(part)} within {MEMORY_TARGET_PCT:g}% "
                      f"(analytic part alone: {_within(part, 'analytic_error_pct')})."]
        L += [""]
        lines = [row([*k, str(len(g)), f"{_within(g)}", pct(sum(abs(r['error_pct']) for r in g) / len(g)),
                      f"{_within(g, 'analytic_error_pct')}"]) for k, g in groups(trusted).items()]
        L += table(["architectures", "family", "mode", "precision", "rows", f"within {MEMORY_TARGET_PCT:g}%",
                    "mean abs error", f"analytic alone within {MEMORY_TARGET_PCT:g}%"], lines) + [""]
    if suspect:
        L += ["### Leftover-suspect peaks", "",
              "Measured above the estimate by what earlier rows left allocated: they cannot judge the estimate. "
              "`gpurec tools plan --sets peaks-networks` plans their peaks again from a collected heap.", ""]
        lines = [row([*k, str(len(g)), f"{_within(g)}", str(sum(r['error_pct'] < 0 for r in g)),
                      f"{sorted(r['measured_gb'] / max(r['estimated_gb'], 1e-12) for r in g)[len(g) // 2]:.1f}x"])
                 for k, g in groups(suspect).items()]
        L += table(["architectures", "family", "mode", "precision", "rows", f"within {MEMORY_TARGET_PCT:g}%",
                    "measured above estimate", "median measured / estimated"], lines) + [""]
    L += ["### Per network", ""]
    lines = [row([short(r["gpu"]), r["set_key"], r["precision"], r["mode"], str(r["split"]),
                  "suspect" if r["leftover_suspect"] else "trusted", f"{r['estimated_gb']:.2f}",
                  f"{r['measured_gb']:.2f}", pct(r["error_pct"])])
             for r in sorted(rows, key=lambda r: (bool(r["leftover_suspect"]), -abs(r["error_pct"])))]
    return L + table(["GPU", "set", "precision", "mode", "architectures", "peak", "estimated GB", "measured GB",
                      "error"], lines) + [""]


def generate(models_dir: Path | str = "models", out: Path | str = "docs/accuracy.md",
             data_root: Path | str | None = None) -> str:
    """docs/accuracy.md from ``models_dir``'s report.json and manifest.json (``gpurec train``
    writes both); returns the text."""
    from gpurec.model.memory import load_memory_fit

    models_dir = Path(models_dir)
    for name in ("report.json", "manifest.json"):
        if not (models_dir / name).exists():
            raise FileNotFoundError(f"{models_dir / name} is missing: train first (`gpurec train --out {models_dir}`)")
    rep = json.loads((models_dir / "report.json").read_text())
    manifest = json.loads((models_dir / "manifest.json").read_text())
    sources_file = models_dir.parent / "benchmarks" / "gpu_time_sources.json"
    sources = json.loads(sources_file.read_text()) if sources_file.exists() else None
    cross_file = models_dir / "crossgpu_report.json"
    cross = json.loads(cross_file.read_text()) if cross_file.exists() else None
    host_gpu = host_gpu_tables(models_dir, data_root, rep)
    return write(rep, manifest, Path(out), Path(data_root) if data_root is not None else None,
                 host_gpu, sources, cross, energy_tables(models_dir, data_root, rep, host_gpu),
                 memory_fit=load_memory_fit(models_dir), precision=precision_tables(models_dir, data_root, host_gpu))


def precision_tables(models_dir: Path, data_root: Path | str | None,
                     host_gpu: dict[str, Any] | None) -> dict[str, Any] | None:
    """The networks measured at a precision other than fp32, estimated at their precision with the
    shipped models (gpurec.model.fitting.evaluate.precision_accuracy), each beside its fp32 twin."""
    from gpurec.dataset.load import default_root
    from gpurec.model import load_predictor
    from gpurec.model.features import HALF_TWINS
    from gpurec.model.fitting.evaluate import precision_accuracy
    from gpurec.model.fitting.kind_errors import per_kind_errors

    try:
        predictor = load_predictor(models_dir, data_root=data_root, check_data=False)
    except Exception:
        return None
    root = Path(data_root) if data_root is not None else default_root()
    out = precision_accuracy(predictor, data_root, host_gpu["records"] if host_gpu is not None else None,
                             plan_file=root / "plans" / "precision.json")
    ratios: list[dict[str, Any]] | None = None
    for precision, p in out["precisions"].items():
        rec = p["records"]
        batch = rec["set_key"].str.extract(r":b(\d+):")[0].astype(float)
        cases = sorted(set(zip(rec["set_key"][batch >= FLIP_MIN_BATCH], rec["mode"][batch >= FLIP_MIN_BATCH],
                               strict=True)))
        p["flips"] = precision_flips(predictor, cases, precision, sorted(set(rec["gpu"])))
        p["per_kind"] = per_kind_errors(predictor, data_root, archs=sorted(set(rec["arch"])), precision=precision)
        if precision in {a for a, _ in HALF_TWINS} and predictor.builder.config.fp16_as_bf16_kinds:
            p["bf16_twins"] = bf16_twin_effect(predictor, rec, data_root)
            ratios = fp16_bf16_kernel_ratios(data_root) if ratios is None else ratios  # one table, read once
            p["fp16_bf16_ratios"] = ratios
        if predictor.gemm_floor is not None and precision != "fp32":
            p["gemm_floor"] = gemm_floor_effect(predictor, rec, data_root)
            p["gemm_floor_fit"] = predictor.gemm_floor.as_dict()
        if predictor.wide_gemm is not None and precision != "fp32":
            p["wide_gemm"] = wide_gemm_effect(predictor, rec, data_root)
            p["wide_gemm_fit"] = predictor.wide_gemm.as_dict()
    return out


def bf16_twin_effect(predictor: Any, records: Any, data_root: Path | str | None) -> list[dict[str, Any]]:
    """Host-free MAPE of ``records`` (one fp16 precision's networks, as predicted) against the
    same networks predicted without reading fp16 operations of bf16-only kinds as their bf16
    twins (FeatureConfig.fp16_as_bf16_kinds emptied), per GPU, architecture group and mode."""
    from dataclasses import replace

    from gpurec.model import load_predictor
    from gpurec.model.features import FeatureBuilder

    plain = load_predictor(predictor.model_dir, data_root=data_root, check_data=False)
    b = predictor.builder
    plain.builder = FeatureBuilder(b.kinds, replace(b.config, fp16_as_bf16_kinds=()), b.extra_columns)
    return effect_of(plain, records, data_root)


def gemm_floor_effect(predictor: Any, records: Any, data_root: Path | str | None) -> list[dict[str, Any]]:
    """Host-free MAPE of the networks of ``records`` whose prediction the unaligned-GEMM floor
    (gpurec.model.gemm) moves, with and without it, per GPU, architecture group and mode."""
    from gpurec.model import load_predictor

    plain = load_predictor(predictor.model_dir, data_root=data_root, check_data=False)
    plain.gemm_floor = None
    return effect_of(plain, records, data_root, moved_only=True)


def wide_gemm_effect(predictor: Any, records: Any, data_root: Path | str | None) -> list[dict[str, Any]]:
    """As gemm_floor_effect, for the wide half-precision product model."""
    from gpurec.model import load_predictor

    plain = load_predictor(predictor.model_dir, data_root=data_root, check_data=False)
    plain.wide_gemm = None
    return effect_of(plain, records, data_root, moved_only=True)


def effect_of(plain: Any, records: Any, data_root: Path | str | None, moved_only: bool = False) -> list[dict[str, Any]]:
    """``records`` (one precision's networks, as the shipped models predict them) against the same
    networks predicted by ``plain`` (the models without one of their parts): host-free MAPE
    before (``plain``) and after, per GPU, architecture group and mode; with ``moved_only``, only
    the networks whose predicted time the part moves by more than 0.1%."""
    import numpy as np

    from gpurec.dataset import load_dataset
    from gpurec.model.fitting.evaluate import ape, network_records
    from gpurec.model.provenance import host_profiles_by_run
    from gpurec.ops.precision import rows_at_precision

    nets = rows_at_precision(load_dataset(root=data_root, table="networks"), str(records["precision"].iloc[0]))
    nets = nets.reset_index(drop=True)
    keys = ["gpu", "set_key", "mode", "run_id"]
    cols = ["pred_gpu_time_ms", "pred_gpu_energy_mj"]
    both = records.merge(network_records(plain, nets, host_profiles_by_run(data_root))[keys + cols],
                         on=keys, how="left", suffixes=("", "_before"), validate="one_to_one")
    if moved_only:
        moved = np.abs(both["pred_gpu_time_ms"] / both["pred_gpu_time_ms_before"] - 1.0) > 1e-3
        both = both[moved.fillna(False).to_numpy(dtype=bool)]
    out = []
    for (gpu, is_test, mode), part in both.groupby(["gpu", "is_test", "mode"]):
        entry: dict[str, Any] = {"gpu": gpu, "archs": "unseen test" if is_test else "training", "mode": mode,
                                 "n": int(len(part)), "which": sorted(set(part["arch"]))}
        for what, col in (("time", "gpu_time_ms"), ("energy", "gpu_energy_mj")):
            for when, pred in (("before", f"pred_{col}_before"), ("after", f"pred_{col}")):
                entry[f"{what}_{when}"] = float(np.nanmean(ape(part[pred], part[f"measured_{col}"])))
        out.append(entry)
    return out


def fp16_bf16_kernel_ratios(data_root: Path | str | None, min_pairs: int = 20) -> list[dict[str, Any]]:
    """Per GPU and kind: fp16-mixed / bf16-mixed in-network kernel time of the same operation (same
    network, mode and node, each measured at both; kernels of at least 10 us), median and mean
    |ratio - 1| over kinds with at least ``min_pairs`` pairs: the evidence for bf16 twins."""
    import numpy as np

    from gpurec.dataset import load_dataset

    inn = load_dataset(root=data_root, table="in_network")
    if "precision" not in inn:
        return []
    inn = inn[inn["kernel_ms"] >= 0.01]
    keys = ["gpu", "set_key", "mode", "node", "op_kind"]
    at = {p: inn[inn["precision"] == p].groupby(keys)["kernel_ms"].median() for p in ("fp16-mixed", "bf16-mixed")}
    pairs = (at["fp16-mixed"] / at["bf16-mixed"]).dropna().rename("ratio").reset_index()
    out = []
    for (gpu, kind), part in pairs.groupby(["gpu", "op_kind"]):
        if len(part) >= min_pairs:
            r = part["ratio"].to_numpy(dtype=float)
            out.append({"gpu": gpu, "kind": kind, "pairs": int(len(r)), "median": float(np.median(r)),
                        "mean_abs_dev_pct": float(np.mean(np.abs(r - 1.0)) * 100)})
    return sorted(out, key=lambda d: (d["gpu"], -d["pairs"]))


FLIP_MIN_BATCH = 32  # the order of GPUs is asked of GPU-bound steps (small batches are launch-bound)


def precision_flips(predictor: Any, cases: list[tuple[str, str]], precision: str,
                    measured_gpus: Sequence[str] = ()) -> dict[str, Any]:
    """Pairs of catalogue GPUs whose predicted host-free order flips between fp32 and
    ``precision`` on the (set_key, mode) ``cases``: a is faster than b in fp32 and slower at
    ``precision``.  Each flip's margin is the smaller of the two relative differences; the
    widest flip is ``best`` (and ``best_measured`` among pairs with one of ``measured_gpus``,
    those with networks measured at ``precision``).  Both GPUs must fit the step in memory at both precisions."""
    import warnings

    from gpurec.ops.precision import LOW_DTYPE
    from gpurec.recommend import recommend
    from gpurec.sets import parse_set_key

    peak = "bf16_tflops" if LOW_DTYPE.get(precision) == "bfloat16" else "fp16_tflops"
    from gpurec.catalog import load_catalog

    gpus = [g.nvml_name for g in load_catalog() if (getattr(g, peak, 0) or 0) > 2 * g.fp32_tflops]
    flips = []
    for set_key, mode in cases:
        s = parse_set_key(set_key)
        times = {}
        for p in ("fp32", precision):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                r = recommend(s.arch, s.input_shape, mode=mode, predictor=predictor, cuda_graphs=True,
                              batch_search=False, precision=p, gpus=gpus)
            times[p] = {row.gpu: row.gpu_time_ms for row in r.rows if row.fits}
        common = sorted(set(times["fp32"]) & set(times[precision]))
        for a in common:
            for b in common:
                fa, fb, la, lb = times["fp32"][a], times["fp32"][b], times[precision][a], times[precision][b]
                if fa < fb and la > lb:
                    flips.append({"set_key": set_key, "mode": mode, "faster_fp32": a, "faster_low": b,
                                  "fp32_ms": (fa, fb), "low_ms": (la, lb),
                                  "margin_pct": 100 * (min(fb / fa, la / lb) - 1)})
    measured = set(measured_gpus)
    flips.sort(key=lambda f: -f["margin_pct"])
    with_measured = [f for f in flips if {f["faster_fp32"], f["faster_low"]} & measured]
    return {"precision": precision, "cases": len(cases), "gpus": gpus, "flips": flips, "best": flips[0] if flips else None,
            "best_measured": with_measured[0] if with_measured else None, "measured_gpus": sorted(measured)}


def _ratio(a: Any, b: Any) -> str:
    try:
        v = float(a) / float(b)
    except (TypeError, ValueError, ZeroDivisionError):
        return "—"
    return "—" if v != v else f"{v:.2f}×"


def _flip_lines(fl: dict[str, Any] | None) -> list[str]:
    """The widest predicted flip of two GPUs' order between fp32 and a lower precision."""
    if not fl:
        return []
    precision = fl["precision"]
    L = [f"#### GPUs whose order flips between fp32 and {precision}", "",
         f"The {len(fl['gpus'])} catalogue GPUs with tensor cores at {precision}'s dtype (catalogue peak more "
         "than twice the FP32 peak) predicted (host-free, shipped models) at fp32 and at "
         f"{precision} on the "
         f"{fl['cases']} measured {precision} networks of batch ≥ {FLIP_MIN_BATCH} (GPU-bound steps); a flip is a "
         f"pair where one GPU is the faster in fp32 and the slower at {precision}, its margin the smaller of the "
         "two relative differences.", ""]
    if not fl["flips"]:
        return L + [f"No pair flips on these networks: the predicted order is the same at fp32 and {precision}.", ""]
    L += [f"{len(fl['flips'])} flips in all ({len({(f['faster_fp32'], f['faster_low']) for f in fl['flips']})} "
          "distinct pairs)."]
    lines = []
    for label, f in (("widest", fl["best"]), ("widest with a GPU measured at this precision", fl["best_measured"])):
        if f is None:
            lines.append(row([label, "none", "", "", "", "", "", ""]))
            continue
        lines.append(row([label, f"{f['set_key']} {f['mode']}", f"{short(f['faster_fp32'])} vs {short(f['faster_low'])}",
                          f"{f['fp32_ms'][0]:.2f} / {f['fp32_ms'][1]:.2f}", f"{f['low_ms'][0]:.2f} / {f['low_ms'][1]:.2f}",
                          f"{f['margin_pct']:.1f}%",
                          ", ".join(short(g) for g in (f["faster_fp32"], f["faster_low"]) if g in fl["measured_gpus"])
                          or "neither"]))
    L += [""] + table(["flip", "network", "GPU a vs GPU b", "fp32 ms (a / b)", f"{precision} ms (a / b)", "margin",
                       f"measured at {precision}"], lines)
    L += ["", "Caveat: GPUs without host-free rows take the H100's time times the cross-GPU model's per-operation "
          "ratio (each GPU's tensor-core peak for the operation's math, its bandwidth, the operations' FLOPs and "
          f"bytes in the {precision} dtypes); only "
          + (", ".join(short(g) for g in fl["measured_gpus"]) or "no GPU")
          + f" has networks measured at {precision}, so a flip between two other GPUs rests on that model alone.",
          ""]
    return L


def gemm_floor_lines(precision: str, p: dict[str, Any]) -> list[str]:
    """The unaligned-GEMM floor's fit and what it does to this precision's networks it moves."""
    if not p.get("gemm_floor_fit"):
        return []
    fits = p["gemm_floor_fit"]["by_mode"]
    L = [f"At {precision}, a product with a weight (`nn.Linear`, `F.linear`) whose inner or outer dimension is "
         "odd (2-byte aligned), and that fills the GPU at least once, is held at or above a throughput "
         "floor: time ≥ FLOPs / (efficiency × the GPU's dense half-precision peak) (`gpurec.model.gemm`): cuBLAS "
         "runs such products (a 50,257-word LM head) on its slowest unaligned kernels, and the boosters have no "
         "feature for alignment (products aligned to 2 or 4 elements, such as a 30,522-word head, run 2-3x faster "
         "and are not floored). Efficiency per mode, the median over the training architectures' odd rows, with "
         "its leave-one-architecture-out error: "
         + "; ".join(f"{m} {f['efficiency']:.4f} ({f['rows']} rows of {', '.join(f['archs'])}; "
                     f"{100 * f['loao_mape']:.1f}%)" for m, f in fits.items()) + ".", ""]
    return L + effect_lines(p.get("gemm_floor"), "Host-free MAPE of the networks the floor moves, without it and "
                            "with it:", "It moves none of the networks measured at this precision.")


def effect_lines(effect: list[dict[str, Any]] | None, intro: str, none: str) -> list[str]:
    """A part's effect_of table (host-free MAPE of the networks it moves, without and with it)
    under ``intro``, or ``none`` where it moves no network."""
    if not effect:
        return [none, ""]
    return [intro, ""] + table(
        ["GPU", "architectures", "mode", "networks", "which", "time without", "time with", "energy without",
         "energy with"],
        [row([short(t["gpu"]), t["archs"], t["mode"], str(t["n"]), ", ".join(t["which"]), _f(t["time_before"]),
              _f(t["time_after"]), _f(t["energy_before"]), _f(t["energy_after"])]) for t in effect]) + [""]


def wide_gemm_lines(precision: str, p: dict[str, Any]) -> list[str]:
    """The wide half-precision product model's fit and what it does to this precision's networks."""
    if not p.get("wide_gemm_fit"):
        return []
    fit = p["wide_gemm_fit"]
    L = [f"At {precision}, a product with a weight whose output is at least {fit['min_n']:,} wide and whose "
         "dimensions are even (a 50,304- or 32,000-word LM head; odd ones keep the floor above), and that fills the "
         "GPU at least once, takes its time from a roofline instead of the boosters: time = a × FLOPs / the GPU's "
         "dense half-precision peak + b × bytes / its DRAM bandwidth (`gpurec.model.gemm.WideHalfGemm`). The "
         "boosters never saw such a product: the widest half-precision ones among the training architectures are "
         "recurrent language models' 10,000-word heads, whose in-network time (their training target) runs well above "
         "their graph-replayed time at bf16-mixed, and they put the head sweep's aligned heads at several times their "
         "measured time (DEVELOPERS.md, session 48). Fitted on "
         "the head sweep's rows per mode and alignment class (K and N multiples of 8, or even only), with the "
         "error in sample and leaving each inner dimension K out:", ""]
    L += table(["mode", "class", "a", "b", "rows", "GPUs", "inner dimensions", "MAPE", "leave-one-K-out MAPE"],
               [row([mode, cls, f"{f['compute_scale']:.3f}", f"{f['memory_scale']:.3f}", str(f["rows"]),
                     ", ".join(short(g) for g in f["gpus"]), ", ".join(str(w) for w in f["widths"]),
                     _f(100 * f["mape"]), _f(100 * f["cv_mape"])])
                for mode, by in fit["by_mode"].items() for cls, f in by.items()]) + [""]
    return L + effect_lines(p.get("wide_gemm"), "Host-free MAPE of the networks it moves, without it and with it:",
                            "It moves none of the networks measured at this precision (none has such a product).")


def precision_section(prec: dict[str, Any] | None) -> list[str]:
    """Host-free accuracy per precision other than fp32: unseen test architectures against the
    targets, training architectures for contrast, and every network's row."""
    if not prec or not prec.get("precisions"):
        return []
    tgt = prec["targets_pct"]
    L = ["## Lower precision: host-free accuracy per precision", "",
         f"Networks measured at a precision other than fp32 (column `precision` of `networks.parquet`), each "
         f"estimated at its own precision (`predict(..., precision=...)`). Target on unseen test architectures: "
         f"host-free time ≤ {tgt['time']:g}% and energy ≤ {tgt['energy']:g}% MAPE per mode. The training "
         "architectures' networks are shown for contrast: their operations at this precision are in the "
         "training data, and they are fitted on as wholes too, by the network correction of their precision "
         "(its own from 30 networks on, else its sibling's or the fp32 one; see *What each correction term "
         "buys*). The unseen test architectures' networks never enter any fit.", ""]
    for precision, p in prec["precisions"].items():
        L += [f"### {precision}", ""]
        lines = []
        for g in p["groups"]:
            if g["n_time"] == 0 and g["n_energy"] == 0:
                verdict = "no networks measured"
            elif g["archs"] == "unseen test":
                ok = g["time_mape"] <= tgt["time"] and g["energy_mape"] <= tgt["energy"]
                verdict = "met" if ok else "**NOT met**"
            else:
                verdict = "(contrast, no target)"
            lines.append(row([short(g["gpu"]), g["archs"], g["mode"], str(g["n_time"]), _f(g["time_mape"]),
                              str(g["n_energy"]), _f(g["energy_mape"]), ", ".join(g["architectures"]) or "—",
                              verdict]))
        L += table(["GPU", "architectures", "mode", "networks (time)", "host-free time MAPE", "networks (energy)",
                    "host-free energy MAPE", "which", "target"], lines)
        n_test = sum(g["n_time"] for g in p["groups"] if g["archs"] == "unseen test")
        n_all = sum(g["n_time"] for g in p["groups"])
        L += [""]
        L += gemm_floor_lines(precision, p)
        L += wide_gemm_lines(precision, p)
        if p.get("bf16_twins"):
            L += [f"At {precision}, operations of the kinds the training rows held at bf16 and never at fp16 "
                  "are read as their bf16 twins on GPUs with equal fp16 and bf16 peaks "
                  "(`FeatureConfig.fp16_as_bf16_kinds`; recorded after training by `gpurec tools fp16-twins` "
                  "where the models predate it): fp16 and bf16 run the same tensor-core path there. Host-free "
                  "MAPE of these networks without it and with it:", ""]
            L += table(["GPU", "architectures", "mode", "networks", "time without", "time with", "energy without",
                        "energy with"],
                       [row([short(t["gpu"]), t["archs"], t["mode"], str(t["n"]), _f(t["time_before"]),
                             _f(t["time_after"]), _f(t["energy_before"]), _f(t["energy_after"])])
                        for t in p["bf16_twins"]]) + [""]
            if p.get("fp16_bf16_ratios"):
                L += ["The evidence: the same operation's in-network kernel time at fp16-mixed over bf16-mixed (same "
                      "network, mode and node, measured at both; kernels of at least 10 µs), per kind with at least "
                      "20 pairs. Kinds far from 1 should be among those the rows hold at fp16, which keep their own "
                      "math mode.", ""]
                L += table(["GPU", "kind", "pairs", "median fp16 / bf16", "mean |ratio - 1|"],
                           [row([short(r["gpu"]), f"`{r['kind']}`", str(r["pairs"]), f"{r['median']:.3f}",
                                 _f(r["mean_abs_dev_pct"])]) for r in p["fp16_bf16_ratios"]]) + [""]
        if n_test == 0:
            planned = p.get("test_planned_not_measured", [])
            L += [f"**No unseen test architecture has been measured at {precision}, so the target cannot be "
                  f"judged** (the {n_all} networks above are all of training architectures)."
                  + (f" The work order `datasets/plans/precision.json` holds {len(planned)} test-architecture "
                     f"networks (set and mode) at {precision}, of {len({k for k, _ in planned})} sets "
                     f"({', '.join(sorted({k for k, _ in planned}))}), not measured yet." if planned else ""), ""]
        elif n_test < 10:
            L += [f"Only {n_test} unseen test networks at {precision}: too few to be conclusive.", ""]
        if p.get("sequence"):
            L += [f"Of them, the sequence models at {precision}: every measured network of the unseen sequence "
                  "architectures (" + ", ".join(sorted({a for r in p["sequence"] for a in r["archs"]}))
                  + "), never trained on; the sequence targets are set on fp32, so no verdict:", "",
                  *_sequence_table(p["sequence"], judge=False), ""]
        if p.get("per_kind"):
            L += [f"Where the {precision} time error sits: each operation's predicted GPU time against the kernel "
                  f"time the in-network pass attributed to it in these {precision} networks, summed per kind "
                  "(as in *The kinds that carry the time error* below; `autocast cast` is the copies autocast "
                  "inserts):", ""]
            lines = [row([short(r["gpu"]), r["mode"], r["kind"], str(r["n_ops"]), f"{r['measured_ms']:.1f}",
                          f"{r['predicted_ms']:.1f}",
                          f"{r['bias_pct']:+.1f}%" if r["measured_ms"] > 0 else "— (0 ms measured)",
                          _f(r["weighted_error_pct"]),
                          f"{100 * r['share_of_error']:.0f}%"]) for r in p["per_kind"]]
            L += table(["GPU", "mode", "kind", "ops", "measured ms", "predicted ms", "bias", "weighted error",
                        "share of error"], lines) + [""]
        check = p.get("correction_check") or []
        if check:
            casts_out = any(c["variant"] == "casts taken out" for c in check)
            L += [f"Would a whole-network correction for {precision} help held-out networks? Per mode, host-free time "
                  "MAPE of these networks as predicted and after a scale fitted leave-one-family-out (the median "
                  "measured / predicted of the other families' networks)"
                  + ("; then the same with the predicted autocast casts taken out (inside a network autocast "
                     "launches them in their consumer's call, and the consumer's in-network time, a training "
                     "target, already holds their kernels)." if casts_out else
                     ". The autocast casts add no GPU time to these estimates: inside a network autocast launches "
                     "them in their consumer's call, and the consumer's in-network time, its training target, "
                     "already holds their kernels."), ""]
            lines = [row([c["variant"], c["mode"], str(c["n"]), str(c["families"]), pct(c["time_mape"]),
                          pct(c["lofo_scaled_time_mape"])]) for c in check]
            L += table(["predicted time", "mode", "networks", "families", "time MAPE",
                        "scaled, leave one family out"], lines)
            helps = [c for c in check if c["lofo_scaled_time_mape"] < c["time_mape"]]
            L += ["", f"The scale lowers the held-out error in {len(helps)} of {len(check)} cases"
                  + (": no precision-wide network correction is fitted." if not helps else
                     ": see where before fitting one.") + ""]
            L += [""]
        L += _flip_lines(p.get("flips"))
        rec = p["records"]
        if len(rec):
            L += ["Every network (speed-up = fp32 host-free time / this precision's, measured and as predicted; "
                  "— where the fp32 twin is not measured host-free):", ""]
            lines = []
            for r in rec.sort_values(["is_test", "arch", "mode", "set_key", "gpu"],
                                     ascending=[False, True, True, True, True]).itertuples(index=False):
                t_err = (r.pred_gpu_time_ms / r.measured_gpu_time_ms - 1) * 100 if not r.error else float("nan")
                e_err = (r.pred_gpu_energy_mj / r.measured_gpu_energy_mj - 1) * 100 if not r.error else float("nan")
                lines.append(row([short(r.gpu), r.set_key, r.mode, "unseen" if r.is_test else "training",
                                  _f(r.measured_gpu_time_ms, 3, ""), _f(getattr(r, "pred_gpu_time_ms", None), 3, ""),
                                  f"{t_err:+.1f}%" if t_err == t_err else "—",
                                  _f(r.measured_gpu_energy_mj, 0, ""), _f(getattr(r, "pred_gpu_energy_mj", None), 0, ""),
                                  f"{e_err:+.1f}%" if e_err == e_err else "—",
                                  _ratio(getattr(r, "fp32_measured_gpu_time_ms", None), r.measured_gpu_time_ms),
                                  _ratio(getattr(r, "fp32_pred_gpu_time_ms", None), getattr(r, "pred_gpu_time_ms", None)),
                                  r.error or ""]))
            L += table(["GPU", "network", "mode", "architecture", "measured ms", "predicted ms", "time error",
                        "measured mJ", "predicted mJ", "energy error", "measured speed-up", "predicted speed-up",
                        "error"], lines) + [""]
    return L


def energy_tables(models_dir: Path, data_root: Path | str | None, rep: dict[str, Any],
                  host_gpu: dict[str, Any] | None) -> dict[str, Any] | None:
    """The energy, power-bound and per-kind tables (gpurec.model.fitting.kind_errors) of the shipped
    models, with the recorded snapshot of the models before them (benchmarks/unseen_before.json,
    written by `gpurec tools unseen-snapshot`) where it exists."""
    from gpurec.model import load_predictor
    from gpurec.model.fitting.kind_errors import (
        POWER_GRID,
        gpu_bound_transfer,
        kernel_sum_over_step,
        per_kind_errors,
        power_bound_violations,
        unseen_summary,
    )

    try:
        predictor = load_predictor(models_dir, data_root=data_root, check_data=False)
    except Exception:
        return None
    before_file = models_dir.parent / "benchmarks" / "unseen_before.json"
    out: dict[str, Any] = {
        "before": json.loads(before_file.read_text()) if before_file.exists() else None,
        "after": {"unseen": unseen_summary(rep), "per_kind": per_kind_errors(predictor, data_root),
                  "unseen_by_gpu": unseen_by_gpu(rep), "kernel_sum_over_step": kernel_sum_over_step(data_root)},
        "bounds": power_bound_violations(predictor, POWER_GRID), "grid": POWER_GRID,
        "transfer": gpu_bound_transfer(host_gpu["records"]) if host_gpu is not None else None,
        "rows_by_gpu_mode": rep.get("rows", {}).get("by_gpu_mode", {}),
        "eager_proxy_min_ms": rep.get("targets", {}).get("eager_proxy_min_ms"),
        "targeted_rows": targeted_rows(data_root)}
    return out


def targeted_rows(data_root: Path | str | None) -> dict[str, dict[str, int]]:
    """Per GPU, the measured rows (``ok``) of the targeted plan's architectures (gpurec.sets
    SYNTH_ARCHS and SWEEP_ARCHS): ``operations`` and ``networks``; every GPU with measured networks
    is listed, with zeros where it measured none of them."""
    from gpurec.dataset import load_dataset
    from gpurec.model.fitting.evaluate import arch_of
    from gpurec.sets import SWEEP_ARCHS, SYNTH_ARCHS

    archs = set(SYNTH_ARCHS) | set(SWEEP_ARCHS)
    out: dict[str, dict[str, int]] = {}
    for table in ("operations", "networks"):
        rows = load_dataset(root=data_root, table=table)
        rows = rows[rows["status"] == "ok"]
        if table == "networks":
            for g in sorted(set(rows["gpu"])):
                out.setdefault(str(g), {"operations": 0, "networks": 0})
        rows = rows[rows["set_key"].map(lambda k: arch_of(str(k)) in archs)]
        for gpu, n in rows.groupby("gpu").size().items():
            out.setdefault(str(gpu), {"operations": 0, "networks": 0})[table] = int(n)
    return out


def targeted_sentence(counts: dict[str, dict[str, int]] | None) -> str:
    """What the report says of the targeted plan's rows: which GPUs measured them (and so which
    per-kind errors above can reflect them once the models are trained on them), which did not."""
    lead = ("The hand-written architectures and operation sweeps that target these kinds (`gpurec.synthsets`; "
            "plan `datasets/plans/targeted.json`, `gpurec tools plan --sets targeted`)")
    measured = {g: c for g, c in (counts or {}).items() if c["operations"] or c["networks"]}
    if not measured:
        return (f"{lead} are not measured yet: the per-kind time error changes only once their rows are collected "
                "and the models retrained.")
    have = "; ".join(f"{short(g)} {c['operations']:,} operation rows and {c['networks']:,} network rows"
                     for g, c in sorted(measured.items()))
    missing = [short(g) for g in sorted(counts or {}) if g not in measured]
    tail = (f" Not yet measured on the {', '.join(missing)}: its per-kind error moves only through what the "
            "models learn from the other GPUs' rows." if missing else "")
    return (f"{lead} are measured on: {have}; models trained on the data at hand include them (the rows "
            f"of these architectures are training rows; none is a test architecture).{tail}")


def unseen_by_gpu(rep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """unseen_summary per GPU of the report's test-set records (the pooled figure mixes GPUs)."""
    from gpurec.model.fitting.kind_errors import unseen_summary

    recs = rep.get("test_set", {}).get("records", [])
    return {gpu: unseen_summary({"test_set": {"records": [r for r in recs if r.get("gpu") == gpu]}})
            for gpu in sorted({r.get("gpu") for r in recs if r.get("gpu")})}


def _after_training(manifest: dict[str, Any]) -> list[str]:
    """What of the shipped models' network correction was fitted after training, in words."""
    corr = manifest.get("network_correction", {})
    return [what for key, what in (("nonrecurrent_fitted_after_training",
                                    "the network time correction of networks without recurrent layers"),
                                   ("measured_gap_fitted_after_training",
                                    "the gap between kernels of looked-up operations"))
            if corr.get(key)]


def energy_section(energy: dict[str, Any] | None, manifest: dict[str, Any]) -> list[str]:
    """Energy inside networks, power bounds, H200 eager energy, and the kinds that carry the error."""
    from gpurec.model.network import POWER_CLASSES

    if energy is None:
        return []
    L = ["## Energy inside networks, power bounds and the kinds that carry the error", ""]
    b = energy["bounds"]
    L += ["### Power bounded by physics", "",
          "Every operation's, network's and waiting power is held inside its GPU's [idle power, power limit] "
          "(`GPUSpec.power_bounds_w`; the firmware holds the average at the limit, a board with a live context "
          "never draws less than idle). Limits are the datasheet maximum board power (NVML's enforced limit, "
          "700 W, on the measured H100 and H200); idle is measured on the H100 and H200 (median of "
          "`datasets/<gpu>/idle.parquet`) and estimated elsewhere as the limit × their median idle/limit share.",
          "",
          f"Over {b['estimates']} estimates (every catalogue GPU × "
          + ", ".join(f"{m} b{bs} {mode}" for m, bs, mode in energy["grid"])
          + f"): **{b['above_limit']} above the power limit, {b['below_idle']} below idle** "
          f"(eager, host-free and every operation's power; highest {100 * b['max_power_over_limit']:.1f}% of "
          "the limit).", ""]
    coef = manifest.get("network_correction", {})
    pc = coef.get("power_coef", {})
    L += ["### Energy inside networks", "",
          f"Chosen power correction: {variant_text(coef.get('power_variant', '?'))} (the variants and their "
          "leave-one-family-out MAPE are in *What each correction term buys* above). In the `kinds` variants "
          "each power class's dynamic energy (above idle) is scaled by its own factor, fitted on the training "
          "architectures' host-free network energy; a factor above 1 says the class draws more power inside "
          "a network than in isolation.", ""]
    lines = []
    for key, c in sorted(pc.items()):
        if any(f"dyn_{k}" in c for k in POWER_CLASSES):
            lines.append(row([key.replace("*|", "pooled, "), *(f"{1 + c.get(f'dyn_{k}', 0.0):.3f}"
                                                                for k in POWER_CLASSES)]))
    L += (table(["GPU | mode", *POWER_CLASSES], lines) if lines
          else ["No per-class factors kept: the chosen variant does not scale power classes."]) + [""]
    before, after = energy.get("before"), energy["after"]
    L += [f"### Unseen test architectures, host-free, before and after (target ≤ {TARGET_MAPE:g}% per mode, "
          "no network worse than 15%)", ""]
    if before is not None:
        L += [f"Before: the models trained {before.get('models_created', '?')} (power correction "
              f"`{(before.get('network_correction') or {}).get('power', '?')}`), recorded in "
              "`benchmarks/unseen_before.json` by `gpurec tools unseen-snapshot`; after: the shipped models"
              + ("" if not _after_training(manifest) else
                 f" as their training scored them ({' and '.join(_after_training(manifest))} fitted after "
                 "training: what they predict now is in \"Host-free time and energy, unseen test "
                 "architectures\")") + ".", ""]
    lines = []
    met = True
    # pooled over the GPUs (as the snapshot before was), then per GPU (after only); the networks
    # column says how many each side scored, for the test sets grow as GPUs measure them
    rows_after = [(mode, (before or {}).get("unseen", {}).get(mode, {}), a) for mode, a in after["unseen"].items()]
    rows_after += [(f"{short(gpu)} {mode}", {}, a) for gpu, by_mode in after.get("unseen_by_gpu", {}).items()
                   for mode, a in by_mode.items()]
    for label, bf, a in rows_after:
        ok = a["time_mape"] <= TARGET_MAPE and a["energy_mape"] <= TARGET_MAPE and not a["over_15pct"]
        met &= ok
        lines.append(row([label, f"{bf['n']} → {a['n']}" if bf.get("n") else str(a["n"]),
                          pct(bf.get("time_mape")), pct(a["time_mape"]),
                          pct(bf.get("energy_mape")), pct(a["energy_mape"]),
                          f"{a['worst_time']['set_key']} {a['worst_time']['error_pct']:+.1f}%",
                          f"{a['worst_energy']['set_key']} {a['worst_energy']['error_pct']:+.1f}%",
                          ", ".join(a["over_15pct"]) or "none", "met" if ok else "**NOT met**"]))
    L += table(["GPU and mode", "networks (before → after)", "time MAPE before", "time MAPE after", "energy MAPE before",
                "energy MAPE after", "worst time (after)", "worst energy (after)", "networks over 15% (after)",
                "target"], lines)
    L += ["", f"**Target {'met' if met else 'NOT met'}.**", ""]
    L += ["### The kinds that carry the time error, unseen test architectures", "",
          "Each operation's predicted GPU time against the kernel time the in-network pass attributed to it "
          "(`in_network.parquet`), summed per kind over the unseen networks: bias = predicted / measured − 1, "
          "weighted error = Σ|predicted − measured| / Σ measured, share = the kind's part of all absolute error. "
          "Squeeze-excite counts its gate (pooling, sigmoid, multiply); its 1×1 convolutions are dense convs.", ""]
    bk = {(r["gpu"], r["mode"], r["kind"]): r for r in (before or {}).get("per_kind", [])}
    lines = []
    for r in after["per_kind"]:
        o = bk.get((r["gpu"], r["mode"], r["kind"]), {})
        lines.append(row([short(r["gpu"]), r["mode"], r["kind"], str(r["n_ops"]), f"{r['measured_ms']:.1f}",
                          f"{o['bias_pct']:+.1f}%" if o else "—", f"{r['bias_pct']:+.1f}%",
                          pct(o.get("weighted_error_pct")) if o else "—", pct(r["weighted_error_pct"]),
                          f"{100 * o['share_of_error']:.0f}%" if o else "—", f"{100 * r['share_of_error']:.0f}%"]))
    L += table(["GPU", "mode", "kind", "ops", "measured ms", "bias before", "bias after", "weighted error before",
                "weighted error after", "share before", "share after"], lines)
    overlap = {(r["gpu"], r["mode"], r["recurrent"]): r for r in after.get("kernel_sum_over_step", [])}
    if any(r["kind"] == "recurrent layer" for r in after["per_kind"]) and overlap:
        L += ["", "The recurrent layers' bias is against an inflated reference: cuDNN runs an LSTM or GRU module's layers and "
              "directions on several streams at once, so their kernel times add up to more than the step takes. "
              "Median in-network kernel sum / host-free step time, all measured networks:", ""]
        lines = []
        for gpu, mode in sorted({(g, m) for g, m, _ in overlap}):
            with_rnn, rest = overlap.get((gpu, mode, True)), overlap.get((gpu, mode, False))
            lines.append(row([short(gpu), mode,
                              f"{with_rnn['median_ratio']:.2f} ({with_rnn['networks']})" if with_rnn else "—",
                              f"{rest['median_ratio']:.2f} ({rest['networks']})" if rest else "—"]))
        L += table(["GPU", "mode", "networks with a recurrent layer", "other networks"], lines)
    L += ["", targeted_sentence(energy.get("targeted_rows")), ""]
    tr = energy.get("transfer")
    if tr is not None and tr["rows"]:
        L += ["### Eager energy of GPU-bound networks on GPUs without host-free data", "",
              f"GPU-bound, from data: the same (set, mode) spends ≥ {100 * tr['min_gpu_share']:.0f}% of its eager "
              f"time on the GPU (host-free / eager time) on the GPU that has host-free rows ({tr['n_gpu_bound_sets']} "
              "(set, mode) pairs). Predicted eager energy (reference host) against the measured eager energy.", ""]
        lines = [row([short(r["gpu"]), r["mode"], str(r["n"]), str(r["n_test_archs"]), pct(r["energy_mj_mape"]),
                      f"{r['energy_mj_bias']:+.1f}%", pct(r["power_w_mape"]), f"{r['power_w_bias']:+.1f}%",
                      pct(r["time_ms_mape"]), f"{r['time_ms_bias']:+.1f}%"])
                 for r in tr["rows"]]
        L += table(["GPU", "mode", "networks", "of unseen archs", "eager energy MAPE", "mean error",
                    "power MAPE", "mean error", "eager time MAPE", "mean error"], lines)
        per_gpu: dict[str, int] = {}
        for k, n in energy.get("rows_by_gpu_mode", {}).items():
            per_gpu[k.split("|")[0]] = per_gpu.get(k.split("|")[0], 0) + int(n)
        L += ["", "The per-operation power model is fitted on "
              + " and ".join(f"{n:,} {short(g)} rows" for g, n in per_gpu.items())
              + f" (on a GPU without host-free rows, eager rows of at least {energy.get('eager_proxy_min_ms')} ms, "
              "where the GPU dominates the eager time, stand in for host-free ones; `gpurec.model.fitting.data`); the "
              "network correction on the H100's host-free networks only. Power = energy / time separates the "
              "power model from the time model: where the power column is small and the time column carries the "
              "error, the energy error is the time error (the cross-GPU time model's part).", ""]
    return L


def host_gpu_tables(models_dir: Path, data_root: Path | str | None, rep: dict[str, Any]) -> dict[str, Any] | None:
    """The host/GPU tables: every measured network predicted with the shipped models for the
    host profile of the run that measured it (gpurec.model.fitting.evaluate.accuracy_tables)."""
    from gpurec.dataset import load_dataset
    from gpurec.dataset.load import fp32_rows
    from gpurec.model import load_predictor
    from gpurec.model.fitting.evaluate import accuracy_tables

    try:
        predictor = load_predictor(models_dir, data_root=data_root, check_data=False)
    except Exception:
        return None
    tables = accuracy_tables(predictor, data_root, rep)
    nets = fp32_rows(load_dataset(root=data_root, table="networks"))
    if "v1_time_ms" in nets and len(tables["records"]):
        other = nets.set_index(["gpu", "set_key", "mode"])["v1_time_ms"]
        keys = list(zip(tables["records"]["gpu"], tables["records"]["set_key"], tables["records"]["mode"], strict=True))
        tables["records"]["measured_eager_other_machine"] = [other.get(k) for k in keys]
    return tables
