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


def precision_or_default(value: Any) -> str:
    """A stored precision. Rows written before precision was recorded have none (absent, None,
    NaN or empty): they were measured at PyTorch's default, fp32."""
    return value if isinstance(value, str) and value else DEFAULT_PRECISION


def rows_at_precision(frame: Any, precision: str = DEFAULT_PRECISION) -> Any:
    """The rows of a table measured at ``precision`` (a table without the column is all fp32).
    One filter for every table, so no caller can disagree on what an unrecorded precision is."""
    if "precision" not in frame:
        return frame if precision == DEFAULT_PRECISION else frame.iloc[:0]
    return frame[precision_column(frame) == precision]


def precision_column(frame: Any) -> Any:
    """Each row's precision, for ``frame.assign(precision=...)``: fp32 where the table has no
    precision column (tables from before it) or a row has none."""
    return frame["precision"].map(precision_or_default) if "precision" in frame else DEFAULT_PRECISION


def item_id(item: str, key: str, mode: str, precision: str = DEFAULT_PRECISION) -> str:
    """A work item's / row's id: fp32 ids are as they always were, others end in the precision."""
    base = f"{item}:{key}:{mode}"
    return base if precision == DEFAULT_PRECISION else f"{base}:{precision}"


class PrecisionMismatch(ValueError):
    """A precision that contradicts the dtype of the module's parameters."""


_CAST_OF_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}


def resolve_precision(model: Any, precision: str | None = None) -> str:
    """The precision to extract and predict ``model`` at.

    A module whose floating parameters are bf16 or fp16 runs at that cast precision: it is
    what ``None`` means for it, and any other precision contradicts it (PrecisionMismatch,
    one line saying how to fix it); so does a cast precision for a module still in float32.
    A torchvision name has no parameters yet: ``None`` is fp32, any precision is taken.
    """
    if precision is not None:
        check_precision(precision)
    dtypes = _parameter_dtypes(model)
    if not dtypes:
        return precision or DEFAULT_PRECISION
    low = {_CAST_OF_DTYPE[d] for d in dtypes if d in _CAST_OF_DTYPE}
    if low:
        if len(low) > 1 or len(dtypes) > 1:
            raise PrecisionMismatch(f"the module's parameters mix dtypes ({', '.join(sorted(dtypes))}): cast it "
                                    "to one dtype (model.bfloat16(), model.half() or model.float())")
        found = low.pop()
        if precision is not None and precision != found:
            raise PrecisionMismatch(f"precision {precision!r} contradicts the module's {next(iter(dtypes))} "
                                    f"parameters: use precision {found!r}, or model.float() for {precision}")
        return found
    if precision in CAST:
        raise PrecisionMismatch(f"precision {precision!r} needs the module cast (model.{LOW_DTYPE[precision]}()): "
                                f"its parameters are {', '.join(sorted(dtypes))}; or use {precision}-mixed")
    return precision or DEFAULT_PRECISION


def _parameter_dtypes(model: Any) -> set[str]:
    """The dtypes of a module's floating parameters (empty for a name or a module without any)."""
    params = getattr(model, "parameters", None)
    if params is None or isinstance(model, str):
        return set()
    modules = getattr(model, "modules", None)
    if modules is None:
        found = {p.dtype for p in params()}
    else:
        # each module's own parameter table: named_parameters' generator, prefixes and
        # de-duplication cost more than the dtypes themselves (called twice per fresh candidate)
        found = {p.dtype for m in modules() for p in m._parameters.values() if p is not None}
    # distinct dtypes first: a name per dtype, not per parameter
    return {str(d).replace("torch.", "") for d in found if d.is_floating_point}
