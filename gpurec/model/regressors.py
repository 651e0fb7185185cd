"""Regressors on log targets with a per-row margin (log-roofline time, log-TDP power).

All three learn the *residual* y - margin, so they are compared on equal terms:

* XGBoost (primary): gradient-boosted trees; boosters are saved as XGBoost JSON/UBJ, never pickled.
* RandomForest: a second tree ensemble, reported beside it.
* Roofline-linear baseline: ridge on log features, i.e. time = roofline x exp(linear(log features)).

:class:`Routed` trains one model per mode (inference / training differ in kernels, not just in
scale) and falls back to a pooled model, with ``mode_training`` as a feature, for a mode with too
few rows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.model._sets import MODES

DEFAULT_XGB_PARAMS: dict[str, Any] = {
    "objective": "reg:squarederror",
    "tree_method": "hist",
    "max_depth": 7,
    "learning_rate": 0.08,
    "min_child_weight": 2.0,
    "subsample": 0.85,
    "colsample_bytree": 0.8,
    "reg_lambda": 1.0,
    "reg_alpha": 0.0,
}


class _Params:
    """scikit-learn's estimator contract (``get_params``, ``set_params``, so ``sklearn.base.clone``
    works): the constructor arguments, stored unchanged under their own names; fitted state ends
    in ``_`` and is never a parameter."""

    _param_names: tuple[str, ...] = ()

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._param_names}

    def set_params(self, **params: Any) -> _Params:
        """Set constructor parameters by name (unknown names raise ValueError); returns self."""
        unknown = sorted(set(params) - set(self._param_names))
        if unknown:
            raise ValueError(f"{type(self).__name__} has no parameter {', '.join(map(repr, unknown))}; "
                             f"its parameters: {', '.join(self._param_names) or 'none'}")
        for k, v in params.items():
            setattr(self, k, v)
        return self


class XGBModel(_Params):
    """XGBoost booster on y with base_margin = margin (fitted: ``booster_``).

    ``monotone`` is one constraint per feature (+1, -1, 0), see gpurec.model.features."""

    kind = "xgboost"
    _param_names = ("params", "num_rounds", "seed", "nthread", "monotone")

    def __init__(self, params: dict[str, Any] | None = None, num_rounds: int = 400, seed: int = 0,
                 nthread: int | None = None, monotone: tuple[int, ...] | None = None) -> None:
        self.params = params if params is not None else {}  # stored as given, as clone() expects
        self.num_rounds = int(num_rounds)
        self.seed = seed
        self.nthread = nthread
        self.monotone = monotone
        self.booster_: Any = None

    @property
    def booster(self) -> Any:  # the name persist.py reads
        return self.booster_

    def train_params(self) -> dict[str, Any]:
        """The parameters handed to ``xgboost.train``."""
        out = {**DEFAULT_XGB_PARAMS, **self.params, "seed": self.seed}
        if self.nthread:
            out["nthread"] = self.nthread
        if self.monotone is not None and any(self.monotone):
            out["monotone_constraints"] = "(" + ",".join(str(int(c)) for c in self.monotone) + ")"
        return out

    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray,
            feature_names: list[str] | None = None) -> XGBModel:
        import xgboost as xgb

        d = xgb.DMatrix(X, label=y, base_margin=margin, feature_names=_safe_names(feature_names, X.shape[1]))
        self.booster_ = xgb.train(self.train_params(), d, num_boost_round=self.num_rounds)
        return self

    def predict(self, X: np.ndarray, margin: np.ndarray) -> np.ndarray:
        if len(X) == 0:
            return np.zeros(0)
        out = self.booster_.inplace_predict(X, base_margin=np.asarray(margin, dtype=np.float32),
                                            validate_features=False)
        return np.asarray(out, dtype=np.float64)

    def save(self, path: Path) -> None:
        self.booster_.save_model(str(path))

    @classmethod
    def load(cls, path: Path, nthread: int | None = None) -> XGBModel:
        """A fitted model from a saved booster."""
        import xgboost as xgb

        b = xgb.Booster()
        b.load_model(str(path))
        if nthread:
            b.set_param({"nthread": nthread})
        m = cls(nthread=nthread, num_rounds=b.num_boosted_rounds())
        m.booster_ = b
        return m


def _safe_names(names: list[str] | None, n: int) -> list[str] | None:
    """XGBoost refuses names with [ ] < ; keep ours printable and unique."""
    if names is None or len(names) != n:
        return None
    out = [s.replace("[", "(").replace("]", ")").replace("<", "lt") for s in names]
    return out if len(set(out)) == len(out) else None


class ForestModel(_Params):
    """sklearn RandomForest on the residual (NaN -> 0)."""

    kind = "random_forest"
    _param_names = ("n_estimators", "seed", "n_jobs")

    def __init__(self, n_estimators: int = 200, seed: int = 0, n_jobs: int = -1) -> None:
        self.n_estimators = n_estimators
        self.seed = seed
        self.n_jobs = n_jobs
        self.model_: Any = None

    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray, **_: Any) -> ForestModel:
        from sklearn.ensemble import RandomForestRegressor

        self.model_ = RandomForestRegressor(n_estimators=self.n_estimators, min_samples_leaf=2, max_features=0.5,
                                            n_jobs=self.n_jobs, random_state=self.seed)
        self.model_.fit(np.nan_to_num(X), y - margin)
        return self

    def predict(self, X: np.ndarray, margin: np.ndarray) -> np.ndarray:
        if len(X) == 0:
            return np.zeros(0)
        return self.model_.predict(np.nan_to_num(X)) + margin


class RooflineLinearModel(_Params):
    """Baseline: time = roofline x exp(ridge(log1p features)), power = TDP x exp(ridge(...))."""

    kind = "roofline_linear"

    def __init__(self) -> None:
        self.model_: Any = None
        self.bounds_: tuple[float, float] = (-np.inf, np.inf)
        self.mean_: np.ndarray | None = None
        self.scale_: np.ndarray | None = None

    @staticmethod
    def _transform(X: np.ndarray) -> np.ndarray:
        X = np.nan_to_num(np.asarray(X, dtype=np.float64))
        return np.sign(X) * np.log1p(np.abs(X))

    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray, **_: Any) -> RooflineLinearModel:
        from sklearn.linear_model import RidgeCV

        Z = self._transform(X)
        self.mean_ = Z.mean(axis=0)
        self.scale_ = np.where(Z.std(axis=0) > 1e-9, Z.std(axis=0), 1.0)
        r = y - margin
        self.bounds_ = (float(r.min()), float(r.max()))
        self.model_ = RidgeCV(alphas=(0.1, 1.0, 10.0, 100.0)).fit((Z - self.mean_) / self.scale_, r)
        return self

    def predict(self, X: np.ndarray, margin: np.ndarray) -> np.ndarray:
        if len(X) == 0:
            return np.zeros(0)
        Z = (self._transform(X) - self.mean_) / self.scale_
        # A linear model extrapolates without limit; keep it within the residuals it was fitted on.
        return np.clip(self.model_.predict(Z), *self.bounds_) + margin


class Routed(_Params):
    """One regressor per mode, or a pooled one for a mode with fewer than ``min_rows`` rows."""

    _param_names = ("factory", "min_rows")

    def __init__(self, factory: Callable[[], Any], min_rows: int = 30) -> None:
        self.factory = factory
        self.min_rows = min_rows
        self.models_: dict[str, Any] = {}  # mode or "all" -> regressor
        self.route_: dict[str, str] = {}  # mode -> key in models_
        # a model replacing some rows' predictions (gpurec.model.recurrent.RecurrentTime for the
        # time target): its apply(log_pred, X, modes) is called after the regressors
        self.override: Any = None

    @property
    def models(self) -> dict[str, Any]:  # the names persist.py reads
        return self.models_

    @property
    def route(self) -> dict[str, str]:
        return self.route_

    def by_mode(self) -> dict[str, Any]:
        """mode -> its fitted regressor."""
        return {m: self.models_[k] for m, k in self.route_.items()}

    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray, modes: np.ndarray,
            feature_names: list[str] | None = None) -> Routed:
        modes = np.asarray(modes)
        pooled_needed = False
        for m in MODES:
            sel = modes == m
            if sel.sum() >= self.min_rows:
                self.models_[m] = self.factory().fit(X[sel], y[sel], margin[sel], feature_names=feature_names)
                self.route_[m] = m
            else:
                pooled_needed = True
                self.route_[m] = "all"
        if pooled_needed:
            self.models_["all"] = self.factory().fit(X, y, margin, feature_names=feature_names)
        return self

    def predict(self, X: np.ndarray, margin: np.ndarray, modes: np.ndarray) -> np.ndarray:
        out = np.empty(len(X), dtype=np.float64)
        modes = np.asarray(modes)
        for m in MODES:
            sel = modes == m
            if sel.any():
                out[sel] = self.models_[self.route_[m]].predict(X[sel], margin[sel])
        return out if self.override is None else self.override.apply(out, X, modes)
