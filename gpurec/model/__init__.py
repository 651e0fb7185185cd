"""Per-operation time/power models, whole-network estimates, training and persistence.

Heavy modules (numpy, xgboost, sklearn, optuna, torch) load on first use, so
``import gpurec.model`` stays fast.

``gpurec.model.train`` is the training *function* (the module of the same name is
gpurec/model/train.py; reach it with ``from gpurec.model.train import ...`` or
``python3 -m gpurec.model.train``).
"""

from __future__ import annotations

import sys
import types
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
    """Train, validate and save the predictors; see gpurec.model.train.train."""
    from gpurec.model.train import train as _train

    return _train(data_root, out_dir, tune_trials=tune_trials, seed=seed, **kwargs)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpurec.model' has no attribute {name!r}")


class _Package(types.ModuleType):
    """Keeps ``gpurec.model.train`` the function when the submodule train.py gets imported
    (the import system would otherwise overwrite the attribute with the module)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "train" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
