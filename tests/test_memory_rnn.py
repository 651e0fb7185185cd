"""cuDNN RNNs in the peak-memory estimate (gpurec.ops.memory): what PyTorch's ``_cudnn_rnn``
keeps and copies, and where cuDNN's workspace and reserve space sit on the step's timeline."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpurec.ops import extract_operations
from gpurec.ops.memory import (
    RNN_RESERVE_HIDDEN,
    RNN_WORKSPACE_FIXED_TOKENS,
    RNN_WORKSPACE_LAYERS,
    memory_terms,
)


def blk(n: int) -> int:
    return -(-n // 512) * 512


class Classifier(nn.Module):
    """An RNN over the input, mean-pooled over time, and a tiny head (the peak is at the RNN)."""

    def __init__(self, kind: type = nn.LSTM, layers: int = 1, hidden: int = 64, bidirectional: bool = True,
                 batch_first: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.rnn = kind(16, hidden, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0].mean(dim=1 if self.batch_first else 0))


def terms(net: nn.Module, shape: tuple[int, ...], mode: str):  # noqa: ANN201
    return memory_terms(extract_operations(net, shape, mode=mode, keep_sources=False), mode)


def test_rnn_keeps_its_output_for_backward_and_its_gradient_flows() -> None:
    """cuDNN's backward reads the RNN's output y as well as its input; ``y, h = rnn(x)`` indexes a
    tuple, which extraction leaves out, so y must be found as the RNN's own output (else it
    carries no gradient).  In the RNN's backward: the input, y (with h and c), y's gradient and
    PyTorch's contiguous copies of the input and of that gradient."""
    batch, seq, hidden = 8, 40, 64
    ops = extract_operations(Classifier(hidden=hidden), (batch, seq, 16), mode="training", keep_sources=False)
    t = memory_terms(ops, "training")
    rnn_out = blk(next(op for op in ops if op.kind == "LSTM").bytes_written)
    x_bytes, y_bytes = blk(batch * seq * 16 * 4), blk(batch * seq * 2 * hidden * 4)
    assert t.saved_bytes >= x_bytes + y_bytes
    assert t.activations_bytes >= 2 * x_bytes + rnn_out + 2 * y_bytes


def test_batch_first_input_is_copied_during_the_call_except_at_batch_one() -> None:
    """``_cudnn_rnn`` transposes a batch-first input to sequence-first and makes it contiguous:
    a copy of the input while the RNN runs (none at batch 1, where the transpose is contiguous)."""
    batch, seq = 8, 40
    ops = extract_operations(Classifier(), (batch, seq, 16), keep_sources=False)
    rnn_out = blk(next(op for op in ops if op.kind == "LSTM").bytes_written)  # y, h and c
    x_bytes = blk(batch * seq * 16 * 4)
    # at the RNN: the step's input, its copy and the RNN's outputs
    assert memory_terms(ops, "inference").activations_bytes == 2 * x_bytes + rnn_out
    seq_first = terms(Classifier(batch_first=False), (seq, batch, 16), "inference")
    assert seq_first.activations_bytes <= x_bytes + rnn_out + 4096  # no copy (at most the pooled output)
    one = terms(Classifier(), (1, seq, 16), "inference")
    one_seq_first = terms(Classifier(batch_first=False), (seq, 1, 16), "inference")
    assert one.activations_bytes == one_seq_first.activations_bytes


@pytest.mark.parametrize("kind, gates", [(nn.LSTM, 4), (nn.GRU, 3)])
def test_workspace_holds_two_layers_of_gates_per_token_and_a_fixed_part_per_layer(kind: type, gates: int) -> None:
    """cuDNN runs the layers one after another and reuses its workspace: more layers add only the
    fixed part (counting every layer's gates per token put a 3-layer GRU 40% above its peaks)."""
    batch, seq, hidden = 8, 40, 64
    layer_gates = 2 * hidden * gates * 4  # both directions, fp32
    one, three = (terms(Classifier(kind, layers, hidden), (batch, seq, 16), "inference") for layers in (1, 3))
    expected_one = RNN_WORKSPACE_LAYERS * batch * seq * layer_gates + RNN_WORKSPACE_FIXED_TOKENS * layer_gates
    assert abs(one.rnn_term_bytes - expected_one) < 1024
    assert abs(three.rnn_term_bytes - one.rnn_term_bytes - 2 * RNN_WORKSPACE_FIXED_TOKENS * layer_gates) < 1024


@pytest.mark.parametrize("kind, mode_name", [(nn.LSTM, "LSTM"), (nn.GRU, "GRU")])
def test_training_keeps_the_reserve_space_until_the_rnns_backward(kind: type, mode_name: str) -> None:
    """The reserve space lives from the forward to the RNN's backward: a language model whose
    vocabulary head peaks after the RNN meets all of it and none of the workspace; a classifier
    peaks in the RNN's backward, with both.  Reserve per token, layer and direction: LSTM 5
    hidden-sized vectors, GRU 7 (read off the training architectures' peaks)."""
    batch, seq, hidden, layers = 8, 40, 64, 2
    reserve = RNN_RESERVE_HIDDEN[mode_name] * batch * seq * layers * 2 * hidden * 4

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = kind(16, hidden, num_layers=layers, bidirectional=True, batch_first=True)
            self.head = nn.Linear(2 * hidden, 50_000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(self.head(self.rnn(x)[0]), dim=-1)

    lm = terms(LM(), (batch, seq, 16), "training")
    assert abs(lm.rnn_term_bytes - reserve) < 1024
    cls = terms(Classifier(kind, layers, hidden), (batch, seq, 16), "training")
    gates = {"LSTM": 4, "GRU": 3}[mode_name]
    workspace = (RNN_WORKSPACE_LAYERS * batch * seq + RNN_WORKSPACE_FIXED_TOKENS * layers) * 2 * hidden * gates * 4
    assert abs(cls.rnn_term_bytes - reserve - workspace) < 1024
