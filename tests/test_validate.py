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

    hosts: list = []

    def predict(self, model, input_shape, mode="inference", gpu="H100", host=None):
        self.hosts.append(host)
        f = self.factors[gpu]
        per_op = pd.DataFrame({"kind": ["Conv2d", "ReLU"], "signature": ["a", "b"],
                               "time_ms": [2.0 * f, 0.5], "energy_mj": [600.0 * f, 50.0]})
        t, e = 10.0 * f, 3000.0 * f * f
        return SimpleNamespace(time_ms=t, energy_mj=e, power_w=e / t, measured_gpu=gpu != "NVIDIA A100-SXM4-80GB",
                               time_low_ms=t * 0.9, time_high_ms=t * 1.1, energy_low_mj=e * 0.9,
                               energy_high_mj=e * 1.1, per_op=per_op, uncovered=None,
                               gpu_time_ms=2.5 * f, gpu_energy_mj=900.0 * f, host_time_ms=t, bound="host",
                               host=getattr(host, "name", "reference"))


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
    import gpurec.validate.run as val_run

    monkeypatch.setattr(val_run, "load_predictor_or_none", lambda: None)
    rec = val.validate("resnet18", 8, 224, "training", log_path=log, measurement=MEAS)
    assert rec["prediction"].startswith("pending") and "predicted_time_ms" not in rec
    assert "pending" in val.render(rec)
    assert val.complete_log(log, predictor=FakePredictor()) == 1
    done = val.load_log(log)[0]
    assert done["predicted_time_ms"] == pytest.approx(8.0) and "prediction" not in done
    assert val.complete_log(log, predictor=FakePredictor()) == 0


def test_validate_compares_host_free_fields_bound_and_operations(tmp_path: Path) -> None:
    """Issue 13: each field (gpu_time_ms, gpu_energy_mj, time_ms with this host's profile,
    bound) is compared, and the per-operation comparison names the operations that carry the
    error."""
    from gpurec.host import run_host_bench

    host = run_host_bench(use_gpu=False, blocks=2, calls_per_block=3, name="this test's host")
    meas = {**MEAS, "gpu_time_ms": 2.5, "gpu_energy_mj": 600.0, "gpu_power_w": 240.0, "host_ms": 9.0,
            "captured": True, "host_bench": host.to_dict(), "in_network_kernel_sum_ms": 2.4,
            "in_network": {"position": [0, 1], "op_signature": ["a", "b"], "kernel_ms": [1.0, 0.55]}}
    p = FakePredictor()
    rec = val.validate("resnet18", 8, 224, "inference", log_path=tmp_path / "l.jsonl", predictor=p, measurement=meas)
    assert p.hosts[-1].name == "this test's host"  # predicted for the measuring host
    assert rec["predicted_host"] == "this test's host"
    assert rec["measured_bound"] == "host" and rec["bound_right"] is True  # 10 ms eager >= 1.2 x 2.5 ms
    assert rec["gpu_time_error_pct"] == pytest.approx((2.0 / 2.5 - 1) * 100)
    assert rec["gpu_energy_error_pct"] == pytest.approx((720.0 / 600.0 - 1) * 100)
    worst = rec["per_op_error"][0]
    assert worst["kind"] == "Conv2d" and worst["diff_ms"] == pytest.approx(1.6 - 1.0) and worst["same_operation"]
    assert "host-free" in val.render(rec)
    gpu_bound = {**meas, "time_ms": 2.6}
    rec = val.validate("resnet18", 8, 224, "inference", log_path=None, predictor=p, measurement=gpu_bound)
    assert rec["measured_bound"] == "gpu" and rec["bound_right"] is False


def test_sum_of_measured_ops_uses_host_free_rows_and_needs_every_operation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Host-free operation rows sum (with multiplicity) to compare with the graph; eager energy
    is summed only where the rows have it, and a missing operation leaves no sum at all."""
    import gpurec.dataset
    from gpurec.ops import extract_operations

    shape = (2, 3, 64, 64)
    ops = extract_operations("resnet18", shape, mode="inference", keep_sources=False)
    sigs = sorted({op.signature for op in ops})
    rows = pd.DataFrame({"op_signature": sigs, "mode": "inference", "time_ms": 0.3,
                         "gpu_time_ms": [0.1 + i for i in range(len(sigs))], "gpu_energy_mj": 2.0})
    expected = sum(0.1 + sigs.index(op.signature) for op in ops)
    monkeypatch.setattr(gpurec.dataset, "load_dataset", lambda gpu, root=None: rows)
    s = val.sum_of_measured_ops("resnet18", shape, "inference", "NVIDIA H100 80GB HBM3")
    assert s["coverage"] == 1.0 and s["ops"] == len(ops) > len(sigs)
    assert s["sum_gpu_time_ms"] == pytest.approx(expected)
    assert s["sum_gpu_energy_mj"] == pytest.approx(2.0 * len(ops))
    assert s["sum_time_ms"] == pytest.approx(0.3 * len(ops)) and "sum_energy_mj" not in s
    rec = val.validate("resnet18", 2, 64, "inference", log_path=None, predictor=FakePredictor(),
                       measurement={**MEAS, "gpu_time_ms": expected / 2, "gpu_energy_mj": 1.0})
    assert rec["opsum_gpu_time_error_pct"] == pytest.approx(100.0)
    missing = rows.assign(gpu_time_ms=[float("nan")] + [0.1] * (len(sigs) - 1))
    monkeypatch.setattr(gpurec.dataset, "load_dataset", lambda gpu, root=None: missing)
    s = val.sum_of_measured_ops("resnet18", shape, "inference", "NVIDIA H100 80GB HBM3")
    assert "sum_gpu_time_ms" not in s and "sum_time_ms" in s


class AskedPredictor(FakePredictor):
    """The fake predictor, remembering the input and precision each prediction was asked for."""

    def __init__(self) -> None:
        self.asked: list = []

    def predict(self, model, input_shape, mode="inference", gpu="H100", host=None, **kwargs):
        self.asked.append((model, tuple(input_shape), kwargs.get("precision")))
        return super().predict(model, input_shape, mode, gpu, host)


def test_validate_a_sequence_model_at_a_mixed_precision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sequence model takes (batch, seq_len) token ids: the record keeps the sequence length
    and the precision, the prediction is asked for both, and a pending record is completed with
    the same input; fp32 classifiers are asked as before, with no precision named."""
    import gpurec.validate.run as val_run

    p = AskedPredictor()
    rec = val.validate("bert_d384_pre", 4, mode="training", log_path=None, predictor=p, measurement=MEAS,
                       seq_len=64, precision="bf16-mixed")
    assert p.asked[-1] == ("bert_d384_pre", (4, 64), "bf16-mixed")
    assert rec["seq_len"] == 64 and "resolution" not in rec and rec["precision"] == "bf16-mixed"
    assert val.record_input(rec) == ((4, 64), "bf16-mixed", "bert_d384_pre:b4:s64")
    assert "sequence length 64" in val.render(rec) and "at bf16-mixed" in val.render(rec)
    log = tmp_path / "log.jsonl"
    monkeypatch.setattr(val_run, "load_predictor_or_none", lambda: None)
    val.validate("gpt_d768", 2, mode="inference", log_path=log, measurement=MEAS, seq_len=256, precision="bf16-mixed")
    assert val.complete_log(log, predictor=p) == 1
    assert p.asked[-1] == ("gpt_d768", (2, 256), "bf16-mixed")
    rec = val.validate("resnet18", 2, 64, "inference", log_path=None, predictor=p, measurement=MEAS)
    assert p.asked[-1] == ("resnet18", (2, 3, 64, 64), None) and rec["precision"] == "fp32"
    with pytest.raises(ValueError, match="sequence length"):
        val.input_of("bert_d384_pre", 4)


def test_sum_of_measured_ops_takes_the_rows_of_its_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's identity is (gpu, precision, id): the same operation measured at another precision
    (listed first here) never stands in for the precision asked for."""
    import gpurec.dataset
    from gpurec.ops import extract_operations

    shape = (2, 3, 32, 32)
    ops = extract_operations("resnet18", shape, mode="inference", keep_sources=False)
    sigs = sorted({op.signature for op in ops})
    other = pd.DataFrame({"op_signature": sigs, "mode": "inference", "precision": "bf16-mixed", "time_ms": 9.0,
                          "gpu_time_ms": 5.0, "gpu_energy_mj": 5.0})
    fp32 = other.assign(precision=None, gpu_time_ms=1.0, gpu_energy_mj=1.0, time_ms=2.0)
    monkeypatch.setattr(gpurec.dataset, "load_dataset", lambda gpu, root=None: pd.concat([other, fp32]))
    s = val.sum_of_measured_ops("resnet18", shape, "inference", "NVIDIA H100 80GB HBM3")
    assert s["sum_gpu_time_ms"] == pytest.approx(1.0 * len(ops))


def test_live_records_on_two_gpus_give_the_measured_and_predicted_ratio() -> None:
    """The difference a ranking sells, checked live: per set, the median of each GPU's records
    (every machine) over the base GPU's, against the ratio of the estimates, in points."""
    from gpurec.reports.validation import _gpu_pairs

    def rec(gpu: str, t: float, e: float, **kw) -> dict:
        return {"model": "resnet50", "batch_size": 32, "resolution": 224, "mode": "inference", "gpu": gpu,
                "measured_gpu_time_ms": t, "measured_gpu_energy_mj": e, "_file": "live_x.jsonl", **kw}

    def est(t: float, e: float) -> SimpleNamespace:
        return SimpleNamespace(gpu_time_ms=t, gpu_energy_mj=e)

    recs = [rec("NVIDIA H100 80GB HBM3", 10.0, 100.0), rec("NVIDIA H100 80GB HBM3", 12.0, 120.0),
            rec("NVIDIA H200", 9.9, 99.0), rec("NVIDIA H200", 9.0, 80.0, precision="bf16-mixed")]
    ests = [est(10.0, 100.0), est(10.0, 100.0), est(8.0, 95.0), est(5.0, 50.0)]
    text = "\n".join(_gpu_pairs(recs, ests))
    # measured 9.9 / median(10, 12) = 0.900, predicted 0.800: -10.0 pp; energy 0.900 vs 0.950: +5.0 pp
    assert "| resnet50:b32:r224 | inference | NVIDIA H200 | 0.900 | 0.800 | -10.0 | 0.900 | 0.950 | +5.0 |" in text
    assert "bf16-mixed" not in text  # no H100 record at that precision: no pair
    assert "time 10.0 pp (bias -10.0 pp, n=1)" in text and "energy 5.0 pp (bias +5.0 pp, n=1)" in text
    assert _gpu_pairs(recs[:2], ests[:2]) == []


class _Packed(__import__("torch").nn.Module):
    """A classifier whose forward needs its inputs' values (lengths to pack)."""

    def __init__(self) -> None:
        from torch import nn

        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(20, 8), nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 2)

    def forward(self, ids, lengths):
        from torch import nn

        seq = nn.utils.rnn.pack_padded_sequence(self.emb(ids), lengths.cpu(), batch_first=True, enforce_sorted=False)
        return self.head(self.rnn(seq)[1][0][-1])


def test_a_module_unit_steps_a_copy_with_the_inputs_values() -> None:
    """validate_module's step: a copy of the caller's module (not moved, not trained), the example
    inputs' values kept (lengths to pack), keyword inputs passed by keyword, a backward in training."""
    import torch

    from gpurec.collect.runner import ModuleUnit

    model = _Packed()
    ids, lengths = torch.randint(0, 20, (3, 6)), torch.tensor([6, 2, 4])
    unit = ModuleUnit(model, (ids, lengths), "training", "cpu")
    assert unit.model is not model and torch.equal(unit.args[1], lengths)
    unit.step()
    assert all(p.grad is None for p in model.parameters()) and model.training
    assert unit.model.training
    kw = ModuleUnit(model, {"ids": ids, "lengths": lengths}, "inference", "cpu")
    assert kw.args == () and set(kw.kwargs) == {"ids", "lengths"} and not kw.model.training
    kw.step()
    cast = ModuleUnit(torch.nn.Linear(4, 2), torch.zeros(3, 4), "inference", "cpu", precision="bf16")
    assert cast.args[0].dtype == torch.bfloat16 and cast.model.weight.dtype == torch.bfloat16


class _ModulePredictor:
    """Answers predict(module, example_inputs=...) and keeps what it was asked."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def predict(self, model, input_shape=None, mode="inference", gpu="H100", host=None, example_inputs=None,
                **kwargs):
        self.calls.append({"model": model, "example_inputs": example_inputs, "mode": mode, "gpu": gpu, "host": host,
                           **kwargs})
        return SimpleNamespace(time_ms=12.0, energy_mj=2400.0, power_w=200.0, measured_gpu=True, gpu_time_ms=3.0,
                               gpu_energy_mj=600.0, host_time_ms=12.0, bound="host", host="this host",
                               per_op=pd.DataFrame(), uncovered=None)


def test_validate_module_compares_your_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller's module is predicted with its own example inputs for the measuring GPU and host
    and compared field by field; without xgboost the record says the prediction is pending;
    without a GPU, measuring is a typed error."""
    import torch

    import gpurec.validate.run as val_run
    from gpurec.device import NVMLUnavailable
    from gpurec.host import run_host_bench

    model = _Packed()
    inputs = (torch.randint(0, 20, (3, 6)), torch.tensor([6, 2, 4]))
    host = run_host_bench(use_gpu=False, blocks=2, calls_per_block=4)
    meas = {**MEAS, "gpu_time_ms": 2.5, "gpu_energy_mj": 500.0, "host_bench": host.to_dict()}
    predictor = _ModulePredictor()
    rec = val.validate_module(model, inputs, "training", predictor=predictor, measurement=meas, precision="bf16-mixed")
    (call,) = predictor.calls
    assert call["model"] is model and call["example_inputs"] is inputs and call["gpu"] == "NVIDIA H200"
    assert call["mode"] == "training" and call["precision"] == "bf16-mixed"
    assert call["host"].to_dict() == host.to_dict()
    assert rec["module"] and rec["model"] == "_Packed" and rec["input_shapes"] == [[3, 6], [3]]
    assert rec["time_error_pct"] == pytest.approx(20.0) and rec["gpu_time_error_pct"] == pytest.approx(20.0)
    assert rec["gpu_energy_error_pct"] == pytest.approx(20.0)
    # packing copies the host's lengths: the step is not captured, its GPU time is the eager one's
    eager = val.validate_module(model, inputs, "training", predictor=predictor,
                                measurement={**meas, "captured": False, "gpu_time_ms": 10.0})
    assert eager["measured_captured"] is False and "measured_bound" not in eager
    assert "gpu_time_error_pct" not in eager and "gpu_energy_error_pct" not in eager and "bound_right" not in eager
    assert eager["time_error_pct"] == pytest.approx(20.0)
    monkeypatch.setattr(val_run, "load_predictor_or_none", lambda: None)
    assert val.validate_module(model, inputs, measurement=MEAS)["prediction"].startswith("pending")
    if not torch.cuda.is_available():
        with pytest.raises(NVMLUnavailable, match="No CUDA GPU"):
            val.validate_module(model, inputs, predictor=predictor)
