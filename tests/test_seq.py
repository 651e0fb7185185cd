"""Sequence models: the architectures of gpurec.seqmodels, their extraction (recurrent layers
whole, token-id inputs, kernel-free operations, the attention backend), their runnable units,
and a sequence plan measured through the real runner on the CPU with the fake board."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from fakes import FakeNVML
from torch import nn

from gpurec import seqmodels
from gpurec.collect import CollectConfig, WindowConfig, build_plan, run_worker
from gpurec.dataset.store import read_jsonl
from gpurec.ops.extract import extract_operations, sdpa_backend
from gpurec.sets import (
    RNN_SWEEP_ARCHS,
    SEQ_DATASET_ARCHS,
    SEQ_SHAPES,
    SEQ_SWEEP_ARCHS,
    SEQ_TEST_ARCHS,
    SEQ_TEST_SHAPES,
    ModelInputSet,
    SequenceInputSet,
    parse_set_key,
    seq_family,
    sequence_input_sets,
)

FAST = WindowConfig(min_window_s=0.05, tick_timeout_s=10.0, gpu_blocks=3, gpu_min_block_ms=1.0)


# -- sets ---------------------------------------------------------------------------------------

def test_sequence_set_keys_round_trip_beside_image_keys() -> None:
    s = SequenceInputSet("gpt_d512", 4, 1024)
    assert s.key == "gpt_d512:b4:s1024" and s.input_shape == (4, 1024) and s.input_dtype == "int64"
    assert parse_set_key(s.key) == s
    assert parse_set_key("resnet50:b32:r224") == ModelInputSet("resnet50", 32, 224)
    for bad in ("gpt_d512:b4", "gpt_d512:bx:s12", "gpt_d512:4:s12"):
        with pytest.raises(ValueError, match="looks like"):
            parse_set_key(bad)


def test_sequence_architectures_are_split_into_training_and_held_out() -> None:
    assert not set(SEQ_DATASET_ARCHS) & set(SEQ_TEST_ARCHS) and 3 <= len(SEQ_TEST_ARCHS) <= 4
    assert set(seqmodels.SPECS) == set(SEQ_DATASET_ARCHS) | set(SEQ_TEST_ARCHS) | set(SEQ_SWEEP_ARCHS)
    for fam in ("bert", "gpt", "rnn"):
        assert any(seq_family(a) == fam for a in SEQ_TEST_ARCHS), fam  # every family has an unseen model
    train = {s.key for s in sequence_input_sets(SEQ_DATASET_ARCHS, SEQ_SHAPES)}
    test = {s.key for s in sequence_input_sets(SEQ_TEST_ARCHS, SEQ_TEST_SHAPES)}
    assert not train & test and len(train) == sum(
        len(SEQ_SHAPES[seq_family(a)][0]) * len(SEQ_SHAPES[seq_family(a)][1]) for a in SEQ_DATASET_ARCHS)
    with pytest.raises(seqmodels.UnknownSequenceArch, match="not a sequence architecture"):
        seqmodels.build("resnet50")


def test_recurrent_sweeps_add_sizes_without_the_held_out_models_layers() -> None:
    """The LSTM and GRU sweeps: one operation per branch, every branch a layer stack no training
    model has and none a held-out model has, so the held-out recurrent networks stay unseen."""
    from gpurec.ops import extract_operations

    def layers(arch: str) -> set[tuple[str, int, int, int, bool]]:
        spec = seqmodels.SPECS[arch]
        if isinstance(spec, seqmodels.RecurrentSweepSpec):
            return {(spec.cell, d, h, n, bi) for d, h, n, bi in spec.branches}
        if isinstance(spec, seqmodels.RecurrentSpec):
            return {(spec.cell, spec.embed or spec.hidden, spec.hidden, spec.layers, spec.bidirectional)}
        return set()

    swept = set().union(*(layers(a) for a in RNN_SWEEP_ARCHS))
    assert len(swept) == sum(len(seqmodels.SPECS[a].branches) for a in RNN_SWEEP_ARCHS) >= 40
    assert not swept & set().union(*(layers(a) for a in SEQ_TEST_ARCHS))
    assert not swept & set().union(*(layers(a) for a in SEQ_DATASET_ARCHS))
    held_out_hidden = {h for a in SEQ_TEST_ARCHS for _, _, h, _, _ in layers(a)}
    assert not {h for _, _, h, _, _ in swept} & held_out_hidden
    for mode in ("inference", "training"):
        ops = extract_operations("gru_sweep", (8, 32), mode=mode)
        rnn = [o for o in ops if o.kind == "GRU"]
        assert {(o.settings["input_size"], o.settings["hidden_size"], o.settings["num_layers"],
                 o.settings["bidirectional"]) for o in rnn} == set(seqmodels.SPECS["gru_sweep"].branches)
        assert all(tuple(o.input_shapes[0][:2]) == (8, 32) for o in rnn)
    assert seqmodels.build("lstm_sweep").vocab_size == seqmodels.SPECS["lstm_sweep"].vocab


def test_head_sweep_operations_run_through_the_runner(tmp_path: Path, fast_worker: FakeNVML) -> None:
    """The head sweep's heads measure as the device will measure them: built by name, each head
    found by its key, forward and backward (its input's gradient too), no failure."""
    plan = build_plan([SequenceInputSet("gpt_heads", 1, 2)], networks=False)
    heads = [w for w in plan if w.kind == "Linear"]
    assert len(heads) == 2 * len(seqmodels.SPECS["gpt_heads"].branches)  # every branch, both modes
    # the first two heads of each mode (in execution order: width 512, the smallest vocabularies)
    items = [w for m in ("inference", "training") for w in [h for h in heads if h.mode == m][:2]]
    cfg = CollectConfig(window=FAST, repeat_every=0, max_consecutive_failures=5, host_bench_blocks=0)
    summary = run_worker(items, tmp_path, cfg, shard_name="heads", device="cpu", log=lambda _: None)
    rows = [r for r in read_jsonl(tmp_path / "rows-heads.jsonl") if r["item"] != "idle"]
    assert summary["failed"] == 0, [r.get("error") for r in rows if r["status"] != "ok"]
    assert sorted(r["id"] for r in rows) == sorted(w.id for w in items)
    assert {r["backward"] for r in rows if r["mode"] == "training"} == {True}


def test_rnn_sweep_plan_holds_operations_only(tmp_path) -> None:
    import json

    from gpurec.tools.plan import write_rnn_sweep_plan

    counts = write_rnn_sweep_plan(tmp_path / "rnn_sweep.json")
    items = json.loads((tmp_path / "rnn_sweep.json").read_text())["items"]
    assert counts["items"] == len(items) == counts["op"] and {w["item"] for w in items} == {"op"}
    kinds = {w["kind"] for w in items}
    assert {"LSTM", "GRU"} <= kinds
    archs = {k.split(":")[0] for w in items for k in w["model_sets"]}
    assert archs == set(RNN_SWEEP_ARCHS)
    batches, lengths = SEQ_SHAPES["rnn"]
    assert {w["set_key"] for w in items if w["kind"] == "LSTM"} == {
        f"lstm_sweep:b{b}:s{s}" for b in batches for s in lengths}


def test_head_sweep_holds_each_head_once_and_none_of_the_held_out_widths(tmp_path) -> None:
    """The language-model head sweep: one Linear operation per (width, vocabulary) branch at each
    shape, with its input gradient in training; aligned and unaligned vocabularies; no width of a
    held-out model; its plan holds those heads alone, at bf16-mixed and fp32, in both modes."""
    import json

    from gpurec.ops import extract_operations
    from gpurec.sets import HEAD_SWEEP_ARCHS, HEAD_SWEEP_SHAPES
    from gpurec.tools.plan import write_preset_plan

    spec = seqmodels.SPECS["gpt_heads"]
    assert isinstance(spec, seqmodels.HeadSweepSpec) and seqmodels.build("gpt_heads").vocab_size == spec.vocab
    widths = {k for k, _ in spec.branches}
    held_out = {getattr(seqmodels.SPECS[a], "d", None) or seqmodels.SPECS[a].hidden for a in SEQ_TEST_ARCHS}
    assert held_out == {384, 768} and not widths & held_out
    assert {n % 8 == 0 for _, n in spec.branches} == {True, False}
    for mode in ("inference", "training"):
        heads = [o for o in extract_operations("gpt_heads", (8, 256), mode=mode) if o.kind == "Linear"]
        assert sorted((o.settings["in_features"], o.settings["out_features"]) for o in heads) == sorted(spec.branches)
        assert all(tuple(o.input_shapes[0]) == (8, 256, o.settings["in_features"]) for o in heads)
        if mode == "training":
            assert all(o.features()["input_requires_grad"] == 1 for o in heads)

    counts = write_preset_plan("lm-heads", tmp_path / "heads.json")
    items = json.loads((tmp_path / "heads.json").read_text())["items"]
    assert counts["items"] == len(items) == counts["op"] and {w["kind"] for w in items} == {"Linear"}
    batches, lengths = HEAD_SWEEP_SHAPES["gpt"]
    assert {w["set_key"] for w in items} == {f"{a}:b{b}:s{s}" for a in HEAD_SWEEP_ARCHS for b in batches for s in lengths}
    assert {w.get("precision", "fp32") for w in items} == {"bf16-mixed", "fp32"}
    assert {w["mode"] for w in items} == {"inference", "training"}
    assert len(items) == len(spec.branches) * len(batches) * len(lengths) * 2 * 2
    assert not set(batches) & set(SEQ_TEST_SHAPES["gpt"][0])  # never a held-out decoder's batch


# -- extraction ---------------------------------------------------------------------------------

_FAMILY_KINDS = {
    "bert_d256_post": {"Embedding", "MultiheadAttention", "LayerNorm", "Linear", "arange"},
    "bert_d512_pre": {"Embedding", "matmul", "masked_fill", "softmax", "eq"},
    "bert_d768_post": {"Embedding", "cumsum", "ne", "scaled_dot_product_attention", "invert"},
    "gpt_d512": {"Embedding", "scaled_dot_product_attention", "pow", "tanh", "linear"},
    "gpt_d1024": {"Embedding", "bmm", "triu", "masked_fill", "softmax"},
    "lstm_lm_2x512": {"Embedding", "LSTM", "Linear", "log_softmax"},
    "lstm_cls_bi_1x256": {"Embedding", "LSTM", "max", "Linear"},
    "gru_cls_bi_3x512": {"Embedding", "GRU", "mean", "Linear"},
}


@pytest.mark.parametrize("arch", sorted(_FAMILY_KINDS))
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_each_family_extracts_by_name_with_its_operations(arch: str, mode: str) -> None:
    ops = extract_operations(arch, (2, 24), mode=mode, keep_sources=False)
    kinds = {op.kind for op in ops}
    assert _FAMILY_KINDS[arch] <= kinds, _FAMILY_KINDS[arch] - kinds
    assert ("Dropout" in kinds) == (mode == "training")
    emb = next(op for op in ops if op.kind == "Embedding")
    assert emb.input_shapes == [[2, 24]] and emb.input_dtypes == ["int64"] and emb.dtype == "float32"
    # a lookup reads the ids and the rows it gathers, not the whole table
    assert emb.bytes_read == 2 * 24 * 8 + emb.bytes_written < emb.params * 4
    model = seqmodels.build(arch)
    assert extract_operations(model, (2, 24), mode=mode, dtype=torch.long, keep_sources=False)[-1].output_shapes \
        == ops[-1].output_shapes


@pytest.mark.parametrize("cls, gates", [(nn.LSTM, 4), (nn.GRU, 3), (nn.RNN, 1)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_recurrent_layers_are_one_operation_with_their_settings(cls: type[nn.Module], gates: int,
                                                               bidirectional: bool) -> None:
    rnn = cls(16, 24, num_layers=2, batch_first=True, bidirectional=bidirectional)
    n, seq, d = 3, 7, 2 if bidirectional else 1
    ops = extract_operations(rnn, (n, seq, 16), mode="training", keep_sources=False)
    assert [op.kind for op in ops] == [cls.__name__]
    op = ops[0]
    s = op.settings
    assert (s["input_size"], s["hidden_size"], s["num_layers"], s["bidirectional"], s["batch_first"]) == \
        (16, 24, 2, bidirectional, True)
    assert op.input_shapes == [[n, seq, 16]]  # sequence length and batch in the input shape
    h = [[2 * d, n, 24]]
    assert op.output_shapes == [[n, seq, 24 * d], *h, *(h if cls is nn.LSTM else [])]
    assert op.flops == sum(2 * n * seq * gates * 24 * (in_f + 24) for in_f in (16, 24 * d)) * d
    assert op.flops_bwd > 0 and op.flops_elementwise > 0 and op.params == sum(p.numel() for p in rnn.parameters())
    # the analytic shapes are what the module really returns
    real = rnn(torch.randn(n, seq, 16))
    flat = [real[0], *(real[1] if isinstance(real[1], tuple) else (real[1],))]
    assert [list(t.shape) for t in flat] == op.output_shapes


def test_kernel_free_operations_are_flagged() -> None:
    ops = extract_operations("gpt_d1024", (2, 16), mode="training", keep_sources=False)
    flagged = {op.kind for op in ops if op.kernel_free}
    assert {"view", "transpose", "getitem"} <= flagged
    # split is a view, but in training its backward assembles the pieces' gradients (a kernel)
    assert "split" not in flagged
    inference = {op.kind for op in extract_operations("gpt_d1024", (2, 16), keep_sources=False) if op.kernel_free}
    assert "split" in inference
    assert not flagged & {"Linear", "bmm", "softmax", "masked_fill", "add", "LayerNorm", "Dropout"}
    # reshape of a transposed tensor copies; of a contiguous one it does not
    reshapes = [op.kernel_free for op in ops if op.kind == "reshape"]
    assert False in reshapes
    # dropout launches no kernel at p=0 only
    p0 = [op for op in extract_operations("gpt_d512", (2, 16), mode="training", keep_sources=False)
          if op.kind == "Dropout"]
    assert p0 and all(op.kernel_free for op in p0)
    p1 = [op for op in ops if op.kind == "Dropout"]
    assert p1 and not any(op.kernel_free for op in p1)

    class Views(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.view(2, 8, 4).contiguous()  # contiguous already: no copy
            y.add_(1.0)  # in place: writes, though it returns its input
            return y.transpose(1, 2).contiguous()  # a copy

    by_kind = {op.kind: op for op in extract_operations(Views(), (2, 32), keep_sources=False)}
    got = [by_kind[k].kernel_free for k in ("view", "add_")]
    assert got == [True, False]
    assert [op.kernel_free for op in extract_operations(Views(), (2, 32), keep_sources=False)
            if op.kind == "contiguous"] == [True, False]


def test_attention_backend_rule_per_dtype() -> None:
    assert sdpa_backend("float32", 64, 64, has_mask=False) == "memory_efficient"  # fp32: never flash
    assert sdpa_backend("bfloat16", 64, 64, has_mask=False) == "flash"
    assert sdpa_backend("float16", 128, 128, has_mask=True) == "memory_efficient"  # a mask rules flash out
    assert sdpa_backend("float16", 512, 512, has_mask=False) == "memory_efficient"  # head dim over 256
    assert sdpa_backend("float32", 6, 6, has_mask=False) == "math"
    assert sdpa_backend("float64", 64, 64, has_mask=False) == "math"
    ops = extract_operations("gpt_d512", (2, 16), keep_sources=False)
    att = [op for op in ops if op.kind == "scaled_dot_product_attention"]
    assert att and {op.backend for op in att} == {"memory_efficient"}
    assert all(op.backend == "" for op in ops if op.kind != "scaled_dot_product_attention")


@pytest.mark.parametrize("arch", ["gpt_d512", "bert_d768_post"])  # flash; memory-efficient (a padding mask)
def test_fused_attention_under_autocast_reads_its_half_precision_inputs(arch: str) -> None:
    """Without CUDA, torch's math fallback upcasts q, k, v to float32 inside the call; the GPU's
    fused kernel does not, so those copies are neither casts nor the attention's input dtype
    (the GPU machine's extraction, whose signatures a plan must name, has neither)."""
    ops = extract_operations(arch, (2, 16), mode="training", keep_sources=False, precision="bf16-mixed")
    att = [op for op in ops if op.kind == "scaled_dot_product_attention"]
    assert att and {op.backend for op in att} <= {"flash", "memory_efficient"}
    for op in att:
        assert op.input_dtypes[:3] == ["bfloat16"] * 3 and op.dtype == "bfloat16"
        assert op.bytes_read >= sum(2 * torch.Size(s).numel() for s in op.input_shapes[:3])
    feeding = {n for op in att for n in op.input_nodes}
    upcasts = [op for op in ops if op.kind == "autocast_cast" and op.node in feeding]
    assert not upcasts
    assert not [op for op in ops if op.kind == "autocast_cast" and op.settings["to_dtype"] == "float32"
                and op.settings["from_dtype"] == "bfloat16" and op.input_shapes == att[0].input_shapes[:1]]


def test_float_operations_keep_their_signatures() -> None:
    """input_dtypes enters the identity only where an input is not the operation's dtype."""
    ops = extract_operations("gpt_d512", (2, 16), keep_sources=False)
    lin = next(op for op in ops if op.kind == "Linear")
    assert lin.input_dtypes is None and "input_dtypes" not in lin.identity()
    emb = next(op for op in ops if op.kind == "Embedding")
    assert emb.identity()["input_dtypes"] == ["int64"]


# -- units ----------------------------------------------------------------------------------------

def test_token_id_inputs_are_random_and_in_range() -> None:
    ops = extract_operations("bert_d256_post", (4, 32), mode="training")
    emb = next(op for op in ops if op.kind == "Embedding" and op.input_shapes == [[4, 32]])
    unit = emb.materialize(instances=1, seed=3)
    ids = unit.inputs[0]
    assert ids.dtype == torch.int64 and int(ids.min()) >= 0 and int(ids.max()) < 30522
    assert len(ids.unique()) > 64  # not zeros
    unit.step()
    # the positional table is looked up through arange, created on the unit's device
    pos = next(op for op in ops if op.kind == "arange")
    assert pos.materialize()._calls[0]().device.type == "cpu"  # not the extraction's meta device


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_recurrent_units_run_forward_and_backward(cls: type[nn.Module]) -> None:
    op = extract_operations(cls(8, 16, 2, batch_first=True), (3, 5, 8), mode="training")[0]
    unit = op.materialize(instances=2)
    assert unit.backward and len(unit._grads) == (3 if cls is nn.LSTM else 2)  # output, h_n (and c_n)
    for _ in range(3):
        unit.step()
    inference = extract_operations(cls(8, 16, 2, batch_first=True), (3, 5, 8))[0].materialize()
    inference.step()


# -- collection -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def seq_plan() -> list:
    sets = [SequenceInputSet("lstm_cls_bi_1x256", 2, 12), SequenceInputSet("gpt_d512", 1, 8)]
    return build_plan(sets)


def test_sequence_plan_has_networks_and_the_new_kinds(seq_plan: list) -> None:
    nets = [w for w in seq_plan if w.item == "network"]
    assert {(w.key, w.mode) for w in nets} == {(k, m) for k in ("lstm_cls_bi_1x256:b2:s12", "gpt_d512:b1:s8")
                                                for m in ("inference", "training")}
    kinds = Counter(w.kind for w in seq_plan if w.item == "op")
    assert {"LSTM", "Embedding", "scaled_dot_product_attention", "pow", "max"} <= set(kinds)


def test_sequence_plan_runs_through_the_runner(tmp_path: Path, fast_worker: FakeNVML, seq_plan: list) -> None:
    wanted = {"LSTM", "Embedding", "scaled_dot_product_attention", "max"}
    items = [w for w in seq_plan if w.item == "network"]
    items += [w for w in seq_plan if w.item == "op" and w.kind in wanted]
    cfg = CollectConfig(window=FAST, repeat_every=0, max_consecutive_failures=5, host_bench_blocks=0)
    summary = run_worker(items, tmp_path, cfg, shard_name="seq", device="cpu", log=lambda _: None)
    rows = [r for r in read_jsonl(tmp_path / "rows-seq.jsonl") if r["item"] != "idle"]
    assert summary["failed"] == 0, [r.get("error") for r in rows if r["status"] != "ok"]
    assert summary["ok"] == len(items) and sorted(r["id"] for r in rows) == sorted(w.id for w in items)
    by_kind = {(r["op_kind"], r["mode"]): r for r in rows}
    assert by_kind[("LSTM", "training")]["backward"] is True
    assert by_kind[("network", "training")]["backward"] is True
    assert all(r["time_ms"] > 0 for r in rows)


def test_recurrent_sweep_operations_run_through_the_runner(tmp_path: Path, fast_worker: FakeNVML) -> None:
    """The sweep's operations measure as the device will measure them: built by name, each layer
    stack found by its key, forward and backward, no failure."""
    plan = build_plan([SequenceInputSet("gru_sweep", 2, 6)], networks=False)
    assert {w.kind for w in plan} >= {"GRU", "Embedding", "getitem", "cat"}
    grus = [w for w in plan if w.kind == "GRU"]
    assert len(grus) == 2 * len(seqmodels.SPECS["gru_sweep"].branches)  # every branch, both modes
    items = grus[:2] + grus[-2:] + [w for w in plan if w.kind in ("getitem", "cat") and w.mode == "training"][:2]
    cfg = CollectConfig(window=FAST, repeat_every=0, max_consecutive_failures=5, host_bench_blocks=0)
    summary = run_worker(items, tmp_path, cfg, shard_name="sweep", device="cpu", log=lambda _: None)
    rows = [r for r in read_jsonl(tmp_path / "rows-sweep.jsonl") if r["item"] != "idle"]
    assert summary["failed"] == 0, [r.get("error") for r in rows if r["status"] != "ok"]
    assert sorted(r["id"] for r in rows) == sorted(w.id for w in items)
    assert all(r["backward"] for r in rows if r["mode"] == "training" and r["op_kind"] == "GRU")


def test_network_unit_feeds_token_ids_in_range() -> None:
    from gpurec.collect.runner import NetworkUnit

    unit = NetworkUnit("lstm_cls_bi_1x256", (3, 40), "training", "cpu", seed=1)
    assert unit.x.dtype == torch.int64 and unit.x.shape == (3, 40)
    assert 0 <= int(unit.x.min()) and int(unit.x.max()) < unit.model.vocab_size and len(unit.x.unique()) > 20
    unit.step()
    assert all(p.grad is None for p in unit.model.parameters())  # gradients reset after the step


# -- capture --------------------------------------------------------------------------------------

class _PositionalTable(nn.Module):
    """The commonest way a positional table is written: sliced to the input's length."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(1000, 64)
        self.pos = nn.Parameter(torch.zeros(1, 512, 64))
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), 2,
                                         enable_nested_tensor=False)
        self.head = nn.Linear(64, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids) + self.pos[:, : ids.shape[1]]
        return self.head(self.enc(x)[:, 0])


@pytest.mark.parametrize("keep_sources", [True, False])
def test_positional_table_sliced_to_the_input_length_extracts(keep_sources: bool) -> None:
    ops = extract_operations(_PositionalTable(), (4, 100), mode="training", dtype=torch.long,
                             keep_sources=keep_sources)
    add = next(op for op in ops if op.kind == "add")
    assert add.input_shapes == [[4, 100, 64], [1, 100, 64]]  # the table cut to the 100 tokens
    sliced = next(op for op in ops if op.kind == "getitem" and not op.input_shapes)
    assert sliced.kernel_free and sliced.settings["args"][1][1] == {"slice": [None, 100, None]}
    assert ops[-1].output_shapes == [[4, 3]]


def test_control_flow_on_tensor_values_is_a_clear_error() -> None:
    from gpurec.ops.extract import ExtractionError

    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(ExtractionError, match="branches with if/while on a tensor"):
        extract_operations(Branchy(), (2, 8))


def test_recurrent_features_follow_the_layout_and_settings() -> None:
    from gpurec.ops.features import operation_features

    lstm = nn.LSTM(8, 16, num_layers=2, bidirectional=True)  # (seq, batch, features)
    f = operation_features(extract_operations(lstm, (5, 3, 8), keep_sources=False)[0])
    assert (f["batch"], f["seq_len"], f["channels"]) == (3.0, 5.0, 8.0)
    assert (f["in_features"], f["out_features"], f["embed_dim"], f["num_heads"]) == (8.0, 32.0, 16.0, 4.0)
    gru = nn.GRU(8, 16, batch_first=True)
    g = operation_features(extract_operations(gru, (3, 5, 8), keep_sources=False)[0])
    assert (g["batch"], g["seq_len"], g["out_features"], g["num_heads"]) == (3.0, 5.0, 16.0, 1.0)


def test_attention_with_a_padding_mask_runs_finite() -> None:
    ops = extract_operations("bert_d768_post", (2, 16), mode="training")
    att = next(op for op in ops if op.kind == "scaled_dot_product_attention")
    assert att.input_dtypes == ["float32", "float32", "float32", "bool"]
    unit = att.materialize()
    assert bool(unit.inputs[3].all())
    assert torch.isfinite(unit._calls[0]()).all()  # every query may attend somewhere
    unit.step()


def test_training_never_asks_a_gradient_of_a_non_float_input() -> None:
    """A bool mask made from a float tensor (a causal triu mask) carries no gradient: measuring
    such an operation with its mask requiring grad failed on the GPU."""
    ops = extract_operations("gpt_d1024", (1, 32), mode="training", keep_sources=True)
    masked = [op for op in ops if op.input_dtypes and any(d in ("bool", "int64") for d in op.input_dtypes)]
    assert {op.kind for op in masked} >= {"triu", "masked_fill"}
    for op in masked:
        flags = [rg for rg, d in zip(op.input_requires_grad, op.input_dtypes, strict=True) if d in ("bool", "int64")]
        assert not any(flags), (op.kind, op.input_requires_grad, op.input_dtypes)
    triu = next(op for op in masked if op.kind == "triu")
    triu.materialize("cpu").step()


def test_recard_plan_interleaves_both_families_and_matches_the_committed_plan(tmp_path) -> None:
    import json

    from gpurec.tools.plan import DEFAULT_PLAN, RECARD_PLAN, SEQ_PLAN, recard_items, write_recard_plan

    cnn = {"items": [{"item": "network", "key": f"resnet18:b{b}:r224", "mode": "inference"} for b in (1, 32, 128)]
           + [{"item": "op", "key": "resnet18:b32:r224", "mode": "inference"}]}
    seq = {"items": [{"item": "network", "key": f"gpt_d512:b{b}:s512", "mode": "training"} for b in (32, 64)]}
    items = recard_items(cnn, seq)
    assert [i["key"] for i in items] == ["resnet18:b32:r224", "gpt_d512:b32:s512", "resnet18:b128:r224"]
    # the committed plan is what the committed main and sequence plans give
    summary = write_recard_plan(tmp_path / "recard.json", DEFAULT_PLAN, SEQ_PLAN)
    written, committed = (json.loads(p.read_text()) for p in (tmp_path / "recard.json", RECARD_PLAN))
    assert written == committed and summary["items"] == len(committed["items"]) > 100


def test_arch_subset_plan_copies_the_archs_items_verbatim_and_matches_the_committed_subset(tmp_path) -> None:
    import json

    import pytest

    from gpurec.tools.plan import TARGETED_PLAN, arch_subset_items, write_arch_subset_plan

    shared = {"item": "op", "key": "aa11", "mode": "inference", "precision": "bf16-mixed",
              "model_sets": ["sweepdense:b1:r224", "sweepfewgroups:b8:r224"]}
    plan = {"items": [{"item": "op", "key": "bb22", "mode": "training", "model_sets": ["sweepdense:b1:r224"]},
                      shared,
                      {"item": "network", "key": "sweepfewgroups:b8:r224", "mode": "inference",
                       "model_sets": ["sweepfewgroups:b8:r224"]}]}
    # an operation shared with another set is in; the plan's order and every field are kept
    assert arch_subset_items(plan, ["sweepfewgroups"]) == plan["items"][1:]
    with pytest.raises(ValueError, match="not in the plan: sweepnone"):
        arch_subset_items(plan, ["sweepfewgroups", "sweepnone"])
    (tmp_path / "plan.json").write_text(json.dumps({**plan, "torch": "2.11.0"}))
    assert write_arch_subset_plan(tmp_path / "small.json", tmp_path / "plan.json", ["sweepfewgroups"]) == {
        "items": 2, "op": 1, "op:bf16-mixed": 1, "network": 1}
    # the committed subset is what the committed targeted plan gives
    summary = write_arch_subset_plan(tmp_path / "sub.json", TARGETED_PLAN, ["sweepfewgroups"])
    written = json.loads((tmp_path / "sub.json").read_text())
    committed = json.loads((TARGETED_PLAN.parent / "targeted_fewgroups.json").read_text())
    assert written == committed and summary["items"] == len(committed["items"]) > 100
