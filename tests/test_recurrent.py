"""cuDNN recurrent layers timed from their sequential chain (gpurec.model.recurrent)."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpurec.model.fitting.recurrent_fit import fit_recurrent
from gpurec.model.recurrent import PowerFit, RecurrentPower, RecurrentTime, recurrent_shape

NAMES = ["batch", "seq_len", "embed_dim", "out_features", "num_heads", "element_bytes", "math_mode",
         "mode_training", "flops", "kind=LSTM", "kind=GRU", "kind=conv2d"]


def _rows(specs: list[tuple[str, int, int, int, int, int]], training: bool = False) -> np.ndarray:
    """Feature rows (NAMES order) of recurrent layers: (kind, batch, seq, hidden, layers, directions)."""
    out = []
    for kind, b, s, h, layers, dirs in specs:
        out.append([b, s, h, h * dirs, layers * dirs, 4.0, 0.0, float(training), 1e9,
                    float(kind == "LSTM"), float(kind == "GRU"), 0.0])
    return np.array(out, dtype=np.float64)


def _true_ms(X: np.ndarray, layer_share: float = 0.5, direction_share: float = 0.0) -> np.ndarray:
    """A known chain: steps as in the module docstring, 2 us x batch^0.1 x (hidden / 256)^0.3 per step."""
    s = recurrent_shape(X, NAMES)
    a = np.where(s.directions > 1, 1.0, layer_share)
    steps = s.seq_len * (1 + a * (s.layers - 1)) * (1 + direction_share * (s.directions - 1))
    return steps * 2e-3 * s.batch ** 0.1 * (s.hidden / 256) ** 0.3


def _training_grid() -> list[tuple[str, int, int, int, int, int]]:
    archs = [("LSTM", 512, 2, 1), ("LSTM", 1024, 1, 1), ("GRU", 256, 2, 1), ("GRU", 512, 3, 2), ("LSTM", 256, 1, 2)]
    return [(k, b, s, h, layers, d) for k, h, layers, d in archs for b in (1, 8, 32, 128) for s in (32, 128)]


def test_chain_model_recovers_a_known_chain_and_extrapolates() -> None:
    specs = _training_grid()
    X = _rows(specs)
    groups = [f"{k}{h}x{layers}x{d}" for k, _, _, h, layers, d in specs]
    model, report = fit_recurrent(X, np.log(_true_ms(X)), np.full(len(X), "inference"), groups, NAMES)
    assert model is not None
    fit = model.fits["inference"]
    assert (fit.layer_share, fit.direction_share) == (0.5, 0.0)
    assert fit.loao_mape < 1e-4 and report["rows"]["inference"] == {"rows": 40, "architectures": 5}
    # unseen: deeper, longer, wider, bidirectional with two layers
    unseen = _rows([("LSTM", 8, 384, 768, 3, 1), ("GRU", 64, 384, 384, 2, 2), ("LSTM", 4, 1024, 2048, 4, 1)])
    got = np.exp(model.apply(np.zeros(len(unseen)), unseen, "inference"))
    assert got == pytest.approx(_true_ms(unseen), rel=1e-4)


def test_layers_below_the_minimum_hidden_size_are_counted_not_fitted() -> None:
    """cuDNN's small-hidden regime (no pipelining, a slow step) must not bend the form fitted on
    the layers real architectures use; the rows it leaves out are reported."""
    from gpurec.model.fitting.recurrent_fit import MIN_HIDDEN

    specs = _training_grid()
    narrow = [(k, b, s, 192, layers, d) for k in ("LSTM", "GRU") for b in (1, 8, 32, 128) for s in (32, 128)
              for layers, d in ((1, 1), (3, 1), (2, 2))]
    assert 192 < MIN_HIDDEN
    X, Xn = _rows(specs), _rows(narrow)
    sn = recurrent_shape(Xn, NAMES)
    slow_ms = sn.seq_len * sn.layers * sn.directions * 6e-3 * np.where(sn.batch >= 128, 3.5, 1.0)
    groups = [f"{k}{h}x{layers}x{d}" for k, _, _, h, layers, d in specs] + ["sweep"] * len(narrow)
    model, report = fit_recurrent(np.vstack([X, Xn]), np.log(np.concatenate([_true_ms(X), slow_ms])),
                                  np.full(len(X) + len(Xn), "inference"), groups, NAMES)
    assert model is not None
    assert report["rows"]["inference"] == {"rows": 40, "architectures": 5, f"rows_below_hidden_{MIN_HIDDEN}": 48}
    fit = model.fits["inference"]
    assert fit.loao_mape < 1e-4 and fit.ranges is not None and fit.ranges[2] == 256.0
    unseen = _rows([("LSTM", 8, 384, 768, 3, 1)])
    assert np.exp(model.apply(np.zeros(1), unseen, "inference")) == pytest.approx(_true_ms(unseen), rel=1e-4)


def test_a_sweep_with_many_rows_weighs_as_one_architecture() -> None:
    """An operation sweep measured in six times the rows of five real architectures, on another
    chain (directions one after the other, steps growing faster with the hidden size), must not
    choose the form for them: weighted by row, the real architectures were 30% off."""
    specs = _training_grid()
    sweep = [(k, b, s, h, layers, d) for k in ("LSTM", "GRU") for b in (1, 8, 32, 128) for s in (32, 128)
             for h in (448, 576, 896) for layers, d in ((1, 1), (2, 1), (3, 1), (1, 2), (2, 2))]
    X, Xs = _rows(specs), _rows(sweep)
    sweep_ms = _true_ms(Xs, direction_share=1.0) * (recurrent_shape(Xs, NAMES).hidden / 512) ** 0.6
    groups = [f"{k}{h}x{layers}x{d}" for k, _, _, h, layers, d in specs] + ["sweep"] * len(sweep)
    model, _ = fit_recurrent(np.vstack([X, Xs]), np.log(np.concatenate([_true_ms(X), sweep_ms])),
                             np.full(len(X) + len(Xs), "inference"), groups, NAMES)
    assert model is not None and len(sweep) == 6 * len(specs)
    got = np.exp(model.apply(np.zeros(len(X)), X, "inference"))
    assert np.mean(np.abs(got / _true_ms(X) - 1)) < 0.15


def test_only_recurrent_fp32_rows_of_the_fitted_mode_are_replaced() -> None:
    X = _rows(_training_grid())
    model, _ = fit_recurrent(X, np.log(_true_ms(X)), np.full(len(X), "inference"),
                             [str(i % 5) for i in range(len(X))], NAMES)
    assert model is not None
    conv = np.zeros((1, len(NAMES)))
    conv[0, NAMES.index("kind=conv2d")] = 1.0
    half = _rows([("LSTM", 8, 64, 512, 1, 1)])
    half[0, NAMES.index("element_bytes")] = 2.0  # a bfloat16 layer: the fp32 fit says nothing about it
    lstm = _rows([("LSTM", 8, 64, 512, 1, 1)])
    X2 = np.vstack([conv, half, lstm, lstm])
    base = np.array([1.0, 2.0, 3.0, 4.0])
    out = model.apply(base, X2, np.array(["inference", "inference", "inference", "training"]))
    assert out[[0, 1, 3]] == pytest.approx(base[[0, 1, 3]])  # conv, bf16, a mode without a fit: untouched
    assert np.exp(out[2]) == pytest.approx(_true_ms(lstm)[0], rel=1e-4)


def test_too_few_architectures_give_no_model() -> None:
    X = _rows(_training_grid()[:16])  # two architectures
    model, report = fit_recurrent(X, np.log(_true_ms(X)), np.full(len(X), "inference"),
                                  ["a"] * 8 + ["b"] * 8, NAMES)
    assert model is None and report["rows"]["inference"]["architectures"] == 2


def test_round_trip_through_the_manifest_dict() -> None:
    X = _rows(_training_grid())
    model, _ = fit_recurrent(X, np.log(_true_ms(X)), np.full(len(X), "inference"),
                             [str(i % 5) for i in range(len(X))], NAMES)
    again = RecurrentTime.from_dict(model.as_dict(), NAMES)
    assert again is not None and RecurrentTime.from_dict(None, NAMES) is None
    assert again.apply(np.zeros(len(X)), X, "inference") == pytest.approx(model.apply(np.zeros(len(X)), X,
                                                                                       "inference"))


def test_routed_time_model_applies_its_override() -> None:
    from gpurec.model.regressors import Routed

    class Flat:
        def fit(self, X, y, margin, feature_names=None):  # noqa: ANN001, ANN201
            return self

        def predict(self, X, margin):  # noqa: ANN001, ANN201
            return np.zeros(len(X))

    X = _rows(_training_grid())
    r = Routed(Flat, min_rows=1).fit(X, np.zeros(len(X)), np.zeros(len(X)), np.full(len(X), "inference"))
    assert r.predict(X, np.zeros(len(X)), np.full(len(X), "inference")) == pytest.approx(0.0)
    r.override, _ = fit_recurrent(X, np.log(_true_ms(X)), np.full(len(X), "inference"),
                                  [str(i % 5) for i in range(len(X))], NAMES)
    assert np.exp(r.predict(X, np.zeros(len(X)), np.full(len(X), "inference"))) == pytest.approx(_true_ms(X), rel=1e-4)


def test_recurrent_rows_keep_their_elapsed_time_not_the_in_network_kernel_sum() -> None:
    from gpurec.model.fitting.data import with_targets

    ops = pd.DataFrame({
        "gpu": "NVIDIA H100 80GB HBM3", "mode": "inference", "op_signature": ["lstm1", "lin1"],
        "set_key": ["lstm_lm_2x512:b8:s32", "lstm_lm_2x512:b8:s32"], "op_kind": ["LSTM", "linear"],
        "gpu_time_ms": [1.0, 0.2], "gpu_power_w": [200.0, 300.0], "captured": True, "schema": 2,
        "time_ms": [5.0, 0.3], "power_w": [150.0, 250.0], "host_ms": [4.0, 0.05]})
    in_net = pd.DataFrame({"gpu": "NVIDIA H100 80GB HBM3", "mode": "inference", "op_signature": ["lstm1", "lin1"],
                           "set_key": "lstm_lm_2x512:b8:s32", "kernel_ms": [1.45, 0.18]})
    out, _, info, _ = with_targets(ops, pd.DataFrame(), in_net, "auto", "in_network")
    t = out.set_index("op_signature")["_t_gpu"]
    assert t["lstm1"] == pytest.approx(1.0)  # concurrent streams: the kernel sum over-counts
    assert t["lin1"] == pytest.approx(0.18)  # every other kind takes its in-network time
    assert info["in_network_rows"] == 1
    # models trained before it took the kernel sum: their data hash is computed that way
    old, _, info, _ = with_targets(ops, pd.DataFrame(), in_net, "auto", "in_network", recurrent_elapsed=False)
    assert old.set_index("op_signature")["_t_gpu"]["lstm1"] == pytest.approx(1.45)
    assert info["in_network_rows"] == 2 and info["recurrent_elapsed"] is False


def test_predictor_scales_a_recurrent_layer_with_its_chain() -> None:
    """With a recurrent model in the manifest, four times the sequence is four times the layer's time."""
    import torch

    from gpurec.model import load_predictor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = load_predictor(check_data=False)
        names = p.builder.feature_names
        rows = np.zeros((4, len(names)))
        for i, (b, s) in enumerate(((8, 32), (8, 128), (64, 32), (64, 128))):
            for k, v in {"batch": b, "seq_len": s, "embed_dim": 512, "out_features": 512, "num_heads": 2,
                         "element_bytes": 4, "kind=LSTM": 1}.items():
                rows[i, names.index(k)] = v
        model, _ = fit_recurrent(np.vstack([rows] * 3), np.log(np.tile([0.3, 1.2, 0.5, 2.0], 3)),
                                 np.full(12, "inference"), [str(i // 4) for i in range(12)], names)
        p.recurrent = model
        # and its power, 30% of the board's TDP whatever the shape
        p.recurrent_power = RecurrentPower({"inference": PowerFit(("log_batch", "log_hidden"), (np.log(0.3), 0.0, 0.0),
                                                                  0.0, 12, ("LSTM",))}, names)
        per_op = [p.predict("lstm_lm_2x512", (8, s), gpu="H100", dtype=torch.long).per_op for s in (96, 384)]
    t = [float(d.loc[d["kind"] == "LSTM", "time_ms"].sum()) for d in per_op]
    assert t[1] / t[0] == pytest.approx(4.0, rel=1e-6)
    from gpurec.catalog import resolve_gpu

    tdp = resolve_gpu("H100").features()["tdp_w"]
    assert per_op[0].loc[per_op[0]["kind"] == "LSTM", "power_w"].to_numpy() == pytest.approx([0.3 * tdp])


def test_coverage_of_a_recurrent_layer_is_judged_by_its_chain_model_inputs() -> None:
    """A layer the chain model predicts counts as covered when its batch and hidden size are
    within the fitted rows' (x tolerance), however long its sequence: FLOPs grow with the
    sequence, which the chain length extrapolates (a 3-layer bidirectional GRU at batch 128 x 512
    tokens read as 0% covered).  A batch far outside the fitted ones still warns."""
    import torch

    from gpurec import LowCoverageWarning
    from gpurec.model import load_predictor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = load_predictor(check_data=False)
    names = p.builder.feature_names
    specs = [(b, s) for b in (8, 64, 128) for s in (32, 128)]
    rows = np.zeros((len(specs), len(names)))
    for i, (b, s) in enumerate(specs):
        for k, v in {"batch": b, "seq_len": s, "embed_dim": 512, "out_features": 1024, "num_heads": 6,
                     "element_bytes": 4, "kind=GRU": 1}.items():
            rows[i, names.index(k)] = v
    model, _ = fit_recurrent(np.vstack([rows] * 3), np.log(np.tile([1e-3 * b * s for b, s in specs], 3)),
                             np.full(3 * len(specs), "inference"), [str(i // len(specs)) for i in range(3 * len(specs))],
                             names)
    assert model is not None and model.fits["inference"].ranges == (8.0, 128.0, 512.0, 512.0)
    p.recurrent = model
    with warnings.catch_warnings():
        warnings.simplefilter("error", LowCoverageWarning)
        est = p.predict("gru_cls_bi_3x512", (128, 2048), gpu="H100", dtype=torch.long)
    assert est.coverage > 0.99 and "GRU" not in set(est.uncovered["kind"])
    with pytest.warns(LowCoverageWarning):
        est = p.predict("gru_cls_bi_3x512", (1024, 128), gpu="H100", dtype=torch.long)
    assert "GRU" in set(est.uncovered["kind"])

    # a hidden size the boosters' rows may span but the chain model was not fitted on: the chain
    # model predicts it, so its range decides, with no tolerance below the smallest hidden size
    # fitted (cuDNN's small-hidden regime): 384 is below 512, though within 512 / tolerance 2
    class Narrow(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.GRU(128, 384, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rnn(x)[0]

    with pytest.warns(LowCoverageWarning):
        est = p.predict(Narrow(), (32, 64, 128), gpu="H100")
    (reason,) = est.uncovered.loc[est.uncovered["kind"] == "GRU", "uncovered_reason"].unique()
    assert "outside the recurrent form's fitted range" in reason


def test_power_is_a_share_of_the_tdp_from_batch_and_hidden() -> None:
    from gpurec.model.fitting.recurrent_fit import fit_recurrent_power

    names = [*NAMES, "hw_tdp_w"]
    X = np.column_stack([_rows(_training_grid()), np.full(40, 700.0)])
    s = recurrent_shape(X, names)
    share = 0.2 * s.batch ** 0.15 * (s.hidden / 256) ** 0.2  # a known law
    model, report = fit_recurrent_power(X, np.log(700.0 * share), np.full(40, "inference"),
                                        [str(i % 5) for i in range(40)], names)
    assert model is not None and report["chosen"]["inference"]["loao_mape"] < 1e-4
    assert model.fits["inference"].terms == ("log_batch", "log_hidden")  # a tie keeps the simpler set
    other = X.copy()
    other[:, -1] = 350.0  # another board: the same share of its own TDP
    assert np.exp(model.apply(np.zeros(40), other, "inference")) == pytest.approx(350.0 * share, rel=1e-4)


def _fit_power_law(share: Any, grid: list[tuple[str, int, int, int, int, int]] | None = None
                   ) -> tuple[Any, dict, list[str]]:
    """The power model fitted on the rows of ``grid`` (default: the training grid) drawing
    ``share(X)`` of a 700 W TDP, grouped by architecture, with the feature names it reads."""
    from gpurec.model.fitting.recurrent_fit import fit_recurrent_power

    grid = grid or _training_grid()
    names = [*NAMES, "hw_tdp_w"]
    X = np.column_stack([_rows(grid), np.full(len(grid), 700.0)])
    groups = [f"{k}{h}x{layers}x{d}" for k, _, _, h, layers, d in grid]
    model, report = fit_recurrent_power(X, np.log(700.0 * share(X, names)), np.full(len(grid), "inference"), groups,
                                        names)
    return model, report, names


def test_power_that_bends_with_the_batch_takes_the_squared_term() -> None:
    """Chains draw little more at batch 8 than at 1 but much more at 128 (per-step kernels fill
    the GPU): a law in (log batch)^2 is found by the leave-one-architecture-out choice and predicts
    an unseen architecture's power."""

    def share(X: np.ndarray, names: list[str]) -> np.ndarray:
        s = recurrent_shape(X, names)
        lb = np.log(s.batch)
        return 0.25 * np.exp(-0.05 * lb + 0.03 * lb * lb) * (s.hidden / 256) ** 0.2

    model, report, names = _fit_power_law(share)
    assert model is not None
    assert model.fits["inference"].terms == ("log_batch", "log_batch_sq", "log_hidden")
    c = report["candidates"]["inference"]
    assert c["log_batch+log_batch_sq+log_hidden"] < 1e-4 < c["log_batch+log_hidden"]
    unseen = np.column_stack([_rows([("LSTM", 64, 384, 768, 3, 1)]), [700.0]])
    assert np.exp(model.apply(np.zeros(1), unseen, "inference")) == pytest.approx(700.0 * share(unseen, names),
                                                                                rel=1e-4)


def test_power_that_grows_with_the_chains_in_flight_and_the_gates_takes_those_terms() -> None:
    """cuDNN keeps several layers' and both directions' chains in flight, and an LSTM step does 4
    gates' work to a GRU's 3: a law in layers x directions and step FLOPs is found by the
    leave-one-architecture-out choice and predicts a deeper unseen LSTM's power, which the
    hidden-size law misses."""

    def share(X: np.ndarray, names: list[str]) -> np.ndarray:
        s = recurrent_shape(X, names)
        lb = np.log(s.batch)
        flops = 2.0 * s.batch * s.gates * s.hidden * s.hidden
        return 0.01 * np.exp(-0.2 * lb + 0.03 * lb * lb) * flops ** 0.15 * (s.layers * s.directions) ** 0.1

    model, report, names = _fit_power_law(share)
    assert model is not None
    assert model.fits["inference"].terms == ("log_batch", "log_batch_sq", "log_step_flops", "log_chains")
    c = report["candidates"]["inference"]
    assert c["log_batch+log_batch_sq+log_step_flops+log_chains"] < 1e-4 < c["log_batch+log_batch_sq+log_hidden"]
    unseen = np.column_stack([_rows([("LSTM", 8, 384, 768, 3, 1)]), [700.0]])
    assert np.exp(model.apply(np.zeros(1), unseen, "inference")) == pytest.approx(700.0 * share(unseen, names),
                                                                                rel=1e-4)


def test_step_time_whose_hidden_slope_depends_on_the_batch_takes_the_interaction() -> None:
    """Latency-bound small batches barely feel the hidden size, compute-bound large ones do: the
    batch x hidden term is chosen and extrapolates to a deeper, wider unseen layer."""
    specs = _training_grid()
    X = _rows(specs)
    groups = [f"{k}{h}x{layers}x{d}" for k, _, _, h, layers, d in specs]

    def true_ms(X: np.ndarray) -> np.ndarray:
        s = recurrent_shape(X, NAMES)
        steps = s.seq_len * (1 + np.where(s.directions > 1, 1.0, 0.5) * (s.layers - 1))
        lb, lh = np.log(s.batch), np.log(s.hidden / 256)
        return steps * 2e-3 * np.exp(0.05 * lb + 0.1 * lh + 0.08 * lb * lh)

    model, _ = fit_recurrent(X, np.log(true_ms(X)), np.full(len(X), "inference"), groups, NAMES)
    assert model is not None
    assert model.fits["inference"].terms == ("log_batch", "log_hidden", "log_batch_hidden")
    unseen = _rows([("LSTM", 64, 384, 768, 3, 1)])
    assert np.exp(model.apply(np.zeros(1), unseen, "inference")) == pytest.approx(true_ms(unseen), rel=1e-4)


def test_step_time_whose_layer_cost_grows_with_the_hidden_size_takes_the_chain_terms() -> None:
    """Pipelined layers that add more to a step the wider the step, and a GRU step that is another
    kernel than an LSTM one: the chains-in-flight terms and the GRU indicator are chosen, and the
    fit extrapolates to a deeper, wider unseen stack of either kind."""
    archs = [("LSTM", 512, 2, 1), ("LSTM", 1024, 1, 1), ("LSTM", 256, 3, 1), ("LSTM", 1024, 2, 1), ("GRU", 256, 2, 1),
             ("GRU", 512, 1, 1), ("GRU", 512, 3, 1)]
    specs = [(k, b, s, h, layers, d) for k, h, layers, d in archs for b in (1, 8, 32, 128) for s in (32, 128)]
    X = _rows(specs)
    groups = [f"{k}{h}x{layers}x{d}" for k, _, _, h, layers, d in specs]

    def true_ms(X: np.ndarray) -> np.ndarray:
        s = recurrent_shape(X, NAMES)
        lb, lh, chains = np.log(s.batch), np.log(s.hidden / 256), np.log(s.layers)
        return s.seq_len * 2e-3 * np.exp(0.1 * lb + 0.3 * lh + 0.25 * chains * lh - 0.2 * (s.gates == 3))

    model, _ = fit_recurrent(X, np.log(true_ms(X)), np.full(len(X), "inference"), groups, NAMES)
    assert model is not None
    fit = model.fits["inference"]
    assert {"log_chains_in_flight_hidden", "gru"} <= set(fit.terms) and fit.loao_mape < 1e-3
    unseen = _rows([("LSTM", 8, 384, 768, 3, 1), ("GRU", 64, 384, 640, 4, 1)])
    assert np.exp(model.apply(np.zeros(2), unseen, "inference")) == pytest.approx(true_ms(unseen), rel=1e-3)


def test_host_dispatch_grows_with_every_step_of_every_layer_and_direction() -> None:
    from gpurec.model.fitting.recurrent_fit import fit_recurrent_host
    from gpurec.model.host_model import HostDispatch

    X = _rows(_training_grid())
    s = recurrent_shape(X, NAMES)
    host_ms = 0.3 + 0.02 * s.seq_len * s.layers * s.directions
    model, report = fit_recurrent_host(X, np.log(host_ms), np.full(40, "inference"), [str(i % 5) for i in range(40)],
                                       NAMES)
    assert model is not None
    assert report["chosen"]["inference"]["a_ms"] == pytest.approx(0.3, rel=1e-6)
    assert report["chosen"]["inference"]["b_ms"] == pytest.approx(0.02, rel=1e-6)
    dispatch = HostDispatch.__new__(HostDispatch)
    dispatch.models, dispatch.recurrent = None, model
    dispatch._prior = {"inference": np.full(16, 0.01)}
    unseen = _rows([("GRU", 8, 384, 384, 2, 2)])
    got = dispatch.reference_ms(unseen, np.zeros(1, dtype=np.int64), "inference")
    assert got == pytest.approx([0.3 + 0.02 * 384 * 4])


def test_fit_recurrent_into_trained_models(tmp_path) -> None:  # noqa: ANN001
    """The tool fits the three models from the committed recurrent rows into a copy of the models."""
    import json
    import shutil

    from gpurec.model import load_predictor
    from gpurec.model.persist import default_model_dir
    from gpurec.tools.recurrent import fit_into

    shutil.copytree(default_model_dir(), tmp_path / "m")
    report = fit_into(tmp_path / "m", evaluate=False)
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert set(manifest["recurrent_time"]["by_mode"]) == {"inference", "training"}
    assert report["rows"] >= 24 and report["time"]["rows"]["inference"]["architectures"] >= 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = load_predictor(tmp_path / "m", check_data=False)
    assert p.recurrent is not None and p.recurrent_power is not None and p.host_model.recurrent is not None


def test_power_of_a_bidirectional_stack_grows_with_the_chains_in_flight_not_all_chains() -> None:
    """A bidirectional layer waits for the whole layer below, so only its two directions draw power
    together whatever the depth: a law in the chains in flight is chosen over layers x directions
    and predicts an unseen 2-layer bidirectional GRU's power, which the latter over-predicts."""

    def share(X: np.ndarray, names: list[str]) -> np.ndarray:
        s = recurrent_shape(X, names)
        lb = np.log(s.batch)
        flops = 2.0 * s.batch * s.gates * s.hidden * s.hidden
        in_flight = np.where(s.directions > 1, s.directions, s.layers)
        return 0.01 * np.exp(-0.2 * lb + 0.03 * lb * lb) * flops ** 0.15 * in_flight ** 0.2

    # the sequence plan's training stacks: 1-4 unidirectional layers, bidirectional ones of 1 and 3
    archs = [("LSTM", 256, 1, 2), ("LSTM", 1024, 1, 1), ("LSTM", 512, 2, 1), ("LSTM", 384, 4, 1),
             ("GRU", 512, 3, 2), ("GRU", 1024, 1, 1), ("GRU", 256, 2, 1), ("GRU", 640, 3, 1)]
    grid = [(k, b, s, h, layers, d) for k, h, layers, d in archs for b in (1, 8, 32, 128) for s in (32, 128)]
    model, report, names = _fit_power_law(share, grid)
    assert model is not None
    assert model.fits["inference"].terms == ("log_batch", "log_batch_sq", "log_step_flops", "log_chains_in_flight")
    c = report["candidates"]["inference"]
    assert c["log_batch+log_batch_sq+log_step_flops+log_chains_in_flight"] < 1e-4
    assert c["log_batch+log_batch_sq+log_step_flops+log_chains"] > 1e-3
    unseen = np.column_stack([_rows([("GRU", 8, 384, 384, 2, 2)]), [700.0]])
    assert np.exp(model.apply(np.zeros(1), unseen, "inference")) == pytest.approx(700.0 * share(unseen, names),
                                                                                rel=1e-4)


def _half(X: np.ndarray) -> np.ndarray:
    """The same layers with fp16 elements (autocast runs cuDNN's recurrent layers in fp16)."""
    out = X.copy()
    out[:, NAMES.index("element_bytes")] = 2.0
    return out


def test_half_precision_layers_take_the_fp32_chain_times_a_fitted_factor() -> None:
    """fp32 rows fix the chain; half-precision rows of three architectures, 0.6x as long, fit one
    factor per mode that carries to an unseen half-precision layer (deeper, longer, wider); with
    too few half-precision architectures there is none and the boosters' value stays."""
    specs = _training_grid()
    X = _rows(specs)
    groups = [f"{k}{h}x{layers}x{d}" for k, _, _, h, layers, d in specs]
    Xh = _half(X[:24])  # the first three architectures
    model, report = fit_recurrent(np.vstack([X, Xh]), np.log(np.concatenate([_true_ms(X), 0.6 * _true_ms(X[:24])])),
                                  np.full(len(X) + 24, "inference"), groups + groups[:24], NAMES)
    assert model is not None
    half = model.fits["inference"].half
    assert half is not None and half.log_factor == pytest.approx(np.log(0.6), abs=1e-4) and half.rows == 24
    assert half.loao_mape < 1e-4 and report["chosen"]["inference"]["half"]["rows"] == 24
    assert model.fits["inference"].loao_mape < 1e-4  # the fp32 form is fitted on fp32 rows alone
    unseen = _rows([("LSTM", 8, 384, 768, 3, 1), ("GRU", 64, 384, 384, 2, 2)])
    got = np.exp(model.apply(np.zeros(2), _half(unseen), "inference"))
    assert got == pytest.approx(0.6 * _true_ms(unseen), rel=1e-4)
    again = RecurrentTime.from_dict(model.as_dict(), NAMES)
    assert again is not None and again.fits["inference"].half == half
    replaced, _ = model.coverage(_half(unseen), NAMES, np.array(["LSTM", "GRU"], dtype=object), "inference", 2.0)
    assert replaced.all()

    few, _ = fit_recurrent(np.vstack([X, Xh[:16]]), np.log(np.concatenate([_true_ms(X), 0.6 * _true_ms(X[:16])])),
                           np.full(len(X) + 16, "inference"), groups + groups[:16], NAMES)
    assert few is not None and few.fits["inference"].half is None  # two architectures
    assert few.apply(np.array([1.5, 2.5]), _half(unseen), "inference") == pytest.approx([1.5, 2.5])


def test_a_half_precision_gain_that_grows_with_the_hidden_size_is_fitted_and_clamped() -> None:
    """fp16 steps gain more the wider the recurrent product (x0.9 at hidden 256, x0.59 at 1024):
    a constant factor misses that, the log-hidden term recovers it on an unseen layer, and a
    layer wider than any half-precision row fitted keeps the widest one's factor; the form
    survives a save and load, and a factor saved without terms still loads as a constant."""
    from gpurec.model.fitting.recurrent_fit import refit_half
    from gpurec.model.recurrent import HalfFactor

    def gain(X: np.ndarray) -> np.ndarray:
        return 0.9 * (np.minimum(recurrent_shape(X, NAMES).hidden, 1024.0) / 256.0) ** -0.3

    specs = _training_grid()
    X = _rows(specs)
    groups = [f"{k}{h}x{layers}x{d}" for k, _, _, h, layers, d in specs]
    y = np.log(np.concatenate([_true_ms(X), gain(X) * _true_ms(X)]))
    model, report = fit_recurrent(np.vstack([X, _half(X)]), y, np.full(2 * len(X), "inference"), groups + groups,
                                  NAMES)
    assert model is not None
    half = model.fits["inference"].half
    assert half is not None and half.terms == ("log_hidden",) and half.loao_mape < 1e-4
    assert half.ranges == (1.0, 128.0, 256.0, 1024.0)
    assert report["half_candidates"]["inference"]["constant"] > 0.05  # one number cannot follow the width
    unseen = _rows([("LSTM", 8, 384, 768, 3, 1), ("GRU", 64, 384, 384, 2, 2), ("LSTM", 4, 256, 2048, 2, 1)])
    got = np.exp(model.apply(np.zeros(3), _half(unseen), "inference"))
    assert got == pytest.approx(gain(unseen) * _true_ms(unseen), rel=1e-4)
    again = RecurrentTime.from_dict(model.as_dict(), NAMES)
    assert again is not None and again.fits["inference"].half == half
    legacy = HalfFactor.from_dict({"log_factor": -0.3, "loao_mape": 0.2, "rows": 24})
    assert legacy is not None and legacy.log_shift(recurrent_shape(unseen, NAMES)) == pytest.approx([-0.3] * 3)
    damaged = {**half.as_dict(), "ranges": [1.0, 128.0]}  # terms without their four clamping ranges
    with pytest.raises(ValueError, match="four fitted ranges"):
        HalfFactor.from_dict(damaged)

    # refitting only the factor (new half-precision rows: a flat x0.5) keeps the fp32 form as it is
    refit, _, rep = refit_half(model, None, np.vstack([X, _half(X)]), np.zeros((0, len(NAMES))),
                               np.log(np.concatenate([_true_ms(X), 0.5 * _true_ms(X)])), np.zeros(0),
                               np.full(2 * len(X), "inference"), groups + groups, NAMES)
    assert refit is not None and rep["time"]["inference"]["constant"] < 1e-4
    assert replace(refit.fits["inference"], half=None) == replace(model.fits["inference"], half=None)
    assert np.exp(refit.apply(np.zeros(3), _half(unseen), "inference")) == pytest.approx(0.5 * _true_ms(unseen),
                                                                                          rel=1e-4)


def test_half_precision_power_is_the_fp32_share_times_a_fitted_factor() -> None:
    from gpurec.model.fitting.recurrent_fit import fit_recurrent_power
    from gpurec.model.recurrent import RecurrentHost

    names = [*NAMES, "hw_tdp_w"]
    X = np.column_stack([_rows(_training_grid()), np.full(40, 700.0)])
    Xh = X[:24].copy()
    Xh[:, NAMES.index("element_bytes")] = 2.0
    share = 0.2 * recurrent_shape(X, names).batch ** 0.15
    model, _ = fit_recurrent_power(np.vstack([X, Xh]), np.log(700.0 * np.concatenate([share, 0.8 * share[:24]])),
                                   np.full(64, "inference"), [str(i // 8) for i in range(40)] + [str(i // 8)
                                                                                             for i in range(24)],
                                   names)
    assert model is not None and model.fits["inference"].half is not None
    assert model.fits["inference"].half.log_factor == pytest.approx(np.log(0.8), abs=1e-6)
    got = np.exp(model.apply(np.zeros(24), Xh, "inference"))
    assert got == pytest.approx(700.0 * 0.8 * share[:24], rel=1e-4)
    host = RecurrentHost({"inference": {"a_ms": 0.1, "b_ms": 0.01, "kinds": ["LSTM", "GRU"]}}, names)
    s = recurrent_shape(Xh, names)
    assert host.apply(np.zeros(24), Xh, "inference") == pytest.approx(0.1 + 0.01 * s.seq_len * s.layers * s.directions)
