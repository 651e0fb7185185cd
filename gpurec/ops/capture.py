"""Capture on concrete shapes: the fallback when torch.fx cannot trace a forward.

torch.fx runs ``forward`` on proxies, so Python that uses a shape as a number (``if
x.shape[1] > 64:``, ``range(x.size(0))``, a slice bound in a helper fx does not look into)
fails.  Here ``forward`` runs for real, on meta tensors, and every call is recorded into an
fx graph of the same nodes torch.fx would have made: leaf modules (the same leaves as
gpurec.ops.extract's tracer, composite Transformer modules decomposed the same way) through
a patched ``nn.Module.__call__``, torch functions and tensor methods through a
TorchFunctionMode (nested calls inside a recorded one are not seen: the mode is off while a
call runs).  gpurec.ops.extract then interprets that graph exactly as it interprets a traced
one, so the same operations get the same signatures.  Shapes are plain numbers here; a branch
on tensor *values* (``if x.sum() > 0``) has no answer on meta tensors and raises
ValueDependentControlFlow.
"""

from __future__ import annotations

import builtins
import operator
import sys
import warnings
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.nn.utils.rnn import PackedSequence
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from gpurec.ops.extract import (
    _DECOMPOSITIONS,
    _RECURRENT,
    ExtractionError,
    PackedSequenceWarning,
    _analytic_recurrent,
    _recording_autocast,
    _swapped_to_meta,
    _Traced,
    _Tracer,
    _wrapped_as_root,
)


class ValueDependentControlFlow(ExtractionError):
    """``forward`` reads a tensor's values (bool(), item(), int()): unknown on meta tensors."""


# Tensor operators, recorded as torch.fx records them on a proxy: operator.<name>, reflected
# ones with their operands swapped, and in-place ones (x += y) as the out-of-place operator
# (a proxy has no __iadd__, so Python falls back to x = x + y).
_FX_MAGIC: tuple[str, ...] = tuple(torch.fx.graph.magic_methods)
_FX_REFLECTABLE: tuple[str, ...] = tuple(torch.fx.graph.reflectable_magic_methods)
_IN_PLACE: tuple[str, ...] = ("add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "lshift", "rshift", "and_",
                              "or_", "xor", "matmul")
_VALUE_READS = frozenset({"__bool__", "item", "tolist", "__int__", "__float__", "__index__", "__complex__",
                          "__array__", "numpy"})
_NO_NODE_METHODS = frozenset({"size", "dim", "numel", "__len__", "__format__", "__repr__", "__hash__",
                              "is_floating_point", "is_complex", "element_size", "stride", "storage_offset",
                              "is_contiguous", "get_device", "data_ptr", "__iter__", "__contains__", "nelement",
                              "ndimension", "has_names", "__reversed__"})


def _is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def _tensor_leaves(out: Any, path: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    if _is_tensor(out):
        return [(path, out)]
    if isinstance(out, (tuple, list)):
        return [leaf for i, v in enumerate(out) for leaf in _tensor_leaves(v, (*path, i))]
    return []


class _MarkingGraph(torch.fx.Graph):
    """An fx graph whose nodes carry the activation-checkpointed region they are made in, as the
    tracer's do (gpurec.ops.extract.CheckpointRegions)."""

    def __init__(self) -> None:
        from gpurec.ops.extract import CheckpointRegions

        super().__init__()
        self.checkpoints = CheckpointRegions()

    def create_node(self, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = super().create_node(*args, **kwargs)
        self.checkpoints.mark(node)
        return node


class _Recorder(TorchFunctionMode):
    """Records torch functions and tensor methods called outside leaf modules into ``graph``."""

    def __init__(self, root: nn.Module) -> None:
        super().__init__()
        self.graph = _MarkingGraph()
        self.root = root
        self.node_of: dict[int, torch.fx.Node] = {}
        self.alive: list[Any] = []  # keeps recorded tensors alive so their ids are never reused
        self.in_leaf = 0
        self.attr_name: dict[int, str] = {}
        for prefix, store in (("", root.named_parameters(remove_duplicate=False)),
                              ("", root.named_buffers(remove_duplicate=False))):
            for name, t in store:
                self.attr_name.setdefault(id(t), prefix + name)
        self.paths = {id(m): name for name, m in root.named_modules(remove_duplicate=False)}
        self._device_node: torch.fx.Node | None = None

    # -- arguments ------------------------------------------------------------------------------
    def arg(self, a: Any) -> Any:
        """An argument with its tensors replaced by the nodes that made them."""
        if _is_tensor(a):
            node = self.node_of.get(id(a))
            if node is not None:
                return node
            name = self.attr_name.get(id(a))
            if name is None:
                raise ExtractionError(
                    f"a tensor of shape {list(a.shape)} used in forward was made neither from the inputs nor "
                    "by a recorded call, and is not a parameter or buffer (a plain tensor attribute?): register "
                    "it with register_buffer so extraction can see it")
            node = self.node_of[id(a)] = self.graph.get_attr(name)
            self.alive.append(a)
            return node
        if isinstance(a, torch.device) and a.type == "meta":
            return self.device_node()
        if type(a) is slice:
            return slice(self.arg(a.start), self.arg(a.stop), self.arg(a.step))
        if isinstance(a, torch.Size):
            return tuple(a)
        if isinstance(a, tuple):
            mapped = [self.arg(x) for x in a]
            return type(a)(*mapped) if hasattr(a, "_fields") else tuple(mapped)
        if isinstance(a, list):
            return [self.arg(x) for x in a]
        if isinstance(a, dict):
            return {k: self.arg(v) for k, v in a.items()}
        return a

    def device_node(self) -> torch.fx.Node:
        """The inputs' device as a node (``getattr(input_0, "device")``, as torch.fx records
        ``x.device``), for a device argument that reads meta here: the graph is interpreted on
        meta in fp32 but on a CUDA device at other precisions, and a literal meta would put that
        call's tensor apart from the others."""
        if self._device_node is None:
            first = next(n for n in self.graph.nodes if n.op == "placeholder")
            self._device_node = self.graph.call_function(builtins.getattr, (first, "device"))
        return self._device_node

    def check_known(self, args: Any) -> None:
        """Before a call runs: a tensor not on meta that no call made is a parameter or buffer
        (mapped), else a plain attribute, which fails here with the cure rather than with a
        device mismatch."""
        for t in tree_flatten(args)[0]:
            if _is_tensor(t) and t.device.type != "meta" and id(t) not in self.node_of:
                self.arg(t)

    def bind(self, node: torch.fx.Node, out: Any) -> None:
        """Map the output tensors of ``node`` to it (elements of tuples through getitem nodes)."""
        for path, t in _tensor_leaves(out):
            n = node
            for i in path:
                n = self.graph.call_function(operator.getitem, (n, i))
            self.node_of[id(t)] = n
            self.alive.append(t)

    # -- functions and methods -------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.in_leaf:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in _VALUE_READS and args and _is_tensor(args[0]):
            raise ValueDependentControlFlow(
                f"forward branches with if/while on a tensor's values ({name}() of a tensor of shape "
                f"{list(args[0].shape)}, e.g. `if x.sum() > 0:`); extraction sees shapes, never values: move the "
                "branch out of forward or make it depend on shapes or constant attributes")
        if name in _HOST_COPIES and args and _is_tensor(args[0]) and args[0].device.type == "meta":
            args, kwargs = _without_local_devices(args, kwargs)
            if len(args) == 1 and not kwargs:
                return args[0]  # a copy to where the tensor is: nothing to record
        func = _PACKING_ON_META.get(name, func)
        self.check_known((args, kwargs))
        # the call's own insides (a decomposition's operators, a Python function's tensor
        # arithmetic) are part of this one node, not nodes of their own
        self.in_leaf += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.in_leaf -= 1
        if name in _NO_NODE_METHODS or not _tensor_leaves(out):
            return out  # shapes, sizes, flags: plain values, as fx's interpretation makes them
        getter = getattr(func, "__self__", None)
        if name == "__get__" and getter is not None:  # a property (x.T, x.mT, x.data)
            node = self.graph.call_function(builtins.getattr, (self.arg(args[0]), getter.__name__))
        elif _is_tensor_method(func):
            node = self.graph.call_method(name, tuple(self.arg(x) for x in args), self.arg(kwargs))
        else:
            node = self.graph.call_function(func, tuple(self.arg(x) for x in args), self.arg(kwargs))
        self.bind(node, out)
        return out


_HOST_COPIES = frozenset({"cpu", "to"})


def _without_local_devices(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """``x.cpu()`` / ``x.to(...)`` of a meta tensor without the host or meta devices it names.

    Forward code copies sequence lengths to the host before packing (``pack_padded_sequence``
    wants them there), and moves tensors to ``other.device``, which is meta while recording: on
    meta tensors those copies have nothing to copy (the real host copy is a small transfer, not a
    kernel), and a graph that named the meta device would put its tensors there when it is
    interpreted at a precision on a CUDA device (gpurec.ops.extract._Precise).  A dtype is kept."""
    def local(a: Any) -> bool:
        if isinstance(a, torch.device):
            return a.type in ("cpu", "meta")
        return isinstance(a, str) and a.split(":")[0] in ("cpu", "meta")

    rest = tuple(a for a in args[1:] if not local(a))
    return (args[0], *rest), {k: v for k, v in kwargs.items() if not (k == "device" and local(v))}


def pack_padded_sequence(input: torch.Tensor, lengths: torch.Tensor, batch_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's packing kernel (``_VF._pack_padded_sequence``) while recording on meta tensors.

    Lengths are values, which extraction never sees, so every sequence is taken at the padded
    length (gpurec.PackedSequenceWarning says so; not a bound: cuDNN's packed path with shorter
    sequences measured slower in training than at full length, DEVELOPERS session 37).  The
    data is kept time-major, ``(steps, batch, features)``, not flattened, so that a recurrent
    layer fed it is recorded as the same layer on the padded tensor (_packed_recurrent)."""
    x = input.transpose(0, 1) if batch_first else input
    steps, batch = int(x.shape[0]), int(x.shape[1])
    return x.contiguous(), torch.full((steps,), batch, dtype=torch.int64)  # on the host, as torch keeps it


def pad_packed_sequence(data: torch.Tensor, batch_sizes: torch.Tensor, batch_first: bool, padding_value: float,
                        total_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's unpacking kernel (``_VF._pad_packed_sequence``) on pack_padded_sequence's data:
    padded to ``total_length`` steps, every sequence at the padded length."""
    if data.dim() != 3:
        raise ExtractionError("pad_packed_sequence of a PackedSequence whose data was reshaped after packing: "
                              "extraction keeps packed data as the padded (steps, batch, features) tensor, so "
                              "unpack what pack_padded_sequence or the recurrent layer returned")
    steps, batch = int(data.shape[0]), int(data.shape[1])
    if total_length > steps:
        data = torch.nn.functional.pad(data, (0, 0, 0, 0, 0, total_length - steps), value=padding_value)
    out = data.transpose(0, 1) if batch_first else data
    return out.contiguous(), torch.full((batch,), steps, dtype=torch.int64)  # on the host, as torch returns them


_PACKING_ON_META = {"_pack_padded_sequence": pack_padded_sequence, "_pad_packed_sequence": pad_packed_sequence}


def _is_tensor_method(func: Any) -> bool:
    name = getattr(func, "__name__", None)
    return name is not None and getattr(torch.Tensor, name, None) is func


def record(root: nn.Module, inputs: list[torch.Tensor]) -> _Traced:
    """``root``'s forward on ``inputs`` (meta tensors) as the fx graph torch.fx would have traced.

    ``root``'s parameters and buffers are swapped to meta while it runs (put back after); its
    train/eval flags are the caller's.  Raises ValueDependentControlFlow for a branch on tensor
    values and ExtractionError for anything else the forward cannot do on these inputs."""
    from gpurec.ops.extract import _Wrap1, _Wrap2, _Wrap3

    if _wrapped_as_root(root):
        wrappers = {1: _Wrap1, 2: _Wrap2, 3: _Wrap3}
        if len(inputs) not in wrappers:
            raise ExtractionError(f"{type(root).__name__} takes at most 3 example inputs here, got {len(inputs)}")
        root = wrappers[len(inputs)](root)
    leaf_rule = _Tracer()
    original_call = nn.Module.__call__
    with _swapped_to_meta(root):
        rec = _Recorder(root)
        rec.graph.checkpoints.stop = sys._getframe()  # a checkpoint around the extraction is not the model's
        placeholders = [rec.graph.placeholder(f"input_{i}") for i in range(len(inputs))]
        for node, t in zip(placeholders, inputs, strict=True):
            rec.node_of[id(t)] = node
            rec.alive.append(t)

        def call(mod: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if rec.in_leaf or mod is root:
                return original_call(mod, *args, **kwargs)
            decomposition = _DECOMPOSITIONS.get(type(mod))
            if decomposition is not None:
                return decomposition(mod, *args, **kwargs)
            path = rec.paths.get(id(mod))
            if path is None or not leaf_rule.is_leaf_module(mod, path):
                return original_call(mod, *args, **kwargs)
            if isinstance(mod, _RECURRENT) and args and isinstance(args[0], PackedSequence):
                return _packed_recurrent(rec, mod, path, args, kwargs, original_call)
            node = rec.graph.call_module(path, rec.arg(args), rec.arg(kwargs))
            rec.in_leaf += 1
            try:
                known = _analytic_recurrent(mod, args, kwargs) if isinstance(mod, _RECURRENT) else None
                out = known[0] if known is not None else original_call(mod, *args, **kwargs)
            finally:
                rec.in_leaf -= 1
            rec.bind(node, out)
            return out

        nn.Module.__call__ = call  # type: ignore[method-assign]
        own_attrs = set(torch.Tensor.__dict__)
        saved = _patch_operators(rec)
        requests: list[tuple[str, torch.dtype, bool]] = []
        try:
            # a torch.autocast that forward enters becomes the same marker nodes torch.fx's trace holds
            with _recording_autocast(lambda target, args: rec.graph.call_function(target, args), requests,
                                     lambda: not rec.in_leaf), rec:
                out = root(*inputs)
        except ExtractionError:
            raise
        except Exception as exc:
            if "meta" in str(exc) and ("item" in str(exc) or "data-dependent" in str(exc)):
                raise ValueDependentControlFlow(
                    f"forward branches with if/while on a tensor's values, unknown on meta tensors ({str(exc).splitlines()[0][:160]}): extraction "
                    "sees shapes, never values") from exc
            raise ExtractionError(f"{type(root).__name__} could not run on meta inputs: "
                                  f"{str(exc).splitlines()[0][:200]}") from exc
        finally:
            nn.Module.__call__ = original_call  # type: ignore[method-assign]
            rec.graph.checkpoints.frames.clear()  # the calls' frames, and what they hold, go with them
            for attr, value in saved.items():
                if attr in own_attrs:
                    setattr(torch.Tensor, attr, value)
                else:  # inherited from the C base class: remove the patch, do not shadow it
                    delattr(torch.Tensor, attr)
        rec.graph.output(_map_out(rec, out))
    return _Traced(root, rec.graph, tuple(requests))


def _packed_recurrent(rec: _Recorder, mod: nn.Module, path: str, args: Any, kwargs: Any,
                      original_call: Any) -> Any:
    """An LSTM, GRU or RNN fed a PackedSequence, recorded as the same layer called on the padded
    tensor that pack_padded_sequence's stand-in holds (made batch-first by a view where the layer
    is), so it has the operation, features and measured rows of a padded call; its output is
    packed again the same way for the code after it."""
    packed = args[0]
    data = packed.data
    if data.dim() != 3:
        raise ExtractionError(f"{type(mod).__name__} fed a PackedSequence whose data was reshaped after packing: "
                              "extraction keeps packed data as the padded (steps, batch, features) tensor, so pass "
                              "the layer what pack_padded_sequence inside forward returned")
    warnings.warn(f"{type(mod).__name__} ({path}) runs on a packed sequence: lengths are values, which extraction "
                  f"never sees, so it is estimated as if every sequence had the padded length {int(data.shape[0])} "
                  "(cuDNN's packed path can take longer than that with shorter sequences)", PackedSequenceWarning,
                  stacklevel=4)
    x = data.transpose(0, 1) if mod.batch_first else data  # a view, recorded as the forward's own calls are
    node = rec.graph.call_module(path, rec.arg((x, *args[1:])), rec.arg(kwargs))
    rec.in_leaf += 1
    try:
        known = _analytic_recurrent(mod, (x, *args[1:]), kwargs)
        out = known[0] if known is not None else original_call(mod, x, *args[1:], **kwargs)
    finally:
        rec.in_leaf -= 1
    rec.bind(node, out)
    y, hidden = out
    return packed._replace(data=y.transpose(0, 1) if mod.batch_first else y), hidden


def _patch_operators(rec: _Recorder) -> dict[str, Any]:
    """Tensor's operator methods replaced by recording ones (a TorchFunctionMode sees ``x + y``
    and ``x.add(y)`` as the same call, and ``2 * x`` as ``x.mul(2)``; torch.fx records
    operator.add, call_method add and operator.mul(2, x)).  Returns the originals to restore."""
    saved: dict[str, Any] = {}

    def recording(attr: str, target: Any, run: Any, swap: bool) -> Any:
        def method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if rec.in_leaf:
                return run(self, *args, **kwargs)
            rec.check_known((self, *args))
            rec.in_leaf += 1
            try:
                out = run(self, *args, **kwargs)
            finally:
                rec.in_leaf -= 1
            if out is NotImplemented or not _tensor_leaves(out):
                return out
            operands = (args[0], self) if swap and args else (self, *args)
            rec.bind(rec.graph.call_function(target, tuple(rec.arg(x) for x in operands), rec.arg(kwargs)), out)
            return out

        method.__name__ = attr
        return method

    def patch(attr: str, target: Any, run: Any, swap: bool = False) -> None:
        if attr in saved or not hasattr(torch.Tensor, attr):
            return
        saved[attr] = torch.Tensor.__dict__.get(attr, getattr(torch.Tensor, attr))
        setattr(torch.Tensor, attr, recording(attr, target, run, swap))

    for m in _FX_MAGIC:
        target, own = getattr(operator, m, None), getattr(torch.Tensor, f"__{m.strip('_')}__", None)
        if target is not None and own is not None:
            patch(f"__{m.strip('_')}__", target, own)
    for m in _FX_REFLECTABLE:
        target, reflected = getattr(operator, m, None), getattr(torch.Tensor, f"__r{m.strip('_')}__", None)
        if target is not None and reflected is not None:
            patch(f"__r{m.strip('_')}__", target, reflected, swap=True)
    for m in _IN_PLACE:
        target, forward = getattr(operator, m, None), saved.get(f"__{m.strip('_')}__")
        if target is not None and forward is not None:
            patch(f"__i{m.strip('_')}__", target, forward)
    return saved


def _map_out(rec: _Recorder, out: Any) -> Any:
    if _is_tensor(out):
        return rec.node_of.get(id(out))
    if isinstance(out, (tuple, list)):
        return type(out)(_map_out(rec, v) for v in out) if not hasattr(out, "_fields") else \
            type(out)(*(_map_out(rec, v) for v in out))
    if isinstance(out, dict):
        return {k: _map_out(rec, v) for k, v in out.items()}
    return None
