"""Turn a torchvision name or any ``nn.Module`` plus an input shape into operations.

An *operation* is one layer type with its settings applied to one input shape and dtype.
We trace with ``torch.fx`` (leaf modules stay whole, so operation identity is at module /
function level, never ATen decompositions), then interpret the graph on the ``meta``
device: shapes propagate without allocating activations, and a dispatch mode attributes
FlopCounterMode's matmul/convolution/attention counts to the node that issued them.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import gc
import keyword
import math
import numbers
import operator
import re
import string
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from gpurec.ops.memory import contiguous_strides
from gpurec.ops.operation import GRAD_ASSEMBLING_VIEWS, ActRef, Operation, ParamRef, canonical_value
from gpurec.ops.precision import (
    CAST,
    DEFAULT_PRECISION,
    MIXED,
    PrecisionMismatch,
    check_precision,
    low_dtype,
    resolve_precision,
)
from gpurec.sets import MODES, SEQ_DATASET_ARCHS, SEQ_TEST_ARCHS, is_sequence_arch

# Graph nodes that are pure Python bookkeeping (no kernel, no data movement).
_DROP_FUNCTIONS = {
    getattr,
    torch._assert,
    torch.Tensor.size,
    torch.Tensor.dim,
}
_DROP_METHODS = {"size", "dim", "numel", "__len__"}
_EVAL_NOOPS: tuple[type, ...] = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                                 nn.FeatureAlphaDropout)
# Functional dropouts: (position of the ``training`` argument, its name, its default).  With
# training=False they return their input unchanged, like a dropout module in eval.
_DROPOUT_FUNCTIONS: dict[Any, tuple[int, str, bool]] = {
    nn.functional.dropout: (2, "training", True),
    nn.functional.dropout1d: (2, "training", True),
    nn.functional.dropout2d: (2, "training", True),
    nn.functional.dropout3d: (2, "training", True),
    nn.functional.alpha_dropout: (2, "training", False),
    nn.functional.feature_alpha_dropout: (2, "training", False),
    torch.dropout: (2, "train", True),
}


def _is_disabled_dropout(target: Any, args: Any, kwargs: Any) -> bool:
    """A functional dropout called with training=False (e.g. ``F.dropout(x, p, self.training)`` in eval)."""
    spec = _DROPOUT_FUNCTIONS.get(target) if callable(target) else None
    if spec is None:
        return False
    pos, name, default = spec
    if isinstance(kwargs, dict) and name in kwargs:
        flag = kwargs[name]
    elif isinstance(args, (tuple, list)) and len(args) > pos:
        flag = args[pos]
    else:
        flag = default
    return isinstance(flag, bool) and not flag


class ExtractionError(ValueError):
    """The model could not be turned into operations (bad name, bad input, untraceable)."""


class NoOperations(ExtractionError):
    """The module runs no operation on its input (``nn.Identity``, an empty ``nn.Sequential``):
    there is no GPU work to estimate, and 0 ms would read as a measurement."""


class UnknownModel(ExtractionError):
    """Model name not in torchvision's classification models."""


class TorchvisionUnusable(ExtractionError):
    """torchvision is installed but does not load with this torch: most often a pair from two
    package indexes (a CPU-only torch beside a CUDA torchvision), whose compiled operators fail."""


# torchvision release -> the torch release it is built against (the range gpurec supports)
TORCHVISION_FOR_TORCH = {"2.11": "0.26", "2.12": "0.27", "2.13": "0.28", "2.14": "0.29"}


def torchvision_models() -> Any:
    """``torchvision.models``, or TorchvisionUnusable saying how to install a matching pair."""
    import importlib

    try:
        return importlib.import_module("torchvision.models")
    except (ImportError, RuntimeError, OSError) as exc:
        raise TorchvisionUnusable(_torchvision_fix(exc)) from exc


def _torchvision_fix(exc: BaseException) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        have = version("torchvision")
    except PackageNotFoundError:
        have = None
    minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    want = TORCHVISION_FOR_TORCH.get(minor)
    pair = f"'torch=={torch.__version__.split('+')[0]}' 'torchvision=={want}.*'" if want else \
        "a torch and torchvision release of one date"
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    return (("torchvision is not installed" if have is None else
             f"torchvision {have} does not load with torch {torch.__version__} ({first})")
            + f"; install the two as a matching pair from one index, e.g. `pip install --index-url "
              f"https://download.pytorch.org/whl/cpu {pair}` (drop --index-url for the CUDA build)")


def classification_models() -> list[str]:
    """The torchvision classification model names (80 in torchvision 0.26-0.29)."""
    tvm = torchvision_models()
    return sorted(tvm.list_models(module=tvm))


@functools.lru_cache(maxsize=1)
def _leaf_types() -> tuple[type, ...]:
    types: list[type] = []
    try:
        from torchvision.ops import StochasticDepth

        types.append(StochasticDepth)
    except Exception:  # pragma: no cover - older torchvision
        pass
    return tuple(types)


@functools.cache
def _checkpoint_code() -> Any:
    """The code of torch.utils.checkpoint.checkpoint under its decorators (checkpoint_sequential and
    checkpoint wrappers call it): both of its ways (reentrant or not) run the region's function
    inside it, so a frame of it above the tracer means that the operation is checkpointed."""
    import inspect

    from torch.utils import checkpoint

    return inspect.unwrap(checkpoint.checkpoint).__code__


def checkpoint_frame(stop: Any = None) -> Any:
    """The outermost torch.utils.checkpoint.checkpoint call the caller runs inside (its frame; None:
    none), looking up the Python stack no further than the frame ``stop`` (the trace's own: a
    checkpoint around the whole extraction is not the model's)."""
    code = _checkpoint_code()
    found = None
    frame = sys._getframe(1)
    while frame is not None and frame is not stop:
        if frame.f_code is code:  # by identity: a code object's hash reads its whole body
            found = frame
        frame = frame.f_back
    return found


class CheckpointRegions:
    """Numbers the checkpoint calls that a trace's nodes are made in, from 1 in the order met, and
    marks each such node's ``meta["checkpoint_region"]`` (Operation.checkpoint_region)."""

    def __init__(self) -> None:
        self.frames: list[Any] = []  # held, so that a finished call's frame is never taken for a new one
        self.stop: Any = None

    def mark(self, node: torch.fx.Node) -> None:
        frame = checkpoint_frame(self.stop)
        if frame is None:
            return
        for i, seen in enumerate(self.frames):
            if seen is frame:
                node.meta["checkpoint_region"] = i + 1
                return
        self.frames.append(frame)
        node.meta["checkpoint_region"] = len(self.frames)


class _Tracer(torch.fx.Tracer):
    """torch.nn modules (and StochasticDepth) are leaves; everything else is traced through.

    PyTorch's composite modules (Transformer layers and stacks) are traced through as the
    modules they call, with the slow-path forward written out in _DECOMPOSITIONS, as the
    blocks of torchvision's ViT are: their operations are MultiheadAttention, Linear,
    LayerNorm, dropout and additions, which the models know. Recurrent layers (nn.LSTM,
    nn.GRU, nn.RNN) stay whole, one operation each, as cuDNN runs them.
    """

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if isinstance(m, _leaf_types()):
            return True
        if isinstance(m, (nn.Sequential, nn.ModuleList, nn.ModuleDict)) or type(m) in _DECOMPOSITIONS:
            return False
        return type(m).__module__.startswith("torch.nn")

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        """torch.fx's call_module without its scope and module-stack bookkeeping, which only
        fills ``node.meta`` (unused here) and took a quarter of tracing a fresh candidate; the
        graph is the same (tests/test_extract_speed.py compares it with fx's own)."""
        decomposition = _DECOMPOSITIONS.get(type(m))
        if decomposition is not None:
            forward = functools.partial(decomposition, m)
        path = self.path_of_module(m)
        if not self.is_leaf_module(m, path):
            return forward(*args, **kwargs)
        return self.create_proxy("call_module", path, args, kwargs)

    def trace(self, root: Any, concrete_args: Any = None) -> torch.fx.Graph:
        """fx's trace; inside tracing_session() (this thread's), nn.Module's call and attribute
        lookup reach this tracer through the session's hooks instead of being patched on
        nn.Module and restored for this one trace (see tracing_session)."""
        self.checkpoints = CheckpointRegions()
        self.checkpoints.stop = sys._getframe()  # where the model's code ends
        session = _SESSION
        if session is None or session.thread != threading.get_ident():
            return super().trace(root, concrete_args)
        prior = session.tracer, session.parameter_proxies
        session.tracer, session.parameter_proxies = self, {}
        _patched_for_fx(True)  # fx's patcher leaves the hooks in place for this trace
        try:
            return super().trace(root, concrete_args)
        finally:
            _patched_for_fx(prior[0] is not None)
            session.tracer, session.parameter_proxies = prior

    checkpoints: CheckpointRegions | None = None  # trace() sets this trace's own

    def create_node(self, kind: str, target: Any, args: Any, kwargs: Any, name: str | None = None,
                    type_expr: Any = None) -> torch.fx.Node:
        """fx's node, with the activation-checkpointed region it is made in, if any
        (torch.utils.checkpoint: backward runs it again)."""
        node = self._lean_node(kind, target, args, kwargs, name, type_expr)
        if self.checkpoints is not None:
            self.checkpoints.mark(node)
        return node

    def _lean_node(self, kind: str, target: Any, args: Any, kwargs: Any, name: str | None = None,
                   type_expr: Any = None) -> torch.fx.Node:
        """fx's node creation without what extraction never reads: the scope table
        (``node_name_to_scope``) and Graph.create_node's scan of every argument for raw SymInts
        (arguments made here are proxies' nodes and constants, never symbolic values), together
        about a fifth of tracing a fresh candidate.  Same node, name and position in the graph
        (tests/test_extract_speed.py compares the graph with fx's own); fx's own path where it
        would do more (preserved node meta, mutation checks) or the graph lacks what this uses."""
        graph = self.graph
        if (self.check_mutable_operations or _preserved_node_meta() or type(graph) is not torch.fx.Graph
                or not _LEAN_GRAPH_ATTRS.issubset(vars(graph)) or graph.owning_module is not None):
            return super().create_node(kind, target, args, kwargs, name, type_expr)
        if name is not None:
            candidate = name
        else:  # fx's name for the target, a function of its name or path alone (snake-casing it was a tenth)
            named = (True, target.__name__) if callable(target) else (False, target)
            candidate = _TARGET_NAMES.get(named)
            if candidate is None:
                candidate = _TARGET_NAMES[named] = graph._target_to_str(target)
        name = graph._graph_namespace.create_name(candidate, None)
        node = torch.fx.Node(graph, name, kind, target, args or (), kwargs or _immutable_dict(), type_expr)
        graph._graph_namespace.associate_name_with_obj(name, node)
        graph._insert(node)
        graph._find_nodes_lookup_table.insert(node)
        graph._len += 1
        return node

    def create_arg(self, a: Any) -> Any:
        """The commonest arguments (proxies, plain tuples, scalars) without fx's chain of type
        checks for parameters, buffers, modules and opaque objects; the rest as fx does it."""
        t = type(a)
        if t is torch.fx.Proxy:
            return a.node
        if t is tuple:
            return tuple(self.create_arg(x) for x in a)
        if t in _PLAIN_ARGS or a is None:
            return a
        if t is dict and not a:
            return {}
        return super().create_arg(a)


_PLAIN_ARGS = frozenset({int, float, bool, str})
# What _Tracer.create_node uses of a Graph instance (torch 2.11 to 2.14 have them all).
_LEAN_GRAPH_ATTRS = frozenset({"_graph_namespace", "_insert", "_find_nodes_lookup_table", "_len"})
_immutable_dict = torch.fx.immutable_collections.immutable_dict
# Graph._target_to_str by (callable, name or path): module paths repeat across candidates
_TARGET_NAMES: dict[tuple[bool, str], str] = {}
_preserved_node_meta = torch.fx.traceback.has_preserved_node_meta


class _Session:
    """What tracing_session's hooks on nn.Module route to: the tracer tracing in ``thread``, if any."""

    def __init__(self, call: Any, getattr_: Any) -> None:
        self.thread = threading.get_ident()
        self.call, self.getattr = call, getattr_  # nn.Module's own, as they were on entering
        self.tracer: _Tracer | None = None
        self.parameter_proxies: dict[str, Any] = {}


_SESSION: _Session | None = None
_FX = torch.fx._symbolic_trace  # fx's module: its original nn.Module methods, patcher and autowrap check
# What the session's hooks use of torch.fx (torch 2.11 to 2.14 have them); without them there is no session.
_SESSION_NEEDS = ("_orig_module_call", "_orig_module_getattr", "_autowrap_check", "CURRENT_PATCHER")


def _session_call(mod: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """nn.Module.__call__ in a session: fx's module call wrapper for the session's tracer, else nn.Module's."""
    session = _SESSION
    tracer = session.tracer if session is not None and session.thread == threading.get_ident() else None
    if tracer is None:
        return (session.call if session is not None else _FX._orig_module_call)(mod, *args, **kwargs)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return _FX._orig_module_call(mod, *args, **kwargs)

    _FX._autowrap_check(_FX.CURRENT_PATCHER, getattr(getattr(mod, "forward", mod), "__globals__", {}),
                        tracer._autowrap_function_ids)
    return tracer.call_module(mod, forward, args, kwargs)


def _session_getattr(mod: nn.Module, attr: str) -> Any:
    """nn.Module.__getattr__ in a session: fx's getattr wrapper for the session's tracer, else nn.Module's."""
    session = _SESSION
    tracer = session.tracer if session is not None and session.thread == threading.get_ident() else None
    if tracer is None:
        return (session.getattr if session is not None else _FX._orig_module_getattr)(mod, attr)
    return tracer.getattr(attr, _FX._orig_module_getattr(mod, attr), session.parameter_proxies)


def _patched_for_fx(flag: bool) -> None:
    """fx's patcher leaves a method alone that carries this flag (it takes it for one of its own
    patches): set while a _Tracer traces in the session, so any other fx tracer (the hooks would
    not route to it) patches nn.Module over the hooks as it always does."""
    _session_call.__fx_already_patched = flag  # type: ignore[attr-defined]
    _session_getattr.__fx_already_patched = flag  # type: ignore[attr-defined]


@contextlib.contextmanager
def tracing_session() -> Any:
    """Trace many modules (predict_many's candidates) under one patch of nn.Module.

    torch.fx patches nn.Module.__call__ and __getattr__ for every trace and restores them after;
    each assignment to nn.Module updates every subclass in the process (about 1 ms each with
    ~600 of them: four per trace were a third of tracing a fresh candidate).  Here they are set
    once, to hooks that act as fx's wrappers for the _Tracer tracing in this thread and as
    nn.Module's own otherwise; fx sees them patched already and leaves them.  The graphs are
    fx's (tests/test_extract_speed.py).  Holds the extraction lock; nested sessions are one;
    without what the hooks use of torch.fx, a plain context."""
    global _SESSION
    with _EXTRACTION_LOCK:
        if _SESSION is not None or not all(hasattr(_FX, name) for name in _SESSION_NEEDS):
            yield
            return
        session = _Session(nn.Module.__call__, nn.Module.__getattr__)
        _SESSION = session
        nn.Module.__call__ = _session_call  # type: ignore[method-assign]
        nn.Module.__getattr__ = _session_getattr  # type: ignore[method-assign]
        try:
            yield
        finally:
            nn.Module.__call__ = session.call  # type: ignore[method-assign]
            nn.Module.__getattr__ = session.getattr  # type: ignore[method-assign]
            _SESSION = None


# -- composite modules written out as the modules they call (PyTorch's slow path) ---------------
def _encoder_layer(m: nn.TransformerEncoderLayer, src: Any, src_mask: Any = None, src_key_padding_mask: Any = None,
                   is_causal: bool = False) -> Any:
    x = src
    if m.norm_first:
        x = x + m._sa_block(m.norm1(x), src_mask, src_key_padding_mask, is_causal=is_causal)
        return x + m._ff_block(m.norm2(x))
    x = m.norm1(x + m._sa_block(x, src_mask, src_key_padding_mask, is_causal=is_causal))
    return m.norm2(x + m._ff_block(x))


def _decoder_layer(m: nn.TransformerDecoderLayer, tgt: Any, memory: Any, tgt_mask: Any = None,
                   memory_mask: Any = None, tgt_key_padding_mask: Any = None, memory_key_padding_mask: Any = None,
                   tgt_is_causal: bool = False, memory_is_causal: bool = False) -> Any:
    x = tgt
    if m.norm_first:
        x = x + m._sa_block(m.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
        x = x + m._mha_block(m.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
        return x + m._ff_block(m.norm3(x))
    x = m.norm1(x + m._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
    x = m.norm2(x + m._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
    return m.norm3(x + m._ff_block(x))


def _encoder(m: nn.TransformerEncoder, src: Any, mask: Any = None, src_key_padding_mask: Any = None,
             is_causal: bool | None = None) -> Any:
    x = src
    for layer in m.layers:
        x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
    return m.norm(x) if m.norm is not None else x


def _decoder(m: nn.TransformerDecoder, tgt: Any, memory: Any, tgt_mask: Any = None, memory_mask: Any = None,
             tgt_key_padding_mask: Any = None, memory_key_padding_mask: Any = None, tgt_is_causal: bool | None = None,
             memory_is_causal: bool = False) -> Any:
    x = tgt
    for layer in m.layers:
        x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask, tgt_key_padding_mask=tgt_key_padding_mask,
                  memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=bool(tgt_is_causal),
                  memory_is_causal=memory_is_causal)
    return m.norm(x) if m.norm is not None else x


def _transformer(m: nn.Transformer, src: Any, tgt: Any, src_mask: Any = None, tgt_mask: Any = None,
                 memory_mask: Any = None, src_key_padding_mask: Any = None, tgt_key_padding_mask: Any = None,
                 memory_key_padding_mask: Any = None, src_is_causal: bool | None = None,
                 tgt_is_causal: bool | None = None, memory_is_causal: bool = False) -> Any:
    memory = m.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
    return m.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                     tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                     tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)


# -- recurrent cells as ATen runs them on CUDA (aten/src/ATen/native/RNN.cpp, LSTMCell/GRUCell):
# the input and hidden products (matmuls) and one fused pointwise kernel that applies the gates; a
# step loop of cells is that many GEMM pairs and kernels.
def _one_kernel(fn: Any) -> Any:
    """``fn`` as a torch function of its own (positional tensor arguments, None for an absent one),
    so torch.fx and capture record each call as one node, one operation, not the calls inside it."""

    @functools.wraps(fn)
    def node(*args: Any) -> Any:
        relevant = tuple(a for a in args if a is not None)
        if torch.overrides.has_torch_function(relevant):
            return torch.overrides.handle_torch_function(node, relevant, *args)
        return fn(*args)

    return node


@_one_kernel
def fused_lstm_cell(igates: torch.Tensor, hgates: torch.Tensor, cx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten::_thnn_fused_lstm_cell``'s (hy, cy), the biases added by cell_linear already: one kernel."""
    i, f, g, o = (igates + hgates).chunk(4, -1)
    cy = f.sigmoid() * cx + i.sigmoid() * g.tanh()
    return o.sigmoid() * cy.tanh(), cy


@_one_kernel
def fused_gru_cell(igates: torch.Tensor, hgates: torch.Tensor, hx: torch.Tensor) -> torch.Tensor:
    """``aten::_thnn_fused_gru_cell``'s hy (see fused_lstm_cell)."""
    i_r, i_z, i_n = igates.chunk(3, -1)
    h_r, h_z, h_n = hgates.chunk(3, -1)
    z = (i_z + h_z).sigmoid()
    n = (i_n + (i_r + h_r).sigmoid() * h_n).tanh()
    return (1 - z) * n + z * hx


@_one_kernel
def cell_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """A cell's input or hidden product (ATen's matmul_ih / matmul_hh): a Linear layer's GEMM,
    predicted from Linear's rows (_cell_linear_settings).  The bias, which ATen adds in the fused
    pointwise kernel, is added here, in the GEMM's epilogue as nn.Linear adds it: the same reads
    and additions, and the pointwise kernel then holds no parameters, as the elementwise rows the
    models learnt from hold none."""
    return nn.functional.linear(input, weight, bias)


def _zero_state(m: nn.Module, input: Any) -> Any:
    return input.new_zeros(input.shape[:-1] + (m.hidden_size,))


def _lstm_cell(m: nn.LSTMCell, input: Any, hx: Any = None) -> Any:
    h, c = (_zero_state(m, input),) * 2 if hx is None else hx
    igates, hgates = cell_linear(input, m.weight_ih, m.bias_ih), cell_linear(h, m.weight_hh, m.bias_hh)
    return fused_lstm_cell(igates, hgates, c)


def _gru_cell(m: nn.GRUCell, input: Any, hx: Any = None) -> Any:
    h = _zero_state(m, input) if hx is None else hx
    igates, hgates = cell_linear(input, m.weight_ih, m.bias_ih), cell_linear(h, m.weight_hh, m.bias_hh)
    return fused_gru_cell(igates, hgates, h)


def _rnn_cell(m: nn.RNNCell, input: Any, hx: Any = None) -> Any:
    """ATen's rnn_tanh_cell / rnn_relu_cell: two biased linears, their sum and the activation."""
    h = _zero_state(m, input) if hx is None else hx
    pre = cell_linear(input, m.weight_ih, m.bias_ih) + cell_linear(h, m.weight_hh, m.bias_hh)
    return pre.tanh() if m.nonlinearity == "tanh" else pre.relu()


_DECOMPOSITIONS: dict[type, Any] = {
    nn.LSTMCell: _lstm_cell,
    nn.GRUCell: _gru_cell,
    nn.RNNCell: _rnn_cell,
    nn.TransformerEncoderLayer: _encoder_layer,
    nn.TransformerDecoderLayer: _decoder_layer,
    nn.TransformerEncoder: _encoder,
    nn.TransformerDecoder: _decoder,
    nn.Transformer: _transformer,
}
_RECURRENT: tuple[type[nn.Module], ...] = (nn.LSTM, nn.GRU, nn.RNN)


class _SkipMetaInit(TorchFunctionMode):
    """Weight initialisation (``nn.init`` and the in-place random and fill methods it calls) is
    skipped on meta tensors: they hold no values, so it changes nothing but took about 40% of
    building a torchvision model on meta (their meta kernels run as Python references).  The
    tensor is returned as the in-place call would return it; any other call runs as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func in _META_INIT_SKIPPED:
            # nn.init's own functions pass the tensor by keyword (handle_torch_function)
            tensor = args[0] if args else kwargs.get("tensor")
            if type(tensor) in (torch.Tensor, nn.Parameter) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


@functools.cache
def _meta_init_functions() -> frozenset[Any]:
    names = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
             "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")
    methods = ("normal_", "uniform_", "fill_", "zero_", "random_", "exponential_", "log_normal_", "cauchy_",
               "geometric_", "bernoulli_")
    return frozenset([getattr(nn.init, n) for n in names if hasattr(nn.init, n)]
                     + [getattr(torch.Tensor, n) for n in methods if hasattr(torch.Tensor, n)])


@contextlib.contextmanager
def _building_on_meta() -> Any:
    """Modules built inside are on meta, without weight initialisation (_SkipMetaInit)."""
    global _META_INIT_SKIPPED
    _META_INIT_SKIPPED = _meta_init_functions()
    with torch.device("meta"), _SkipMetaInit():
        yield


_META_INIT_SKIPPED: frozenset[Any] = frozenset()
# torchvision names that cannot be built on meta (built on CPU, then moved): see _build_meta
_CPU_BUILT: set[str] = set()


def _build_meta(name: str) -> nn.Module:
    """A new meta instance of a torchvision (or gpurec.synthsets) model, not cached."""
    from gpurec.synthsets import SYNTH_BUILDERS, build_synthetic

    if name in SYNTH_BUILDERS:  # the hand-written architectures of gpurec.sets (SYNTH/SWEEP_ARCHS)
        with _building_on_meta():
            return build_synthetic(name)
    tvm = torchvision_models()
    kwargs: dict[str, Any] = {"weights": None}
    if name in ("googlenet", "inception_v3"):
        kwargs["init_weights"] = False
    if name not in _CPU_BUILT:
        try:
            with _building_on_meta():
                return tvm.get_model(name, **kwargs)
        except Exception:
            _CPU_BUILT.add(name)
    # RegNets (and anything else that initialises with data-dependent ops) cannot be
    # built under the meta device: build on CPU, then move.
    return tvm.get_model(name, **kwargs).to("meta")


@functools.lru_cache(maxsize=64)
def _build_torchvision_meta(name: str) -> nn.Module:
    """The meta model of ``name``, built once (copy it before changing it)."""
    return _build_meta(name)


def _fresh_meta(name: str) -> nn.Module:
    """A meta model of ``name`` of one's own: built anew where it builds on meta (cheaper than a
    deep copy of the cached one, with initialisation skipped), else a copy of the cached one."""
    if name in _CPU_BUILT:
        return copy.deepcopy(_build_torchvision_meta(name))
    return _build_meta(name)


def resolve_model(model: str | nn.Module) -> tuple[str, nn.Module]:
    """Return (display name, a meta-device copy of the module)."""
    if isinstance(model, nn.Module):
        name = type(model).__name__
        try:
            meta = _meta_copy(model)
        except Exception:
            meta = model
        return name, meta
    if not isinstance(model, str):
        raise ExtractionError(f"model must be a torchvision model name or an nn.Module, not {type(model).__name__}")
    name = _check_name(model)
    if is_sequence_arch(name):
        from gpurec import seqmodels

        with _building_on_meta():
            return name, seqmodels.build(name)
    return name, _fresh_meta(name)


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    """An empty meta tensor of ``t``'s shape and dtype; a Parameter (same requires_grad) for one."""
    m = torch.empty(t.shape, dtype=t.dtype, device="meta")
    return nn.Parameter(m, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else m


def _meta_copy(model: nn.Module) -> nn.Module:
    """A structural copy whose parameters and buffers live on meta (no weight data copied)."""
    memo: dict[int, Any] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in memo:
            memo[id(t)] = _meta_like(t)
    return copy.deepcopy(model, memo)


@contextlib.contextmanager
def _swapped_to_meta(root: nn.Module) -> Any:
    """Swap every parameter and buffer reachable from ``root`` for a meta tensor of the same
    shape, dtype and requires_grad, and put the originals back on exit (also on errors).

    Why: extraction only needs shapes, and deep-copying a fresh module took about a third of
    its extraction time (neural-architecture-search loops pass fresh modules).  Tied tensors stay tied.
    Tensors that a module keeps as plain attributes are not swapped (as in _meta_copy).  The
    caller's module is changed while this is active: not for a module another thread is using.
    """
    with _swapped_tensors(root, _meta_like, keep_meta=True):
        yield root


@contextlib.contextmanager
def _gc_paused() -> Any:
    """Python's cyclic garbage collector off for the duration (back on after, if it was on).

    Why: tracing and interpreting allocate many small objects, which set off collections
    that scan every object of the process, which is large in a NAS loop holding candidate
    modules.  The cycles made here are collected once it is back on.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _in_mode(root: nn.Module, training: bool) -> Any:
    """``root.train(training)`` for the duration, then every submodule's own flag restored.

    Where no class in the tree overrides ``train`` or ``__setattr__`` (so ``train`` only sets
    the flags), the flags that differ are set directly: nn.Module.__setattr__ on ~130 modules
    both ways was a few per cent of a fresh candidate's extraction."""
    flags = [(m, m.training) for m in root.modules()]
    if not all(type(m).train is nn.Module.train and type(m).__setattr__ is nn.Module.__setattr__ for m, _ in flags):
        root.train(training)
        try:
            yield root
        finally:
            for m, flag in flags:
                m.training = flag
        return
    changed = [(m, flag) for m, flag in flags if flag != training]
    for m, _ in changed:
        object.__setattr__(m, "training", training)
    try:
        yield root
    finally:
        for m, flag in changed:
            object.__setattr__(m, "training", flag)


def _check_name(model: str) -> str:
    from gpurec.ops.names import unknown_model_message

    if is_sequence_arch(model):
        return model
    message = unknown_model_message(model, _model_names())
    if message is not None:
        raise UnknownModel(message)
    return model


@functools.lru_cache(maxsize=1)
def _model_names() -> tuple[str, ...]:
    from gpurec.synthsets import SYNTH_BUILDERS

    return (*classification_models(), *SYNTH_BUILDERS, *SEQ_DATASET_ARCHS, *SEQ_TEST_ARCHS)


@dataclasses.dataclass(frozen=True)
class _Traced:
    """A traced forward: the fx graph and the module whose paths its nodes name.

    Not a torch.fx.GraphModule: building one copies the module tree and compiles Python code
    for a forward that extraction never calls.
    """

    root: nn.Module
    graph: torch.fx.Graph
    # (device_type, dtype, enabled) of every torch.autocast its forward enters (marker nodes)
    autocast: tuple[tuple[str, torch.dtype, bool], ...] = ()
    # the root is gpurec's own (a model built by name), which nothing changes once traced
    owned: bool = False

    def modules(self) -> dict[str, nn.Module]:
        """``dict(root.named_modules())``, listed once per trace: a named model's trace is
        interpreted again at every new input shape, and listing its modules each time was a few
        per cent of that (nothing changes the module tree of a trace)."""
        listed = self.__dict__.get("_modules")
        if listed is None:
            listed = self.__dict__["_modules"] = dict(self.root.named_modules())
        return listed


@functools.lru_cache(maxsize=64)
def _trace_torchvision(name: str, training: bool) -> _Traced:
    if is_sequence_arch(name):
        from gpurec import seqmodels

        with _building_on_meta():
            root = seqmodels.build(name)
    else:
        root = _fresh_meta(name)
    root.train(training)
    return dataclasses.replace(_trace(root), owned=True)


class _Wrap1(nn.Module):
    """Holds a composite or recurrent module that is traced as the network itself (its own
    forward cannot be traced; called as a submodule it is decomposed or unrolled)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Any) -> Any:
        return self.inner(x)


class _Wrap2(_Wrap1):
    def forward(self, x: Any, y: Any) -> Any:  # type: ignore[override]
        return self.inner(x, y)


class _Wrap3(_Wrap1):
    def forward(self, x: Any, y: Any, z: Any) -> Any:  # type: ignore[override]
        return self.inner(x, y, z)


def _wrapped_as_root(root: nn.Module) -> bool:
    """A root module that is traced inside a wrapper (_Wrap1-3), so that it is handled as it is
    as a child: written out (_DECOMPOSITIONS), or kept whole (recurrent layers, parametrized modules)."""
    return type(root) in _DECOMPOSITIONS or isinstance(root, _RECURRENT) or _is_parametrized(root)


def _trace(root: nn.Module, n_inputs: int = 1) -> _Traced:
    if _wrapped_as_root(root):
        wrappers = {1: _Wrap1, 2: _Wrap2, 3: _Wrap3}
        if n_inputs not in wrappers:
            raise ExtractionError(f"{type(root).__name__} takes at most 3 example inputs here, got {n_inputs}")
        root = wrappers[n_inputs](root)
    tracer = _Tracer()
    requests: list[tuple[str, torch.dtype, bool]] = []
    try:
        with _recording_autocast(lambda target, args: tracer.create_proxy("call_function", target, args, {}),
                                 requests):
            graph = tracer.trace(root)
    except Exception as exc:
        hint = ""
        if "control flow" in str(exc):
            hint = (" (forward branches with if/while on a tensor or its shape; extraction sees shapes, never "
                    "values: move the branch out of forward or make it a constant attribute)")
        raise _TraceFailed(f"torch.fx could not trace {type(root).__name__}: {exc}{hint}") from exc
    return _Traced(root, graph, tuple(requests))


def _autocast_enter(device_type: str, dtype: torch.dtype, enabled: bool) -> None:
    """Graph marker: forward enters ``torch.autocast(device_type, dtype, enabled)`` here
    (recorded by _recording_autocast, acted on by _interpret; does nothing if called)."""


def _autocast_exit() -> None:
    """Graph marker: forward leaves its innermost torch.autocast here."""


_AUTOCAST_MARKERS = frozenset({_autocast_enter, _autocast_exit})


@contextlib.contextmanager
def _recording_autocast(emit: Callable[[Any, tuple[Any, ...]], Any], requests: list[tuple[str, torch.dtype, bool]],
                        recording: Callable[[], bool] = lambda: True) -> Any:
    """While forward is traced (``emit(target, args)`` adds a call_function node: torch.fx's
    tracer, or gpurec.ops.capture's recorder) on this thread, a ``torch.autocast`` entered or
    left inside forward becomes a marker node (and its request is appended to ``requests``)
    instead of switching autocast at trace time, which fx would do and then forget: the graph
    would hold no trace of it.  The request is taken as written, before torch.autocast disables
    a CUDA autocast on a machine without CUDA.  An autocast made while ``recording()`` is false
    (inside a leaf module the recorder runs) and other threads see torch.autocast unchanged;
    restored on exit."""
    cls = torch.amp.autocast_mode.autocast
    init, enter, leave = cls.__init__, cls.__enter__, cls.__exit__
    me = threading.get_ident()

    def rec_init(self: Any, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        self._gpurec_marker = threading.get_ident() == me and recording()
        if not self._gpurec_marker:
            return init(self, device_type, dtype, enabled, cache_enabled)
        self.device = device_type
        self.fast_dtype = torch.get_autocast_dtype(device_type) if dtype is None else dtype
        self._enabled = bool(enabled)
        self._cache_enabled = cache_enabled
        return None

    def marker(self: Any) -> bool:  # made before the patch: decided where it is entered
        made = getattr(self, "_gpurec_marker", None)
        return threading.get_ident() == me and recording() if made is None else made

    def rec_enter(self: Any) -> Any:
        if not marker(self):
            return enter(self)
        request = (str(self.device), self.fast_dtype, bool(self._enabled))
        requests.append(request)
        emit(_autocast_enter, request)
        return self

    def rec_exit(self: Any, *exc: Any) -> Any:
        if not marker(self):
            return leave(self, *exc)
        emit(_autocast_exit, ())
        return False

    cls.__init__, cls.__enter__, cls.__exit__ = rec_init, rec_enter, rec_exit
    try:
        yield
    finally:
        cls.__init__, cls.__enter__, cls.__exit__ = init, enter, leave


class _TraceFailed(ExtractionError):
    """torch.fx could not trace the forward (the capture on concrete shapes may still)."""


def _trace_or_record(root: nn.Module, inputs: list[torch.Tensor]) -> _Traced:
    """torch.fx's graph of ``root``, or, where fx fails (Python that uses a shape as a number),
    the same graph recorded while forward runs on the meta ``inputs`` (gpurec.ops.capture).
    The fallback runs only then: tracing stays the fast path."""
    try:
        return _trace(root, len(inputs))
    except _TraceFailed as fx_failed:
        from gpurec.ops.capture import ValueDependentControlFlow, record

        try:
            return record(root, inputs)
        except ValueDependentControlFlow:
            raise
        except ExtractionError as exc:
            raise ExtractionError(f"{fx_failed}; running forward on meta tensors failed too: {exc}") from exc


# --------------------------------------------------------------------------------------------
# Interpretation on meta with per-node FLOP attribution
# --------------------------------------------------------------------------------------------


class _NodeFlops(TorchDispatchMode):
    """Adds FlopCounterMode's formula counts of every ATen call to ``self.current``."""

    def __init__(self) -> None:
        super().__init__()
        from torch.utils.flop_counter import flop_registry

        self.registry = flop_registry
        self.current = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in self.registry:
            self.current += int(self.registry[packet](*args, **kwargs, out_val=out))
        return out


class _NodeTrace(_NodeFlops):
    """_NodeFlops that also records what precision needs: each dtype-changing copy (the casts
    autocast inserts reach the dispatch modes as ``_to_copy``, below the autocast key, so these
    are torch's own decisions) and which ATen operators ran."""

    def __init__(self) -> None:
        super().__init__()
        self.casts: list[tuple[torch.Tensor, torch.dtype]] = []
        self.packets: set[Any] = set()

    def reset(self) -> None:
        self.current = 0
        self.casts = []
        self.packets = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        packet = func._overloadpacket
        self.packets.add(packet)
        if packet is torch.ops.aten._to_copy and args and _is_tensor(args[0]):
            to = kwargs.get("dtype")
            if to is not None and to != args[0].dtype:
                self.casts.append((args[0], to))
        return super().__torch_dispatch__(func, types, args, kwargs)


# Operations whose output never carries a gradient, whatever their input does.
_GRADIENT_STOPS = frozenset({"detach", "detach_"})


def _is_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


# Functional calls that launch the kernel of a torch.nn module, named as that module: timm's norm-act
# layers call F.batch_norm, squeeze-excite gates x.sigmoid(), so a user's network of them is predicted
# from the measured rows of those modules' kinds instead of as an unknown kind.  Only names that no
# measured row or plan holds in functional form (their module twins are in the data); kinds whose
# features read module settings (a convolution's kernel, a pool's window) keep their own name.
_MODULE_TWINS: dict[str, str] = {"sigmoid": "Sigmoid", "silu": "SiLU", "hardsigmoid": "Hardsigmoid",
                                 "hardswish": "Hardswish", "relu6": "ReLU6", "dropout": "Dropout",
                                 "rms_norm": "LayerNorm"}
# Modules that run another module's kernels: on CUDA, torch (2.11, as on the GPU machines) runs
# nn.RMSNorm through LayerNorm's own kernel templates with their RMS flag set (forward,
# grad-input and gamma backward; the profiler names them, datasets/probes/norm_kernels_h200.json),
# so LayerNorm's rows predict it (RMSNorm measured 0.75x LayerNorm's time in inference and 0.91x
# in training there: it skips the mean).
_KERNEL_TWINS: dict[str, str] = {"RMSNorm": "LayerNorm"}
_BATCH_NORM_BY_RANK: dict[int, str] = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d", 5: "BatchNorm3d"}


# 1-D convolutions and pools run as their 2-D kernels over a height-1 image: ATen views a 3-D
# convolution input and weight as 4-D before cuDNN sees them (at::_convolution, view1d_as_2d), and
# on CUDA max_pool1d, avg_pool1d and the adaptive ones are the 2-D pools of x.unsqueeze(-2).  So
# they are predicted from the 2-D kinds' rows, as the operation the GPU runs.
_HEIGHT_ONE_TWINS: dict[str, str] = {"Conv1d": "Conv2d", "MaxPool1d": "MaxPool2d", "AvgPool1d": "AvgPool2d",
                                     "AdaptiveAvgPool1d": "AdaptiveAvgPool2d",
                                     "AdaptiveMaxPool1d": "AdaptiveMaxPool2d"}
# each 1-D setting's value along the added height dimension (a kernel, stride or output of 1, no padding)
_HEIGHT_ONE_SETTINGS = {"kernel_size": 1, "stride": 1, "dilation": 1, "padding": 0, "output_padding": 0,
                        "output_size": 1}


def _as_height_one(op: Operation) -> None:
    """``op``, a batched 1-D convolution or pool, made the 2-D operation of height 1 it runs as
    (_HEIGHT_ONE_TWINS): kind, settings, parameter and activation shapes; FLOPs and bytes are the same."""
    if len(op.input_shapes[0]) != 3:
        return  # unbatched input: left as it is
    settings = dict(op.settings)
    for key, height in _HEIGHT_ONE_SETTINGS.items():
        value = settings.get(key)
        if isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool):
            settings[key] = [height, value]
    weight = settings.get("param_shapes", {}).get("weight")
    if weight is not None and len(weight) == 3:
        settings["param_shapes"] = {**settings["param_shapes"], "weight": [weight[0], weight[1], 1, weight[2]]}
    op.kind = _HEIGHT_ONE_TWINS[op.kind]
    op.settings = settings
    op.input_shapes = [[*s[:2], 1, *s[2:]] if len(s) == 3 else s for s in op.input_shapes]
    op.output_shapes = [[*s[:2], 1, *s[2:]] if len(s) == 3 else s for s in op.output_shapes]


# A two-operand torch.einsum that contracts at least one index is, in ATen (at::einsum's
# sumproduct_pair), a bmm of its operands permuted and reshaped to (batch, rows, contracted) and
# (batch, contracted, columns), so it is predicted from bmm's rows as that bmm.  Not counted: the
# copies ATen makes of operands whose permuted layout is not a view (a few elementwise-sized
# kernels beside the product).  An einsum of an activation and a 2-D weight parameter that is
# ``x @ W`` or ``F.linear(x, W)`` (the activation's last index contracted, the output the
# activation's other indices in order, then the weight's free one) is that matmul or linear, so
# their rows predict it.  Other einsums (one or three operands, diagonals, an index summed within
# one operand, no contracted index: a broadcast multiply) keep their own kind.
def _einsum_terms(equation: Any, shapes: list[list[int]]) -> tuple[list[str], str, dict[str, int]] | None:
    """A two-operand einsum's operand terms and output with ``...`` spelt out as letters, and each
    letter's size; None for anything else, a diagonal or a broadcast size-1 dimension."""
    if not isinstance(equation, str) or len(shapes) != 2:
        return None
    lhs, arrow, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        return None
    spare = iter(c for c in string.ascii_letters if c not in lhs + out)
    # the broadcast dimensions (...) as letters of their own, aligned right as broadcasting aligns them
    ranks = [len(shape) - (len(t) - 3) for t, shape in zip(terms, shapes, strict=True) if "..." in t]
    ell = "".join(next(spare) for _ in range(max(ranks, default=0)))
    full = [t.replace("...", ell[len(ell) - (len(shape) - (len(t) - 3)):]) if "..." in t else t
            for t, shape in zip(terms, shapes, strict=True)]
    out = out.replace("...", ell) if arrow else ell + "".join(
        sorted(c for c in set(full[0] + full[1]) - set(ell) if (full[0] + full[1]).count(c) == 1))
    sizes: dict[str, int] = {}
    for term, shape in zip(full, shapes, strict=True):
        if len(term) != len(shape) or len(set(term)) != len(term) or not term.isalpha():
            return None  # a diagonal, or a term that does not fit its operand
        for c, size in zip(term, shape, strict=True):
            if sizes.setdefault(c, int(size)) != int(size):
                return None  # a broadcast size-1 dimension: not one bmm
    if len(set(out)) != len(out) or any(c not in sizes for c in out):
        return None
    return full, out, sizes


def _einsum_as_bmm(equation: Any, shapes: list[list[int]]) -> tuple[int, int, int, int] | None:
    """(batch, rows, contracted, columns) of the bmm a two-operand einsum runs, or None."""
    parsed = _einsum_terms(equation, shapes)
    if parsed is None:
        return None
    (a, b), out, sizes = parsed
    groups = {"batch": 1, "rows": 1, "contracted": 1, "columns": 1}
    for c in sizes:
        in_a, in_b, in_out = c in a, c in b, c in out
        key = ("batch" if in_a and in_b and in_out else "rows" if in_a and in_out else
               "columns" if in_b and in_out else "contracted" if in_a and in_b else None)
        if key is None:
            return None  # summed within one operand
        groups[key] *= sizes[c]
    if all(c in out for c in sizes):
        return None  # nothing contracted: ATen multiplies, no bmm
    return groups["batch"], groups["rows"], groups["contracted"], groups["columns"]


def _einsum_weight_kind(equation: Any, shapes: list[list[int]], weight_index: int) -> str | None:
    """``matmul`` where an einsum of an activation and a 2-D weight (operand ``weight_index``) is
    ``x @ W``, ``linear`` where it is ``F.linear(x, W)``, else None."""
    if len(shapes[weight_index]) != 2 or len(shapes[1 - weight_index]) < 2:
        return None
    parsed = _einsum_terms(equation, shapes)
    if parsed is None:
        return None
    terms, out, _ = parsed
    x, w = terms[1 - weight_index], terms[weight_index]
    contracted, free = x[-1], (set(w) - {x[-1]})
    if contracted not in w or len(free) != 1 or out != x[:-1] + next(iter(free)):
        return None
    return "matmul" if w[0] == contracted else "linear"


def _einsum_as_product(op: Operation) -> None:
    """``op``, a two-operand einsum, made the product ATen runs it as: the bmm of two activations
    (_einsum_as_bmm), or the matmul or linear of an activation and a weight (_einsum_weight_kind);
    FLOPs and bytes stay as counted.  Any other einsum is left as it is."""
    args = op.settings.get("args") or []
    operands = args[1] if len(args) == 2 and isinstance(args[1], list) else args[1:]  # (eq, a, b) or (eq, [a, b])
    equation = args[0] if args else None
    if len(op.input_shapes) == 1 and len(operands) == 2 and "$0" in operands:
        weight_index = 1 - operands.index("$0")
        weight = operands[weight_index]
        if not (isinstance(weight, dict) and "param" in weight):
            return
        shapes = [op.input_shapes[0], op.input_shapes[0]]  # in the equation's operand order
        shapes[weight_index] = list(weight["param"])
        kind = _einsum_weight_kind(equation, shapes, weight_index)
        if kind is not None:
            op.kind = kind
            op.settings = {"args": ["$0", weight], "kwargs": {}}
        return
    if op.params or len(op.input_shapes) != 2 or operands != ["$0", "$1"]:
        return  # operands given otherwise
    dims = _einsum_as_bmm(equation, op.input_shapes)
    if dims is None:
        return
    batch, rows, contracted, columns = dims
    op.kind = "bmm"
    op.settings = {"args": ["$0", "$1"], "kwargs": {}}
    op.input_shapes = [[batch, rows, contracted], [batch, contracted, columns]]
    op.output_shapes = [[batch, rows, columns]]


def _baddbmm_as_bmm(op: Operation) -> None:
    """``torch.baddbmm(c, a, b)`` made the bmm of ``a`` (batch, rows, contracted) by ``b`` (batch,
    contracted, columns) that cuBLAS runs it as (one batched GEMM that also reads ``c`` unless beta
    is 0), so bmm's rows predict it (attention scores in Megatron- and BLOOM-style code, a kind no
    row covers).  FLOPs stay as counted, bytes too but for ``c`` with beta 0; ``c`` leaves the
    operation's activation lists, which hold the product's operands.  Any other call is left as it is."""
    if op.params or len(op.input_shapes) != 3:
        return
    c, a, b = op.input_shapes
    if len(a) != 3 or len(b) != 3 or a[0] != b[0] or a[2] != b[1]:
        return
    if (op.settings.get("kwargs") or {}).get("beta", 1) == 0:
        dtype = getattr(torch, (op.input_dtypes or [op.dtype])[0], torch.float32)
        op.bytes_read = max(0, op.bytes_read - math.prod(c) * _element_size(dtype))
    op.kind = "bmm"
    op.settings = {"args": ["$0", "$1"], "kwargs": {}}
    op.input_shapes = [a, b]
    for name in ("input_requires_grad", "input_nodes", "input_dtypes"):
        values = getattr(op, name)
        if values and len(values) == 3:
            setattr(op, name, values[1:])


def _module_twin(kind: str, args: Any) -> str:
    """The torch.nn module kind a functional call runs as (its own name where none)."""
    if kind == "batch_norm" and args and _is_tensor(args[0]):
        return _BATCH_NORM_BY_RANK.get(args[0].dim(), kind)
    return _MODULE_TWINS.get(kind, kind)


def _linear_settings(args: Any, kwargs: Any) -> dict[str, int] | None:
    """A Linear layer's settings when ``torch.addmm(bias, x, weight)`` is one (a bias and a weight
    parameter around one activation: Hugging Face's GPT-2 ``Conv1D``, weight stored input-major), so it
    is predicted from Linear's rows; None for any other addmm."""
    if kwargs or not isinstance(args, (tuple, list)) or len(args) != 3:
        return None
    bias, x, weight = args
    if not (isinstance(bias, ParamRef) and isinstance(x, ActRef) and isinstance(weight, ParamRef)):
        return None
    if len(weight.shape) != 2 or tuple(bias.shape) != (weight.shape[1],):
        return None
    return {"in_features": int(weight.shape[0]), "out_features": int(weight.shape[1])}


# Functional convolutions and pools run their torch.nn module's kernels, but their features read
# the module's settings (a convolution's channels and kernel, a pool's window and stride): so they
# are named as the module with the settings it would hold, read from the call's arguments
# (_functional_module_settings), and predicted from its measured rows (a hand-written network's
# F.max_pool2d(x, 2) or a weight-standardised convolution's F.conv2d).
_CONV_ARGS: tuple[tuple[str, Any], ...] = (("weight", None), ("bias", None), ("stride", 1), ("padding", 0),
                                           ("dilation", 1), ("groups", 1))
_MAX_POOL_ARGS: tuple[tuple[str, Any], ...] = (("kernel_size", None), ("stride", None), ("padding", 0), ("dilation", 1),
                                               ("ceil_mode", False), ("return_indices", False))
_AVG_POOL_ARGS: tuple[tuple[str, Any], ...] = (("kernel_size", None), ("stride", None), ("padding", 0),
                                               ("ceil_mode", False), ("count_include_pad", True),
                                               ("divisor_override", None))
# function -> (its module, the function's arguments after its input, in order, with their defaults)
_FUNCTIONAL_MODULES: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    "conv1d": ("Conv1d", _CONV_ARGS), "conv2d": ("Conv2d", _CONV_ARGS),
    "max_pool1d": ("MaxPool1d", _MAX_POOL_ARGS), "max_pool2d": ("MaxPool2d", _MAX_POOL_ARGS),
    "avg_pool1d": ("AvgPool1d", _AVG_POOL_ARGS), "avg_pool2d": ("AvgPool2d", _AVG_POOL_ARGS)}


def _functional_module_settings(kind: str, args: Any, kwargs: Any,
                                act_shapes: Sequence[tuple[int, ...]]) -> tuple[str, dict[str, Any]] | None:
    """(module kind, the settings that module would hold) of a functional convolution or pool
    (_FUNCTIONAL_MODULES), from its argument templates (``act_shapes``: the activations' shapes, by
    ActRef index, for a weight computed in ``forward``); None where the call does not read as one."""
    if kind not in _FUNCTIONAL_MODULES or not isinstance(args, (tuple, list)) or not args \
            or not isinstance(args[0], ActRef) or not isinstance(kwargs, dict):
        return None
    module, spec = _FUNCTIONAL_MODULES[kind]
    names = [n for n, _ in spec]
    if len(args) - 1 > len(spec) or set(kwargs) - set(names) or set(kwargs) & set(names[:len(args) - 1]):
        return None
    v = {**dict(spec), **dict(zip(names, args[1:], strict=False)), **kwargs}
    if spec is not _CONV_ARGS:  # a pool
        if v["kernel_size"] is None:
            return None
        if v["stride"] is None or v["stride"] == []:
            v["stride"] = v["kernel_size"]  # as the module and the function default it
        return module, {k: canonical_value(x) for k, x in v.items()} | {"param_shapes": {}}
    weight, bias, groups = v["weight"], v["bias"], v["groups"]
    shape = tuple(weight.shape) if isinstance(weight, ParamRef) else act_shapes[weight.index] \
        if isinstance(weight, ActRef) else None
    dims = 1 if kind == "conv1d" else 2
    if shape is None or len(shape) != dims + 2 or not isinstance(groups, int) or isinstance(groups, bool):
        return None

    def per_dim(x: Any) -> Any:  # as nn.Conv1d/nn.Conv2d hold them (_single, _pair); "same"/"valid" kept
        return x if isinstance(x, str) else [int(x)] * dims if isinstance(x, int) else canonical_value(x)

    settings = {"in_channels": int(shape[1]) * groups, "out_channels": int(shape[0]),
                "kernel_size": [int(k) for k in shape[2:]], "stride": per_dim(v["stride"]),
                "padding": per_dim(v["padding"]), "dilation": per_dim(v["dilation"]), "groups": groups,
                "output_padding": [0] * dims, "padding_mode": "zeros", "transposed": False,
                "param_shapes": {"weight": list(shape)} | ({"bias": list(bias.shape)}
                                                           if isinstance(bias, ParamRef) else {})}
    return module, settings


def _cell_linear_settings(args: Any) -> dict[str, int] | None:
    """A Linear layer's settings for cell_linear(x, weight, bias) of a weight parameter (out, in)."""
    weight = args[1] if isinstance(args, (tuple, list)) and len(args) == 3 else None
    if not isinstance(weight, ParamRef) or len(weight.shape) != 2:
        return None
    return {"in_features": int(weight.shape[1]), "out_features": int(weight.shape[0])}


def _running_stats_numel(args: Any, kwargs: Any) -> int:
    """Elements of the running statistics F.batch_norm reads (its buffers, not parameters)."""
    stats = [*(args[1:3] if isinstance(args, (tuple, list)) else ()),
             *(kwargs.get(k) for k in ("running_mean", "running_var") if isinstance(kwargs, dict))]
    return sum(int(torch.Size(p.shape).numel()) for p in stats if isinstance(p, ParamRef))


def _function_kind(node: torch.fx.Node) -> str:
    target = node.target
    if node.op == "call_method":
        return str(target)
    if target in (operator.add, operator.iadd):
        return "add"
    if target in (operator.mul, operator.imul):
        return "mul"
    if target in (operator.sub, operator.isub):
        return "sub"
    if target in (operator.truediv, operator.itruediv):
        return "div"
    if target is operator.getitem:
        return "getitem"
    if target is operator.matmul:
        return "matmul"
    name = getattr(target, "__name__", str(target))
    return name


def _module_settings(m: nn.Module, named_params: list[tuple[str, nn.Parameter]]) -> dict[str, Any]:
    """Constructor-like settings: public attributes of simple types, plus parameter shapes
    (``named_params`` is ``list(m.named_parameters())``, listed once by the caller)."""
    settings: dict[str, Any] = {}
    d = vars(m)
    for key in sorted(d.keys() - _module_bookkeeping()):  # nn.Module's own attributes dropped in C
        if key.startswith("_"):
            continue
        value = d[key]
        t = type(value)
        if t is int or t is bool or t is str or value is None:
            settings[key] = value  # already canonical (the commonest case, checked first)
        elif isinstance(value, (bool, int, float, str)) or (
            isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float, str)) for v in value)
        ):
            settings[key] = canonical_value(value)
    settings["param_shapes"] = {n: list(p.shape) for n, p in sorted(named_params, key=lambda np_: np_[0])}
    return settings


# _settings_of's memo: a module's settings and their repr, by its class, attribute names, the
# repr of its public attribute values and its parameter shapes; and the sorted public attribute
# names of each (class, attribute names).  Both bounded (cleared when full).
_SETTINGS_MEMO: dict[Any, tuple[dict[str, Any], str]] = {}
_PUBLIC_KEYS: dict[Any, tuple[str, ...]] = {}
_SETTINGS_MEMO_SIZE = 8192
# Types whose repr identifies the value and its type (so its canonical form, and that it is a setting).
_REPR_EXACT = frozenset({int, bool, str, float, type(None)})


def _settings_of(m: nn.Module, named_params: list[tuple[str, nn.Parameter]]) -> tuple[dict[str, Any], str]:
    """``_module_settings(m, named_params)`` and its repr, remembered for modules of one class
    with equal attribute values (a fresh candidate's convolutions and norms repeat ones seen
    before): building the settings was a quarter of interpreting a fresh candidate.  Only
    attributes of plain scalar types, or tuples and lists of them, key the memo (their repr is
    exact); a module with any other public attribute is computed each time.  The dict is shared
    between calls: read it, never change it."""
    d = m.__dict__
    layout = (type(m), tuple(d))
    names = _PUBLIC_KEYS.get(layout)
    if names is None:
        if len(_PUBLIC_KEYS) >= _SETTINGS_MEMO_SIZE:
            _PUBLIC_KEYS.clear()
        names = _PUBLIC_KEYS[layout] = tuple(k for k in sorted(d.keys() - _module_bookkeeping())
                                             if not k.startswith("_"))
    values = [d[k] for k in names]
    for v in values:
        t = type(v)
        if t not in _REPR_EXACT and not ((t is tuple or t is list) and all(type(x) in _REPR_EXACT for x in v)):
            settings = _module_settings(m, named_params)
            return settings, repr(settings)
    key = (layout, repr(values), tuple([(n, tuple(p.shape)) for n, p in named_params]))
    hit = _SETTINGS_MEMO.get(key)
    if hit is None:
        if len(_SETTINGS_MEMO) >= _SETTINGS_MEMO_SIZE:
            _SETTINGS_MEMO.clear()
        settings = _module_settings(m, named_params)
        hit = _SETTINGS_MEMO[key] = (settings, repr(settings))
    return hit


@functools.lru_cache(maxsize=1)
def _module_bookkeeping() -> frozenset[str]:
    """The attributes every nn.Module has: its tables, hooks and ``training`` (never settings)."""
    return frozenset(nn.Module().__dict__)


def _is_parametrized(m: nn.Module) -> bool:
    """A module under torch.nn.utils.parametrize (weight_norm, spectral_norm, orthogonal): its class is
    one torch made on the fly, a subclass of the module's own (``ParametrizedLinear`` of ``Linear``)."""
    return type(m).__module__ == "torch.nn.utils.parametrize" and "parametrizations" in m._modules


def _module_class_name(m: nn.Module) -> str:
    """The module's class name; a parametrized module's is its own class's (it runs that kernel)."""
    return type(m).__bases__[0].__name__ if _is_parametrized(m) else type(m).__name__


def _parametrized_params(m: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """What a parametrized module's kernel reads: its plain parameters, and each parametrized tensor
    under its own name, shaped as the largest of its originals (weight_norm's direction, spectral_norm's
    weight: the weight's shape), so that it is the module's own operation, signature included."""
    out = [(name, p) for name, p in m._parameters.items() if p is not None]
    for name, originals in m._modules["parametrizations"].items():
        tensors = list(originals.parameters())
        if not tensors:
            continue
        largest = max(tensors, key=lambda t: t.numel())
        out.append((name, nn.Parameter(torch.empty(largest.shape, dtype=largest.dtype, device="meta"),
                                       requires_grad=any(t.requires_grad for t in tensors))))
    return out


def _named_params(m: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """``list(m.named_parameters())``; for a module without children (most leaves) read from
    its own table, as named_parameters does, without its generator machinery; for a parametrized
    module, what its kernel reads (_parametrized_params)."""
    if m._modules:
        return _parametrized_params(m) if _is_parametrized(m) else list(m.named_parameters())
    seen: set[int] = set()
    out = []
    for name, p in m._parameters.items():
        if p is not None and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def _flops_elementwise(kind: str, in_numel: int, out_numel: int, settings: dict[str, Any], training: bool) -> int:
    """Our own per-element counts for operations FlopCounterMode counts as zero."""
    k = kind.lower()
    if k.startswith("batchnorm"):
        return (8 if training else 2) * out_numel
    if k in ("layernorm", "layer_norm", "groupnorm", "group_norm", "localresponsenorm"):
        return 8 * out_numel
    if k in ("softmax", "log_softmax", "_softmax"):
        return 5 * out_numel
    if k in ("gelu",):
        return 8 * out_numel
    if k in ("silu", "sigmoid", "hardsigmoid", "hardswish", "tanh", "mish"):
        return 4 * out_numel
    if k in ("relu", "relu6", "relu_", "add", "iadd", "mul", "sub", "div", "hardtanh", "dropout", "stochasticdepth"):
        return out_numel
    if "pool" in k:
        if "adaptive" in k or k in ("mean",):
            return in_numel
        ks = settings.get("kernel_size", 1)
        ks_n = 1
        for v in ks if isinstance(ks, list) else [ks]:
            ks_n *= int(v)
        return ks_n * out_numel
    if k in ("mean", "sum", "max", "amax", "min", "amin", "cumsum", "argmax"):
        return in_numel  # reductions and scans: one operation per input element
    if k in ("masked_fill", "masked_fill_", "where", "pow", "eq", "ne", "lt", "gt", "le", "ge", "invert", "tanh_",
             "exp", "neg", "rsqrt", "sqrt"):
        return out_numel
    if k in _RECURRENT_ELEMENTWISE:
        # gate activations and state updates at every step of every layer (the products are in flops)
        return _RECURRENT_ELEMENTWISE[k] * out_numel * int(settings.get("num_layers", 1))
    return 0


# Per output element and layer: LSTM 3 sigmoids + 2 tanh (4 each) and ~5 products/sums; GRU 2
# sigmoids + tanh and ~6 products/sums; a plain RNN its activation and the sum.
_RECURRENT_ELEMENTWISE = {"lstm": 25, "gru": 18, "rnn": 2}


def sdpa_backend(dtype: str, head_dim: int, head_dim_v: int, has_mask: bool, enable_gqa: bool = False) -> str:
    """Which kernel PyTorch's CUDA dispatcher takes for F.scaled_dot_product_attention on an
    sm80/sm90 GPU ("flash", "memory_efficient" or "math"), by the rule torch 2.1-2.14 apply in
    priority order flash > memory-efficient > math (cuDNN attention is not preferred by default):

    * flash: half precision only (float16, bfloat16), no ``attn_mask`` (``is_causal`` is fine),
      head dims equal, at most 256 and a multiple of 8;
    * memory-efficient: float32, float16 or bfloat16 with an ``attn_mask`` or not; head dims a
      multiple of 8 for half precision and of 4 for float32;
    * math otherwise (float64, unaligned head dims, ``enable_gqa``).

    So float32 (and TF32) attention never takes flash, and a padding mask moves half-precision
    attention from flash to memory-efficient.  It is a rule, not a query of the GPU: the GPU
    machine's torch may still fall back (e.g. on odd strides); the measured row is the truth.
    """
    if enable_gqa or dtype not in ("float32", "float16", "bfloat16"):
        return "math"
    half = dtype in ("float16", "bfloat16")
    if half and not has_mask and head_dim == head_dim_v and head_dim <= 256 and head_dim % 8 == 0:
        return "flash"
    align = 8 if half else 4
    if head_dim % align == 0 and head_dim_v % align == 0:
        return "memory_efficient"
    return "math"


def _sdpa_backend_of(args: Any, kwargs: Any, training: bool) -> str:
    """sdpa_backend for one call's (meta) arguments."""
    names = ("query", "key", "value", "attn_mask")
    bound = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    q, v = bound.get("query"), bound.get("value")
    if not (_is_tensor(q) and _is_tensor(v)) or q.dim() < 2:
        return "math"
    return sdpa_backend(str(q.dtype).replace("torch.", ""), int(q.shape[-1]), int(v.shape[-1]),
                        bound.get("attn_mask") is not None, bool(kwargs.get("enable_gqa", False)))


def _without_math_upcasts(casts: list[tuple[torch.Tensor, torch.dtype]]) -> list[tuple[torch.Tensor, torch.dtype]]:
    """The casts of a fused-backend attention call, less the float32 copies of its half-precision
    inputs.  Without CUDA, torch._fused_sdp_choice answers "math" for fake CUDA tensors, and the
    math fallback upcasts half-precision q, k and v to float32; on the GPU the fused kernel
    (sdpa_backend) reads them as they are, so the GPU machine's extraction has no such casts, and
    a plan made here would name attention signatures it never finds."""
    return [(src, to) for src, to in casts if not (to == torch.float32 and src.dtype in (torch.float16, torch.bfloat16))]


def _backward_flops(op_matmul_flops: int, has_params: bool, inputs_requiring_grad: int, elementwise: int) -> int:
    """Analytic backward count: the gradient of each operand of a product costs about one forward.

    A product has two operands (input and weight, or two activations as in matmul/bmm), so
    at most two forwards' worth; attention's q, k and v still give two (dQ and dK share dS).
    """
    operands = min((1 if has_params else 0) + inputs_requiring_grad, 2)
    return op_matmul_flops * operands + (2 * elementwise if operands else 0)


def _meta_inputs(input_shape: Sequence[int] | None, dtype: torch.dtype, example_inputs: Any
                 ) -> tuple[list[torch.Tensor], str]:
    """Meta tensors for the forward's inputs, and how to name them in an error."""
    if example_inputs is None:
        if input_shape is None:
            raise ExtractionError("give input_shape, e.g. (32, 3, 224, 224), or example_inputs")
        shape = _normalise_input_shape(input_shape)
        return [torch.empty(shape, dtype=dtype, device="meta")], f"shape {list(shape)}"
    items = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if not items or not all(_is_tensor(t) for t in items):
        raise ExtractionError("example_inputs must be a tensor or a tuple of tensors")
    described = ", ".join(f"{list(t.shape)} {str(t.dtype).replace('torch.', '')}" for t in items)
    return [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in items], f"({described})"


def _shape_dim(s: Any) -> int | None:
    """A dimension as an int, or None unless it is a whole number (2.7, NaN, '8' and True are not)."""
    if isinstance(s, bool):
        return None
    if isinstance(s, numbers.Integral):
        return int(s)
    if isinstance(s, numbers.Real) and math.isfinite(float(s)) and float(s).is_integer():
        return int(s)
    return None


def normalise_input_shape(input_shape: Sequence[int] | int) -> tuple[int, ...]:
    """``input_shape`` as a tuple of ints; ExtractionError unless every dimension is a positive
    whole number (2.7 is refused, never truncated to 2) and there are at least two."""
    if isinstance(input_shape, numbers.Number):
        raise ExtractionError("input_shape must be a shape such as (32, 3, 224, 224), not a single number")
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, Sequence):
        raise ExtractionError(f"input_shape must be a shape such as (32, 3, 224, 224), not {input_shape!r}")
    dims = [_shape_dim(s) for s in input_shape]
    bad = [(i, s) for i, (s, d) in enumerate(zip(input_shape, dims, strict=True)) if d is None or d < 1]
    if bad:
        where = ", ".join(f"{s!r} at position {i}" for i, s in bad)
        raise ExtractionError(f"input_shape {tuple(input_shape)!r}: every dimension must be a positive integer "
                              f"({where})")
    shape = tuple(int(d) for d in dims if d is not None)
    if len(shape) < 2:
        raise ExtractionError(f"input_shape {shape} needs at least a batch and a feature dimension")
    return shape


@dataclasses.dataclass
class _Precise:
    """How a non-fp32 extraction makes and reads its tensors (see _precision_scope)."""

    precision: str  # the precision of the operations being interpreted now
    mixed: bool
    low: torch.dtype
    scope: str = ""  # the precision the scope was made for (autocast in forward can switch ``precision``)

    def like(self, t: torch.Tensor) -> torch.Tensor:
        """A placeholder of ``t``'s shape in this precision: a fake CUDA tensor under autocast,
        a meta tensor (floats in the low dtype for a cast precision) otherwise."""
        dtype = self.low if self.precision in CAST and t.is_floating_point() else t.dtype
        made = torch.empty(tuple(t.shape), dtype=dtype, device="cuda" if self.mixed else "meta")
        return nn.Parameter(made, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else made

    def input(self, t: torch.Tensor) -> torch.Tensor:
        return self.like(t)

    def is_placeholder(self, t: torch.Tensor) -> bool:
        from torch._subclasses.fake_tensor import FakeTensor

        return isinstance(t, FakeTensor) if self.mixed else t.device.type == "meta"


@contextlib.contextmanager
def _cuda_autocast_state(dtype: torch.dtype) -> Any:
    """CUDA autocast switched on without CUDA (``torch.autocast("cuda")`` refuses on a machine
    without it): torch's CUDA autocast kernels then run on fake CUDA tensors.  The cast cache
    is off, as in collection (CUDA-graph capture), so every use of a weight casts it.  The
    previous state is restored, also on errors."""
    enabled, previous, cache = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
                                torch.is_autocast_cache_enabled())
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.set_autocast_cache_enabled(False)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", previous)
        torch.set_autocast_cache_enabled(cache)


@contextlib.contextmanager
def _swapped_tensors(root: nn.Module, make: Any, keep_meta: bool = False) -> Any:
    """Every parameter and buffer reachable from ``root`` replaced by ``make(t)`` (tied ones stay
    tied; with ``keep_meta`` those already on meta are left as they are), the originals put back
    on exit, also on errors."""
    memo: dict[int, torch.Tensor] = {}
    saved: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    try:
        for mod in root.modules():
            for store in (mod._parameters, mod._buffers):
                for key, t in list(store.items()):
                    if t is None or (keep_meta and t.device.type == "meta"):
                        continue
                    if id(t) not in memo:
                        memo[id(t)] = make(t)
                    saved.append((store, key, t))
                    store[key] = memo[id(t)]
        yield root
    finally:
        for store, key, t in reversed(saved):
            store[key] = t


@contextlib.contextmanager
def _precision_scope(precision: str, root: nn.Module) -> Any:
    """What a non-fp32 extraction runs under: fake CUDA tensors and CUDA autocast for a mixed
    precision, the module's tensors in the low dtype for a cast one; yields the _Precise."""
    precise = _Precise(precision, precision in MIXED, low_dtype(precision), precision)
    with contextlib.ExitStack() as stack:
        if precise.mixed:
            from torch._subclasses.fake_tensor import FakeTensorMode

            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            stack.enter_context(_cuda_autocast_state(precise.low))
        stack.enter_context(_swapped_tensors(root, precise.like))
        yield precise


# Methods that are themselves a dtype conversion (their copy is the operation, not a cast
# autocast inserted).
_EXPLICIT_CASTS = frozenset({"to", "float", "half", "bfloat16", "double", "type", "type_as"})


@functools.lru_cache(maxsize=1)
def _matmul_packets() -> frozenset[Any]:
    """ATen operators that run cuBLAS matrix products (what TF32 matmul changes): those
    FlopCounterMode counts, less the convolutions (cuDNN, TF32 already by default)."""
    from torch.utils.flop_counter import flop_registry

    return frozenset(p for p in flop_registry if "conv" not in str(p))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


_normalise_input_shape = normalise_input_shape


def extract_operations(
    model: str | nn.Module,
    input_shape: Sequence[int] | None = None,
    mode: str = "inference",
    dtype: torch.dtype = torch.float32,
    keep_sources: bool = True,
    example_inputs: Any = None,
    precision: str | None = None,
    shared_records: bool = False,
) -> OperationList:
    """Every operation the forward of ``model`` executes on ``input_shape``, in order (with the
    memory of submodules it never calls, ``OperationList.dormant_state_bytes``).

    ``dtype`` is the input's dtype: an integer dtype (``torch.long``) for models that take
    token ids, whose activations are then float32. ``example_inputs`` (a tensor or a tuple
    of tensors, on any device; only shapes and dtypes are used) replaces ``input_shape`` and
    ``dtype`` for models with several or non-float inputs, e.g. ``(src, tgt)`` for
    nn.Transformer; a dict of tensors passes them by keyword (``{"input_ids": ...,
    "decoder_input_ids": ...}`` for an encoder-decoder).  ``mode='training'`` keeps train-only
    work (dropout, auxiliary classifiers, BatchNorm in train mode) and marks which inputs
    require grad.  With
    ``keep_sources`` each operation holds the module / function it came from so it can be
    materialised and benchmarked.

    ``precision`` (gpurec.ops.precision) is the math mode the step runs in.  Under
    ``"bf16-mixed"``/``"fp16-mixed"`` the graph runs on fake CUDA tensors with CUDA autocast
    switched on, so torch's own autocast kernels decide each operation's dtype, and the casts
    autocast inserts on an operation's inputs and weights become operations themselves
    (kind ``autocast_cast``).  ``"bf16"``/``"fp16"`` run the module and its float inputs in that
    dtype.  ``"tf32"`` marks the operations that run cuBLAS matrix products (the rest stay fp32
    operations: TF32 changes nothing else).  ``None``: fp32, or the cast precision of a module
    whose parameters are bf16/fp16; a precision contradicting them raises PrecisionMismatch.

    ``shared_records`` (with ``keep_sources=False``, fp32): a leaf module call seen before (same
    type, settings, inputs and gradient flags, in this extraction or an earlier one) gives a copy
    of the operation recorded then, signature and feature row included, instead of being recorded
    again.  The copies share their settings and shape lists, so treat them as read-only (as
    prediction does); every field is what recording it would give (tests/test_extract_speed.py).
    """
    if mode not in MODES:
        raise ExtractionError(f"mode must be one of {', '.join(MODES)}, not '{mode}'")
    try:
        # A cast precision asked of a float32 module is what collection does (the extraction casts
        # it); predict and recommend refuse that contradiction before they get here.
        precision = (check_precision(precision) if precision in CAST
                     else resolve_precision(model, precision))
    except PrecisionMismatch:
        raise
    except ValueError as exc:
        raise ExtractionError(str(exc)) from None
    return extract_at_resolved_precision(model, input_shape, mode, dtype, keep_sources, example_inputs, precision,
                                         shared_records)


def extract_at_resolved_precision(model: str | nn.Module, input_shape: Sequence[int] | None = None,
                                  mode: str = "inference", dtype: torch.dtype = torch.float32,
                                  keep_sources: bool = True, example_inputs: Any = None,
                                  precision: str = DEFAULT_PRECISION, shared_records: bool = False) -> OperationList:
    """extract_operations for a ``precision`` that ``gpurec.ops.precision.resolve_precision(model, ...)``
    returned already (predict resolves it first): resolving it again walks every parameter of
    the module a second time per fresh candidate.  Anything else: use extract_operations."""
    if mode not in MODES:
        raise ExtractionError(f"mode must be one of {', '.join(MODES)}, not '{mode}'")
    model = _uncompiled(model)
    _warn_if_channels_last(model, example_inputs)
    if isinstance(example_inputs, Mapping):
        model, example_inputs = _called_by_keyword(model, example_inputs)
    with _EXTRACTION_LOCK:
        return _extract_operations(model, input_shape, mode, dtype, keep_sources, example_inputs, precision,
                                   shared_records and not keep_sources)


def _uncompiled(model: str | nn.Module) -> str | nn.Module:
    """The module ``torch.compile`` wrapped, with a warning: neither torch.fx nor a run on meta
    tensors goes through the compiled wrapper, and the estimate is of the eager step (the fusions
    a compiler makes are not modelled).  A TorchScript module is refused with what to pass instead:
    its forward is no longer Python to trace."""
    if isinstance(model, torch.jit.ScriptModule):
        raise ExtractionError(f"{type(model).__name__} is a TorchScript module (torch.jit.script or torch.jit.trace): "
                              "its Python forward is gone, so neither torch.fx nor a run on meta tensors can see its "
                              "operations; pass the nn.Module you scripted instead (estimated as its eager step, as "
                              "a torch.compile'd module is)")
    inner = getattr(model, "_orig_mod", None)
    if isinstance(model, nn.Module) and type(model).__name__ == "OptimizedModule" and isinstance(inner, nn.Module):
        warnings.warn(f"{type(inner).__name__} is a torch.compile'd module: estimated as its eager step (the "
                      "kernels compilation fuses are not modelled)", CompiledModuleWarning, stacklevel=3)
        return inner
    return model


def _is_channels_last(t: Any) -> bool:
    """A 4-D tensor laid out channels-last (NHWC) rather than contiguous (NCHW)."""
    return isinstance(t, torch.Tensor) and t.dim() == 4 and t.stride(1) == 1 and not t.is_contiguous()


def _warn_if_channels_last(model: str | nn.Module, example_inputs: Any) -> None:
    """Every measured row ran on contiguous (NCHW) tensors: a network moved to
    ``torch.channels_last`` is estimated as its NCHW step, which a warning says."""
    if not isinstance(model, nn.Module):
        return
    inputs = example_inputs.values() if isinstance(example_inputs, Mapping) else (
        example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,))
    # ``model.to(memory_format=...)`` moves every 4-D weight: the first one tells (a walk over all
    # of them would cost a fresh NAS candidate a few per cent of its estimate)
    first = next((p for p in model.parameters() if p.dim() == 4), None)
    if any(_is_channels_last(t) for t in inputs) or _is_channels_last(first):
        warnings.warn(f"{type(model).__name__} runs in torch.channels_last: estimated as its contiguous (NCHW) step; "
                      "every measured operation ran NCHW, and cuDNN's NHWC kernels (without the layout transposes "
                      "half precision adds to NCHW) are not modelled", ChannelsLastWarning, stacklevel=4)


class ChannelsLastWarning(UserWarning):
    """A channels-last (NHWC) network or input was estimated as the contiguous (NCHW) one."""


class CompiledModuleWarning(UserWarning):
    """A torch.compile'd module was estimated as the eager module it wraps."""


class PackedSequenceWarning(UserWarning):
    """A recurrent layer ran on a PackedSequence: estimated with every sequence at the padded length
    (lengths are values; cuDNN's packed path is not always faster with shorter ones)."""


def _called_by_keyword(model: str | nn.Module, example_inputs: Mapping[str, Any]) -> tuple[nn.Module, tuple[Any, ...]]:
    """``model`` wrapped so that keyword inputs (an encoder-decoder's ``input_ids`` and
    ``decoder_input_ids``, in the dict's order) are the wrapper's positional ones: tracing and
    capture take positional inputs.  The wrapper's submodule is ``inner``."""
    if isinstance(model, str):
        raise ExtractionError("keyword example_inputs (a dict) are for an nn.Module; a model by name takes "
                              "input_shape")
    keys = tuple(example_inputs)
    if not keys or not all(isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) for k in keys):
        raise ExtractionError(f"keyword example_inputs need the forward's argument names as keys, got {list(keys)}")
    wrapper = _keyword_wrapper_type(keys)()
    wrapper.inner = model
    wrapper.training = model.training  # the wrapper's own flag only: train() would set every submodule's
    return wrapper, tuple(example_inputs.values())


@functools.lru_cache(maxsize=64)
def _keyword_wrapper_type(keys: tuple[str, ...]) -> type[nn.Module]:
    """An nn.Module class whose forward takes ``keys`` positionally and calls ``self.inner`` with
    them as keywords.  Written out (not ``**kwargs``), because torch.fx makes one placeholder per
    named argument of the forward it traces."""
    names = ", ".join(keys)
    namespace: dict[str, Any] = {}
    exec(f"def forward(self, {names}):\n    return self.inner({', '.join(f'{k}={k}' for k in keys)})\n",
         namespace)
    return type("KeywordInputs", (nn.Module,), {"forward": namespace["forward"], "__module__": __name__})


# torch.fx tracing patches module-level state (its CURRENT_PATCHER), and the fast path swaps the
# caller's tensors to meta: one extraction at a time in a process, from any thread.
_EXTRACTION_LOCK = threading.RLock()


def _extract_operations(model: str | nn.Module, input_shape: Sequence[int] | None, mode: str, dtype: torch.dtype,
                        keep_sources: bool, example_inputs: Any, precision: str,
                        shared_records: bool = False) -> OperationList:
    if isinstance(model, str) and example_inputs is None and is_sequence_arch(model) and dtype.is_floating_point:
        # a sequence architecture by name takes int64 token ids; ``dtype`` is its activations'
        inputs, described = _meta_inputs(input_shape, torch.int64, None)
    else:
        inputs, described = _meta_inputs(input_shape, dtype, example_inputs)
    floats = [t.dtype for t in inputs if t.is_floating_point()]
    compute = dtype if dtype.is_floating_point else (floats[0] if floats else torch.float32)
    training = mode == "training"
    with contextlib.ExitStack() as scope:
        scope.enter_context(_gc_paused())
        if isinstance(model, str):
            name = _check_name(model)
            traced = _trace_torchvision(name, training)
        elif keep_sources or not isinstance(model, nn.Module):
            # Operations keep their modules as sources: work on a meta copy, never on the caller's.
            name, meta = resolve_model(model)
            meta.train(training)
            traced = _trace_or_record(meta, inputs)
        else:
            # Fast path (prediction): trace the caller's module in place; when interpreted, a
            # leaf that has to run does so with its own tensors swapped to meta, and parameters
            # read by functions are read as meta tensors (_run_node, _interpret), so the weights
            # of the many leaves that are memoised or analytic are never copied.  Tensors and
            # train/eval flags are as they were on leaving.  Leaf modules read their train/eval
            # flag while interpreted, so the mode holds throughout.
            name = type(model).__name__
            scope.enter_context(_in_mode(model, training))
            traced = _trace_or_record(model, inputs)
        try:
            scoped = _scope_precision(precision, traced)
            if scoped == DEFAULT_PRECISION:
                ops, _ = _interpret(traced, inputs, compute, training, keep_sources, shared_records=shared_records)
            else:
                precise = scope.enter_context(_precision_scope(scoped, traced.root))
                if scoped != precision:  # autocast entered only inside forward: off until its marker
                    precise.precision = precision
                    torch.set_autocast_enabled("cuda", False)
                ops, _ = _interpret(traced, [precise.input(t) for t in inputs], compute, training, keep_sources,
                                    precise=precise)
        except ExtractionError:
            raise
        except Exception as exc:  # shape errors surface here: the model cannot take this input
            reason = re.sub(r"Proxy\([^)]*\)", described, str(exc).splitlines()[0][:200])
            raise ExtractionError(f"{name} cannot take input {described}: {reason}") from exc
    for op in ops:
        op.model = name
    return OperationList(ops, functools.partial(_dormant_state_bytes, traced, precision))


class OperationList(list):
    """The operations of one step in execution order (a list), and the memory the module holds
    that no operation carries: ``dormant_state_bytes``."""

    def __init__(self, ops: Sequence[Operation], dormant: Callable[[], int] | int = 0) -> None:
        super().__init__(ops)
        self._dormant = dormant

    @property
    def dormant_state_bytes(self) -> int:
        """Parameters and buffers of submodules the step never calls (GoogLeNet's and Inception's
        auxiliary heads in inference): they are on the GPU all the same.  Worked out on first use
        (prediction of time never asks)."""
        if callable(self._dormant):
            self._dormant = int(self._dormant())
        return self._dormant


def _dormant_state_bytes(traced: _Traced, precision: str) -> int:
    """Bytes of the parameters and buffers of ``traced.root``'s submodules that no node of the
    traced step calls or reads, each tensor once and none that a called module shares (a tied
    weight); at ``precision``'s element size where the module is cast (bf16, fp16)."""
    used: set[str] = set()  # modules called and tensors read, by path
    touched: set[str] = set()  # those paths and every module above them
    for node in traced.graph.nodes:
        if node.op in ("call_module", "get_attr"):
            path = str(node.target)
            used.add(path)
            parts = path.split(".")
            touched.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    dormant: list[str] = []

    def walk(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            path = prefix + name
            if path in used:
                continue  # called as a whole
            if path in touched:
                walk(path + ".", child)  # partly used: look inside
            else:
                dormant.append(path + ".")

    walk("", traced.root)
    if not dormant:
        return 0
    prefixes = tuple(dormant)
    live: set[int] = set()
    idle: dict[int, torch.Tensor] = {}
    root = traced.root
    for path, t in (*root.named_parameters(remove_duplicate=False), *root.named_buffers(remove_duplicate=False)):
        if path.startswith(prefixes):
            idle[id(t)] = t
        else:
            live.add(id(t))
    cast = precision in CAST
    return sum(t.numel() * (2 if cast and t.is_floating_point() else t.element_size())
               for i, t in idle.items() if i not in live)


_MIXED_OF_DTYPE = {torch.bfloat16: "bf16-mixed", torch.float16: "fp16-mixed"}


def _scope_precision(precision: str, traced: _Traced) -> str:
    """The precision to set up the extraction for: ``precision``, or the mixed precision of a
    CUDA autocast that forward enters itself (the step runs at it there; _interpret follows the
    markers).  A module cast to bf16/fp16 that enters autocast is refused (not modelled)."""
    cuda = [(dtype, enabled) for device, dtype, enabled in traced.autocast if device == "cuda"]
    if not cuda or precision in MIXED:
        return precision
    if precision in CAST:
        raise ExtractionError(f"a module cast to {precision} that enters torch.autocast in forward is not supported: "
                              "pass the float32 module (its autocast regions are followed)")
    entered = [_MIXED_OF_DTYPE[d] for d, enabled in cuda if enabled and d in _MIXED_OF_DTYPE]
    return entered[0] if entered else precision


def _switch_autocast(node: torch.fx.Node, precise: _Precise, stack: list[Any]) -> None:
    """Follow an autocast marker of forward: set CUDA autocast as forward asks (restore it on
    the matching exit) and label the operations that follow with the precision they run at."""
    if node.target is _autocast_exit:
        saved = stack.pop() if stack else None
        if saved is not None:
            torch.set_autocast_enabled("cuda", saved[0])
            torch.set_autocast_dtype("cuda", saved[1])
            precise.precision = saved[2]
        return
    device, dtype, enabled = node.args
    if device != "cuda":  # another device's autocast leaves the CUDA step as it is
        stack.append(None)
        return
    stack.append((torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"), precise.precision))
    torch.set_autocast_enabled("cuda", bool(enabled))
    torch.set_autocast_dtype("cuda", dtype)
    precise.precision = _MIXED_OF_DTYPE.get(dtype, DEFAULT_PRECISION) if enabled else DEFAULT_PRECISION


def _interpret(traced: _Traced, inputs: list[torch.Tensor], dtype: torch.dtype, training: bool,
               keep_sources: bool, input_grads: Sequence[bool] = (), precise: _Precise | None = None,
               shared_records: bool = False) -> tuple[list[Operation], Any]:
    """The graph's operations and its output, run on meta with ``inputs`` as its placeholders
    (on the placeholders of ``precise`` for a precision other than fp32).  ``shared_records``:
    leaf module calls are recorded once per distinct call (_RECORD_MEMO; extract_operations)."""
    shared_records = shared_records and precise is None and not keep_sources
    env: dict[str, Any] = {}
    grad: dict[str, bool] = {}  # does the node's value require grad in training?
    ops: list[Operation] = []
    counter = _NodeFlops() if precise is None else _NodeTrace()
    modules = traced.modules()
    # a named model's leaves (gpurec's own modules, never changed) keep their settings between
    # interpretations at other input shapes; a caller's module may change between calls
    node_settings = traced.__dict__.setdefault("_node_settings", {}) if traced.owned and precise is None else None
    metas: dict[int, torch.Tensor] = {}  # parameters and buffers read by get_attr, as meta tensors
    placeholders_seen = 0
    elem_size = torch.empty((), dtype=dtype).element_size()
    dtype_name = str(dtype).replace("torch.", "")
    mode_name = "training" if training else "inference"
    no_ops = _EVAL_NOOPS + _leaf_types()  # modules that return their input in eval
    markers = bool(traced.autocast)
    autocast_stack: list[Any] = []

    def load(a: Any) -> Any:
        if type(a) is tuple and all(type(x) is torch.fx.Node for x in a):  # the commonest: (x,), (x, y)
            return tuple([env[x.name] for x in a])
        if not a and isinstance(a, dict):
            return {}
        return _map_nodes(a, lambda n: env[n.name])

    def in_grad(node: torch.fx.Node) -> bool:
        """Does any input of the node require grad (what a no-op or view passes on)?  Asked only
        where needed: most calls are recorded, or copied from a record, without it."""
        return any(grad.get(n.name, False) for n in node.all_input_nodes)

    def is_view_or_bookkeeping(node: torch.fx.Node, args: Any) -> bool:
        if node.op == "call_function" and node.target in _DROP_FUNCTIONS:
            return True
        if node.op == "call_method" and node.target in _DROP_METHODS:
            return True
        if node.op == "call_function" and isinstance(node.target, type) and issubclass(node.target, tuple):
            return True  # namedtuple outputs (GoogLeNetOutputs, InceptionOutputs) only pack tensors
        if node.op == "call_function" and node.target is operator.getitem:
            # indexing a tuple/list (e.g. MHA's (out, weights)) is Python, not a kernel
            return not _is_tensor(args[0])
        return False

    for node in traced.graph.nodes:
        if node.op == "placeholder":
            i = placeholders_seen
            env[node.name] = inputs[i] if i < len(inputs) else (node.args[0] if node.args else None)
            grad[node.name] = bool(input_grads[i]) if i < len(input_grads) else False  # the network's input: none
            placeholders_seen += 1
            continue
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(traced.root)
            if precise is not None:
                if _is_tensor(value) and not precise.is_placeholder(value):  # a plain tensor attribute
                    value = metas.get(id(value)) or metas.setdefault(id(value), precise.like(value))
            elif _is_tensor(value) and value.device.type != "meta" and (_is_param_or_buffer(modules, node.target)
                                                                      or _is_fx_constant(node.target)):
                value = metas.get(id(value)) or metas.setdefault(id(value), _meta_like(value))
            env[node.name] = value
            grad[node.name] = training and isinstance(value, nn.Parameter) and value.requires_grad
            continue
        if node.op == "output":
            return ops, load(node.args[0])
        if markers and node.op == "call_function" and node.target in _AUTOCAST_MARKERS:
            if precise is not None and precise.mixed:
                _switch_autocast(node, precise, autocast_stack)
            continue
        args, kwargs = load(node.args), load(node.kwargs)
        if node.op != "call_module" and is_view_or_bookkeeping(node, args):
            env[node.name] = _run_node(modules, node, args, kwargs)
            grad[node.name] = in_grad(node)
            continue
        # Settings of a leaf module: computed once, used by the memo key and the record.
        if node.op != "call_module":
            named_params, settings, settings_text = [], {}, ""
        elif (listed := node_settings.get(node.target) if node_settings is not None else None) is not None:
            named_params, settings, settings_text = listed
        else:
            named_params = _named_params(modules[node.target])
            settings, settings_text = _settings_of(modules[node.target], named_params)
            if node_settings is not None:
                node_settings[node.target] = (named_params, settings, settings_text)
        leaf_key = (_leaf_key(modules[node.target], args, kwargs, training, settings, settings_text)
                    if node.op == "call_module" and precise is None else None)
        record_key = None
        if shared_records and leaf_key is not None:
            record_key, act_names = _record_key(leaf_key, node, env, grad, training, dtype_name, named_params)
            recorded = _RECORD_MEMO.get(record_key) if record_key is not None else None
            if recorded is not None:  # the same call recorded before: its operation, at this node
                _RECORD_MEMO.move_to_end(record_key)
                template, grad_out, leaf = recorded
                # the output from the leaf result kept with the record (a second memo look-up saved)
                env[node.name] = (_made_output(leaf) if leaf is not None else
                                  _run_counted(modules, node, args, kwargs, counter, training, settings,
                                               key=leaf_key)[0])
                grad[node.name] = grad_out
                op = Operation.__new__(Operation)  # copy.copy of the dataclass, without its reduce protocol
                op.__dict__.update(template.__dict__)
                op.name, op.node, op.input_nodes = str(node.target), node.name, act_names
                op.checkpoint_region = node.meta.get("checkpoint_region", 0) if training else 0  # where, not what
                ops.append(op)
                continue
        if precise is not None and node.op == "call_module" and isinstance(modules[node.target], _RECURRENT):
            assert isinstance(counter, _NodeTrace)
            out, mm_flops, aliased = _recurrent_at(precise, modules[node.target], args, kwargs, counter)
        else:
            out, mm_flops, aliased = _run_counted(modules, node, args, kwargs, counter, training, settings,
                                                  exact=precise is not None, key=leaf_key)
        env[node.name] = out
        has_params = False
        if node.op == "call_module":
            mod = modules[node.target]
            if isinstance(mod, nn.Identity) or (not training and isinstance(mod, no_ops)):
                grad[node.name] = in_grad(node)  # no-ops: Identity always, dropout-likes in eval
                continue
            mod_params = [p for _, p in named_params]
            has_params = any(p.requires_grad for p in mod_params)
            cls_name = _module_class_name(mod)
            kind = _KERNEL_TWINS.get(cls_name, cls_name)
        else:
            if node.op == "call_function" and _is_disabled_dropout(node.target, args, kwargs):
                grad[node.name] = in_grad(node)  # returns its input: no kernel
                continue
            kind = _module_twin(_function_kind(node), args)
            if kind == "sub" and not training:
                # ATen runs ``a - b`` as ``add`` with alpha -1: the same kernel, so add's rows predict
                # it (a hand-written norm's ``x - mean``).  Not in training: its backward negates the
                # gradient of ``b`` in a kernel of its own, where add's passes it through.
                kind = "add"
        # Split the arguments into activation inputs, parameters and constants.
        split = _ArgSplitter(env, training)
        backend = _sdpa_backend_of(args, kwargs, training) if kind == "scaled_dot_product_attention" else ""
        if precise is not None:  # parameters read by functions: in the dtype the kernel reads them
            assert isinstance(counter, _NodeTrace)
            if backend not in ("", "math"):
                counter.casts = _without_math_upcasts(counter.casts)
            split.cast_to = {id(src): to for src, to in counter.casts}
        arg_template = _map_nodes(node.args, split)
        kwarg_template = _map_nodes(dict(node.kwargs), split)
        twin_settings = (_linear_settings(arg_template, kwarg_template) if kind == "addmm"
                         else _cell_linear_settings(arg_template) if kind == "cell_linear" else None)
        if twin_settings is not None:
            kind = "Linear"
        elif kind in _FUNCTIONAL_MODULES:
            twin = _functional_module_settings(kind, arg_template, kwarg_template,
                                               [_shape(t) for t in split.act_values])
            if twin is not None:
                kind, twin_settings = twin
        act_nodes, act_values = split.act_nodes, split.act_values
        has_params = has_params or split.has_params
        out_tensors = [t for t in _leaves(out) if _is_tensor(t)]
        if not out_tensors:
            grad[node.name] = in_grad(node)
            continue
        requires_grad = [bool(training and grad.get(n, False)) for n in act_nodes]
        # Only floating-point outputs carry gradients (a bool mask made from a float tensor does not),
        # and never a detached one (a stop-gradient: what reads it has no backward through it).
        grad[node.name] = bool(training and (has_params or any(requires_grad)) and kind not in _GRADIENT_STOPS
                               and any(t.is_floating_point() or t.is_complex() for t in out_tensors))
        in_numel = sum(t.numel() for t in act_values)
        out_numel = sum(t.numel() for t in out_tensors)
        param_numel = 0
        if node.op == "call_module":
            param_numel = sum(p.numel() for p in mod_params)
        else:
            param_numel = sum(int(torch.Size(p.shape).numel()) for p in _leaves((arg_template, kwarg_template))
                              if isinstance(p, ParamRef))
            if kind in _BATCH_NORM_BY_RANK.values():  # a module twin counts weight and bias, as the module does
                param_numel -= _running_stats_numel(arg_template, kwarg_template)
        # a fresh top-level dict for the record (_settings_of's are shared between calls; the
        # values inside are read, never changed, so they may be shared)
        settings = dict(settings) if node.op == "call_module" else dict(twin_settings or {})
        settings["args"] = _strip_acts(arg_template)
        settings["kwargs"] = _strip_acts(kwarg_template)
        elementwise = _flops_elementwise(kind, in_numel, out_numel, settings, training)
        in_dtypes = [str(t.dtype).replace("torch.", "") for t in act_values]
        bytes_read = int((in_numel + param_numel) * elem_size)
        if any(d != dtype_name for d in in_dtypes):  # token ids, masks: bytes at their own width
            bytes_read = int(sum(t.numel() * t.element_size() for t in act_values) + param_numel * elem_size)
        if kind in ("Embedding", "embedding"):  # a gather: reads the looked-up rows, not the whole table
            bytes_read = int(sum(t.numel() * t.element_size() for t in act_values) + out_numel * elem_size)
        op = Operation(
            kind=kind,
            category=node.op.replace("call_", ""),
            settings=settings,
            input_shapes=[list(_shape(t)) for t in act_values],
            input_requires_grad=requires_grad,
            output_shapes=[list(_shape(t)) for t in out_tensors],
            dtype=dtype_name,
            mode=mode_name,
            params=int(param_numel),
            flops=int(mm_flops),
            flops_elementwise=int(elementwise),
            flops_bwd=(_backward_flops(int(mm_flops), has_params, sum(map(bool, requires_grad)), elementwise)
                       if training else 0),
            bytes_read=bytes_read,
            bytes_written=int(out_numel * elem_size),
            name=str(node.target) if node.op == "call_module" else node.name,
            node=node.name,
            input_nodes=list(act_nodes),
            in_place=_is_in_place(node, settings),
        )
        if kind in _HEIGHT_ONE_TWINS and op.input_shapes:
            _as_height_one(op)
        elif kind == "einsum":
            _einsum_as_product(op)
        if any(d != dtype_name for d in in_dtypes):
            op.input_dtypes = in_dtypes
        # A view launches no kernel, but in training the backward of one that splits its input
        # into pieces assembles their gradients into one tensor (a copy into zeros or a cat):
        # in-network, chunk, split and unbind launched backward kernels in every training step.
        op.kernel_free = (aliased and not op.in_place and "out" not in kwargs
                          and not (training and any(requires_grad) and kind in GRAD_ASSEMBLING_VIEWS))
        op.backend = backend
        op.checkpoint_region = node.meta.get("checkpoint_region", 0) if training else 0
        if keep_sources:
            if node.op == "call_module":
                op.source = ("module", modules[node.target], arg_template, kwarg_template)
            else:
                op.source = (node.op.replace("call_", ""), node.target, arg_template, kwarg_template)
        if precise is not None:
            assert isinstance(counter, _NodeTrace)
            explicit = node.op == "call_method" and node.target in _EXPLICIT_CASTS
            ops.extend(_apply_precision(op, precise, counter, split, modules[node.target] if node.op == "call_module"
                                        else None, out_tensors, explicit, keep_sources))
        if kind == "baddbmm":  # after the precision pass, which reads the call's activation lists
            _baddbmm_as_bmm(op)
        if record_key is not None:
            _remember_record(record_key, op, grad[node.name], _LEAF_MEMO.get(leaf_key))
        ops.append(op)
    return ops, None


# Operations of leaf module calls, by everything their record depends on (_record_key): a
# repeated call (the same convolution, norm or activation on the same shape, in one network
# or across NAS candidates) is copied from here, its signature and feature row with it.
_RECORD_MEMO: collections.OrderedDict[Any, tuple[Operation, bool, Any]] = collections.OrderedDict()
_RECORD_MEMO_SIZE = 8192


def _record_key(leaf_key: Any, node: torch.fx.Node, env: dict[str, Any], grad: dict[str, bool], training: bool,
                dtype_name: str, named_params: list[tuple[str, nn.Parameter]]) -> tuple[Any, list[str]]:
    """What a leaf call's Operation depends on beyond its leaf memo key (type, settings, input
    shapes, strides, dtypes and constants, mode): the compute dtype, whether its parameters
    train, and how its arguments are wired: for each node argument, whether it is a parameter
    read or which activation it is (by first appearance), and whether that activation requires
    grad in training.  Also the names of its activation inputs, as _ArgSplitter lists them.
    (None, []) for a call not keyed here."""
    wiring: list[Any] = []
    seen: dict[str, int] = {}
    act_names: list[str] = []
    args = node.args
    # the commonest call, nodes as positional arguments only, without walking the structure
    leaves = args if not node.kwargs and all(type(a) is torch.fx.Node for a in args) else _leaves((args, node.kwargs))
    for a in leaves:
        if isinstance(a, torch.fx.Node):
            value = env[a.name]
            if a.op == "get_attr":  # read as a parameter reference: whether it trains matters
                wiring.append(("p", isinstance(value, nn.Parameter), bool(getattr(value, "requires_grad", False))))
            else:
                if a.name not in seen and _is_tensor(value):
                    act_names.append(a.name)
                wiring.append((seen.setdefault(a.name, len(seen)), bool(training and grad.get(a.name, False))))
        elif type(a) is slice:  # a node inside a slice is not keyed here: never shared
            return None, []
        else:
            wiring.append(None)
    trains = any(p.requires_grad for _, p in named_params)
    return (leaf_key, dtype_name, trains, tuple(wiring)), act_names


def _remember_record(key: Any, op: Operation, grad_out: bool, leaf: Any) -> None:
    """Keep a copy of ``op`` (its signature and feature row computed) for later calls of ``key``,
    with whether its output requires grad and its _LEAF_MEMO entry (None: the call's output is
    not remembered, so a later call runs it again).  Both are computed on ``op`` itself, which
    keeps them too (neither reads where the call sits), so predicting it does not compute them
    again."""
    from gpurec.ops.features import operation_feature_row

    _ = op.signature  # cached on the instance, so every copy carries it
    op.__dict__["_feature_row"] = tuple(operation_feature_row(op))
    template = Operation.__new__(Operation)  # copy.copy of the dataclass, without its reduce protocol
    template.__dict__.update(op.__dict__)
    template.name = template.node = ""
    template.input_nodes = []
    template.model = ""
    _RECORD_MEMO[key] = (template, grad_out, leaf)
    if len(_RECORD_MEMO) > _RECORD_MEMO_SIZE:
        _RECORD_MEMO.popitem(last=False)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype, device="meta").element_size()


def _apply_precision(op: Operation, precise: _Precise, counter: _NodeTrace, split: _ArgSplitter,
                     module: nn.Module | None, out_tensors: list[torch.Tensor], explicit: bool,
                     keep_sources: bool) -> list[Operation]:
    """Give ``op`` (extracted at a precision other than fp32) its precision, the dtypes its kernel
    reads and its byte counts in those dtypes; return the casts autocast ran on its inputs and
    weights, as operations that run before it.

    A cast of one of the operation's own inputs (an activation, a weight) is an operation of its
    own, and the operation then reads the cast copy; a cast of a tensor made inside the call
    (MultiheadAttention's internal softmax input) stays part of the operation's own work."""
    label = precise.precision
    if label == DEFAULT_PRECISION:  # autocast switched off inside forward (_switch_autocast)
        if all(t.dtype == torch.float32 for t in (*split.act_values, *out_tensors) if t.is_floating_point()):
            return []  # the fp32 operation, signature and all
        label = precise.scope  # it runs in the low dtype its inputs arrive in
    if label == "tf32":
        # Only the operators TF32 changes; the others are the fp32 operations, signatures and all.
        if counter.packets & _matmul_packets():
            op.precision = "tf32"
            op.input_dtypes = [_dtype_name(t.dtype) for t in split.act_values]
        return []
    op.precision = label
    input_dtypes = [t.dtype for t in split.act_values]
    named: dict[str, torch.Tensor] = {}
    if module is not None:
        named.update(module.named_parameters())
        named.update(module.named_buffers())
    name_of = {id(t): n for n, t in named.items()}
    read_params = {id(t) for _, t in split.param_values}
    act_index = {id(t): j for j, t in enumerate(split.act_values)}
    kernel_dtype: dict[str, torch.dtype] = {}  # module tensor -> the dtype its kernel reads
    casts: list[Operation] = []
    for src, to in ([] if explicit or not precise.mixed else counter.casts):
        j = act_index.get(id(src))
        if j is not None:
            input_dtypes[j] = to
            requires_grad, producer = op.input_requires_grad[j], op.input_nodes[j]
        elif id(src) in name_of or id(src) in read_params:
            if id(src) in name_of:
                kernel_dtype[name_of[id(src)]] = to
            requires_grad = op.mode == "training" and isinstance(src, nn.Parameter) and src.requires_grad
            producer = None
        else:
            continue  # made inside the call: part of the operation's own time
        cast = _cast_operation(src, to, op, len(casts), bool(requires_grad), producer, keep_sources)
        if j is not None:
            op.input_nodes[j] = cast.node  # the operation reads the cast copy
        casts.append(cast)
    op.input_dtypes = [_dtype_name(d) for d in input_dtypes]
    op.param_dtypes = {}
    for n, t in sorted(named.items()):
        d = kernel_dtype.get(n, t.dtype)
        if t.is_floating_point() and d != torch.float32:
            op.param_dtypes[n] = _dtype_name(d)
    floats = [t.dtype for t in out_tensors if t.is_floating_point()] or [d for d in input_dtypes if d.is_floating_point]
    op.dtype = _dtype_name(floats[0]) if floats else "float32"
    read = sum(t.numel() * _element_size(d) for t, d in zip(split.act_values, input_dtypes, strict=True))
    if module is not None:
        read += sum(p.numel() * _element_size(kernel_dtype.get(n, p.dtype)) for n, p in module.named_parameters())
    else:
        cast_to = split.cast_to or {}
        read += sum(t.numel() * _element_size(cast_to.get(id(t), t.dtype)) for _, t in split.param_values)
    op.bytes_read = int(read)
    op.bytes_written = int(sum(t.numel() * t.element_size() for t in out_tensors))
    return casts


def _cast_operation(src: torch.Tensor, to: torch.dtype, consumer: Operation, k: int, requires_grad: bool,
                    producer: str | None, keep_sources: bool) -> Operation:
    """The copy autocast makes of ``src`` in dtype ``to`` before ``consumer`` reads it."""
    numel = src.numel()
    cast = Operation(
        kind="autocast_cast",
        category="autocast",
        settings={"from_dtype": _dtype_name(src.dtype), "to_dtype": _dtype_name(to)},
        input_shapes=[list(_shape(src))],
        input_requires_grad=[requires_grad],
        output_shapes=[list(_shape(src))],
        dtype=_dtype_name(to),
        mode=consumer.mode,
        params=0,
        flops=0,
        flops_elementwise=0,
        flops_bwd=0,
        bytes_read=int(numel * src.element_size()),
        bytes_written=int(numel * _element_size(to)),
        name=f"{consumer.name}.cast",
        node=f"{consumer.node}.cast{k}",
        input_nodes=[producer] if producer else [],
        precision=consumer.precision,
        input_dtypes=[_dtype_name(src.dtype)],
    )
    if keep_sources:
        cast.source = ("method", "to", (ActRef(0),), {"dtype": to})
    return cast


_IN_PLACE_FUNCTIONS = {operator.iadd, operator.imul, operator.isub, operator.itruediv}


def _is_in_place(node: torch.fx.Node, settings: dict[str, Any]) -> bool:
    """Does the call write into its first input instead of allocating an output?"""
    if node.op == "call_module":
        return settings.get("inplace") is True
    if node.op == "call_function":
        return node.target in _IN_PLACE_FUNCTIONS or node.kwargs.get("inplace") is True
    return node.op == "call_method" and str(node.target).endswith("_") and not str(node.target).startswith("_")


def _map_nodes(a: Any, fn: Any) -> Any:
    """``fn`` applied to every fx Node in an fx argument structure (tuples, lists, dicts).

    A lighter torch.utils._pytree.tree_map for the shapes fx arguments take (it was a quarter
    of extraction time); it gives fx's immutable lists and dicts back as plain ones.  Slices
    are looked into, as fx's own map_arg does: ``self.pos[:, : ids.shape[1]]`` puts the node
    of ``ids.shape[1]`` in a slice, which becomes the concrete length when interpreted.
    """
    if isinstance(a, torch.fx.Node):
        return fn(a)
    if type(a) is slice and any(isinstance(v, torch.fx.Node) for v in (a.start, a.stop, a.step)):
        return slice(_map_nodes(a.start, fn), _map_nodes(a.stop, fn), _map_nodes(a.step, fn))
    if isinstance(a, tuple) and not isinstance(a, torch.Size):
        mapped = [_map_nodes(x, fn) for x in a]
        return type(a)(*mapped) if hasattr(a, "_fields") else tuple(mapped)
    if isinstance(a, list):
        return [_map_nodes(x, fn) for x in a]
    if isinstance(a, dict):
        return {k: _map_nodes(v, fn) for k, v in a.items()}
    return a


def _map_leaves(a: Any, fn: Any) -> Any:
    """``fn`` applied to every leaf of nested tuples (torch.Size and namedtuples included), lists
    and dicts, keeping the containers: torch's tree_map for these, without its per-node type
    dispatch (several times cheaper on the argument templates of a network)."""
    if isinstance(a, tuple):
        mapped = [_map_leaves(x, fn) for x in a]
        if isinstance(a, torch.Size):
            return torch.Size(mapped)
        return type(a)(*mapped) if hasattr(a, "_fields") else tuple(mapped)
    if isinstance(a, list):
        return [_map_leaves(x, fn) for x in a]
    if isinstance(a, dict):
        return {k: _map_leaves(v, fn) for k, v in a.items()}
    return fn(a)


def _leaves(a: Any) -> list[Any]:
    """The leaves of nested tuples, lists and dicts, in tree_flatten's order."""
    out: list[Any] = []

    def walk(x: Any) -> None:
        if isinstance(x, (tuple, list)):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        else:
            out.append(x)

    walk(a)
    return out


class _ArgSplitter:
    """Maps an fx argument to an activation reference, a parameter reference or a constant."""

    def __init__(self, env: dict[str, Any], training: bool):
        self.env = env
        self.training = training
        self.act_nodes: list[str] = []
        self.act_values: list[torch.Tensor] = []
        self.has_params = False
        # Non-fp32 precisions: the dtype a tensor is cast to before the kernel reads it (by id),
        # and the parameters read, with the name of the get_attr node that read each.
        self.cast_to: dict[int, torch.dtype] | None = None
        self.param_values: list[tuple[str, torch.Tensor]] = []

    def __call__(self, a: Any) -> Any:
        if not isinstance(a, torch.fx.Node):
            return a
        value = self.env[a.name]
        if a.op == "get_attr" and _is_tensor(value):
            if isinstance(value, nn.Parameter) and value.requires_grad:
                self.has_params = True
            dtype = value.dtype if self.cast_to is None else self.cast_to.get(id(value), value.dtype)
            if self.cast_to is not None:
                self.param_values.append((str(a.target), value))
            return ParamRef(tuple(_shape(value)), str(dtype).replace("torch.", ""),
                            bool(self.training and isinstance(value, nn.Parameter)))
        if _is_tensor(value):
            if a.name not in self.act_nodes:
                self.act_nodes.append(a.name)
                self.act_values.append(value)
            return ActRef(self.act_nodes.index(a.name))
        return value


def _strip_acts(template: Any) -> Any:
    """JSON-able form of an argument template (activations as "$i", params as shapes)."""
    def conv(x: Any) -> Any:
        if isinstance(x, ActRef):
            return f"${x.index}"
        if isinstance(x, ParamRef):
            return {"param": list(x.shape), "dtype": x.dtype}
        return canonical_value(x)

    out = _map_leaves(template, conv)
    if isinstance(out, tuple):
        out = list(out)
    return out


# Leaf modules with the same settings on the same input give the same output shapes and
# FLOPs: remember them, so repeated blocks (within a network and across NAS candidates) skip
# the meta kernels.  Keys hold no tensors; the memo is bounded.
_LEAF_MEMO: collections.OrderedDict[Any, tuple[Any, list[Any], int]] = collections.OrderedDict()
_LEAF_MEMO_SIZE = 8192


class _Unkeyable(Exception):
    """An argument with no stable key: the call is not memoised."""


def _value_key(x: Any) -> Any:
    """A hashable key equal only for arguments of equal shapes, dtypes, strides and constants
    (scalars keep their type: ``True``, ``1`` and ``1.0`` differ, as in a signature)."""
    t = type(x)
    if t is int or t is str or x is None:
        return x
    if _is_tensor(x):
        return ("T", tuple(x.shape), str(x.dtype), tuple(x.stride()))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_value_key(v) for v in x))
    if isinstance(x, dict):
        return ("D", tuple(sorted((str(k), _value_key(v)) for k, v in x.items())))
    if isinstance(x, (bool, int, float, str)):
        return (t, repr(x))  # a type is never an argument value, so these tags are unambiguous
    raise _Unkeyable


def _leaf_key(mod: nn.Module, args: Any, kwargs: Any, training: bool, settings: dict[str, Any],
              settings_text: str | None = None) -> Any:
    """The leaf memo's key.  ``settings`` holds canonical values only (JSON types, built in one
    order by _module_settings), so its repr identifies it; repr is several times cheaper than
    the sorted JSON it replaced.  ``settings_text``: that repr, where the caller has it."""
    if not type(mod).__module__.startswith("torch.nn"):
        return None
    if not kwargs and all(type(x) is torch.Tensor for x in args):  # the commonest call, as _value_key keys it
        a: Any = ("tuple", tuple([("T", tuple(x.shape), str(x.dtype), tuple(x.stride())) for x in args]))
        k: Any = ("D", ())
    else:
        try:
            a, k = _value_key(tuple(args)), _value_key(dict(kwargs))
        except _Unkeyable:
            return None
    return (type(mod), repr(settings) if settings_text is None else settings_text, a, k, training)


def _run_counted(modules: dict[str, nn.Module], node: torch.fx.Node, args: Any, kwargs: Any, counter: _NodeFlops,
                 training: bool, settings: dict[str, Any], exact: bool = False, key: Any = None
                 ) -> tuple[Any, int, bool]:
    """Run one node on meta and count its FLOPs, reusing memoised leaf-module results.
    The flag says whether every output aliases an input (a view or the input itself).

    ``exact`` (a precision other than fp32): every node runs through ``counter``, with no memo
    and no analytic shortcut, and its tensors are used as they are (already swapped by the
    caller), because the dtypes, casts and operators it records depend on the real call."""
    if exact:
        assert isinstance(counter, _NodeTrace)
        counter.reset()
        with counter:
            out = _run_node(modules, node, args, kwargs, swap=False)
        return out, counter.current, _aliases_input(out, args, kwargs)
    # ``key``: the leaf memo key, when the caller computed it already
    if key is None and node.op == "call_module":
        key = _leaf_key(modules[node.target], args, kwargs, training, settings)
    hit = _LEAF_MEMO.get(key) if key is not None else None
    if hit is not None:
        _LEAF_MEMO.move_to_end(key)
        return _made_output(hit), hit[2], hit[3]
    if key is not None:
        mod = modules[node.target]
        known = (_analytic_recurrent(mod, args, kwargs) if isinstance(mod, _RECURRENT)
                 else _analytic_leaf(mod, args, kwargs))
    elif node.op == "call_function" and node.target in _BINARY_FUNCTIONS:
        known = _analytic_binary(args, kwargs)
    else:
        known = None
    if known is not None:
        out, flops = known
        aliased = False
    else:
        counter.current = 0
        with counter:  # only around real meta calls: the mode makes every dispatch a Python call
            out = _run_node(modules, node, args, kwargs)
        flops = counter.current
        aliased = _aliases_input(out, args, kwargs)
    if key is not None:
        # spec None: the output is one tensor (the commonest case; tree_unflatten of a leaf was
        # a few per cent of a fresh candidate's extraction)
        leaves, spec = ([out], None) if _is_tensor(out) else tree_flatten(out)
        if all(_is_tensor(v) or v is None for v in leaves):
            _LEAF_MEMO[key] = (spec, [(tuple(v.shape), tuple(v.stride()), v.dtype) if _is_tensor(v) else v
                                      for v in leaves], flops, aliased)
            if len(_LEAF_MEMO) > _LEAF_MEMO_SIZE:
                _LEAF_MEMO.popitem(last=False)
    return out, flops, aliased


def _made_output(hit: tuple[Any, list[Any], int, bool]) -> Any:
    """The output of a remembered leaf call (a _LEAF_MEMO entry), as new meta tensors."""
    spec, leaves = hit[0], hit[1]
    made = [torch.empty_strided(v[0], v[1], dtype=v[2], device="meta") if isinstance(v, tuple) else v
            for v in leaves]
    return made[0] if spec is None else tree_unflatten(made, spec)


def _aliases_input(out: Any, args: Any, kwargs: Any) -> bool:
    """Is every output tensor an input tensor or a view of one's storage?  Such a call (a view,
    ``contiguous()`` of a contiguous tensor, ``.to`` its own dtype, dropout with p=0) launches
    no kernel.  Calls that write into an input or an ``out=`` argument are judged elsewhere."""
    outs = [t for t in _leaves(out) if _is_tensor(t)]
    if not outs:
        return False
    bases = {id(t._base if t._base is not None else t) for t in _leaves((args, kwargs)) if _is_tensor(t)}
    return all(id(t._base if t._base is not None else t) in bases for t in outs)


_RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _analytic_recurrent(rnn: nn.Module, args: Any, kwargs: Any) -> tuple[Any, int] | None:
    """Outputs and FLOPs of nn.LSTM / nn.GRU / nn.RNN on a batched 3-D input, without running
    it on meta (its meta forward steps through time in Python: seconds for long sequences).

    FLOPs are the gate products as cuDNN computes them: per layer and direction, the input
    projection over the whole sequence and the recurrent product at every step,
    2 * seq * batch * gates * hidden * (layer input + hidden) (plus 2 * seq * batch * hidden *
    proj_size for an LSTM projection).  Anything else (unbatched input, packed sequences)
    returns None and runs on meta.
    """
    x = args[0] if args else None
    if kwargs or len(args) > 2 or not _is_tensor(x) or x.dim() != 3 or x.device.type != "meta":
        return None
    if x.shape[-1] != rnn.input_size or not x.dtype.is_floating_point:
        return None  # the real call raises; let it, with its own message
    gates = _RECURRENT_GATES.get(rnn.mode)
    if gates is None:
        return None
    seq, batch = (x.shape[1], x.shape[0]) if rnn.batch_first else (x.shape[0], x.shape[1])
    dirs = 2 if rnn.bidirectional else 1
    hidden, proj = rnn.hidden_size, getattr(rnn, "proj_size", 0) or 0
    h_out = proj or hidden
    flops, layer_in = 0, rnn.input_size
    for _ in range(rnn.num_layers):
        per_dir = 2 * seq * batch * gates * hidden * (layer_in + h_out)
        if proj:
            per_dir += 2 * seq * batch * hidden * proj
        flops += dirs * per_dir
        layer_in = dirs * h_out
    out_shape = (batch, seq, dirs * h_out) if rnn.batch_first else (seq, batch, dirs * h_out)
    out = torch.empty(out_shape, dtype=x.dtype, device="meta")
    h_n = torch.empty((rnn.num_layers * dirs, batch, h_out), dtype=x.dtype, device="meta")
    if rnn.mode == "LSTM":
        c_n = torch.empty((rnn.num_layers * dirs, batch, hidden), dtype=x.dtype, device="meta")
        return (out, (h_n, c_n)), int(flops)
    return (out, h_n), int(flops)


def rnn_autocast_dtype() -> torch.dtype | None:
    """The dtype CUDA autocast runs a whole recurrent layer (nn.LSTM/GRU/RNN) in, or None if
    it leaves it alone.  On CUDA the layer is one ``aten::_cudnn_rnn`` call; torch registers an
    autocast kernel for it (asked of the dispatcher here) that casts the input, the hidden
    state and the weights (into one flat buffer) to float16 whatever autocast's dtype, bf16
    included (aten/src/ATen/cudnn/AutocastRNN.cpp: ``cached_cast(at::kHalf, ...)``).  The
    per-step cells (lstm_cell, gru_cell, rnn_*_cell) are on autocast's lower-precision list
    and run through torch's own autocast kernels like any other leaf."""
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_cudnn_rnn", "AutocastCUDA"):
        return torch.float16
    return None


def _recurrent_at(precise: _Precise, rnn: nn.Module, args: Any, kwargs: Any,
                  counter: _NodeTrace) -> tuple[Any, int, bool]:
    """A whole recurrent layer at a precision other than fp32, analytically (as in fp32): under
    CUDA autocast in rnn_autocast_dtype() with the casts of its float inputs and weights recorded
    in ``counter`` as torch's autocast kernel makes them; under TF32 the fp32 layer (cuDNN's RNN
    math mode is TF32 by default already).  A module cast to bf16/fp16 is refused."""
    label = precise.precision
    if label in CAST:
        raise ExtractionError(f"{type(rnn).__name__} in a module cast to {label} is not supported yet: "
                              f"use precision '{label}-mixed' with the float32 module")
    x = args[0] if args else None
    active = precise.mixed and torch.is_autocast_enabled("cuda")
    to = rnn_autocast_dtype() if active else None
    if not _is_tensor(x):
        raise ExtractionError(f"{type(rnn).__name__} takes a tensor input, got {type(x).__name__}")
    run_dtype = to if to is not None and x.is_floating_point() else x.dtype
    known = _analytic_recurrent(rnn, (torch.empty(tuple(x.shape), dtype=run_dtype, device="meta"), *args[1:]), kwargs)
    if known is None:
        raise ExtractionError(f"{type(rnn).__name__} at precision {label!r}: only a batched 3-D tensor input "
                              "with the default hidden state form is supported (packed sequences are not)")
    meta_out, flops = known
    device = x.device
    out = tree_unflatten([torch.empty(tuple(t.shape), dtype=t.dtype, device=device)
                          for t in tree_flatten(meta_out)[0]], tree_flatten(meta_out)[1])
    counter.reset()
    counter.current = int(flops)
    if to is not None:
        floats = [t for t in _leaves((args, kwargs)) if _is_tensor(t) and t.is_floating_point() and t.dtype != to]
        floats += [p for p in rnn.parameters() if p.is_floating_point() and p.dtype != to]
        counter.casts = [(t, to) for t in floats]
    return out, int(flops), False


# Shape-preserving leaves whose FLOPs FlopCounterMode counts as zero (our own per-element counts
# come from _flops_elementwise).
_UNARY_LEAVES: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.SiLU, nn.GELU, nn.Hardswish,
                                              nn.Hardsigmoid, nn.Sigmoid, nn.Tanh, nn.BatchNorm2d)


def _analytic_leaf(mod: nn.Module, args: Any, kwargs: Any) -> tuple[torch.Tensor, int] | None:
    """Output and FLOPs of the commonest CNN leaves without running their meta kernels.

    Why: for a candidate whose layer shapes were never seen (a NAS width search), the meta
    kernels of Conv2d, BatchNorm2d and activations dominated extraction.  Only the plain
    case is handled (one contiguous 4-D or unary input, zero padding given as numbers,
    contiguous weights); anything else, and any input the real call would reject, returns
    None and runs on meta.  FLOPs use FlopCounterMode's own convolution formula;
    tests/test_ops.py checks both against meta on many configurations.
    """
    if kwargs or len(args) != 1 or not _is_tensor(args[0]):
        return None
    x = args[0]
    if x.device.type != "meta" or not x.is_contiguous():
        return None
    kind = type(mod)
    if kind in _UNARY_LEAVES:
        if kind is nn.BatchNorm2d:
            if x.dim() != 4 or x.shape[1] != mod.num_features:
                return None
            if mod.training and x.shape[0] * x.shape[2] * x.shape[3] == 1:
                return None  # the real call raises "Expected more than 1 value per channel"
        return torch.empty(x.shape, dtype=x.dtype, device="meta"), 0
    if kind is nn.AdaptiveAvgPool2d:
        return _analytic_adaptive_pool(mod, x)
    if kind is not nn.Conv2d or mod.padding_mode != "zeros" or isinstance(mod.padding, str):
        return None
    w = mod.weight
    if x.dim() != 4 or x.shape[1] != mod.in_channels or w.dtype != x.dtype or not w.is_contiguous():
        return None
    spatial = []
    for size, k, s, p, d in zip(x.shape[2:], mod.kernel_size, mod.stride, mod.padding, mod.dilation, strict=True):
        out = (size + 2 * p - d * (k - 1) - 1) // s + 1
        if out <= 0:
            return None
        spatial.append(out)
    out_shape = [x.shape[0], mod.out_channels, *spatial]
    from torch.utils.flop_counter import conv_flop_count

    flops = conv_flop_count(list(x.shape), list(w.shape), out_shape, transposed=False)
    return torch.empty(out_shape, dtype=x.dtype, device="meta"), int(flops)


def _analytic_adaptive_pool(mod: nn.AdaptiveAvgPool2d, x: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """AdaptiveAvgPool2d on a contiguous 4-D float input with no empty dimension: a contiguous
    (N, C, *output_size) result and no FLOPs counted (FlopCounterMode counts none for it)."""
    size = mod.output_size
    hw = (size, size) if isinstance(size, int) else tuple(size)
    if x.dim() != 4 or not x.dtype.is_floating_point or 0 in x.shape or len(hw) != 2:
        return None
    if x.stride() != contiguous_strides(x.shape):
        return None
    out = [x.shape[2 + i] if s is None else int(s) for i, s in enumerate(hw)]
    if min(out) <= 0:
        return None
    return torch.empty((x.shape[0], x.shape[1], *out), dtype=x.dtype, device="meta"), 0


def _is_param_or_buffer(modules: dict[str, nn.Module], target: str) -> bool:
    """Does the get_attr ``target`` name a parameter or buffer (not a plain tensor attribute)?"""
    owner, _, attr = target.rpartition(".")
    mod = modules.get(owner)
    return mod is not None and (attr in mod._parameters or attr in mod._buffers)


def _is_fx_constant(target: str) -> bool:
    """Is the get_attr ``target`` a tensor torch.fx made while tracing?  fx does not proxy buffers,
    so what forward computes from one (timm's Swin: ``mask.unsqueeze(1)`` of its attention-mask
    buffer) runs eagerly at trace time, on the buffer's device, and enters the graph as a constant:
    only its shape matters here."""
    return target.rpartition(".")[2].startswith("_tensor_constant")


# Element-wise functions of two tensors (a residual ``x + y``) that _analytic_binary may answer.
_BINARY_FUNCTIONS = frozenset({operator.add, operator.sub, operator.mul, operator.truediv})


def _analytic_binary(args: Any, kwargs: Any) -> tuple[torch.Tensor, int] | None:
    """Output and FLOPs (none counted by FlopCounterMode) of ``a + b`` (or -, *, /) on two
    floating-point meta tensors of one dtype and contiguous layout, without the meta kernel:
    residual additions, and squeeze-excite's ``scale * x`` (one operand of the output's shape,
    the other broadcast along some of its dimensions), were the commonest calls left that ran on
    meta.  Anything else (both operands broadcast, scalars, other layouts, in-place forms) returns
    None and runs on meta; tests/test_extract_speed.py checks the result against meta."""
    if kwargs or len(args) != 2:
        return None
    a, b = args
    if not (_is_tensor(a) and _is_tensor(b)) or a.device.type != "meta" or b.device.type != "meta":
        return None
    if a.dtype != b.dtype or not a.dtype.is_floating_point or a.dim() != b.dim():
        return None
    full, other = (a, b) if all(x >= y for x, y in zip(a.shape, b.shape, strict=True)) else (b, a)
    if any(y not in (x, 1) for x, y in zip(full.shape, other.shape, strict=True)):
        return None  # both broadcast, or shapes the real call rejects
    if other.shape != full.shape and 1 in full.shape:
        return None  # a broadcast against size-1 dimensions: the kernel's stride choice is not this simple
    if full.stride() != contiguous_strides(full.shape) or other.stride() != contiguous_strides(other.shape):
        return None
    return torch.empty(full.shape, dtype=a.dtype, device="meta"), 0


def _run_node(modules: dict[str, nn.Module], node: torch.fx.Node, args: Any, kwargs: Any, swap: bool = True) -> Any:
    if node.op == "call_module":
        if not swap:
            return modules[node.target](*args, **kwargs)
        with _swapped_to_meta(modules[node.target]):  # a no-op where its tensors are on meta already
            return modules[node.target](*args, **kwargs)
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        self_obj, *rest = args
        return getattr(self_obj, node.target)(*rest, **kwargs)
    raise ExtractionError(f"unexpected fx node {node.op}")


def network_totals(ops: Sequence[Operation]) -> dict[str, float]:
    """Network-level totals of the analytic features."""
    return {
        "operations": len(ops),
        "distinct_operations": len({op.signature for op in ops}),
        "flops": sum(op.flops for op in ops),
        "flops_elementwise": sum(op.flops_elementwise for op in ops),
        "flops_bwd": sum(op.flops_bwd for op in ops),
        "bytes_read": sum(op.bytes_read for op in ops),
        "bytes_written": sum(op.bytes_written for op in ops),
        "params": sum(op.params for op in ops),
    }


def reference_flops(model: str | nn.Module, input_shape: Sequence[int], mode: str = "inference") -> int:
    """FlopCounterMode's forward count for the same forward, on meta (the coverage reference)."""
    from torch.utils.flop_counter import FlopCounterMode

    _, meta = resolve_model(model)
    meta.train(mode == "training")
    x = torch.empty(_normalise_input_shape(input_shape), device="meta")
    with FlopCounterMode(display=False) as fc:
        meta(x)
    return int(fc.get_total_flops())


def unique_operations(ops_lists: Sequence[Sequence[Operation]]) -> dict[str, Operation]:
    """First operation of each signature across several extractions (deduplication)."""
    seen: dict[str, Operation] = {}
    for ops in ops_lists:
        for op in ops:
            seen.setdefault(op.signature, op)
    return seen
