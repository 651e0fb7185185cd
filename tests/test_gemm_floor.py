"""The throughput floor of half-precision products with an unaligned weight, and the roofline of
wide ones (gpurec.model.gemm): which rows each finds, what it fits, and that the predictor applies
them."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from gpurec.model.fitting.gemm_fit import fit_floor, fit_wide
from gpurec.model.gemm import (
    ModeFloor,
    UnalignedGemmFloor,
    WideFit,
    WideHalfGemm,
    gemm_dims,
    unaligned_half,
    unaligned_products,
    wide_half_class,
)
from gpurec.model.persist import IncompatibleModel

NAMES = ["flops", "input_elements", "output_elements", "math_mode", "flops_mode", "peak_tflops_used", "waves",
         "kind=Linear", "kind=linear", "kind=Conv2d"]
PEAK = 989.0  # TFLOPS


def _row(m: int, k: int, n: int, math: float = 3.0, kind: str = "Linear", waves: float = 4.0,
         training: bool = False) -> list[float]:
    flops = 2.0 * m * k * n
    return [flops, m * k, m * n, math, 3 * flops if training else flops, PEAK, waves,
            float(kind == "Linear"), float(kind == "linear"), float(kind == "Conv2d")]


def test_dims_are_recovered_from_flops_and_element_counts() -> None:
    X = np.array([_row(6144, 768, 50257), _row(128, 512, 1536)])
    m, k, n = gemm_dims(X[:, 0], X[:, 1], X[:, 2])
    assert m.tolist() == [6144, 128] and k.tolist() == [768, 512] and n.tolist() == [50257, 1536]


def test_only_half_precision_unaligned_products_of_a_full_wave_are_found() -> None:
    rows = [_row(6144, 768, 50257),                    # GPT head, bf16: found
            _row(6144, 768, 50257, kind="linear"),     # F.linear, no in/out features needed: found
            _row(6144, 771, 4096, math=2.0),           # fp16, odd K: found
            _row(6144, 768, 50304),                    # aligned: not
            _row(6144, 768, 50257, math=0.0),          # fp32: not (no tensor-core alignment rule)
            _row(64, 1024, 2, waves=0.01),             # a 2-way classifier head: latency-bound, not
            _row(6144, 768, 50257, kind="Conv2d"),     # not a product with a weight
            _row(6144, 768, 30522)]                    # BERT's vocabulary: a multiple of 2, not of 8: not floored
    kinds = np.array(["Linear", "linear", "Linear", "Linear", "Linear", "Linear", "Conv2d", "Linear"], dtype=object)
    assert unaligned_half(np.array(rows), NAMES, kinds).tolist() == [
        True, True, True, False, False, False, False, False]
    # ... though it is listed for the user to pad (it ran at a quarter of the aligned heads' rate)
    assert [(k, n) for _, k, n in unaligned_products(np.array(rows), NAMES, kinds)] == [
        (768, 50257), (768, 50257), (771, 4096), (1024, 2), (768, 30522)]


def _fitted_rows(eff: dict[str, float], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                             np.ndarray, list[str]]:
    X, t, modes, groups = [], [], [], []
    for arch, d in (("gpt_a", 512), ("gpt_b", 1024), ("gpt_c", 1536)):
        for m in (128, 512, 2048, 8192):
            for mode, e in eff.items():
                r = _row(m, d, 50257, training=mode == "training")
                X.append(r)
                t.append(r[4] / (e * PEAK * 1e9) * rng.uniform(0.97, 1.03))
                modes.append(mode)
                groups.append(arch)
    X.append(_row(64, 512, 2, waves=0.01))  # a latency-bound head far below any throughput: ignored
    t.append(0.01)
    modes.append("inference")
    groups.append("bert_a")
    return np.array(X), np.array(["Linear"] * len(t), dtype=object), np.array(t), np.array(modes, dtype=object), groups


def test_the_fit_recovers_the_efficiency_per_mode_and_scores_it_leaving_architectures_out() -> None:
    X, kinds, t, modes, groups = _fitted_rows({"inference": 0.095, "training": 0.12}, np.random.default_rng(0))
    floor, report = fit_floor(X, kinds, t, modes, groups, NAMES)
    assert floor is not None
    assert floor.fits["inference"].efficiency == pytest.approx(0.095, rel=0.03)
    assert floor.fits["training"].efficiency == pytest.approx(0.12, rel=0.03)
    assert floor.fits["inference"].rows == 12 and floor.fits["inference"].archs == ("gpt_a", "gpt_b", "gpt_c")
    assert report["inference"]["loao_mape"] < 0.04


def test_too_few_architectures_fit_nothing_and_say_why() -> None:
    X, kinds, t, modes, groups = _fitted_rows({"inference": 0.095}, np.random.default_rng(1))
    one = np.array([g == "gpt_a" for g in groups])
    floor, report = fit_floor(X[one], kinds[one], t[one], modes[one], [g for g in groups if g == "gpt_a"], NAMES)
    assert floor is None and report["inference"]["fitted"] is False and "architectures" in report["inference"]["why"]


def test_the_floor_raises_only_what_is_below_it_and_survives_a_round_trip() -> None:
    floor = UnalignedGemmFloor({"inference": ModeFloor(0.1, 12, ("a", "b"), 0.05, 1e9)}, NAMES)
    X = np.array([_row(6144, 768, 50257), _row(6144, 768, 50257), _row(6144, 768, 50304)])
    expected = X[0, 4] / (0.1 * PEAK * 1e9)
    log_t = np.log([expected / 2, expected * 2, expected / 2])
    out = floor.apply(log_t, X, "inference")
    assert np.exp(out).tolist() == pytest.approx([expected, expected * 2, expected / 2])
    assert floor.apply(log_t, X, "training").tolist() == log_t.tolist()  # no fit for that mode
    again = UnalignedGemmFloor.from_dict(floor.as_dict(), NAMES)
    assert again is not None and again.fits == floor.fits
    assert UnalignedGemmFloor.from_dict(None, NAMES) is None
    with pytest.raises(IncompatibleModel, match="alignment"):
        UnalignedGemmFloor.from_dict(floor.as_dict() | {"align_elements": 4}, NAMES)


def _head_ms(p: Any, vocab: int, shape: tuple[int, ...]) -> float:
    """The bf16-mixed H100 time of one bias-free nn.Linear(768, vocab) over ``shape``."""
    import torch.nn as nn

    ops = p.predict(nn.Sequential(nn.Linear(768, vocab, bias=False)), shape, gpu="H100",
                    precision="bf16-mixed").per_op
    assert ops["kind"].tolist().count("Linear") == 1
    return float(ops.loc[ops["kind"] == "Linear", "time_ms"].sum())


def test_the_shipped_predictor_puts_an_unaligned_bf16_head_at_or_above_the_floor() -> None:
    """nn.Linear(768, 50257) at bf16 was predicted at 2.7 ms on the H100 (measured heads of this
    shape run about 5 ms); the floor lifts it, and leaves the aligned 50,304-word head alone."""

    from gpurec.model import load_predictor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = load_predictor(use_measured=False)
        assert p.gemm_floor is not None, "the shipped models carry the floor (gpurec tools fit-gemm-floor)"

        with_floor = _head_ms(p, 50257, (8, 768, 768)), _head_ms(p, 50304, (8, 768, 768))
        saved, p.gemm_floor = p.gemm_floor, None
        p.clear_cache()
        without = _head_ms(p, 50257, (8, 768, 768)), _head_ms(p, 50304, (8, 768, 768))
        p.gemm_floor = saved
    from gpurec.catalog import resolve_gpu

    flops = 2.0 * 8 * 768 * 768 * 50257
    eff = saved.fits["inference"].efficiency
    assert with_floor[0] >= flops / (eff * resolve_gpu("H100").bf16_tflops * 1e9) * 0.999
    assert with_floor[0] > 1.3 * without[0]
    assert with_floor[1] == pytest.approx(without[1], rel=1e-9)


class _Head(__import__("torch").nn.Module):
    """A tied LM head as GPT writes it (F.linear to the embedding's weight) after an aligned Linear."""

    def __init__(self, vocab: int) -> None:
        import torch.nn as nn

        super().__init__()
        self.tok = nn.Embedding(vocab, 64)
        self.proj = nn.Linear(64, 64)

    def forward(self, ids: object) -> object:
        import torch.nn.functional as F

        return F.linear(self.proj(self.tok(ids)), self.tok.weight)


def test_estimates_and_rankings_name_the_unaligned_products_a_user_can_pad() -> None:
    import torch

    from gpurec.model import load_predictor
    from gpurec.model.gemm import unaligned_note
    from gpurec.recommend import recommend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = load_predictor()
        found = p.predict(_Head(50257), (4, 128), gpu="H100", dtype=torch.long,
                          precision="bf16-mixed").unaligned_products
        padded = p.predict(_Head(50304), (4, 128), gpu="H100", dtype=torch.long,
                           precision="bf16-mixed").unaligned_products
        fp32 = p.predict(_Head(50257), (4, 128), gpu="H100", dtype=torch.long).unaligned_products
        ranking = recommend(_Head(50257), (4, 128), gpus=["H100"], dtype=torch.long, precision="bf16-mixed",
                            predictor=p)
    assert found[["kind", "k", "n"]].values.tolist() == [["linear", 64, 50257]]  # the aligned proj is not listed
    assert 0 < found["time_share"].iloc[0] <= 1
    assert padded.empty and fp32.empty  # aligned, or no tensor-core alignment rule at fp32
    note = unaligned_note(found.to_dict("records"))
    assert "64 x 50257" in note and "multiple of 8" in note
    assert note in ranking.notes


WIDE_NAMES = NAMES + ["bytes_mode", "hw_memory_bandwidth_gbs"]
BANDWIDTH = 3350.0  # GB/s


def _wide_row(m: int, k: int, n: int, math: float = 3.0, kind: str = "Linear", waves: float = 4.0,
              training: bool = False) -> list[float]:
    bytes_mode = 2.0 * (m * k + k * n + m * n) * (3 if training else 1)
    return _row(m, k, n, math, kind, waves, training) + [bytes_mode, BANDWIDTH]


def _roofline_ms(r: list[float], a: float, b: float) -> float:
    return a * r[4] / (PEAK * 1e9) + b * r[-2] / (BANDWIDTH * 1e6)


def test_wide_products_are_the_even_half_precision_ones_of_vocabulary_width() -> None:
    rows = [_wide_row(8192, 768, 50304),                  # nanoGPT's padded head: aligned
            _wide_row(8192, 768, 30522),                  # BERT's vocabulary: even, not a multiple of 8
            _wide_row(8192, 768, 50257),                  # odd: the floor's, not this model's
            _wide_row(8192, 768, 50304, math=0.0),        # fp32
            _wide_row(8192, 768, 3072),                   # a transformer's MLP: narrower than any head
            _wide_row(8, 768, 50304, waves=0.5),          # under a wave
            _wide_row(8192, 768, 50304, kind="Conv2d"),   # not a product with a weight
            _wide_row(8192, 4096, 128256, kind="linear")]  # a tied F.linear head: aligned
    kinds = np.array(["Linear"] * 6 + ["Conv2d", "linear"], dtype=object)
    assert wide_half_class(np.array(rows), WIDE_NAMES, kinds).tolist() == [
        "aligned", "even", "", "", "", "", "", "aligned"]


def _wide_rows(coef: dict[tuple[str, str], tuple[float, float]], rng: np.random.Generator,
               widths: tuple[int, ...] = (512, 1024, 2048)) -> tuple[np.ndarray, ...]:
    X, t, modes = [], [], []
    for (mode, cls), (a, b) in coef.items():
        for k in widths:
            for m in (256, 512, 4096, 8192):
                for n in ((32000, 50304, 128256) if cls == "aligned" else (30522,)):
                    r = _wide_row(m, k, n, training=mode == "training")
                    X.append(r)
                    t.append(_roofline_ms(r, a, b) * rng.uniform(0.98, 1.02))
                    modes.append(mode)
    X.append(_wide_row(4096, 1024, 4096))  # narrow: not fitted, whatever its time
    t.append(100.0)
    modes.append("inference")
    return np.array(X), np.array(["Linear"] * len(t), dtype=object), np.array(t), np.array(modes, dtype=object)


def test_the_wide_fit_recovers_the_roofline_per_mode_and_class_and_scores_it_leaving_widths_out() -> None:
    truth = {("inference", "aligned"): (1.4, 0.45), ("inference", "even"): (3.5, 0.8),
             ("training", "aligned"): (1.3, 0.8)}
    X, kinds, t, modes = _wide_rows(truth, np.random.default_rng(2))
    model, report = fit_wide(X, kinds, t, modes, ["H100"] * len(t), WIDE_NAMES)
    assert model is not None
    for (mode, cls), (a, b) in truth.items():
        fit = model.fits[mode][cls]
        assert (fit.compute_scale, fit.memory_scale) == (pytest.approx(a, rel=0.05), pytest.approx(b, rel=0.1))
        assert fit.widths == (512, 1024, 2048) and fit.cv_mape < 0.03 and fit.gpus == ("H100",) and fit.m_min == 256
    assert report["training|even"]["fitted"] is False and "rows" in report["training|even"]["why"]
    one = gemm_dims(X[:, 0], X[:, 1], X[:, 2])[1] == 512  # a single inner dimension: no width to leave out
    alone, why = fit_wide(X[one], kinds[one], t[one], modes[one], ["H100"] * int(one.sum()), WIDE_NAMES)
    assert alone is None and "inner dimensions" in why["inference|aligned"]["why"]


def test_the_wide_model_replaces_only_its_rows_and_survives_a_round_trip() -> None:
    fit = WideFit(1.4, 0.45, 48, ("H100",), (512, 1024), 256.0, 0.06, 0.08)
    model = WideHalfGemm({"inference": {"aligned": fit}}, WIDE_NAMES)
    X = np.array([_wide_row(8192, 768, 50304), _wide_row(8192, 768, 30522), _wide_row(8192, 768, 50257),
                  _wide_row(4096, 768, 3072), _wide_row(128, 768, 50304), _wide_row(96, 768, 50304)])
    log_t = np.log([9.0] * 6)
    out = np.exp(model.apply(log_t, X, "inference"))
    # no "even" fit; down to half the fewest tokens fitted (128 of 256), not below (96)
    assert out.tolist() == pytest.approx([_roofline_ms(X[0].tolist(), 1.4, 0.45), 9.0, 9.0, 9.0,
                                          _roofline_ms(X[4].tolist(), 1.4, 0.45), 9.0])
    assert model.apply(log_t, X, "training").tolist() == log_t.tolist()  # no fit for that mode
    again = WideHalfGemm.from_dict(model.as_dict(), WIDE_NAMES)
    assert again is not None and again.fits == model.fits
    assert WideHalfGemm.from_dict(None, WIDE_NAMES) is None
    with pytest.raises(IncompatibleModel, match="another rule"):
        WideHalfGemm.from_dict(model.as_dict() | {"min_n": 8192}, WIDE_NAMES)
    with pytest.raises(IncompatibleModel, match="features"):
        WideHalfGemm.from_dict(model.as_dict(), NAMES)


def test_the_shipped_predictor_shows_what_padding_a_vocabulary_buys() -> None:
    """nn.Linear(768, 50304) at bf16 over 8,192 tokens was predicted at 4.5 ms on the H100, 1.5x
    faster than the odd 50,257-word head; the head sweep measured aligned heads 4-6x faster than
    odd ones (docs/accuracy.md).  The wide model puts it on its roofline."""

    from gpurec.model import load_predictor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = load_predictor(use_measured=False)
        assert p.wide_gemm is not None, "the shipped models carry the wide model (gpurec tools fit-gemm-floor)"

        odd, padded = _head_ms(p, 50257, (8, 1024, 768)), _head_ms(p, 50304, (8, 1024, 768))
    assert padded * 4 < odd
    # at the roofline's compute term alone the head would take 0.64 ms at the H100's dense bf16 peak
    assert 0.64 < padded < 1.6
