"""Activation checkpointing (torch.utils.checkpoint): which operations backward runs again, what
that costs in time and energy, and what autograd no longer keeps."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_capture import _fx_refused  # fx refuses, so the capture on concrete shapes runs
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import gpurec
from gpurec.ops import extract_operations
from gpurec.ops.memory import memory_terms

SHAPE = (64, 128, 512)
BLOCK_INPUT_BYTES = 64 * 128 * 512 * 4  # what each checkpoint keeps: its input


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(512, 2048), nn.Linear(2048, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class _Net(nn.Module):
    """Four residual MLP blocks; ``how`` says which run inside torch.utils.checkpoint."""

    def __init__(self, how: str = "none", reentrant: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(4))
        self.how, self.reentrant = how, reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.blocks
        if self.how == "all":
            for block in b:
                x = checkpoint(block, x, use_reentrant=self.reentrant)
        elif self.how == "some":  # the first alone, the second plainly, the last two as one region
            x = b[1](checkpoint(b[0], x, use_reentrant=self.reentrant))
            x = checkpoint(lambda y: b[3](b[2](y)), x, use_reentrant=self.reentrant)
        elif self.how == "sequential":
            x = checkpoint_sequential(nn.Sequential(*b), 2, x, use_reentrant=self.reentrant)
        else:
            for block in b:
                x = block(x)
        return x


def _ops(how: str, mode: str = "training", reentrant: bool = False) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "None of the inputs have requires_grad=True"
        return extract_operations(_Net(how, reentrant), SHAPE, mode=mode)


@pytest.mark.parametrize("reentrant", [False, True])
def test_each_checkpoint_call_is_a_region_of_its_operations_in_training_only(reentrant: bool) -> None:
    plain = _ops("none")
    assert [op.checkpoint_region for op in plain] == [0] * 16
    some = _ops("some", reentrant=reentrant)
    assert [op.checkpoint_region for op in some] == [1] * 4 + [0] * 4 + [2] * 8
    assert [op.checkpoint_region for op in _ops("all", reentrant=reentrant)] == [r for r in (1, 2, 3, 4)
                                                                                  for _ in range(4)]
    assert [op.checkpoint_region for op in _ops("sequential", reentrant=reentrant)] == [1] * 8 + [0] * 8
    # where an operation runs is not what it is: the same signatures as without checkpointing
    assert [op.signature for op in some] == [op.signature for op in plain]
    assert not any(op.recomputed for op in _ops("some", "inference", reentrant))


@pytest.mark.parametrize("capture", [False, True])
def test_a_checkpoint_around_the_extraction_is_not_the_models(monkeypatch: pytest.MonkeyPatch, capture: bool) -> None:
    if capture:
        _fx_refused(monkeypatch)
    found: list = []

    def extract(x: torch.Tensor) -> torch.Tensor:
        found.extend(_ops("none"))
        return x * 2

    checkpoint(extract, torch.ones(1, requires_grad=True), use_reentrant=False)
    assert len(found) == 16 and not any(op.recomputed for op in found)


def test_the_capture_on_concrete_shapes_marks_regions_too(monkeypatch: pytest.MonkeyPatch) -> None:
    _fx_refused(monkeypatch)
    assert [op.checkpoint_region for op in _ops("some")] == [1] * 4 + [0] * 4 + [2] * 8


class _Gated(nn.Module):
    """A gated unit: its chunk launches kernels in training (backward assembles the halves' gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(512, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._gate, x, use_reentrant=False)

    def _gate(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.lin(x).chunk(2, dim=-1)
        return a * torch.sigmoid(b)


def test_the_recomputation_is_the_operation_as_inference_measures_it() -> None:
    inference = _ops("none", "inference")
    again = [op.recomputation() for op in _ops("all")]
    assert [op.signature for op in again] == [op.signature for op in inference]
    assert all(op.mode == "inference" and op.flops_bwd == 0 and not op.recomputed for op in again)
    training = extract_operations(_Gated(), SHAPE, mode="training")
    inference = extract_operations(_Gated(), SHAPE, mode="inference")
    assert [op.kind for op in training] == ["Linear", "chunk", "Sigmoid", "mul"]
    assert not training[1].kernel_free  # in training, the chunk's backward launches kernels
    again = [op.recomputation() for op in training]
    assert [op.signature for op in again] == [op.signature for op in inference]
    assert [op.kernel_free for op in again] == [op.kernel_free for op in inference] == [False, True, False, False]


@pytest.fixture(scope="module")
def p():  # noqa: ANN201
    return gpurec.load_predictor()


def _predict(p, how: str, mode: str = "training"):  # noqa: ANN001, ANN202
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return p.predict(_Net(how), SHAPE, mode=mode, gpu="H100")


def test_a_checkpointed_step_costs_the_plain_step_and_the_forward_it_runs_again(p) -> None:  # noqa: ANN001
    plain, forward = _predict(p, "none"), _predict(p, "none", "inference")
    full = _predict(p, "all")
    assert full.recomputed_ops == 16 and plain.recomputed_ops == 0
    assert full.recompute_gpu_time_ms == pytest.approx(forward.gpu_time_ms, rel=1e-9)
    assert full.gpu_time_ms == pytest.approx(plain.gpu_time_ms + forward.gpu_time_ms, rel=1e-9)
    assert full.gpu_energy_mj == pytest.approx(plain.gpu_energy_mj + forward.gpu_energy_mj, rel=1e-9)
    assert full.time_ms == pytest.approx(plain.time_ms + forward.time_ms, rel=1e-9)
    assert full.energy_mj == pytest.approx(plain.energy_mj + forward.energy_mj, rel=1e-9)
    assert full.power_w == pytest.approx(full.energy_mj / full.time_ms)
    assert full.op_sum_time_ms == pytest.approx(plain.op_sum_time_ms + forward.op_sum_time_ms, rel=1e-9)
    assert full.op_sum_energy_mj == pytest.approx(plain.op_sum_energy_mj + forward.op_sum_energy_mj, rel=1e-9)
    assert full.time_low_ms < full.time_ms < full.time_high_ms
    assert len(full.per_op) == 16  # each operation once, with its forward again beside it
    assert full.per_op["recompute_ms"].to_numpy() == pytest.approx(forward.per_op["time_ms"].to_numpy(), rel=1e-9)
    assert (plain.per_op["recompute_ms"] == 0).all()
    # a partly checkpointed step recomputes its regions' operations only
    some = _predict(p, "some")
    assert some.recomputed_ops == 12
    again = some.per_op["recompute_ms"].to_numpy()
    assert (again[4:8] == 0).all() and (again[:4] > 0).all() and (again[8:] > 0).all()
    assert plain.gpu_time_ms < some.gpu_time_ms < full.gpu_time_ms
    # inference runs nothing again
    assert _predict(p, "all", "inference").gpu_time_ms == pytest.approx(forward.gpu_time_ms, rel=1e-9)


def test_checkpointing_keeps_only_each_regions_input_until_backward_makes_the_rest_again() -> None:
    plain, full, some = memory_terms(_ops("none")), memory_terms(_ops("all")), memory_terms(_ops("some"))
    assert full.saved_bytes == 4 * BLOCK_INPUT_BYTES
    assert full.saved_bytes < some.saved_bytes < plain.saved_bytes
    # Backward starts by making the last region's saved tensors again, so at that peak a step
    # holds what the plain step holds less the saved tensors of every other region but its input
    # (a block saves 80 MiB: its input, the 2048-wide product and its activation).
    one_block = plain.saved_bytes // 4
    assert full.activations_bytes == plain.activations_bytes - 3 * (one_block - BLOCK_INPUT_BYTES)
    assert some.activations_bytes == plain.activations_bytes - (one_block - BLOCK_INPUT_BYTES)


_USER_FILE = '''
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Net(nn.Module):
    def __init__(self, ckpt=True):
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU()) for _ in range(3))
        self.ckpt = ckpt

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        return x.mean((2, 3))


def Plain():
    return Net(False)
'''


def test_gpurec_predict_says_what_checkpointing_adds(tmp_path) -> None:  # noqa: ANN001
    import json

    from typer.testing import CliRunner

    import cli

    path = tmp_path / "ckpt.py"
    path.write_text(_USER_FILE)
    args = ["predict", "-b", "8", "-r", "64", "--mode", "training", "--gpu", "H100"]
    runner = CliRunner()
    out = {name: json.loads(runner.invoke(cli.app, [*args, "--model", f"{path}:{name}", "--format", "json"]).stdout)
           for name in ("Net", "Plain")}
    assert out["Net"]["recomputed_ops"] == 6 and out["Plain"]["recomputed_ops"] == 0
    assert out["Net"]["gpu_time_ms"] == pytest.approx(out["Plain"]["gpu_time_ms"] + out["Net"]["recompute_gpu_time_ms"])
    assert out["Net"]["memory_gb"] < out["Plain"]["memory_gb"]
    table = runner.invoke(cli.app, [*args, "--model", f"{path}:Net"]).output
    assert "checkpointing: backward runs the forward of 6 checkpointed operations again" in table
