"""Regressors on log targets with a per-row margin (log-roofline time, log-TDP power).

All three learn the *residual* y - margin, so they are compared on equal terms:

* XGBoost (primary): gradient-boosted trees; boosters are saved as XGBoost JSON/UBJ, never pickled.
* RandomForest: a second tree ensemble, reported beside it.
* Roofline-linear baseline: ridge on log features, i.e. time = roofline x exp(linear(log features)).

:class:`Routed` trains one model per mode (inference / training differ in kernels, not just in
scale) and falls back to a pooled model, with ``mode_training`` as a feature, for a mode with too
few rows.  With kind groups (:class:`KindGroups`; the time target's are
gpurec.model.config.TIME_KIND_GROUPS) it trains one per mode and group, rows routed by their kind
one-hot columns, and a group with too few rows is served by its mode's model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
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


REST_GROUP = "rest"  # the group of every row whose kind no named group lists
_GROUP_NAME = re.compile(r"[a-z0-9_]+")


class KindGroups:
    """Named groups of operation kinds over one feature layout: each row's group is read from its
    ``kind=K`` one-hot columns (a kind in no group, or without a column of its own, is in
    :data:`REST_GROUP`).  ``groups`` maps a group name to its kinds; the constructor raises
    ValueError on a malformed definition (a name that is no file-name word or is ``rest``, a group
    without kinds, a kind in two groups, a kind without a ``kind=K`` column)."""

    def __init__(self, groups: Mapping[str, Sequence[str]], feature_names: Sequence[str]) -> None:
        if not isinstance(groups, Mapping) or not groups:
            raise ValueError(f"kind groups must be a non-empty mapping of group name to kinds, not {groups!r}")
        cols = {f: i for i, f in enumerate(feature_names)}
        seen: dict[str, str] = {}
        self.groups: dict[str, tuple[str, ...]] = {}
        self._cols: list[np.ndarray] = []
        for name, kinds in groups.items():
            if not isinstance(name, str) or not _GROUP_NAME.fullmatch(name) or name == REST_GROUP:
                raise ValueError(f"kind group name {name!r}: lower-case letters, digits and '_' only, "
                                 f"and not {REST_GROUP!r} (the group of every other kind)")
            if isinstance(kinds, str) or not isinstance(kinds, Sequence) or not kinds \
                    or not all(isinstance(k, str) for k in kinds):
                raise ValueError(f"kind group {name!r}: a non-empty list of kind names, not {kinds!r}")
            for k in kinds:
                if k in seen:
                    raise ValueError(f"kind {k!r} is in two kind groups ({seen[k]!r} and {name!r})")
                if f"kind={k}" not in cols:
                    raise ValueError(f"kind group {name!r} names kind {k!r}, which has no 'kind={k}' feature column")
                seen[k] = name
            self.groups[name] = tuple(kinds)
            self._cols.append(np.array([cols[f"kind={k}"] for k in kinds], dtype=np.int64))
        self.names: tuple[str, ...] = (*self.groups, REST_GROUP)

    @classmethod
    def fitted(cls, groups: Mapping[str, Sequence[str]], feature_names: Sequence[str]) -> KindGroups | None:
        """The groups for a training run: each group keeps only the kinds with a column (a kind
        without one has no training rows, and its operations are ``kind=__other__``, so rest);
        a group left without kinds is dropped; None when none is left (one model per mode)."""
        names = set(feature_names)
        kept = {g: tuple(k for k in kinds if f"kind={k}" in names) for g, kinds in groups.items()}
        kept = {g: kinds for g, kinds in kept.items() if kinds}
        return cls(kept, feature_names) if kept else None

    def index(self, X: np.ndarray) -> np.ndarray:
        """Per row, the position of its group in :attr:`names` (rest last)."""
        out = np.full(len(X), len(self.groups), dtype=np.int64)
        for i, cols in enumerate(self._cols):
            out[(X[:, cols] == 1).any(axis=1)] = i
        return out

    def as_dict(self) -> dict[str, list[str]]:
        return {g: list(kinds) for g, kinds in self.groups.items()}


class KindRouter:
    """One mode's regressors by kind group: ``predict(X, margin)`` sends each row to the regressor
    of its group (``models``: group name -> regressor, every name of ``groups``), one call per
    distinct regressor (a group falling back to its mode's regressor shares it)."""

    def __init__(self, groups: KindGroups, models: Mapping[str, Any]) -> None:
        missing = [g for g in groups.names if g not in models]
        if missing:
            raise ValueError(f"no regressor for kind group(s) {', '.join(missing)}")
        self.groups = groups
        self.models = dict(models)

    def predict(self, X: np.ndarray, margin: Any) -> np.ndarray:
        n = len(X)
        margin = np.broadcast_to(np.asarray(margin, dtype=np.float64), (n,))
        return _predict_groups([self.models[g] for g in self.groups.names], self.groups.index(X), X, margin,
                               np.ones(n, dtype=bool), np.empty(n, dtype=np.float64))


def _predict_groups(models: list[Any], g: np.ndarray, X: np.ndarray, margin: np.ndarray, sel: np.ndarray,
                    out: np.ndarray) -> np.ndarray:
    """``out[sel]`` from each selected row's group's model (``models`` in the order of the groups'
    names, ``g`` each row's group: KindGroups.index); the rows of groups sharing a model go
    through it in one call."""
    by_model: dict[int, list[int]] = {}
    for i, m in enumerate(models):
        by_model.setdefault(id(m), []).append(i)
    for idx in by_model.values():
        rows = sel & ((g == idx[0]) if len(idx) == 1 else np.isin(g, idx))
        if rows.any():
            out[rows] = models[idx[0]].predict(X[rows], margin[rows])
    return out


class Routed(_Params):
    """One regressor per mode, or a pooled one for a mode with fewer than ``min_rows`` rows.

    With ``kind_groups`` (group name -> kinds; needs ``feature_names`` in :meth:`fit`) one
    regressor per mode and group (:class:`KindGroups`, rest included): ``route_[mode]`` is then
    {group: key in models_}, and a group with fewer than ``min_rows`` rows of the mode is served
    by the mode's regressor on all its rows (key = the mode), so no row goes unfitted."""

    _param_names = ("factory", "min_rows", "kind_groups")

    def __init__(self, factory: Callable[[], Any], min_rows: int = 30,
                 kind_groups: Mapping[str, Sequence[str]] | None = None) -> None:
        self.factory = factory
        self.min_rows = min_rows
        self.kind_groups = kind_groups
        self.models_: dict[str, Any] = {}  # mode, "{mode}_{group}" or "all" -> regressor
        self.route_: dict[str, Any] = {}  # mode -> key in models_, or {group: key} with kind groups
        self.groups_: KindGroups | None = None  # the kind groups fitted (None: one regressor per mode)
        # a model replacing some rows' predictions (gpurec.model.recurrent.RecurrentTime for the
        # time target): its apply(log_pred, X, modes) is called after the regressors
        self.override: Any = None

    @property
    def models(self) -> dict[str, Any]:  # the names persist.py reads
        return self.models_

    @property
    def route(self) -> dict[str, Any]:
        return self.route_

    def by_mode(self) -> dict[str, Any]:
        """mode -> its fitted regressor (a KindRouter with kind groups)."""
        if self.groups_ is None:
            return {m: self.models_[k] for m, k in self.route_.items()}
        return {m: KindRouter(self.groups_, {g: self.models_[k] for g, k in r.items()}) for m, r in self.route_.items()}

    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray, modes: np.ndarray,
            feature_names: list[str] | None = None) -> Routed:
        modes = np.asarray(modes)
        self.models_, self.route_ = {}, {}
        self.groups_ = None
        if self.kind_groups:
            if feature_names is None:
                raise ValueError("kind groups route rows by their kind=... columns: fit needs feature_names")
            self.groups_ = KindGroups.fitted(self.kind_groups, feature_names)
        g = self.groups_.index(X) if self.groups_ is not None else None
        pooled_needed = False
        for m in MODES:
            sel = modes == m
            if sel.sum() < self.min_rows:
                pooled_needed = True
                self.route_[m] = "all" if g is None else {name: "all" for name in self.groups_.names}
                continue
            if g is None:
                self.models_[m] = self.factory().fit(X[sel], y[sel], margin[sel], feature_names=feature_names)
                self.route_[m] = m
                continue
            route: dict[str, str] = {}
            for i, name in enumerate(self.groups_.names):
                rows = sel & (g == i)
                if rows.sum() >= self.min_rows:
                    key = f"{m}_{name}"
                    self.models_[key] = self.factory().fit(X[rows], y[rows], margin[rows], feature_names=feature_names)
                else:  # too few of this group: the mode's regressor, on all the mode's rows
                    key = m
                    if key not in self.models_:
                        self.models_[key] = self.factory().fit(X[sel], y[sel], margin[sel],
                                                               feature_names=feature_names)
                route[name] = key
            self.route_[m] = route
        if pooled_needed:
            self.models_["all"] = self.factory().fit(X, y, margin, feature_names=feature_names)
        return self

    def predict(self, X: np.ndarray, margin: np.ndarray, modes: np.ndarray) -> np.ndarray:
        out = np.empty(len(X), dtype=np.float64)
        modes = np.asarray(modes)
        margin = np.asarray(margin)
        g = self.groups_.index(X) if self.groups_ is not None else None
        for m in MODES:
            sel = modes == m
            if not sel.any():
                continue
            r = self.route_[m]
            if isinstance(r, str):
                out[sel] = self.models_[r].predict(X[sel], margin[sel])
            else:
                _predict_groups([self.models_[r[name]] for name in self.groups_.names], g, X, margin, sel, out)
        return out if self.override is None else self.override.apply(out, X, modes)
