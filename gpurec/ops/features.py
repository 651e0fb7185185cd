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
)


def _first(value: Any, default: float = 0.0) -> float:
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


def operation_features(op: Operation) -> dict[str, float]:
    s = op.settings
    shape = op.input_shapes[0] if op.input_shapes else []
    input_elements = sum(math.prod(x) for x in op.input_shapes)
    output_elements = sum(math.prod(x) for x in op.output_shapes)
    bytes_total = op.bytes_read + op.bytes_written
    channels = height = width = seq_len = 0.0
    if len(shape) == 4:
        channels, height, width = float(shape[1]), float(shape[2]), float(shape[3])
    elif len(shape) == 3:
        seq_len, channels = float(shape[1]), float(shape[2])
    elif len(shape) == 2:
        channels = float(shape[1])
    return {
        "flops": float(op.flops),
        "flops_elementwise": float(op.flops_elementwise),
        "flops_bwd": float(op.flops_bwd),
        "flops_total": float(op.flops + op.flops_elementwise),
        "bytes_read": float(op.bytes_read),
        "bytes_written": float(op.bytes_written),
        "bytes_total": float(bytes_total),
        "arithmetic_intensity": (op.flops + op.flops_elementwise) / bytes_total if bytes_total else 0.0,
        "params": float(op.params),
        "input_elements": float(input_elements),
        "output_elements": float(output_elements),
        "n_inputs": float(len(op.input_shapes)),
        "batch": float(shape[0]) if shape else 0.0,
        "channels": channels,
        "height": height,
        "width": width,
        "seq_len": seq_len,
        "in_channels": _first(s.get("in_channels")),
        "out_channels": _first(s.get("out_channels")),
        "kernel_size": _prod(s.get("kernel_size", 0)),
        "stride": _first(s.get("stride", 0)),
        "padding": _first(s.get("padding", 0)),
        "dilation": _first(s.get("dilation", 0)),
        "groups": _first(s.get("groups", 0)),
        "in_features": _first(s.get("in_features")),
        "out_features": _first(s.get("out_features")),
        "embed_dim": _first(s.get("embed_dim")),
        "num_heads": _first(s.get("num_heads")),
        "input_requires_grad": float(any(op.input_requires_grad)),
    }
