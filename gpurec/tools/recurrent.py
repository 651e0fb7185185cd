"""Fit the recurrent-layer models (gpurec.model.recurrent) into an already trained model directory.

Why: `gpurec train` fits them with everything else (tens of minutes); this fits only them, in
seconds, from the training architectures' recurrent operation rows, with the features the
trained manifest defines, and writes them into its manifest.  The boosters, the measured-row
lookup and the network correction stay as trained (the correction was fitted on sums whose
recurrent layers the boosters predicted: retrain for full consistency).  Also returns the
held-out sequence networks' errors with and without them, measured against the committed
network rows.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.ops.precision import precision_or_default


def recurrent_rows(data_root: Path | str | None, builder: Any) -> tuple[Any, dict[str, np.ndarray], Any]:
    """The recurrent operation rows usable as training rows (test architectures never), their
    feature matrices per target, and the (reference host, rows by run) for host scales."""
    from gpurec.model.features import masked, target_mask
    from gpurec.model.fitting.data import RECURRENT_KINDS, kind_rows, reference_host

    rows, X_all, ops, nets = kind_rows(data_root, RECURRENT_KINDS, builder)
    X = {t: masked(X_all, target_mask(t, builder.feature_names)) for t in ("time", "power", "host")}
    return rows, X, reference_host(data_root, ops, nets)


def fit_into(model_dir: Path | str, data_root: Path | str | None = None, evaluate: bool = True,
             half_only: bool = False) -> dict[str, Any]:
    """Fit the three recurrent models and write them into ``model_dir``'s manifest (atomically);
    with ``half_only``, only the time and power models' half-precision factors, against the fp32
    forms the manifest holds (gpurec.model.fitting.recurrent_fit.refit_half).  Returns the fit
    reports and, with ``evaluate``, the held-out sequence networks' MAPE before and after."""
    from gpurec.host import HostProfile
    from gpurec.model.features import FeatureBuilder, FeatureConfig
    from gpurec.model.fitting.data import host_scales
    from gpurec.model.fitting.evaluate import arch_of
    from gpurec.model.fitting.recurrent_fit import (
        fit_recurrent,
        fit_recurrent_host,
        fit_recurrent_power,
        refit_half,
    )
    from gpurec.model.persist import read_manifest, write_manifest
    from gpurec.model.recurrent import RecurrentPower, RecurrentTime

    manifest = read_manifest(model_dir)
    builder = FeatureBuilder(manifest["kind_categories"], FeatureConfig.from_dict(manifest["feature_config"]),
                             manifest.get("extra_columns", []))
    rows, X, (_, _, by_run) = recurrent_rows(data_root, builder)
    names, modes = builder.feature_names, rows["mode"].to_numpy().astype(str)
    groups = [arch_of(str(k)) for k in rows["set_key"]]
    t = rows["gpu_time_ms"].to_numpy(dtype=np.float64)  # host-free elapsed (what with_targets keeps for them)
    w = rows["gpu_power_w"].to_numpy(dtype=np.float64)
    before = evaluate_held_out(model_dir, data_root) if evaluate else None
    manifest = dict(manifest)
    out: dict[str, Any] = {"rows": int(len(rows))}
    if half_only:
        time_model, power_model, out["half_candidates"] = refit_half(
            RecurrentTime.from_dict(manifest.get("recurrent_time"), names),
            RecurrentPower.from_dict(manifest.get("recurrent_power"), names), X["time"], X["power"], np.log(t),
            np.log(w), modes, groups, names)
        out["half"] = {k: {m: f.half.as_dict() if f.half is not None else None for m, f in model.fits.items()}
                       for k, model in (("time", time_model), ("power", power_model)) if model is not None}
        manifest["recurrent_half_fitted_after_training"] = True
    else:
        time_model, out["time"] = fit_recurrent(X["time"], np.log(t), modes, groups, names)
        power_model, out["power"] = fit_recurrent_power(X["power"], np.log(w), modes, groups, names)
        reference = HostProfile.from_dict(manifest["host"]["reference"])
        scales, _ = host_scales(rows, by_run, reference)
        host_ms = rows["host_ms"].to_numpy(dtype=np.float64)
        ok = np.isfinite(host_ms) & (host_ms > 0) & np.isfinite(scales) & (scales > 0)
        host_model, out["host"] = fit_recurrent_host(X["host"][ok], np.log(host_ms[ok] / scales[ok]), modes[ok],
                                                     [g for g, k in zip(groups, ok, strict=True) if k], names)
        manifest["recurrent_host"] = host_model.as_dict() if host_model is not None else None
        manifest["recurrent_fitted_after_training"] = True
    manifest["recurrent_time"] = time_model.as_dict() if time_model is not None else None
    manifest["recurrent_power"] = power_model.as_dict() if power_model is not None else None
    write_manifest(model_dir, manifest)
    if evaluate:
        out["held_out_before"], out["held_out_after"] = before, evaluate_held_out(model_dir, data_root)
    return out


def evaluate_held_out(model_dir: Path | str, data_root: Path | str | None = None) -> dict[str, Any]:
    """MAPE of host-free time, host-free energy and eager time on every measured network row of
    the held-out sequence architectures, per family ("lstm"; "lstm|bf16-mixed" at another
    precision) and overall (fp32 rows only, "all"; every precision, "all precisions")."""
    import torch

    from gpurec.dataset.load import default_root
    from gpurec.model import load_predictor
    from gpurec.model.fitting.data import load_tables
    from gpurec.model.fitting.evaluate import arch_of
    from gpurec.sets import SEQ_TEST_ARCHS

    _, nets, _ = load_tables(data_root if data_root is not None else default_root())
    nets = nets[(nets["status"] == "ok") & nets["set_key"].map(lambda k: arch_of(str(k)) in SEQ_TEST_ARCHS)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = load_predictor(model_dir, check_data=False)
        errors: dict[str, dict[str, list[float]]] = {}
        for _, r in nets.iterrows():
            arch, b, s = str(r["set_key"]).split(":")
            precision = precision_or_default(r["precision"])
            e = p.predict(arch, (int(b[1:]), int(s[1:])), mode=str(r["mode"]), gpu=str(r["gpu"]), dtype=torch.long,
                          precision=None if precision == "fp32" else precision)
            name = arch.split("_")[0] + ("" if precision == "fp32" else f"|{precision}")
            fam = errors.setdefault(name, {"time": [], "energy": [], "eager_time": []})
            fam["time"].append(abs(e.gpu_time_ms / r["gpu_time_ms"] - 1))
            fam["energy"].append(abs(e.gpu_energy_mj / r["gpu_energy_mj"] - 1))
            fam["eager_time"].append(abs(e.time_ms / r["time_ms"] - 1))
    table = {f: {k: float(np.mean(v)) for k, v in d.items()} | {"n": len(d["time"])} for f, d in errors.items()}
    for label, names in (("all", [f for f in errors if "|" not in f]), ("all precisions", list(errors))):
        every = {k: [x for f in names for x in errors[f][k]] for k in ("time", "energy", "eager_time")}
        if every["time"]:
            table[label] = {k: float(np.mean(v)) for k, v in every.items()} | {"n": len(every["time"])}
    return table
