"""Per-operation GPU time/power and host dispatch models, the step timeline, training, persistence.

Heavy modules (numpy, xgboost, sklearn, optuna, torch) load on first use, so
``import gpurec.model`` stays fast.

Layout, prediction: features (feature rows), host_model (dispatch per operation), timeline
(the two-queue step), network (whole-network correction, waiting power), crossgpu, predictor
(``load_predictor``, ``Estimate``), bench (prediction speed), persist (save/load).  Training,
in ``gpurec.model.fitting`` (never imported by prediction): data (targets, training data),
tuning, validation, manifest, training (``train``, called by ``gpurec train``), evaluate
(metrics and the network accuracy tables).

Hosts: every estimate is for a host profile (gpurec.host). ``host=None`` is the *reference
host* saved with the models: the per-field median of the ``host_bench`` profiles of the
collection runs the models were trained on (``Predictor.reference_host``). Until the data
carries ``host_bench``, the reference is the training machine's CPU-side profile, and its
name says so.
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
    """Train, validate and save the predictors; see gpurec.model.fitting.training.train."""
    from gpurec.model.fitting.training import train as _train

    return _train(data_root, out_dir, tune_trials=tune_trials, seed=seed, **kwargs)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpurec.model' has no attribute {name!r}")
