"""Fitting the host dispatch model (training half): the profile prior, and where the data has
enough ``host_ms`` rows a booster on top, validated by grouped K-fold.  The fitted model is a
``gpurec.model.host_model.HostDispatch``, which prediction uses without this module."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpurec.model.host_model import HostDispatch


def fit_host_model(p: Any, cfg: Any, log: Any) -> tuple[HostDispatch, Any, dict[str, Any]]:
    """The host dispatch model of a training run: the profile prior, and where the data has enough
    ``host_ms`` rows a booster on top, validated by grouped K-fold (op signatures) against the
    prior. Returns the model, the fitted Routed (None for the prior) and the report entry.

    ``p`` is a gpurec.model.fitting.data.Prepared, ``cfg`` a TrainConfig."""
    from gpurec.model.fitting.evaluate import grouped_folds, summary
    from gpurec.model.regressors import Routed, XGBModel

    rows = p.host_rows
    prior = HostDispatch(p.reference)
    report: dict[str, Any] = {"reference_host": p.reference.name, "reference_source": p.reference_source,
                              "rows": int(len(rows)), "prior": "each operation costs the reference host's "
                              "host-bench call of its kind group (gpurec.host.GROUP_CALL)"}
    if len(rows) == 0:
        report["model"] = "profile_prior"
        report["note"] = "no host_ms rows in the data: host dispatch is the profile prior, unvalidated"
        return prior, None, report
    measured = np.exp(p.host_y)
    margin = np.log(prior.prior_ms(p.groups[rows], p.modes[rows]))
    report["prior_error"] = summary(np.exp(margin), measured)
    if len(rows) < cfg.host_min_rows:
        report["model"] = "profile_prior"
        report["note"] = f"only {len(rows)} host_ms rows (< {cfg.host_min_rows}): the prior is kept"
        return prior, None, report
    X = p.X["host"][rows]
    modes = p.modes[rows]

    def factory() -> XGBModel:
        return XGBModel({"max_depth": 5, "learning_rate": 0.08}, cfg.host_rounds, cfg.seed, cfg.nthread)

    sigs = p.ops["op_signature"].to_numpy().astype(str)[rows]
    oof = np.full(len(rows), np.nan)
    for tr, te in grouped_folds(sigs, cfg.n_folds, cfg.seed):
        r = Routed(factory, cfg.min_rows_per_mode).fit(X[tr], p.host_y[tr], margin[tr], modes[tr])
        oof[te] = np.exp(r.predict(X[te], margin[te], modes[te]))
    report["grouped_kfold"] = summary(oof, measured)
    routed = Routed(factory, cfg.min_rows_per_mode).fit(X, p.host_y, margin, modes)
    report["model"] = "learnt"
    log(f"host dispatch: {len(rows)} rows, grouped-CV MAPE {report['grouped_kfold']['mape']:.1f}% "
        f"(profile prior alone {report['prior_error']['mape']:.1f}%)")
    return HostDispatch(p.reference, routed.by_mode()), routed, report
