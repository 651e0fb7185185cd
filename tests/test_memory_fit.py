"""The terms of the peak-memory estimate (gpurec.ops.memory) and their fit (gpurec.model.fitting.memory_fit)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
from torch import nn

from gpurec.model.fitting.memory_fit import (
    LEFTOVER_LIMIT_BYTES,
    fit_memory,
    leftover_reason,
    peak_table,
)
from gpurec.model.memory import MemoryFitError, load_memory_fit, memory_fit_from_dict, memory_fit_to_dict
from gpurec.ops import extract_operations
from gpurec.ops.memory import MemoryFit, MemoryTerms, memory_terms, step_memory

TERMS = ("floor_bytes", "activations", "largest", "conv_io", "matmul_io", "rnn")


def blk(n: int) -> int:
    return -(-n // 512) * 512


def _coefs(**kw: float) -> dict[str, float]:
    return {n: float(kw.get(n, 0.0)) for n in TERMS}


def test_each_tensor_takes_whole_512_byte_blocks() -> None:
    ops = extract_operations(nn.Linear(10, 3, bias=False), (1, 10), keep_sources=False)
    t = memory_terms(ops, "inference")
    # the input (40 B) and the output (12 B) each take one 512-byte block
    assert t.activations_bytes == 2 * 512


@pytest.mark.parametrize("act, copies", [(nn.Hardtanh(0.0, 6.0, inplace=True), 1), (nn.ReLU(inplace=True), 0),
                                         (nn.SiLU(inplace=True), 1)])
def test_in_place_activation_keeps_a_copy_only_when_backward_needs_its_input(act: nn.Module, copies: int) -> None:
    """ReLU6 / SiLU in place: autograd keeps the input they overwrite; ReLU in place needs only its result."""
    net = nn.Sequential(nn.Linear(64, 256, bias=False), act, nn.Linear(256, 8, bias=False))
    base = nn.Sequential(nn.Linear(64, 256, bias=False), nn.ReLU(inplace=True), nn.Linear(256, 8, bias=False))
    batch = 32
    with_act = memory_terms(extract_operations(net, (batch, 64), mode="training", keep_sources=False), "training")
    ref = memory_terms(extract_operations(base, (batch, 64), mode="training", keep_sources=False), "training")
    assert with_act.saved_bytes - ref.saved_bytes == copies * blk(batch * 256 * 4)


@pytest.mark.parametrize("kind, gates", [(nn.LSTM, 4), (nn.GRU, 3)])
def test_cudnn_rnn_term_scales_with_layers_directions_sequence_batch_hidden_and_gates(kind: type, gates: int) -> None:
    layers, hidden, batch, seq = 2, 32, 4, 10

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = kind(16, hidden, num_layers=layers, bidirectional=True, batch_first=True)

        def forward(self, x):  # noqa: ANN001, ANN201
            return self.rnn(x)[0]

    for mode in ("inference", "training"):
        t = memory_terms(extract_operations(Net(), (batch, seq, 16), mode=mode, keep_sources=False), mode)
        assert t.rnn_bytes == layers * 2 * seq * batch * hidden * gates * 4
        fit = MemoryFit({mode: _coefs(rnn=2.0)}, {"rows": {}})
        assert fit.apply(t).workspace_bytes == 2 * t.rnn_term_bytes > 0  # cuDNN's reserve space / workspace
    # a model without an RNN has none
    assert memory_terms(extract_operations(nn.Linear(4, 4), (2, 4), keep_sources=False)).rnn_bytes == 0


def test_bf16_halves_activations_and_parameters_and_the_rnn_term() -> None:
    net = nn.Sequential(nn.Linear(256, 512, bias=False), nn.Tanh(), nn.Linear(512, 256, bias=False))
    lstm = nn.LSTM(64, 128, batch_first=True)
    for mode in ("inference", "training"):
        fp32 = memory_terms(extract_operations(net, (64, 256), mode=mode, keep_sources=False), mode)
        bf16 = memory_terms(extract_operations(net, (64, 256), mode=mode, keep_sources=False, precision="bf16"), mode)
        assert bf16.activations_bytes * 2 == fp32.activations_bytes
        assert bf16.params_bytes * 2 == fp32.params_bytes
        # recurrent layers are extracted in fp32 only so far: the same LSTM operation in bfloat16
        ops = extract_operations(lstm, (8, 16, 64), mode=mode, keep_sources=False)
        r32 = memory_terms(ops, mode)
        r16 = memory_terms([dataclasses.replace(op, dtype="bfloat16") for op in ops], mode)
        assert r16.rnn_bytes * 2 == r32.rnn_bytes > 0


def test_largest_convolution_and_matmul_inputs_plus_outputs() -> None:
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 1, 1), nn.Flatten(), nn.Linear(16 * 16, 10))
    t = memory_terms(extract_operations(net, (2, 3, 16, 16), keep_sources=False), "inference")
    assert t.conv_io_bytes == 2 * (3 + 8) * 16 * 16 * 4  # the first convolution's input plus output
    assert t.matmul_io_bytes == 2 * (16 * 16 + 10) * 4


def test_fitted_floor_and_terms_add_to_the_analytic_part_per_mode() -> None:
    t = MemoryTerms("training", 1000, 1000, 5000, 700, 300, 200, 100)
    fit = MemoryFit({"training": {"floor_bytes": 64e6, "activations": 1.0, "largest": 2.0, "conv_io": 0.5,
                                  "matmul_io": 1.0, "rnn": 3.0}}, {"rows": {}})
    m = fit.apply(t)
    assert m.floor_bytes == 64_000_000
    assert m.activations_bytes == 5000 + 2 * 700
    assert m.workspace_bytes == 150 + 200 + 300
    assert m.total_bytes == 2000 + 6400 + 64_000_000 + 650
    with pytest.raises(KeyError, match="fit-memory"):
        fit.apply(MemoryTerms("inference", 1, 0, 1, 1, 0, 0, 0))
    plain = step_memory(extract_operations(nn.Linear(4, 4), (2, 4), keep_sources=False), "inference")
    assert plain.floor_bytes == 0 and plain.workspace_bytes == 0  # without a fit: the analytic part alone


def _table(rows: list[dict]) -> pd.DataFrame:
    base = {"gpu": "H100", "item": "peak", "precision": "fp32", "family": "torchvision", "leftover_suspect": ""}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_fit_recovers_the_terms_from_trusted_training_rows_only() -> None:
    truth = {"inference": _coefs(floor_bytes=70e6, activations=1.0, conv_io=1.5, matmul_io=1.2, rnn=2.0),
             "training": _coefs(floor_bytes=60e6, activations=1.0, largest=1.6, matmul_io=0.5, rnn=3.0)}
    rows, terms = [], []
    for mode in ("inference", "training"):
        for i in range(12):
            t = MemoryTerms(mode, 10_000_000 * (i + 1), 10_000_000 * (i + 1) if mode == "training" else 0,
                            30_000_000 * (i % 5 + 1), 9_000_000 * (i % 3 + 1), 8_000_000 * (i % 4),
                            5_000_000 * (i % 2), 4_000_000 * (i % 6 == 0) * (i + 1))
            exact = MemoryFit(truth, {"rows": {}}).apply(t).total_bytes
            rows.append({"mode": mode, "split": "training", "measured_bytes": float(exact), "arch": f"a{i}"})
            terms.append(t)
            # held-out rows and leftover-suspect rows must not move the fit
            rows.append({"mode": mode, "split": "held-out", "measured_bytes": float(exact) * 3, "arch": f"h{i}"})
            terms.append(t)
            rows.append({"mode": mode, "split": "training", "measured_bytes": float(exact) + 3e9, "arch": f"s{i}",
                         "leftover_suspect": "network row measured after earlier rows, without a collection first"})
            terms.append(t)
    fit = fit_memory(_table(rows), terms)
    for mode, coefs in truth.items():
        for name, value in coefs.items():
            assert fit.terms[mode][name] == pytest.approx(value, rel=1e-4, abs=1e-3), (mode, name)
    assert fit.provenance["rows"]["training"]["rows"] == 12
    assert sum(fit.provenance["excluded_leftover_suspect"].values()) == 24
    with pytest.raises(ValueError, match="no trusted training-architecture peak"):
        fit_memory(_table([r for r in rows if r["mode"] == "training"]),
                   [t for r, t in zip(rows, terms, strict=True) if r["mode"] == "training"])


def test_a_peak_is_trusted_only_when_nothing_else_was_allocated() -> None:
    assert leftover_reason("network", None) is not None  # measured after other rows, no collection
    assert leftover_reason("network", float("nan")) is not None
    assert leftover_reason("peak", None) is None  # a fresh unit per row
    assert leftover_reason("network", 40 * 2**20) is None  # cuBLAS workspaces stay allocated: fine
    assert "MiB allocated before" in leftover_reason("peak", LEFTOVER_LIMIT_BYTES + 1)


def test_peak_table_keeps_every_row_and_marks_the_suspect_ones(tmp_path: Path) -> None:
    d = tmp_path / "h100"
    d.mkdir()
    pd.DataFrame({"gpu": ["NVIDIA H100 80GB HBM3"] * 3, "id": ["a", "b", "c"], "item": ["network"] * 3,
                  "set_key": ["resnet18:b2:r224", "lstm_lm_3x768:b8:s96", "gpt_d512:b1:s128"],
                  "mode": ["training"] * 3, "time_ms": [1.0] * 3, "peak_memory_bytes": [1e8, 2e9, 3e8],
                  "memory_allocated_before_bytes": [None, 5e9, 1e6]}).to_parquet(d / "networks.parquet")
    t = peak_table(tmp_path).set_index("id")
    assert list(t["family"]) == ["torchvision", "rnn", "transformer"]
    assert list(t["split"]) == ["training", "held-out", "training"]
    assert t.loc["a", "leftover_suspect"] and t.loc["b", "leftover_suspect"] and not t.loc["c", "leftover_suspect"]


def test_memory_json_is_checked_when_loaded(tmp_path: Path) -> None:
    assert load_memory_fit(tmp_path) is None  # no fit: the analytic estimate
    good = {"schema": 1, "terms": {"inference": _coefs(floor_bytes=1.0), "training": _coefs(rnn=2.0)},
            "provenance": {"rows": {"inference": {"rows": 3}}}}
    (tmp_path / "memory.json").write_text(json.dumps(good))
    fit = load_memory_fit(tmp_path)
    assert fit is not None and fit.terms["training"]["rnn"] == 2.0
    assert memory_fit_to_dict(fit) == good
    for bad, match in [({**good, "schema": 0}, "schema"),
                       ({**good, "terms": {"inference": good["terms"]["inference"]}}, "modes"),
                       ({**good, "terms": {**good["terms"], "training": {**_coefs(), "rnn": -1.0}}}, "non-negative"),
                       ({**good, "terms": {**good["terms"], "training": {"rnn": 1.0}}}, "exactly the terms"),
                       ({k: v for k, v in good.items() if k != "provenance"}, "provenance")]:
        with pytest.raises(MemoryFitError, match=match):
            memory_fit_from_dict(bad)
    (tmp_path / "memory.json").write_text("{")
    with pytest.raises(MemoryFitError, match="not JSON"):
        load_memory_fit(tmp_path)


def test_suspect_peaks_are_summarised_by_reason_not_listed_by_amount() -> None:
    """Hundreds of distinct amounts still allocated read as one reason with its range."""
    from gpurec.model.fitting.memory_fit import leftover_reason
    from gpurec.reports.accuracy import _suspect_reasons

    suspect = [{"allocated_before_bytes": mib * 2.0**20, "leftover_suspect": leftover_reason("peak", mib * 2.0**20)}
               for mib in (300, 1665, 260)]
    suspect.append({"allocated_before_bytes": None, "leftover_suspect": leftover_reason("network", None)})
    assert _suspect_reasons(suspect) == [
        "1: network row measured after earlier rows, without a collection first",
        "3: 260–1665 MiB still allocated before the step, after a garbage collection"]


def test_a_peak_above_its_gpus_library_floor_is_suspect(tmp_path: Path) -> None:
    """Every run starts at the GPU's library floor (65 or 71 MiB on the H100); an earlier row's
    leftover adds 60 MiB and more, and such a peak must not count as trusted."""
    floor = 65 * 2**20
    assert leftover_reason("peak", floor + 6 * 2**20, floor) is None  # another run's workspaces
    assert "MiB allocated before" in leftover_reason("peak", floor + 66 * 2**20, floor)
    assert leftover_reason("peak", floor + 66 * 2**20) is None  # without a floor: the absolute limit only
    d = tmp_path / "h100"
    d.mkdir()
    pd.DataFrame({"gpu": ["NVIDIA H100 80GB HBM3"] * 3, "id": ["a", "b", "c"], "item": ["peak"] * 3,
                  "set_key": ["resnet18:b2:r224"] * 3, "mode": ["inference"] * 3, "time_ms": [1.0] * 3,
                  "peak_memory_bytes": [1e8, 1e8, 2e8],
                  "memory_allocated_before_bytes": [floor, 71.2 * 2**20, 195 * 2**20]}).to_parquet(d / "networks.parquet")
    t = peak_table(tmp_path).set_index("id")
    assert not t.loc["a", "leftover_suspect"] and not t.loc["b", "leftover_suspect"]
    assert t.loc["c", "leftover_suspect"] == "195 MiB allocated before the step"
