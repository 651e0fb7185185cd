"""Time boosters per mode and kind group (convolutions and batch norm, and the rest): fitting,
fallbacks, persistence, the loader's checks, the predictor's routing, and old manifests."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpurec.model.config import TIME_KIND_GROUPS
from gpurec.model.regressors import REST_GROUP, KindGroups, KindRouter, Routed, XGBModel

FIXTURE = Path(__file__).parent / "fixtures" / "model"
QUICK = dict(tune_trials=0, max_rounds=30, default_rounds=30, early_stopping_rounds=5, n_folds=3, tune_folds=2,
             forest_trees=20, min_rows_per_mode=20, baselines=False)
KINDS = ("Conv2d", "BatchNorm2d", "Linear", "ReLU")
NAMES = ["x", "mode_training", *(f"kind={k}" for k in KINDS), "kind=__other__"]
CONV_BN = {"Conv2d", "BatchNorm2d"}


def _rows(kinds: list[str], rng: np.random.Generator) -> np.ndarray:
    X = np.zeros((len(kinds), len(NAMES)), dtype=np.float32)
    X[:, 0] = rng.random(len(kinds))
    for i, k in enumerate(kinds):
        X[i, NAMES.index(f"kind={k}" if f"kind={k}" in NAMES else "kind=__other__")] = 1.0
    return X


class _Recorder:
    """A regressor that remembers the rows it was fitted on and predicts its own id."""

    made: list[_Recorder] = []

    def __init__(self) -> None:
        self.id = float(len(_Recorder.made) + 1)
        _Recorder.made.append(self)
        self.X: np.ndarray | None = None

    def fit(self, X: np.ndarray, y: np.ndarray, margin: np.ndarray, feature_names: Any = None) -> _Recorder:
        self.X = X
        return self

    def predict(self, X: np.ndarray, margin: np.ndarray) -> np.ndarray:
        return np.full(len(X), self.id)


def _kinds_of(X: np.ndarray) -> set[str]:
    cols = [i for i, n in enumerate(NAMES) if n.startswith("kind=")]
    return {NAMES[cols[j]][len("kind="):] for j in np.argmax(X[:, cols], axis=1)}


def _synthetic(n_conv: int, n_rest: int, mode: str, rng: np.random.Generator) -> tuple[np.ndarray, list[str]]:
    kinds = [("Conv2d", "BatchNorm2d")[i % 2] for i in range(n_conv)] + [("Linear", "ReLU", "Softmax")[i % 3]
                                                                      for i in range(n_rest)]
    return _rows(kinds, rng), kinds


# -- Routed --------------------------------------------------------------------------------------


def test_grouped_routed_fits_and_serves_each_group_with_its_own_regressor() -> None:
    rng = np.random.default_rng(0)
    Xi, ki = _synthetic(40, 50, "inference", rng)
    Xt, kt = _synthetic(30, 30, "training", rng)
    X, kinds = np.concatenate([Xi, Xt]), ki + kt
    modes = np.array(["inference"] * len(Xi) + ["training"] * len(Xt))
    _Recorder.made = []
    r = Routed(_Recorder, min_rows=10, kind_groups=TIME_KIND_GROUPS).fit(X, np.zeros(len(X)), np.zeros(len(X)), modes,
                                                                       feature_names=NAMES)
    assert r.groups_ is not None and r.groups_.names == ("conv_bn", REST_GROUP)
    assert r.route_ == {m: {"conv_bn": f"{m}_conv_bn", "rest": f"{m}_rest"} for m in ("inference", "training")}
    assert _kinds_of(r.models_["inference_conv_bn"].X) == CONV_BN
    assert _kinds_of(r.models_["training_rest"].X) == {"Linear", "ReLU", "__other__"}  # Softmax: no column
    pred = r.predict(X, np.zeros(len(X)), modes)
    for i, (k, m) in enumerate(zip(kinds, modes, strict=True)):
        want = r.models_[f"{m}_{'conv_bn' if k in CONV_BN else 'rest'}"].id
        assert pred[i] == want, (i, k, m)
    # the recurrent override still applies after the groups' regressors
    r.override = type("Override", (), {"apply": lambda self, out, X, modes: out * 0 - 7.0})()
    assert np.all(r.predict(X, np.zeros(len(X)), modes) == -7.0)


def test_a_group_below_min_rows_falls_back_to_its_modes_regressor() -> None:
    rng = np.random.default_rng(1)
    Xi, _ = _synthetic(4, 40, "inference", rng)  # 4 conv/bn rows < min_rows
    Xt, _ = _synthetic(3, 3, "training", rng)  # the whole mode < min_rows: pooled over modes
    X = np.concatenate([Xi, Xt])
    modes = np.array(["inference"] * len(Xi) + ["training"] * len(Xt))
    _Recorder.made = []
    r = Routed(_Recorder, min_rows=10, kind_groups=TIME_KIND_GROUPS).fit(X, np.zeros(len(X)), np.zeros(len(X)), modes,
                                                                       feature_names=NAMES)
    assert r.route_["inference"] == {"conv_bn": "inference", "rest": "inference_rest"}
    assert r.route_["training"] == {"conv_bn": "all", "rest": "all"}
    assert len(r.models_["inference"].X) == len(Xi)  # the mode's regressor: every row of the mode, none dropped
    assert len(r.models_["all"].X) == len(X)
    pred = r.predict(X, np.zeros(len(X)), modes)
    conv = np.isin(np.argmax(X[:, 2:], axis=1), [0, 1])
    assert np.all(pred[:len(Xi)][conv[:len(Xi)]] == r.models_["inference"].id)
    assert np.all(pred[:len(Xi)][~conv[:len(Xi)]] == r.models_["inference_rest"].id)
    assert np.all(pred[len(Xi):] == r.models_["all"].id)


def test_ungrouped_routed_is_one_regressor_per_mode_as_before() -> None:
    rng = np.random.default_rng(2)
    X, _ = _synthetic(20, 20, "inference", rng)
    modes = np.array(["inference"] * 20 + ["training"] * 20)
    r = Routed(_Recorder, min_rows=10).fit(X, np.zeros(len(X)), np.zeros(len(X)), modes, feature_names=NAMES)
    assert r.groups_ is None and r.route_ == {"inference": "inference", "training": "training"}
    # kind groups none of whose kinds has a column: one regressor per mode as well
    r = Routed(_Recorder, min_rows=10, kind_groups={"g": ("Conv3d",)}).fit(X, np.zeros(40), np.zeros(40), modes,
                                                                          feature_names=NAMES)
    assert r.groups_ is None and r.route_ == {"inference": "inference", "training": "training"}


@pytest.mark.parametrize("groups, why", [
    ({"rest": ("Conv2d",)}, "not 'rest'"), ({"Conv BN": ("Conv2d",)}, "lower-case"), ({"g": ()}, "non-empty"),
    ({"g": "Conv2d"}, "non-empty"), ({"a": ("Conv2d",), "b": ("Conv2d",)}, "in two kind groups"),
    ({"g": ("Conv2D",)}, "no 'kind=Conv2D' feature column"), ({}, "non-empty mapping")])
def test_malformed_kind_groups_are_refused(groups: dict, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        KindGroups(groups, NAMES)


# -- persistence ---------------------------------------------------------------------------------


def _xgb_grouped(rng: np.random.Generator, min_rows: int = 10) -> tuple[Routed, np.ndarray, np.ndarray]:
    """XGBoost boosters per mode and group on rows whose target is +3 for convolutions and batch
    norm and -3 for the rest, so each group's booster tells its rows apart from the other's."""
    Xi, ki = _synthetic(30, 40, "inference", rng)
    Xt, kt = _synthetic(4, 40, "training", rng)  # conv/bn below min rows in training: the mode's booster
    X = np.concatenate([Xi, Xt])
    modes = np.array(["inference"] * len(Xi) + ["training"] * len(Xt))
    y = np.where(np.isin(ki + kt, list(CONV_BN)), 3.0, -3.0)

    def factory() -> XGBModel:
        return XGBModel({"max_depth": 2}, num_rounds=20, seed=0, nthread=1)

    r = Routed(factory, min_rows=min_rows, kind_groups=TIME_KIND_GROUPS).fit(X, y, np.zeros(len(X)), modes,
                                                                           feature_names=NAMES)
    return r, X, modes


def _save(r: Routed, out: Path) -> dict[str, Any]:
    from gpurec.model.persist import save_model

    save_model(out, {"time": r}, {"schema_version": 4, "feature_names": NAMES}, {"cv": 1})
    return json.loads((out / "manifest.json").read_text())


def test_grouped_boosters_round_trip_and_route_by_kind(tmp_path: Path) -> None:
    from gpurec.model.persist import check_kind_groups, load_boosters, verify_model_files

    r, X, modes = _xgb_grouped(np.random.default_rng(3))
    m = _save(r, tmp_path / "m")
    assert m["kind_groups"] == {"time": {"conv_bn": ["Conv2d", "BatchNorm2d"]}}
    assert m["boosters"]["time"] == {
        "inference": {"conv_bn": "time_inference_conv_bn.ubj", "rest": "time_inference_rest.ubj"},
        "training": {"conv_bn": "time_training.ubj", "rest": "time_training_rest.ubj"}}
    assert {"time_inference_conv_bn.ubj", "time_inference_rest.ubj", "time_training.ubj",
            "time_training_rest.ubj"} <= set(m["file_sha256"])
    verify_model_files(m, tmp_path / "m")
    check_kind_groups(m, tmp_path / "m")
    loaded = load_boosters(m, tmp_path / "m", nthread=1)
    margin = np.zeros(len(X))
    back = np.empty(len(X))
    for mode in ("inference", "training"):
        router = loaded["time"][mode]
        assert isinstance(router, KindRouter)
        sel = modes == mode
        back[sel] = router.predict(X[sel], margin[sel])
    assert np.array_equal(back, r.predict(X, margin, modes))  # identical after the round trip
    inf = modes == "inference"
    conv = np.isin(np.argmax(X[:, 2:], axis=1), [0, 1])
    # each group's rows by its own booster: conv/bn near +3, the rest near -3 (swapped or one
    # booster for both, neither holds)
    assert np.all(back[inf & conv] > 2.0) and np.all(back[inf & ~conv] < -2.0)
    router = loaded["time"]["inference"]
    assert np.array_equal(back[inf & conv], router.models["conv_bn"].predict(X[inf & conv], margin[inf & conv]))
    assert np.all(router.models["rest"].predict(X[inf & conv], margin[inf & conv]) < -2.0)


# -- through gpurec train and the predictor -------------------------------------------------------


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list]:
    """The model fixture trained with kind groups (the default); records every Routed built."""
    import gpurec.model.fitting.validation as validation
    from gpurec.model import train

    built: list[Any] = []

    class Recording(Routed):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            built.append(self)

    out = tmp_path_factory.mktemp("grouped")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(validation, "Routed", Recording)
        report = train(FIXTURE, out / "models", log=lambda s: None,
                       **{**QUICK, "cache_dir": str(tmp_path_factory.getbasetemp() / "kind_groups_cache")})
    return out / "models", report, built


@pytest.fixture(scope="module")
def ungrouped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpurec.model import train

    out = tmp_path_factory.mktemp("ungrouped") / "models"
    train(FIXTURE, out, log=lambda s: None, time_kind_groups=False,
          **{**QUICK, "cache_dir": str(tmp_path_factory.getbasetemp() / "kind_groups_cache")})
    return out


def test_every_cross_validation_fit_of_time_uses_the_kind_groups(grouped: tuple[Path, dict, list]) -> None:
    _, report, built = grouped
    time_fits = [r for r in built if r.kind_groups]
    other = [r for r in built if not r.kind_groups]
    # one time and one power model per fit: final, grouped k-fold, each family, each GPU held out
    assert len(time_fits) == len(other) >= 1 + 3 + 2
    assert all(r.kind_groups == TIME_KIND_GROUPS for r in time_fits)
    assert report["config"]["time_kind_groups"] is True


def test_trained_manifest_records_groups_and_predictor_routes_by_kind(grouped: tuple[Path, dict, list]) -> None:
    from gpurec.model import load_predictor
    from gpurec.model.features import OpBlock, hardware_row, masked
    from gpurec.ops import extract_operations

    models, _, _ = grouped
    m = json.loads((models / "manifest.json").read_text())
    assert m["schema_version"] == 4 and m["kind_groups"] == {"time": {"conv_bn": ["Conv2d", "BatchNorm2d"]}}
    assert m["boosters"]["time"]["training"] == {"conv_bn": "time_training_conv_bn.ubj",
                                                 "rest": "time_training_rest.ubj"}
    assert isinstance(m["boosters"]["power"]["training"], str)  # power: one booster per mode, as before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = load_predictor(models, check_data=False)
    router = p._boosters["time"]["training"]
    assert isinstance(router, KindRouter) and set(router.models) == {"conv_bn", "rest"}
    block = OpBlock.from_operations(extract_operations("resnet18", (2, 3, 64, 64), mode="training"), "training")
    feats = p.builder.build(block, hardware_row("H100")[None, :])
    got = p._time_log_ms(feats, "training")
    X = masked(feats.X, p._masks["time"])
    conv = np.isin(block.kinds, list(CONV_BN))
    assert conv.any() and (~conv).any()
    boosters = {g: router.model.models[g] for g in ("conv_bn", "rest")}  # the boosters themselves
    want_conv = boosters["conv_bn"].predict(X[conv], feats.margin_time[conv])
    want_rest = boosters["rest"].predict(X[~conv], feats.margin_time[~conv])
    assert np.allclose(got[conv], want_conv) and np.allclose(got[~conv], want_rest)
    # the two boosters disagree on these rows, so a swap or a single booster would show
    assert not np.allclose(want_conv, boosters["rest"].predict(X[conv], feats.margin_time[conv]))
    assert len(router) > 0
    p.clear_cache()
    assert len(router) == 0


def _copy(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst))


def _refused(d: Path, match: str) -> None:
    from gpurec.model import IncompatibleModel, load_predictor

    with pytest.raises(IncompatibleModel, match=match) as exc:
        load_predictor(d, check_data=False)
    assert "gpurec train" in str(exc.value)  # says how to fix it


@pytest.mark.parametrize("damage", ["missing", "changed", "no_group_entry", "malformed", "unknown_kind",
                                    "old_schema", "one_file_for_grouped"])
def test_a_damaged_grouped_model_is_refused(grouped: tuple[Path, dict, list], tmp_path: Path, damage: str) -> None:
    from gpurec.model.persist import write_manifest

    d = _copy(grouped[0], tmp_path / damage)
    m = json.loads((d / "manifest.json").read_text())
    name = m["boosters"]["time"]["training"]["conv_bn"]
    if damage == "missing":
        (d / name).unlink()
        return _refused(d, f"{name} is missing")
    if damage == "changed":
        (d / name).write_bytes((d / name).read_bytes()[:-10] + b"0123456789")
        return _refused(d, f"{name} in .* differs")
    if damage == "no_group_entry":
        del m["boosters"]["time"]["training"]["conv_bn"]
        match = "must name one file for each kind group"
    elif damage == "malformed":
        m["kind_groups"]["time"]["other"] = ["Conv2d"]
        match = "malformed .*in two kind groups"
    elif damage == "unknown_kind":
        m["kind_groups"]["time"]["conv_bn"] = ["Conv2D"]
        match = "malformed .*no 'kind=Conv2D' feature column"
    elif damage == "old_schema":
        m["schema_version"] = 3
        match = "kind_groups' in a schema_version 3 manifest"
    else:
        m["boosters"]["time"]["training"] = name
        match = "must name one file for each kind group"
    write_manifest(d, m)  # re-sealed, so the check under test is the one that refuses
    _refused(d, match)


def test_an_old_manifest_without_groups_loads_and_predicts_as_before(ungrouped: Path, tmp_path: Path) -> None:
    """A schema-3 manifest (one time booster per mode, no kind_groups: the shipped models until
    the retrain) loads, each mode's time booster sees every row, and the estimates are those
    of the same boosters read as schema 4."""
    from gpurec.model import load_predictor
    from gpurec.model.features import OpBlock, hardware_row, masked
    from gpurec.model.persist import write_manifest
    from gpurec.model.rowmemo import RowMemo
    from gpurec.ops import extract_operations

    old = _copy(ungrouped, tmp_path / "old")
    m = json.loads((old / "manifest.json").read_text())
    assert m["kind_groups"] == {} and all(isinstance(v, str) for v in m["boosters"]["time"].values())
    del m["kind_groups"]
    m["schema_version"] = 3
    write_manifest(old, m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # coverage warnings of the small fixture model
        p_old = load_predictor(old, check_data=False)
        p_new = load_predictor(ungrouped, check_data=False)
        for mode in ("inference", "training"):
            memo = p_old._boosters["time"][mode]
            assert isinstance(memo, RowMemo) and isinstance(memo.model, XGBModel)
            block = OpBlock.from_operations(extract_operations("resnet18", (2, 3, 64, 64), mode=mode), mode)
            feats = p_old.builder.build(block, hardware_row("H100")[None, :])
            X = masked(feats.X, p_old._masks["time"])
            want = XGBModel.load(old / m["boosters"]["time"][mode], nthread=1).predict(X, feats.margin_time)
            assert np.array_equal(p_old._time_log_ms(feats, mode), want)
            a = p_old.predict("resnet18", (2, 3, 64, 64), mode=mode, gpu="H100")
            b = p_new.predict("resnet18", (2, 3, 64, 64), mode=mode, gpu="H100")
            assert a.as_dict() == b.as_dict()
