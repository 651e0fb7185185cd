"""Host dispatch time per operation: what the CPU spends to issue it (Python, ATen, autograd, launch).

Expressed on the *reference host* and rescaled to any other host by the ratio of their
``gpurec host-bench`` dispatch figures (``HostProfile.dispatch_scale``): a host that issues the
benchmark's fixed calls 1.5x slower issues a network's operations about 1.5x slower too.

The starting point (the booster's margin, and the whole model when the data has no
``host_ms`` yet) is the *profile prior*: each operation costs what the benchmark call of its
kind group costs on the reference host (``gpurec.host.GROUP_CALL``: a convolution costs a
Conv2d call, a matmul a Linear call, an elementwise op an ``add``; forward, or forward and
backward in training). With ``host_ms`` rows, a booster learns the correction by kind, mode
and operation features (the GPU's features are hidden from it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpurec.host import GROUP_CALL, HostProfile, call_cost_us
from gpurec.model._sets import MODES
from gpurec.model.features import KIND_GROUPS


def prior_table_ms(reference: HostProfile) -> dict[str, np.ndarray]:
    """mode -> per kind group (KIND_GROUPS order) dispatch ms of the benchmark call on ``reference``."""
    return {mode: np.array([call_cost_us(reference, GROUP_CALL.get(g, "add"), mode) / 1000.0 for g in KIND_GROUPS])
            for mode in MODES}


class HostDispatch:
    """Per-operation host dispatch on the reference host: prior, or prior x learnt correction."""

    def __init__(self, reference: HostProfile, models: Any = None) -> None:
        self.reference = reference
        self.models = models  # mode -> regressor on log ms with the log prior as margin, or None (prior only)
        self._prior = prior_table_ms(reference)

    @property
    def kind(self) -> str:
        return "learnt" if self.models is not None else "profile_prior"

    def prior_ms(self, groups: np.ndarray, mode: str | np.ndarray) -> np.ndarray:
        groups = np.asarray(groups, dtype=np.int64)
        if isinstance(mode, str):
            return self._prior[mode][groups]
        modes = np.asarray(mode)
        out = np.empty(len(groups))
        for m in MODES:
            sel = modes == m
            out[sel] = self._prior[m][groups[sel]]
        return out

    def reference_ms(self, X: np.ndarray, groups: np.ndarray, mode: str) -> np.ndarray:
        """Dispatch ms on the reference host (X already masked for the host target)."""
        prior = self.prior_ms(groups, mode)
        if self.models is None or len(X) == 0:
            return prior
        return np.exp(self.models[mode].predict(X, np.log(prior)))

    def predict_ms(self, X: np.ndarray, groups: np.ndarray, mode: str, scale: float) -> np.ndarray:
        """Dispatch ms on a host ``scale`` x slower than the reference."""
        return self.reference_ms(X, groups, mode) * float(scale)


def fit_host_model(p: Any, cfg: Any, log: Any) -> tuple[HostDispatch, Any, dict[str, Any]]:
    """The host dispatch model of a training run: the profile prior, and where the data has enough
    ``host_ms`` rows a booster on top, validated by grouped K-fold (op signatures) against the
    prior. Returns the model, the fitted Routed (None for the prior) and the report entry.

    ``p`` is a gpurec.model.data.Prepared, ``cfg`` a TrainConfig."""
    from gpurec.model.evaluate import grouped_folds, summary
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
