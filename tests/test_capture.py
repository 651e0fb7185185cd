"""Capture on concrete shapes (gpurec.ops.capture): the fallback when torch.fx cannot trace."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpurec.ops import extract as extract_mod
from gpurec.ops import extract_operations
from gpurec.ops.extract import ExtractionError


class _Block(nn.Module):
    """Attention written out, positional table sliced to the length, in-place and reflected operators."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(100, d)
        self.pos = nn.Parameter(torch.zeros(1, 64, d))
        self.qkv = nn.Linear(d, 3 * d)
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.drop = nn.Dropout(0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape[0], ids.shape[1]
        x = self.emb(ids) + self.pos[:, :s]
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1]), dim=-1)
        y = torch.matmul(self.drop(att), v).transpose(1, 2).reshape(b, s, -1)
        x = x + y
        x += self.ff(x)
        x = 2.0 * x - F.relu(x)
        y, _ = self.rnn(x)
        return y.mean(dim=1)


def _fx_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(root: nn.Module, n_inputs: int = 1) -> None:
        raise extract_mod._TraceFailed("torch.fx refused (test)")

    monkeypatch.setattr(extract_mod, "_trace", refuse)


def _identity(ops: list) -> list:
    return [(op.kind, op.signature, op.flops, op.flops_bwd, op.output_shapes, op.kernel_free) for op in ops]


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("keep_sources", [True, False])
def test_fallback_gives_the_operations_fx_gives(monkeypatch: pytest.MonkeyPatch, mode: str,
                                                keep_sources: bool) -> None:
    traced = extract_operations(_Block(), (2, 48), mode=mode, dtype=torch.long, keep_sources=keep_sources)
    _fx_refused(monkeypatch)
    recorded = extract_operations(_Block(), (2, 48), mode=mode, dtype=torch.long, keep_sources=keep_sources)
    assert len(traced) > 15 and _identity(recorded) == _identity(traced)


def test_fallback_gives_fx_operations_for_a_torchvision_classifier(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchvision.models import mobilenet_v3_small

    with torch.device("meta"):
        traced = extract_operations(mobilenet_v3_small(), (2, 3, 96, 96), mode="training")
        _fx_refused(monkeypatch)
        recorded = extract_operations(mobilenet_v3_small(), (2, 3, 96, 96), mode="training")
    assert _identity(recorded) == _identity(traced)


class _ShapeBranch(nn.Module):
    """Python control flow on a shape, which torch.fx cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.short = nn.Linear(16, 8)
        self.long = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] > 32:
            x = x[:, :32]
        for _ in range(x.size(1) // 16):  # a loop whose count is a shape
            x = x * 0.5
        return self.long(x) if x.shape[1] >= 32 else self.short(x)


def test_a_branch_on_a_shape_is_captured_on_concrete_shapes() -> None:
    with pytest.raises(ExtractionError):
        extract_mod._trace(_ShapeBranch())  # torch.fx alone cannot
    long_ops = extract_operations(_ShapeBranch(), (4, 100, 16))
    short_ops = extract_operations(_ShapeBranch(), (4, 20, 16))
    assert [op.kind for op in long_ops] == ["getitem", "mul", "mul", "Linear", "ReLU", "Linear"]
    assert long_ops[3].input_shapes == [[4, 32, 16]]
    assert [op.kind for op in short_ops] == ["mul", "Linear"]


class _HelperSlice(nn.Module):
    """A positional table sliced by a helper that turns the length into a Python int."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(1000, 64)
        self.pos = nn.Parameter(torch.zeros(1, 512, 64))
        self.head = nn.Linear(64, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = int(ids.shape[1])
        return self.head(self.emb(ids) + self.pos[:, :n])


@pytest.mark.parametrize("keep_sources", [True, False])
def test_a_positional_table_sliced_through_int_is_captured(keep_sources: bool) -> None:
    ops = extract_operations(_HelperSlice(), (4, 100), mode="training", dtype=torch.long, keep_sources=keep_sources)
    add = next(op for op in ops if op.kind == "add")
    assert add.input_shapes == [[4, 100, 64], [1, 100, 64]]
    assert ops[-1].output_shapes == [[4, 100, 3]]


class _CausalMask(nn.Module):
    """minGPT's attention: a causal mask made in forward from the sequence length (a factory
    call, ``torch.tril``, which PyTorch runs through a decomposition of tensor operators)."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.tril(torch.ones(t, t, device=x.device)).view(1, 1, t, t)
        att = F.softmax(att.masked_fill(mask == 0, float("-inf")), dim=-1)
        return (att @ v).transpose(1, 2).contiguous().view(b, t, c)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_causal_mask_made_in_forward_is_one_operation_per_call(mode: str) -> None:
    """A call that PyTorch runs through Python (tril's decomposition subtracts aranges) is one
    recorded operation: its insides are neither recorded again nor taken for unknown tensors."""
    ops = extract_operations(_CausalMask(), (2, 16, 32), mode=mode)
    kinds = [op.kind for op in ops]
    assert kinds.count("tril") == 1 and kinds.count("ones") == 1
    assert "arange" not in kinds and "sub" not in kinds
    fill = next(op for op in ops if op.kind == "masked_fill")
    assert fill.input_shapes[0] == [2, 4, 16, 16]
    assert ops[-1].output_shapes == [[2, 16, 32]]


def test_transformer_with_example_inputs_when_fx_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    tr = nn.Transformer(32, 4, 1, 1, 64, batch_first=True)
    src, tgt = torch.zeros(2, 10, 32), torch.zeros(2, 7, 32)
    traced = extract_operations(tr, example_inputs=(src, tgt), mode="training")
    _fx_refused(monkeypatch)
    recorded = extract_operations(tr, example_inputs=(src, tgt), mode="training")
    assert _identity(recorded) == _identity(traced)
    assert recorded[-1].output_shapes == [[2, 7, 32]]


def test_a_branch_on_tensor_values_is_a_typed_error() -> None:
    from gpurec.ops.capture import ValueDependentControlFlow

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] > 1 and x.sum() > 0:  # the shape test alone would be fine
                return self.lin(x)
            return -x

    with pytest.raises(ValueDependentControlFlow, match=r"values \(__bool__\(\) of a tensor"):
        extract_operations(Branchy(), (2, 8))


def test_a_plain_tensor_attribute_is_a_clear_error() -> None:
    class Hidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.ones(8)  # neither parameter nor buffer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[1] > 4:  # forces the capture
                return x * self.scale
            return x

    with pytest.raises(ExtractionError, match="register_buffer"):
        extract_operations(Hidden(), (2, 8))


class _Act(nn.Module):
    def __init__(self, act) -> None:  # noqa: ANN001
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 0:  # shape-dependent: only the capture can take it
            x = self.lin(x)
        return self.act(x)


def test_modules_differing_only_in_a_function_attribute_get_their_own_operations_and_keys() -> None:
    from gpurec.model.predictor import structure_key

    relu, tanh = _Act(torch.relu), _Act(torch.tanh)
    assert structure_key(relu) != structure_key(tanh)
    kinds = [[op.kind for op in extract_operations(m, (4, 16), keep_sources=False)] for m in (relu, tanh)]
    assert kinds == [["Linear", "relu"], ["Linear", "tanh"]]


class _BufferMath(nn.Module):
    """timm's Swin: forward computes from a buffer (torch.fx does not proxy buffers, so
    ``self.mask.unsqueeze(0)`` runs at trace time and enters the graph as a constant)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("mask", torch.zeros(8, 4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).transpose(1, 2) + self.mask.unsqueeze(0)  # not contiguous: runs on meta


@pytest.mark.parametrize("keep_sources", [True, False])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_tensor_fx_computed_from_a_buffer_is_read_as_a_shape(mode: str, keep_sources: bool) -> None:
    """The constant fx makes of it lives on the buffer's device (the caller's, on the prediction
    path, which traces the module in place); extraction reads its shape on meta (it failed with
    'Tensor on device cpu is not on the expected device meta')."""
    ops = extract_operations(_BufferMath(), (2, 4, 8), mode=mode, keep_sources=keep_sources)
    assert [op.kind for op in ops if not op.kernel_free] == ["Linear", "add"]
    assert ops[-1].output_shapes == [[2, 8, 4]]


class _EncoderDecoder(nn.Module):
    """An encoder-decoder called by keyword, as Hugging Face's are (``decoder_input_ids`` is not the
    second positional argument)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.enc, self.dec = nn.Linear(16, 16), nn.Linear(16, 16)
        self.frozen = nn.BatchNorm1d(16)  # never called; put in eval by the test

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None) -> torch.Tensor:
        memory = self.enc(self.emb(input_ids)).mean(1, keepdim=True)
        return self.dec(self.emb(decoder_input_ids) + memory)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_example_inputs_by_keyword(mode: str) -> None:
    """A dict of example inputs passes them by keyword, through extraction, predict_many's items
    and recommend alike; the caller's module keeps its own flags; bad keys are an ExtractionError."""
    model = _EncoderDecoder().train()
    model.frozen.eval()
    inputs = {"input_ids": torch.zeros(2, 12, dtype=torch.long), "decoder_input_ids": torch.zeros(2, 5, dtype=torch.long)}
    ops = extract_operations(model, example_inputs=inputs, mode=mode, keep_sources=False)
    linears = [op for op in ops if op.kind == "Linear"]
    assert [op.input_shapes for op in linears] == [[[2, 12, 16]], [[2, 5, 16]]]
    assert ops[-1].output_shapes == [[2, 5, 16]]
    assert model.training and not model.frozen.training
    with pytest.raises(ExtractionError, match="argument names"):
        extract_operations(model, example_inputs={"not a name": torch.zeros(2, 3, dtype=torch.long)})
    with pytest.raises(ExtractionError, match="nn.Module"):
        extract_operations("resnet18", example_inputs=inputs)


class _PackedClassifier(nn.Module):
    """An LSTM or GRU classifier over variable-length token sequences, as text classifiers are
    written: lengths copied to the host, packed unsorted, unpacked to a longer padded length."""

    def __init__(self, rnn: nn.Module, packed: bool = True, layout_first: bool = True) -> None:
        super().__init__()
        self.emb, self.rnn, self.packed, self.layout_first = nn.Embedding(50, 24), rnn, packed, layout_first
        self.fc = nn.Linear(rnn.hidden_size * (2 if rnn.bidirectional else 1), 3)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)  # (batch, steps, features)
        if not self.layout_first:
            x = x.transpose(0, 1)
        if not self.packed:
            out, hidden = self.rnn(x if self.rnn.batch_first or not self.layout_first else x.transpose(0, 1))
            return self.fc(out.mean(1 if self.rnn.batch_first else 0))
        seq = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=self.layout_first,
                                                enforce_sorted=False)
        out, hidden = self.rnn(seq)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1] + 4)
        return self.fc(padded.mean(1))


@pytest.mark.parametrize(("rnn", "layout_first"), [
    (lambda: nn.LSTM(24, 32, num_layers=2, batch_first=True), True),
    (lambda: nn.GRU(24, 32, bidirectional=True), False),  # time-major layer, packed from a time-major tensor
    (lambda: nn.GRU(24, 32, bidirectional=True), True),   # time-major layer, packed from a batch-first tensor
])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_recurrent_layer_fed_a_packed_sequence_is_the_padded_layer(rnn, layout_first: bool, mode: str) -> None:
    """Packing needs the lengths' values, which extraction never sees: the layer is the same
    operation (signature, shapes, FLOPs) as on the padded batch, every sequence at full length,
    with a PackedSequenceWarning; the unpacked output has the padded shape."""
    import gpurec

    layer = rnn()
    ids, lengths = torch.zeros(6, 10, dtype=torch.long), torch.tensor([10, 3, 7, 1, 9, 10])
    with pytest.warns(gpurec.PackedSequenceWarning, match="padded length 10"):
        ops = extract_operations(_PackedClassifier(layer, True, layout_first), example_inputs=(ids, lengths),
                                 mode=mode, keep_sources=False)
    padded = extract_operations(_PackedClassifier(layer, False, layout_first), example_inputs=(ids, lengths),
                                mode=mode, keep_sources=False)
    kind = type(layer).__name__
    (packed_op,), (padded_op,) = ([op for op in o if op.kind == kind] for o in (ops, padded))
    assert packed_op.signature == padded_op.signature
    assert packed_op.flops == padded_op.flops > 0
    unpacked = next(op for op in ops if op.kind == "pad_packed_sequence")
    assert unpacked.output_shapes[0] == [6, 14, layer.hidden_size * (2 if layer.bidirectional else 1)]
    assert ops[-1].kind == "Linear" and ops[-1].output_shapes == [[6, 3]]


def test_a_packed_sequence_at_mixed_precision() -> None:
    """At a mixed precision the graph is interpreted on a CUDA device, not meta: the calls that
    named the recording's meta device (``torch.arange(..., device=x.device)`` inside
    torch's packing) follow the inputs there instead."""
    import warnings

    import gpurec

    model = _PackedClassifier(nn.LSTM(24, 32, batch_first=True))
    ids, lengths = torch.zeros(4, 12, dtype=torch.long), torch.tensor([12, 5, 8, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpurec.PackedSequenceWarning)
        ops = extract_operations(model, example_inputs=(ids, lengths), mode="training", precision="bf16-mixed",
                                 keep_sources=False)
        fp32 = extract_operations(model, example_inputs=(ids, lengths), mode="training", keep_sources=False)
    (lstm,), (lstm32,) = ([op for op in o if op.kind == "LSTM"] for o in (ops, fp32))
    assert lstm.precision == "bf16-mixed" and lstm.flops == lstm32.flops
    assert lstm.input_shapes == lstm32.input_shapes == [[4, 12, 24]]


def test_packed_data_reshaped_before_the_layer_is_a_clear_error() -> None:
    """Packed data is kept padded while extracting; a forward that flattens it before the layer
    gets an ExtractionError that says so, not a wrong operation."""

    class Reshaped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.LSTM(8, 16)

        def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            seq = nn.utils.rnn.pack_padded_sequence(x, lengths)
            seq = nn.utils.rnn.PackedSequence(seq.data.reshape(-1, 8), seq.batch_sizes)
            return self.rnn(seq)[1][0]

    with pytest.raises(ExtractionError, match="reshaped after packing"):
        extract_operations(Reshaped(), example_inputs=(torch.zeros(5, 4, 8), torch.full((4,), 5)), keep_sources=False)


class _CellLoop(nn.Module):
    """A decoder that steps a recurrent cell in Python, as seq2seq models do."""

    def __init__(self, cell: nn.Module, steps: int = 3, give_state: bool = False) -> None:
        super().__init__()
        self.cell, self.steps, self.give_state = cell, steps, give_state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = None
        if self.give_state:
            h = x.new_zeros(x.shape[0], self.cell.hidden_size)
            state = (h, h) if isinstance(self.cell, nn.LSTMCell) else h
        for t in range(self.steps):
            state = self.cell(x[:, t], state)
        return state[0] if isinstance(state, tuple) else state


@pytest.mark.parametrize(("cell", "gates", "fused"), [(nn.LSTMCell, 4, "fused_lstm_cell"),
                                                      (nn.GRUCell, 3, "fused_gru_cell"), (nn.RNNCell, 1, "tanh")])
@pytest.mark.parametrize("give_state", [False, True])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_a_recurrent_cell_is_its_two_gemms_and_one_pointwise_kernel(monkeypatch: pytest.MonkeyPatch, cell, gates: int,
                                                                     fused: str, give_state: bool, mode: str) -> None:
    """An LSTMCell, GRUCell or RNNCell step is what ATen runs on CUDA: the input and hidden
    products, Linear operations with Linear's settings (so Linear's rows predict them) and the
    cell's FLOPs, then one pointwise kernel; torch.fx and the capture fallback agree."""
    batch, inputs, hidden, steps = 4, 24, 32, 3
    model = _CellLoop(cell(inputs, hidden), steps, give_state)
    ops = extract_operations(model, (batch, steps, inputs), mode=mode, keep_sources=False)
    gemms = [op for op in ops if op.kind == "Linear"]
    assert len(gemms) == 2 * steps and len([op for op in ops if op.kind == fused]) == steps
    assert [(op.settings["in_features"], op.settings["out_features"]) for op in gemms[:2]] == \
        [(inputs, gates * hidden), (hidden, gates * hidden)]
    assert sum(op.flops for op in gemms[:2]) == 2 * batch * gates * hidden * (inputs + hidden)
    assert ops[-1].output_shapes[0] == [batch, hidden]
    _fx_refused(monkeypatch)
    assert _identity(extract_operations(model, (batch, steps, inputs), mode=mode, keep_sources=False)) == _identity(ops)
