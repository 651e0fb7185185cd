"""Saving and loading trained predictors, with compatibility checks.

A model directory holds XGBoost boosters in XGBoost's own format (``.ubj``: portable across
platforms and XGBoost versions, and unlike pickle it executes no code on load), a
``manifest.json`` describing exactly how to rebuild the feature rows, and ``report.json``
with every validation number.

Loading refuses (IncompatibleModel) what would give silently wrong predictions: another
schema version, features this code can no longer compute, a booster that is missing, altered
or has another feature count. It warns (ModelWarning) about what may merely shift numbers:
other library versions, or training data that differs from the data now on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
MODELS_ENV = "GPUREC_MODELS"
MANIFEST = "manifest.json"
REPORT = "report.json"
_VERSION_KEYS = ("xgboost", "sklearn", "torch", "gpurec")


class IncompatibleModel(ValueError):
    """The saved model cannot be used with this code (the message says why and what to do)."""


class ModelWarning(UserWarning):
    """The saved model loads, but something differs from when it was trained."""


def default_model_dir() -> Path:
    """$GPUREC_MODELS, else ``models/`` beside the package (the repository root)."""
    if os.environ.get(MODELS_ENV):
        return Path(os.environ[MODELS_ENV])
    import gpurec

    return Path(gpurec.__file__).resolve().parent.parent / "models"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


LOOKUP = "measured_ops.parquet"


def save_model(out_dir: Path, models: dict[str, Any], manifest: dict[str, Any], report: dict[str, Any],
               lookup: Any = None) -> None:
    """Write boosters (one file per distinct route), the measured-operation table, report.json,
    then manifest.json last (a directory without it is an unfinished save)."""
    from gpurec.model.provenance import dumps

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    boosters: dict[str, dict[str, str]] = {}
    files: dict[str, str] = {}
    for target, routed in models.items():
        boosters[target] = {}
        written: dict[str, str] = {}
        for mode, key in routed.route.items():
            if key not in written:
                name = f"{target}_{key}.ubj"
                routed.models[key].save(out_dir / name)
                written[key] = name
                files[name] = _sha256(out_dir / name)
            boosters[target][mode] = written[key]
    if lookup is not None:
        lookup.to_parquet(out_dir / LOOKUP)
        files[LOOKUP] = _sha256(out_dir / LOOKUP)
    elif (out_dir / LOOKUP).exists():
        (out_dir / LOOKUP).unlink()
    manifest = {**manifest, "boosters": boosters, "booster_sha256": files,
                "measured_lookup": LOOKUP if lookup is not None else None}
    (out_dir / REPORT).write_text(dumps(report) + "\n")
    tmp = out_dir / (MANIFEST + ".tmp")
    tmp.write_text(dumps(manifest) + "\n")
    tmp.replace(out_dir / MANIFEST)


def read_manifest(model_dir: Path | str) -> dict[str, Any]:
    path = Path(model_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(
            f"no trained model at {Path(model_dir)} ({MANIFEST} missing). Train one with "
            f"`gpurec train --out {model_dir}` or set ${MODELS_ENV}.")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise IncompatibleModel(f"{path} is not valid JSON: {exc}") from exc


def check_manifest(manifest: dict[str, Any], model_dir: Path | str, data_root: Path | str | None = None,
                   check_data: bool = False) -> list[str]:
    """Raise IncompatibleModel on a schema or feature mismatch; return (and warn) softer differences."""
    from gpurec.model.features import FEATURE_SCHEMA_VERSION, FeatureBuilder, FeatureConfig

    model_dir = Path(model_dir)
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise IncompatibleModel(f"model schema_version {manifest.get('schema_version')!r}, this gpurec reads "
                                f"{SCHEMA_VERSION}: retrain (gpurec train)")
    if manifest.get("feature_schema_version") != FEATURE_SCHEMA_VERSION:
        raise IncompatibleModel(f"feature schema {manifest.get('feature_schema_version')!r}, this gpurec builds "
                                f"{FEATURE_SCHEMA_VERSION}: retrain")
    for key in ("feature_names", "kind_categories", "feature_config", "boosters", "targets"):
        if key not in manifest:
            raise IncompatibleModel(f"manifest lacks '{key}': not a gpurec model directory, or a damaged one")
    try:
        builder = FeatureBuilder(manifest["kind_categories"], FeatureConfig.from_dict(manifest["feature_config"]),
                                 manifest.get("extra_columns", []))
    except (KeyError, TypeError) as exc:
        raise IncompatibleModel(f"the model needs features this gpurec cannot compute: {exc}") from exc
    want, have = list(manifest["feature_names"]), builder.feature_names
    if want != have:
        missing = [f for f in want if f not in have]
        extra = [f for f in have if f not in want]
        raise IncompatibleModel(
            f"feature mismatch: the model expects {len(want)} features, this code builds {len(have)}"
            + (f"; missing here: {missing[:8]}" if missing else "")
            + (f"; not in the model: {extra[:8]}" if extra else "")
            + ("; same names in another order" if not missing and not extra else "") + ". Retrain.")
    sums = manifest.get("booster_sha256", {})
    for target, routes in manifest["boosters"].items():
        for mode, name in routes.items():
            path = model_dir / name
            if not path.exists():
                raise IncompatibleModel(f"booster {name} ({target}, {mode}) is missing from {model_dir}")
            if name in sums and _sha256(path) != sums[name]:
                raise IncompatibleModel(f"booster {name} differs from the one the manifest was written with")
    lk = manifest.get("measured_lookup")
    if lk:
        path = model_dir / lk
        if not path.exists():
            raise IncompatibleModel(f"measured-operation table {lk} is missing from {model_dir}")
        if lk in sums and _sha256(path) != sums[lk]:
            raise IncompatibleModel(f"measured-operation table {lk} differs from the one the manifest was written with")
    notes: list[str] = []
    from gpurec.model.provenance import library_versions

    now = library_versions()
    for k in _VERSION_KEYS:
        then = manifest.get("versions", {}).get(k)
        if then is not None and then != now.get(k):
            notes.append(f"{k} {now.get(k)} here, model trained with {then}")
    if check_data:
        try:
            from gpurec.model.data import current_data_hash

            digest = current_data_hash(data_root)
            if digest != manifest.get("training_data", {}).get("sha256"):
                notes.append("the data on disk differs from the data the model was trained on (data hash); "
                             "retrain to use the new rows")
        except FileNotFoundError:
            pass
    for n in notes:
        warnings.warn(f"gpurec model at {model_dir}: {n}", ModelWarning, stacklevel=3)
    return notes


def load_boosters(manifest: dict[str, Any], model_dir: Path | str, nthread: int | None = None
                  ) -> dict[str, dict[str, Any]]:
    """{target: {mode: XGBModel}}; a booster shared by two modes is loaded once."""
    from gpurec.model.regressors import XGBModel

    model_dir = Path(model_dir)
    loaded: dict[str, Any] = {}
    out: dict[str, dict[str, Any]] = {}
    for target, routes in manifest["boosters"].items():
        out[target] = {}
        for mode, name in routes.items():
            if name not in loaded:
                m = XGBModel.load(model_dir / name, nthread=nthread)
                if m.booster.num_features() != len(manifest["feature_names"]):
                    raise IncompatibleModel(f"booster {name} has {m.booster.num_features()} features, the manifest "
                                            f"{len(manifest['feature_names'])}")
                loaded[name] = m
            out[target][mode] = loaded[name]
    return out
