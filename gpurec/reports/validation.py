"""docs/validation.md from the live `gpurec validate` logs (datasets/validation/live_*.jsonl).

Each live record was measured by `gpurec validate` on the GPU it names, then completed here
with `gpurec validate --complete LOG` where the GPU machine had no xgboost.  Besides the
prediction error, the report compares each live measurement with the whole-network row that
`gpurec collect` measured for the same set and mode on another board of the same GPU model
(datasets/<gpu>/networks.parquet): how far a measurement itself moves between machines.

    gpurec report validation
"""

from __future__ import annotations

import json
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpurec.dataset import load_dataset
from gpurec.dataset.store import atomic_write_text
from gpurec.reports.markdown import table
from gpurec.sets import TEST_ARCHS


def _records(val_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(val_dir.glob("live_*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                rec["_file"] = path.name
                out.append(rec)
    return out


def _collected(nets: Any, model: str, batch: int, res: int, mode: str) -> dict[str, Any] | None:
    """The collected whole-network row of the same set and mode (``nets``: that GPU's networks table)."""
    row = nets[(nets["set_key"] == f"{model}:b{batch}:r{res}") & (nets["mode"] == mode)]
    if row.empty:
        return None
    r = row.iloc[-1]
    return {"time_ms": float(r["time_ms"]), "energy_mj": float(r["energy_mj"]), "board": str(r.get("gpu_uuid", ""))}


def _current_errors(recs: list[dict[str, Any]], models_dir: Path,
                    warn: Callable[[str], None]) -> tuple[list[tuple[float, float] | None], dict[str, Any]]:
    """(time, energy) error of the models shipped now for each record, and what they were trained on.

    The log keeps the prediction made when the record was completed; the shipped models may have
    been retrained on more rows since, so both are reported (nothing in the log is rewritten).
    """
    from gpurec.model import load_predictor
    from gpurec.validate import prediction_fields

    predictor = load_predictor(models_dir, data_root=models_dir.parent / "datasets")
    errors: list[tuple[float, float] | None] = []
    for r in recs:
        shape = (int(r["batch_size"]), 3, int(r["resolution"]), int(r["resolution"]))
        try:
            est = predictor.predict(r["model"], input_shape=shape, mode=r["mode"], gpu=r["gpu"])
        except Exception as exc:  # a record the current models cannot cover is shown, not dropped
            warn(f"current models: {r['model']} b{r['batch_size']} {r['mode']}: {exc}")
            errors.append(None)
            continue
        now = prediction_fields(est, r["measured_time_ms"], r["measured_energy_mj"])
        errors.append((now["time_error_pct"], now["energy_error_pct"]))
    manifest = json.loads((models_dir / "manifest.json").read_text())
    return errors, {"created": manifest.get("created", "?"),
                    "operations": manifest.get("training_data", {}).get("operations")}


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:+.{digits}f}%"


def generate(root: Path | str = ".", warn: Callable[[str], None] | None = None) -> str:
    """docs/validation.md (and datasets/validation/live_<gpu>.png) from <root>/datasets/validation/
    live_*.jsonl, the shipped dataset and the shipped models; returns the text.  ``warn`` hears of records the models cannot cover
    (they stay in the table)."""
    root = Path(root)
    warn = warn or (lambda msg: warnings.warn(msg, stacklevel=2))
    val_dir = root / "datasets" / "validation"
    recs = _records(val_dir)
    if not recs:
        raise FileNotFoundError(f"no {val_dir}/live_*.jsonl: run scripts/device_validate.sh on a GPU, then "
                                "`gpurec validate --complete LOG`")
    networks: dict[str, Any] = {}
    rows, t_err, e_err, t_moved, e_moved, far = [], [], [], [], [], []
    now, models = _current_errors(recs, root / "models", warn)
    for r, cur in zip(recs, now, strict=True):
        unseen = r["model"] in TEST_ARCHS
        if r["gpu"] not in networks:
            networks[r["gpu"]] = load_dataset(gpu=r["gpu"], table="networks", root=root / "datasets")
        col = _collected(networks[r["gpu"]], r["model"], r["batch_size"], r["resolution"], r["mode"])
        dt = 100 * (r["measured_time_ms"] / col["time_ms"] - 1) if col else None
        de = 100 * (r["measured_energy_mj"] / col["energy_mj"] - 1) if col else None
        te, ee = r.get("time_error_pct"), r.get("energy_error_pct")
        if te is not None:
            t_err.append(abs(te))
            e_err.append(abs(ee))
        if dt is not None:
            t_moved.append(abs(dt))
            if abs(dt) > 10:
                far.append(f"{r['model']} batch {r['batch_size']} {r['mode']} ({dt:+.0f}%)")
            e_moved.append(abs(de))
        cov = r.get("opsum_coverage")
        col_t = f"{col['time_ms']:.2f} ({_pct(dt)})" if col else "—"
        col_e = f"{col['energy_mj']:.0f} ({_pct(de)})" if col else "—"
        cov_s = "—" if cov is None else f"{100 * cov:.0f}%"
        rows.append([
            r["model"], r["batch_size"], r["mode"], "unseen" if unseen else "training arch",
            f"{r['measured_time_ms']:.2f}", f"{r.get('predicted_time_ms', float('nan')):.2f}", _pct(te),
            f"{r['measured_energy_mj']:.0f}", f"{r.get('predicted_energy_mj', float('nan')):.0f}", _pct(ee),
            *(("—", "—") if cur is None else (_pct(cur[0]), _pct(cur[1]))),
            f"{r['measured_power_w']:.0f}", cov_s, col_t, col_e])
    gpus = sorted({r["gpu"] for r in recs})
    prov = recs[0].get("provenance", {})
    lines = [
        "# Live validation: `gpurec validate` on real GPUs",
        "",
        f"_Generated by `gpurec report validation` from {', '.join(sorted({r['_file'] for r in recs}))} "
        "(`datasets/validation/`); every number comes from those files and the shipped dataset._",
        "",
        f"GPU: {', '.join(gpus)}; driver {prov.get('driver', '?')}, torch {prov.get('torch', '?')}, host CPU "
        f"{prov.get('host_cpu', '?')}.  Each row was measured by `gpurec validate --model M --batch-size B "
        "--mode MODE` (the collection method on the whole network: tick-aligned NVML energy window, "
        "Timer median).  The GPU machine has no xgboost, so the predictions were added here with "
        "`gpurec validate --complete datasets/validation/live_<gpu>.jsonl`, by the shipped models "
        "(which never saw these live measurements).  Errors are (predicted − measured) / measured.",
        "",
        "*Collected* is the whole-network row `gpurec collect` measured for the same set and mode on another "
        "machine with the same GPU model (the ground truth the models' network correction and the accuracy "
        "report use); the bracket is how far the live measurement is from it.",
        "",
        f"*Now* is the error of the models shipped now (trained {models['created'][:10]} on "
        f"{models['operations']:,} operation rows), recomputed from the same measurement; the *predicted* columns "
        "keep the prediction the log recorded when it was completed.",
        "",
        table(["model", "batch", "mode", "architecture", "measured ms", "predicted ms", "time error",
               "measured mJ", "predicted mJ", "energy error", "time error now", "energy error now", "power W",
               "ops measured (sum)", "collected ms (live vs it)", "collected mJ (live vs it)"], rows),
        "",
    ]
    cur_ok = [c for c in now if c is not None]
    if t_err:
        lines += [f"**Prediction error** over {len(t_err)} live runs: time MAPE {statistics.mean(t_err):.1f}% "
                  f"(max {max(t_err):.1f}%), energy MAPE {statistics.mean(e_err):.1f}% (max {max(e_err):.1f}%)"
                  + (f"; with the models shipped now: time {statistics.mean(abs(c[0]) for c in cur_ok):.1f}% "
                     f"(max {max(abs(c[0]) for c in cur_ok):.1f}%), energy {statistics.mean(abs(c[1]) for c in cur_ok):.1f}% "
                     f"(max {max(abs(c[1]) for c in cur_ok):.1f}%) over {len(cur_ok)} runs." if cur_ok else "."),
                  ""]
    if t_moved:
        lines += [f"**Measurement moves between machines**: the live runs differ from the collected rows by a "
                  f"median {statistics.median(t_moved):.1f}% in time (max {max(t_moved):.1f}%) and "
                  f"{statistics.median(e_moved):.1f}% in energy (max {max(e_moved):.1f}%).  Moves above 10% in time: "
                  f"{', '.join(far) if far else 'none'}; small batches of networks of many small kernels are "
                  "launch-bound, so their time is set by the host, while the other sets reproduce closely.  "
                  "A prediction can be no closer to a given machine than "
                  "that machine is to the one the data came from, which bounds what any predictor trained on "
                  "these data can reach for launch-bound networks.", ""]
    full = [r for r in recs if (r.get("opsum_coverage") or 0) >= 1.0]
    lines += ["The op-sum comparison needs every operation of the set measured on this GPU: "
              + (f"{len(full)} of these sets are fully covered." if full else
                 "none of these sets is fully covered yet (column *ops measured*), so it is reported as not "
                 "comparable."), ""]
    from gpurec.validate import plot_log

    for log in sorted(val_dir.glob("live_*.jsonl")):  # one plot per live log, drawn by gpurec.validate
        plot_log(log, log.with_suffix(".png"))
        lines += [f"![predicted vs measured](../datasets/validation/{log.stem}.png)", ""]
    text = "\n".join(lines)
    atomic_write_text(root / "docs" / "validation.md", text)
    return text
