"""gpurec.tools.probes on the CPU: the probe networks, and the comparison of measured rows with a
fake predictor (no GPU, no xgboost)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpurec.tools import probes


class _Fixed:
    """Predicts 2 ms eager, 1 ms and 300 mJ host-free for everything; keeps the hosts asked for."""

    def __init__(self) -> None:
        self.hosts: list = []

    def predict(self, model, example_inputs=None, mode="inference", gpu="H100", host=None):
        self.hosts.append(host)
        return SimpleNamespace(time_ms=2.0, energy_mj=400.0, power_w=200.0, gpu_time_ms=1.0, gpu_energy_mj=300.0,
                               measured_gpu=True, host_time_ms=2.0, bound="host", host="h", per_op=None)


def test_the_probe_networks_run_on_their_inputs() -> None:
    for name in probes.RNN_NETWORKS:
        ids, lengths = probes.rnn_example_inputs(name)
        assert probes.rnn_network(name)(ids[:2, :9], lengths[:2].clamp(max=9)).shape[0] == 2
    short = probes.rnn_example_inputs("lstm_cls_packed_varlen")[1]
    assert short.min() >= 8 and short.max() <= probes.STEPS and len(set(short.tolist())) > 1
    with pytest.raises(KeyError, match="unknown probe network"):
        probes.rnn_network("resnet50")


def test_compare_keeps_failures_and_uses_host_free_only_where_captured(tmp_path: Path) -> None:
    rows = [{"network": "lstm_cls_padded", "mode": "inference", "status": "ok", "gpu": "NVIDIA H200",
             "time_ms": 4.0, "energy_mj": 900.0, "captured": True, "gpu_time_ms": 0.5, "gpu_energy_mj": 200.0},
            {"network": "lstm_cls_packed", "mode": "training", "status": "ok", "gpu": "NVIDIA H200",
             "time_ms": 1.0, "energy_mj": 300.0, "captured": False, "gpu_time_ms": 0.9, "gpu_energy_mj": 250.0},
            {"network": "grucell_lm", "mode": "training", "status": "failed", "error": "RuntimeError: x"}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    padded, packed, failed = probes.compare_rnn(path, predictor=_Fixed())
    assert padded["time_error_pct"] == pytest.approx(-50.0) and padded["gpu_time_error_pct"] == pytest.approx(100.0)
    assert padded["gpu_energy_error_pct"] == pytest.approx(50.0)
    assert packed["time_error_pct"] == pytest.approx(100.0) and "gpu_time_error_pct" not in packed
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: x"


def test_complete_predicts_with_the_measuring_hosts_profile(tmp_path: Path) -> None:
    from gpurec.host import run_host_bench

    host = run_host_bench(use_gpu=False, blocks=2, calls_per_block=4)
    rec = {"model": "grucell_lm", "mode": "inference", "gpu": "NVIDIA H200", "measured_time_ms": 4.0,
           "measured_energy_mj": 800.0, "measured_gpu_time_ms": 0.8, "measured_gpu_energy_mj": 240.0,
           "host_bench": host.to_dict(), "prediction": "pending"}
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(rec) + "\n" + json.dumps({"model": "lstmcell_lm", "mode": "training",
                                                         "status": "failed", "error": "E"}) + "\n")
    predictor = _Fixed()
    done, failed = probes.complete_rnn(path, predictor=predictor)
    assert predictor.hosts[0].to_dict() == host.to_dict() and "prediction" not in done
    assert done["time_error_pct"] == pytest.approx(-50.0) and done["gpu_time_error_pct"] == pytest.approx(25.0)
    assert failed == {"model": "lstmcell_lm", "mode": "training", "status": "failed", "error": "E"}
    assert json.loads(path.read_text().splitlines()[0])["prediction"] == "pending"  # the file is not rewritten
    # a record of older code that stated a bound and host-free figures for an uncaptured step
    path.write_text(json.dumps({**rec, "measured_captured": False, "measured_bound": "gpu"}) + "\n")
    (uncaptured,) = probes.complete_rnn(path, predictor=predictor)
    assert "gpu_time_error_pct" not in uncaptured and "bound_right" not in uncaptured
    assert uncaptured["time_error_pct"] == pytest.approx(-50.0)


def test_small_networks_are_validated_then_completed_now_and_as_trained(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """probe-small measures every small network through validate_module (a failure kept as a
    record), and complete adds the prediction, the one the models gave with the correction as
    trained (the floors and the non-recurrent coefficients off for that call only) and the
    operations' sum."""
    import gpurec.validate.run as val_run
    from gpurec.host import run_host_bench

    host = run_host_bench(use_gpu=False, blocks=2, calls_per_block=4)
    seen: list = []

    def measure(model, example_inputs, mode, gpu_index=0, min_window_s=1.0, precision="fp32"):
        seen.append((type(model).__name__, tuple(example_inputs[0].shape), mode))
        if len(seen) == 3:
            raise RuntimeError("CUDA error: out of memory")
        return {"gpu": "NVIDIA H200", "time_ms": 0.1, "energy_mj": 10.0, "power_w": 100.0, "gpu_time_ms": 0.02,
                "gpu_energy_mj": 3.0, "captured": True, "host_bench": host.to_dict()}

    monkeypatch.setattr(val_run, "measure_module", measure)
    monkeypatch.setattr(val_run, "load_predictor_or_none", lambda: None)  # as on the GPU machine
    monkeypatch.setattr(probes, "SMALL_BATCHES", (1, 8))
    path = tmp_path / "small.jsonl"
    recs = probes.validate_small(path, budget_s=100)
    assert len(recs) == len(path.read_text().splitlines()) == 2 * 2 * len(probes.SMALL_NETWORKS)
    assert seen[0] == ("Sequential", (1, 512), "inference") and seen[3] == ("Sequential", (1, 3, 32, 32), "training")
    assert recs[2]["status"] == "failed" and "out of memory" in recs[2]["error"] and recs[2]["network"] == "mlp256"

    class Floors:
        def __init__(self) -> None:
            self.correction = SimpleNamespace(time_floor_ms={"*|inference": 0.06},
                                              nonrecurrent_time_coef={"*|inference": {"scale": 1.0}})

        def predict(self, model, example_inputs=None, mode="inference", gpu="H100", host=None):
            assert host.to_dict() == host_profile.to_dict()
            c = self.correction  # both added after training on, or both off
            assert bool(c.time_floor_ms) == bool(c.nonrecurrent_time_coef)
            g = 0.025 if c.time_floor_ms else 0.1
            return SimpleNamespace(time_ms=0.2, energy_mj=8.0, power_w=40.0, gpu_time_ms=g, gpu_energy_mj=2.0,
                                   measured_gpu=True, host_time_ms=0.2, bound="host", host="h", per_op=None,
                                   op_sum_time_ms=0.01)

    host_profile = host
    predictor = Floors()
    done = probes.complete_small(path, predictor=predictor)
    assert predictor.correction.time_floor_ms == {"*|inference": 0.06}  # restored
    assert predictor.correction.nonrecurrent_time_coef == {"*|inference": {"scale": 1.0}}
    first = done[0]
    assert first["gpu_time_error_pct"] == pytest.approx(25.0) and first["as_trained_gpu_time_ms"] == 0.1
    assert first["op_sum_gpu_time_ms"] == 0.01 and "prediction" not in first
    assert done[2]["status"] == "failed" and "predicted_time_ms" not in done[2]
