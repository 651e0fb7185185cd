"""Precision as a dimension: extraction follows torch's autocast policy, units run in the
recorded dtypes, and collection plans, measures and resumes per precision (on the CPU, with
the fake board of tests/fakes.py standing in for NVML)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fakes import FakeNVML
from torch import nn

from gpurec.collect import CollectConfig, ModelInputSet, WindowConfig, WorkItem, build_plan, run_worker
from gpurec.collect import runner as runner_mod
from gpurec.collect.runner import done_ids
from gpurec.dataset.store import read_jsonl
from gpurec.ops.extract import ExtractionError, extract_operations
from gpurec.ops.precision import PRECISIONS, item_id, rows_at_precision
from gpurec.tools.plan import PlanPart, build_parts_plan

SET = ModelInputSet("resnet18", 2, 32)
FAST = WindowConfig(min_window_s=0.05, tick_timeout_s=10.0, gpu_blocks=3, gpu_min_block_ms=1.0)


class Block(nn.Module):
    """A convolution, a linear layer, a layer norm and a softmax: each autocast class once."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4 * 8 * 8, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.conv(x)).flatten(1)
        return torch.softmax(self.norm(self.fc(y)), -1)


def _by_kind(ops: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for op in ops:
        out.setdefault(op.kind, []).append(op)
    return out


# -- extraction -----------------------------------------------------------------------------------

@pytest.mark.parametrize("precision, low", [("bf16-mixed", "bfloat16"), ("fp16-mixed", "float16")])
def test_autocast_extraction_follows_torch_policy(precision: str, low: str) -> None:
    ops = extract_operations(Block(), (2, 3, 8, 8), mode="training", precision=precision)
    kinds = _by_kind(ops)
    for kind in ("Conv2d", "Linear"):  # autocast's lower-precision list
        (op,) = kinds[kind]
        assert op.dtype == low and op.input_dtypes == [low] and op.precision == precision
        assert op.param_dtypes == {"bias": low, "weight": low}  # its weights arrive cast
    assert kinds["ReLU"][0].dtype == low  # runs in its input's dtype
    for kind in ("LayerNorm", "softmax"):  # autocast's fp32 list
        (op,) = kinds[kind]
        assert op.dtype == "float32" and op.input_dtypes == ["float32"]
    assert all(op.precision == precision for op in ops)


def test_autocast_casts_are_operations_before_their_consumer() -> None:
    ops = extract_operations(Block(), (2, 3, 8, 8), mode="training", precision="bf16-mixed")
    casts = [op for op in ops if op.kind == "autocast_cast"]
    moves = {(op.settings["from_dtype"], op.settings["to_dtype"], tuple(op.input_shapes[0])) for op in casts}
    assert ("float32", "bfloat16", (2, 3, 8, 8)) in moves  # the network's input, into the convolution
    assert ("float32", "bfloat16", (4, 3, 3, 3)) in moves  # the convolution's weight, every call
    assert ("float32", "bfloat16", (16, 256)) in moves  # the linear layer's weight
    assert ("bfloat16", "float32", (2, 16)) in moves  # the linear output into LayerNorm
    assert len(casts) == 6  # conv: input, weight, bias; fc: weight, bias (input already bf16); norm: input
    names = [op.node for op in ops]
    conv = names.index("conv")
    assert {"conv.cast0", "conv.cast1", "conv.cast2"} <= set(names[:conv])
    (conv_op,) = [op for op in ops if op.kind == "Conv2d"]
    assert conv_op.input_nodes[0].startswith("conv.cast")  # it reads the cast copy
    weight_cast = next(op for op in casts if op.input_shapes[0] == [4, 3, 3, 3])
    assert weight_cast.input_requires_grad == [True] and weight_cast.bytes_read == 2 * weight_cast.bytes_written
    input_cast = next(op for op in casts if op.input_shapes[0] == [2, 3, 8, 8])
    assert input_cast.input_requires_grad == [False] and input_cast.input_nodes == ["x"]


def test_autocast_state_is_restored_also_after_an_error() -> None:
    before = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"), torch.is_autocast_cache_enabled())
    extract_operations(Block(), (2, 3, 8, 8), precision="bf16-mixed")
    with pytest.raises(ExtractionError):
        extract_operations(Block(), (2, 5, 8, 8), precision="bf16-mixed")  # wrong channel count
    after = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"), torch.is_autocast_cache_enabled())
    assert after == before


def test_fp32_signatures_are_unchanged_and_other_precisions_differ() -> None:
    default = extract_operations("resnet18", (2, 3, 32, 32), mode="training")
    fp32 = extract_operations("resnet18", (2, 3, 32, 32), mode="training", precision="fp32")
    assert [op.signature for op in fp32] == [op.signature for op in default]
    assert all("precision" not in op.identity() and op.precision == "fp32" for op in fp32)
    fp32_sigs = {op.signature for op in fp32}
    for precision in ("bf16-mixed", "fp16-mixed", "bf16", "fp16"):
        ops = extract_operations("resnet18", (2, 3, 32, 32), mode="training", precision=precision)
        assert not fp32_sigs & {op.signature for op in ops}, precision
    bf16 = {op.signature for op in extract_operations("resnet18", (2, 3, 32, 32), precision="bf16-mixed")}
    fp16 = {op.signature for op in extract_operations("resnet18", (2, 3, 32, 32), precision="fp16-mixed")}
    assert not bf16 & fp16


def test_tf32_marks_only_the_matrix_products() -> None:
    fp32 = extract_operations(Block(), (2, 3, 8, 8), mode="training")
    tf32 = extract_operations(Block(), (2, 3, 8, 8), mode="training", precision="tf32")
    assert [op.kind for op in tf32] == [op.kind for op in fp32]  # no casts: nothing changes dtype
    for a, b in zip(fp32, tf32, strict=True):
        if a.kind == "Linear":
            assert b.precision == "tf32" and b.signature != a.signature
        else:  # convolutions use TF32 by default already; the rest are the fp32 operations
            assert b.precision == "fp32" and b.signature == a.signature


@pytest.mark.parametrize("precision, low", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_cast_precision_runs_module_and_inputs_in_the_low_dtype(precision: str, low: str) -> None:
    ops = extract_operations(Block(), (2, 3, 8, 8), precision=precision)
    assert not [op for op in ops if op.kind == "autocast_cast"]
    assert all(op.dtype == low and op.precision == precision for op in ops)
    (norm,) = _by_kind(ops)["LayerNorm"]
    assert norm.param_dtypes == {"bias": low, "weight": low}
    (fc,) = _by_kind(ops)["Linear"]
    fp32_fc = _by_kind(extract_operations(Block(), (2, 3, 8, 8)))["Linear"][0]
    assert fc.bytes_read * 2 == fp32_fc.bytes_read and fc.bytes_written * 2 == fp32_fc.bytes_written


def test_a_caller_module_is_left_as_it_was() -> None:
    block = Block()
    weight = block.fc.weight
    extract_operations(block, (2, 3, 8, 8), precision="bf16-mixed", keep_sources=False)
    extract_operations(block, (2, 3, 8, 8), precision="bf16", keep_sources=False)
    assert block.fc.weight is weight and weight.dtype == torch.float32 and weight.device.type == "cpu"


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ExtractionError, match="precision must be one of fp32, tf32"):
        extract_operations(Block(), (2, 3, 8, 8), precision="bf32")


def test_rows_without_a_recorded_precision_are_fp32_in_every_table_filter() -> None:
    """Rows written before precision was recorded read as absent, None, NaN or empty: all fp32,
    and never another precision (one filter, so no report can count them differently)."""
    import pandas as pd

    df = pd.DataFrame({"id": list("abcdef"),
                       "precision": ["fp32", None, float("nan"), "", "bf16-mixed", "fp16-mixed"]})
    assert rows_at_precision(df)["id"].tolist() == list("abcd")
    assert rows_at_precision(df, "bf16-mixed")["id"].tolist() == ["e"]
    assert rows_at_precision(df, "bf16")["id"].tolist() == []
    legacy = pd.DataFrame({"id": ["x", "y"]})
    assert rows_at_precision(legacy)["id"].tolist() == ["x", "y"]
    assert rows_at_precision(legacy, "bf16-mixed").empty


# -- units ----------------------------------------------------------------------------------------

def test_units_take_the_recorded_dtypes_and_train_under_autocast() -> None:
    ops = extract_operations(Block(), (2, 3, 8, 8), mode="training", precision="bf16-mixed")
    fc = next(op for op in ops if op.kind == "Linear")
    unit = fc.materialize("cpu")
    assert [x.dtype for x in unit.inputs] == [torch.bfloat16]
    assert {p.dtype for group in unit._params for p in group} == {torch.bfloat16}
    assert unit.backward and [g.dtype for g in unit._grads] == [torch.bfloat16]
    with unit.scope():
        assert torch.is_autocast_enabled("cpu")
        unit.step()
    assert not torch.is_autocast_enabled("cpu")
    cast = next(op for op in ops if op.kind == "autocast_cast" and op.input_shapes[0] == [16, 256])
    unit = cast.materialize("cpu")
    assert unit.inputs[0].dtype == torch.float32 and unit.inputs[0].requires_grad
    with unit.scope():
        unit.step()  # forward and backward of the cast
    norm = next(op for op in ops if op.kind == "LayerNorm")
    assert norm.materialize("cpu").inputs[0].dtype == torch.float32


def test_tf32_scope_sets_and_restores_the_matmul_flag() -> None:
    ops = extract_operations(Block(), (2, 3, 8, 8), precision="tf32")
    unit = next(op for op in ops if op.precision == "tf32").materialize("cpu")
    before = torch.backends.cuda.matmul.allow_tf32
    with unit.scope():
        assert torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.backends.cuda.matmul.allow_tf32 == before


# -- plans ----------------------------------------------------------------------------------------

def test_ids_carry_the_precision_except_fp32() -> None:
    assert item_id("op", "abc", "training") == "op:abc:training"
    assert item_id("op", "abc", "training", "bf16-mixed") == "op:abc:training:bf16-mixed"
    w = WorkItem("network", SET.key, "inference", "network", SET.key, [SET.key], "fp16")
    assert w.id == f"network:{SET.key}:inference:fp16" and w.as_dict()["precision"] == "fp16"
    assert "precision" not in WorkItem("op", "abc", "inference", "ReLU", SET.key).as_dict()
    assert WorkItem(**w.as_dict()) == w


def _fake_extract(arch: str, shape: tuple[int, ...], mode: str, precision: str = "fp32") -> list:
    ops = [SimpleNamespace(signature=f"{arch}-{shape[0]}-{k}-{precision}", kind=k, precision=precision)
           for k in ("Conv2d", "ReLU", "add")]
    if precision == "tf32":  # only matrix products change under TF32
        ops = [SimpleNamespace(signature=o.signature, kind=o.kind, precision="tf32" if o.kind == "Conv2d" else "fp32")
               for o in ops]
    return ops


def test_build_plan_at_a_precision_keeps_that_precision_s_operations() -> None:
    sets = [ModelInputSet("archA", 1), ModelInputSet("archB", 8)]
    fp32 = build_plan(sets, extract=lambda a, s, m: _fake_extract(a, s, m))
    bf16 = build_plan(sets, extract=_fake_extract, precision="bf16-mixed")
    assert len(bf16) == len(fp32) and all(w.precision == "bf16-mixed" for w in bf16)
    assert all(w.id.endswith(":bf16-mixed") for w in bf16) and not {w.id for w in fp32} & {w.id for w in bf16}
    tf32 = [w for w in build_plan(sets, extract=_fake_extract, precision="tf32") if w.item == "op"]
    assert {w.kind for w in tf32} == {"Conv2d"}
    with pytest.raises(ValueError, match="precision must be one of"):
        build_plan(sets, extract=_fake_extract, precision="int8")


def test_a_plan_of_several_precisions_puts_networks_first_then_operations_round_robin() -> None:
    parts = [PlanPart("bf16-mixed", ["archA", "archB"], [1, 8]), PlanPart("bf16", ["archA"], [8], networks=False),
             PlanPart("fp16-mixed", ["archA"], [8], operations=False)]
    items = build_parts_plan(parts, extract=_fake_extract)
    nets = [w for w in items if w.item == "network"]
    assert items[:len(nets)] == nets and len(nets) == 4 * 2 + 2
    assert {w.precision for w in nets} == {"bf16-mixed", "fp16-mixed"}
    ops = [w for w in items if w.item == "op"]
    assert [w.precision for w in ops[:2]] == ["bf16-mixed", "bf16"]  # round-robin over the parts
    assert len(ops) == 2 * (4 * 3) + 2 * 3 and len({w.id for w in items}) == len(items)


def test_a_plan_part_may_keep_only_some_operation_kinds() -> None:
    """PlanPart.op_kinds keeps the operations of those kinds (the seq-kinds preset: the attention,
    embedding and recurrent operations alone), and leaves its networks whole."""
    parts = [PlanPart("fp16-mixed", ["archA"], [1, 8], op_kinds=("ReLU", "add"))]
    items = build_parts_plan(parts, extract=_fake_extract)
    ops = [w for w in items if w.item == "op"]
    assert {w.kind for w in ops} == {"ReLU", "add"} and len(ops) == 2 * 2 * 2
    assert sum(w.item == "network" for w in items) == 2 * 2


# -- collection -----------------------------------------------------------------------------------

def _cfg() -> CollectConfig:
    return CollectConfig(window=FAST, repeat_every=0, max_consecutive_failures=5)


def test_a_bf16_mixed_plan_runs_through_the_runner_and_resumes(tmp_path: Path, fast_worker: FakeNVML,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    plan = build_plan([SET], precision="bf16-mixed")
    nets = [w for w in plan if w.item == "network" and w.mode == "inference"]
    casts = [w for w in plan if w.item == "op" and w.kind == "autocast_cast"][:2]
    convs = [w for w in plan if w.item == "op" and w.kind == "Conv2d"][:2]
    items = nets + casts + convs
    assert {w.mode for w in casts + convs} == {"inference", "training"}
    # What the step sees while it is measured: autocast on, the unit's inputs in their dtypes.
    seen: list[tuple[bool, object]] = []
    real_op, real_net = runner_mod.measure_op, runner_mod.measure_network

    def spy(real):  # noqa: ANN001, ANN202
        def measure(step, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
            unit = step.__self__
            x = unit.inputs[0] if hasattr(unit, "inputs") else unit.x
            seen.append((torch.is_autocast_enabled("cpu"), x.dtype))
            return real(step, *a, **kw)
        return measure

    monkeypatch.setattr(runner_mod, "measure_op", spy(real_op))
    monkeypatch.setattr(runner_mod, "measure_network", spy(real_net))
    s1 = run_worker(items, tmp_path, _cfg(), device="cpu", log=lambda m: None)
    assert s1["ok"] == len(items) and s1["failed"] == 0
    assert all(enabled for enabled, _ in seen) and len(seen) == len(items)
    assert (True, torch.bfloat16) in seen  # the convolutions read bf16 inputs
    rows = [r for p in tmp_path.glob("rows-*.jsonl") for r in read_jsonl(p) if r["item"] != "idle"]
    assert sorted(r["id"] for r in rows) == sorted(w.id for w in items)
    assert all(r["precision"] == "bf16-mixed" and r["id"].endswith(":bf16-mixed") for r in rows)
    assert done_ids(tmp_path) == {w.id for w in items}
    # the fp32 twin of a measured network is not done; the bf16-mixed one is
    fp32_net = WorkItem("network", SET.key, "inference", "network", SET.key, [SET.key])
    s2 = run_worker([*items, fp32_net], tmp_path, _cfg(), device="cpu", log=lambda m: None)
    assert s2["ok"] == 1 and s2["failed"] == 0
    rows2 = [r for p in tmp_path.glob("rows-*.jsonl") for r in read_jsonl(p) if r["item"] != "idle"]
    assert [r for r in rows2 if r["id"] == fp32_net.id][0]["precision"] == "fp32"
    assert not seen[-1][0]  # the fp32 network ran without autocast


def test_cast_network_unit_runs_in_the_low_dtype() -> None:
    unit = runner_mod.NetworkUnit("resnet18", (2, 3, 32, 32), "training", "cpu", precision="bf16")
    assert unit.x.dtype == torch.bfloat16 and {p.dtype for p in unit.model.parameters()} == {torch.bfloat16}
    assert [g.dtype for g in unit._grads] == [torch.bfloat16]
    with unit.scope():
        unit.step()


def test_every_precision_name_is_accepted_by_the_options(tmp_path: Path) -> None:
    from gpurec.collect.api import CollectOptions

    for precision in PRECISIONS:
        assert CollectOptions(out=str(tmp_path), precision=precision).precision == precision
    with pytest.raises(ValueError, match="precision must be one of"):
        CollectOptions(out=str(tmp_path), precision="bfloat16")
    opts = CollectOptions(out=str(tmp_path), precision="tf32")
    assert json.loads(opts.write(tmp_path / "spec.json").read_text())["precision"] == "tf32"


# -- prediction -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def predictor():  # noqa: ANN201
    from gpurec.model import load_predictor

    return load_predictor(check_data=False)


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_module_cast_to_bf16_is_predicted_as_bf16_and_an_unmeasured_cast_says_so(predictor) -> None:  # noqa: ANN001
    """bf16 (cast) rows are in the shipped models' data; fp16 (cast) rows are not, so an fp16
    module is predicted at fp16 and warns that no row of its precision was measured."""
    from gpurec.ops.coverage import UnmeasuredPrecisionWarning

    fp32 = predictor.predict(MLP(), (256, 1024), gpu="H100")
    assert fp32.precision == "fp32" and fp32.precision_measured
    bf16 = predictor.predict(MLP().bfloat16(), (256, 1024), gpu="H100")
    assert bf16.precision == "bf16" and bf16.precision_measured == ("bf16" in predictor.precisions_measured)
    assert bf16.gpu_time_ms < fp32.gpu_time_ms  # tensor-core peak and half the bytes
    assert "fp16" not in predictor.precisions_measured
    with pytest.warns(UnmeasuredPrecisionWarning, match="no fp16 rows"):
        fp16 = predictor.predict(MLP().half(), (256, 1024), gpu="H100")
    assert fp16.precision == "fp16" and not fp16.precision_measured


def test_a_precision_contradicting_the_parameters_is_refused(predictor) -> None:  # noqa: ANN001
    from gpurec.ops.precision import PrecisionMismatch

    with pytest.raises(PrecisionMismatch, match="contradicts the module's bfloat16 parameters"):
        predictor.predict(MLP().bfloat16(), (8, 1024), precision="fp16")
    with pytest.raises(PrecisionMismatch, match="needs the module cast"):
        predictor.predict(MLP(), (8, 1024), precision="bf16")


def test_autocast_casts_add_no_gpu_time_their_consumers_hold_them(predictor) -> None:  # noqa: ANN001
    """Inside a network autocast launches a cast in its consumer's call, and the consumer's GPU-time
    target (in-network) holds the cast's kernels: the cast adds no GPU time of its own, on a measured
    GPU and through the cross-GPU path alike, yet keeps its host dispatch."""
    import warnings

    import numpy as np

    from gpurec.model.network import free_consumer_held

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for gpu in ("H100", "A100-80GB"):
            est = predictor.predict(MLP(), (256, 1024), mode="training", gpu=gpu, precision="bf16-mixed")
            ops = est.per_op
            cast = (ops["kind"] == "autocast_cast").to_numpy()
            assert cast.sum() >= 3, gpu  # the input and both weights
            assert (ops.loc[cast, "time_ms"] == 0.0).all() and (ops.loc[~cast, "time_ms"] > 0).all(), gpu
            assert (ops.loc[cast, "host_ms"] > 0).all(), gpu  # the cast is still dispatched
            assert est.op_sum_time_ms == pytest.approx(float(ops["time_ms"].sum()), rel=1e-9), gpu
    # a measured cast is the cast alone: zeroed too; other kinds and fp32 blocks are untouched
    t = np.array([1.0, 2.0, 3.0])
    got = free_consumer_held(t, np.array(["autocast_cast", "Linear", "autocast_cast"], dtype=object))
    assert got.tolist() == [0.0, 2.0, 0.0]
    assert free_consumer_held(t, np.array(["Linear"] * 3, dtype=object)) is t and free_consumer_held(t, None) is t


def test_fp16_and_bf16_differ_where_the_gpu_differs(predictor) -> None:  # noqa: ANN001
    import warnings

    from gpurec.ops.coverage import UnmeasuredPrecisionWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnmeasuredPrecisionWarning)
        t = {(g, p): predictor.predict("resnet50", (32, 3, 224, 224), gpu=g, precision=p).gpu_time_ms
             for g in ("V100", "H100") for p in ("fp16-mixed", "bf16-mixed")}
    # a V100 has fp16 tensor cores and no bf16 ones; an H100 has both at one peak rate, and the
    # H100's measured networks differ by little (bf16-mixed / fp16-mixed: median 1.05, at most 1.40
    # over 24 pairs; resnet50 b32 inference 4.13 / 3.76 ms)
    assert t[("V100", "bf16-mixed")] > 1.5 * t[("V100", "fp16-mixed")]
    assert 0.95 < t[("H100", "bf16-mixed")] / t[("H100", "fp16-mixed")] < 1.3


def test_memory_follows_precision() -> None:
    from gpurec.ops.memory import step_memory

    def mem(precision: str, mode: str):  # noqa: ANN202
        return step_memory(extract_operations("resnet18", (32, 3, 224, 224), mode=mode, precision=precision,
                                              keep_sources=False), mode)

    fp32, mixed, cast = mem("fp32", "training"), mem("bf16-mixed", "training"), mem("bf16", "training")
    assert mixed.params_bytes == fp32.params_bytes  # autocast keeps float32 weights
    assert cast.params_bytes * 2 == fp32.params_bytes
    assert cast.activations_bytes < 0.6 * fp32.activations_bytes
    assert mem("bf16-mixed", "inference").activations_bytes < mem("fp32", "inference").activations_bytes


def test_the_ranking_states_its_precision(predictor) -> None:  # noqa: ANN001
    import warnings

    from gpurec.recommend import recommend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = recommend("resnet18", (8, 3, 224, 224), gpus=["H100", "A100"], predictor=predictor,
                      precision="bf16-mixed", batch_search=False)
    assert r.precision == "bf16-mixed"
    assert r.precision_measured == ("bf16-mixed" in predictor.precisions_measured)  # from the training data
    assert r.to_dict()["precision"] == "bf16-mixed"
    assert all(e.precision == "bf16-mixed" for e in r.estimates.values())


def test_training_matches_a_row_to_the_operation_of_its_precision() -> None:
    """A bf16-mixed row is featurised from the bf16-mixed extraction of its set: looked up in
    the fp32 extraction its signature is not there, and the row would be lost to training."""
    import pandas as pd

    from gpurec.model.features import SetExtractor, operations_of_rows
    from gpurec.ops import extract_operations

    ops = extract_operations("resnet18", (1, 3, 32, 32), mode="inference", precision="bf16-mixed")
    conv = next(op for op in ops if op.kind == "Conv2d")
    row = {"set_key": "resnet18:b1:r32", "mode": "inference", "op_signature": conv.signature, "model_sets": None}
    extractor = SetExtractor()
    matched = operations_of_rows(pd.DataFrame([{**row, "precision": "bf16-mixed"}]), extractor)
    assert len(matched.row_index) == 1 and matched.block.kinds[0] == "Conv2d"
    as_fp32 = operations_of_rows(pd.DataFrame([{**row, "precision": None}]), extractor)
    assert len(as_fp32.row_index) == 0 and sum(as_fp32.unmatched.values()) == 1


class _SpeedupPredictor:
    """Stands in for a trained predictor: host-free time 10 ms at fp32, 4 ms at any other
    precision, at a constant 200 W; records the precision of every call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def predict(self, arch, shape, mode, gpu, host=None, precision="fp32"):  # noqa: ANN001, ANN201
        self.calls.append(precision)
        t = 10.0 if precision == "fp32" else 4.0
        ops = SimpleNamespace(entry=SimpleNamespace(block=SimpleNamespace(kinds=["autocast_cast", "Linear"])),
                              gpu_time_ms=[1.0, t - 1.0])  # 1 ms of the step is autocast's casts
        return SimpleNamespace(gpu_time_ms=t, gpu_energy_mj=t * 200.0, time_ms=t, energy_mj=t * 200.0,
                               host_time_ms=0.1, bound="gpu", host="reference", _ops=ops)


def test_low_precision_networks_are_estimated_at_their_precision_and_grouped(tmp_path: Path) -> None:
    """Each network row is predicted at its own precision; unseen test groups are listed with n 0
    where nothing was measured, and planned test networks not measured are named."""
    import pandas as pd

    from gpurec.model.fitting.evaluate import network_records, precision_accuracy

    gpu = "NVIDIA H100 80GB HBM3"
    rows = [  # (set_key, mode, precision, host-free ms)
        ("alexnet:b8:r224", "inference", "fp32", 10.0), ("alexnet:b8:r224", "inference", "bf16-mixed", 5.0),
        ("alexnet:b8:r224", "training", "bf16-mixed", 4.0), ("vgg13_bn:b8:r224", "inference", "bf16-mixed", 8.0)]
    nets = pd.DataFrame([{"gpu": gpu, "set_key": k, "mode": m, "precision": p, "status": "ok", "run_id": "r",
                          "time_ms": t * 1.5, "energy_mj": t * 300.0, "gpu_time_ms": t, "gpu_energy_mj": t * 200.0}
                         for k, m, p, t in rows])
    (tmp_path / "h100").mkdir()
    nets.to_parquet(tmp_path / "h100" / "networks.parquet", index=False)
    plan = tmp_path / "precision.json"
    plan.write_text(json.dumps({"items": [
        {"item": "network", "set_key": k, "mode": m, "precision": "bf16-mixed"}
        for k in ("vgg13_bn:b8:r224", "swin_s:b8:r224") for m in ("inference", "training")]}))
    pred = _SpeedupPredictor()
    fp32 = network_records(pred, nets[nets["precision"] == "fp32"])
    out = precision_accuracy(pred, tmp_path, fp32, plan_file=plan)
    assert pred.calls == ["fp32", "bf16-mixed", "bf16-mixed", "bf16-mixed"]
    bf = out["precisions"]["bf16-mixed"]
    g = {(x["archs"], x["mode"]): x for x in bf["groups"]}
    assert g[("unseen test", "inference")]["n_time"] == 1  # vgg13_bn: 4 ms predicted for 8 ms measured
    assert g[("unseen test", "inference")]["time_mape"] == pytest.approx(50.0)
    assert g[("unseen test", "training")]["n_time"] == 0 and np.isnan(g[("unseen test", "training")]["time_mape"])
    assert g[("training", "inference")]["time_mape"] == pytest.approx(20.0)  # 4 for 5
    assert g[("training", "training")]["energy_mape"] == pytest.approx(0.0)
    assert sorted(bf["test_planned_not_measured"]) == [("swin_s:b8:r224", "inference"), ("swin_s:b8:r224", "training"),
                                                       ("vgg13_bn:b8:r224", "training")]
    twin = bf["records"].set_index(["set_key", "mode"])
    assert twin.loc[("alexnet:b8:r224", "inference"), "fp32_measured_gpu_time_ms"] == pytest.approx(10.0)
    assert np.isnan(twin.loc[("alexnet:b8:r224", "training"), "fp32_measured_gpu_time_ms"])
    check = {(c["variant"], c["mode"]): c for c in bf["correction_check"]}
    inf = check[("as predicted", "inference")]  # alexnet 4 for 5, vgg13_bn 4 for 8
    assert (inf["n"], inf["families"]) == (2, 2) and inf["time_mape"] == pytest.approx(35.0)
    # each scaled by the other family's ratio: alexnet 4 x 2 = 8 for 5, vgg13_bn 4 x 1.25 = 5 for 8
    assert inf["lofo_scaled_time_mape"] == pytest.approx((60.0 + 37.5) / 2)
    assert check[("casts taken out", "inference")]["time_mape"] == pytest.approx((40.0 + 62.5) / 2)  # 3 ms each
    assert np.isnan(check[("as predicted", "training")]["lofo_scaled_time_mape"])  # one family: nothing held out


# -- autocast entered inside forward, and recurrent layers under autocast -------------------------

class _AutocastInside(Block):
    """Block whose forward enters CUDA autocast itself (as a user's training module may)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return super().forward(x)


class _AutocastPart(Block):
    """Only the convolution runs under fp16 autocast; the rest of forward runs in fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.float16):
            y = self.relu(self.conv(x))
        return torch.softmax(self.norm(self.fc(y.float().flatten(1))), -1)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_autocast_inside_forward_is_extracted_at_the_precision_it_runs(mode: str) -> None:
    inside = extract_operations(_AutocastInside(), (2, 3, 8, 8), mode=mode, keep_sources=False)
    outside = extract_operations(Block(), (2, 3, 8, 8), mode=mode, keep_sources=False, precision="bf16-mixed")
    assert [op.signature for op in inside] == [op.signature for op in outside]
    assert {op.precision for op in inside} == {"bf16-mixed"}
    # the autocast state and torch.autocast itself are as they were
    assert not torch.is_autocast_enabled("cuda")
    assert torch.amp.autocast_mode.autocast.__enter__.__qualname__ == "autocast.__enter__"


def test_an_autocast_region_of_forward_is_low_precision_and_the_rest_fp32() -> None:
    ops = extract_operations(_AutocastPart(), (2, 3, 8, 8), mode="training", keep_sources=False)
    kinds = _by_kind(ops)
    (conv,) = kinds["Conv2d"]
    assert conv.precision == "fp16-mixed" and conv.dtype == "float16"
    assert kinds["ReLU"][0].dtype == "float16"
    fp32 = {op.kind: op for op in extract_operations(Block(), (2, 3, 8, 8), mode="training", keep_sources=False)}
    for kind in ("Linear", "LayerNorm", "softmax"):  # after the region: the fp32 operations themselves
        (op,) = kinds[kind]
        assert op.precision == "fp32" and op.signature == fp32[kind].signature


class _AutocastPartUntraceable(_AutocastPart):
    """_AutocastPart with a branch on a shape that torch.fx cannot trace: extracted by the capture
    fallback (gpurec.ops.capture) instead."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 64:  # a shape used as a number: fx fails, the capture runs forward for real
            x = x[:64]
        return super().forward(x)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_the_capture_fallback_follows_autocast_in_forward_as_fx_does(mode: str) -> None:
    """The same autocast regions, precisions and casts whether forward is traced by fx or captured."""
    from gpurec.ops.capture import record
    from gpurec.ops.extract import _AUTOCAST_MARKERS, _trace, _TraceFailed

    with pytest.raises(_TraceFailed):
        _trace(_AutocastPartUntraceable())
    graph = record(_AutocastPartUntraceable(), [torch.empty(2, 3, 8, 8, device="meta")])
    assert graph.autocast == (("cuda", torch.float16, True),)
    assert sum(n.op == "call_function" and n.target in _AUTOCAST_MARKERS for n in graph.graph.nodes) == 2
    for traced, captured in ((_AutocastPart(), _AutocastPartUntraceable()), (_AutocastInside(), _AutocastInsideUntraceable())):
        via_fx = extract_operations(traced, (2, 3, 8, 8), mode=mode, keep_sources=False)
        via_capture = extract_operations(captured, (2, 3, 8, 8), mode=mode, keep_sources=False)
        assert any(op.kind == "autocast_cast" for op in via_capture)
        assert [(op.kind, op.signature, op.precision, op.node) for op in via_capture] == \
            [(op.kind, op.signature, op.precision, op.node) for op in via_fx]
    assert not torch.is_autocast_enabled("cuda")
    assert torch.amp.autocast_mode.autocast.__enter__.__qualname__ == "autocast.__enter__"


class _AutocastInsideUntraceable(_AutocastInside):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 64:
            x = x[:64]
        return super().forward(x)


class _LM(nn.Module):
    def __init__(self, layer: type[nn.Module]) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.rnn = layer(32, 64, num_layers=2, batch_first=True)
        self.out = nn.Linear(64, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(x))
        return self.out(h)


@pytest.mark.parametrize("layer", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed"])
def test_recurrent_layers_follow_cudnn_autocast_policy(layer: type[nn.Module], precision: str) -> None:
    """cuDNN's RNN under CUDA autocast runs in float16 whatever autocast's dtype: the input and
    every weight arrive cast (one cast each), and the next layer casts its float16 input again."""
    from gpurec.ops.extract import rnn_autocast_dtype

    assert rnn_autocast_dtype() == torch.float16  # torch registers the autocast kernel for aten::_cudnn_rnn
    model = _LM(layer)
    ops = extract_operations(model, (4, 16), dtype=torch.long, mode="training", precision=precision)
    (rnn,) = [op for op in ops if op.kind == layer.__name__]
    assert rnn.precision == precision and rnn.dtype == "float16" and rnn.input_dtypes == ["float16"]
    weights = [n for n, _ in model.rnn.named_parameters()]
    assert rnn.param_dtypes == {n: "float16" for n in weights}
    before = ops[:ops.index(rnn)]
    casts = [op for op in before if op.kind == "autocast_cast" and op.name == rnn.name + ".cast"]
    assert len(casts) == 1 + len(weights) and all(c.dtype == "float16" for c in casts)
    assert all(c.input_requires_grad == [True] for c in casts)  # weights and the embedding's output
    fp32 = [op for op in extract_operations(model, (4, 16), dtype=torch.long, mode="training")
            if op.kind == layer.__name__][0]
    assert rnn.flops == fp32.flops and rnn.bytes_read < fp32.bytes_read
    (linear,) = [op for op in ops if op.kind == "Linear"]
    low = "bfloat16" if precision == "bf16-mixed" else "float16"
    assert linear.dtype == low and linear.input_dtypes == [low]


def test_precision_flips_finds_the_pairs_whose_order_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pair flips when one GPU is faster in fp32 and slower at the lower precision; GPUs without
    tensor cores at its dtype (a V100 for bf16) never take part."""
    import importlib

    from gpurec.reports.accuracy import precision_flips

    rec_mod = importlib.import_module("gpurec.recommend")

    l40s, a100, v100, h100 = "NVIDIA L40S", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB", "NVIDIA H100 80GB HBM3"
    times = {"fp32": {l40s: 1.0, a100: 2.0, v100: 0.5, h100: 0.8},  # the H100 is the fastest in both
             "bf16-mixed": {l40s: 2.0, a100: 1.0, v100: 3.0, h100: 0.5}}
    asked: list[list[str]] = []

    def fake_recommend(arch, shape, mode, predictor, cuda_graphs, batch_search, precision, gpus):  # noqa: ANN001, ANN202
        asked.append(list(gpus))
        return SimpleNamespace(rows=[SimpleNamespace(gpu=g, gpu_time_ms=t, fits=True)
                                     for g, t in times[precision].items() if g in gpus])

    monkeypatch.setattr(rec_mod, "recommend", fake_recommend)
    out = precision_flips(object(), [("alexnet:b32:r224", "training")], "bf16-mixed", [a100])
    assert v100 not in asked[0] and {l40s, a100} <= set(asked[0])
    assert [(f["faster_fp32"], f["faster_low"]) for f in out["flips"]] == [(l40s, a100)]
    assert out["best"]["margin_pct"] == pytest.approx(100.0) and out["best_measured"] == out["best"]
    none_measured = precision_flips(object(), [("alexnet:b32:r224", "training")], "bf16-mixed", [])
    assert none_measured["best_measured"] is None and none_measured["best"] is not None


def test_the_precision_networks_preset_is_networks_only_with_the_unseen_architectures_first() -> None:
    from gpurec.sets import DATASET_ARCHS, TEST_ARCHS, TEST_BATCH_SIZES
    from gpurec.tools.plan import PRESETS, held_out_first

    items = held_out_first(build_parts_plan(PRESETS["precision-networks"](), extract=_fake_extract), TEST_ARCHS)
    assert {(w.item, w.precision) for w in items} == {("network", "bf16-mixed")}
    n_test = len(TEST_ARCHS) * len(TEST_BATCH_SIZES) * 2
    assert {w.key.split(":")[0] for w in items[:n_test]} == set(TEST_ARCHS)
    assert {w.key.split(":")[0] for w in items[n_test:]} == set(DATASET_ARCHS)


def test_training_network_sums_give_autocast_casts_no_time_as_prediction_does() -> None:
    """The network sums training fits its correction on treat casts as the predictor does."""
    from types import SimpleNamespace

    import numpy as np
    import pandas as pd

    from gpurec.model.fitting.validation import predict_networks

    class _Const:
        def __init__(self, value: float) -> None:
            self.value = value

        def predict(self, X, margin, modes):  # noqa: ANN001, ANN201
            return np.full(len(X), np.log(self.value))

    kinds = np.array(["autocast_cast", "Linear", "GELU", "autocast_cast", "Linear"], dtype=object)
    n = len(kinds)
    p = SimpleNamespace(
        net_offsets=np.array([0, n]), net_X={"time": np.zeros((n, 1)), "power": np.zeros((n, 1))},
        net_margin={"time": np.zeros(n), "power": np.zeros(n)}, net_modes_ops=np.full(n, "training"),
        nets=pd.DataFrame({"gpu": ["NVIDIA H100 80GB HBM3"], "mode": ["training"]}), net_kernel_free=None,
        net_kinds=kinds, net_signatures=[f"s{i}" for i in range(n)], net_groups=np.zeros(n, dtype=np.int64),
        builder=SimpleNamespace(feature_names=["x"]))
    sums = predict_networks({"time": _Const(2.0), "power": _Const(300.0)}, p, np.array([0]), small_op_ms=0.02)
    assert sums.sum_time_ms[0] == pytest.approx(6.0)  # three operations of 2 ms, the two casts none
    assert sums.sum_energy_mj[0] == pytest.approx(6.0 * 300.0)


def test_the_bf16_mixed_operations_preset_holds_the_precision_plans_bf16_mixed_operations_only() -> None:
    """The same operation items as the precision preset's bf16-mixed part (so the rows it
    measures count there too), no networks, no other precision, no test architecture."""
    from gpurec.sets import TEST_ARCHS
    from gpurec.tools.plan import PRESETS

    ops = build_parts_plan(PRESETS["bf16-mixed-operations"](), extract=_fake_extract)
    assert ops and {(w.item != "network", w.precision) for w in ops} == {(True, "bf16-mixed")}
    assert not {w.key.split(":")[0] for w in ops} & set(TEST_ARCHS)
    full = build_parts_plan(PRESETS["precision"](), extract=_fake_extract)
    assert [w.id for w in ops] == [w.id for w in full if w.item != "network" and w.precision == "bf16-mixed"]


def test_the_seq_bf16_mixed_preset_measures_sequence_sets_with_the_held_out_architectures_networks_only() -> None:
    """Sequence sets (token shapes, not image batches) at bf16-mixed: every held-out sequence
    architecture's networks at its test shapes first, operations of the training architectures
    alone, and each training set's networks."""
    from gpurec.sets import (
        SEQ_DATASET_ARCHS,
        SEQ_SHAPES,
        SEQ_TEST_ARCHS,
        SEQ_TEST_SHAPES,
        sequence_input_sets,
    )
    from gpurec.tools.plan import PRESETS, held_out_first

    def extract(arch: str, shape: tuple[int, ...], mode: str, precision: str = "fp32") -> list:
        return [SimpleNamespace(signature=f"{arch}-{shape}-{k}", kind=k, precision=precision)
                for k in ("Linear", "softmax")]

    items = held_out_first(build_parts_plan(PRESETS["seq-bf16-mixed"](), extract=extract), SEQ_TEST_ARCHS)
    assert {w.precision for w in items} == {"bf16-mixed"}
    nets = [w for w in items if w.item == "network"]
    test_keys = {s.key for s in sequence_input_sets(SEQ_TEST_ARCHS, SEQ_TEST_SHAPES)}
    train_keys = {s.key for s in sequence_input_sets(SEQ_DATASET_ARCHS, SEQ_SHAPES)}
    assert {w.key for w in nets[:2 * len(test_keys)]} == test_keys
    assert {w.key for w in nets[2 * len(test_keys):]} == train_keys
    ops = [w for w in items if w.item != "network"]
    assert {w.set_key for w in ops} == train_keys  # ":s" keys: sequence sets, not image batches
    assert all(":s" in w.set_key for w in ops) and not {w.set_key.split(":")[0] for w in ops} & set(SEQ_TEST_ARCHS)
