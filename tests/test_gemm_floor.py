"""The throughput floor of half-precision products with an unaligned weight (gpurec.model.gemm):
which rows it finds, what it fits, and that the predictor raises such a product to it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from gpurec.model.fitting.gemm_fit import fit_floor
from gpurec.model.gemm import ModeFloor, UnalignedGemmFloor, gemm_dims, unaligned_half, unaligned_products
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


def test_the_shipped_predictor_puts_an_unaligned_bf16_head_at_or_above_the_floor() -> None:
    """nn.Linear(768, 50257) at bf16 was predicted at 2.7 ms on the H100 (measured heads of this
    shape run about 5 ms); the floor lifts it, and leaves the aligned 50,304-word head alone."""
    import torch.nn as nn

    from gpurec.model import load_predictor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = load_predictor(use_measured=False)
        assert p.gemm_floor is not None, "the shipped models carry the floor (gpurec tools fit-gemm-floor)"

        def head_ms(vocab: int) -> float:
            e = p.predict(nn.Sequential(nn.Linear(768, vocab, bias=False)), (8, 768, 768), gpu="H100",
                          precision="bf16-mixed")
            ops = e.per_op
            assert ops["kind"].tolist().count("Linear") == 1
            return float(ops.loc[ops["kind"] == "Linear", "time_ms"].sum())

        with_floor = head_ms(50257), head_ms(50304)
        saved, p.gemm_floor = p.gemm_floor, None
        p.clear_cache()
        without = head_ms(50257), head_ms(50304)
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
