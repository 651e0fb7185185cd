"""docs/validation.md from the live `gpurec validate` logs (datasets/validation/live_*.jsonl).

Each live record was measured by `gpurec validate` on the GPU it names: eager, host-free (the
step as one CUDA graph), in-network attribution, and that machine's `host-bench` profile.  The
report predicts every record with the shipped models and that record's host profile, and
compares field by field (`gpu_time_ms`, `gpu_energy_mj`, `time_ms`, `energy_mj`, `bound`); it
shows which operations carry the GPU-time error, how the same set moved between hosts, and how
far a live measurement is from the row `gpurec collect` measured on another board.  Records
from before host-free validation (no `measured_gpu_time_ms`) are kept in their own table.

    gpurec report validation
"""

from __future__ import annotations

import json
import statistics
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpurec.dataset import load_dataset
from gpurec.dataset.store import atomic_write_text
from gpurec.model._sets import test_arch_names
from gpurec.reports.markdown import table

FIELDS = (("gpu_time_ms", "GPU time (one CUDA graph)"), ("gpu_energy_mj", "GPU energy (one CUDA graph)"),
          ("time_ms", "eager time on the measuring host"), ("energy_mj", "eager energy on the measuring host"))


def _records(val_dir: Path, pattern: str = "live_*.jsonl") -> list[dict[str, Any]]:
    out = []
    for path in sorted(val_dir.glob(pattern)):
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                rec["_file"] = path.name
                out.append(rec)
    return out


def _unseen(r: dict[str, Any]) -> bool:
    """An architecture never trained on: a torchvision or a sequence test architecture."""
    return r["model"] in test_arch_names()


def _architecture(r: dict[str, Any]) -> str:
    return "unseen" if _unseen(r) else "training"


def _err(pred: float, meas: float | None) -> float | None:
    return None if not meas else 100.0 * (pred / meas - 1.0)


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:+.{digits}f}%"


def _machine(r: dict[str, Any]) -> str:
    hb = r.get("host_bench") or {}
    return f"{Path(r['_file']).stem.removeprefix('live_')} ({hb['cores']} cores)" if hb else Path(r["_file"]).stem


def _set(r: dict[str, Any]) -> tuple[str, str]:
    """The record's set key and precision (gpurec.validate.compare.record_input)."""
    from gpurec.validate.compare import record_input

    _, precision, key = record_input(r)
    return key, precision


def _label(r: dict[str, Any]) -> str:
    """The record's model as the tables name it: with its sequence length and any precision
    other than fp32."""
    _, precision = _set(r)
    seq = f" s{r['seq_len']}" if r.get("seq_len") else ""
    return f"{r['model']}{seq}" + ("" if precision == "fp32" else f" ({precision})")


def _collected(nets: Any, r: dict[str, Any]) -> dict[str, float] | None:
    """The whole-network row `gpurec collect` measured for the record's set, mode and precision."""
    from gpurec.ops.precision import rows_at_precision

    key, precision = _set(r)
    nets = rows_at_precision(nets, precision)
    row = nets[(nets["set_key"] == key) & (nets["mode"] == r["mode"])]
    if row.empty:
        return None
    last = row.iloc[-1]
    out = {"time_ms": float(last["time_ms"])}
    if "gpu_time_ms" in last and last["gpu_time_ms"] == last["gpu_time_ms"]:
        out["gpu_time_ms"] = float(last["gpu_time_ms"])
    return out


def _predict(recs: list[dict[str, Any]], predictor: Any, warn: Callable[[str], None]) -> list[Any]:
    """The shipped models' estimate for each record, with the measuring host's profile (None
    where the models cannot cover it: the record stays in the tables)."""
    from gpurec.validate.compare import predict_record

    out = []
    for r in recs:
        try:
            out.append(predict_record(predictor, r))
        except Exception as exc:  # shown as "—", never dropped
            warn(f"{_label(r)} b{r['batch_size']} {r['mode']}: {exc}")
            out.append(None)
    return out


def _checkpointing(recs: list[dict[str, Any]], predictor: Any, warn: Callable[[str], None]) -> list[str]:
    """Each step measured plain and with its repeated blocks checkpointed (checkpoint_*.jsonl,
    ``scripts/device_checkpoint.sh``) beside what the shipped models say of both: the measured and
    predicted cost of the recomputation, the checkpointed step's GPU time and energy and its
    peak memory.  Why: the question checkpointing answers is whether a larger batch fits and at
    what cost, so the cost and the memory are what is checked."""
    from gpurec.catalog import short_name
    from gpurec.validate.compare import predicted_fields

    pairs: dict[tuple[Any, ...], dict[bool, tuple[dict[str, Any], dict[str, Any] | None]]] = {}
    for r in recs:
        try:
            est = predicted_fields(predictor, r)
        except Exception as exc:  # shown as "—", never dropped
            warn(f"{_label(r)} b{r['batch_size']} {r['mode']} checkpointed={bool(r.get('checkpoint_blocks'))}: {exc}")
            est = None
        key = (r["_file"], r["gpu"], _label(r), r["batch_size"], r["mode"])
        pairs.setdefault(key, {})[bool(r.get("checkpoint_blocks"))] = (r, est)
    rows, over_err, errs = [], [], {"time": [], "energy": [], "memory": []}
    for (_, gpu, label, batch, mode), both in pairs.items():
        plain, ck = both.get(False), both.get(True)
        cells = [short_name(gpu), label, batch, mode]
        if plain is None or ck is None:
            rows.append(cells + ["plain only" if ck is None else "checkpointed only"] + ["—"] * 6)
            continue
        (pr, pe), (cr, ce) = plain, ck
        meas = cr["measured_gpu_time_ms"] / pr["measured_gpu_time_ms"] - 1
        pred = None if pe is None or ce is None else ce["predicted_gpu_time_ms"] / pe["predicted_gpu_time_ms"] - 1
        t_err = None if ce is None else _err(ce["predicted_gpu_time_ms"], cr["measured_gpu_time_ms"])
        e_err = None if ce is None else _err(ce["predicted_gpu_energy_mj"], cr.get("measured_gpu_energy_mj"))
        m_err = None if ce is None else ce.get("peak_memory_error_pct")
        if pred is not None:
            over_err.append(100 * (pred - meas))
        for k, v in (("time", t_err), ("energy", e_err), ("memory", m_err)):
            if v is not None:
                errs[k].append(abs(v))
        rows.append(cells + [f"{pr['measured_gpu_time_ms']:.2f} -> {cr['measured_gpu_time_ms']:.2f}",
                             f"{100 * meas:+.0f}%", "—" if pred is None else f"{100 * pred:+.0f}%",
                             _pct(t_err), _pct(e_err),
                             f"{pr.get('measured_peak_memory_gb', float('nan')):.2f} -> "
                             f"{cr.get('measured_peak_memory_gb', float('nan')):.2f}",
                             "—" if ce is None or "predicted_peak_memory_gb" not in ce
                             else f"{ce['predicted_peak_memory_gb']:.2f} ({_pct(m_err)})"])
    header = ["GPU", "model", "batch", "mode", "GPU ms plain -> checkpointed", "measured cost", "predicted cost",
              "checkpointed GPU time error", "checkpointed GPU energy error", "peak GB plain -> checkpointed",
              "checkpointed peak GB predicted"]
    lines = ["Each step measured plain and then with every repeated block inside `torch.utils.checkpoint` "
             "(`gpurec validate --checkpoint-blocks`, `scripts/device_checkpoint.sh`), one after the other on the "
             f"same card ({', '.join(sorted({r['_file'] for r in recs}))}).  Cost = checkpointed / plain host-free "
             "GPU time − 1; the predictions are the shipped models' for the same network with the same blocks "
             "checkpointed (`gpurec predict --checkpoint-blocks`).  A step measured plain only: its checkpointed run "
             "failed on the GPU (the run's log beside the records, `checkpoint_run_*.txt.gz`, says why).", "",
             table(header, rows), ""]
    if over_err:
        lines += [f"Over {len(over_err)} pairs: the predicted cost is off by {statistics.fmean(map(abs, over_err)):.1f} "
                  f"points on average ({statistics.fmean(over_err):+.1f} mean, signed); the checkpointed step's "
                  f"MAPE is {statistics.fmean(errs['time']):.1f}% in GPU time, {statistics.fmean(errs['energy']):.1f}% "
                  f"in GPU energy and {statistics.fmean(errs['memory']):.1f}% in peak memory.", ""]
    return lines


def _field_table(recs: list[dict[str, Any]], ests: list[Any]) -> list[str]:
    rows = []
    for r, est in zip(recs, ests, strict=True):
        cells = [_machine(r), _label(r), r["batch_size"], r["mode"], _architecture(r)]
        for f, _ in FIELDS:
            meas = r.get(f"measured_{f}")
            pred = None if est is None else getattr(est, f)
            digits = 2 if f.endswith("_ms") else 0
            cells.append("—" if meas is None else f"{meas:.{digits}f}")
            cells.append("—" if pred is None else f"{pred:.{digits}f} ({_pct(_err(pred, meas))})")
        cells += [r.get("measured_bound", "—"), "—" if est is None else est.bound]
        rows.append(cells)
    header = ["machine", "model", "batch", "mode", "architecture",
              "GPU ms measured", "GPU ms predicted", "GPU mJ measured", "GPU mJ predicted",
              "eager ms measured", "eager ms predicted", "eager mJ measured", "eager mJ predicted",
              "bound measured", "bound predicted"]
    return [table(header, rows), ""]


def _summary(recs: list[dict[str, Any]], ests: list[Any]) -> list[str]:
    """MAPE per field for training and unseen architectures, beside how far the same field moved
    between machines measuring the same set (the noise floor)."""
    by_set: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by_set[(r["gpu"], *_set(r), r["mode"])].append(r)
    rows = []
    for f, label in FIELDS:
        cells: list[Any] = [label]
        for unseen in (False, True):
            errs = [abs(e) for r, est in zip(recs, ests, strict=True)
                    if est is not None and _unseen(r) == unseen
                    and (e := _err(getattr(est, f), r.get(f"measured_{f}"))) is not None]
            cells.append(f"{statistics.mean(errs):.1f}% (max {max(errs):.1f}%, n={len(errs)})" if errs else "—")
        moves = [100 * abs(max(v) / min(v) - 1) for rs in by_set.values()
                 if len(v := [r[f"measured_{f}"] for r in rs if r.get(f"measured_{f}")]) >= 2]
        cells.append(f"{statistics.median(moves):.1f}% (max {max(moves):.1f}%, n={len(moves)})" if moves else "—")
        rows.append(cells)
    right = [(_unseen(r), est.bound == r["measured_bound"]) for r, est in zip(recs, ests, strict=True)
             if est is not None and r.get("measured_bound")]
    cells = ["bound verdict (right)"]
    for unseen in (False, True):
        hits = [ok for u, ok in right if u == unseen]
        cells.append(f"{sum(hits)}/{len(hits)}" if hits else "—")
    flips = sum(len({r["measured_bound"] for r in rs if r.get("measured_bound")}) > 1 for rs in by_set.values())
    cells.append(f"{flips} of {sum(len(rs) >= 2 for rs in by_set.values())} sets changed verdict between machines")
    rows.append(cells)
    return [table(["field", "training architectures: MAPE", "unseen architectures: MAPE",
                   "same set on several machines: median spread (max/min − 1) of the measurement"], rows), ""]


def _two_hosts(recs: list[dict[str, Any]], ests: list[Any]) -> list[str]:
    """Sets measured on several hosts of one GPU model: does the host profile move the eager
    prediction the way the measurement moved?"""
    by_set: dict[tuple[Any, ...], list[tuple[dict[str, Any], Any]]] = defaultdict(list)
    for r, est in zip(recs, ests, strict=True):
        if r.get("host_bench") and est is not None:
            by_set[(r["gpu"], *_set(r), r["mode"])].append((r, est))
    rows, agree = [], []
    hosts: dict[str, dict[str, Any]] = {}
    for (_, _, _, mode), pairs in by_set.items():
        if len(pairs) < 2:
            continue
        for r, _ in pairs:
            hosts.setdefault(_machine(r), r["host_bench"])
        for (ra, ea), (rb, eb) in ((a, b) for i, a in enumerate(pairs) for b in pairs[i + 1:]):
            m_ratio = rb["measured_time_ms"] / ra["measured_time_ms"]
            if abs(m_ratio - 1) > 0.05:
                agree.append((m_ratio > 1) == (eb.time_ms > ea.time_ms))
        gpu = [r["measured_gpu_time_ms"] for r, _ in pairs]
        rows.append([_label(pairs[0][0]), pairs[0][0]["batch_size"], mode,
                     " / ".join(f"{r['measured_time_ms']:.2f}" for r, _ in pairs),
                     " / ".join(f"{e.time_ms:.2f}" for _, e in pairs),
                     f"{100 * (max(gpu) / min(gpu) - 1):.1f}%", " / ".join(r["measured_bound"] for r, _ in pairs)])
    if not rows:
        return ["No set was measured on two hosts yet.", ""]
    names = list(hosts)
    host_rows = [[n, h["cores"], f"{h['launch_us']:.1f}", f"{h['python_loop_us']:.0f}",
                  f"{h['dispatch_cpu_us'].get('conv2d:inference', float('nan')):.1f}",
                  f"{h['dispatch_cpu_us'].get('conv2d:training', float('nan')):.1f}"] for n, h in hosts.items()]
    return ["The hosts, as their `gpurec host-bench` profile saw them at the start of the run:", "",
            table(["host", "cores", "tiny-kernel launch µs", "Python loop µs", "conv2d inference dispatch µs",
                   "conv2d training dispatch µs"], host_rows), "",
            f"The same sets on each host, in the order {' / '.join(names)}:", "",
            table(["model", "batch", "mode", "eager ms measured", "eager ms predicted with each host's profile",
                   "GPU time spread (graph, max/min − 1)", "bound measured"], rows), "",
            (f"Of the host pairs where a set's measured eager time moved more than 5%, the prediction moved "
             f"the same way in {sum(agree)} of {len(agree)}." if agree else "No set's eager time moved more than 5%."),
            ""]


def _gpu_pairs(recs: list[dict[str, Any]], ests: list[Any]) -> list[str]:
    """Sets measured live on two GPU models: the measured ratio of their host-free time and
    energy (each GPU's median over its machines) against the predicted ratio, in percentage
    points: the difference a ranking sells, checked live."""
    by_set: dict[tuple[Any, ...], dict[str, list[tuple[dict[str, Any], Any]]]] = defaultdict(lambda: defaultdict(list))
    for r, est in zip(recs, ests, strict=True):
        if est is not None and r.get("measured_gpu_time_ms") and r.get("measured_gpu_energy_mj"):
            by_set[(*_set(r), r["mode"])][r["gpu"]].append((r, est))
    gpus = sorted({g for per_gpu in by_set.values() for g in per_gpu})
    if len(gpus) < 2:
        return []
    base, other = gpus[0], gpus[1:]
    rows, errs = [], defaultdict(list)
    for (key, precision, mode), per_gpu in sorted(by_set.items()):
        if base not in per_gpu:
            continue
        for g in other:
            if g not in per_gpu:
                continue
            cells: list[Any] = [key + ("" if precision == "fp32" else f" ({precision})"), mode, g]
            for f in ("gpu_time_ms", "gpu_energy_mj"):
                meas = statistics.median(r[f"measured_{f}"] for r, _ in per_gpu[g]) / statistics.median(
                    r[f"measured_{f}"] for r, _ in per_gpu[base])
                pred = getattr(per_gpu[g][0][1], f) / getattr(per_gpu[base][0][1], f)
                err = 100 * (pred - meas)
                errs[f].append(err)
                cells += [f"{meas:.3f}", f"{pred:.3f}", f"{err:+.1f}"]
            rows.append(cells)
    if not rows:
        return []

    def mean_abs(v: list[float]) -> str:
        return f"{statistics.mean(abs(x) for x in v):.1f} pp (bias {statistics.mean(v):+.1f} pp, n={len(v)})"

    return [f"Each GPU against the {base}: the measured ratio is the median of each GPU's live records of the set "
            "(every machine), the predicted one the ratio of the two estimates.", "",
            table(["set", "mode", "GPU", "time ratio measured", "time ratio predicted", "error (pp)",
                   "energy ratio measured", "energy ratio predicted", "error (pp)"], rows), "",
            f"Mean |error| of the ratio: time {mean_abs(errs['gpu_time_ms'])}, energy "
            f"{mean_abs(errs['gpu_energy_mj'])}.", ""]


def _per_op(recs: list[dict[str, Any]], ests: list[Any]) -> list[str]:
    """Predicted per-operation GPU time against the in-network kernel time of the same position,
    summed by operation kind over every record (positions whose signature differs are counted apart)."""
    from gpurec.validate.compare import per_op_errors

    agg: dict[tuple[str, bool], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    mismatched = total = 0
    for r, est in zip(recs, ests, strict=True):
        if est is None or not r.get("in_network"):
            continue
        positions = per_op_errors(est, r["in_network"], top=None)
        total += len(positions)
        unseen = _unseen(r)
        for pos in positions:
            if not pos["same_operation"]:
                mismatched += 1
                continue
            a = agg[(pos["kind"], unseen)]
            a[0] += 1
            a[1] += pos["measured_ms"]
            a[2] += pos["predicted_ms"]
    if not agg:
        return []
    abs_total = sum(abs(v[2] - v[1]) for v in agg.values()) or 1.0
    top = sorted(agg.items(), key=lambda kv: -abs(kv[1][2] - kv[1][1]))[:14]
    rows = [[kind, "unseen" if unseen else "training", n, f"{m:.2f}", f"{p:.2f}", _pct(_err(p, m)),
             f"{100 * abs(p - m) / abs_total:.0f}%"] for (kind, unseen), (n, m, p) in top]
    return [f"{total:,} operation positions compared ({mismatched} where the record's operation and the "
            "estimate's differ, left out); the kinds below carry the most absolute error.", "",
            table(["operation kind", "architectures", "positions", "measured kernel ms (sum)",
                   "predicted GPU ms (sum)", "error", "share of all |error|"], rows), ""]


def _against_collection(recs: list[dict[str, Any]], root: Path) -> list[str]:
    """How far each live measurement is from the collected row of the same set, eager and graph."""
    networks: dict[str, Any] = {}
    moved: dict[str, list[float]] = {"time_ms": [], "gpu_time_ms": []}
    far = []
    for r in recs:
        if r["gpu"] not in networks:
            networks[r["gpu"]] = load_dataset(gpu=r["gpu"], table="networks", root=root / "datasets")
        col = _collected(networks[r["gpu"]], r)
        if col is None:
            continue
        for f in moved:
            if f in col and r.get(f"measured_{f}"):
                d = 100 * (r[f"measured_{f}"] / col[f] - 1)
                moved[f].append(abs(d))
                if f == "time_ms" and abs(d) > 10:
                    far.append(f"{_label(r)} b{r['batch_size']} {r['mode']} on {_machine(r)} ({d:+.0f}%)")

    def summary(v: list[float]) -> str:
        return f"median {statistics.median(v):.1f}% (max {max(v):.1f}%, n={len(v)})" if v else "—"

    return [f"Against the rows `gpurec collect` measured for the same sets on other machines: eager time "
            f"{summary(moved['time_ms'])}, GPU time as one graph {summary(moved['gpu_time_ms'])}.  "
            f"Eager moves above 10%: {', '.join(far) if far else 'none'}.  No predictor can be closer to a "
            "given machine's eager time than that machine is to the machine its data came from; the GPU "
            "time, by contrast, reproduces.", ""]


def _op_sums(recs: list[dict[str, Any]], root: Path) -> list[str]:
    """The sum of the isolated host-free operation rows against the network's graph time."""
    from gpurec.validate.compare import record_input, sum_of_measured_ops

    rows, seen = [], set()
    for r in recs:
        key = (r["gpu"], *_set(r), r["mode"])
        if key in seen or not r.get("measured_gpu_time_ms"):
            continue
        seen.add(key)
        shape, precision, _ = record_input(r)
        s = sum_of_measured_ops(r["model"], shape, r["mode"], r["gpu"], root=root / "datasets", precision=precision)
        if "sum_gpu_time_ms" in s:
            rows.append([_label(r), r["batch_size"], r["mode"], f"{r['measured_gpu_time_ms']:.2f}",
                         f"{s['sum_gpu_time_ms']:.2f} ({_pct(_err(s['sum_gpu_time_ms'], r['measured_gpu_time_ms']))})",
                         f"{r['measured_gpu_energy_mj']:.0f}",
                         f"{s['sum_gpu_energy_mj']:.0f} ({_pct(_err(s['sum_gpu_energy_mj'], r['measured_gpu_energy_mj']))})"
                         if "sum_gpu_energy_mj" in s else "—"])
        else:
            rows.append([_label(r), r["batch_size"], r["mode"], f"{r['measured_gpu_time_ms']:.2f}",
                         f"{s['covered_ops']}/{s['ops']} operations measured", "—", "—"])
    return [table(["model", "batch", "mode", "graph ms (live)", "sum of operation rows, ms", "graph mJ (live)",
                   "sum of operation rows, mJ"], rows), ""]


def _legacy(recs: list[dict[str, Any]], ests: list[Any]) -> list[str]:
    rows = []
    for r, est in zip(recs, ests, strict=True):
        rows.append([r["_file"], _label(r), r["batch_size"], r["mode"], _architecture(r),
                     f"{r['measured_time_ms']:.2f}", "—" if est is None else f"{est.time_ms:.2f} ({_pct(_err(est.time_ms, r['measured_time_ms']))})",
                     f"{r['measured_energy_mj']:.0f}",
                     "—" if est is None else f"{est.energy_mj:.0f} ({_pct(_err(est.energy_mj, r['measured_energy_mj']))})"])
    return [table(["log", "model", "batch", "mode", "architecture", "eager ms measured", "eager ms predicted (reference host)",
                   "eager mJ measured", "eager mJ predicted"], rows), ""]


def _plot(recs: list[dict[str, Any]], ests: list[Any], out: Path) -> None:
    """Predicted (models shipped now, each record's host) against measured GPU time, eager time
    and GPU energy; one marker per machine, unseen architectures hollow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("gpu_time_ms", "GPU time (one graph), ms"), ("time_ms", "eager time on the host, ms"),
              ("gpu_energy_mj", "GPU energy (one graph), mJ")]
    machines = sorted({_machine(r) for r in recs})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2))
    for ax, (f, label) in zip(axes, panels, strict=True):
        xs_all: list[float] = []
        for k, m in enumerate(machines):
            for unseen in (False, True):
                pts = [(r[f"measured_{f}"], getattr(e, f)) for r, e in zip(recs, ests, strict=True)
                       if e is not None and _machine(r) == m and _unseen(r) == unseen
                       and r.get(f"measured_{f}")]
                if not pts:
                    continue
                xs, ys = zip(*pts, strict=True)
                xs_all += [*xs, *ys]
                ax.loglog(xs, ys, "os^"[k % 3], ms=5, mfc="none" if unseen else None, color=f"C{k}",
                          label=f"{m}{', unseen' if unseen else ''}")
        if xs_all:
            ax.plot([min(xs_all), max(xs_all)], [min(xs_all), max(xs_all)], "k--", lw=0.8)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("measured")
        ax.set_ylabel("predicted")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def generate(root: Path | str = ".", warn: Callable[[str], None] | None = None) -> str:
    """docs/validation.md (and docs/img/validation_live.png) from <root>/datasets/validation/live_*.jsonl,
    the shipped dataset and the shipped models; returns the text.  ``warn`` hears of records the
    models cannot cover (they stay in the tables)."""
    root = Path(root)
    warn = warn or (lambda msg: warnings.warn(msg, stacklevel=2))
    val_dir = root / "datasets" / "validation"
    recs = _records(val_dir)
    if not recs:
        raise FileNotFoundError(f"no {val_dir}/live_*.jsonl: run scripts/device_validate.sh on a GPU, then "
                                "`gpurec validate --complete LOG`")
    from gpurec.model import load_predictor

    predictor = load_predictor(root / "models", data_root=root / "datasets")
    ests = _predict(recs, predictor, warn)
    checkpointed = _records(val_dir, "checkpoint_*.jsonl")
    manifest = json.loads((root / "models" / "manifest.json").read_text())
    new = [(r, e) for r, e in zip(recs, ests, strict=True) if r.get("measured_gpu_time_ms")]
    old = [(r, e) for r, e in zip(recs, ests, strict=True) if not r.get("measured_gpu_time_ms")]
    new_r, new_e = [r for r, _ in new], [e for _, e in new]
    gpus = sorted({r["gpu"] for r in recs})
    prov = recs[-1].get("provenance", {})
    lines = [
        "# Live validation: `gpurec validate` on real GPUs",
        "",
        f"_Generated by `gpurec report validation` from {', '.join(sorted({r['_file'] for r in recs}))} "
        "(`datasets/validation/`), the shipped dataset and the shipped models; every number comes from those files._",
        "",
        f"GPUs: {', '.join(gpus)}; driver {prov.get('driver', '?')}, torch {prov.get('torch', '?')}.  "
        "Each record was measured by `gpurec validate --model M --batch-size B --mode MODE [--seq-len S] "
        "[--precision P]` "
        "(`scripts/device_validate.sh`) the three ways collection measures a network: eager (Timer median, "
        "tick-aligned NVML energy window), host-free (the step captured as one CUDA graph, replays timed by CUDA "
        "events inside an energy window) and in-network (kernel time per operation position under the profiler), "
        "together with that machine's `gpurec host-bench` profile.",
        "",
        f"The predictions are the models shipped now (trained {manifest.get('created', '?')[:10]} on "
        f"{manifest.get('training_data', {}).get('operations', 0):,} operation rows; they never saw these live "
        "records), made with each record's own host profile; the logs also keep the prediction stored when "
        "`gpurec validate --complete` filled them in.  Errors are (predicted − measured) / measured.  *Unseen* "
        "architectures are never trained on; for training architectures the GPU's own operation rows are "
        "looked up, so their error is mostly that of the whole-network composition and of the host.  On every "
        "GPU but the H100 the GPU time `predict` gives is the H100's times the cross-GPU model's ratio, so a "
        "record of another GPU checks that transfer live.",
        "",
    ]
    if new:
        lines += ["## Field by field", ""]
        for gpu in sorted({r["gpu"] for r in new_r}):
            mine = [(r, e) for r, e in zip(new_r, new_e, strict=True) if r["gpu"] == gpu]
            lines += [f"### {gpu}", "", *_summary([r for r, _ in mine], [e for _, e in mine])]
        lines += [
                  "The last column is the noise floor: the same set measured by the same code on several "
                  "machines with the same GPU model.  The bound is `host` when the eager step is at least 20% "
                  "longer than the graph.", "",
                  *_field_table(new_r, new_e),
                  "## The same sets on several hosts", "", *_two_hosts(new_r, new_e),
                  "## The same sets on two GPUs: the difference, live", "",
                  *(_gpu_pairs(new_r, new_e) or ["No set was measured live on two GPU models yet.", ""]),
                  "## Which operations carry the GPU-time error", "", *_per_op(new_r, new_e),
                  "## Live measurements against the collected rows", "", *_against_collection(new_r, root),
                  "## The network as the sum of its isolated operations", "",
                  "The host-free rows of the dataset (each operation captured and replayed alone) summed with "
                  "multiplicity, against the live graph time of the whole step; shown where every operation of "
                  "the set is measured on this GPU.", "", *_op_sums(new_r, root)]
    if checkpointed:
        lines += ["## Activation checkpointing, measured", "", *_checkpointing(checkpointed, predictor, warn)]
    if old:
        lines += ["## Eager-only records (before host-free validation)", "",
                  "Measured by an earlier `gpurec validate` that timed the eager step only and recorded no host "
                  "profile, so they are predicted for the reference host.", "",
                  *_legacy([r for r, _ in old], [e for _, e in old])]
    if new:
        _plot(new_r, new_e, root / "docs" / "img" / "validation_live.png")
        lines += ["![predicted against measured, every host-free live record, models shipped now]"
                  "(img/validation_live.png)", ""]
    text = "\n".join(lines).rstrip("\n") + "\n"
    atomic_write_text(root / "docs" / "validation.md", text)
    return text
