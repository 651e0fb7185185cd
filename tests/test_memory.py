"""Peak step memory (gpurec.ops.memory) against hand-computed liveness and measured peaks."""

from __future__ import annotations

import torch
from torch import nn

from gpurec.ops import extract_operations
from gpurec.ops.memory import step_memory

# Peaks measured with torch.cuda.max_memory_allocated on an H100 (fp32, batch x 3 x 224 x 224),
# quoted in issue 24; the collected network rows will carry their own (peak_memory_bytes).
MEASURED_PEAK_GB = {("vit_b_16", 256, "inference"): 2.55, ("vit_b_16", 1024, "inference"): 9.06,
                    ("resnet50", 256, "training"): 22.4}


def test_inference_frees_each_activation_after_its_last_user() -> None:
    """Eval dropouts are left out of the operations: their outputs must not live from the step's start."""
    width, layers, batch = 256, 6, 512
    net = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width, bias=False), nn.Dropout(0.1))])
    ops = extract_operations(net, (batch, width), keep_sources=False)
    assert [op.kind for op in ops] == ["Linear"] * layers
    act = batch * width * 4
    mem = step_memory(ops, "inference")
    # at any Linear: the step's input (held by the caller), the Linear's input and its output
    assert mem.activations_bytes == 3 * act
    assert mem.params_bytes == layers * width * width * 4


def test_estimate_is_within_15_percent_of_measured_peaks() -> None:
    for (model, batch, mode), measured_gb in MEASURED_PEAK_GB.items():
        ops = extract_operations(model, (batch, 3, 224, 224), mode=mode, keep_sources=False)
        est = step_memory(ops, mode).memory_gb
        assert abs(est / measured_gb - 1) <= 0.15, (model, batch, mode, est, measured_gb)


class _SelfAttention(nn.Module):
    def __init__(self, need_weights: bool) -> None:
        super().__init__()
        self.mha, self.need_weights = nn.MultiheadAttention(64, 4, batch_first=True), need_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=self.need_weights)[0]


def test_attention_scores_grow_with_the_square_of_the_sequence() -> None:
    """Multi-head attention's own buffers in inference on the math path (weights asked for, or
    a sequence length not a multiple of 8): scores and softmax are heads x L x L."""
    def act(seq: int, need_weights: bool) -> int:
        ops = extract_operations(_SelfAttention(need_weights), (2, seq, 64), keep_sources=False)
        return step_memory(ops).activations_bytes

    out = 2 * 64 * 4  # one token's output bytes x batch
    for seq in (197, 50):  # ViT's token counts
        # input, output, 4 outputs' worth of projections, 2 x (batch x heads x L x L) scores
        assert act(seq, False) == 6 * out * seq + 2 * 2 * 4 * seq * seq * 4
    # asked for the weights, the math path at any length (its averaged weights are an output too)
    assert act(64, True) >= 6 * out * 64 + 2 * 2 * 4 * 64 * 64 * 4


def test_fused_attention_holds_no_score_matrix() -> None:
    """need_weights=False on sequences of a multiple of 8 tokens (BERT-like encoders): a fused
    kernel, 8 outputs' worth inside the attention (projection, q/k/v, output, its copy), linear
    in the sequence; the math path's scores put BERT inference up to 61% above its peaks."""
    out = 2 * 64 * 4
    for seq in (16, 512):
        ops = extract_operations(_SelfAttention(False), (2, seq, 64), keep_sources=False)
        assert step_memory(ops).activations_bytes == 10 * out * seq  # + the input and the output


def test_math_attention_keeps_the_softmax_output_not_every_stage_of_its_scores() -> None:
    """Training keeps what autograd saves: q (both matmuls' input), the probabilities (softmax's
    output, the second matmul's input) and the mask, not the raw, scaled or masked scores."""
    from gpurec.ops.memory import memory_terms

    batch, seq, dim = 2, 64, 32

    class MathAttention(nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            scores = torch.matmul(q, q.transpose(-2, -1)) / 8.0
            mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=q.device), 1)
            probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
            return torch.matmul(probs, q)

    ops = extract_operations(MathAttention(), (batch, seq, dim), mode="training", keep_sources=False)
    by_kind = {op.kind: op for op in ops}
    assert {"matmul", "truediv", "softmax", "masked_fill", "triu"} <= set(by_kind) or \
        {"matmul", "div", "softmax", "masked_fill", "triu"} <= set(by_kind)
    q = batch * seq * dim * 4
    expected = q + by_kind["softmax"].bytes_written + by_kind["triu"].bytes_written
    assert memory_terms(ops, "training").saved_bytes == expected


def test_training_peak_follows_backward_not_the_sum_of_saved_tensors_and_gradients() -> None:
    """Backward frees saved activations while parameter gradients appear: a step whose parameters
    outweigh its activations peaks at the end of backward, below parameters + gradients + saved."""
    from gpurec.ops.memory import memory_terms

    def blk(n: int) -> int:
        return -(-n // 512) * 512

    width, layers, batch = 512, 4, 64
    net = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width, bias=False), nn.Tanh())])
    t = memory_terms(extract_operations(net, (batch, width), mode="training", keep_sources=False), "training")
    act = blk(batch * width * 4)
    assert t.saved_bytes == (layers + 1) * act  # each Linear's input and each Tanh's output, not its input
    # at the first Linear's backward every gradient exists; alive beside them: the step's input
    # and result, the result's gradient and the gradient of the first Linear's output
    assert t.activations_bytes == 4 * act
    # with activations far larger than the parameters, the peak is at backward's start instead:
    # everything saved (less the step's input and result, counted apart) and both gradients
    big = memory_terms(extract_operations(net, (16384, width), mode="training", keep_sources=False), "training")
    big_act = blk(16384 * width * 4)
    # in the last Linear's backward: x, the result and its gradient, the three saved Tanh outputs
    # before it, the gradients of that Linear's output and input (8 activations), and the first
    # parameter gradient already made; less than the saved sum with every gradient
    assert 8 * big_act < big.activations_bytes + 2 * big.params_bytes < 8 * big_act + 2 * big.params_bytes


def test_a_tied_lm_head_holds_the_embedding_once_and_dropout_zero_is_its_input() -> None:
    """F.linear(x, tok.weight) reuses the embedding's weight; nn.Dropout(0.0) returns its input."""
    from gpurec.ops.memory import memory_terms

    class Tied(nn.Module):
        def __init__(self, p: float) -> None:
            super().__init__()
            self.tok = nn.Embedding(1000, 64)
            self.drop = nn.Dropout(p)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(self.drop(self.tok(ids)), self.tok.weight)

    def terms(p: float):  # noqa: ANN202
        ops = extract_operations(Tied(p), (4, 32), mode="training", dtype=torch.long, keep_sources=False)
        return memory_terms(ops, "training")

    assert terms(0.0).params_bytes == 1000 * 64 * 4
    # p = 0.1 keeps a one-byte mask and a new output; p = 0 neither
    assert terms(0.0).saved_bytes < terms(0.1).saved_bytes


def test_autocast_weight_copies_live_until_their_layers_backward_not_the_whole_step() -> None:
    """Steps run autocast with its cast cache off: a weight's bf16 copy is held only by the layer
    that saved it, so at the end of backward (every fp32 gradient made) one copy is left, not all."""
    from gpurec.ops.memory import memory_terms

    width, layers = 1024, 4
    net = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)])
    ops = extract_operations(net, (2, width), mode="training", keep_sources=False, precision="bf16-mixed")
    assert sum(op.kind == "autocast_cast" and not op.input_nodes for op in ops) == layers
    t = memory_terms(ops, "training")
    copy = width * width * 2
    assert t.params_bytes == layers * width * width * 4
    assert copy <= t.activations_bytes < 2 * copy  # the first layer's copy (and small activations)


def test_rnn_workspace_counts_in_inference_only_above_the_peak_it_meets() -> None:
    """cuDNN's RNN workspace lives during the RNN's call: a language model whose vocabulary head
    peaks later adds nothing (training: tests/test_memory_rnn.py)."""
    from gpurec.ops.memory import memory_terms

    class LM(nn.Module):
        def __init__(self, vocab: int) -> None:
            super().__init__()
            self.rnn, self.head = nn.LSTM(64, 64, batch_first=True), nn.Linear(64, vocab)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(self.head(self.rnn(x)[0]), dim=-1)

    def terms(vocab: int, mode: str):  # noqa: ANN202
        return memory_terms(extract_operations(LM(vocab), (8, 32, 64), mode=mode, keep_sources=False), mode)

    big_head, small_head = terms(50_000, "inference"), terms(4, "inference")
    assert big_head.rnn_bytes == small_head.rnn_bytes == 8 * 32 * 64 * 4 * 4
    assert big_head.rnn_term_bytes == 0  # the head's logits outweigh the workspace
    assert small_head.rnn_term_bytes > 0


def test_swin_window_attention_keeps_its_scores_inside() -> None:
    """Swin's shifted-window attention is one leaf: training keeps four outputs' worth and the
    softmax (tokens x heads x window^2) inside it, so twice the heads keep that much more."""
    import dataclasses

    from gpurec.ops.memory import memory_terms

    ops = extract_operations("swin_t", (1, 3, 224, 224), mode="training", keep_sources=False)
    i = next(j for j, op in enumerate(ops) if op.kind == "shifted_window_attention")
    op = ops[i]
    tokens, heads, window2 = 56 * 56, op.input_shapes[1][1], op.input_shapes[1][2]
    assert (heads, window2) == (3, 49)
    more = dataclasses.replace(op, input_shapes=[op.input_shapes[0], [1, 2 * heads, window2, window2]])
    base = memory_terms(ops, "training").saved_bytes
    grown = memory_terms([*ops[:i], more, *ops[i + 1:]], "training").saved_bytes - base
    assert abs(grown - tokens * heads * window2 * 4) < 512  # in 512-byte blocks
    assert base - memory_terms([*ops[:i], *ops[i + 1:]], "training").saved_bytes >= 4 * op.bytes_written


def test_autocast_inference_keeps_the_steps_input_alive_behind_the_weight_casts() -> None:
    """Under autocast the step opens with the first layer's weight cast, which reads no
    activation; the fp32 input the caller holds must still count for the whole step."""
    width, batch = 256, 512
    net = nn.Sequential(nn.Linear(width, width, bias=False), nn.ReLU(), nn.Linear(width, width, bias=False))
    ops = extract_operations(net, (batch, width), keep_sources=False, precision="bf16-mixed")
    assert ops[0].kind == "autocast_cast" and not ops[0].input_nodes
    x_fp32, act_bf16, weight_bf16 = batch * width * 4, batch * width * 2, width * width * 2
    mem = step_memory(ops, "inference")
    # at the second Linear: the fp32 input, the ReLU's output (the first Linear's, in place),
    # the weight's bf16 copy and the output
    assert mem.activations_bytes == x_fp32 + 2 * act_bf16 + weight_bf16


def test_max_pooling_holds_int64_indices_during_inference_and_keeps_them_in_training() -> None:
    """CUDA max pooling always computes its argmax (aten ``max_pool2d`` calls
    ``max_pool2d_with_indices``): eight bytes per output element, freed after the call in
    inference, kept for backward in training."""
    from gpurec.ops.memory import memory_terms

    batch, ch, res = 16, 8, 64
    net = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), nn.Flatten())
    ops = extract_operations(net, (batch, ch, res, res), keep_sources=False)
    x = batch * ch * res * res * 4
    assert memory_terms(ops, "inference").activations_bytes == x + x + 2 * x  # input, output, indices
    train = extract_operations(net, (batch, ch, res, res), mode="training", keep_sources=False)
    assert memory_terms(train, "training").saved_bytes >= 2 * x  # the indices among what backward needs


def test_a_convolutions_workspace_lifts_the_peak_only_where_it_runs() -> None:
    """The fitted convolution term multiplies how far each convolution's workspace (its inputs
    plus outputs, during its call) lifts the inference peak, not the largest convolution's io
    added on top of a peak it may not meet."""
    from gpurec.ops.memory import CONV_WORKSPACE_IO, memory_terms

    class Net(nn.Module):
        def __init__(self, head: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(8, 4, 3, padding=1, bias=False)
            self.head = nn.Linear(4 * 16 * 16, head, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.flatten(self.conv(x), 1))

    batch = 8
    x, y = batch * 8 * 16 * 16 * 4, batch * 4 * 16 * 16 * 4
    small = memory_terms(extract_operations(Net(10), (batch, 8, 16, 16), keep_sources=False), "inference")
    assert small.conv_io_bytes == x + y
    head_out = 512  # 8 x 10 floats, one allocator block
    assert small.activations_bytes == x + y + head_out  # at the head: its input's storage and output
    # at the convolution: the input, its output and the workspace
    assert small.conv_term_bytes == x + y + int(CONV_WORKSPACE_IO * (x + y)) - small.activations_bytes
    big = memory_terms(extract_operations(Net(40_000), (batch, 8, 16, 16), keep_sources=False), "inference")
    assert big.conv_io_bytes == x + y
    assert big.conv_term_bytes == 0  # the head's output outweighs the workspace


def test_autocast_input_casts_keep_nothing_for_backward() -> None:
    """A dtype cast's backward (ToCopyBackward) needs none of its input: the float32 output of a
    LayerNorm (autocast's float32 list) is not kept because a Linear reads its bf16 copy."""
    from gpurec.ops.memory import memory_terms

    width, batch = 512, 256
    net = nn.Sequential(nn.Linear(width, width, bias=False), nn.LayerNorm(width), nn.Linear(width, width, bias=False))
    ops = extract_operations(net, (batch, width), mode="training", keep_sources=False, precision="bf16-mixed")
    ln = next(op for op in ops if op.kind == "LayerNorm")
    assert ln.dtype == "float32"
    assert any(op.kind == "autocast_cast" and op.input_nodes == [ln.node] for op in ops)
    t = memory_terms(ops, "training")
    act_fp32, act_bf16 = batch * width * 4, batch * width * 2
    weights_bf16 = 2 * width * width * 2
    # kept: the weight copies, the input's bf16 copy (first Linear), the float32 copy LayerNorm
    # reads, the bf16 copy of its output (second Linear); neither the first Linear's bf16 output
    # nor the float32 LayerNorm output, which only casts read
    assert t.saved_bytes == weights_bf16 + act_bf16 + act_fp32 + act_bf16


def test_window_attention_scores_are_float32_under_autocast() -> None:
    """Swin's scores are float32 under autocast (the float32 position bias promotes them, softmax
    runs in float32), so a bf16-mixed step holds them at four bytes, as fp32 does."""
    from gpurec.ops.memory import _window_attention_buffers

    ops = {p: extract_operations("swin_t", (1, 3, 224, 224), keep_sources=False, precision=p)
           for p in ("fp32", "bf16-mixed")}
    att = {p: next(op for op in o if op.kind == "shifted_window_attention") for p, o in ops.items()}
    assert att["bf16-mixed"].dtype == "bfloat16"
    out32, out16 = int(att["fp32"].bytes_written), int(att["bf16-mixed"].bytes_written)
    scores32 = _window_attention_buffers(att["fp32"])[1] - 5 * out32
    scores16 = _window_attention_buffers(att["bf16-mixed"])[1] - 5 * out16
    assert scores16 == scores32 > 0


def test_submodules_the_step_never_calls_still_hold_their_parameters() -> None:
    """GoogLeNet's auxiliary heads run in training only, yet their weights are on the GPU in
    inference too (its batch-1 inference peak read 17% low without them); a weight an uncalled
    module shares with a called one (tied) is counted once, and a cast module's weights take 2 bytes."""
    from gpurec.ops.memory import memory_terms

    class WithAux(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(64, 64)
            self.aux = nn.Sequential(nn.Linear(64, 500), nn.BatchNorm1d(500), nn.Linear(500, 64))
            self.head = nn.Linear(64, 64)  # never called; its weight is the body's
            self.head.weight = self.body.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.body(x)
            return y + self.aux(x) if self.training else y

    floats = (64 * 500 + 500) + (500 + 500) + (500 * 64 + 64) + (500 + 500)  # linear, BN, linear, running stats
    count = 8  # BatchNorm's int64 num_batches_tracked
    head_bias = 64
    ops = extract_operations(WithAux(), (8, 64), keep_sources=False)
    assert ops.dormant_state_bytes == (floats + head_bias) * 4 + count
    assert memory_terms(ops, "inference").params_bytes == (64 * 64 + 64) * 4 + (floats + head_bias) * 4 + count
    trained = extract_operations(WithAux(), (8, 64), mode="training", keep_sources=False)
    assert trained.dormant_state_bytes == head_bias * 4  # training calls the head: its layers carry it
    cast = extract_operations(WithAux(), (8, 64), keep_sources=False, precision="bf16")
    assert cast.dormant_state_bytes == (floats + head_bias) * 2 + count
    assert extract_operations("googlenet", (1, 3, 224, 224), keep_sources=False).dormant_state_bytes > 25e6


def test_a_reshape_that_cannot_view_its_permuted_input_copies_it() -> None:
    """PyTorch's reshape returns a view only where the input's strides allow one: after a permute
    that moves a dimension across others it copies (Swin-style window partitions), and the copy
    holds memory; a reshape that only splits a permuted tensor's dimensions stays a view."""

    class Partition(nn.Module):
        def __init__(self, split_only: bool) -> None:
            super().__init__()
            self.split_only = split_only
            self.proj = nn.Linear(32, 32, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.permute(0, 2, 1)  # (B, L, C), strides (C*L, 1, L)
            y = y.reshape(x.shape[0], 4, 16, 32) if self.split_only else y.reshape(-1, 32)
            return self.proj(y)

    b, length, c = 64, 64, 32
    act = b * length * c * 4
    view = step_memory(extract_operations(Partition(True), (b, c, length), keep_sources=False), "inference")
    copy = step_memory(extract_operations(Partition(False), (b, c, length), keep_sources=False), "inference")
    # the view: the step's input and the projection's output; the copy lives beside both
    assert view.activations_bytes == 2 * act
    assert copy.activations_bytes == 3 * act


def test_strides_after_a_view_follow_pytorch() -> None:
    """The stride rule agrees with PyTorch's own on permuted, expanded and contiguous tensors."""
    from gpurec.ops.memory import _strides_after_view

    cases = [((2, 3, 4), (0, 2, 1), (2, 12)), ((2, 3, 4), (0, 2, 1), (2, 4, 3)), ((2, 3, 4), (0, 2, 1), (8, 3)),
             ((2, 3, 4), (1, 0, 2), (3, 8)), ((2, 3, 4), (1, 0, 2), (6, 4)), ((6, 1, 4), (0, 2, 1), (6, 4)),
             ((2, 8, 8, 5), (0, 2, 1, 3), (2, 8, 2, 4, 5)), ((2, 8, 8, 5), (0, 2, 1, 3), (16, 8, 5))]
    for shape, dims, new_shape in cases:
        t = torch.empty(shape).permute(*dims)
        expected = t.view(new_shape).stride() if _viewable(t, new_shape) else None
        assert _strides_after_view(t.shape, t.stride(), new_shape) == expected, (shape, dims, new_shape)
    e = torch.empty(3, 1).expand(3, 5)
    assert _strides_after_view(e.shape, e.stride(), (15,)) is None
    assert _strides_after_view(e.shape, e.stride(), (3, 5, 1)) == e.view(3, 5, 1).stride()


def _viewable(t: torch.Tensor, shape: tuple[int, ...]) -> bool:
    try:
        t.view(shape)
    except RuntimeError:
        return False
    return True


def test_only_convolutions_that_cudnn_gives_a_workspace_add_one() -> None:
    """Measured on an H200 (``datasets/h200/raw/logs/conv-workspace-s22*.jsonl.gz``): depthwise, 1x1
    stride-1 and RGB-stem convolutions take no workspace; a 3x3 convolution of 64 channels takes
    about its inputs plus outputs, and so does a 1x1 convolution of stride 2."""
    from gpurec.ops.memory import memory_terms

    def conv_term(conv: nn.Conv2d, channels: int) -> int:
        net = nn.Sequential(conv)
        return memory_terms(extract_operations(net, (4, channels, 32, 32), keep_sources=False), "inference").conv_term_bytes

    assert conv_term(nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False), 64) == 0  # depthwise
    assert conv_term(nn.Conv2d(64, 64, 1, bias=False), 64) == 0  # 1x1, stride 1
    assert conv_term(nn.Conv2d(3, 64, 3, padding=1, bias=False), 3) == 0  # RGB stem, kernel <= 5
    io = 4 * 64 * 32 * 32 * 4 * 2
    assert conv_term(nn.Conv2d(64, 64, 3, padding=1, bias=False), 64) == io
    assert conv_term(nn.Conv2d(64, 64, 1, stride=2, bias=False), 64) == io * 5 // 8  # output a quarter


def test_a_mask_shaped_like_the_scores_keeps_no_scores_for_backward() -> None:
    """``ones_like(scores[0]).triu(1)`` reads only the scores' shape: autograd keeps nothing of it.
    Counting the scores as its saved input kept every layer's scaled scores of a GPT to the
    backward (its batch-16 training peak read 18% high)."""
    from gpurec.ops.memory import memory_terms

    batch, seq, dim = 2, 64, 32

    class CausalAttention(nn.Module):
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            scores = torch.bmm(q, q.transpose(1, 2)) / 8.0
            future = torch.ones_like(scores[0], dtype=torch.bool).triu(1)
            return torch.bmm(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1), q)

    ops = extract_operations(CausalAttention(), (batch, seq, dim), mode="training", keep_sources=False)
    by_kind = {op.kind: op for op in ops}
    assert "ones_like" in by_kind
    q = batch * seq * dim * 4
    # q (both bmm's input), the probabilities and the mask; not the scaled scores
    expected = q + by_kind["softmax"].bytes_written + by_kind["triu"].bytes_written
    assert memory_terms(ops, "training").saved_bytes == expected


def test_inference_holds_the_scores_a_softmax_reads_while_its_output_is_read() -> None:
    """Attention written out in Python keeps ``scores`` in a local until it returns: at the
    matmul that reads the probabilities, the scores, the probabilities and the output are alive
    (BERT-like inference at 512 tokens read 18% low without the scores)."""
    from gpurec.ops.memory import memory_terms

    batch, heads, seq, dim = 2, 4, 128, 16

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(0.1)

        def forward(self, q: torch.Tensor) -> torch.Tensor:
            scores = torch.matmul(q, q.transpose(-2, -1)) * 0.25
            return torch.matmul(self.drop(torch.softmax(scores, dim=-1)), q)

    ops = extract_operations(Attention().eval(), (batch, heads, seq, dim), keep_sources=False)
    score_bytes = batch * heads * seq * seq * 4
    q = batch * heads * seq * dim * 4
    # the step's input q, the scores, the probabilities and the output of the second matmul
    assert memory_terms(ops, "inference").activations_bytes == q + 2 * score_bytes + q


def test_a_container_calls_argument_lives_until_the_call_returns() -> None:
    """``self.blocks(self.stem(x))``: the stem's output stays on the caller's stack while the blocks
    run, though only the first block reads it (synthwin and synthgconv inference read 18-24% low
    without it; H200 peak breakdowns, session 22)."""
    from gpurec.ops.memory import memory_terms

    width, batch = 256, 64

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Linear(width, width, bias=False)
            self.blocks = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(3)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks(self.stem(x))

    ops = extract_operations(Net(), (batch, width), keep_sources=False)
    act = batch * width * 4
    # at the last block: the step's input, the stem's output (held), the block's input and output
    assert memory_terms(ops, "inference").activations_bytes == 4 * act


def test_a_bias_gradient_over_many_rows_stages_partial_sums_in_backward() -> None:
    """ATen sums a Linear's output gradient over its rows for the bias gradient, splitting long
    columns across thread blocks with a staging buffer: 81.9 MB for a 10,000-word head over 1,024
    tokens and 138.2 MB over 4,096, as the H200's peak breakdowns recorded
    (``datasets/h200/raw/logs/peak-breakdown-s22-rnn-cpp.*``); nothing for a few rows."""
    from types import SimpleNamespace

    from gpurec.ops.memory import _bias_grad_staging_bytes, memory_terms

    def staging(shape: list[int]) -> int:
        return _bias_grad_staging_bytes(SimpleNamespace(output_shapes=[shape]))

    assert staging([8, 128, 10_000]) == 81_920_000
    assert staging([32, 128, 10_000]) == 138_240_000
    assert staging([32, 10_000]) == 0

    def peak(bias: bool) -> int:
        net = nn.Sequential(nn.Linear(256, 10_000, bias=bias))
        return memory_terms(extract_operations(net, (8, 128, 256), mode="training", keep_sources=False),
                            "training").activations_bytes

    # the head's backward is the step's peak: the staging buffer adds to it (the bias and its
    # gradient count as parameters, not activations)
    assert peak(True) - peak(False) == 81_920_000
