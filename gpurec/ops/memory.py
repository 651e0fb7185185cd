"""Peak GPU memory of one step, estimated from the extracted operations.

Why: a ranking that puts a GPU first which cannot hold the step is worse than no ranking.
The estimate follows what PyTorch keeps alive, without running anything:

- parameters (and, in training, one gradient per parameter; no optimizer state, since the
  optimizer is the user's choice and the step is measured without one);
- inference: the largest set of activations alive at once (liveness): a tensor holds memory
  from the operation that makes it to its last user, views and in-place operations share
  their input's storage, the step's inputs and result stay alive, and multi-head attention
  adds what it allocates inside itself;
- training: the largest memory alive at once over the step's timeline.  Forward keeps every
  activation some operation saves for backward (a convolution keeps its input, a ReLU its
  output; an addition keeps neither; dropout a one-byte mask per element).  Backward runs the
  operations in reverse, freeing each saved tensor after the backward of the earliest
  operation that saved it, while the gradients of the activations pass through and the
  parameter gradients appear; the step's result and its preallocated gradient stay alive
  throughout.  A small batch so peaks at the end of backward, a large one at its start;
  autocast's weight copies (cast cache off, as measured) live until their layer's backward.

- an in-place operation whose backward needs its input (ReLU6/Hardtanh, SiLU, Hardswish,
  GELU) makes autograd keep a copy of that input (``original_self``); ReLU, sigmoid and tanh
  in place need only their result and keep nothing more;
- every tensor is rounded up to the caching allocator's 512-byte blocks;
- max pooling on CUDA computes int64 argmax indices (held during the call in inference, kept
  for backward in training), and autocast's weight copies live through the layer they were
  made for; the step's input stays alive behind the weight casts that open an autocast step.

- a cuDNN RNN (LSTM, GRU) keeps its input and its output for backward, and PyTorch's
  ``_cudnn_rnn`` copies a batch-first input to sequence-first during each forward and backward
  call, and the output's gradient during backward (:func:`_rnn_buffers`).

That analytic part is what autograd and liveness say.  What they do not say (the cuBLAS and
cuDNN workspaces every step holds, a convolution's or matmul's scratch space, cuDNN's RNN
reserve space and workspace, placed on the step's timeline by rules read off measured peaks:
RNN_WORKSPACE_LAYERS, CONV_WORKSPACE_IO) is a small set of
terms (:class:`MemoryTerms`) whose coefficients are fitted on measured peaks of the training
architectures only (:mod:`gpurec.model.fitting.memory_fit`, saved as ``models/memory.json``) and
applied by :func:`step_memory` when a :class:`MemoryFit` is given.  Without one the estimate
is the analytic part alone, a lower bound of ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Operations that return a view of their first input (no new storage; a reshape or flatten that
# cannot view its permuted or expanded input copies it instead: RESHAPE_KINDS below).
VIEW_KINDS = frozenset({
    "reshape", "view", "flatten", "permute", "transpose", "t", "expand", "expand_as", "squeeze", "unsqueeze",
    "getitem", "split", "chunk", "unbind", "narrow", "view_as", "unflatten", "Flatten", "Unflatten", "detach",
})
# Operations whose backward needs none of their inputs (so they do not keep them alive).
NO_SAVE_KINDS = VIEW_KINDS | frozenset({
    "add", "sub", "cat", "stack", "AdaptiveAvgPool2d", "AdaptiveAvgPool1d", "mean", "sum", "Identity", "contiguous",
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "dropout", "StochasticDepth", "clone", "to", "float",
    "triu", "tril",
    # a new tensor shaped like its input reads only the input's shape: GPT's causal mask
    # ``ones_like(scores[0])`` kept every layer's scores to the backward (batch-16 training 18% over)
    "ones_like", "zeros_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
    # a dtype cast (autocast's too: ToCopyBackward) needs none of its input for backward
    "autocast_cast",
})
# Operations whose backward needs their output (activations computed from the result).
# (A cuDNN RNN keeps its output as well as its input: its backward reads both.)
SAVES_OUTPUT_KINDS = frozenset({"ReLU", "relu", "ReLU6", "Sigmoid", "sigmoid", "Tanh", "tanh", "Softmax", "softmax",
                                "LogSoftmax", "log_softmax", "Hardtanh", "ELU", "LSTM", "GRU", "RNN"})
# In place, their backward needs only the result: nothing beyond the result is kept.  Any
# other in-place operation whose backward reads its input keeps a copy of it.
INPLACE_RESULT_KINDS = frozenset({"ReLU", "relu", "relu_", "LeakyReLU", "leaky_relu", "ELU", "elu", "Sigmoid",
                                  "sigmoid", "Tanh", "tanh", "Dropout", "dropout"})
# Operations whose backward needs their output but none of their inputs (keeping a tanh's input
# as well kept one more activation-sized tensor per GPT-2 GELU).
OUTPUT_ONLY_KINDS = frozenset({"Softmax", "softmax", "LogSoftmax", "log_softmax", "ReLU", "relu", "Sigmoid",
                               "sigmoid", "Tanh", "tanh"})
SOFTMAX_KINDS = frozenset({"softmax", "Softmax"})
LINEAR_KINDS = frozenset({"Linear", "linear"})
# A reduction's launch heuristic reads the GPU's SM count and threads per SM; the bias gradient's
# staging buffer (_bias_grad_staging_bytes) takes the H100's and H200's.
REDUCE_SM_COUNT, REDUCE_THREADS_PER_SM = 132, 2048
# Operations that save only their tensor arguments after the first (masked_fill keeps the mask).
SAVES_LATER_INPUTS_KINDS = frozenset({"masked_fill", "masked_fill_"})
# Arithmetic with one tensor and a Python number saves nothing (the number is a constant).
SCALAR_ARITH_KINDS = frozenset({"mul", "div", "truediv", "floordiv"})
# Kinds that run on cuDNN's RNN kernels: gates per cell, for the reserve space and workspace.
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1, "RNN": 1}
RNN_KINDS = frozenset({"LSTM", "GRU", "RNN"})
# cuDNN's RNN buffers.  cuDNN does not document their sizes (cudnnGetRNNTempSpaceSizes only
# reports them at run time), so these rules are READ OFF the trusted H100 peaks of the training
# architectures (lstm_cls_bi_1x256 and gru_cls_bi_3x512, whose peaks sit inside the RNN, and the
# LSTM/GRU language models), never off held-out ones:
# - workspace (during each forward and backward call): RNN_WORKSPACE_LAYERS layers' worth of gate
#   pre-activations per token (directions x hidden x gates x element bytes), whatever the number
#   of layers (the layers run one after another and reuse it: the per-token slope of the
#   inference peaks beyond the RNN's input, its copy and its output is 1.8x one layer's gates
#   for lstm_cls_bi_1x256 and 2.1x for the 3-layer gru_cls_bi_3x512; counting every layer put the
#   latter 40% above its peaks), plus a part that does not grow with the tokens,
#   RNN_WORKSPACE_FIXED_TOKENS tokens' worth of every layer's gates (the peaks' intercepts: 22 MB
#   for lstm_cls_bi_1x256, 0.10 GB for gru_cls_bi_3x512, beyond parameters and library floor);
# - reserve space (training: kept from the forward to the RNN's backward): RNN_RESERVE_HIDDEN
#   hidden-sized vectors per token, layer and direction: 5 for an LSTM (its 4 gates and the cell
#   state), 7 for a GRU (the training peaks' per-token slopes beyond the workspace, the copies and
#   the saved tensors); a plain RNN has no measured peak and is taken to keep its one gate.
RNN_WORKSPACE_LAYERS = 2.0
RNN_WORKSPACE_FIXED_TOKENS = 2600
RNN_RESERVE_HIDDEN = {"LSTM": 5.0, "GRU": 7.0, "RNN_TANH": 1.0, "RNN_RELU": 1.0, "RNN": 1.0}
# Kinds whose library call takes a scratch workspace (cuDNN convolution, cuBLAS matmul).
CONV_KINDS = frozenset({"Conv1d", "Conv2d", "Conv3d", "conv1d", "conv2d", "conv3d", "ConvTranspose2d",
                        "conv_transpose2d"})
MATMUL_KINDS = frozenset({"Linear", "linear", "matmul", "bmm", "mm", "addmm", "baddbmm", "einsum",
                          "MultiheadAttention", "scaled_dot_product_attention", "shifted_window_attention"})
# Max pooling on CUDA always computes its argmax indices (int64, one per output element):
# ``max_pool2d`` in aten/src/ATen/native/Pooling.cpp calls ``max_pool2d_with_indices`` and drops
# the indices, so inference holds them during the call; training saves them for backward.
MAX_POOL_KINDS = frozenset({"MaxPool2d", "max_pool2d", "MaxPool3d", "max_pool3d", "AdaptiveMaxPool2d",
                            "adaptive_max_pool2d"})
BLOCK_BYTES = 512  # the caching allocator hands out multiples of 512 bytes
# A convolution's cuDNN workspace in inference, in units of its inputs plus outputs, held during
# its call only.  READ OFF the trusted H100 inference peaks of the training architectures: beyond
# parameters, library floor and live activations, VGG-16 at batch 128 holds 3.29 GB in fp32 and
# 1.64 GB in bf16-mixed, each its first 224x224 3x3 convolution's inputs plus outputs (3.29 and
# 1.64 GB), and ResNet-18 at batch 128 (fp32) 0.98 GB, the batch plus its 7x7 convolution's input
# and output twice over (0.08 + 2 x 0.49 GB).  One plausible reading: cuDNN's tensor-core kernels
# work on NHWC copies of NCHW tensors.  As one coefficient on the largest convolution added at
# the peak (0.44), VGG-16 read 25-29% low and ResNets up to 13% high at once.  Which
# convolutions take it was measured later (session 22, _conv_takes_workspace): with every
# convolution counted, the fitted coefficient settled at 0.63 and VGG inference still read 16% low.
CONV_WORKSPACE_IO = 1.0
_ELEMENT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
                  "int8": 1, "uint8": 1, "bool": 1, "complex64": 8}


@dataclass(frozen=True)
class StepMemory:
    """Estimated peak memory of one step, in bytes, and what it is made of."""

    mode: str
    params_bytes: int
    grads_bytes: int
    activations_bytes: int  # peak live activations (inference) or kept for backward plus one gradient (training)
    # fitted terms (0 without a MemoryFit): the fixed library workspaces of every step, and the
    # scratch space that grows with the step (convolution, matmul, cuDNN RNN)
    floor_bytes: int = 0
    workspace_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.activations_bytes + self.floor_bytes + self.workspace_bytes

    @property
    def memory_gb(self) -> float:
        """Decimal gigabytes (1e9 bytes), the unit of GPU datasheets."""
        return self.total_bytes / 1e9


@dataclass(frozen=True)
class MemoryTerms:
    """The terms of a step's peak, in bytes, before any fitted coefficient.

    ``activations_bytes`` is the liveness peak (inference) or what autograd keeps for backward
    (training); ``largest_bytes`` the largest activation (training: the gradient in flight);
    ``conv_io_bytes`` / ``matmul_io_bytes`` the inputs plus outputs of the largest convolution /
    matmul (their workspaces scale with them); ``rnn_bytes`` layers x directions x sequence x
    batch x hidden x gates x element bytes summed over cuDNN RNNs (their size, for reference);
    ``rnn_excess_bytes`` how far cuDNN's RNN workspaces and reserve spaces, placed on the step's
    timeline, lift its peak."""

    mode: str
    params_bytes: int
    grads_bytes: int
    activations_bytes: int
    largest_bytes: int
    conv_io_bytes: int
    matmul_io_bytes: int
    rnn_bytes: int
    saved_bytes: int = 0  # training: everything autograd keeps for backward (all of it alive at once)
    # how far the cuDNN RNN workspaces (during each call) and, in training, reserve spaces (forward
    # to backward) lift the peak; None where not computed (then the whole rnn_bytes)
    rnn_excess_bytes: int | None = None
    # how far each convolution's workspace (its inputs plus outputs, during its call) lifts the
    # peak; None where not computed (then the whole conv_io_bytes)
    conv_excess_bytes: int | None = None

    @property
    def rnn_term_bytes(self) -> int:
        """What the fitted ``rnn`` coefficient multiplies: what cuDNN's buffers add above the peak
        where they live (a language model peaks at its head, after the RNN, where only the
        reserve space is alive: the whole term put LSTM LMs up to 36% above their peaks)."""
        return self.rnn_bytes if self.rnn_excess_bytes is None else self.rnn_excess_bytes

    @property
    def conv_term_bytes(self) -> int:
        """What the fitted ``conv_io`` coefficient multiplies: what the convolutions' workspaces
        add above the peak where they live (CONV_WORKSPACE_IO), else the largest one's io."""
        return self.conv_io_bytes if self.conv_excess_bytes is None else self.conv_excess_bytes


@dataclass(frozen=True)
class MemoryFit:
    """Fitted coefficients per mode (``models/memory.json``): a step's peak is
    params + grads + floor + sum(coefficient x term).  ``terms`` maps a mode to
    {"floor_bytes", "activations", "largest", "conv_io", "matmul_io", "rnn"}."""

    terms: dict[str, dict[str, float]]
    provenance: dict[str, Any]

    def apply(self, t: MemoryTerms) -> StepMemory:
        c = self.terms.get(t.mode)
        if c is None:
            raise KeyError(f"the memory fit has no coefficients for mode {t.mode!r} (has {sorted(self.terms)}): "
                           "refit it with `gpurec tools fit-memory`")
        activations = c["activations"] * t.activations_bytes + c["largest"] * t.largest_bytes
        workspace = c["conv_io"] * t.conv_term_bytes + c["matmul_io"] * t.matmul_io_bytes + c["rnn"] * t.rnn_term_bytes
        return StepMemory(t.mode, t.params_bytes, t.grads_bytes, int(round(activations)),
                          int(round(c["floor_bytes"])), int(round(workspace)))


def _numel(shape: Sequence[int]) -> int:
    return math.prod(map(int, shape))


def _block(nbytes: int) -> int:
    """Bytes the caching allocator hands out for a request of ``nbytes`` (512-byte blocks)."""
    return 0 if nbytes <= 0 else -(-int(nbytes) // BLOCK_BYTES) * BLOCK_BYTES


# View operations whose result PyTorch may have to copy: reshape and flatten return a view
# only where the input's strides allow one (``at::detail::computeStride``), else a new tensor.
RESHAPE_KINDS = frozenset({"reshape", "flatten", "Flatten", "view", "view_as", "unflatten", "Unflatten", "squeeze",
                           "unsqueeze"})
# View operations that leave a tensor's storage as it is but change its strides.
STRIDING_KINDS = frozenset({"permute", "transpose", "t", "expand", "expand_as"})


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(out))


def _strides_after_view(old_shape: Sequence[int], old_strides: Sequence[int], new_shape: Sequence[int]
                        ) -> tuple[int, ...] | None:
    """The strides of ``new_shape`` viewed on a tensor of ``old_shape`` and ``old_strides``, or None
    where no view exists and reshape copies (``at::detail::computeStride``)."""
    if _numel(old_shape) == 0 or not old_shape:
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = int(old_strides[-1])
    tensor_numel = view_numel = 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= int(old_shape[d])
        if d == 0 or (int(old_shape[d - 1]) != 1 and int(old_strides[d - 1]) != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or int(new_shape[view_d]) == 1):
                new_strides[view_d] = view_numel * chunk_base
                view_numel *= int(new_shape[view_d])
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = int(old_strides[d - 1])
                tensor_numel = view_numel = 1
    return tuple(new_strides) if view_d == -1 else None


def _strided_view(op: Any, in_strides: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Strides of a permute, transpose or expand of a tensor with ``in_strides`` (None: contiguous);
    None where the result is contiguous after all (or its strides cannot be read)."""
    shape_in = list(op.input_shapes[0]) if op.input_shapes else []
    shape_out = list(op.output_shapes[0]) if op.output_shapes else []
    if not shape_in or not shape_out:
        return None
    strides = list(in_strides) if in_strides is not None and len(in_strides) == len(shape_in) \
        else list(contiguous_strides(shape_in))
    args = [a for a in ((op.settings or {}).get("args") or [])[1:] if isinstance(a, int)]
    if op.kind == "permute" and sorted(d % len(shape_in) for d in args) == list(range(len(shape_in))):
        out = [strides[d % len(shape_in)] for d in args]
    elif op.kind == "transpose" and len(args) == 2:
        a, b = (d % len(shape_in) for d in args)
        out = strides[:]
        out[a], out[b] = out[b], out[a]
    elif op.kind == "t" and len(shape_in) == 2:
        out = strides[::-1]
    elif op.kind in ("expand", "expand_as") and len(shape_out) >= len(shape_in):
        pad = len(shape_out) - len(shape_in)
        padded_shape, padded = [1] * pad + shape_in, [0] * pad + strides
        out = [0 if int(n) == 1 and int(m) != 1 else st for n, m, st in zip(padded_shape, shape_out, padded,
                                                                            strict=True)]
    else:
        return None
    if len(out) != len(shape_out):
        return None
    return None if tuple(out) == contiguous_strides(shape_out) else tuple(out)


def _rnn_bytes(op: Any) -> int:
    """layers x directions x sequence x batch x hidden x gates x element bytes of a cuDNN RNN
    (its reserve space in training and its workspace both scale with it); 0 for other kinds."""
    settings = op.settings or {}
    gates = RNN_GATES.get(str(settings.get("mode", op.kind))) if op.kind in ("LSTM", "GRU", "RNN") else None
    if gates is None or not op.input_shapes or len(op.input_shapes[0]) != 3:
        return 0
    x = op.input_shapes[0]
    batch, seq = (x[0], x[1]) if settings.get("batch_first") else (x[1], x[0])
    layers = int(settings.get("num_layers", 1) or 1)
    directions = 2 if settings.get("bidirectional") else 1
    hidden = int(settings.get("hidden_size", 0) or 0)
    return layers * directions * int(seq) * int(batch) * hidden * gates * _ELEMENT_BYTES.get(op.dtype, 4)


def _rnn_buffers(op: Any) -> tuple[int, int, int, int]:
    """A cuDNN RNN's buffers, in bytes: (workspace during each call, reserve space kept for
    backward in training, PyTorch's copy of its input during each call, its copy of the
    output's gradient during backward); zeros for other kinds.

    The copies follow PyTorch's ``_cudnn_rnn`` (aten/src/ATen/native/cudnn/RNN.cpp): a
    batch-first input is transposed to sequence-first and made contiguous (``x =
    input.contiguous()``) in the forward and again in each backward call, and the backward takes
    ``grad_output.contiguous()`` of the transposed gradient; at batch 1 the transposed tensor is
    already contiguous and nothing is copied.  The workspace and reserve sizes are cuDNN's
    (RNN_WORKSPACE_LAYERS, RNN_RESERVE_LAYERS, RNN_WORKSPACE_FIXED_TOKENS)."""
    settings = op.settings or {}
    gates = RNN_GATES.get(str(settings.get("mode", op.kind))) if op.kind in RNN_KINDS else None
    if gates is None or not op.input_shapes or len(op.input_shapes[0]) != 3:
        return 0, 0, 0, 0
    x = op.input_shapes[0]
    batch_first = bool(settings.get("batch_first"))
    batch, seq = (x[0], x[1]) if batch_first else (x[1], x[0])
    layers = int(settings.get("num_layers", 1) or 1)
    directions = 2 if settings.get("bidirectional") else 1
    hidden = int(settings.get("hidden_size", 0) or 0)
    element = _ELEMENT_BYTES.get(op.dtype, 4)
    layer_gates = directions * hidden * gates * element  # one layer's gate pre-activations per token
    tokens = int(seq) * int(batch)
    workspace = int(RNN_WORKSPACE_LAYERS * tokens * layer_gates + RNN_WORKSPACE_FIXED_TOKENS * layers * layer_gates)
    reserve = int(RNN_RESERVE_HIDDEN[str(settings.get("mode", op.kind))] * tokens * layers * directions * hidden * element)
    copies = batch_first and int(batch) > 1
    x_copy = _block(_numel(x) * element) if copies else 0
    out = op.output_shapes[0] if op.output_shapes else []
    dy_copy = _block(_numel(out) * element) if copies and out else 0
    return _block(workspace), _block(reserve), x_copy, dy_copy


def _io_bytes(op: Any) -> int:
    """An operation's activation inputs plus outputs, in bytes."""
    dtypes = getattr(op, "input_dtypes", None)
    ins = sum(_numel(shape) * _ELEMENT_BYTES.get(dtypes[j] if dtypes and j < len(dtypes) else op.dtype, 4)
              for j, shape in enumerate(op.input_shapes))
    return ins + int(op.bytes_written)


def _param_keys(ops: Sequence[Any]) -> list[str | None]:
    """Which parameters each operation uses, as one key per set of parameters (None: none).

    A module called several times holds one copy.  A function given a parameter (``F.linear(x,
    self.tok.weight)``, a tied LM head) is taken to reuse the module parameter of the same shape
    when one exists: counting it again added the token embedding twice (0.1-0.3 GB per GPT)."""
    module_shapes: dict[tuple[int, ...], str] = {}
    keys: list[str | None] = []
    for op in ops:
        if not op.params:
            keys.append(None)
            continue
        settings = op.settings or {}
        if op.category == "module":
            for shape in (settings.get("param_shapes") or {}).values():
                module_shapes.setdefault(tuple(map(int, shape)), op.name)
            keys.append(op.name)
            continue
        shapes = [tuple(map(int, a["param"])) for a in settings.get("args", [])
                  if isinstance(a, dict) and isinstance(a.get("param"), list)]
        tied = [module_shapes[s] for s in shapes if s in module_shapes]
        keys.append(tied[0] if tied and len(tied) == len(shapes) else f"{op.node or op.name}")
    return keys


def _param_bytes(ops: Sequence[Any], keys: Sequence[str | None] | None = None) -> int:
    """Each set of parameters once (:func:`_param_keys`; ``keys`` when already computed)."""
    seen: set[str] = set()
    total = 0
    for op, key in zip(ops, _param_keys(ops) if keys is None else keys, strict=True):
        if key is None or key in seen:
            continue
        seen.add(key)
        total += int(op.params) * _param_element_bytes(op)
    return total


def _param_grads_at(ops: Sequence[Any], keys: Sequence[str | None] | None = None) -> tuple[list[int], list[int]]:
    """Bytes of parameter gradients that appear at each operation's backward, and bytes alive
    only during it.  A parameter's gradient is allocated by the backward of its last call
    (backward runs in reverse); each earlier call of a shared parameter (a tied LM head's
    embedding) makes a new gradient and its sum with the one held: two more parameter-sized
    buffers while it runs (without them GPT training at batch 1 read 0.2-0.4 GB low)."""
    size: dict[str, int] = {}
    last: dict[str, int] = {}
    calls: dict[str, list[int]] = {}
    for i, (op, key) in enumerate(zip(ops, _param_keys(ops) if keys is None else keys, strict=True)):
        if key is not None:
            size.setdefault(key, int(op.params) * _param_element_bytes(op))
            last[key] = i
            calls.setdefault(key, []).append(i)
    at, during = [0] * len(ops), [0] * len(ops)
    for key, i in last.items():
        at[i] += size[key]
        for j in calls[key][:-1]:
            if ops[j].category != "module" or ops[j].name != ops[i].name:  # another module or function
                during[j] += 2 * size[key]
    return at, during


def _window_attention_buffers(op: Any) -> tuple[int, int]:
    """Bytes Swin's shifted-window attention (one leaf) keeps inside for backward, and holds at
    its peak in inference.  Per window it runs the math path: the windows of its input, the
    packed q/k/v (three outputs' worth), q scaled, the scores plus position bias and their
    softmax (tokens x heads x window^2 each), the output before its projection.  Training keeps
    the packed q/k/v (k and v are views of it) and the projection's input, four outputs'
    worth, and the softmax; inference holds five outputs' worth and two score
    tensors at once.  Without them swin_t training read 19-28% and Swin inference up to 40%
    below the measured peaks (the counts of outputs' worth were checked against swin_t's
    peaks, a training architecture; swin_s is held out)."""
    out_bytes = _block(int(op.bytes_written))
    out = op.output_shapes[0] if op.output_shapes else []
    bias = op.input_shapes[1] if len(op.input_shapes) > 1 else []
    if len(out) < 2 or len(bias) != 4 or not out[-1]:
        return 4 * out_bytes, 5 * out_bytes
    tokens = _numel(out) // int(out[-1])
    # Under autocast the scores are float32 whatever the step's dtype: adding the float32
    # relative position bias promotes them, and softmax is on autocast's float32 list
    # (aten/src/ATen/autocast_mode.cpp); only q, k, v and the output are low precision.
    score_bytes = 4 if getattr(op, "precision", "fp32") in ("bf16-mixed", "fp16-mixed") \
        else _ELEMENT_BYTES.get(op.dtype, 4)
    scores = _block(tokens * int(bias[1]) * int(bias[2]) * score_bytes)
    return 4 * out_bytes + scores, 5 * out_bytes + 2 * scores


def _conv_takes_workspace(op: Any) -> bool:
    """Whether cuDNN's heuristics (``cudnn.benchmark`` off) give this convolution a workspace
    (about its inputs plus outputs, CONV_WORKSPACE_IO) in inference.  Measured on 4,008
    configurations on an H200 (``gpurec.collect.conv_workspace``, cuDNN 9.19;
    ``datasets/h200/raw/logs/conv-workspace-s22*.jsonl.gz``): none for depthwise convolutions, 1x1
    convolutions of stride 1 (grouped by 2, some take one: not modelled) and stems of a few input
    channels with kernels up to 5; the median of the rest is their inputs plus outputs (small maps
    with large kernels take several times that, a few MB).  Functional convolutions, without
    their settings here, keep the workspace."""
    settings = op.settings or {}
    cin = int(settings.get("in_channels") or 0)
    kernel, stride = settings.get("kernel_size") or 0, settings.get("stride") or 1
    kernel = max(kernel) if isinstance(kernel, (list, tuple)) else kernel
    if not cin or not kernel:
        return True
    groups = int(settings.get("groups") or 1)
    if groups > 1 and groups == cin:
        return False
    if kernel == 1 and (max(stride) if isinstance(stride, (list, tuple)) else stride) == 1:
        return False
    return not (cin < 8 and kernel <= 5)


def _hold_call_arguments(ops: Sequence[Any], storage_of: dict[str, str], born: dict[str, int],
                         last_use: dict[str, int]) -> None:
    """A container module's argument stays alive until the call returns: the caller's frame holds it
    (``x = self.layer1(x)`` rebinds ``x`` only afterwards; ``self.blocks(self.stem(x))`` keeps the
    stem's output on the caller's stack), though its last reader inside may come much earlier.
    Extends ``last_use`` of each module-path prefix's inputs (what the first operation inside it
    reads from before it) to that prefix's last operation.  The H200's peak breakdowns of synthwin
    and synthgconv inference (``datasets/h200/raw/logs/peak-breakdown-s*``) hold exactly these."""
    span: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        name = op.name
        if op.category != "module" or "." not in name:
            continue
        dot = name.find(".")
        while dot > 0:
            prefix = name[:dot]
            s = span.get(prefix)
            if s is None:
                span[prefix] = [i, i]
            else:
                s[1] = i
            dot = name.find(".", dot + 1)
    for first, last in span.values():
        for src in ops[first].input_nodes:
            root = storage_of.get(src)
            if root is not None and born.get(root, first) < first and last_use.get(root, last) < last:
                last_use[root] = last


def _bias_grad_staging_bytes(op: Any) -> int:
    """The global-memory staging buffer of a Linear's bias gradient in backward: the gradient of
    its output summed over every row (token) by ATen's reduction kernel, which splits long columns
    across thread blocks and stages their partial sums (``setReduceConfig`` and
    ``ReduceConfig::global_memory_size`` in aten/src/ATen/native/cuda/Reduce.cuh, reproduced here).
    A 10,000-word LM head over 1,024 tokens stages 81.9 MB, over 4,096 tokens 138.2 MB, exactly as
    the H200's peak breakdowns recorded (``peak-breakdown-s22-rnn-cpp``); small layers stage
    little or nothing."""
    out = op.output_shapes[0] if op.output_shapes else []
    if not out or not out[-1]:
        return 0
    outputs = int(out[-1])
    rows = _numel(out) // outputs
    vec = 4 if outputs % 4 == 0 else 2 if outputs % 2 == 0 else 1
    max_threads = 512 // vec
    dim0 = outputs // vec

    def pow2(n: int) -> int:
        return 1 << (max(int(n), 1).bit_length() - 1) if n < max_threads else max_threads

    width = min(pow2(dim0), 32)
    height = min(pow2(rows), max_threads // width)
    width = min(pow2(dim0), max_threads // height)
    step_output, step_input = width, 1
    split_rows = rows >= height * 16 or rows >= 256
    if split_rows:
        step_input = height
    else:
        step_output *= height
    per_thread = -(-rows // step_input)
    grid = -(-dim0 // step_output)
    target = REDUCE_SM_COUNT * (REDUCE_THREADS_PER_SM // (width * height))
    if not (split_rows and per_thread >= 256 and grid <= target):
        return 0
    ctas = max(min(-(-target // grid), -(-per_thread // 16)), -(-per_thread // 256))
    return _block(4 * outputs * ctas * width * vec) if ctas > 1 else 0


def _consumer_of_cast(ops: Sequence[Any], i: int, index_of: dict[str, int]) -> int:
    """The operation a weight cast ``ops[i]`` (node ``NAME.castK``) was made for: the one after
    it whose node is NAME (``index_of``: node -> last index), else the next operation."""
    j = index_of.get(str(ops[i].node).rsplit(".cast", 1)[0], -1)
    return j if j > i else min(i + 1, len(ops) - 1)


def _next_consumer_of_cast(ops: Sequence[Any], i: int, within: int = 8) -> int:
    """:func:`_consumer_of_cast` without an index of every node: autocast emits a layer's casts
    right before the layer, so its node is looked for among the next ``within`` operations
    first (building the index for every step made a mixed-precision estimate 20% slower)."""
    name = ops[i].node.rpartition(".cast")[0]
    for j in range(i + 1, min(i + 1 + within, len(ops))):
        if ops[j].node == name:
            return j
    return _consumer_of_cast(ops, i, {str(o.node): j for j, o in enumerate(ops)})


@functools.lru_cache(maxsize=512)
def _is_dropout_kind(kind: str) -> bool:
    """Dropout of any flavour (``Dropout``, ``dropout``, ``Dropout2d``, ...), cached per kind name."""
    return kind.lower().startswith("dropout")


def _returns_its_input(op: Any) -> bool:
    """A dropout with p = 0 returns its input itself: no new tensor, no mask."""
    return op.kind.lower().startswith("dropout") and float((op.settings or {}).get("p", 0.5) or 0.0) == 0.0


def _attention_buffers(op: Any) -> int:
    """Bytes multi-head attention holds inside itself at its peak in inference.

    PyTorch's math path of scaled dot-product attention: the packed q/k/v projection (three
    outputs' worth), q scaled (one), and the scores and their softmax (heads x L x S each).
    With these, vit_b_16 inference is estimated at 2.54 and 9.12 GB at batch 256 and 1024,
    against peaks of 2.55 and 9.06 GB measured on an H100; without them it was 13-14% low.
    """
    out_bytes = int(op.bytes_written)
    settings = op.settings or {}
    q = op.input_shapes[0] if op.input_shapes else []
    k = op.input_shapes[1] if len(op.input_shapes) > 1 else q
    if len(q) != 3 or len(k) != 3:
        return 4 * out_bytes
    batch_first = bool(settings.get("batch_first", False))
    batch, tgt = (q[0], q[1]) if batch_first else (q[1], q[0])
    src = k[1] if batch_first else k[0]
    heads = int(settings.get("num_heads", 1) or 1)
    kwargs = settings.get("kwargs") or {}
    if kwargs.get("need_weights") is False and int(tgt) % 8 == 0 and int(src) % 8 == 0:
        # A fused kernel (no heads x L x S matrix): the packed projection and q, k, v rearranged
        # (three outputs' worth each), the attention output and its reshaped copy.  The measured
        # peaks show this for BERT-like encoders (sequences 64-512: within 6% instead of up to 61%
        # above) and the math path for ViT's 197 and 50 tokens; which sequence lengths take which
        # path is read from those peaks, not from PyTorch's dispatch rules.
        return 8 * out_bytes
    scores = int(batch) * heads * int(tgt) * int(src) * _ELEMENT_BYTES.get(op.dtype, 4)
    return 4 * out_bytes + 2 * scores


def _saved_inputs(op: Any) -> Sequence[str]:
    """The input nodes that autograd saves for ``op``'s backward (and so keeps alive in training).

    Without these rules a math-path attention kept every stage of its scores (the scaled scores,
    the masked ones and the softmax's input as well as its output): 30-66% above the measured
    peaks of the BERT- and GPT-like training sets."""
    if op.kind in NO_SAVE_KINDS or op.kind in OUTPUT_ONLY_KINDS:
        return ()
    if op.kind in SAVES_LATER_INPUTS_KINDS:
        return op.input_nodes[1:]
    if op.kind in SCALAR_ARITH_KINDS and len(op.input_nodes) == 1:
        return ()
    return op.input_nodes


def _param_element_bytes(op: Any) -> int:
    """Bytes per stored parameter: autocast keeps float32 weights (the bf16/fp16 copies are the
    cast operations' outputs); a cast module stores them in its dtype."""
    precision = getattr(op, "precision", "fp32")
    if precision in ("bf16-mixed", "fp16-mixed"):
        return 4
    dtypes = getattr(op, "param_dtypes", None)
    if dtypes:
        return _ELEMENT_BYTES.get(next(iter(dtypes.values())), 4)
    return _ELEMENT_BYTES.get(op.dtype, 4) if op.dtype.startswith(("float", "bfloat")) else 4


def step_memory(ops: Sequence[Any], mode: str | None = None, fit: MemoryFit | None = None) -> StepMemory:
    """Peak memory of one forward (inference) or forward + backward (training) step of ``ops``.

    ``ops`` are gpurec.ops Operations in execution order, as extract_operations returns them.
    With ``fit`` (gpurec.model.fitting.memory_fit.load_memory_fit) the fitted terms are applied;
    without, the analytic part alone (parameters, gradients, activations).
    """
    t = memory_terms(ops, mode)
    return fit.apply(t) if fit is not None else analytic_memory(t)


def analytic_memory(t: MemoryTerms) -> StepMemory:
    """The analytic part alone: parameters, gradients and activations (in training, the
    step's timeline peak beyond parameters and their gradients); a lower bound of the peak."""
    return StepMemory(t.mode, t.params_bytes, t.grads_bytes, t.activations_bytes)


def _training_peak(ops: Sequence[Any], params: int, size_of: dict[str, int], born: dict[str, int],
                   last_use: dict[str, int], released: dict[str, int], internal: list[int],
                   needs_grad: set[str], inputs: set[str], out: str | None,
                   rnn: tuple[list[int], list[int], list[int], list[int]] | None = None,
                   param_keys: Sequence[str | None] | None = None,
                   bwd_scratch: Sequence[int] | None = None,
                   recompute_at: dict[str, int] | None = None,
                   internal_recompute_at: dict[int, int] | None = None) -> tuple[int, int]:
    """The largest memory alive at once over a training step's forward and backward.

    Why: parameter gradients appear while backward frees the saved activations, so the peak is
    not their sum: a small batch peaks at the end of backward (every gradient, few activations),
    a large one at its start (every saved activation).  Always alive: parameters, the step's
    inputs, its result and the preallocated gradient of the result.  Forward: saved tensors
    from their birth on, other tensors from birth to last use.  Backward, in reverse: a saved
    tensor until the backward of the earliest operation that saved it, a tensor's gradient from
    the backward of its last user to that of its maker, each parameter gradient from the
    backward of its last call on, each operation's own saved buffers until its backward.
    ``recompute_at`` (activation checkpointing): saved tensors that forward frees after their last
    use, made again when the backward of the given operation (their region's last) starts;
    ``internal_recompute_at``: likewise for what an operation keeps inside itself (masks,
    attention internals, autograd's copies), index -> its region's last operation: inside a
    checkpoint that lives only while the operation runs in forward.

    ``rnn`` (cuDNN RNNs only): per operation the copies PyTorch makes during its forward and
    during its backward, cuDNN's workspace (during both) and reserve space (forward to
    backward).  ``bwd_scratch``: per operation, what its backward allocates beside the gradients
    while it runs.  Returns the peak without the cuDNN buffers and the peak with them."""
    n = len(ops)
    fwd_copy, bwd_copy, workspace, reserve = rnn if rnn is not None else ([0] * n,) * 4
    scratch = bwd_scratch if bwd_scratch is not None else [0] * n
    base = params + sum(size_of[r] for r in inputs)
    if out is not None and out not in inputs:
        base += 2 * size_of.get(out, 0)  # the result and its gradient, made before the step
    recompute_at = recompute_at or {}
    inside = internal_recompute_at or {}
    fwd = [0] * (n + 1)
    for root, size in size_of.items():
        if root in inputs or root == out:
            continue
        start = born[root]
        end = n - 1 if root in released and root not in recompute_at else last_use.get(root, start)
        fwd[start] += size
        fwd[max(end, start) + 1] -= size
    peak = live = with_rnn = kept = 0
    for i in range(n):
        live += fwd[i] + (0 if i in inside else internal[i])
        kept += reserve[i]
        now = base + live + fwd_copy[i] + (internal[i] if i in inside else 0)
        if now > peak:
            peak = now
        now += kept + workspace[i]
        if now > with_rnn:
            with_rnn = now
    # backward, operation n - 1 down to 0: alloc[i] appears as operation i's backward starts,
    # free[i] goes once it ends
    alloc, free = [0] * n, [0] * n
    live = sum(x for i, x in enumerate(internal) if i not in inside)
    for i, at in inside.items():
        alloc[at] += internal[i]
    for root, size in size_of.items():
        if root in inputs or root == out:
            continue
        if root in recompute_at:
            alloc[recompute_at[root]] += size
            if released[root] >= 0:
                free[released[root]] += size
        elif root in released:
            live += size
            if released[root] >= 0:
                free[released[root]] += size
        if root in needs_grad and born[root] < last_use.get(root, born[root]):
            alloc[last_use[root]] += size
            free[born[root]] += size
    grads_at, accumulating = _param_grads_at(ops, param_keys)
    for i in range(n - 1, -1, -1):
        live += alloc[i] + grads_at[i]
        now = base + live + accumulating[i] + bwd_copy[i] + scratch[i]
        if now > peak:
            peak = now
        now += kept + workspace[i]
        if now > with_rnn:
            with_rnn = now
        live -= free[i] + internal[i]
        kept -= reserve[i]
    return peak, max(with_rnn, peak)


def _recompute_at(recomputed: dict[str, int], region_of: dict[int, int], region_end: dict[int, int],
                  internal: Sequence[int]) -> tuple[dict[str, int] | None, dict[int, int] | None]:
    """Where backward makes a checkpoint region's tensors again: each recomputed storage, and each
    operation of a region that keeps something inside itself (``region_of``: operation index ->
    region), -> the index of its region's last operation (``region_end``), whose backward runs the
    region's forward again.  The checkpoint's forward keeps nothing for backward, so masks and
    internals come back only then (a ViT's attention internals, counted from forward on, put its
    checkpointed step 66% over the measured peak).  None, None without checkpointing."""
    if not region_end:
        return None, None
    return ({root: region_end[region] for root, region in recomputed.items()} or None,
            {i: region_end[region] for i, region in region_of.items() if internal[i]} or None)


def memory_terms(ops: Sequence[Any], mode: str | None = None) -> MemoryTerms:
    """The analytic terms of a step's peak (:class:`MemoryTerms`), from ``ops`` in execution order."""
    mode = mode or (ops[0].mode if ops else "inference")
    param_keys = _param_keys(ops)
    # parameters of submodules the step never calls are resident all the same (GoogLeNet's
    # auxiliary heads in inference: 25 MB, its batch-1 peak read 17% low without them)
    params = _param_bytes(ops, param_keys) + int(getattr(ops, "dormant_state_bytes", 0))
    storage_of: dict[str, str] = {}  # node -> the node whose storage it uses
    size_of: dict[str, int] = {}  # storage node -> bytes
    born: dict[str, int] = {}
    last_use: dict[str, int] = {}
    kept_roots: set[str] = set()
    mask_bytes = 0  # kept inside operations: dropout masks, attention internals
    inputs: set[str] = set()  # the step's inputs: the caller holds them for the whole step
    transient = [0] * len(ops)  # bytes an operation allocates and frees inside itself (inference)
    rnn_during = [0] * len(ops)  # a cuDNN RNN's workspace, during its call
    rnn_reserve = [0] * len(ops)  # a cuDNN RNN's reserve space (training: forward to backward)
    conv_during = [0] * len(ops)  # a convolution's workspace, during its call (inference)
    fwd_copy = [0] * len(ops)  # PyTorch's copies inside an RNN's forward
    bwd_copy = [0] * len(ops)  # ... and inside its backward
    bwd_scratch = [0] * len(ops)  # other buffers an operation's backward holds while it runs
    softmax_reads: list[tuple[str, str, int]] = []  # inference: (scores, softmax output, index)
    last_rnn = -1  # the latest cuDNN RNN: the output a later ``getitem`` node indexes
    clone_bytes = conv_io = matmul_io = rnn = 0
    released: dict[str, int] = {}  # saved storage -> the operation whose backward frees it (-1: never)
    internal = [0] * len(ops)  # bytes an operation keeps inside itself for its backward (masks, copies)
    strides_of: dict[str, tuple[int, ...]] = {}  # node -> strides, for the views that are not contiguous
    needs_grad: set[str] = set()  # storages that carry a gradient in backward
    index_of: dict[str, int] | None = None  # node -> index, built at the first weight cast
    training = mode == "training"
    # activation checkpointing (Operation.checkpoint_region): storage -> the region that made it,
    # and the saved ones among them -> their region, whose backward makes them again
    made_in_region: dict[str, int] = {}
    recomputed: dict[str, int] = {}
    region_of: dict[int, int] = {}  # operation index -> its region
    region_end: dict[int, int] = {}  # region -> its last operation's index
    first_reader = -1  # the first operation that reads a tensor: the step's inputs are what it reads
    for i, op in enumerate(ops):
        kind, nodes = op.kind, op.input_nodes
        region = getattr(op, "checkpoint_region", 0) if training else 0
        if region:
            region_of[i], region_end[region] = region, i
        if nodes and first_reader < 0:
            # under autocast the step opens with weight casts that read no activation
            # (``conv1.cast0``), so the input arrives at the operation after them; taking the
            # first operation alone left a ResNet's 77 MB batch-128 image out of its
            # inference peak (the caller holds it throughout the step)
            first_reader = i
        dropout = _is_dropout_kind(kind)
        for j, src in enumerate(nodes):
            root = storage_of.get(src)
            if root is None and last_rnn >= 0 and src.startswith("getitem") and j < len(op.input_shapes) \
                    and ops[last_rnn].output_shapes and list(op.input_shapes[j]) == list(ops[last_rnn].output_shapes[0]):
                # ``y, h = rnn(x)``: extraction leaves the tuple's indexing out; y is the RNN's
                # output (its storage, kept for backward, carrying a gradient), not a new tensor
                root = storage_of[src] = storage_of[ops[last_rnn].node]
            if root is None:
                # No operation made it: the network's input, or the output of a call that
                # extraction leaves out (a dropout in eval returns its input). It is taken to
                # appear where it is first used; counting it from the step's start kept every
                # such tensor of a ViT alive at once (5x the measured peak).
                root = storage_of[src] = src
                shape = op.input_shapes[j] if j < len(op.input_shapes) else []
                in_dtypes = getattr(op, "input_dtypes", None)  # the dtype it arrives in, where recorded
                size_of[root] = _block(_numel(shape) * _ELEMENT_BYTES.get(in_dtypes[j] if in_dtypes else op.dtype, 4))
                born[root] = i
                if i == first_reader:
                    inputs.add(root)
            last_use[root] = i
        copied = False  # a reshape that cannot be a view of its permuted or expanded input copies it
        if nodes and kind in RESHAPE_KINDS and nodes[0] in strides_of and op.input_shapes and op.output_shapes:
            s_out = _strides_after_view(op.input_shapes[0], strides_of[nodes[0]], op.output_shapes[0])
            if s_out is None:
                copied = True
            elif s_out != contiguous_strides(op.output_shapes[0]):
                strides_of[op.node] = s_out
        elif nodes and kind in STRIDING_KINDS:
            s_out = _strided_view(op, strides_of.get(nodes[0]))
            if s_out is not None:
                strides_of[op.node] = s_out
        if nodes and not copied and (op.in_place or kind in VIEW_KINDS or dropout and _returns_its_input(op)):
            storage_of[op.node] = storage_of[nodes[0]]
        else:
            storage_of[op.node] = op.node
            size_of[op.node] = _block(int(op.bytes_written))
            born[op.node] = i
            if region:
                made_in_region[op.node] = region
            last_use[op.node] = max(last_use.get(op.node, i), i)
        if kind in CONV_KINDS:
            io = _io_bytes(op)
            conv_io = max(conv_io, io)
            conv_during[i] = _block(int(CONV_WORKSPACE_IO * io)) if _conv_takes_workspace(op) else 0
        elif kind in MATMUL_KINDS:
            matmul_io = max(matmul_io, _io_bytes(op))
        elif kind in RNN_KINDS:
            rnn += _rnn_bytes(op)
            last_rnn = i
            rnn_during[i], rnn_reserve[i], fwd_copy[i], bwd_copy[i] = _rnn_buffers(op)
            bwd_copy[i] += fwd_copy[i]  # the backward copies the input again, beside the gradient
            transient[i] += fwd_copy[i]
        if kind == "shifted_window_attention":
            kept_inside, transient[i] = _window_attention_buffers(op)
            mask_bytes += kept_inside
            internal[i] += kept_inside
        elif kind == "MultiheadAttention":  # a leaf that keeps q, k, v and the attention output inside
            mask_bytes += 4 * int(op.bytes_written)
            internal[i] += 4 * int(op.bytes_written)
            transient[i] = _attention_buffers(op)
        elif kind in MAX_POOL_KINDS and op.output_shapes:
            indices = _block(8 * _numel(op.output_shapes[0]))
            if training:
                mask_bytes += indices
                internal[i] += indices
            else:
                transient[i] += indices
        if not training and kind in SOFTMAX_KINDS and nodes:
            # the scores a softmax reads stay alive while its output is used: attention written
            # out in Python holds them in a local (``scores = scores.masked_fill(...)``) until the
            # function returns (BERT-like inference at 512 tokens read 18% low without it)
            softmax_reads.append((storage_of[nodes[0]], storage_of[op.node], i))
        if not training:  # what autograd keeps and which tensors carry a gradient: training only
            if kind == "autocast_cast" and not nodes:
                # a weight's low-precision copy: with the cast cache off (as steps are measured;
                # in inference mode autocast caches nothing anyway: ``cached_cast`` in
                # aten/src/ATen/autocast_mode.cpp caches only leaves that require grad, outside
                # InferenceMode) it lives through the operation it was made for, whose input list
                # does not name it
                j = _next_consumer_of_cast(ops, i)
                if j > last_use[op.node]:
                    last_use[op.node] = j
            continue
        if kind in LINEAR_KINDS and "bias" in (op.settings or {}).get("param_shapes", {}):
            bwd_scratch[i] = _bias_grad_staging_bytes(op)
        if dropout and op.bytes_written and not _returns_its_input(op):
            out_elements = sum(_numel(s) for s in op.output_shapes)
            mask_bytes += out_elements
            internal[i] += _block(out_elements)
        saved_now = [storage_of[src] for src in _saved_inputs(op)]
        if op.params or kind == "autocast_cast" and not nodes or \
                any(storage_of.get(src) in needs_grad for src in nodes):
            needs_grad.add(storage_of[op.node])
        if op.in_place and nodes and kind not in INPLACE_RESULT_KINDS and kind not in NO_SAVE_KINDS:
            clone_bytes += _block(int(op.bytes_written))  # autograd's copy of the input it overwrites
            internal[i] += _block(int(op.bytes_written))
        if kind in SAVES_OUTPUT_KINDS:
            saved_now.append(storage_of[op.node])
        for root in saved_now:
            released.setdefault(root, i)  # backward frees it after the earliest operation that saved it
            if region and made_in_region.get(root) == region:
                recomputed[root] = region  # made and saved inside a checkpoint: made again in backward
        if kind == "autocast_cast" and not nodes:
            # a weight's low-precision copy, made for the operation after it (``conv1.cast0`` for
            # ``conv1``), which saves it for its backward; measured steps run autocast with its
            # cast cache off, so nothing else holds it (kept to the step's end, the copies put
            # bf16-mixed training at batch 1 15-22% above its peaks)
            saved_now.append(storage_of[op.node])
            if index_of is None:
                index_of = {str(o.node): j for j, o in enumerate(ops)}
            released[storage_of[op.node]] = _consumer_of_cast(ops, i, index_of)
        kept_roots.update(r for r in saved_now if r not in recomputed)
    if not training:
        _hold_call_arguments(ops, storage_of, born, last_use)
    for src, dst, i in softmax_reads:
        # through the next operation too: an eval-mode dropout between the softmax and its
        # reader is left out of extraction, so the reader names the dropout instead
        last_use[src] = max(last_use[src], last_use[dst], min(i + 1, len(ops) - 1))
    if ops:  # the step's result and inputs stay alive
        out = storage_of.get(ops[-1].node, ops[-1].node)
        last_use[out] = len(ops)
        for root in inputs:
            last_use[root] = len(ops)
    largest = max(size_of.values(), default=0)
    if mode == "training":
        saved = sum(size_of[root] for root in kept_roots) + mask_bytes + clone_bytes
        peak, with_rnn = _training_peak(ops, params, size_of, born, last_use, released, internal, needs_grad,
                                        inputs, storage_of.get(ops[-1].node, ops[-1].node) if ops else None,
                                        (fwd_copy, bwd_copy, rnn_during, rnn_reserve) if last_rnn >= 0 else None,
                                        param_keys, bwd_scratch,
                                        *_recompute_at(recomputed, region_of, region_end, internal))
        return MemoryTerms(mode, params, params, max(peak - 2 * params, 0), largest, conv_io, matmul_io, rnn,
                           saved, rnn_excess_bytes=with_rnn - peak)
    # Liveness: a tensor holds memory from the operation that makes it to its last user.
    delta = [0] * (len(ops) + 2)
    for node, size in size_of.items():
        start = max(born[node], 0)
        delta[start] += size
        delta[max(last_use.get(node, born[node]), start) + 1] -= size
    peak = live = with_rnn = with_conv = 0
    for i in range(len(ops)):  # (comparisons, not max(): this loop runs for every candidate ranked)
        live += delta[i]
        now = live + transient[i]
        if now > peak:
            peak = now
        if now + conv_during[i] > with_conv:
            with_conv = now + conv_during[i]
        now += rnn_during[i]
        if now > with_rnn:
            with_rnn = now
    return MemoryTerms(mode, params, 0, peak, largest, conv_io, matmul_io, rnn, rnn_excess_bytes=with_rnn - peak,
                       conv_excess_bytes=max(with_conv, peak) - peak)
