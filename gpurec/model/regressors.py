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
from typing import Any, Protocol

import numpy as np

from gpurec.sets import MODES


class Regressor(Protocol):
    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray) -> Regressor: ...

    def predict(self, X: np.ndarray, margin: np.ndarray) -> np.ndarray: ...


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


class XGBModel:
    """XGBoost booster on y with base_margin = margin."""

    kind = "xgboost"

    def __init__(self, params: dict[str, Any] | None = None, num_rounds: int = 400, seed: int = 0,
                 nthread: int | None = None, booster: Any = None) -> None:
        self.params = {**DEFAULT_XGB_PARAMS, **(params or {}), "seed": seed}
        if nthread:
            self.params["nthread"] = nthread
        self.num_rounds = int(num_rounds)
        self.booster = booster

    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray,
            feature_names: list[str] | None = None) -> XGBModel:
        import xgboost as xgb

        d = xgb.DMatrix(X, label=y, base_margin=margin, feature_names=_safe_names(feature_names, X.shape[1]))
        self.booster = xgb.train(self.params, d, num_boost_round=self.num_rounds)
        return self

    def predict(self, X: np.ndarray, margin: np.ndarray) -> np.ndarray:
        if len(X) == 0:
            return np.zeros(0)
        out = self.booster.inplace_predict(X, base_margin=np.asarray(margin, dtype=np.float32),
                                           validate_features=False)
        return np.asarray(out, dtype=np.float64)

    def save(self, path: Path) -> None:
        self.booster.save_model(str(path))

    @staticmethod
    def load(path: Path, nthread: int | None = None) -> XGBModel:
        import xgboost as xgb

        b = xgb.Booster()
        b.load_model(str(path))
        if nthread:
            b.set_param({"nthread": nthread})
        return XGBModel(booster=b)


def _safe_names(names: list[str] | None, n: int) -> list[str] | None:
    """XGBoost refuses names with [ ] < ; keep ours printable and unique."""
    if names is None or len(names) != n:
        return None
    out = [s.replace("[", "(").replace("]", ")").replace("<", "lt") for s in names]
    return out if len(set(out)) == len(out) else None


class ForestModel:
    """sklearn RandomForest on the residual (NaN -> 0)."""

    kind = "random_forest"

    def __init__(self, n_estimators: int = 200, seed: int = 0, n_jobs: int = -1) -> None:
        self.n_estimators = n_estimators
        self.seed = seed
        self.n_jobs = n_jobs
        self.model: Any = None

    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray, **_: Any) -> ForestModel:
        from sklearn.ensemble import RandomForestRegressor

        self.model = RandomForestRegressor(n_estimators=self.n_estimators, min_samples_leaf=2, max_features=0.5,
                                           n_jobs=self.n_jobs, random_state=self.seed)
        self.model.fit(np.nan_to_num(X), y - margin)
        return self

    def predict(self, X: np.ndarray, margin: np.ndarray) -> np.ndarray:
        if len(X) == 0:
            return np.zeros(0)
        return self.model.predict(np.nan_to_num(X)) + margin


class RooflineLinearModel:
    """Baseline: time = roofline x exp(ridge(log1p features)), power = TDP x exp(ridge(...))."""

    kind = "roofline_linear"

    def __init__(self) -> None:
        self.model: Any = None
        self.bounds: tuple[float, float] = (-np.inf, np.inf)
        self.mean: np.ndarray | None = None
        self.scale: np.ndarray | None = None

    @staticmethod
    def _transform(X: np.ndarray) -> np.ndarray:
        X = np.nan_to_num(np.asarray(X, dtype=np.float64))
        return np.sign(X) * np.log1p(np.abs(X))

    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray, **_: Any) -> RooflineLinearModel:
        from sklearn.linear_model import RidgeCV

        Z = self._transform(X)
        self.mean = Z.mean(axis=0)
        self.scale = np.where(Z.std(axis=0) > 1e-9, Z.std(axis=0), 1.0)
        r = y - margin
        self.bounds = (float(r.min()), float(r.max()))
        self.model = RidgeCV(alphas=(0.1, 1.0, 10.0, 100.0)).fit((Z - self.mean) / self.scale, r)
        return self

    def predict(self, X: np.ndarray, margin: np.ndarray) -> np.ndarray:
        if len(X) == 0:
            return np.zeros(0)
        Z = (self._transform(X) - self.mean) / self.scale
        # A linear model extrapolates without limit; keep it within the residuals it was fitted on.
        return np.clip(self.model.predict(Z), *self.bounds) + margin


class Routed:
    """One regressor per mode, or a pooled one for a mode with fewer than ``min_rows`` rows."""

    def __init__(self, factory: Callable[[], Any], min_rows: int = 30) -> None:
        self.factory = factory
        self.min_rows = min_rows
        self.models: dict[str, Any] = {}  # mode or "all" -> regressor
        self.route: dict[str, str] = {}  # mode -> key in models

    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray, modes: np.ndarray,
            feature_names: list[str] | None = None) -> Routed:
        modes = np.asarray(modes)
        pooled_needed = False
        for m in MODES:
            sel = modes == m
            if sel.sum() >= self.min_rows:
                self.models[m] = self.factory().fit(X[sel], y[sel], margin[sel], feature_names=feature_names)
                self.route[m] = m
            else:
                pooled_needed = True
                self.route[m] = "all"
        if pooled_needed:
            self.models["all"] = self.factory().fit(X, y, margin, feature_names=feature_names)
        return self

    def predict(self, X: np.ndarray, margin: np.ndarray, modes: np.ndarray) -> np.ndarray:
        out = np.empty(len(X), dtype=np.float64)
        modes = np.asarray(modes)
        for m in MODES:
            sel = modes == m
            if sel.any():
                out[sel] = self.models[self.route[m]].predict(X[sel], margin[sel])
        return out

    def predict_mode(self, X: np.ndarray, margin: np.ndarray, mode: str) -> np.ndarray:
        """All rows in one mode: one booster call."""
        return self.models[self.route[mode]].predict(X, margin)
