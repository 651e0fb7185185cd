"""Precision names (the math mode a step runs in) and what each means for tensors.

The names are the ones users know: ``"fp32"`` is PyTorch's default (cuDNN may use TF32,
matmul does not), ``"tf32"`` lets matmul use TF32 too, ``"bf16-mixed"``/``"fp16-mixed"``
run under ``torch.autocast``, and ``"bf16"``/``"fp16"`` cast the module and its inputs.
No torch import here: the collection plan and the CPU side read these names cheaply.
"""

from __future__ import annotations

from typing import Any

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16-mixed", "fp16-mixed", "bf16", "fp16")
DEFAULT_PRECISION = "fp32"
MIXED: frozenset[str] = frozenset({"bf16-mixed", "fp16-mixed"})  # torch.autocast
CAST: frozenset[str] = frozenset({"bf16", "fp16"})  # module and float inputs cast
# The low-precision dtype of a mixed or cast precision, as torch names it.
LOW_DTYPE: dict[str, str] = {"bf16-mixed": "bfloat16", "fp16-mixed": "float16", "bf16": "bfloat16",
                             "fp16": "float16"}


class UnknownPrecision(ValueError):
    """A precision name that is not one of PRECISIONS."""


def check_precision(precision: str) -> str:
    """``precision`` if it is known; UnknownPrecision (naming the choices) otherwise."""
    if precision not in PRECISIONS:
        raise UnknownPrecision(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    return precision


def low_dtype(precision: str) -> Any:
    """The torch dtype a mixed or cast precision computes in (torch.float32 otherwise)."""
    import torch

    return getattr(torch, LOW_DTYPE.get(check_precision(precision), "float32"))


def item_id(item: str, key: str, mode: str, precision: str = DEFAULT_PRECISION) -> str:
    """A work item's / row's id: fp32 ids are as they always were, others end in the precision."""
    base = f"{item}:{key}:{mode}"
    return base if precision == DEFAULT_PRECISION else f"{base}:{precision}"
