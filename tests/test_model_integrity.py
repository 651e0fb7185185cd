"""An edited, swapped or incomplete model directory is refused; saves are atomic and sealed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpurec.model import IncompatibleModel, load_predictor
from gpurec.model.persist import (
    DIGEST_KEY,
    FILES_KEY,
    TRAINED_LOOKUP_KEY,
    manifest_digest,
    save_model,
    verify_model_files,
    write_manifest,
)

SHIPPED = Path(__file__).resolve().parents[1] / "models"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def models(tmp_path: Path) -> Path:
    return Path(shutil.copytree(SHIPPED, tmp_path / "models"))


def _manifest(d: Path) -> dict[str, Any]:
    return json.loads((d / "manifest.json").read_text())


def _write_raw(d: Path, m: dict[str, Any], reseal_digest: bool = False) -> None:
    """Write a manifest by hand, as an editor would (optionally recomputing only its digest)."""
    if reseal_digest:
        m[DIGEST_KEY] = manifest_digest(m)
    (d / "manifest.json").write_text(json.dumps(m, indent=1))


def _refused(d: Path, match: str) -> None:
    with pytest.raises(IncompatibleModel, match=match) as exc:
        load_predictor(d, check_data=False)
    assert "gpurec train" in str(exc.value)  # says how to fix it


def _booster_files(m: dict[str, Any]) -> set[str]:
    """Every booster file of a manifest: {mode: file}, or {mode: {group: file}} for a target with
    kind groups (schema 4)."""
    return {n for r in m["boosters"].values() for v in r.values() for n in ([v] if isinstance(v, str) else v.values())}


def _time_booster(m: dict[str, Any], mode: str) -> str:
    """A time booster file of ``mode`` (its first kind group's where the model has kind groups)."""
    v = m["boosters"]["time"][mode]
    return v if isinstance(v, str) else v[sorted(v)[0]]


def test_shipped_model_directory_is_sealed() -> None:
    m = _manifest(SHIPPED)
    verify_model_files(m, SHIPPED)
    trained = {m[TRAINED_LOOKUP_KEY]} if m.get(TRAINED_LOOKUP_KEY) else set()  # kept by refresh-lookup
    assert set(m[FILES_KEY]) == {*_booster_files(m), m["measured_lookup"], "report.json", *trained}


def test_reformatting_the_manifest_is_not_an_edit(models: Path) -> None:
    m = _manifest(models)
    (models / "manifest.json").write_text(json.dumps(m, indent=4, sort_keys=False))
    assert load_predictor(models, check_data=False).predict("resnet18", (1, 3, 224, 224), gpu="H100").time_ms > 0


@pytest.mark.parametrize("edit", ["correction_scale_x3", "cv_scores", "schema_of_a_file"])
def test_an_edited_manifest_is_refused(models: Path, edit: str) -> None:
    m = _manifest(models)
    if edit == "correction_scale_x3":
        key = sorted(m["network_correction"]["time_coef"])[0]  # per GPU or pooled ("*|mode")
        m["network_correction"]["time_coef"][key]["scale"] *= 3
    elif edit == "cv_scores":
        m["cv"]["grouped_kfold_per_op"]["time"]["mape"] = 1.0
    else:
        m[FILES_KEY]["report.json"] = "0" * 64
    _write_raw(models, m)
    _refused(models, "was edited after it was written")


def test_a_manifest_without_digest_is_refused(models: Path) -> None:
    m = _manifest(models)
    del m[DIGEST_KEY]
    _write_raw(models, m)
    _refused(models, f"no {DIGEST_KEY}")


def test_a_swapped_booster_without_its_hash_entry_is_refused(models: Path) -> None:
    m = _manifest(models)
    name = _time_booster(m, "training")
    shutil.copy(models / _time_booster(m, "inference"), models / name)
    _refused(models, f"{name} in .* differs")
    del m[FILES_KEY][name]
    _write_raw(models, m)
    _refused(models, "edited")
    _write_raw(models, m, reseal_digest=True)  # even with a matching digest: every read file needs a hash
    _refused(models, f"{name} is read from .* no sha256 entry")


def test_scaled_measured_table_without_its_hash_entry_is_refused(models: Path) -> None:
    m = _manifest(models)
    lookup = models / m["measured_lookup"]
    df = pd.read_parquet(lookup)
    df["time_ms"] *= 10
    df.to_parquet(lookup, index=False)
    _refused(models, "measured_ops.parquet in .* differs")
    del m[FILES_KEY]["measured_ops.parquet"]
    _write_raw(models, m, reseal_digest=True)
    _refused(models, "measured_ops.parquet is read from .* no sha256 entry")


def test_missing_or_changed_files_are_refused(models: Path) -> None:
    (models / "report.json").write_text((models / "report.json").read_text().replace('"', "'", 1))
    _refused(models, "report.json in .* differs")
    (models / "report.json").unlink()
    _refused(models, "report.json is missing")


# -- saving ------------------------------------------------------------------------------------

class _Booster:
    def __init__(self, payload: bytes):
        self.payload = payload

    def save(self, path: Path) -> None:
        Path(path).write_bytes(self.payload)


class _Routed:
    def __init__(self, payload: bytes):
        self.route = {"inference": "all", "training": "all"}
        self.models = {"all": _Booster(payload)}


class _Lookup:
    def to_parquet(self, path: Path) -> None:
        pd.DataFrame({"time_ms": [1.0]}).to_parquet(path, index=False)


def test_save_model_seals_every_file(tmp_path: Path) -> None:
    out = tmp_path / "m"
    save_model(out, {"time": _Routed(b"t1")}, {"schema_version": 2, "note": "x"}, {"cv": 1}, _Lookup())
    m = _manifest(out)
    assert set(m[FILES_KEY]) == {"time_all.ubj", "measured_ops.parquet", "report.json"}
    assert m[DIGEST_KEY] == manifest_digest(m) and "booster_sha256" not in m
    verify_model_files(m, out)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "measured_ops.parquet", "report.json",
                                                    "time_all.ubj"]  # no temporary files left


def _usable(out: Path) -> dict:
    m = _manifest(out)
    verify_model_files(m, out)
    return m


@pytest.mark.parametrize("fail_at", ["report.json", "booster"])
def test_a_failed_save_leaves_the_previous_model_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       fail_at: str) -> None:
    out = tmp_path / "m"
    save_model(out, {"time": _Routed(b"old")}, {"n": 1}, {"cv": 1}, _Lookup())
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_replace = os.replace

    def failing_replace(src: Any, dst: Any) -> None:
        if str(dst).endswith("report.json"):
            raise OSError("No space left on device")
        real_replace(src, dst)

    new = _Routed(b"new")
    if fail_at == "report.json":
        monkeypatch.setattr(os, "replace", failing_replace)
    else:
        def full(path: Path) -> None:
            Path(path).write_bytes(b"ne")
            raise OSError("No space left on device")
        new.models["all"].save = full  # type: ignore[method-assign]
    with pytest.raises(OSError, match="No space left"):
        save_model(out, {"time": new}, {"n": 2}, {"cv": 2}, _Lookup())
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the previous model, untouched
    assert _usable(out)["n"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no staging directory left behind


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_a_save_swaps_the_new_model_in_and_keeps_other_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             exchange: bool) -> None:
    if not exchange:
        from gpurec.model import persist

        monkeypatch.setattr(persist, "_exchange", lambda a, b: False)
    out = tmp_path / "m"
    save_model(out, {"time": _Routed(b"old")}, {"n": 1}, {"cv": 1}, _Lookup())
    (out / "NOTES.md").write_text("kept\n")
    os.chmod(out, 0o750)
    routed = _Routed(b"new")
    routed.route = {"inference": "inf", "training": "trn"}
    routed.models = {"inf": _Booster(b"i"), "trn": _Booster(b"t")}
    save_model(out, {"time": routed}, {"n": 2}, {"cv": 2}, None)
    m = _usable(out)
    assert m["n"] == 2 and (out / "time_inf.ubj").read_bytes() == b"i"
    assert sorted(p.name for p in out.iterdir()) == ["NOTES.md", "manifest.json", "report.json", "time_inf.ubj",
                                                    "time_trn.ubj"]  # the old generation's files are gone
    assert (os.stat(out).st_mode & 0o777) == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_train_checks_the_output_directory_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import cli
    from gpurec.model.fitting import training

    def no_training(*a: Any, **kw: Any) -> None:
        raise AssertionError("training started before the output directory was checked")

    monkeypatch.setattr(training, "prepare", no_training)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out, why in ((afile, "is a file"), (afile / "models", "cannot create")):
        with pytest.raises(ValueError, match=why):
            training.train(tmp_path, out)
        res = CliRunner().invoke(cli.app, ["train", "--data", str(tmp_path), "--out", str(out)])
        assert res.exit_code == 2 and why in res.output and "Traceback" not in res.output


def test_write_manifest_refuses_a_missing_file(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="a.ubj is missing"):
        write_manifest(tmp_path, {"boosters": {"time": {"inference": "a.ubj"}}})
