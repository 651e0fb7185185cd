"""gpurec.ops: extraction, FLOP coverage, runnable units and signature stability across torch versions.

Extraction runs on the meta device, so resolution costs nothing there; units run on the CPU
at small batch sizes and resolutions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpurec.dataset.store import raw_row_files, read_jsonl
from gpurec.ops import (
    ExtractionError,
    Operation,
    UnknownModel,
    classification_models,
    extract_operations,
    network_totals,
    reference_flops,
    unique_operations,
)

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ROOT / "datasets"
MODES = ("inference", "training")
B2 = (2, 3, 224, 224)


@cache
def ops_of(model: str, mode: str, shape: tuple[int, ...] = B2) -> tuple[Operation, ...]:
    return tuple(extract_operations(model, shape, mode=mode))


def kinds(ops: tuple[Operation, ...] | list[Operation]) -> set[str]:
    return {op.kind for op in ops}


# -- a custom module with functional operations ------------------------------------------------

class Hybrid(nn.Module):
    """Conv stem, residual add, cat, flatten, MHA, hand-written SDPA attention, functional pools."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.skip = nn.Identity()
        self.drop = nn.Dropout(0.1)
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)
        self.qkv = nn.Linear(32, 96)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn(self.conv(x)))
        y = self.skip(y) + self.conv2(y)  # residual add
        y = torch.cat([y, F.relu(y)], dim=1)  # 32 channels
        t = torch.flatten(y, 2).transpose(1, 2)  # (B, HW, 32)
        a, _ = self.mha(t, t, t)
        t = t + a
        q, k, v = self.qkv(t).chunk(3, dim=-1)
        b, n, c = q.shape
        q, k, v = (z.reshape(b, n, 4, c // 4).transpose(1, 2) for z in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
        t = self.drop(t + o)
        t = F.dropout(t, 0.2, training=self.training)  # eval: a no-op like nn.Dropout
        p = F.adaptive_avg_pool2d(t.transpose(1, 2).reshape(b, c, 8, 8), 1)
        return self.fc(torch.flatten(p, 1))


HYBRID_SHAPE = (2, 3, 8, 8)


@pytest.mark.parametrize("mode", MODES)
def test_custom_module_functional_ops(mode: str) -> None:
    model = Hybrid()
    ops = extract_operations(model, HYBRID_SHAPE, mode=mode)
    k = kinds(ops)
    assert k >= {"Conv2d", "BatchNorm2d", "relu", "add", "cat", "flatten", "MultiheadAttention",
                 "scaled_dot_product_attention", "adaptive_avg_pool2d", "Linear", "chunk", "transpose"}
    assert "Identity" not in k
    # nn.Dropout and F.dropout (the same kernel, so the module's kind): operations in training only
    assert sum(op.kind == "Dropout" for op in ops) == (2 if mode == "training" else 0)
    assert all(op.model == "Hybrid" and op.mode == mode for op in ops)
    sdpa = next(op for op in ops if op.kind == "scaled_dot_product_attention")
    assert sdpa.input_shapes == [[2, 4, 64, 8]] * 3 and sdpa.flops == 4 * 2 * 4 * 64 * 64 * 8
    mha = next(op for op in ops if op.kind == "MultiheadAttention")
    assert mha.settings["embed_dim"] == 32 and mha.settings["num_heads"] == 4 and mha.params == 4 * 32 * 33
    adds = [op for op in ops if op.kind == "add"]
    assert len(adds) == 3 and adds[0].input_shapes == [[2, 16, 8, 8], [2, 16, 8, 8]]
    # the first operation reads the network input, which never needs a gradient
    assert ops[0].kind == "Conv2d" and ops[0].input_requires_grad == [False]
    if mode == "training":
        assert all(all(op.input_requires_grad) for op in ops[1:])
        assert ops[0].flops_bwd == ops[0].flops  # weight gradient only
        assert ops[1].flops_bwd > 0
        # weightless product with q, k, v needing gradients: two forwards' worth (dQ/dK and dV/dP)
        assert sdpa.flops_bwd == 2 * sdpa.flops
    else:
        assert not any(any(op.input_requires_grad) for op in ops) and all(op.flops_bwd == 0 for op in ops)
    # the user's module is left as it was: on the CPU, in its own mode
    assert next(model.parameters()).device.type == "cpu" and model.training
    assert sum(op.flops for op in ops) == reference_flops(model, HYBRID_SHAPE, mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("make", [Hybrid, lambda: __import__("torchvision").models.resnet18()])
def test_in_place_fast_path_matches_copy_and_restores_module(mode: str, make) -> None:
    """keep_sources=False swaps the caller's tensors to meta instead of deep-copying the module:
    same operations as the copy path, and the module comes back with its tensors and flags."""
    model = make().eval()
    model.layer1.train() if hasattr(model, "layer1") else model.bn.train()  # mixed flags survive
    flags = [m.training for m in model.modules()]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = {k: id(v) for k, v in model.named_parameters()}
    shape = HYBRID_SHAPE if isinstance(model, Hybrid) else (2, 3, 64, 64)
    fast = extract_operations(model, shape, mode=mode, keep_sources=False)
    slow = extract_operations(model, shape, mode=mode, keep_sources=True)
    assert [op.signature for op in fast] == [op.signature for op in slow]
    assert [op.flops_bwd for op in fast] == [op.flops_bwd for op in slow]
    assert [m.training for m in model.modules()] == flags
    assert {k: id(v) for k, v in model.named_parameters()} == ids
    after = model.state_dict()
    assert all(after[k].device.type == "cpu" and torch.equal(after[k], v) for k, v in before.items())


def test_in_place_fast_path_restores_module_after_an_error() -> None:
    model = Hybrid().eval()
    with pytest.raises(ExtractionError):
        extract_operations(model, (2, 5, 8, 8), mode="training", keep_sources=False)  # wrong channels
    assert not any(m.training for m in model.modules())
    assert all(t.device.type == "cpu" for t in model.state_dict().values())


def test_custom_module_records_are_json_and_features_are_finite() -> None:
    ops = extract_operations(Hybrid(), HYBRID_SHAPE, mode="training")
    for op in ops:
        rec = op.to_record()
        json.dumps(rec)
        assert rec["op_signature"] == op.signature and len(op.signature) == 16
        assert all(v == v for v in op.features().values())  # no NaN
        assert op.bytes_read > 0 and op.bytes_written > 0


# -- torchvision models ------------------------------------------------------------------------

EXPECTED_KINDS = {
    "vit_b_16": {"Conv2d", "LayerNorm", "Linear", "MultiheadAttention", "GELU", "add", "cat"},
    "swin_t": {"Conv2d", "LayerNorm", "Linear", "GELU", "shifted_window_attention", "add", "permute",
               "AdaptiveAvgPool2d"},
    "convnext_tiny": {"Conv2d", "LayerNorm", "layer_norm", "Linear", "GELU", "mul", "add", "permute"},
    "efficientnet_b0": {"Conv2d", "BatchNorm2d", "SiLU", "Sigmoid", "mul", "add", "AdaptiveAvgPool2d", "Linear"},
    "mobilenet_v3_large": {"Conv2d", "BatchNorm2d", "ReLU", "Hardswish", "Hardsigmoid", "mul", "add", "Linear"},
    "resnet50": {"Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "add", "AdaptiveAvgPool2d", "flatten", "Linear"},
    "googlenet": {"Conv2d", "BatchNorm2d", "relu", "MaxPool2d", "cat", "AdaptiveAvgPool2d", "Linear"},
    "regnet_y_400mf": {"Conv2d", "BatchNorm2d", "ReLU", "Sigmoid", "mul", "add", "Linear"},
}
# Work that only exists in training (dropout p>0 or p=0 modules, stochastic depth).
TRAIN_ONLY = {
    "vit_b_16": {"Dropout"},
    "swin_t": {"Dropout", "StochasticDepth"},
    "convnext_tiny": {"StochasticDepth"},
    "efficientnet_b0": {"Dropout", "StochasticDepth"},
    "mobilenet_v3_large": {"Dropout"},
    "resnet50": set(),
    "googlenet": {"Dropout", "adaptive_avg_pool2d"},
    "regnet_y_400mf": set(),
}


@pytest.mark.parametrize("model", sorted(EXPECTED_KINDS))
def test_torchvision_extraction(model: str) -> None:
    inf, train = ops_of(model, "inference"), ops_of(model, "training")
    for mode, ops in (("inference", inf), ("training", train)):
        k = kinds(ops)
        assert k >= EXPECTED_KINDS[model], (mode, EXPECTED_KINDS[model] - k)
        assert "Identity" not in k
        assert all(op.mode == mode and op.model == model and op.dtype == "float32" for op in ops)
        assert ops[0].input_requires_grad == [False] * len(ops[0].input_shapes)
        assert all(op.output_shapes for op in ops)
    assert kinds(train) >= TRAIN_ONLY[model]
    assert not kinds(inf) & (TRAIN_ONLY[model] | {"Dropout", "dropout", "StochasticDepth"})
    # past the first layer with weights, every activation input in training carries a gradient
    # (Swin's _get_relative_position_bias reads only parameters: it has no activation input)
    first_param = next(i for i, op in enumerate(train) if op.params > 0)
    assert all(all(op.input_requires_grad) for op in train[first_param + 1:] if op.input_shapes)
    assert all(op.flops_bwd >= op.flops for op in train)
    assert sum(op.params for op in inf) > 0


def test_googlenet_aux_classifiers_only_in_training() -> None:
    inf, train = ops_of("googlenet", "inference"), ops_of("googlenet", "training")
    assert not any(op.name.startswith("aux") for op in inf)
    aux = [op for op in train if op.name.startswith(("aux1.", "aux2."))]
    assert {op.name for op in aux} >= {"aux1.conv.conv", "aux1.fc1", "aux1.fc2", "aux2.fc2", "aux1.dropout"}
    assert [op.name for op in inf if op.kind == "Linear"] == ["fc"]
    assert [op.name for op in train if op.kind == "Linear"] == ["aux1.fc1", "aux1.fc2", "aux2.fc1", "aux2.fc2", "fc"]
    assert [op.name for op in train if op.kind == "Dropout"] == ["aux1.dropout", "aux2.dropout", "dropout"]
    assert len(train) > len(inf)


def test_batchnorm_mode_is_part_of_identity() -> None:
    # BatchNorm in training normalises with batch statistics and requires input grads:
    # a different operation from eval BatchNorm with the same shape
    inf = {op.signature for op in ops_of("resnet50", "inference") if op.kind == "BatchNorm2d"}
    train = {op.signature for op in ops_of("resnet50", "training") if op.kind == "BatchNorm2d"}
    assert inf and train and not inf & train


def test_deduplication_across_resnets() -> None:
    r18 = extract_operations("resnet18", (2, 3, 224, 224), keep_sources=False)
    r34 = extract_operations("resnet34", (2, 3, 224, 224), keep_sources=False)
    s18, s34 = {op.signature for op in r18}, {op.signature for op in r34}
    shared = s18 & s34
    assert r18[0].signature in shared  # the stem
    assert {op.kind for op in r18 if op.signature in shared} >= {"Conv2d", "BatchNorm2d", "ReLU", "add", "MaxPool2d"}
    uniq = unique_operations([r18, r34])
    assert set(uniq) == s18 | s34 and len(uniq) < len(s18) + len(s34)
    assert all(uniq[s].model == "resnet18" for s in s18)  # first seen wins
    totals = network_totals(r34)
    assert totals["operations"] == len(r34) > totals["distinct_operations"] == len(s34)
    assert totals["params"] == pytest.approx(21.8e6, rel=0.01)
    # names (where an operation sits) are not identity: repeated blocks share a signature
    assert len(r18) > len(s18)


def test_signatures_are_stable_and_shape_sensitive() -> None:
    a = extract_operations("resnet18", (2, 3, 224, 224), keep_sources=False)
    b = extract_operations("resnet18", (2, 3, 224, 224), keep_sources=False)
    c = extract_operations("resnet18", (4, 3, 224, 224), keep_sources=False)
    assert [op.signature for op in a] == [op.signature for op in b]
    assert not {op.signature for op in a} & {op.signature for op in c}
    half = extract_operations("resnet18", (2, 3, 224, 224), dtype=torch.float16, keep_sources=False)
    assert half[0].dtype == "float16" and half[0].signature != a[0].signature


# -- FLOP coverage -----------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["vit_b_16", "swin_t", "efficientnet_b0", "convnext_tiny", "resnet50",
                                   "mobilenet_v3_large", "googlenet"])
def test_flops_match_flop_counter(model: str) -> None:
    for mode in MODES:
        ours = sum(op.flops for op in ops_of(model, mode))
        ref = reference_flops(model, B2, mode=mode)
        assert ref > 0
        assert ours == pytest.approx(ref, rel=0.01), (model, mode)


def test_known_flop_counts() -> None:
    # 2 x MACs, FlopCounterMode's convention: resnet50 is 4.1 GMACs per image
    assert sum(op.flops for op in ops_of("resnet50", "inference")) == pytest.approx(2 * 4.09e9 * 2, rel=0.01)
    # googlenet's auxiliary classifiers add forward work in training only
    assert sum(op.flops for op in ops_of("googlenet", "training")) > sum(op.flops for op in ops_of("googlenet", "inference"))


# -- runnable units ----------------------------------------------------------------------------

@pytest.fixture
def one_thread() -> Iterator[None]:
    """Many tiny kernels run faster on one thread than two on a shared 2-core CI machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


UNIT_MODELS = [("resnet18", (2, 3, 64, 64)), ("mobilenet_v3_large", (2, 3, 64, 64)),
               ("vit_b_32", (2, 3, 224, 224)), ("swin_t", (2, 3, 64, 64))]


def _run_units(ops: list[Operation] | tuple[Operation, ...], mode: str) -> int:
    distinct = unique_operations([ops])
    for op in distinct.values():
        unit = op.materialize(device="cpu", instances=2 if op.params else 1, seed=1)
        assert unit.instances == (2 if op.params else 1)
        if mode == "inference":
            with torch.inference_mode():
                unit.step()
                unit.step()  # second instance
            assert not unit.backward
        else:
            with torch.enable_grad():
                unit.step()
                unit.step()
            # every operation whose output needs a gradient runs its backward
            assert unit.backward == (op.params > 0 or any(op.input_requires_grad)), op.kind
            if unit.backward:
                assert all(x.grad is None for x in unit.inputs)  # reset after each step
    return len(distinct)


@pytest.mark.parametrize("mode", MODES)
def test_units_run_forward_and_backward_on_cpu(mode: str, one_thread: None) -> None:
    n = 0
    for model, shape in UNIT_MODELS:
        n += _run_units(ops_of(model, mode, shape), mode)
    n += _run_units(extract_operations(Hybrid(), HYBRID_SHAPE, mode=mode), mode)
    assert n > 150


def test_unit_output_shapes_match_extraction(one_thread: None) -> None:
    for op in unique_operations([ops_of("resnet18", "inference", (2, 3, 64, 64))]).values():
        unit = op.materialize()
        with torch.inference_mode():
            out = unit._calls[0]()
        outs = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
        assert [list(t.shape) for t in outs] == op.output_shapes, op.kind


def test_operation_without_source_cannot_be_materialized() -> None:
    op = extract_operations("resnet18", (1, 3, 64, 64), keep_sources=False)[0]
    assert op.source is None
    with pytest.raises(ValueError, match="keep_sources=True"):
        op.materialize()


# -- signature stability across torch versions -------------------------------------------------

@lru_cache(maxsize=1)
def plan_items() -> frozenset[tuple[str, str]]:
    data = json.loads((DATASETS / "plans" / "main.json").read_text())
    return frozenset((w["key"], w["mode"]) for w in data["items"] if w["item"] == "op")


@lru_cache(maxsize=1)
def measured() -> dict[tuple[str, str], set[str]]:
    """Operation signatures the GPU machines' torch 2.11 measured, by (set key, mode)."""
    out: dict[tuple[str, str], set[str]] = {}
    for raw_dir in sorted(DATASETS.glob("*/raw")):
        for r in (r for p in raw_row_files(raw_dir) for r in read_jsonl(p, allow_corrupt=True)):
            if r.get("item") == "op" and r.get("status") == "ok" and not r.get("repeat"):
                for key in r.get("model_sets") or [r["set_key"]]:
                    out.setdefault((key, r["mode"]), set()).add(r["op_signature"])
    return out


@pytest.mark.parametrize("arch,batch", [("resnet18", 1), ("vit_b_32", 8)])
@pytest.mark.parametrize("mode", MODES)
def test_golden_signatures_are_in_the_shipped_plan(arch: str, batch: int, mode: str) -> None:
    ops = extract_operations(arch, (batch, 3, 224, 224), mode=mode, keep_sources=False)
    missing = {(op.signature, op.kind) for op in ops if (op.signature, mode) not in plan_items()}
    assert not missing, f"{arch} b{batch} {mode}: signatures changed for {sorted(missing)[:5]}"


def test_golden_signature_literals() -> None:
    """Literal keys, so a change to the signature format fails even if the plan is regenerated."""
    assert extract_operations("resnet18", (8, 3, 224, 224), keep_sources=False)[0].signature == "a5d6738af754e42a"
    vit = extract_operations("vit_b_32", (8, 3, 224, 224), mode="training", keep_sources=False)
    assert [op.signature for op in vit[:3]] == ["756c3d883e361102", "6a518a299faaad43", "7a49bb80866a1841"]
    assert "a5d6738af754e42a" in measured()[("resnet18:b8:r224", "inference")]


def test_shipped_rows_carry_signatures() -> None:
    rows = measured()
    assert sum(len(v) for v in rows.values()) > 1000
    assert all(len(s) == 16 and int(s, 16) >= 0 for v in rows.values() for s in v)


CROSS_VERSION_SETS = ["resnet18:b8:r224", "resnet50:b1:r224", "vit_b_32:b8:r224", "swin_t:b1:r224",
                      "efficientnet_b0:b1:r224", "googlenet:b32:r224", "convnext_tiny:b8:r224",
                      "mobilenet_v3_large:b1:r224", "densenet121:b8:r224", "regnet_y_400mf:b1:r224"]


@pytest.mark.parametrize("set_key", CROSS_VERSION_SETS)
def test_gpu_machine_signatures_are_refound_here(set_key: str) -> None:
    """The cross-version agreement test: every operation the GPU machines (torch 2.11) measured
    for a model-input set is extracted, with the same signature, by this torch."""
    import pandas as pd

    arch, b, r = set_key.split(":")
    shape = (int(b[1:]), 3, int(r[1:]), int(r[1:]))
    frames = []
    for p in sorted(DATASETS.glob("*/operations.parquet")):
        f = pd.read_parquet(p)
        f["precision"] = f["precision"].fillna("fp32") if "precision" in f else "fp32"
        frames.append(f[["set_key", "model_sets", "mode", "op_signature", "op_kind", "torch", "precision"]])
    df = pd.concat(frames)
    # measured where set_key was planned first, or in another set that also contains it
    owners = df["model_sets"].map(lambda v: set(json.loads(v)) if isinstance(v, str) else set())
    df = df[(df["set_key"] == set_key) | owners.map(lambda o: set_key in o)]
    assert len(df) > 0, f"no measured operations for {set_key}"
    assert df["torch"].str.startswith("2.11").all()
    for (mode, precision), part in df.groupby(["mode", "precision"]):  # each precision's own extraction
        want = set(part["op_signature"])
        got = {op.signature for op in extract_operations(arch, shape, mode=mode, keep_sources=False,
                                                         precision=precision)}
        kinds_missing = sorted(set(part.loc[part["op_signature"].isin(want - got), "op_kind"]))
        assert want <= got, (f"{set_key} {mode} {precision}: {len(want - got)} measured signatures not re-found "
                             f"({kinds_missing})")


# -- bad input ---------------------------------------------------------------------------------

def test_unknown_model_suggests_names() -> None:
    with pytest.raises(UnknownModel, match="Did you mean: .*resnet18") as ei:
        extract_operations("resnet19", B2)
    assert isinstance(ei.value, ExtractionError) and isinstance(ei.value, ValueError)
    assert "--list-models" in str(ei.value)
    with pytest.raises(UnknownModel, match="vit_b_16"):
        extract_operations("vit_b16", B2)
    with pytest.raises(UnknownModel, match="Unknown model 'qqqqzzzz'"):
        extract_operations("qqqqzzzz", B2)


def test_a_torchvision_that_does_not_load_with_this_torch_says_how_to_install_a_pair(monkeypatch) -> None:
    """A fresh environment from two package indexes (CPU torch, CUDA torchvision) fails inside
    torchvision's import with "operator torchvision::nms does not exist": one typed error with
    the fix, not a traceback."""
    import importlib
    import importlib.metadata

    import gpurec.ops.extract as extract

    real = importlib.import_module

    def broken(name: str, *args, **kwargs):
        if name.startswith("torchvision"):
            raise RuntimeError("operator torchvision::nms does not exist")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", broken)
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "0.28.0")
    monkeypatch.setattr(extract.torch, "__version__", "2.13.0+cpu")
    with pytest.raises(extract.TorchvisionUnusable) as ei:
        extract.classification_models()
    assert isinstance(ei.value, ExtractionError)  # the CLI's one-line error, exit code 2
    msg = str(ei.value)
    assert "torchvision 0.28.0 does not load with torch 2.13.0+cpu (operator torchvision::nms" in msg
    assert "'torch==2.13.0' 'torchvision==0.28.*'" in msg and "\n" not in msg
    monkeypatch.setattr(extract.torch, "__version__", "2.14.1")
    with pytest.raises(extract.TorchvisionUnusable, match="'torchvision==0.29.*'"):
        extract._build_meta("resnet18")  # building a classifier goes through the same check


@pytest.mark.parametrize("shape,match", [
    ((0, 3, 224, 224), r"must be a positive integer \(0 at position 0\)"),
    ((-2, 3, 224, 224), r"must be a positive integer \(-2 at position 0\)"),
    ((2, 3, 0, 224), r"must be a positive integer \(0 at position 2\)"),
    ((2, 3, 2.7, 224), r"must be a positive integer \(2.7 at position 2\)"),  # never truncated to 2
    ((2, 3, float("nan"), 224), r"must be a positive integer \(nan at position 2\)"),
    ((2, 3, "224", 224), r"must be a positive integer \('224' at position 2\)"),
    ((True, 3, 224, 224), r"must be a positive integer \(True at position 0\)"),
    ((2,), "at least a batch"),
])
def test_bad_shapes(shape: tuple[int, ...], match: str) -> None:
    with pytest.raises(ExtractionError, match=match):
        extract_operations("resnet18", shape)


def test_other_bad_input() -> None:
    with pytest.raises(ExtractionError, match="single number"):
        extract_operations("resnet18", 224)  # type: ignore[arg-type]
    with pytest.raises(ExtractionError, match="mode must be one of"):
        extract_operations("resnet18", B2, mode="train")
    with pytest.raises(ExtractionError, match="nn.Module"):
        extract_operations(42, B2)  # type: ignore[arg-type]
    with pytest.raises(ExtractionError, match="cannot take input shape"):
        extract_operations("vit_b_16", (1, 3, 384, 384))  # ViT's position embedding is for 224
    with pytest.raises(ExtractionError, match="cannot take input shape"):
        extract_operations("resnet18", (1, 3, 32, 32), mode="training")  # BatchNorm on 1 value


def test_classification_models() -> None:
    names = classification_models()
    assert len(names) == 80 and names == sorted(names)
    assert {"resnet18", "vit_b_16", "swin_v2_t", "inception_v3"} <= set(names)


class _TwoOperandProducts(torch.nn.Module):
    """x @ x^T (both operands need a gradient) and a product with a constant operand."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)  # makes its output need a gradient
        self.register_buffer("const", torch.ones(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        return torch.matmul(y, y.transpose(-1, -2)).sum() + torch.matmul(y, self.const).sum()


def test_backward_flops_count_one_forward_per_operand_needing_a_gradient() -> None:
    ops = extract_operations(_TwoOperandProducts(), (2, 4, 8), mode="training")
    mm = [op for op in ops if op.kind == "matmul"]
    assert len(mm) == 2 and all(op.flops > 0 for op in mm)
    both, one = mm
    assert both.input_requires_grad == [True, True] and both.flops_bwd == 2 * both.flops
    assert one.flops_bwd == one.flops  # the buffer operand needs no gradient


@pytest.mark.parametrize("training", [False, True])
def test_analytic_leaves_agree_with_meta_kernels(training: bool) -> None:
    """The shortcut for Conv2d, BatchNorm2d, activations and adaptive average pooling gives the meta kernels' output
    shapes and FlopCounterMode's FLOPs, and declines what it does not handle."""
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    from gpurec.ops.extract import _analytic_leaf

    convs = [nn.Conv2d(8, 16, 3), nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
             nn.Conv2d(8, 8, 5, padding=2, groups=8), nn.Conv2d(8, 12, (1, 3), stride=(2, 1), padding=(0, 1)),
             nn.Conv2d(8, 4, 3, dilation=2, padding=2), nn.Conv2d(8, 24, 7, stride=3, padding=3, groups=4),
             nn.Conv2d(8, 16, 1)]
    others = [nn.BatchNorm2d(8), nn.ReLU(), nn.ReLU(inplace=True), nn.ReLU6(inplace=True), nn.SiLU(), nn.GELU(),
              nn.Hardswish(), nn.Hardsigmoid(), nn.Sigmoid(), nn.Tanh(), nn.Hardtanh(), nn.AdaptiveAvgPool2d(1),
              nn.AdaptiveAvgPool2d((7, 7)), nn.AdaptiveAvgPool2d((None, 2)), nn.AdaptiveAvgPool2d((3, 5))]
    for shape in [(2, 8, 17, 23), (1, 8, 7, 7), (4, 8, 224, 224)]:
        for mod in convs + others:
            mod = mod.to("meta").train(training)
            x = torch.empty(shape, device="meta")
            got = _analytic_leaf(mod, (x,), {})
            assert got is not None, mod
            with FlopCounterMode(display=False) as fc:
                ref = mod(x.clone())
            assert got[0].shape == ref.shape and got[0].stride() == ref.stride() and got[0].dtype == ref.dtype, mod
            assert got[1] == fc.get_total_flops(), mod
    x = torch.empty(2, 8, 9, 9, device="meta")
    declined = [(nn.Conv2d(8, 16, 3, padding="same").to("meta"), (x,)),  # string padding
                (nn.Conv2d(8, 16, 3, padding=1, padding_mode="reflect").to("meta"), (x,)),
                (nn.Conv2d(4, 16, 3).to("meta"), (x,)),  # wrong channel count: the real call raises
                (nn.Conv2d(8, 16, 11).to("meta"), (x,)),  # kernel larger than the input
                (nn.ConvTranspose2d(8, 16, 3).to("meta"), (x,)),
                (nn.ReLU(), (x.transpose(2, 3),)),  # not contiguous
                (nn.BatchNorm2d(4).to("meta"), (x,)),
                (nn.AdaptiveAvgPool2d(1), (torch.empty(2, 8, 0, 9, device="meta"),)),  # empty: the real call raises
                (nn.AdaptiveAvgPool2d(1), (torch.empty(8, 9, 9, device="meta"),))]  # 3-D
    for mod, args in declined:
        assert _analytic_leaf(mod, args, {}) is None, mod
    one = nn.BatchNorm2d(8).to("meta").train()
    assert _analytic_leaf(one, (torch.empty(1, 8, 1, 1, device="meta"),), {}) is None


def test_step_memory_matches_known_pytorch_figures() -> None:
    """resnet50 at batch 256, fp32 training: PyTorch's allocator peaks at about 22-25 GB."""
    from gpurec.ops.memory import step_memory

    train = step_memory(extract_operations("resnet50", (256, 3, 224, 224), mode="training", keep_sources=False))
    assert 20 < train.memory_gb < 25, train
    assert train.params_bytes == train.grads_bytes == 25_557_032 * 4
    infer = step_memory(extract_operations("resnet50", (256, 3, 224, 224), keep_sources=False))
    assert infer.grads_bytes == 0 and 1 < infer.memory_gb < train.memory_gb / 4
    # twice the batch: activations double, parameters do not
    big = step_memory(extract_operations("resnet50", (512, 3, 224, 224), mode="training", keep_sources=False))
    assert abs((big.activations_bytes / train.activations_bytes) - 2) < 0.01


def test_step_memory_liveness_views_and_in_place() -> None:
    """Inference peak is the largest set alive at once; views and in-place ops add no storage."""
    from gpurec.ops.memory import memory_terms, step_memory

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(100, 1000, bias=False)
            self.act = nn.ReLU(inplace=True)
            self.b = nn.Linear(1000, 10, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.act(self.a(x)).reshape(x.shape[0], -1))

    ops = extract_operations(Chain(), (8, 100), keep_sources=False)
    assert [op.in_place for op in ops if op.kind == "ReLU"] == [True]
    mem = step_memory(ops)
    # at its peak (b), the step's input (8x100, held by the caller), a's output (8x1000) and b's
    # output (8x10) are alive; ReLU and reshape share a's output; each in 512-byte blocks
    def blk(n: int) -> int:
        return -(-n // 512) * 512

    assert mem.params_bytes == (100 * 1000 + 1000 * 10) * 4
    assert mem.activations_bytes == blk(8 * 100 * 4) + blk(8 * 1000 * 4) + blk(8 * 10 * 4)
    train = step_memory(extract_operations(Chain(), (8, 100), mode="training", keep_sources=False))
    # the parameters (1.76 MB) outweigh the activations, so training peaks in a's backward, with
    # every parameter gradient: then x, the result and its preallocated gradient, and the
    # gradient of a's output are alive (a's output itself was freed after ReLU's backward)
    assert train.activations_bytes == blk(8 * 100 * 4) + 2 * blk(8 * 10 * 4) + blk(8 * 1000 * 4)
    # autograd keeps x (by a) and a's output (by ReLU, its output in place, and by b)
    assert memory_terms(extract_operations(Chain(), (8, 100), mode="training", keep_sources=False)).saved_bytes \
        == blk(8 * 100 * 4) + blk(8 * 1000 * 4)


def test_shipped_model_names_are_torchvisions() -> None:
    """The quick name check (no torch import) knows exactly the installed torchvision's names."""
    from gpurec.ops.names import TORCHVISION_CLASSIFIERS

    assert list(TORCHVISION_CLASSIFIERS) == classification_models()


def _flop_counter(module: nn.Module, *inputs: torch.Tensor) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        module(*inputs)
    return int(fc.get_total_flops())


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_is_decomposed_into_known_operations(norm_first: bool) -> None:
    """Defect 2: nn.TransformerEncoder was one opaque operation; a bare layer failed to trace."""
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, norm_first=norm_first)
    enc = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
    ops = extract_operations(enc, (2, 10, 64), keep_sources=False)
    kinds = {op.kind for op in ops}
    assert kinds == {"MultiheadAttention", "Linear", "LayerNorm", "add", "relu"}
    assert sum(op.kind == "MultiheadAttention" for op in ops) == 3
    enc.train()  # PyTorch's slow path, the one written out; dropout adds no FLOPs
    assert sum(op.flops for op in ops) == _flop_counter(enc, torch.randn(2, 10, 64))
    train = extract_operations(enc, (2, 10, 64), mode="training", keep_sources=False)
    assert sum(op.kind == "Dropout" for op in train) == 9 and all(op.flops_bwd >= 0 for op in train)
    assert len(extract_operations(nn.TransformerEncoderLayer(64, 4, 128), (10, 2, 64), keep_sources=False)) == 8


def test_transformer_decoder_and_full_transformer_take_example_inputs() -> None:
    tr = nn.Transformer(32, 4, 2, 2, 64, batch_first=True)
    src, tgt = torch.randn(3, 12, 32), torch.randn(3, 7, 32)
    ops = extract_operations(tr, example_inputs=(src, tgt), keep_sources=False)
    assert sum(op.kind == "MultiheadAttention" for op in ops) == 2 + 2 * 2
    assert ops[-1].output_shapes == [[3, 7, 32]]
    tr.train()
    assert sum(op.flops for op in ops) == _flop_counter(tr, src, tgt)


def test_token_id_inputs_with_an_integer_dtype() -> None:
    """Defect 2: models taking integer token ids failed: inputs were always float."""
    import gpurec

    class Tokens(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(100, 32)
            self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2,
                                             enable_nested_tensor=False)
            self.head = nn.Linear(32, 5)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.enc(self.emb(ids)).mean(1))

    ops = gpurec.extract_operations(Tokens(), (4, 20), dtype=torch.long)
    assert ops[0].kind == "Embedding" and ops[-1].output_shapes == [[4, 5]]
    assert all(op.dtype == "float32" for op in ops)  # activations stay float
    same = gpurec.extract_operations(Tokens(), example_inputs=torch.zeros(4, 20, dtype=torch.long))
    assert [op.signature for op in same] == [op.signature for op in ops]
    with pytest.raises(ExtractionError, match="cannot take input"):
        gpurec.extract_operations(Tokens(), (4, 20))  # float ids: the embedding refuses them


def test_whole_number_shapes_of_other_types_are_accepted() -> None:
    import numpy as np

    from gpurec.ops.extract import normalise_input_shape

    assert normalise_input_shape((np.int64(2), 3.0, torch.tensor(32).item(), 32)) == (2, 3, 32, 32)
    assert normalise_input_shape(torch.Size([2, 3, 32, 32])) == (2, 3, 32, 32)


class _NormActFunctional(nn.Module):
    """timm's way: a BatchNorm2d subclass whose forward calls F.batch_norm then its activation, and
    a squeeze-excite gate through the tensor method ``sigmoid``."""

    class BNAct(nn.BatchNorm2d):
        def __init__(self, c: int) -> None:
            super().__init__(c)
            self.act = nn.SiLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                             self.momentum, self.eps)
            return self.act(x)

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3)
        self.bn = self.BNAct(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x))
        return y * y.mean((2, 3), keepdim=True).sigmoid()


class _NormActModules(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.act, self.gate = nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.SiLU(), nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.bn(self.conv(x)))
        return y * self.gate(y.mean((2, 3), keepdim=True))


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_functional_calls_of_a_module_kernel_are_that_module(mode: str) -> None:
    """F.batch_norm and x.sigmoid() run BatchNorm2d's and Sigmoid's kernels: they get those kinds and
    the feature rows the module forms get (weight and bias as parameters, running statistics not), so
    the models predict them from those kinds' rows instead of as unknown kinds."""
    from gpurec.ops.features import operation_feature_row

    functional = extract_operations(_NormActFunctional(), (2, 3, 16, 16), mode=mode)
    modules = extract_operations(_NormActModules(), (2, 3, 16, 16), mode=mode)
    assert [op.kind for op in functional] == [op.kind for op in modules] == [
        "Conv2d", "BatchNorm2d", "SiLU", "mean", "Sigmoid", "mul"]
    assert [operation_feature_row(op) for op in functional] == [operation_feature_row(op) for op in modules]


class _Conv1D(nn.Module):
    """Hugging Face GPT-2's Conv1D: a linear layer as torch.addmm, its weight stored input-major."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(*x.shape[:-1], -1)


class _TwoActivationsAddmm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(x[:, 0], x, x.t())


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_addmm_of_a_bias_and_a_weight_is_a_linear_layer(mode: str) -> None:
    """GPT-2's Conv1D runs the GEMM nn.Linear runs: it takes Linear's kind and in/out features, with
    the FLOPs, bytes and parameters of nn.Linear on the same rows; an addmm of activations keeps its
    own kind."""
    conv1d = extract_operations(_Conv1D(96, 32), (6, 32), mode=mode)
    linear = extract_operations(nn.Linear(32, 96), (6, 32), mode=mode)
    gemm = next(op for op in conv1d if not op.kernel_free)
    assert gemm.kind == "Linear" and gemm.settings["in_features"] == 32 and gemm.settings["out_features"] == 96
    assert (gemm.flops, gemm.flops_bwd, gemm.bytes_read, gemm.bytes_written, gemm.params) == (
        linear[0].flops, linear[0].flops_bwd, linear[0].bytes_read, linear[0].bytes_written, linear[0].params)
    assert [op.kind for op in extract_operations(_TwoActivationsAddmm(), (8, 8), mode=mode)
            if op.kind in ("addmm", "Linear")] == ["addmm"]


class _OneD(nn.Module):
    """A 1-D CNN as text and audio models write one."""

    def __init__(self, two_d: bool = False) -> None:
        super().__init__()
        if two_d:  # the same network as the 2-D kernels of height 1 that ATen runs it as
            self.conv = nn.Conv2d(16, 32, (1, 5), stride=(1, 2), padding=(0, 2), groups=2)
            self.pools = nn.Sequential(nn.MaxPool2d((1, 3), (1, 2), (0, 1)), nn.AvgPool2d((1, 2)),
                                       nn.AdaptiveMaxPool2d((1, 8)), nn.AdaptiveAvgPool2d((1, 1)))
        else:
            self.conv = nn.Conv1d(16, 32, 5, stride=2, padding=2, groups=2)
            self.pools = nn.Sequential(nn.MaxPool1d(3, 2, 1), nn.AvgPool1d(2), nn.AdaptiveMaxPool1d(8),
                                       nn.AdaptiveAvgPool1d(1))
        self.two_d = two_d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pools(self.conv(x.unsqueeze(2) if self.two_d else x)).flatten(1)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_one_d_convolutions_and_pools_are_their_height_one_2d_kernels(mode: str) -> None:
    """Conv1d and the 1-D pools are the 2-D operations of height 1 the GPU runs (same kind,
    features and shapes as the hand-written 2-D network), so the 2-D rows predict them;
    an unbatched input keeps its own kind."""
    one = [op for op in extract_operations(_OneD(), (4, 16, 100), mode=mode) if op.kind != "flatten"]
    two = [op for op in extract_operations(_OneD(two_d=True), (4, 16, 100), mode=mode)
           if op.kind not in ("flatten", "unsqueeze")]
    assert [op.kind for op in one] == ["Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveMaxPool2d", "AdaptiveAvgPool2d"]
    from gpurec.ops.features import operation_feature_row

    assert [(operation_feature_row(op), op.output_shapes, op.params) for op in one] == \
        [(operation_feature_row(op), op.output_shapes, op.params) for op in two]
    assert one[0].signature == two[0].signature  # the convolution: the same settings, written alike
    (unbatched,) = extract_operations(nn.Sequential(nn.Conv1d(16, 32, 5)), example_inputs=(torch.zeros(16, 100),),
                                      mode=mode)
    assert unbatched.kind == "Conv1d" and unbatched.input_shapes == [[16, 100]]


class _ConvPoolNet(nn.Module):
    """A hand-written CNN in module form, or the same network in functional form (F.conv2d on its
    parameters, F.max_pool2d and F.avg_pool2d, and their 1-D forms), as users write both."""

    def __init__(self, functional: bool) -> None:
        super().__init__()
        self.functional = functional
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, stride=2, groups=2, bias=False)
        self.p1, self.p2 = nn.MaxPool2d(2), nn.AvgPool2d(3, stride=1, padding=1)
        self.c3, self.p3 = nn.Conv1d(32, 8, 5, padding="same"), nn.MaxPool1d(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.functional:
            x = F.max_pool2d(F.conv2d(x, self.c1.weight, self.c1.bias, padding=1), 2)
            x = F.avg_pool2d(F.conv2d(x, self.c2.weight, None, 2, 0, 1, 2), kernel_size=3, stride=1, padding=1)
            return F.max_pool1d(F.conv1d(x.flatten(2), self.c3.weight, self.c3.bias, padding="same"), 3, 2)
        return self.p3(self.c3(self.p2(self.c2(self.p1(self.c1(x)))).flatten(2)))


class _StandardisedConv(nn.Module):
    """A weight-standardised convolution: F.conv2d of a weight computed in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 4, 3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight - self.weight.mean((1, 2, 3), keepdim=True)
        return F.conv2d(x, w, stride=2)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_functional_convolutions_and_pools_are_their_modules_with_its_settings(mode: str) -> None:
    """F.conv2d, F.max_pool2d, F.avg_pool2d (and the 1-D forms) run their modules' kernels: they
    take the module's kind and the settings it would hold, read from the call's arguments, so their
    feature rows are the module network's and the models predict them from those kinds' rows (they
    were unknown kinds: inception_v3 calls F.max_pool2d and F.avg_pool2d).  A weight computed in
    forward counts as the convolution's second input."""
    from gpurec.ops.features import operation_feature_row

    def kept(net: nn.Module) -> list[Operation]:
        return [op for op in extract_operations(net, (2, 3, 32, 32), mode=mode) if op.kind != "flatten"]

    functional, modules = kept(_ConvPoolNet(True)), kept(_ConvPoolNet(False))
    assert [op.kind for op in functional] == [op.kind for op in modules] == [
        "Conv2d", "MaxPool2d", "Conv2d", "AvgPool2d", "Conv2d", "MaxPool2d"]
    assert [(operation_feature_row(op), op.output_shapes, op.params) for op in functional] == \
        [(operation_feature_row(op), op.output_shapes, op.params) for op in modules]
    conv = next(op for op in extract_operations(_StandardisedConv(), (2, 4, 16, 16), mode=mode) if op.kind == "Conv2d")
    assert (conv.settings["in_channels"], conv.settings["out_channels"], conv.settings["kernel_size"],
            conv.settings["stride"]) == (4, 8, [3, 3], [2, 2])
    assert conv.input_shapes == [[2, 4, 16, 16], [8, 4, 3, 3]]


class _StopGradient(nn.Module):
    """A head over a detached (stop-gradient) body output, as a target network or a probe is."""

    def __init__(self, detach: bool) -> None:
        super().__init__()
        self.detach = detach
        self.body, self.head = nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(x))
        return self.head(h.detach() if self.detach else h)


def test_a_detached_tensor_carries_no_gradient_into_what_reads_it() -> None:
    """x.detach() cuts the graph: in training the head reading it computes its weight's gradient
    only (no input gradient, half the backward FLOPs), as PyTorch runs it; without the detach the
    head's input carries a gradient."""
    (cut,) = [op for op in extract_operations(_StopGradient(True), (4, 32), mode="training") if op.name == "head"]
    (whole,) = [op for op in extract_operations(_StopGradient(False), (4, 32), mode="training") if op.name == "head"]
    assert cut.input_requires_grad == [False] and whole.input_requires_grad == [True]
    assert cut.flops_bwd == whole.flops_bwd // 2 == cut.flops


class _EinsumAttention(nn.Module):
    """Attention scores and mix as einsum users write them, or as the bmm ATen runs them as."""

    def __init__(self, as_bmm: bool = False) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.as_bmm = as_bmm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 16).unbind(2)  # (batch, tokens, heads, head width)
        if not self.as_bmm:
            att = torch.einsum("bqhd,bkhd->bhqk", q, k).softmax(-1)
            return torch.einsum("bhqk,bkhd->bqhd", att, v).sum()
        q, k, v = (z.transpose(1, 2).reshape(b * 4, t, 16) for z in (q, k, v))
        att = torch.bmm(q, k.transpose(1, 2)).softmax(-1)
        return torch.bmm(att, v).sum()


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_two_operand_einsum_is_the_bmm_aten_runs(mode: str) -> None:
    """A contracting two-operand einsum is the bmm of (batch, rows, contracted) by (batch,
    contracted, columns) that at::einsum runs, with the hand-written bmm's features, so bmm's rows
    predict it; an einsum that contracts nothing or sums within one operand keeps its kind."""
    from gpurec.ops.features import operation_feature_row

    ein = [op for op in extract_operations(_EinsumAttention(), (2, 10, 64), mode=mode) if op.kind == "bmm"]
    mm = [op for op in extract_operations(_EinsumAttention(as_bmm=True), (2, 10, 64), mode=mode)
          if op.kind == "bmm"]
    assert [op.input_shapes for op in ein] == [[[8, 10, 16], [8, 16, 10]], [[8, 10, 10], [8, 10, 16]]]
    assert [(operation_feature_row(op), op.output_shapes, op.flops, op.flops_bwd) for op in ein] == \
        [(operation_feature_row(op), op.output_shapes, op.flops, op.flops_bwd) for op in mm]
    assert ein[1].signature == mm[1].signature
    for eq, shapes in (("bi,bj->bij", [(2, 3), (2, 5)]), ("ij,j->j", [(3, 5), (5,)]), ("ii,ij->j", [(4, 4), (4, 5)])):
        (op,) = extract_operations(_Einsum(eq), example_inputs=tuple(torch.zeros(s) for s in shapes), mode=mode)
        assert op.kind == "einsum", eq
    (listed,) = extract_operations(_Einsum("bij,bjk->bik", listed=True), mode=mode,
                                   example_inputs=(torch.zeros(2, 3, 4), torch.zeros(2, 4, 5)))
    assert listed.kind == "bmm" and listed.input_shapes == [[2, 3, 4], [2, 4, 5]]


class _ScoresProduct(nn.Module):
    """Attention scores as Megatron and BLOOM write them (torch.baddbmm into a preallocated
    buffer, scaled by alpha) or as the bmm that cuBLAS runs for them."""

    def __init__(self, as_bmm: bool, beta: float = 0.0) -> None:
        super().__init__()
        self.qk = nn.Linear(32, 64)
        self.as_bmm, self.beta = as_bmm, beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x).chunk(2, -1)
        if self.as_bmm:
            return torch.bmm(q, k.transpose(1, 2)).softmax(-1)
        scores = torch.zeros(x.shape[0], x.shape[1], x.shape[1], device=x.device)
        return torch.baddbmm(scores, q, k.transpose(1, 2), beta=self.beta, alpha=0.125).softmax(-1)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_baddbmm_is_the_bmm_cublas_runs(mode: str, precision: str) -> None:
    """baddbmm was a kind of its own that no row covers (a LowCoverageWarning for an attention
    written the Megatron way); it is the bmm of its two products' operands, with bmm's signature
    and feature row (beta 0), and keeps the bytes it reads."""
    from gpurec.ops.features import operation_feature_row

    def product(as_bmm: bool, beta: float = 0.0) -> Any:
        ops = extract_operations(_ScoresProduct(as_bmm, beta), (2, 10, 32), mode=mode, precision=precision)
        (op,) = [op for op in ops if op.kind in ("bmm", "baddbmm")]
        return op

    fused, plain = product(False), product(True)
    assert fused.kind == "bmm" and fused.input_shapes == plain.input_shapes == [[2, 10, 32], [2, 32, 10]]
    assert (fused.signature, operation_feature_row(fused), fused.flops, fused.flops_bwd, fused.output_shapes) == \
        (plain.signature, operation_feature_row(plain), plain.flops, plain.flops_bwd, plain.output_shapes)
    assert len(fused.input_requires_grad) == len(fused.input_nodes) == 2
    added = product(False, beta=1.0)  # then cuBLAS reads the buffer it adds into as well
    assert added.kind == "bmm" and added.signature == plain.signature
    assert added.bytes_read == plain.bytes_read + 2 * 10 * 10 * (4 if precision == "fp32" else 2)


class _Centred(nn.Module):
    """x minus (or plus) its mean over the last dimension, as a hand-written norm centres it."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.mean(-1, keepdim=True)
        return {"sub": lambda: x - m, "torch.sub": lambda: torch.sub(x, m), "add": lambda: x + m}[self.how]()


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_a_difference_is_add_in_inference_only(precision: str) -> None:
    """ATen runs ``a - b`` as add with alpha -1, so in inference it takes add's signature and rows
    (it was a kind without rows); in training its backward negates a gradient in a kernel of its
    own, so it stays ``sub`` there."""
    from gpurec.ops.features import operation_feature_row

    def last(how: str, mode: str) -> Any:
        return extract_operations(_Centred(how), (4, 16, 64), mode=mode, precision=precision)[-1]

    plain = last("add", "inference")
    for how in ("sub", "torch.sub"):
        diff = last(how, "inference")
        assert diff.kind == "add", how
        assert (diff.signature, operation_feature_row(diff), diff.flops, diff.bytes_read) == \
            (plain.signature, operation_feature_row(plain), plain.flops, plain.bytes_read)
        trained = last(how, "training")
        assert trained.kind == "sub" and trained.signature != last("add", "training").signature


class _Einsum(nn.Module):
    def __init__(self, equation: str, listed: bool = False) -> None:
        super().__init__()
        self.equation, self.listed = equation, listed

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.einsum(self.equation, [a, b]) if self.listed else torch.einsum(self.equation, a, b)


class _WeightProduct(nn.Module):
    """An activation times a weight parameter, as an einsum (either operand order) or as the
    matmul or F.linear it equals."""

    def __init__(self, how: str, weight_shape: tuple[int, int], equation: str = "") -> None:
        super().__init__()
        self.weight, self.how, self.equation = nn.Parameter(torch.randn(*weight_shape)), how, equation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "einsum":
            return torch.einsum(self.equation, x, self.weight)
        if self.how == "einsum, weight first":
            return torch.einsum(self.equation, self.weight, x)
        return x @ self.weight if self.how == "matmul" else F.linear(x, self.weight)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_an_einsum_with_a_weight_is_the_matmul_or_linear_it_equals(mode: str, precision: str) -> None:
    """``einsum("bij,jk->bik", x, W)`` is ``x @ W`` and ``einsum("bij,kj->bik", x, W)`` is
    ``F.linear(x, W)``: the same signature and features, so their rows predict it (it was an
    uncovered kind of its own); an einsum that contracts another index keeps its kind."""
    from gpurec.ops.features import operation_feature_row

    def product(module: nn.Module) -> Any:
        (op,) = [op for op in extract_operations(module, (4, 6, 8), mode=mode, precision=precision)
                 if op.kind != "autocast_cast"]
        return op

    def described(op: Any) -> tuple[Any, ...]:
        return (op.kind, op.signature, operation_feature_row(op), op.flops, op.flops_bwd, op.output_shapes)

    cases = [("einsum", (8, 5), "bij,jk->bik", "matmul"), ("einsum", (5, 8), "bij,kj->bik", "linear"),
             ("einsum", (8, 5), "...j,jk->...k", "matmul"), ("einsum, weight first", (5, 8), "kj,bij->bik", "linear"),
             ("einsum, weight first", (8, 5), "jk,bij->bik", "matmul")]
    for how, shape, equation, twin in cases:
        assert described(product(_WeightProduct(how, shape, equation))) == \
            described(product(_WeightProduct(twin, shape))), equation
    for equation, shape in (("bij,jk->bki", (8, 5)), ("bij,ik->bjk", (6, 5)), ("bij,jk->bijk", (8, 5))):
        assert product(_WeightProduct("einsum", shape, equation)).kind == "einsum", equation


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_rms_norm_runs_as_layer_norm_kernels(mode: str) -> None:
    """nn.RMSNorm and F.rms_norm are LayerNorm operations (torch runs LayerNorm's kernels for
    them on CUDA), with RMSNorm's own parameters; a hand-written RMSNorm stays its elementwise calls."""

    class Norms(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rms, self.weight = nn.RMSNorm(64), nn.Parameter(torch.ones(64))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.rms(x) + F.rms_norm(x, (64,), self.weight)
            return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)

    ops = extract_operations(Norms(), (4, 16, 64), mode=mode)
    layer_norms = [op for op in ops if op.kind == "LayerNorm"]
    assert len(layer_norms) == 2 and [op.params for op in layer_norms] == [64, 64]
    assert all(op.output_shapes == [[4, 16, 64]] for op in layer_norms)
    assert {"pow", "mean", "rsqrt"} <= {op.kind for op in ops}


class _Held(nn.Module):
    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.m(x)


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("parametrize", ["weight_norm", "spectral_norm"])
@pytest.mark.parametrize("layer", ["linear", "conv1d"])
def test_a_parametrized_module_is_the_module_it_parametrizes(mode: str, parametrize: str, layer: str) -> None:
    """weight_norm / spectral_norm (torch.nn.utils.parametrizations) make a class of their own,
    ``ParametrizedLinear``: a kind without rows.  Its kernel is the module's own."""
    from torch.nn.utils import parametrizations

    def make() -> nn.Module:
        return nn.Linear(256, 512) if layer == "linear" else nn.Conv1d(64, 128, 5, padding=2)

    shape = (32, 64, 256) if layer == "linear" else (16, 64, 400)
    plain = extract_operations(_Held(make()), shape, mode=mode)
    wrapped = getattr(parametrizations, parametrize)
    for model in (_Held(wrapped(make())), wrapped(make())):  # as a child and as the root
        ops = extract_operations(model, shape, mode=mode)
        assert [op.kind for op in ops] == [op.kind for op in plain] == ["Linear" if layer == "linear" else "Conv2d"]
        assert [op.signature for op in ops] == [op.signature for op in plain]


def test_a_channels_last_network_is_estimated_as_nchw_with_a_warning() -> None:
    import warnings

    import gpurec

    def caught(model: nn.Module, **kw: object) -> tuple[list, list[str]]:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ops = extract_operations(model, **kw)
        return ops, [x.category.__name__ for x in w]

    net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 8, 3))
    plain, said = caught(net, input_shape=(2, 3, 32, 32))
    assert said == []
    nhwc, said = caught(net.to(memory_format=torch.channels_last), input_shape=(2, 3, 32, 32))
    assert said == ["ChannelsLastWarning"] and issubclass(gpurec.ChannelsLastWarning, UserWarning)
    assert [op.signature for op in nhwc] == [op.signature for op in plain]
    x = torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last)
    assert caught(nn.Conv2d(3, 4, 3), example_inputs=x)[1] == ["ChannelsLastWarning"]
    one_channel = torch.randn(2, 1, 8, 8).to(memory_format=torch.channels_last)  # NCHW and NHWC alike
    assert caught(nn.Conv2d(1, 4, 3), example_inputs=one_channel)[1] == []
