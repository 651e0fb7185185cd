"""``checkpoint_blocks``: gradient checkpointing switched on as users do it (every repeated block
inside torch.utils.checkpoint), predicted, and validated against a measurement."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from test_validate import MEAS, AskedPredictor
from torch import nn

import gpurec
import gpurec.validate as val
from gpurec.ops import extract_operations
from gpurec.ops.checkpointing import Checkpointed, NoRepeatedBlocks, checkpoint_blocks
from gpurec.ops.extract import resolve_model
from gpurec.ops.memory import memory_terms


class _Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


class _Net(nn.Module):
    """A stem, three repeated blocks (each holding two repeated inner blocks) and a head."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.stem = nn.Linear(8, d)
        self.blocks = nn.Sequential(*(nn.Sequential(_Block(d), _Block(d)) for _ in range(3)))
        self.outer = nn.ModuleList(_Outer(d) for _ in range(2))
        self.head = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        for o in self.outer:
            x = o(x)
        return self.head(x)


class _Outer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.inner = nn.ModuleList(_Block(d) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.inner:
            x = b(x)
        return x


def test_the_outermost_repeated_composite_blocks_are_wrapped_once() -> None:
    net = _Net()
    names = checkpoint_blocks(net)
    # containers are looked into, never wrapped; a wrapped block's insides are left as they are
    assert names == ["blocks.0.0", "blocks.0.1", "blocks.1.0", "blocks.1.1", "blocks.2.0", "blocks.2.1",
                     "outer.0", "outer.1"]
    assert all(isinstance(net.get_submodule(n), Checkpointed) for n in names)
    assert not any(isinstance(m, Checkpointed) for m in net.outer[0].block.modules())
    assert checkpoint_blocks(net) == names  # a second call changes nothing
    assert gpurec.checkpoint_blocks(net) == names
    with pytest.raises(NoRepeatedBlocks, match="torch.utils.checkpoint"):
        checkpoint_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)))  # leaves only


@pytest.mark.parametrize("name, first, count", [("resnet18", "layer1.0", 8), ("vit_b_16", "encoder.layers.encoder_layer_0", 12),
                                                ("mobilenet_v2", "features.1", 17), ("gpt_d512", "blocks.0", 6)])
def test_named_networks_checkpoint_the_blocks_users_would(name: str, first: str, count: int) -> None:
    names = checkpoint_blocks(resolve_model(name)[1])
    assert names[0] == first and len(names) == count


def test_checkpointed_blocks_compute_the_same_and_run_their_forward_again_in_backward() -> None:
    torch.manual_seed(0)
    plain = _Net()
    ckpt = copy.deepcopy(plain)
    checkpoint_blocks(ckpt)
    x = torch.randn(5, 8)
    calls: list[int] = []
    ckpt.outer[0].block.register_forward_pre_hook(lambda *_: calls.append(1))
    for net in (plain, ckpt):
        net(x).square().sum().backward()
    assert torch.allclose(plain(x), ckpt(x))
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad), n
    assert len(calls) == 3  # forward and its recomputation in backward, then the plain forward above
    with torch.no_grad():
        ckpt(x)
    assert len(calls) == 4  # no autograd, no checkpoint: called once


class _DenseLayer(nn.Module):
    """DenseNet's pattern: a layer takes the list of all earlier features, which its parent
    appends to after the call."""

    def __init__(self, c_in: int, growth: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(c_in, growth)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        return torch.tanh(self.lin(torch.cat(feats, 1)))


class _DenseBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_DenseLayer(6 + 4 * i) for i in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [x]
        for layer in self.layers:
            feats.append(layer(feats))
        return torch.cat(feats, 1)


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2,
                                   enable_nested_tensor=False), (2, 5, 16)),
    (_DenseBlock, (3, 6))])
def test_parents_that_look_into_or_append_after_their_blocks_train_checkpointed(make: Any, shape: tuple[int, ...]) -> None:
    # nn.TransformerEncoder reads layers[0].self_attn; DenseNet appends to the list a layer was given,
    # which the recomputation in backward would otherwise see grown (both failed on an H100, session 53)
    torch.manual_seed(0)
    plain = make()
    ckpt = copy.deepcopy(plain)
    assert len(checkpoint_blocks(ckpt)) >= 2
    x = torch.randn(*shape)
    for net in (plain, ckpt):
        net(x).square().sum().backward()
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), n


def test_extraction_marks_each_block_and_memory_keeps_only_their_inputs() -> None:
    shape = (4, 3, 64, 64)
    plain = extract_operations("resnet18", shape, mode="training")
    net = resolve_model("resnet18")[1]
    checkpoint_blocks(net)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ckpt = extract_operations(net, shape, mode="training")
    assert sorted(op.signature for op in ckpt) == sorted(op.signature for op in plain)
    regions = {op.checkpoint_region for op in ckpt if op.recomputed}
    assert len(regions) == 8  # one per BasicBlock
    # the stem and the head run once; every other operation is inside a block
    assert [op.name for op in ckpt if not op.recomputed] == ["conv1", "bn1", "relu", "maxpool", "avgpool", "flatten",
                                                             "fc"]
    assert memory_terms(ckpt, "training").activations_bytes < memory_terms(plain, "training").activations_bytes


class _DropBlock(nn.Module):
    def __init__(self, d: int = 64, h: int = 1024) -> None:
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(d, h), nn.Dropout(0.5), nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(self.drop(torch.relu(self.a(x))))


def _activations_bytes(blocks: int, checkpointed: bool) -> int:
    net = nn.Sequential(*(_DropBlock() for _ in range(blocks)))
    if checkpointed:
        checkpoint_blocks(net)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ops = extract_operations(net, (4096, 64), mode="training")
    return memory_terms(ops, "training").activations_bytes


def test_a_checkpointed_blocks_dropout_mask_lives_only_while_backward_runs_that_block() -> None:
    # each block's dropout mask is 4 MiB (4096 x 1024 bytes), its input 1 MiB: plain, every mask is
    # kept from forward to backward; checkpointed, forward keeps none (masks, attention internals
    # and autograd's copies counted from forward on put a ViT's checkpointed peak 66% over the
    # measured one, session 53), so four more blocks add about their inputs alone
    mask = 4096 * 1024
    assert (_activations_bytes(8, False) - _activations_bytes(4, False)) / 4 > mask
    assert (_activations_bytes(8, True) - _activations_bytes(4, True)) / 4 < mask / 2


class _DtypePredictor(AskedPredictor):
    """AskedPredictor that also remembers the module and input dtype it was asked for."""

    def predict(self, model, input_shape, mode="inference", gpu="H100", host=None, **kwargs):
        self.modules = getattr(self, "modules", []) + [(model, kwargs.pop("dtype", None))]
        return super().predict(model, input_shape, mode, gpu, host, **kwargs)


def test_validate_a_checkpointed_step_predicts_it_checkpointed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gpurec.validate.run as val_run

    log = tmp_path / "checkpoint.jsonl"
    monkeypatch.setattr(val_run, "load_predictor_or_none", lambda: None)
    meas = {**MEAS, "peak_memory_bytes": 2.0e9}
    rec = val.validate("gpt_d512", 2, mode="training", log_path=log, measurement=meas, seq_len=64,
                       checkpoint_blocks=True)
    assert rec["checkpoint_blocks"] is True and rec["measured_peak_memory_gb"] == pytest.approx(2.0)
    assert not any(k.startswith("opsum_") for k in rec)  # the rows are the plain network's
    p = _DtypePredictor()
    assert val.complete_log(log, predictor=p) == 1
    module, dtype = p.modules[-1]
    assert isinstance(module, nn.Module) and dtype == torch.long
    assert sum(isinstance(m, Checkpointed) for m in module.modules()) == 6
    done = val.load_log(log)[0]
    ops = extract_operations(module, (2, 64), mode="training", dtype=torch.long)
    from gpurec.ops.memory import step_memory

    assert done["predicted_peak_memory_gb"] == pytest.approx(step_memory(ops, "training").memory_gb)
    assert done["peak_memory_error_pct"] == pytest.approx((done["predicted_peak_memory_gb"] / 2.0 - 1) * 100)
    text = val.render(done)
    assert "checkpointed" in text and "peak memory" in text
    plain = val.validate("gpt_d512", 2, mode="training", log_path=None, predictor=p, measurement=meas, seq_len=64)
    assert p.modules[-1] == ("gpt_d512", None) and "checkpoint_blocks" not in plain


def test_the_measured_network_unit_runs_its_blocks_checkpointed() -> None:
    from gpurec.collect.runner import NetworkUnit

    unit = NetworkUnit("resnet18", (2, 3, 32, 32), "training", "cpu", checkpoint_blocks=True)
    assert unit.checkpointed_blocks[0] == "layer1.0" and len(unit.checkpointed_blocks) == 8
    calls: list[int] = []
    unit.model.get_submodule("layer4.1").block.register_forward_pre_hook(lambda *_: calls.append(1))
    unit.step()
    assert len(calls) == 2  # the forward, then its recomputation in backward
    plain = NetworkUnit("resnet18", (2, 3, 32, 32), "training", "cpu")
    assert not hasattr(plain, "checkpointed_blocks") and not any(isinstance(m, Checkpointed)
                                                                  for m in plain.model.modules())


def test_gpurec_predict_checkpoint_blocks_prices_the_blocks_again_or_refuses() -> None:
    import json

    from typer.testing import CliRunner

    import cli

    args = ["predict", "-b", "4", "-r", "64", "--mode", "training", "--gpu", "H100", "--format", "json"]
    runner = CliRunner()
    plain = json.loads(runner.invoke(cli.app, [*args, "--model", "resnet18"]).stdout)
    res = runner.invoke(cli.app, [*args, "--model", "resnet18", "--checkpoint-blocks"])
    ckpt = json.loads(res.stdout)
    assert ckpt["checkpointed_blocks"][:2] == ["layer1.0", "layer1.1"] and len(ckpt["checkpointed_blocks"]) == 8
    assert ckpt["recomputed_ops"] > 0 and "checkpointed_blocks" not in plain
    assert ckpt["gpu_time_ms"] == pytest.approx(plain["gpu_time_ms"] + ckpt["recompute_gpu_time_ms"], rel=1e-6)
    assert ckpt["memory_gb"] < plain["memory_gb"]
    refused = runner.invoke(cli.app, [*args, "--model", "vgg11", "--checkpoint-blocks"])
    assert refused.exit_code != 0 and "no repeated block" in refused.output


def test_gpurec_recommend_checkpoint_blocks_ranks_the_checkpointed_step() -> None:
    import json

    from typer.testing import CliRunner

    import cli

    args = ["recommend", "-b", "4", "-r", "64", "--mode", "training", "--gpus", "H100,H200", "--format", "json",
            "--model", "resnet18"]
    runner = CliRunner()
    plain = json.loads(runner.invoke(cli.app, args).stdout)
    ckpt = json.loads(runner.invoke(cli.app, [*args, "--checkpoint-blocks"]).stdout)
    assert len(ckpt["checkpointed_blocks"]) == 8 and "checkpointed_blocks" not in plain
    assert ckpt["memory_gb"] < plain["memory_gb"]
    assert [r["gpu"] for r in ckpt["ranking"]] == [r["gpu"] for r in plain["ranking"]]
    for a, b in zip(ckpt["ranking"], plain["ranking"], strict=True):
        assert a["gpu_time_ms"] > b["gpu_time_ms"]  # the recomputation costs time on every GPU
