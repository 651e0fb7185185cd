"""Saving and loading trained predictors, with compatibility checks.

A model directory holds XGBoost boosters in XGBoost's own format (``.ubj``: portable across
platforms and XGBoost versions, and unlike pickle it executes no code on load), a
``manifest.json`` describing exactly how to rebuild the feature rows, and ``report.json``
with every validation number.

Loading refuses (IncompatibleModel) what would give silently wrong predictions: another
schema version, features this code can no longer compute, a booster that is missing, altered
or has another feature count, kind groups (``kind_groups``: a target's boosters per mode and
group of operation kinds, gpurec.model.regressors.KindGroups) that are malformed or lack a
booster. It warns (ModelWarning) about what may merely shift numbers:
other library versions, or training data that differs from the data now on disk.

Integrity: the manifest lists every file of the directory that gpurec reads (boosters, the
measured-operation table, report.json) with its sha256, and carries a digest of its own
content (``manifest_sha256``).  Loading refuses a file that is missing, unlisted or changed,
and a manifest whose content no longer matches its digest.  This guards against accidental
edits and mismatched copies (a hand-tuned number, a booster copied from another training run,
a half-copied directory), not against an attacker: anyone who can edit the files can also
recompute the digests.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 4  # 2: every file hashed in file_sha256, the manifest sealed by manifest_sha256;
#                    3: host.network_calibration (how dispatch adds up inside a network);
#                    4: kind_groups, and boosters[target][mode] = {group: file} for a grouped target
# Read as well: schema 3 (no kind groups; one booster per target and mode, predicted as before).
READABLE_SCHEMA_VERSIONS = (3, SCHEMA_VERSION)
KIND_GROUPS_KEY = "kind_groups"
MODELS_ENV = "GPUREC_MODELS"
MANIFEST = "manifest.json"
REPORT = "report.json"
FILES_KEY = "file_sha256"
DIGEST_KEY = "manifest_sha256"
RETRAIN = "retrain with `gpurec train --out DIR` (or restore the whole directory from where it came from)"
_VERSION_KEYS = ("xgboost", "sklearn", "torch", "gpurec")


class IncompatibleModel(ValueError):
    """The saved model cannot be used with this code (the message says why and what to do)."""


class ModelWarning(UserWarning):
    """The saved model loads, but something differs from when it was trained."""


def checkout_root(start: Path | None = None) -> Path | None:
    """The gpurec source checkout that ``start`` (default: the working directory) lies in, if any."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        project = d / "pyproject.toml"
        if (d / "gpurec").is_dir() and project.is_file():
            try:
                if 'name = "gpurec"' in project.read_text(encoding="utf-8"):
                    return d
            except OSError:
                return None
    return None


def default_model_dir() -> Path:
    """$GPUREC_MODELS, else ``models/`` of the checkout we run in, else ``models/`` beside the package.

    Why the working directory first: a copied checkout run with a ``gpurec`` command
    installed from another checkout must use its own models (or fail), never the other's.
    """
    if os.environ.get(MODELS_ENV):
        return Path(os.environ[MODELS_ENV])
    root = checkout_root()
    if root is not None:
        return root / "models"
    import gpurec

    return Path(gpurec.__file__).resolve().parent.parent / "models"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


LOOKUP = "measured_ops.parquet"
# The lookup as trained, kept when `gpurec tools refresh-lookup` rebuilds LOOKUP from later rows:
# its signatures are the training rows (gpurec.tools.precision_twins reads them).
TRAINED_LOOKUP = "measured_ops_trained.parquet"
TRAINED_LOOKUP_KEY = "measured_lookup_trained"
REFRESH_KEY = "measured_lookup_refreshed_after_training"  # what the refresh did, and on which data


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's content without its own digest, in one canonical JSON form (sorted
    keys, no whitespace), so re-indenting the file does not change it but any edited value does."""
    from gpurec.dataset.store import json_safe

    body = {k: v for k, v in manifest.items() if k != DIGEST_KEY}
    text = json.dumps(json_safe(body), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def model_files(manifest: dict[str, Any]) -> list[str]:
    """Every file of the model directory that gpurec reads, by the manifest's own description."""
    names = {name for routes in manifest.get("boosters", {}).values() for name in _booster_names(routes)}
    for key in ("measured_lookup", TRAINED_LOOKUP_KEY):
        if manifest.get(key):
            names.add(manifest[key])
    names.add(REPORT)
    return sorted(names)


def _booster_names(routes: Any) -> list[str]:
    """The booster files of one target's ``boosters`` entry: {mode: file} or {mode: {group: file}}
    (anything else is left to check_kind_groups to refuse)."""
    if not isinstance(routes, dict):
        return []
    out: list[str] = []
    for v in routes.values():
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            out += [n for n in v.values() if isinstance(n, str)]
    return out


def write_manifest(model_dir: Path | str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Hash every file the manifest refers to, seal the manifest with its digest and write it
    atomically (last, so a directory without it is an unfinished save).  Returns what was written."""
    from gpurec.dataset.store import atomic_write_text
    from gpurec.model.provenance import dumps

    model_dir = Path(model_dir)
    files = {}
    for name in model_files(manifest):
        if not (model_dir / name).is_file():
            raise FileNotFoundError(f"{model_dir / name} is missing: the manifest refers to it")
        files[name] = _sha256(model_dir / name)
    sealed = {k: v for k, v in manifest.items() if k not in (DIGEST_KEY, "booster_sha256")}
    sealed[FILES_KEY] = files
    sealed = json.loads(dumps(sealed))  # the form it will be read back in
    sealed[DIGEST_KEY] = manifest_digest(sealed)
    atomic_write_text(model_dir / MANIFEST, dumps(sealed) + "\n")
    return sealed


def verify_model_files(manifest: dict[str, Any], model_dir: Path | str) -> None:
    """Raise IncompatibleModel unless the manifest matches its digest and every file gpurec reads is
    listed in it, present, and has the listed sha256."""
    model_dir = Path(model_dir)
    where = model_dir / MANIFEST
    if DIGEST_KEY not in manifest:
        raise IncompatibleModel(f"{where} has no {DIGEST_KEY}: it was not written by gpurec's save; {RETRAIN}")
    if manifest_digest(manifest) != manifest[DIGEST_KEY]:
        raise IncompatibleModel(f"{where} was edited after it was written (its content no longer matches "
                                f"{DIGEST_KEY}); {RETRAIN}")
    sums = manifest.get(FILES_KEY)
    if not isinstance(sums, dict):
        raise IncompatibleModel(f"{where} lacks '{FILES_KEY}' (the sha256 of each model file); {RETRAIN}")
    for name in sorted(set(model_files(manifest)) | set(sums)):
        path = model_dir / name
        if name not in sums:
            raise IncompatibleModel(f"{name} is read from {model_dir} but has no sha256 entry in the manifest; "
                                    f"{RETRAIN}")
        if not path.is_file():
            raise IncompatibleModel(f"{name} is missing from {model_dir}; {RETRAIN}")
        if _sha256(path) != sums[name]:
            raise IncompatibleModel(f"{name} in {model_dir} differs from the file the manifest was written with; "
                                    f"{RETRAIN}")


class ModelDirError(ValueError):
    """The model output directory cannot take a new model (the message says how to fix it)."""


def check_output_dir(out_dir: Path | str) -> Path:
    """Fail now, before hours of training, when ``out_dir`` cannot take a new model: it is a file,
    holds the working directory, or it or its parent (where the new model is staged) cannot be
    written.  Creates the parent if needed; returns ``out_dir`` as a Path."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ModelDirError(f"--out {out_dir} is a file, not a directory; pass a directory for the models")
    if Path.cwd().resolve().is_relative_to(out_dir.resolve()):
        raise ModelDirError(f"--out {out_dir} holds the working directory; pass a directory of its own (e.g. models/)")
    parent = out_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelDirError(f"cannot create {parent} for --out {out_dir} ({exc.strerror or exc}); pass another --out"
                            ) from exc
    for d in [parent] + ([out_dir] if out_dir.exists() else []):
        try:
            fd, probe = tempfile.mkstemp(dir=d, prefix=".gpurec-write-check-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise ModelDirError(f"cannot write to {d} ({exc.strerror or exc}); the new models are written beside "
                                f"{out_dir} and swapped in: pass a writable --out") from exc
    return out_dir


def _write_model_files(out_dir: Path, models: dict[str, Any], manifest: dict[str, Any], report: dict[str, Any],
                       lookup: Any) -> None:
    from gpurec.dataset.store import atomic_write_file, atomic_write_text
    from gpurec.model.provenance import dumps

    boosters: dict[str, dict[str, Any]] = {}
    kind_groups: dict[str, dict[str, list[str]]] = {}
    for target, routed in models.items():
        boosters[target] = {}
        written: dict[str, str] = {}

        def file_of(key: str, target: str = target, routed: Any = routed, written: dict[str, str] = written) -> str:
            if key not in written:  # one file per distinct booster: e.g. time_inference_conv_bn.ubj
                name = f"{target}_{key}.ubj"
                atomic_write_file(out_dir / name, routed.models[key].save)
                written[key] = name
            return written[key]

        groups = getattr(routed, "groups_", None)
        if groups is not None:
            kind_groups[target] = groups.as_dict()
        for mode, key in routed.route.items():
            boosters[target][mode] = file_of(key) if isinstance(key, str) else {g: file_of(k) for g, k in key.items()}
    if lookup is not None:
        atomic_write_file(out_dir / LOOKUP, lookup.to_parquet)
    atomic_write_text(out_dir / REPORT, dumps(report) + "\n")
    write_manifest(out_dir, {**manifest, "boosters": boosters, KIND_GROUPS_KEY: kind_groups,
                             "measured_lookup": LOOKUP if lookup is not None else None})


def _keep_other_files(old: Path, new: Path) -> None:
    """Carry files of the old directory that are no part of its model (notes, a README) over to the new."""
    if not (old / MANIFEST).is_file():
        ours: set[str] = set()
    else:
        try:
            ours = set(model_files(json.loads((old / MANIFEST).read_text())))
        except (ValueError, AttributeError):
            ours = set()
    for p in old.iterdir():
        if p.name in ours or p.name == MANIFEST or (new / p.name).exists():
            continue
        if p.is_dir():
            shutil.copytree(p, new / p.name, symlinks=True)
        else:
            shutil.copy2(p, new / p.name, follow_symlinks=False)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where the
    system cannot."""
    import ctypes
    import errno

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(new: Path, dest: Path) -> None:
    """Make ``new`` the directory at ``dest``; the old one is removed only once the new one is in place."""
    if not dest.exists():
        os.rename(new, dest)
    elif _exchange(new, dest):
        shutil.rmtree(new)  # now the old model
    else:  # two renames, the old directory put back if the second fails
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.rename(dest, old)
        try:
            os.rename(new, dest)
        except BaseException:
            os.rename(old, dest)
            raise
        shutil.rmtree(old)
    fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_model(out_dir: Path, models: dict[str, Any], manifest: dict[str, Any], report: dict[str, Any],
               lookup: Any = None) -> None:
    """Write boosters (one file per distinct route), the measured-operation table, report.json and
    the sealed manifest.json into a new directory beside ``out_dir``, then swap it in.

    Until the swap the previous model stays whole and usable; a failed save (a full disk, an
    interrupt) removes the new directory and leaves the old one as it was."""
    out_dir = check_output_dir(out_dir)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.new-"))
    try:
        _write_model_files(staging, models, manifest, report, lookup)
        if out_dir.is_dir():
            _keep_other_files(out_dir, staging)
            os.chmod(staging, out_dir.stat().st_mode & 0o7777)
        else:
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(staging, 0o777 & ~mask)  # mkdtemp's 0700 would hide the models from other users
        _swap_in(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def read_manifest(model_dir: Path | str) -> dict[str, Any]:
    path = Path(model_dir) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(
            f"no trained model at {Path(model_dir)} ({MANIFEST} missing). Train one with "
            f"`gpurec train --out {model_dir}`, or point --models or ${MODELS_ENV} at a trained directory.")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise IncompatibleModel(f"{path} is not valid JSON: {exc}; {RETRAIN}") from exc


def check_manifest(manifest: dict[str, Any], model_dir: Path | str, data_root: Path | str | None = None,
                   check_data: bool = False) -> list[str]:
    """Raise IncompatibleModel on a schema or feature mismatch; return (and warn) softer differences."""
    from gpurec.model.features import FEATURE_SCHEMA_VERSION, FeatureBuilder, FeatureConfig

    model_dir = Path(model_dir)
    if manifest.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        raise IncompatibleModel(f"model schema_version {manifest.get('schema_version')!r}, this gpurec reads "
                                f"{' or '.join(map(str, READABLE_SCHEMA_VERSIONS))}: {RETRAIN}")
    verify_model_files(manifest, model_dir)
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
    check_kind_groups(manifest, model_dir)
    notes: list[str] = []
    from gpurec.model.provenance import library_versions

    now = library_versions()
    for k in _VERSION_KEYS:
        then = manifest.get("versions", {}).get(k)
        if then is not None and then != now.get(k):
            notes.append(f"{k} {now.get(k)} here, model trained with {then}")
    if check_data:
        try:
            from gpurec.model.fitting.data import current_data_hash

            # the targets as that training chose them (models from before recurrent layers kept their
            # elapsed time took the in-network kernel sum for them too)
            elapsed = bool(manifest.get("target_sources", {}).get("recurrent_elapsed", False))
            digest = current_data_hash(data_root, recurrent_elapsed=elapsed)
            if digest != manifest.get("training_data", {}).get("sha256"):
                notes.append("the data on disk differs from the data the model was trained on (data hash); "
                             "retrain to use the new rows")
        except FileNotFoundError:
            pass
    for n in notes:
        warnings.warn(f"gpurec model at {model_dir}: {n}", ModelWarning, stacklevel=3)
    return notes


def check_kind_groups(manifest: dict[str, Any], model_dir: Path | str) -> None:
    """Raise IncompatibleModel unless the manifest's kind groups are well formed (group names,
    disjoint kinds with a ``kind=K`` feature column each: gpurec.model.regressors.KindGroups)
    and each target's ``boosters`` name one file per mode, or, for a grouped target, one per
    mode and group (rest included).  A schema-3 manifest has no kind groups.  (That each named
    file is there with its sha256 is verify_model_files'.)"""
    from gpurec.model.regressors import KindGroups

    where = Path(model_dir) / MANIFEST
    groups = manifest.get(KIND_GROUPS_KEY, {})
    if groups is None:
        groups = {}
    if not isinstance(groups, dict):
        raise IncompatibleModel(f"{where}: '{KIND_GROUPS_KEY}' must map a target to its kind groups, not "
                                f"{type(groups).__name__}; {RETRAIN}")
    if groups and manifest.get("schema_version") != SCHEMA_VERSION:
        raise IncompatibleModel(f"{where}: '{KIND_GROUPS_KEY}' in a schema_version "
                                f"{manifest.get('schema_version')!r} manifest (kind groups came with "
                                f"{SCHEMA_VERSION}); {RETRAIN}")
    boosters = manifest["boosters"]
    if not isinstance(boosters, dict):
        raise IncompatibleModel(f"{where}: 'boosters' must map a target to its booster files; {RETRAIN}")
    unknown = sorted(set(groups) - set(boosters))
    if unknown:
        raise IncompatibleModel(f"{where}: kind groups for target(s) {', '.join(unknown)} without boosters; {RETRAIN}")
    for target, routes in boosters.items():
        if not isinstance(routes, dict) or not routes:
            raise IncompatibleModel(f"{where}: boosters of '{target}' must map each mode to its file(s); {RETRAIN}")
        if target not in groups:
            bad = sorted(m for m, v in routes.items() if not isinstance(v, str))
            if bad:
                raise IncompatibleModel(f"{where}: boosters of '{target}' in mode(s) {', '.join(bad)} are not one "
                                        f"file each, and '{target}' has no kind groups; {RETRAIN}")
            continue
        try:
            kg = KindGroups(groups[target], manifest["feature_names"])
        except ValueError as exc:
            raise IncompatibleModel(f"{where}: the kind groups of '{target}' are malformed ({exc}); {RETRAIN}"
                                    ) from exc
        for mode, v in routes.items():
            if not isinstance(v, dict) or set(v) != set(kg.names) or not all(isinstance(n, str) for n in v.values()):
                raise IncompatibleModel(f"{where}: boosters of '{target}' in mode '{mode}' must name one file for "
                                        f"each kind group ({', '.join(kg.names)}), not {v!r}; {RETRAIN}")


def load_boosters(manifest: dict[str, Any], model_dir: Path | str, nthread: int | None = None
                  ) -> dict[str, dict[str, Any]]:
    """{target: {mode: XGBModel}}, or {mode: KindRouter} for a target with kind groups (each row
    to its group's booster); a booster shared by two modes or groups is loaded once."""
    from gpurec.model.regressors import KindGroups, KindRouter, XGBModel

    model_dir = Path(model_dir)
    loaded: dict[str, Any] = {}

    def booster(name: str) -> Any:
        if name not in loaded:
            m = XGBModel.load(model_dir / name, nthread=nthread)
            if m.booster.num_features() != len(manifest["feature_names"]):
                raise IncompatibleModel(f"booster {name} has {m.booster.num_features()} features, the manifest "
                                        f"{len(manifest['feature_names'])}")
            loaded[name] = m
        return loaded[name]

    groups = manifest.get(KIND_GROUPS_KEY) or {}
    out: dict[str, dict[str, Any]] = {}
    for target, routes in manifest["boosters"].items():
        kg = KindGroups(groups[target], manifest["feature_names"]) if target in groups else None
        out[target] = {mode: booster(v) if kg is None else KindRouter(kg, {g: booster(n) for g, n in v.items()})
                       for mode, v in routes.items()}
    return out
