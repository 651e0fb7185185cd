"""Runnable benchmark units: an operation rebuilt with random weights on a device.

A unit holds a block of ``instances`` independently initialised copies (so the weights do
not all sit in cache, yet no instance is built inside the timed loop) and one random input
per activation, as the method prescribes.  ``step()`` runs one call:

* inference: forward only; the caller wraps the loop in ``eval`` + ``torch.inference_mode``;
* training: forward, then backward of a preinitialised random output gradient, and the
  gradients are reset (set to None) so they never accumulate.

Inputs and weights are made in the dtypes the operation's kernel reads (its precision's
``input_dtypes``/``param_dtypes``).  A mixed precision's step runs under ``torch.autocast``,
and TF32 under the TF32 matmul setting: callers enter :meth:`Unit.scope` once around their
timing loop (as a user enters autocast once per step, not once per operation).
"""

from __future__ import annotations

import contextlib
import copy
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

from gpurec.ops.operation import ActRef, Operation, ParamRef
from gpurec.ops.precision import MIXED, check_precision, low_dtype

# In-place forms cannot run backward on a leaf input; training uses the out-of-place twin.
_OUT_OF_PLACE_FUNCTIONS: dict[Any, Any] = {
    operator.iadd: operator.add,
    operator.imul: operator.mul,
    operator.isub: operator.sub,
    operator.itruediv: operator.truediv,
}


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _random_tensor(shape: tuple[int, ...] | list[int], dtype: torch.dtype, device: Any,
                   generator: torch.Generator | None, index_high: int = 0) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(tuple(shape), dtype=dtype, device=device, generator=generator)
    if index_high > 0 and dtype in (torch.int64, torch.int32):
        # token ids into a table of ``index_high`` rows: random, so a lookup touches many rows
        return torch.randint(0, index_high, tuple(shape), dtype=dtype, device=device, generator=generator)
    if dtype == torch.bool:
        # masks: True everywhere, so an attention mask lets every query attend (all False would
        # make every row -inf, and NaNs from there on)
        return torch.ones(tuple(shape), dtype=dtype, device=device)
    # Integer buffers are indices (e.g. Swin's relative position index): zeros stay valid.
    return torch.zeros(tuple(shape), dtype=dtype, device=device)


def _index_high(op: Operation) -> int:
    """The table size integer inputs index into: an Embedding's rows (module or F.embedding's
    weight); 0 (zeros) for other integer inputs."""
    if op.kind == "Embedding":
        return int(op.settings.get("num_embeddings", 0) or 0)
    if op.kind == "embedding" and op.source is not None:
        weights = [x for x in tree_flatten((op.source[2], op.source[3]))[0] if isinstance(x, ParamRef)]
        return int(weights[0].shape[0]) if weights else 0
    return 0


def _init_module(m: nn.Module, generator: torch.Generator) -> None:
    """Random weights, sane normalisation statistics."""
    with torch.no_grad():
        for sub in m.modules():
            if hasattr(sub, "reset_running_stats"):
                sub.reset_running_stats()
        for p in m.parameters():
            if p.dtype.is_floating_point:
                bound = 1.0 / max(1.0, float(p.shape[-1] if p.dim() else 1)) ** 0.5
                p.uniform_(-bound, bound, generator=generator)
        for name, b in m.named_buffers():
            if b.dtype.is_floating_point and "running" not in name:
                b.normal_(generator=generator)
            elif not b.dtype.is_floating_point and "num_batches_tracked" not in name:
                b.zero_()  # index buffers: zeros are always in range


@contextlib.contextmanager
def precision_scope(precision: str, device: Any) -> Iterator[None]:
    """What a step at ``precision`` runs under: ``torch.autocast`` on the device's type for a
    mixed precision (cast cache off, so the step can be captured as a CUDA graph), TF32 matmul
    for ``"tf32"`` (the previous setting restored), nothing otherwise."""
    check_precision(precision)
    if precision in MIXED:
        with torch.autocast(torch.device(device).type, dtype=low_dtype(precision), cache_enabled=False):
            yield
        return
    if precision == "tf32":
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
        return
    yield


def _cast_tensors(module: nn.Module, dtypes: dict[str, str]) -> None:
    """Module parameters and buffers in the dtypes the kernel reads (``param_dtypes``)."""
    for name, dtype_name in dtypes.items():
        owner_path, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        t = getattr(owner, attr)
        cast = t.detach().to(_dtype(dtype_name))
        if isinstance(t, nn.Parameter):
            owner._parameters[attr] = nn.Parameter(cast, requires_grad=t.requires_grad)
        else:
            owner._buffers[attr] = cast


class Unit:
    """A materialised operation; call :meth:`step` in a loop, inside :meth:`scope`."""

    def __init__(self, op: Operation, calls: list[Callable[[], Any]], inputs: list[torch.Tensor],
                 params: list[list[torch.Tensor]], training: bool, device: Any, generator: torch.Generator):
        self.op = op
        self.training = training
        self.inputs = inputs
        self.precision = getattr(op, "precision", "fp32")
        self.device = device
        self._calls = calls
        self._params = params
        self._i = 0
        self.backward = False
        self._grads: list[torch.Tensor] = []
        if training:
            with self.scope():
                out = calls[0]()
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            self.backward = bool(outs)
            self._grads = [torch.randn(t.shape, dtype=t.dtype, device=t.device, generator=generator) for t in outs]
            del out, outs
            self._reset_grads()

    def scope(self) -> contextlib.AbstractContextManager[None]:
        """Enter once around the calls of :meth:`step` (see :func:`precision_scope`)."""
        return precision_scope(self.precision, self.device)

    @property
    def instances(self) -> int:
        return len(self._calls)

    def _reset_grads(self) -> None:
        for x in self.inputs:
            x.grad = None
        for group in self._params:
            for p in group:
                p.grad = None

    def step(self) -> None:
        call = self._calls[self._i]
        self._i = (self._i + 1) % len(self._calls)
        if not self.training:
            call()
            return
        out = call()
        if self.backward:
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
            torch.autograd.backward(outs, self._grads)
            self._reset_grads()

    def param_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for group in self._params for p in group)


def materialize(op: Operation, device: Any = "cpu", instances: int = 1, seed: int = 0) -> Unit:
    """Rebuild ``op`` on ``device`` with ``instances`` copies of random weights."""
    if op.source is None:
        raise ValueError(f"operation {op.kind} has no source; extract with keep_sources=True")
    training = op.mode == "training"
    dtype = _dtype(op.dtype)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    inputs = []
    in_dtypes = [_dtype(d) for d in op.input_dtypes] if op.input_dtypes else [dtype] * len(op.input_shapes)
    high = _index_high(op)
    for shape, rg, in_dtype in zip(op.input_shapes, op.input_requires_grad, in_dtypes, strict=True):
        x = _random_tensor(shape, in_dtype, device, gen, high)
        if training and rg:
            x.requires_grad_(True)
        inputs.append(x)

    kind, target, arg_template, kwarg_template = op.source
    has_weights = op.params > 0
    n = max(1, int(instances)) if has_weights else 1
    calls: list[Callable[[], Any]] = []
    params: list[list[torch.Tensor]] = []

    def fill(template: Any, made: list[torch.Tensor]) -> Any:
        def conv(x: Any) -> Any:
            if isinstance(x, ActRef):
                return inputs[x.index]
            if isinstance(x, ParamRef):
                t = _random_tensor(x.shape, _dtype(x.dtype), device, gen)
                if training and x.trainable and t.dtype.is_floating_point:
                    t.requires_grad_(True)
                made.append(t)
                return t
            if isinstance(x, torch.device):  # created on the extraction's meta device: create here
                return torch.device(device)
            return x

        return tree_map(conv, template)

    for _ in range(n):
        made: list[torch.Tensor] = []
        args = fill(arg_template, made)
        kwargs = fill(kwarg_template, made)
        if kind == "module":
            module = copy.deepcopy(target)
            module = module.to_empty(device=device)
            _init_module(module, gen)
            _cast_tensors(module, op.param_dtypes)
            module.train(training)
            if training:
                for sub in module.modules():
                    if getattr(sub, "inplace", False):
                        sub.inplace = False
            made.extend(p for p in module.parameters())
            calls.append(_bind(module, args, kwargs))
        elif kind == "function":
            fn = _OUT_OF_PLACE_FUNCTIONS.get(target, target) if training else target
            if training and isinstance(kwargs, dict) and kwargs.get("inplace"):
                kwargs = {**kwargs, "inplace": False}
            calls.append(_bind(fn, args, kwargs))
        elif kind == "method":
            name = target
            if training and name.endswith("_") and not name.startswith("_"):
                name = name[:-1]
            self_obj, *rest = args
            calls.append(_bind(getattr(self_obj, name), tuple(rest), kwargs))
        else:
            raise ValueError(f"unknown operation source kind {kind}")
        params.append(made)
    return Unit(op, calls, inputs, params, training, device, gen)


def _bind(fn: Callable[..., Any], args: Any, kwargs: Any) -> Callable[[], Any]:
    args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    kwargs = dict(kwargs) if kwargs else {}
    return lambda: fn(*args, **kwargs)
