"""Hyper-parameter tuning of the boosters, and how many threads they get."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gpurec.model.fitting.evaluate import grouped_folds
from gpurec.model.regressors import DEFAULT_XGB_PARAMS, XGBModel


def auto_nthread() -> int:
    """XGBoost threads: the cores not already busy. OpenMP threads that share a loaded core spin
    against other processes; on a 2-core machine with other jobs, 2 threads made tuning >10x
    slower than 1."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(1, min(cores, int(cores - load + 0.5)))


def tune_xgboost(X: np.ndarray, y: np.ndarray, margin: np.ndarray, groups: np.ndarray, cfg: Any,
                 log: Callable[[str], None], monotone: tuple[int, ...] | None = None
                 ) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """Optuna over XGBoost hyper-parameters; objective = grouped-CV RMSE of the log target.

    Groups are op signatures, so the tuned settings are those that generalise to unseen
    operations. Early stopping picks the number of rounds. Tuning sees all training rows, so
    the validation numbers are slightly optimistic about hyper-parameters (not data).
    ``cfg`` is a TrainConfig (tune_trials, tune_folds, seed, nthread, max_rounds, ...).
    """
    import xgboost as xgb

    folds = grouped_folds(groups, cfg.tune_folds, cfg.seed)
    d = xgb.DMatrix(X, label=y, base_margin=margin)
    base = {**XGBModel(seed=cfg.seed, nthread=cfg.nthread, monotone=monotone).train_params(), "eval_metric": "rmse"}

    def run(params: dict[str, Any]) -> tuple[float, int]:
        res = xgb.cv({**base, **params}, d, num_boost_round=cfg.max_rounds, folds=folds,
                     early_stopping_rounds=cfg.early_stopping_rounds, verbose_eval=False, seed=cfg.seed)
        return float(res["test-rmse-mean"].iloc[-1]), int(len(res))

    if cfg.tune_trials <= 0 or len(set(groups.tolist())) < 3:
        return {}, cfg.default_rounds, {"trials": 0}
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def objective(trial: Any) -> float:
        params = {
            "max_depth": trial.suggest_int("max_depth", 3, 10),
            "learning_rate": trial.suggest_float("learning_rate", 0.03, 0.3, log=True),
            "min_child_weight": trial.suggest_float("min_child_weight", 0.5, 20.0, log=True),
            "subsample": trial.suggest_float("subsample", 0.6, 1.0),
            "colsample_bytree": trial.suggest_float("colsample_bytree", 0.4, 1.0),
            "reg_lambda": trial.suggest_float("reg_lambda", 1e-3, 10.0, log=True),
            "reg_alpha": trial.suggest_float("reg_alpha", 1e-4, 1.0, log=True),
        }
        score, rounds = run(params)
        trial.set_user_attr("rounds", rounds)
        return score

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=cfg.seed))
    study.enqueue_trial({k: DEFAULT_XGB_PARAMS[k] for k in ("max_depth", "learning_rate", "min_child_weight",
                                                             "subsample", "colsample_bytree", "reg_lambda")}
                        | {"reg_alpha": 1e-4})
    t0 = time.perf_counter()
    study.optimize(objective, n_trials=cfg.tune_trials)
    best = study.best_trial
    rounds = max(20, int(best.user_attrs.get("rounds", cfg.default_rounds)))
    info = {"trials": len(study.trials), "best_cv_rmse_log": float(best.value),
            "default_cv_rmse_log": float(study.trials[0].value), "seconds": time.perf_counter() - t0,
            "best_params": dict(best.params), "rounds": rounds}
    log(f"  tuned in {info['seconds']:.0f} s: rmse(log) {info['default_cv_rmse_log']:.3f} (defaults) -> "
        f"{info['best_cv_rmse_log']:.3f}, {rounds} rounds")
    return dict(best.params), rounds, info
