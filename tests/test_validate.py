"""validate and recommend with fake predictors and measurements (no GPU, no xgboost needed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

import gpurec.validate as val


class FakePredictor:
    """Time and energy scale with a per-GPU factor; only measured GPUs are 'measured'."""

    factors = {"NVIDIA H100 80GB HBM3": 1.0, "NVIDIA H200": 0.8, "NVIDIA A100-SXM4-80GB": 1.6}
    gpus = [SimpleNamespace(nvml_name=n) for n in factors]

    def predict(self, model, input_shape, mode="inference", gpu="H100"):
        f = self.factors[gpu]
        per_op = pd.DataFrame({"kind": ["Conv2d", "ReLU"], "signature": ["a", "b"],
                               "time_ms": [2.0 * f, 0.5], "energy_mj": [600.0 * f, 50.0]})
        t, e = 10.0 * f, 3000.0 * f * f
        return SimpleNamespace(time_ms=t, energy_mj=e, power_w=e / t, measured_gpu=gpu != "NVIDIA A100-SXM4-80GB",
                               time_low_ms=t * 0.9, time_high_ms=t * 1.1, energy_low_mj=e * 0.9,
                               energy_high_mj=e * 1.1, per_op=per_op, uncovered=None)


MEAS = {"gpu": "NVIDIA H200", "time_ms": 10.0, "energy_mj": 2000.0, "power_w": 200.0, "sm_clock_mhz": 1980}


def test_validate_compares_and_logs(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    rec = val.validate("resnet18", 8, 224, "inference", log_path=log, predictor=FakePredictor(), measurement=MEAS)
    assert rec["predicted_time_ms"] == pytest.approx(8.0)
    assert rec["time_error_pct"] == pytest.approx(-20.0)
    assert rec["energy_error_pct"] == pytest.approx((1920.0 / 2000.0 - 1) * 100)
    assert "opsum_coverage" in rec
    assert val.load_log(log)[0]["model"] == "resnet18"
    assert "predicted" in val.render(rec)


def test_validate_without_xgboost_measures_then_completes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "log.jsonl"
    monkeypatch.setattr(val, "_load_predictor_or_none", lambda: None)
    rec = val.validate("resnet18", 8, 224, "training", log_path=log, measurement=MEAS)
    assert rec["prediction"].startswith("pending") and "predicted_time_ms" not in rec
    assert "pending" in val.render(rec)
    assert val.complete_log(log, predictor=FakePredictor()) == 1
    done = val.load_log(log)[0]
    assert done["predicted_time_ms"] == pytest.approx(8.0) and "prediction" not in done
    assert val.complete_log(log, predictor=FakePredictor()) == 0
