"""The operation record, its stable signature and its analytic features.

The signature is a hash of a canonical JSON form (kind, settings, input shapes, dtype,
which inputs require grad), so identical operations in different models, and on the GPU
machine's torch and this one's, get the same key.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

SIGNATURE_VERSION = 1
# Views whose backward assembles the gradients of their pieces (kernels in training, none in inference).
GRAD_ASSEMBLING_VIEWS = frozenset({"chunk", "split", "split_with_sizes", "tensor_split", "unbind"})


@dataclass(frozen=True)
class ActRef:
    """Placeholder for the i-th activation input of an operation."""

    index: int


@dataclass(frozen=True)
class ParamRef:
    """Placeholder for a parameter/buffer tensor passed to a function (not a module)."""

    shape: tuple[int, ...]
    dtype: str
    trainable: bool


def canonical_value(value: Any) -> Any:
    """A JSON-able, torch-version-independent form of a setting or constant argument."""
    if isinstance(value, (ActRef, ParamRef)):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return float(repr(value)) if math.isfinite(value) else str(value)
    if isinstance(value, (tuple, list)):
        return [canonical_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): canonical_value(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, slice):
        return {"slice": [canonical_value(value.start), canonical_value(value.stop), canonical_value(value.step)]}
    if value is Ellipsis:
        return "..."
    if isinstance(value, enum.Enum):
        return str(value.name)
    module = type(value).__module__
    if module.startswith("torch"):
        text = str(value)
        if type(value).__name__ == "Size":
            return [int(v) for v in value]
        if type(value).__name__ == "device":
            return "device"  # where the tensor lives is not part of the operation
        return text.replace("torch.", "")
    if callable(value):
        return getattr(value, "__qualname__", getattr(value, "__name__", repr(value)))
    return repr(value)


@dataclass(eq=False)
class Operation:
    """One layer type + settings applied to one input shape and dtype, in one mode."""

    kind: str
    category: str  # "module", "function" or "method"
    settings: dict[str, Any]
    input_shapes: list[list[int]]
    input_requires_grad: list[bool]
    output_shapes: list[list[int]]
    dtype: str
    mode: str
    params: int
    flops: int  # forward, FlopCounterMode-compatible (2 x MAC of matmul/conv/attention)
    flops_elementwise: int  # forward, our own count for what FlopCounterMode counts as zero
    flops_bwd: int
    bytes_read: int
    bytes_written: int
    name: str = ""  # where it sits in the model (module path or fx node name)
    model: str = ""
    source: Any = field(default=None, repr=False)
    # Where its activations come from (for memory liveness, gpurec.ops.memory); not part of
    # the identity: the same operation in another place of another model is the same operation.
    node: str = ""  # this call's unique name in the traced graph
    input_nodes: list[str] = field(default_factory=list)  # producers of input_shapes, in order
    in_place: bool = False  # writes into its first input (ReLU(inplace=True), ``x += y``)
    # The math mode it runs in (gpurec.ops.precision); with it, the dtype each activation input
    # arrives in and the dtype of each module parameter/buffer its kernel reads where that is not
    # float32 (a bf16 copy of the weight under autocast, a module cast to bf16).  Part of the
    # identity only when the precision is not fp32, so fp32 signatures never change.
    precision: str = "fp32"
    # Dtypes of the activation inputs: set at a precision other than fp32, and wherever one input
    # differs from ``dtype`` (int64 token ids, bool masks); None: all are ``dtype``.  Part of the
    # identity when set.
    input_dtypes: list[str] | None = None
    param_dtypes: dict[str, str] = field(default_factory=dict)
    # Launches no kernel (a view, ``contiguous()`` of a contiguous tensor, dropout with p=0):
    # derived from the identity, so not part of it; the predictor gives it no GPU time.
    kernel_free: bool = False
    backend: str = ""  # scaled_dot_product_attention: the kernel it takes (gpurec.ops.extract.sdpa_backend)
    # Training only: the activation-checkpointed region (torch.utils.checkpoint call) it runs in,
    # numbered from 1 in execution order; 0: none.  Backward runs a region's forward again and
    # autograd keeps only its inputs until then.  Where it runs, not what: not part of the identity.
    checkpoint_region: int = 0

    # -- identity ---------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        ident = {
            "v": SIGNATURE_VERSION,
            "kind": self.kind,
            "category": self.category,
            "settings": self.settings,
            "input_shapes": self.input_shapes,
            "input_requires_grad": self.input_requires_grad,
            "dtype": self.dtype,
        }
        if self.precision != "fp32":
            ident["precision"] = self.precision
            if self.param_dtypes:
                ident["param_dtypes"] = self.param_dtypes
        if self.input_dtypes:
            ident["input_dtypes"] = self.input_dtypes
        return ident

    @property
    def signature(self) -> str:
        cached = self.__dict__.get("_signature")
        if cached is None:
            cached = signature_of(self.identity())
            self.__dict__["_signature"] = cached
        return cached

    # -- features ---------------------------------------------------------------------------
    @property
    def flops_total(self) -> int:
        return self.flops + self.flops_elementwise

    def features(self) -> dict[str, float]:
        from gpurec.ops.features import operation_features

        return operation_features(self)

    def to_record(self) -> dict[str, Any]:
        """Flat dict for tables and JSON (settings serialised)."""
        rec: dict[str, Any] = dict(self.features())
        rec.update({
            "op_signature": self.signature,
            "op_kind": self.kind,
            "category": self.category,
            "mode": self.mode,
            "name": self.name,
            "model": self.model,
            "input_shapes": json.dumps(self.input_shapes),
            "output_shapes": json.dumps(self.output_shapes),
            "input_requires_grad": json.dumps(self.input_requires_grad),
            "dtype": self.dtype,
            "settings": json.dumps(self.settings, sort_keys=True, default=str),
        })
        if self.precision != "fp32":  # fp32 records stay as they were
            rec["precision"] = self.precision
            rec["input_dtypes"] = json.dumps(self.input_dtypes)
        return rec

    @property
    def recomputed(self) -> bool:
        """Backward runs its forward again (activation checkpointing)."""
        return self.checkpoint_region > 0

    def recomputation(self) -> Operation:
        """The forward that activation checkpointing runs again in backward: this operation
        without gradients, as inference rows measure it (same kind, settings, shapes, precision;
        a view that launched kernels only for its backward launches none)."""
        return dataclasses.replace(self, mode="inference", input_requires_grad=[False] * len(self.input_requires_grad),
                                   flops_bwd=0, checkpoint_region=0, source=None,
                                   kernel_free=self.kernel_free or self.kind in GRAD_ASSEMBLING_VIEWS)

    def materialize(self, device: Any = "cpu", instances: int = 1, seed: int = 0) -> Any:
        """A runnable benchmark unit; see :mod:`gpurec.ops.units`."""
        from gpurec.ops.units import materialize

        return materialize(self, device=device, instances=instances, seed=seed)


def signature_of(identity: dict[str, Any]) -> str:
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]
