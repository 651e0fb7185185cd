"""fp16 operations of kinds the training rows held only at bf16 are read as their bf16 twins on GPUs
with equal fp16 and bf16 peaks (gpurec.model.features.HALF_TWINS), and the tool that records
those kinds in models trained before `gpurec train` did."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from gpurec.model.features import (
    FEATURE_NAMES,
    FeatureBuilder,
    FeatureConfig,
    OpBlock,
    fp16_as_bf16_kinds,
    hardware_row,
)


def test_kinds_held_at_bf16_and_never_at_fp16_by_the_math_mode_the_rows_ran() -> None:
    fp32, fp16, bf16 = 0.0, 2.0, 3.0
    kinds = ["linear", "linear", "Conv2d", "Conv2d", "relu", "softmax", "LSTM"]
    # an LSTM under bf16 autocast runs in fp16: its row's math mode says so, whatever its label
    modes = [bf16, fp32, bf16, fp16, bf16, fp32, fp16]
    assert fp16_as_bf16_kinds(kinds, modes) == ("linear", "relu")
    assert fp16_as_bf16_kinds(["Conv2d"], [fp16]) == ()


def _block(rows: list[tuple[str, float]]) -> OpBlock:
    """One GEMM-sized operation per (kind, math mode code)."""
    v = np.zeros((len(rows), len(FEATURE_NAMES)))
    col = FEATURE_NAMES.index
    v[:, col("flops_total")], v[:, col("bytes_total")], v[:, col("output_elements")] = 2e9, 4e7, 1e6
    v[:, col("element_bytes")] = 2.0
    v[:, col("math_mode")] = [m for _, m in rows]
    return OpBlock(values=v, kinds=np.array([k for k, _ in rows], dtype=object),
                   training=np.zeros(len(rows), dtype=bool))


def test_an_fp16_operation_of_a_bf16_only_kind_reads_as_its_bf16_twin_where_the_peaks_are_equal() -> None:
    fp16, bf16 = 2.0, 3.0
    block = _block([("linear", fp16), ("linear", bf16), ("BatchNorm2d", fp16), ("BatchNorm2d", bf16)])
    before = block.values.copy()
    twins = FeatureBuilder(["linear", "BatchNorm2d"], FeatureConfig(fp16_as_bf16_kinds=("linear",)))
    plain = FeatureBuilder(["linear", "BatchNorm2d"], FeatureConfig())
    h100, v100 = hardware_row("H100")[None, :], hardware_row("V100")[None, :]

    x = twins.build(block, h100).X
    assert np.array_equal(x[0], x[1])  # equal fp16 and bf16 peaks: the twin's row
    assert not np.array_equal(x[2], x[3])  # a kind the rows hold at fp16 keeps its own math mode
    assert not np.array_equal(plain.build(block, h100).X[0], plain.build(block, h100).X[1])
    x = twins.build(block, v100).X  # a V100 has no bf16 tensor cores: fp16 is not bf16 there
    assert not np.array_equal(x[0], x[1])
    assert np.array_equal(block.values, before)  # the caller's block is not changed


def _copy_models(tmp_path: Path) -> Path:
    from gpurec.model.gemm import GEMM_FLOOR_KEY
    from gpurec.model.persist import default_model_dir, read_manifest, write_manifest

    out = tmp_path / "m"
    shutil.copytree(default_model_dir(), out)
    manifest = read_manifest(out)  # as models trained before the kinds were recorded
    manifest["feature_config"] = {k: v for k, v in manifest["feature_config"].items() if k != "fp16_as_bf16_kinds"}
    # without the unaligned-GEMM floor, which holds the head below at the same time at fp16 and bf16
    # (equal peaks) and so would hide what the twins do
    manifest.pop(GEMM_FLOOR_KEY, None)
    write_manifest(out, manifest)
    return out


def test_recording_the_kinds_makes_an_unseen_fp16_head_predict_as_its_bf16_twin(tmp_path: Path) -> None:
    """The held-out GPT's tied LM head (F.linear, held only at bf16 by the training rows) was
    predicted 40% faster at fp16 than at bf16 by the shipped boosters; with the kinds recorded,
    at the same time."""
    import torch

    from gpurec.model import load_predictor
    from gpurec.tools.precision_twins import fp16_twins_into

    models = _copy_models(tmp_path)

    def head_ms(precision: str) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p = load_predictor(models, check_data=False)
            e = p.predict("gpt_d768", (2, 256), gpu="H100", dtype=torch.long, precision=precision)
        ops = e.per_op
        return float(ops.loc[ops["kind"] == "linear", "time_ms"].sum())

    assert head_ms("fp16-mixed") != pytest.approx(head_ms("bf16-mixed"), rel=1e-3)  # the math mode moved it
    report = fp16_twins_into(models)
    assert "linear" in report["fp16_as_bf16_kinds"] and "Conv2d" not in report["fp16_as_bf16_kinds"]
    assert "LSTM" not in report["fp16_as_bf16_kinds"]  # bf16-mixed LSTM rows ran in fp16
    assert "LSTM" in report["kinds_by_precision_and_math_mode"]["bf16-mixed"]["fp16"]
    assert json.loads((models / "manifest.json").read_text())["feature_config"]["fp16_as_bf16_kinds"] == \
        report["fp16_as_bf16_kinds"]
    assert head_ms("fp16-mixed") == pytest.approx(head_ms("bf16-mixed"), rel=1e-6)


def test_training_rows_missing_from_the_tables_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpurec.dataset
    from gpurec.tools.precision_twins import TrainingRowsNotFound, fp16_twins_into

    models = _copy_models(tmp_path)
    load = gpurec.dataset.load_dataset

    def without_first_row(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        table = load(*args, **kwargs)
        return table.iloc[1:] if kwargs.get("table") == "operations" else table

    monkeypatch.setattr(gpurec.dataset, "load_dataset", without_first_row)
    with pytest.raises(TrainingRowsNotFound, match="not in the operation tables"):
        fp16_twins_into(models)
