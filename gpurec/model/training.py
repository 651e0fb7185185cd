"""Train the per-operation predictors, validate them without leakage, and persist them.

Targets are log(time_ms) and log(power_w), one booster per mode (inference and training run
different kernels). Why logs: operation times span five orders of magnitude and what matters
is relative error, which squared error on the log measures; power is bounded between idle and
TDP, and log makes its error relative too. Energy is not a separate target: energy = power x
time, so log energy = log power + log time and its error is the combination of the two, with
no chance of the three predictions disagreeing.

Validation (all three, none leaks an operation or network into its own test fold):

* grouped K-fold by op_signature: per-operation error;
* leave-one-family-out (family = arch name prefix, resnet50 -> resnet): every operation that
  occurs in any model of the held-out family leaves training; error per operation and per
  whole network (sum of operations vs the measured network);
* leave-one-GPU-out when two or more GPUs have data.

Unseen test architectures (gpurec.sets.TEST_ARCHS) are never trained on; they are
scored at the end with the final model.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from gpurec.dataset.store import json_safe
from gpurec.model.evaluate import arch_of, breakdown, family, grouped_folds, row_families
from gpurec.model.features import (
    FEATURE_SCHEMA_VERSION,
    FeatureBuilder,
    FeatureConfig,
    MeasuredLookup,
    SetExtractor,
    hardware_matrix,
    network_blocks,
    operations_of_rows,
    resolve_extra_columns,
)
from gpurec.model.network import (
    POWER_VARIANTS,
    TIME_VARIANTS,
    Correction,
    NetworkSums,
    aggregate,
    correction_cv,
    fit_correction,
)
from gpurec.model.regressors import ForestModel, RooflineLinearModel, Routed, XGBModel
from gpurec.sets import MODES

TARGETS: dict[str, dict[str, str]] = {
    "time": {"column": "time_ms", "transform": "log", "unit": "ms", "name": "log_time_ms"},
    "power": {"column": "power_w", "transform": "log", "unit": "W", "name": "log_power_w"},
}


@dataclass
class TrainConfig:
    """Knobs of a training run (all saved in the manifest)."""

    tune_trials: int = 20
    seed: int = 0
    n_folds: int = 5
    tune_folds: int = 3
    max_rounds: int = 600
    early_stopping_rounds: int = 30
    default_rounds: int = 400  # used when tune_trials == 0
    min_rows_per_mode: int = 30
    forest_trees: int = 150
    baselines: bool = True  # RandomForest and roofline-linear beside XGBoost
    small_op_ms: float = 0.02
    correction_ridge: float = 0.1
    min_networks_gpu: int = 8
    band_quantiles: tuple[float, float] = (0.05, 0.95)
    nthread: int | None = None  # None: auto_nthread() (idle cores) at the start of a run
    cache_dir: str | None = None
    use_measured: bool = True  # measured operations replace predictions on their GPU (saved with the model)
    feature: FeatureConfig = field(default_factory=FeatureConfig)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["feature"] = self.feature.as_dict()
        d["band_quantiles"] = list(self.band_quantiles)
        return d


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def _load_tables(data_root: Path | str | None) -> tuple[Any, Any]:
    import pandas as pd

    from gpurec.dataset import load_dataset

    ops = load_dataset(root=data_root, table="operations")
    try:
        nets = load_dataset(root=data_root, table="networks")
    except FileNotFoundError:
        nets = pd.DataFrame(columns=["gpu", "set_key", "mode", "time_ms", "power_w", "energy_mj"])
    return ops, nets


def _finite_positive(df: Any, cols: list[str]) -> Any:
    ok = np.ones(len(df), dtype=bool)
    for c in cols:
        v = df[c].to_numpy(dtype=np.float64, na_value=np.nan)
        ok &= np.isfinite(v) & (v > 0)
    return ok


def clean_operations(df: Any) -> tuple[Any, dict[str, int]]:
    """Usable training rows: finite positive targets, never a test architecture's set."""
    from gpurec.sets import TEST_ARCHS

    dropped: dict[str, int] = {}
    ok = _finite_positive(df, ["time_ms", "power_w"])
    dropped["non-positive or missing time/power"] = int((~ok).sum())
    df = df[ok]
    test = df["set_key"].map(lambda s: arch_of(s) in TEST_ARCHS).to_numpy(dtype=bool)
    dropped["test-architecture set (never trained on)"] = int(test.sum())
    df = df[~test]
    df = df.sort_values(["gpu", "op_signature", "mode"]).drop_duplicates(["gpu", "op_signature", "mode"], keep="last")
    return df.reset_index(drop=True), dropped


def clean_networks(df: Any) -> Any:
    if len(df) == 0:
        return df
    ok = _finite_positive(df, ["time_ms", "power_w"])
    return df[ok].sort_values(["gpu", "set_key", "mode"]).reset_index(drop=True)


def data_hash(ops: Any, nets: Any) -> str:
    """sha256 over the sorted key columns and targets of the rows trained on."""
    h = hashlib.sha256()
    for name, df, keys in (("operations", ops, ["gpu", "op_signature", "mode"]),
                           ("networks", nets, ["gpu", "set_key", "mode"])):
        h.update(name.encode())
        if len(df) == 0:
            continue
        part = df[[*keys, "time_ms", "power_w"]].sort_values(keys)
        for row in part.itertuples(index=False):
            h.update(("|".join(str(v) for v in row[:3]) + f"|{float(row[3])!r}|{float(row[4])!r}\n").encode())
    return h.hexdigest()


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


def current_data_hash(data_root: Path | str | None = None) -> str:
    """Hash of the data a training run on ``data_root`` would use (cheap: no extraction)."""
    raw_ops, raw_nets = _load_tables(data_root)
    ops, _ = clean_operations(raw_ops)
    return data_hash(ops, clean_networks(raw_nets))


def library_versions() -> dict[str, str]:
    import gpurec

    out = {"gpurec": gpurec.__version__, "python": platform.python_version()}
    for mod in ("xgboost", "sklearn", "torch", "numpy", "pandas", "optuna"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            out[mod] = "missing"
    return out


# ---------------------------------------------------------------------------------------------
# Tuning
# ---------------------------------------------------------------------------------------------


def tune_xgboost(X: np.ndarray, y: np.ndarray, margin: np.ndarray, groups: np.ndarray, cfg: TrainConfig,
                 log: Callable[[str], None]) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """Optuna over XGBoost hyper-parameters; objective = grouped-CV RMSE of the log target.

    Groups are op signatures, so the tuned settings are those that generalise to unseen
    operations. Early stopping picks the number of rounds. Tuning sees all training rows, so
    the validation numbers below are slightly optimistic about hyper-parameters (not data).
    """
    import xgboost as xgb

    from gpurec.model.regressors import DEFAULT_XGB_PARAMS

    folds = grouped_folds(groups, cfg.tune_folds, cfg.seed)
    d = xgb.DMatrix(X, label=y, base_margin=margin)
    base = {**DEFAULT_XGB_PARAMS, "seed": cfg.seed, "eval_metric": "rmse"}
    if cfg.nthread:
        base["nthread"] = cfg.nthread

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


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    ops: Any  # cleaned, matched operation rows (DataFrame)
    nets: Any  # network rows with extracted operations (DataFrame)
    builder: FeatureBuilder
    X: np.ndarray
    margin: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    modes: np.ndarray
    gpus: np.ndarray
    families: list[frozenset[str]]
    kinds: np.ndarray  # operation kind per row (as extracted)
    range_values: np.ndarray  # (rows, len(range_features)) raw values for the coverage ranges
    net_X: np.ndarray
    net_margin: dict[str, np.ndarray]
    net_modes_ops: np.ndarray
    net_offsets: np.ndarray
    net_signatures: list[str]
    report: dict[str, Any]


def _prepare(data_root: Path | str | None, cfg: TrainConfig, log: Callable[[str], None]) -> _Prepared:
    from gpurec.sets import DATASET_ARCHS, TEST_ARCHS

    raw_ops, raw_nets = _load_tables(data_root)
    ops, dropped = clean_operations(raw_ops)
    nets = clean_networks(raw_nets)
    digest = data_hash(ops, nets)
    extractor = SetExtractor(cfg.cache_dir)
    t0 = time.perf_counter()
    matched = operations_of_rows(ops, extractor)
    ops = ops.iloc[matched.row_index].reset_index(drop=True)
    dropped.update({f"unmatched: {k}": v for k, v in matched.unmatched.items()})
    kinds = sorted(set(matched.block.kinds.tolist()))
    extra_cols = resolve_extra_columns(ops.columns, cfg.feature.extra_columns)
    builder = FeatureBuilder(kinds, cfg.feature, extra_cols)
    extra = ops[extra_cols].to_numpy(dtype=np.float64, na_value=np.nan) if extra_cols else None
    feats = builder.build(matched.block, hardware_matrix(ops["gpu"].tolist()), extra)
    if len(nets):
        nets = nets.assign(arch=nets["set_key"].map(arch_of))
        nets = nets[nets["arch"].isin(set(DATASET_ARCHS) | set(TEST_ARCHS))].reset_index(drop=True)
        nets = nets.assign(family=nets["arch"].map(family), is_test=nets["arch"].isin(set(TEST_ARCHS)))
    keys = list(zip(nets["set_key"], nets["mode"], strict=True)) if len(nets) else []
    block, offsets, kept = network_blocks(keys, extractor)
    nets = nets.iloc[kept].reset_index(drop=True) if len(nets) else nets
    extractor.save()
    hw_rows = hardware_matrix(nets["gpu"].tolist()) if len(nets) else np.zeros((0, 12))
    counts = np.diff(offsets)
    net_feats = builder.build(block, np.repeat(hw_rows, counts, axis=0) if len(nets) else hw_rows)
    gone = ", ".join(f"{v} {k}" for k, v in dropped.items() if v) or "none"
    log(f"features: {len(ops)} operation rows (dropped: {gone}), "
        f"{len(nets)} networks, {builder.n_features} features, {len(kinds)} kinds, "
        f"{time.perf_counter() - t0:.0f} s extracting")
    import pandas as pd

    prov: dict[str, dict[str, Any]] = {}
    both = pd.concat([ops.assign(_table="operations"), nets.assign(_table="networks")], ignore_index=True) \
        if len(nets) else ops.assign(_table="operations")
    for gpu, part in both.groupby("gpu"):
        prov[str(gpu)] = {c: sorted({str(v) for v in part[c].dropna().unique()})[:5]
                          for c in ("driver", "torch", "cuda_runtime", "host_cpu", "gpu_uuid") if c in part}
        prov[str(gpu)]["rows"] = {str(k): int(v) for k, v in part["_table"].value_counts().items()}
    report = {"data_sha256": digest, "provenance": prov, "dropped_rows": dropped, "extraction_errors": {f"{k[0]}|{k[1]}": v for k, v in extractor.errors.items()}}
    return _Prepared(
        ops=ops, nets=nets, builder=builder, X=feats.X,
        margin={"time": feats.margin_time, "power": feats.margin_power},
        y={t: np.log(ops[TARGETS[t]["column"]].to_numpy(dtype=np.float64)) for t in TARGETS},
        modes=ops["mode"].to_numpy().astype(str), gpus=ops["gpu"].to_numpy().astype(str),
        families=[row_families(s, m) for s, m in zip(ops["set_key"], ops.get("model_sets", ops["set_key"]),
                                                     strict=True)],
        kinds=matched.block.kinds.astype(str),
        range_values=np.stack([matched.block.column(f) for f in cfg.feature.range_features], axis=1)
        if len(ops) else np.zeros((0, len(cfg.feature.range_features))),
        net_X=net_feats.X, net_margin={"time": net_feats.margin_time, "power": net_feats.margin_power},
        net_modes_ops=np.repeat(nets["mode"].to_numpy().astype(str), counts) if len(nets) else np.zeros(0, str),
        net_offsets=offsets, net_signatures=block.signatures, report=report,
    )


class _Suite:
    """Model factories for XGBoost and the baselines, with the tuned parameters."""

    def __init__(self, cfg: TrainConfig, params: dict[str, dict[str, Any]], rounds: dict[str, int],
                 names: list[str]) -> None:
        self.cfg, self.params, self.rounds, self.names = cfg, params, rounds, names

    def kinds(self) -> list[str]:
        return ["xgboost", "random_forest", "roofline_linear"] if self.cfg.baselines else ["xgboost"]

    def fit(self, kind: str, p: _Prepared, rows: np.ndarray) -> dict[str, Routed]:
        cfg = self.cfg
        out = {}
        for target in TARGETS:
            if kind == "xgboost":
                def factory(t: str = target) -> Any:
                    return XGBModel(self.params[t], self.rounds[t], cfg.seed, cfg.nthread)
            elif kind == "random_forest":
                def factory() -> Any:
                    return ForestModel(cfg.forest_trees, cfg.seed, n_jobs=cfg.nthread or -1)
            else:
                def factory() -> Any:
                    return RooflineLinearModel()
            out[target] = Routed(factory, cfg.min_rows_per_mode).fit(
                p.X[rows], p.y[target][rows], p.margin[target][rows], p.modes[rows], feature_names=self.names)
        return out


def _predict_ops(models: dict[str, Routed], p: _Prepared, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.exp(models["time"].predict(p.X[rows], p.margin["time"][rows], p.modes[rows]))
    w = np.exp(models["power"].predict(p.X[rows], p.margin["power"][rows], p.modes[rows]))
    return t, w


def _predict_networks(models: dict[str, Routed], p: _Prepared, net_rows: np.ndarray, small_op_ms: float,
                      lookup: MeasuredLookup | None = None) -> NetworkSums:
    """Raw per-network sums of per-op predictions for the selected network rows.

    With ``lookup``, measured operations of the network's GPU and mode replace predictions,
    exactly as Predictor does.
    """
    if len(net_rows) == 0:
        return aggregate(np.zeros(0), np.zeros(0), np.zeros(1, dtype=np.int64), small_op_ms)
    idx = np.concatenate([np.arange(p.net_offsets[i], p.net_offsets[i + 1]) for i in net_rows])
    offsets = np.concatenate([[0], np.cumsum(np.diff(p.net_offsets)[net_rows])])
    t = np.exp(models["time"].predict(p.net_X[idx], p.net_margin["time"][idx], p.net_modes_ops[idx]))
    w = np.exp(models["power"].predict(p.net_X[idx], p.net_margin["power"][idx], p.net_modes_ops[idx]))
    if lookup is not None and len(lookup):
        for j, i in enumerate(net_rows):
            a, b = offsets[j], offsets[j + 1]
            sigs = p.net_signatures[p.net_offsets[i]:p.net_offsets[i + 1]]
            t[a:b], w[a:b], _ = lookup.apply(t[a:b], w[a:b], sigs, str(p.nets["gpu"].iat[i]),
                                             str(p.nets["mode"].iat[i]))
    return aggregate(t, w, offsets, small_op_ms)


def _net_measured(p: _Prepared, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (p.nets["time_ms"].to_numpy(dtype=np.float64)[rows], p.nets["power_w"].to_numpy(dtype=np.float64)[rows])


def _net_breakdown(s: NetworkSums, t_pred: np.ndarray, w_pred: np.ndarray, p: _Prepared, rows: np.ndarray
                   ) -> dict[str, Any]:
    t, w = _net_measured(p, rows)
    return breakdown(t_pred, w_pred, t, w, p.nets["gpu"].to_numpy()[rows], p.nets["mode"].to_numpy()[rows],
                     extra={"family": p.nets["family"].to_numpy()[rows]})


def _records(s: NetworkSums, t_pred: np.ndarray, w_pred: np.ndarray, p: _Prepared, rows: np.ndarray
             ) -> list[dict[str, Any]]:
    """Per-network predictions for the report (plots, tables)."""
    t, w = _net_measured(p, rows)
    out = []
    for j, i in enumerate(rows):
        out.append({"set_key": p.nets["set_key"].iat[i], "mode": p.nets["mode"].iat[i], "gpu": p.nets["gpu"].iat[i],
                    "family": p.nets["family"].iat[i], "measured_time_ms": float(t[j]),
                    "measured_power_w": float(w[j]), "sum_time_ms": float(s.sum_time_ms[j]),
                    "sum_power_w": float(s.power_ops_w[j]), "pred_time_ms": float(t_pred[j]),
                    "pred_power_w": float(w_pred[j]), "n_ops": int(s.n_ops[j]), "n_small": int(s.n_small[j]),
                    "small_time_ms": float(s.small_time_ms[j])})
    return out


def train(data_root: Path | str | None = None, out_dir: Path | str = "models", tune_trials: int = 20,
          seed: int = 0, config: TrainConfig | None = None, log: Callable[[str], None] = print,
          **overrides: Any) -> dict[str, Any]:
    """Train, validate and save the predictors; returns the report (also in out_dir/report.json).

    ``data_root`` defaults to the shipped ``datasets/`` (gpurec.dataset); ``overrides`` set
    TrainConfig fields (e.g. ``n_folds=3, max_rounds=50`` for a quick run).
    """
    cfg = replace(config or TrainConfig(), tune_trials=tune_trials, seed=seed, **overrides)
    if cfg.nthread is None:
        cfg = replace(cfg, nthread=auto_nthread())
    t_start = time.perf_counter()
    outer_log = log

    def log(msg: str) -> None:  # noqa: F811 - the same logger, with elapsed seconds
        outer_log(f"[{time.perf_counter() - t_start:6.1f} s] {msg}")

    p = _prepare(data_root, cfg, log)
    if len(p.ops) < 4:
        raise ValueError(f"only {len(p.ops)} usable operation rows: too few to train")
    n_rows = len(p.ops)
    all_rows = np.arange(n_rows)
    sig_groups = p.ops["op_signature"].to_numpy().astype(str)
    gpus_measured = sorted(set(p.gpus.tolist()))
    report: dict[str, Any] = {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "config": cfg.as_dict(), **p.report,
                              "rows": {"operations": n_rows, "networks_train_archs": int((~p.nets["is_test"]).sum())
                                       if len(p.nets) else 0,
                                       "networks_test_archs": int(p.nets["is_test"].sum()) if len(p.nets) else 0,
                                       "by_gpu_mode": {f"{g}|{m}": int(((p.gpus == g) & (p.modes == m)).sum())
                                                       for g in gpus_measured for m in MODES}},
                              "gpus_measured": gpus_measured}

    # -- tuning --------------------------------------------------------------------------------
    params: dict[str, dict[str, Any]] = {}
    rounds: dict[str, int] = {}
    report["tuning"] = {}
    for target in TARGETS:
        log(f"tuning {target} ({cfg.tune_trials} trials)")
        params[target], rounds[target], report["tuning"][target] = tune_xgboost(
            p.X, p.y[target], p.margin[target], sig_groups, cfg, log)
    suite = _Suite(cfg, params, rounds, p.builder.feature_names)
    meas_t = p.ops["time_ms"].to_numpy(dtype=np.float64)
    meas_w = p.ops["power_w"].to_numpy(dtype=np.float64)

    # -- grouped K-fold by op signature ---------------------------------------------------------
    log(f"grouped {cfg.n_folds}-fold CV by op signature")
    folds = grouped_folds(sig_groups, cfg.n_folds, cfg.seed)
    kfold: dict[str, Any] = {"folds": len(folds), "groups": int(len(set(sig_groups.tolist())))}
    oof: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for kind in suite.kinds():
        pt, pw = np.full(n_rows, np.nan), np.full(n_rows, np.nan)
        for train_idx, test_idx in folds:
            models = suite.fit(kind, p, train_idx)
            pt[test_idx], pw[test_idx] = _predict_ops(models, p, test_idx)
        oof[kind] = (pt, pw)
        kfold[kind] = breakdown(pt, pw, meas_t, meas_w, p.gpus, p.modes)
        o = kfold[kind]["overall"]
        log(f"  {kind:16s} per-op MAPE time {o['time']['mape']:.1f}%  power {o['power']['mape']:.1f}%  "
            f"energy {o['energy']['mape']:.1f}%")
    report["grouped_kfold"] = kfold

    # -- leave one family out -------------------------------------------------------------------
    report["leave_one_family_out"] = lofo = _leave_one_family_out(p, suite, cfg, log)
    net_oof = lofo.pop("_oof")

    # -- network correction (fitted on out-of-fold sums) ----------------------------------------
    correction, band_source, band = _network_correction(p, net_oof, oof["xgboost"], meas_t, meas_w, cfg, report, log)

    # -- final models ---------------------------------------------------------------------------
    log("final models on all rows")
    final = suite.fit("xgboost", p, all_rows)

    # -- leave one GPU out ----------------------------------------------------------------------
    report["leave_one_gpu_out"] = logo = _leave_one_gpu_out(p, suite, cfg, net_oof, report, log, final)
    cross_t, cross_e = logo.pop("_ratios")
    lo_q, hi_q = cfg.band_quantiles
    if len(cross_t) >= 5:
        band_unmeasured: dict[str, Any] = {
            "quantiles": [lo_q, hi_q], "source": f"leave-one-GPU-out corrected network errors ({len(cross_t)} networks)",
            "time_ratio": [float(min(1.0, np.quantile(cross_t, lo_q))), float(max(1.0, np.quantile(cross_t, hi_q)))],
            "energy_ratio": [float(min(1.0, np.quantile(cross_e, lo_q))), float(max(1.0, np.quantile(cross_e, hi_q)))]}
    else:
        band_unmeasured = {"source": "no cross-GPU validation possible: measured band widened 3x in log space"}
    lookup = MeasuredLookup.from_frame(p.ops) if cfg.use_measured else None
    report["test_set"] = _test_set(p, final, correction, cfg, lookup, log)
    report["seconds"] = time.perf_counter() - t_start

    from gpurec.model.persist import save_model

    manifest = _manifest(p, cfg, final, correction, band, band_source, report, gpus_measured, band_unmeasured)
    save_model(Path(out_dir), final, manifest, report, lookup)
    log(f"saved to {out_dir} in {report['seconds']:.0f} s")
    return report


def _leave_one_family_out(p: _Prepared, suite: _Suite, cfg: TrainConfig, log: Callable[[str], None]
                          ) -> dict[str, Any]:
    from gpurec.sets import DATASET_ARCHS

    fams = sorted({family(a) for a in DATASET_ARCHS}
                  & ({f for fs in p.families for f in fs}
                     | (set(p.nets.loc[~p.nets["is_test"], "family"]) if len(p.nets) else set())))
    out: dict[str, Any] = {"families": fams}
    per_kind_ops: dict[str, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]] = {k: [] for k in suite.kinds()}
    net_parts: dict[str, list[tuple[np.ndarray, NetworkSums]]] = {k: [] for k in suite.kinds()}
    fold_rows: dict[str, Any] = {}
    log(f"leave-one-family-out over {len(fams)} families")
    for fam in fams:
        test = np.array([fam in fs for fs in p.families], dtype=bool)
        train_idx = np.flatnonzero(~test)
        test_idx = np.flatnonzero(test)
        net_rows = (np.flatnonzero((p.nets["family"] == fam).to_numpy() & ~p.nets["is_test"].to_numpy())
                    if len(p.nets) else np.zeros(0, dtype=np.int64))
        fold_rows[fam] = {"train_ops": int(len(train_idx)), "test_ops": int(len(test_idx)),
                          "test_networks": int(len(net_rows))}
        if len(train_idx) < 4 or (len(test_idx) == 0 and len(net_rows) == 0):
            fold_rows[fam]["skipped"] = True
            continue
        for kind in suite.kinds():
            models = suite.fit(kind, p, train_idx)
            if len(test_idx):
                pt, pw = _predict_ops(models, p, test_idx)
                per_kind_ops[kind].append((fam, test_idx, pt, pw))
            if len(net_rows):
                net_parts[kind].append((net_rows, _predict_networks(models, p, net_rows, cfg.small_op_ms)))
    out["folds"] = fold_rows
    meas_t = p.ops["time_ms"].to_numpy(dtype=np.float64)
    meas_w = p.ops["power_w"].to_numpy(dtype=np.float64)
    oof_nets: dict[str, tuple[np.ndarray, NetworkSums]] = {}
    for kind in suite.kinds():
        parts = per_kind_ops[kind]
        entry: dict[str, Any] = {}
        if parts:
            idx = np.concatenate([a for _, a, _, _ in parts])
            pt = np.concatenate([b for _, _, b, _ in parts])
            pw = np.concatenate([c for _, _, _, c in parts])
            fam_lab = np.concatenate([[f] * len(a) for f, a, _, _ in parts])
            entry["per_op"] = breakdown(pt, pw, meas_t[idx], meas_w[idx], p.gpus[idx], p.modes[idx],
                                        extra={"family": fam_lab})
        nparts = net_parts[kind]
        if nparts:
            rows = np.concatenate([r for r, _ in nparts])
            sums = NetworkSums(*(np.concatenate([getattr(s, f) for _, s in nparts]) for f in
                                 ("sum_time_ms", "sum_energy_mj", "n_ops", "n_small", "small_time_ms")))
            entry["network_raw"] = _net_breakdown(sums, sums.sum_time_ms, sums.power_ops_w, p, rows)
            oof_nets[kind] = (rows, sums)
        out[kind] = entry
        if "per_op" in entry:
            o = entry["per_op"]["overall"]
            msg = f"  {kind:16s} per-op MAPE time {o['time']['mape']:.1f}% energy {o['energy']['mape']:.1f}%"
            if "network_raw" in entry:
                n = entry["network_raw"]["overall"]
                msg += f" | network (raw sum) time {n['time']['mape']:.1f}% energy {n['energy']['mape']:.1f}% " \
                       f"[{n['n']} networks]"
            log(msg)
    out["_oof"] = oof_nets
    return out


def _network_correction(p: _Prepared, net_oof: dict[str, tuple[np.ndarray, NetworkSums]],
                        op_oof: tuple[np.ndarray, np.ndarray], meas_t: np.ndarray, meas_w: np.ndarray,
                        cfg: TrainConfig, report: dict[str, Any], log: Callable[[str], None]
                        ) -> tuple[Correction, str, dict[str, Any]]:
    """Choose and fit the whole-network correction; derive the uncertainty band."""
    lo_q, hi_q = cfg.band_quantiles
    lofo = report["leave_one_family_out"]
    corr_report: dict[str, Any] = {"available": False}
    correction = Correction.identity()
    ratios_t: np.ndarray | None = None
    ratios_e: np.ndarray | None = None
    if "xgboost" in net_oof:
        rows, sums = net_oof["xgboost"]
        gpus = p.nets["gpu"].to_numpy().astype(str)[rows]
        modes = p.nets["mode"].to_numpy().astype(str)[rows]
        fams = p.nets["family"].to_numpy().astype(str)[rows]
        t, w = _net_measured(p, rows)
        cv = correction_cv(sums, gpus, modes, fams, t, w, cfg.min_networks_gpu, 3, cfg.correction_ridge)
        chosen = cv.get("chosen", {"time": "none", "power": "none"})
        correction = fit_correction(sums, gpus, modes, t, w, chosen["time"], chosen["power"],
                                    cfg.min_networks_gpu, 3, cfg.correction_ridge)
        corr_report = {"available": "chosen" in cv, "n_networks": int(len(rows)),
                       "n_families": cv["n_groups"], "mape_by_variant": {k: cv[k] for k in ("time", "power", "energy")},
                       "chosen": chosen, "time_variants": {k: list(v) for k, v in TIME_VARIANTS.items()},
                       "power_variants": {k: list(v) for k, v in POWER_VARIANTS.items()}}
        if "chosen" in cv:
            oof_t, oof_w = cv["oof_time_ms"], cv["oof_power_w"]
            lofo["xgboost"]["network_corrected"] = _net_breakdown(sums, oof_t, oof_w, p, rows)
            lofo["xgboost"]["network_records"] = _records(sums, oof_t, oof_w, p, rows)
            ratios_t = t / oof_t
            ratios_e = (t * w) / (oof_t * oof_w)
            n = lofo["xgboost"]["network_corrected"]["overall"]
            log(f"  network correction time '{chosen['time']}', power '{chosen['power']}': "
                f"time MAPE {cv['time']['none']:.1f}% -> {cv['time'][chosen['time']]:.1f}%, "
                f"energy {cv['energy']['none']:.1f}% -> {cv['energy']['chosen']:.1f}% [{n['n']} networks]")
        else:
            lofo["xgboost"]["network_records"] = _records(sums, sums.sum_time_ms, sums.power_ops_w, p, rows)
    report["network_correction"] = corr_report
    if ratios_t is not None and len(ratios_t) >= 5:
        source = f"leave-one-family-out corrected network errors ({len(ratios_t)} networks)"
    else:
        pt, pw = op_oof
        ok = np.isfinite(pt)
        ratios_t = meas_t[ok] / pt[ok]
        ratios_e = (meas_t[ok] * meas_w[ok]) / (pt[ok] * pw[ok])
        source = f"grouped-CV per-operation errors ({int(ok.sum())} rows; too few networks)"

    def q(r: np.ndarray) -> list[float]:
        return [float(min(1.0, np.quantile(r, lo_q))), float(max(1.0, np.quantile(r, hi_q)))]

    band = {"quantiles": [lo_q, hi_q], "time_ratio": q(ratios_t), "energy_ratio": q(ratios_e),
            "meaning": "measured / predicted ratio quantiles; low = estimate x lo, high = estimate x hi"}
    return correction, source, band


def _leave_one_gpu_out(p: _Prepared, suite: _Suite, cfg: TrainConfig,
                       net_oof: dict[str, tuple[np.ndarray, NetworkSums]], report: dict[str, Any],
                       log: Callable[[str], None], final: dict[str, Routed] | None = None) -> dict[str, Any]:
    """Hold each GPU out: per-operation error (GPUs with operation rows, when >= 2 have them) and
    whole-network error on the held-out GPU with models and network correction from the others.

    A GPU with network rows but no operation rows (a GPU measured only as whole networks) is
    the realistic "unmeasured GPU" case: every one of its estimates is a cross-GPU extrapolation.
    """
    op_gpus = sorted(set(p.gpus.tolist()))
    net_gpus = sorted(set(p.nets["gpu"].astype(str).tolist())) if len(p.nets) else []
    out: dict[str, Any] = {"available": False, "gpus": {}, "op_level": len(op_gpus) >= 2,
                           "gpus_with_operation_rows": op_gpus, "gpus_with_network_rows": net_gpus}
    chosen = report["network_correction"].get("chosen", {"time": "none", "power": "none"})
    ratios_t: list[float] = []
    ratios_e: list[float] = []
    log("leave-one-GPU-out")
    for gpu in sorted(set(op_gpus) | set(net_gpus)):
        test_idx = np.flatnonzero(p.gpus == gpu)
        train_idx = np.flatnonzero(p.gpus != gpu)
        entry: dict[str, Any] = {"train_ops": int(len(train_idx)), "test_ops": int(len(test_idx))}
        if len(train_idx) < 4:
            entry["skipped"] = "no operation rows of other GPUs to train on"
            out["gpus"][gpu] = entry
            continue
        kinds = suite.kinds() if len(test_idx) else ["xgboost"]
        for kind in kinds:
            if kind == "xgboost" and not len(test_idx) and final is not None:
                models = final  # nothing of this GPU in training: the final models are the held-out models
            else:
                models = suite.fit(kind, p, train_idx)
            entry[kind] = {}
            if len(test_idx):
                pt, pw = _predict_ops(models, p, test_idx)
                entry[kind]["per_op"] = breakdown(pt, pw, p.ops["time_ms"].to_numpy()[test_idx],
                                                  p.ops["power_w"].to_numpy()[test_idx], p.gpus[test_idx],
                                                  p.modes[test_idx])
                o = entry[kind]["per_op"]["overall"]
                log(f"  {gpu} {kind:16s} per-op MAPE time {o['time']['mape']:.1f}% "
                    f"energy {o['energy']['mape']:.1f}%")
            if kind != "xgboost" or not len(p.nets):
                continue
            # network-level: correction pooled from the other GPUs' out-of-fold networks
            corr = Correction.identity()
            if "xgboost" in net_oof:
                r0, s0 = net_oof["xgboost"]
                keep = p.nets["gpu"].to_numpy()[r0] != gpu
                if keep.sum() >= 3:
                    t0, w0 = _net_measured(p, r0[keep])
                    corr = fit_correction(s0.take(keep), np.full(int(keep.sum()), "*"),
                                          p.nets["mode"].to_numpy()[r0][keep], t0, w0, chosen["time"],
                                          chosen["power"], 10**9, 3, cfg.correction_ridge)
            for label, test_arch in (("train_archs", False), ("test_archs", True)):
                rows = np.flatnonzero((p.nets["gpu"] == gpu).to_numpy() & (p.nets["is_test"].to_numpy() == test_arch))
                if not len(rows):
                    continue
                sums = _predict_networks(models, p, rows, cfg.small_op_ms)
                ct, cw = np.empty(len(rows)), np.empty(len(rows))
                for j, i in enumerate(rows):
                    a, b, _ = corr.apply(sums.take([j]), "*", str(p.nets["mode"].iat[i]))
                    ct[j], cw[j] = a[0], b[0]
                entry[kind][f"network_{label}_raw"] = _net_breakdown(sums, sums.sum_time_ms, sums.power_ops_w, p,
                                                                     rows)
                entry[kind][f"network_{label}_corrected"] = _net_breakdown(sums, ct, cw, p, rows)
                entry[kind][f"network_{label}_records"] = _records(sums, ct, cw, p, rows)
                t, w = _net_measured(p, rows)
                ratios_t += (t / ct).tolist()
                ratios_e += (t * w / (ct * cw)).tolist()
                o = entry[kind][f"network_{label}_corrected"]["overall"]
                log(f"  {gpu} networks of {label.replace('_', ' ')} from other GPUs: time MAPE "
                    f"{o['time']['mape']:.1f}%, energy {o['energy']['mape']:.1f}% [{o['n']} networks]")
            out["available"] = True
        out["gpus"][gpu] = entry
    if not out["available"]:
        out["reason"] = (f"not available: one GPU measured ({op_gpus[0]})" if len(op_gpus) == 1 and not
                         set(net_gpus) - set(op_gpus) else "not available: no second GPU with usable rows")
    out["_ratios"] = (np.array(ratios_t), np.array(ratios_e))
    return out


def _test_set(p: _Prepared, final: dict[str, Routed], correction: Correction, cfg: TrainConfig,
              lookup: MeasuredLookup | None, log: Callable[[str], None]) -> dict[str, Any]:
    """Unseen test architectures (whole networks only), scored with the final model.

    Scored as the predictor runs (measured operations looked up when ``lookup``) and with the
    models alone, so the benefit of the lookup is visible.
    """
    if not len(p.nets) or not p.nets["is_test"].any():
        return {"available": False, "reason": "no networks of TEST_ARCHS measured"}
    rows = np.flatnonzero(p.nets["is_test"].to_numpy())
    out: dict[str, Any] = {"available": True, "archs": sorted(set(p.nets["arch"].to_numpy()[rows].tolist())),
                           "measured_lookup": lookup is not None}
    variants = [("", lookup), ("_model_only", None)] if lookup is not None else [("", None)]
    for suffix, lk in variants:
        sums = _predict_networks(final, p, rows, cfg.small_op_ms, lk)
        ct, cw = np.empty(len(rows)), np.empty(len(rows))
        for j, i in enumerate(rows):
            a, b, _ = correction.apply(sums.take([j]), str(p.nets["gpu"].iat[i]), str(p.nets["mode"].iat[i]))
            ct[j], cw[j] = a[0], b[0]
        out["raw" + suffix] = _net_breakdown(sums, sums.sum_time_ms, sums.power_ops_w, p, rows)
        out["corrected" + suffix] = _net_breakdown(sums, ct, cw, p, rows)
        if not suffix:
            out["records"] = _records(sums, ct, cw, p, rows)
        o, r = out["corrected" + suffix]["overall"], out["raw" + suffix]["overall"]
        log(f"test architectures{' (models only)' if suffix else ''}: network MAPE time {r['time']['mape']:.1f}% "
            f"(raw) -> {o['time']['mape']:.1f}%, energy {r['energy']['mape']:.1f}% -> {o['energy']['mape']:.1f}% "
            f"[{o['n']} networks]")
    if lookup is not None:
        hits = total = 0
        for i in rows:
            d = lookup.table.get((str(p.nets["gpu"].iat[i]), str(p.nets["mode"].iat[i])), {})
            sigs = p.net_signatures[p.net_offsets[i]:p.net_offsets[i + 1]]
            hits += sum(s in d for s in sigs)
            total += len(sigs)
        out["lookup_hit_share_ops"] = hits / total if total else 0.0
    return out


def _ranges(p: _Prepared, cfg: TrainConfig) -> dict[str, dict[str, list[float]]]:
    """Per mode and kind, min/max of the range-checked features over the training rows."""
    kinds = p.kinds
    out: dict[str, dict[str, list[float]]] = {}
    for mode in MODES:
        out[mode] = {}
        for kind in sorted(set(kinds[p.modes == mode].tolist())):
            sel = (p.modes == mode) & (kinds == kind)
            v = p.range_values[sel]
            out[mode][kind] = [*v.min(axis=0).tolist(), *v.max(axis=0).tolist()]
    return out


def _manifest(p: _Prepared, cfg: TrainConfig, final: dict[str, Routed], correction: Correction,
              band: dict[str, Any], band_source: str, report: dict[str, Any], gpus: list[str],
              band_unmeasured: dict[str, Any]) -> dict[str, Any]:
    from gpurec.model.persist import SCHEMA_VERSION

    def cv_scores(entry: dict[str, Any]) -> dict[str, Any]:
        o = entry.get("overall", {})
        return {t: {k: o.get(t, {}).get(k) for k in ("mape", "within10")} for t in ("time", "power", "energy")} | \
            {"n": o.get("n", 0)}

    lofo = report["leave_one_family_out"].get("xgboost", {})
    cv = {"grouped_kfold_per_op": cv_scores(report["grouped_kfold"]["xgboost"])}
    if "per_op" in lofo:
        cv["lofo_per_op"] = cv_scores(lofo["per_op"])
    if "network_raw" in lofo:
        cv["lofo_network_raw"] = cv_scores(lofo["network_raw"])
    if "network_corrected" in lofo:
        cv["lofo_network_corrected"] = cv_scores(lofo["network_corrected"])
    if report["test_set"].get("available"):
        cv["test_archs_network_corrected"] = cv_scores(report["test_set"]["corrected"])
        if "corrected_model_only" in report["test_set"]:
            cv["test_archs_network_corrected_model_only"] = cv_scores(report["test_set"]["corrected_model_only"])
    return {
        "schema_version": SCHEMA_VERSION,
        "feature_schema_version": FEATURE_SCHEMA_VERSION,
        "created": report["created"],
        "feature_names": p.builder.feature_names,
        "feature_config": cfg.feature.as_dict(),
        "extra_columns": p.builder.extra_columns,
        "kind_categories": p.builder.kinds,
        "targets": {t: {**TARGETS[t], "margin": getattr(cfg.feature, f"{t}_margin")} for t in TARGETS},
        "energy": "energy_mj = power_w x time_ms (W x ms = mJ); not a separate target",
        "modes": list(MODES),
        "routes": {t: dict(final[t].route) for t in TARGETS},
        "training_data": {"sha256": report["data_sha256"],
                          "hash_of": "cleaned operations and networks tables (gpurec.model.training.current_data_hash)",
                          "operations": int(len(p.ops)),
                          "networks": int(len(p.nets)), "rows_by_gpu_mode": report["rows"]["by_gpu_mode"]},
        "versions": library_versions(),
        "gpus_measured": gpus,
        "gpus_networks_measured": sorted(set(p.nets["gpu"].astype(str).tolist())) if len(p.nets) else [],
        "hyperparameters": {t: {"params": final[t].models[next(iter(final[t].models))].params,
                                "rounds": final[t].models[next(iter(final[t].models))].num_rounds} for t in TARGETS},
        "cv": cv,
        "network_correction": correction.as_dict() | {"small_op_ms": cfg.small_op_ms},
        "uncertainty": {"measured_gpu": band, "source": band_source, "unmeasured_gpu": band_unmeasured,
                        "unmeasured_gpu_widening": 3.0,
                        "unmeasured_note": "GPUs without operation measurements: band from leave-one-GPU-out "
                                           "network errors when available, else the measured band widened 3x "
                                           "in log space"},
        "ranges": {"features": list(cfg.feature.range_features), "tolerance": cfg.feature.range_tolerance,
                   "by_mode_kind": _ranges(p, cfg)},
        "train_config": cfg.as_dict(),
        "env": {"GPUREC_MODELS": os.environ.get("GPUREC_MODELS", "")},
    }


def dumps(obj: Any) -> str:
    return json.dumps(json_safe(obj), indent=1, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m gpurec.model.training", description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None, help="datasets root (default: shipped datasets/)")
    ap.add_argument("--out", default="models", help="output directory (default: models/)")
    ap.add_argument("--trials", type=int, default=20, help="Optuna trials per target (0 = defaults)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--no-baselines", action="store_true", help="skip RandomForest and roofline-linear")
    ap.add_argument("--cache", default=None, help="directory to cache extracted operations in")
    ap.add_argument("--nthread", type=int, default=None,
                    help="XGBoost threads (default: the idle cores; 1 is faster when other jobs load the machine)")
    a = ap.parse_args(argv)
    train(a.data, a.out, tune_trials=a.trials, seed=a.seed, n_folds=a.folds, baselines=not a.no_baselines,
          cache_dir=a.cache, nthread=a.nthread)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
