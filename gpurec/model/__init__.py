"""Per-operation time/power models, whole-network estimates, training and persistence.

Heavy modules (numpy, xgboost, sklearn, optuna, torch) load on first use, so
``import gpurec.model`` stays fast.

Training lives in gpurec/model/training.py (``python3 -m gpurec.model.training``);
``gpurec.model.train`` is its entry function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpurec.model.persist import IncompatibleModel, ModelWarning
    from gpurec.model.predictor import Estimate, GPUEntry, Predictor, load_predictor

__all__ = ["Estimate", "GPUEntry", "IncompatibleModel", "ModelWarning", "Predictor", "load_predictor", "train"]

_WHERE = {
    "Estimate": "gpurec.model.predictor",
    "GPUEntry": "gpurec.model.predictor",
    "Predictor": "gpurec.model.predictor",
    "load_predictor": "gpurec.model.predictor",
    "IncompatibleModel": "gpurec.model.persist",
    "ModelWarning": "gpurec.model.persist",
}


def train(data_root: Any = None, out_dir: Any = "models", tune_trials: int = 20, seed: int = 0,
          **kwargs: Any) -> dict[str, Any]:
    """Train, validate and save the predictors; see gpurec.model.training.train."""
    from gpurec.model.training import train as _train

    return _train(data_root, out_dir, tune_trials=tune_trials, seed=seed, **kwargs)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpurec.model' has no attribute {name!r}")
