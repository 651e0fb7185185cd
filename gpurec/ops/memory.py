"""Peak GPU memory of one step, estimated from the extracted operations.

Why: a ranking that puts a GPU first which cannot hold the step is worse than no ranking.
The estimate follows what PyTorch keeps alive, without running anything:

- parameters (and, in training, one gradient per parameter; no optimizer state, since the
  optimizer is the user's choice and the step is measured without one);
- inference: the largest set of activations alive at once (liveness): a tensor holds memory
  from the operation that makes it to its last user, views and in-place operations share
  their input's storage, the step's inputs and result stay alive, and multi-head attention
  adds what it allocates inside itself;
- training: every activation some operation keeps for backward (a convolution keeps its
  input, a ReLU its output; an addition keeps neither), plus the largest activation again
  for the gradient being computed; dropout keeps a one-byte mask per element.

It leaves out the CUDA context, cuDNN/cuBLAS workspaces and allocator fragmentation, so it
is a lower bound of what ``torch.cuda.max_memory_allocated`` reports, typically within ~15%
for convolutional networks (resnet50, batch 256, fp32 training: ~23 GB; PyTorch's allocator
reports about 22-25 GB for the same step).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Operations that return a view of their first input (no new storage).
VIEW_KINDS = frozenset({
    "reshape", "view", "flatten", "permute", "transpose", "t", "expand", "expand_as", "squeeze", "unsqueeze",
    "getitem", "split", "chunk", "unbind", "narrow", "view_as", "unflatten", "Flatten", "Unflatten", "detach",
})
# Operations whose backward needs none of their inputs (so they do not keep them alive).
NO_SAVE_KINDS = VIEW_KINDS | frozenset({
    "add", "sub", "cat", "stack", "AdaptiveAvgPool2d", "AdaptiveAvgPool1d", "mean", "sum", "Identity", "contiguous",
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "dropout", "StochasticDepth", "clone", "to", "float",
})
# Operations whose backward needs their output (activations computed from the result).
SAVES_OUTPUT_KINDS = frozenset({"ReLU", "relu", "ReLU6", "Sigmoid", "sigmoid", "Tanh", "tanh", "Softmax", "softmax",
                                "Hardtanh", "ELU"})
_ELEMENT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
                  "int8": 1, "uint8": 1, "bool": 1, "complex64": 8}


@dataclass(frozen=True)
class StepMemory:
    """Estimated peak memory of one step, in bytes, and what it is made of."""

    mode: str
    params_bytes: int
    grads_bytes: int
    activations_bytes: int  # peak live activations (inference) or kept for backward plus one gradient (training)

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.activations_bytes

    @property
    def memory_gb(self) -> float:
        """Decimal gigabytes (1e9 bytes), the unit of GPU datasheets."""
        return self.total_bytes / 1e9


def _numel(shape: Sequence[int]) -> int:
    return math.prod(int(s) for s in shape)


def _param_bytes(ops: Sequence[Any]) -> int:
    """Each module's parameters once (a module called several times holds one copy)."""
    seen: set[str] = set()
    total = 0
    for op in ops:
        if not op.params:
            continue
        key = op.name if op.category == "module" else f"{op.node or op.name}"
        if key in seen:
            continue
        seen.add(key)
        total += int(op.params) * _param_element_bytes(op)
    return total


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
    scores = int(batch) * heads * int(tgt) * int(src) * _ELEMENT_BYTES.get(op.dtype, 4)
    return 4 * out_bytes + 2 * scores


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


def step_memory(ops: Sequence[Any], mode: str | None = None) -> StepMemory:
    """Peak memory of one forward (inference) or forward + backward (training) step of ``ops``.

    ``ops`` are gpurec.ops Operations in execution order, as extract_operations returns them.
    """
    mode = mode or (ops[0].mode if ops else "inference")
    params = _param_bytes(ops)
    storage_of: dict[str, str] = {}  # node -> the node whose storage it uses
    size_of: dict[str, int] = {}  # storage node -> bytes
    born: dict[str, int] = {}
    last_use: dict[str, int] = {}
    kept_roots: set[str] = set()
    mask_bytes = 0  # kept inside operations: dropout masks, attention internals
    inputs: set[str] = set()  # the step's inputs: the caller holds them for the whole step
    transient = [0] * len(ops)  # bytes an operation allocates and frees inside itself (inference)
    for i, op in enumerate(ops):
        for j, src in enumerate(op.input_nodes):
            root = storage_of.get(src)
            if root is None:
                # No operation made it: the network's input, or the output of a call that
                # extraction leaves out (a dropout in eval returns its input). It is taken to
                # appear where it is first used; counting it from the step's start kept every
                # such tensor of a ViT alive at once (5x the measured peak).
                root = storage_of[src] = src
                shape = op.input_shapes[j] if j < len(op.input_shapes) else []
                in_dtypes = getattr(op, "input_dtypes", None)  # the dtype it arrives in, where recorded
                size_of[root] = _numel(shape) * _ELEMENT_BYTES.get(in_dtypes[j] if in_dtypes else op.dtype, 4)
                born[root] = i
                if i == 0:
                    inputs.add(root)
            last_use[root] = i
        if op.input_nodes and (op.in_place or op.kind in VIEW_KINDS):
            storage_of[op.node] = storage_of[op.input_nodes[0]]
        else:
            storage_of[op.node] = op.node
            size_of[op.node] = int(op.bytes_written)
            born[op.node] = i
            last_use[op.node] = max(last_use.get(op.node, i), i)
        if op.kind not in NO_SAVE_KINDS:
            kept_roots.update(storage_of[src] for src in op.input_nodes)
        if op.kind in SAVES_OUTPUT_KINDS:
            kept_roots.add(storage_of[op.node])
        if op.kind == "autocast_cast" and not op.input_nodes:  # a weight's low-precision copy, saved for backward
            kept_roots.add(storage_of[op.node])
        if op.kind == "MultiheadAttention":  # a leaf that keeps q, k, v and the attention output inside
            mask_bytes += 4 * int(op.bytes_written)
            transient[i] = _attention_buffers(op)
        if op.kind.lower().startswith("dropout") and op.bytes_written:
            out_elements = sum(_numel(s) for s in op.output_shapes)
            mask_bytes += out_elements
    if ops:  # the step's result and inputs stay alive
        out = storage_of.get(ops[-1].node, ops[-1].node)
        last_use[out] = len(ops)
        for root in inputs:
            last_use[root] = len(ops)
    if mode == "training":
        kept = sum(size_of[root] for root in kept_roots) + mask_bytes
        largest = max(size_of.values(), default=0)
        return StepMemory(mode, params, params, kept + largest)
    # Liveness: a tensor holds memory from the operation that makes it to its last user.
    delta = [0] * (len(ops) + 2)
    for node, size in size_of.items():
        start = max(born[node], 0)
        delta[start] += size
        delta[max(last_use.get(node, born[node]), start) + 1] -= size
    peak = live = 0
    for i in range(len(ops)):
        live += delta[i]
        peak = max(peak, live + transient[i])
    return StepMemory(mode, params, 0, peak)
