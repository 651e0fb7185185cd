"""Analytic features of an operation: what a predictor may know without running it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpurec.ops.operation import Operation

FEATURE_NAMES: tuple[str, ...] = (
    "flops", "flops_elementwise", "flops_bwd", "flops_total",
    "bytes_read", "bytes_written", "bytes_total", "arithmetic_intensity",
    "params", "input_elements", "output_elements", "n_inputs",
    "batch", "channels", "height", "width", "seq_len",
    "in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
    "in_features", "out_features", "embed_dim", "num_heads",
    "input_requires_grad",
    "element_bytes", "math_mode",
)
# math_mode codes: how the operation's arithmetic runs (gpurec.ops.precision); the GPU's peak
# rate for it enters the roofline features (gpurec.model.features).
MATH_MODES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16")
_ELEMENT_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "float64": 8.0}


def math_mode(op: Operation) -> float:
    """Index in MATH_MODES of the operation's arithmetic: its compute dtype, TF32 where marked."""
    if op.dtype == "bfloat16":
        return 3.0
    if op.dtype == "float16":
        return 2.0
    return 1.0 if op.precision == "tf32" else 0.0


def _first(value: Any, default: float = 0.0) -> float:
    t = type(value)
    if t is int or t is float:  # the commonest case, checked first
        return float(value)
    if value is None:
        return default
    if isinstance(value, (list, tuple)):
        return float(value[0]) if value and isinstance(value[0], (int, float)) else default
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return default


def _prod(value: Any) -> float:
    if isinstance(value, (list, tuple)):
        return float(math.prod(v for v in value if isinstance(v, (int, float))))
    return _first(value)


_RECURRENT_KINDS = frozenset({"LSTM", "GRU", "RNN"})


def operation_feature_row(op: Operation) -> list[float]:
    """The operation's features in FEATURE_NAMES order, without building a dict (prediction
    turns every operation of every candidate into a row; the dict was a tenth of the time)."""
    s = op.settings
    get = s.get
    shape = op.input_shapes[0] if op.input_shapes else []
    input_elements = sum(math.prod(x) for x in op.input_shapes)
    output_elements = sum(math.prod(x) for x in op.output_shapes)
    bytes_total = op.bytes_read + op.bytes_written
    flops_total = op.flops + op.flops_elementwise
    channels = height = width = seq_len = 0.0
    rank = len(shape)
    if rank == 4:
        channels, height, width = float(shape[1]), float(shape[2]), float(shape[3])
    elif rank == 3:
        seq_len, channels = float(shape[1]), float(shape[2])
    elif rank == 2:
        channels = float(shape[1])
    batch = float(shape[0]) if shape else 0.0
    in_features, out_features, embed_dim, num_heads = (_first(get("in_features")), _first(get("out_features")),
                                                       _first(get("embed_dim")), _first(get("num_heads")))
    if op.kind in _RECURRENT_KINDS and rank == 3:
        # A whole cuDNN recurrent layer, in the features every kind has: batch and sequence
        # length as its layout says; in_features = input size, out_features = output width
        # (hidden x directions), embed_dim = hidden size, num_heads = recurrent sweeps
        # (layers x directions).
        dirs = 2.0 if get("bidirectional") else 1.0
        if not get("batch_first"):
            batch, seq_len = float(shape[1]), float(shape[0])
        hidden = _first(get("hidden_size"))
        in_features, out_features = _first(get("input_size")), hidden * dirs
        embed_dim, num_heads = hidden, _first(get("num_layers"), 1.0) * dirs
    return [
        float(op.flops), float(op.flops_elementwise), float(op.flops_bwd), float(flops_total),
        float(op.bytes_read), float(op.bytes_written), float(bytes_total),
        flops_total / bytes_total if bytes_total else 0.0,
        float(op.params), float(input_elements), float(output_elements), float(len(op.input_shapes)),
        batch, channels, height, width, seq_len,
        _first(get("in_channels")), _first(get("out_channels")), _prod(get("kernel_size", 0)),
        _first(get("stride", 0)), _first(get("padding", 0)), _first(get("dilation", 0)), _first(get("groups", 0)),
        in_features, out_features, embed_dim, num_heads,
        float(any(op.input_requires_grad)),
        _ELEMENT_BYTES.get(op.dtype, 4.0), math_mode(op),
    ]


def operation_features(op: Operation) -> dict[str, float]:
    return dict(zip(FEATURE_NAMES, operation_feature_row(op), strict=True))
