"""The shortcuts that make extracting a never-seen module fast (issue 13's speed target) give
what the long way gives: the same fx graph, the same operations, the same features.

The speed itself is measured by `gpurec report speed --measure` (benchmarks/speed.json), not
here: a timed test on a shared machine could not fail for the right reason.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from gpurec.model.bench import random_mobilenet
from gpurec.ops import extract_operations
from gpurec.ops.extract import tracing_session

MODES = ("inference", "training")


class _FxTracer(torch.fx.Tracer):
    """The tracer as it was before the shortcuts: torch.fx's own call_module and create_arg."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        from gpurec.ops.extract import _DECOMPOSITIONS, _leaf_types

        if isinstance(m, _leaf_types()):
            return True
        if isinstance(m, (nn.Sequential, nn.ModuleList, nn.ModuleDict)) or type(m) in _DECOMPOSITIONS:
            return False
        return type(m).__module__.startswith("torch.nn")

    def call_module(self, m, forward, args, kwargs):  # noqa: ANN001, ANN201
        from gpurec.ops.extract import _DECOMPOSITIONS

        decomposition = _DECOMPOSITIONS.get(type(m))
        if decomposition is not None:
            forward = functools.partial(decomposition, m)
        return super().call_module(m, forward, args, kwargs)


def _nodes(graph: torch.fx.Graph) -> list[tuple[str, str, str, str, str]]:
    return [(n.op, n.name, str(n.target), repr(n.args), repr(n.kwargs)) for n in graph.nodes]


class _Odd(nn.Module):
    """Arguments fx has to work for: kwargs, lists, slices, a buffer, a parameter used by a
    function, a namedtuple-free tuple output, floats, None and a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.register_buffer("scale", torch.ones(1, 8, 1, 1))
        self.w = nn.Parameter(torch.ones(16, 16))
        self.skip = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x) * self.scale
        y = F.interpolate(y, scale_factor=0.5, mode="bilinear", align_corners=None)
        y = torch.cat([y, y[:, :4, ::2, ::2].repeat(1, 2, 2, 2)], dim=1) if self.skip else y
        z = torch.flatten(y, start_dim=2).transpose(1, 2)
        z = F.linear(z, self.w[:, :16].t().contiguous()).reshape(z.shape[0], -1, 16)
        return F.softmax(z.sum(dim=(1,), keepdim=False), dim=-1)


@pytest.mark.parametrize("make", [
    lambda: random_mobilenet(1),
    lambda: random_mobilenet(7),
    _Odd,
    lambda: nn.Sequential(nn.Linear(16, 32),
                          nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2)),
    *[functools.partial(lambda n: __import__("torchvision").models.get_model(n), n)
      for n in ("resnet18", "mobilenet_v3_small", "googlenet", "swin_t", "efficientnet_b0", "vit_b_32",
                "regnet_x_400mf", "convnext_tiny", "inception_v3", "maxvit_t")],
])
def test_tracer_shortcuts_give_fx_graph(make) -> None:
    from gpurec.ops.extract import _Tracer

    def build() -> nn.Module:
        try:
            with torch.device("meta"):
                return make()
        except Exception:  # RegNets initialise with data-dependent ops
            return make()

    for training in (False, True):
        # a fresh module per trace: tracing stows tensor constants on the root, which renames later ones
        ours, theirs = build().train(training), build().train(training)
        assert _nodes(_Tracer().trace(ours)) == _nodes(_FxTracer().trace(theirs))
        in_session = build().train(training)
        with tracing_session():  # nn.Module patched once for many traces, as predict_many does
            assert _nodes(_Tracer().trace(in_session)) == _nodes(_FxTracer().trace(build().train(training)))


def test_tracing_session_restores_nn_module_and_leaves_other_calls_alone() -> None:
    """In a session, modules called outside a trace (and from another thread) run as ever; after
    it, also after an error in a trace, nn.Module's methods are its own again."""
    import threading

    from gpurec.ops.extract import _Tracer

    call, getattr_ = nn.Module.__call__, nn.Module.__getattr__
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    x = torch.ones(2, 4)
    expected = net(x)
    with pytest.raises(ZeroDivisionError), tracing_session():
        assert nn.Module.__call__ is not call
        assert torch.equal(net(x), expected) and net[0].weight.shape == (3, 4)
        other: list[torch.Tensor] = []
        worker = threading.Thread(target=lambda: other.append(net(x)))
        worker.start()
        worker.join()
        assert torch.equal(other[0], expected)
        _Tracer().trace(random_mobilenet(2))
        assert torch.equal(net(x), expected)  # not traced after the trace
        raise ZeroDivisionError("an error in the session")
    assert nn.Module.__call__ is call and nn.Module.__getattr__ is getattr_


def test_analytic_binary_agrees_with_meta_and_declines_the_rest() -> None:
    import operator

    from gpurec.ops.extract import _analytic_binary

    def meta(shape: tuple[int, ...], stride: tuple[int, ...] | None = None, dtype=torch.float32) -> torch.Tensor:
        if stride is None:
            return torch.empty(shape, dtype=dtype, device="meta")
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")

    for fn in (operator.add, operator.sub, operator.mul, operator.truediv):
        for shape in [(8, 32, 56, 56), (8, 1280, 1, 1), (2, 197, 768), (3,)]:
            for dtype in (torch.float32, torch.float16):
                a, b = meta(shape, dtype=dtype), meta(shape, dtype=dtype)
                got = _analytic_binary((a, b), {})
                ref = fn(a, b)
                assert got is not None and got[1] == 0
                assert (got[0].shape, got[0].stride(), got[0].dtype) == (ref.shape, ref.stride(), ref.dtype)
    # squeeze-excite's scale * x: one operand of the output's shape, the other broadcast, either order
    for fn in (operator.mul, operator.add, operator.truediv):
        for full, part in [((8, 32, 56, 56), (8, 32, 1, 1)), ((2, 64, 7, 7), (1, 64, 1, 1)), ((3, 5, 2, 3), (3, 1, 2, 1)),
                           ((2, 197, 768), (2, 197, 1)), ((4, 10), (1, 10))]:
            for a, b in ((meta(full), meta(part)), (meta(part), meta(full))):
                got, ref = _analytic_binary((a, b), {}), fn(a, b)
                assert got is not None and got[1] == 0
                assert (got[0].shape, got[0].stride(), got[0].dtype) == (ref.shape, ref.stride(), ref.dtype)
    x = meta((8, 16, 4, 4))
    declined = [
        (meta((8, 1)), meta((1, 16))),  # both broadcast
        (x, meta((8, 3, 1, 1))),  # shapes the real call rejects
        (meta((8, 16, 1, 4)), meta((8, 1, 1, 4))),  # broadcast against a size-1 dimension
        (x, meta((16, 1, 1))),  # fewer dimensions
        (x, 2.0),  # a scalar
        (x, meta((8, 16, 4, 4), dtype=torch.float16)),  # type promotion
        (meta((8, 16), dtype=torch.int64), meta((8, 16), dtype=torch.int64)),  # integer division is not closed
        (x.transpose(2, 3), x.transpose(2, 3)),  # not contiguous
        (meta((8, 1280, 1, 1), (1280, 1, 1280, 1280)),) * 2,  # contiguous, but meta keeps these odd strides
        (torch.empty(8, 16), torch.empty(8, 16)),  # not meta
    ]
    for args in declined:
        assert _analytic_binary(args, {}) is None, args
    assert _analytic_binary((x, x), {"alpha": 2}) is None


def _features_the_long_way(op) -> dict[str, float]:  # noqa: ANN001
    """operation_features as it was written before operation_feature_row (one dict per call)."""

    def first(value, default=0.0):  # noqa: ANN001, ANN202
        if isinstance(value, (list, tuple)):
            return float(value[0]) if value and isinstance(value[0], (int, float)) else default
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, (int, float)):
            return float(value)
        return default

    def prod(value):  # noqa: ANN001, ANN202
        if isinstance(value, (list, tuple)):
            return float(math.prod(v for v in value if isinstance(v, (int, float))))
        return first(value)

    s = op.settings
    shape = op.input_shapes[0] if op.input_shapes else []
    bytes_total = op.bytes_read + op.bytes_written
    channels = height = width = seq_len = 0.0
    if len(shape) == 4:
        channels, height, width = float(shape[1]), float(shape[2]), float(shape[3])
    elif len(shape) == 3:
        seq_len, channels = float(shape[1]), float(shape[2])
    elif len(shape) == 2:
        channels = float(shape[1])
    return {
        "flops": float(op.flops), "flops_elementwise": float(op.flops_elementwise), "flops_bwd": float(op.flops_bwd),
        "flops_total": float(op.flops + op.flops_elementwise), "bytes_read": float(op.bytes_read),
        "bytes_written": float(op.bytes_written), "bytes_total": float(bytes_total),
        "arithmetic_intensity": (op.flops + op.flops_elementwise) / bytes_total if bytes_total else 0.0,
        "params": float(op.params), "input_elements": float(sum(math.prod(x) for x in op.input_shapes)),
        "output_elements": float(sum(math.prod(x) for x in op.output_shapes)),
        "n_inputs": float(len(op.input_shapes)), "batch": float(shape[0]) if shape else 0.0,
        "channels": channels, "height": height, "width": width, "seq_len": seq_len,
        "in_channels": first(s.get("in_channels")), "out_channels": first(s.get("out_channels")),
        "kernel_size": prod(s.get("kernel_size", 0)), "stride": first(s.get("stride", 0)),
        "padding": first(s.get("padding", 0)), "dilation": first(s.get("dilation", 0)),
        "groups": first(s.get("groups", 0)), "in_features": first(s.get("in_features")),
        "out_features": first(s.get("out_features")), "embed_dim": first(s.get("embed_dim")),
        "num_heads": first(s.get("num_heads")), "input_requires_grad": float(any(op.input_requires_grad)),
        "element_bytes": {"bfloat16": 2.0, "float16": 2.0, "float64": 8.0}.get(op.dtype, 4.0),
        "math_mode": {"bfloat16": 3.0, "float16": 2.0}.get(op.dtype, 1.0 if op.precision == "tf32" else 0.0),
    } | (_recurrent_features(op) if op.kind in ("LSTM", "GRU", "RNN") else {})


def _recurrent_features(op) -> dict[str, float]:  # noqa: ANN001
    """A whole recurrent layer's settings in the shared features (gpurec.ops.features)."""
    s, shape = op.settings, op.input_shapes[0]
    dirs = 2 if s["bidirectional"] else 1
    batch, seq = (shape[0], shape[1]) if s["batch_first"] else (shape[1], shape[0])
    return {"batch": float(batch), "seq_len": float(seq), "in_features": float(s["input_size"]),
            "out_features": float(s["hidden_size"] * dirs), "embed_dim": float(s["hidden_size"]),
            "num_heads": float(s["num_layers"] * dirs)}


@pytest.mark.parametrize("mode", MODES)
def test_feature_rows_match_the_feature_dicts(mode: str) -> None:
    from gpurec.model.features import OpBlock
    from gpurec.ops.features import FEATURE_NAMES, operation_feature_row

    ops = [*extract_operations(random_mobilenet(3), (2, 3, 96, 96), mode=mode, keep_sources=False),
           *extract_operations(_Odd(), (2, 3, 16, 16), mode=mode, keep_sources=False),
           *extract_operations("vit_b_32", (2, 3, 224, 224), mode=mode, keep_sources=False),
           *extract_operations("inception_v3", (2, 3, 299, 299), mode=mode, keep_sources=False),
           *extract_operations(nn.LSTM(8, 16), (5, 2, 8), mode=mode, keep_sources=False)]
    block = OpBlock.from_operations(ops, mode)
    for i, op in enumerate(ops):
        want = _features_the_long_way(op)
        assert list(want) == list(FEATURE_NAMES)
        assert operation_feature_row(op) == list(want.values()) == block.values[i].tolist(), op.kind
        assert op.features() == want


class _Skip(nn.Module):
    """A block whose forward branches on a flag that its repr does not show."""

    def __init__(self, skip: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.skip = skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return x + y if self.skip else y


def test_structure_key_sees_flags_that_forward_reads_and_ignores_weights_and_mode() -> None:
    from gpurec.model.predictor import structure_key

    a, b = nn.Sequential(_Skip(True), nn.ReLU()), nn.Sequential(_Skip(False), nn.ReLU())
    assert repr(a) == repr(b)  # what the key was made of before, with the parameter shapes
    assert len(extract_operations(a, (1, 8, 4, 4))) != len(extract_operations(b, (1, 8, 4, 4)))
    assert structure_key(a) != structure_key(b)
    twin = nn.Sequential(_Skip(True), nn.ReLU()).eval()  # other weights, other mode
    assert structure_key(twin) == structure_key(a)
    wider = nn.Sequential(_Skip(True), nn.ReLU())
    wider[0].conv = nn.Conv2d(8, 8, 5, padding=2)
    assert structure_key(wider) != structure_key(a)
    frozen = nn.Sequential(_Skip(True), nn.ReLU())
    frozen[0].conv.weight.requires_grad_(False)  # changes the backward
    assert structure_key(frozen) != structure_key(a)


def test_module_bookkeeping_is_never_a_setting() -> None:
    """_module_settings drops nn.Module's own attributes before its per-key filter; that is the
    same filter only while all of them are private or ``training``."""
    from gpurec.ops.extract import _module_bookkeeping, _module_settings

    assert all(k.startswith("_") or k == "training" for k in _module_bookkeeping())
    conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
    conv.custom_flag = True
    settings = _module_settings(conv, list(conv.named_parameters()))
    assert settings["custom_flag"] is True and settings["in_channels"] == 3 and "training" not in settings
    assert list(settings)[-1] == "param_shapes" and list(settings)[:-1] == sorted(list(settings)[:-1])


def test_remembered_module_texts_are_those_computed() -> None:
    """structure_key's remembered per-module text is the one computed, also after a module of
    the class with attribute values that compare equal (1, True, 1.0), other parameter shapes,
    a parameter turned buffer, or frozen weights was seen first."""
    from gpurec.model.predictor import _module_bookkeeping, _module_text, _module_text_computed

    def conv(frozen: bool = False, **attrs: object) -> nn.Conv2d:
        m = nn.Conv2d(3, 8, 3)
        m.weight.requires_grad_(not frozen)
        for k, v in attrs.items():
            setattr(m, k, v)
        return m

    as_buffer = nn.Linear(4, 4)
    del as_buffer.bias
    as_buffer.register_buffer("bias", torch.zeros(4, requires_grad=True))
    modules = [conv(flag=1), conv(flag=True), conv(flag=1.0), conv(flag=(1, 1)), conv(flag=(True, True)),
               conv(flag=[1, 1]), conv(flag="1"), conv(frozen=True), conv(_private=2), nn.Conv2d(3, 8, 5),
               nn.Conv2d(3, 8, 3, bias=False), nn.Linear(4, 4), as_buffer, nn.BatchNorm2d(8),
               nn.BatchNorm2d(8, affine=False), nn.ReLU6(inplace=True), nn.GELU(approximate="tanh"),
               *random_mobilenet(5).modules()]
    skip = _module_bookkeeping()
    for _ in range(2):  # the second round is served from the memo
        for m in modules:
            assert _module_text(m, type(m), skip) == _module_text_computed(m, type(m), skip)


def test_remembered_settings_are_the_settings_of_each_module() -> None:
    """_settings_of gives _module_settings of every module, also where another module of the
    class with values that compare equal (1, True, 1.0; a tuple and a list) was seen first, or
    with a value that is no setting (an object), or with other parameter shapes."""
    from gpurec.ops.extract import _module_settings, _settings_of

    class Thing:
        def __repr__(self) -> str:
            return "1"

    def conv(**attrs: object) -> nn.Conv2d:
        m = nn.Conv2d(3, 8, 3)
        for k, v in attrs.items():
            setattr(m, k, v)
        return m

    modules = [conv(flag=1), conv(flag=True), conv(flag=1.0), conv(flag=(1, 1)), conv(flag=(True, True)),
               conv(flag=[1, 1]), conv(flag=Thing()), conv(flag="1"), conv(flag=None), conv(flag=float("nan")),
               conv(groups=True), nn.Conv2d(3, 8, 5), nn.Conv2d(3, 16, 3), nn.Conv2d(3, 8, 3, bias=False),
               nn.BatchNorm2d(8), nn.BatchNorm2d(8, affine=False), nn.ReLU6(inplace=True), nn.ReLU6(),
               *random_mobilenet(3).modules()]
    for _ in range(2):  # the second round is served from the memo
        for m in modules:
            params = list(m.named_parameters())
            settings, text = _settings_of(m, params)
            expected = _module_settings(m, params)
            assert repr(settings) == repr(expected) and text == repr(expected)


@pytest.fixture(scope="module")
def small_predictor(tmp_path_factory: pytest.TempPathFactory):
    """A predictor trained quickly on the model fixture (as in tests/test_model.py)."""
    from pathlib import Path

    from gpurec.model import load_predictor, train

    fixture = Path(__file__).parent / "fixtures" / "model"
    out = tmp_path_factory.mktemp("models")
    train(fixture, out, log=lambda s: None, tune_trials=2, max_rounds=30, default_rounds=30, early_stopping_rounds=5,
          n_folds=3, tune_folds=2, forest_trees=20, min_rows_per_mode=20)
    return load_predictor(out, check_data=False)


@pytest.mark.parametrize("mode", MODES)
def test_boosters_see_each_distinct_row_once_with_the_same_estimates(small_predictor, mode: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    import gpurec.model.predictor as pred

    frozen = random_mobilenet(5)
    for p in frozen[0].parameters():  # the stem's weights frozen: same signatures, other backward
        p.requires_grad_(False)
    candidates = [(random_mobilenet(4), (2, 3, 64, 64)), (random_mobilenet(5), (2, 3, 64, 64)),
                  (frozen, (2, 3, 64, 64)), ("resnet18", (2, 3, 64, 64))]
    block = pred.OpBlock.concat([small_predictor._entry(m, s, mode)[0].block for m, s in candidates])
    rows, inverse = pred._distinct_rows(block)
    assert rows is not None and len(rows) < len(block)
    assert np.array_equal(block.values[rows][inverse], block.values)
    assert list(block.kinds[rows][inverse]) == list(block.kinds)
    assert np.array_equal(block.training[rows][inverse], block.training)
    assert list(rows) == sorted(rows) and inverse[0] == 0  # distinct rows in order of first appearance
    # every row hashed alike (a collision everywhere): the rows compared whole give the same answer
    monkeypatch.setattr(pred, "_row_hash_multipliers", lambda width: np.zeros(width, dtype=np.uint64))
    collided = pred._distinct_rows(block)
    assert np.array_equal(collided[0], rows) and np.array_equal(collided[1], inverse)
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # coverage warnings of the small fixture model
        fast = small_predictor.predict_many(candidates, mode=mode, gpu="H100")
        monkeypatch.setattr(pred, "_distinct_rows", lambda b: (None, None))
        slow = small_predictor.predict_many(candidates, mode=mode, gpu="H100")
    assert [e.as_dict() for e in fast] == [e.as_dict() for e in slow]
    for a, b in zip(fast, slow, strict=True):
        assert a.per_op.equals(b.per_op)


def test_predict_many_pauses_the_collector_while_extracting_and_restores_it(small_predictor,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Candidates are extracted with the cyclic collector off (young collections every few
    candidates instead of full ones), and the collector is left as it was found, also when a
    candidate fails; the answers are those of extraction with the collector on."""
    import contextlib
    import gc
    import warnings

    import gpurec.model.predictor as pred

    real_entry = pred.Predictor._entry
    seen: list[bool] = []

    def entry(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(gc.isenabled())
        return real_entry(self, *args, **kwargs)

    candidates = [(random_mobilenet(31), (2, 3, 64, 64)), (nn.Sequential(), (2, 3)), (random_mobilenet(32), (2, 3, 64, 64))]
    monkeypatch.setattr(pred, "_GC_EVERY_CANDIDATES", 2)  # a young collection inside the loop too
    collections: list[int] = []

    def on_collect(phase: str, info: dict) -> None:
        if phase == "start" and not gc.isenabled():  # ours, not automatic ones after the extractions
            collections.append(info["generation"])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # coverage warnings of the small fixture model
        small_predictor.clear_cache()
        with monkeypatch.context() as m:  # the straightforward path: the collector left alone
            m.setattr(pred, "_collector_paused", lambda: contextlib.nullcontext(lambda: None))
            with_collector = [e.as_dict() if e.ok else str(e) for e in
                              small_predictor.predict_many(candidates, mode="inference", gpu="H100")]
        monkeypatch.setattr(pred.Predictor, "_entry", entry)
        small_predictor.clear_cache()
        gc.callbacks.append(on_collect)
        try:
            out = small_predictor.predict_many(candidates, mode="inference", gpu="H100")
        finally:
            gc.callbacks.remove(on_collect)
        assert seen == [False, False, False] and gc.isenabled()
        assert collections == [0, 0]  # young ones only: after the second candidate and at the end
        assert [e.as_dict() if e.ok else str(e) for e in out] == with_collector
        assert isinstance(out[1], pred.CandidateError)
        gc.disable()
        try:
            small_predictor.clear_cache()
            small_predictor.predict_many(candidates[:1], mode="inference", gpu="H100")
            assert not gc.isenabled()  # a caller's choice to keep it off is kept
        finally:
            gc.enable()


@pytest.mark.parametrize("gpu", ["H100", "A100"])  # A100: the cross-GPU path (anchor's time x ratio)
def test_remembered_booster_rows_give_the_boosters_own_estimates(small_predictor, gpu: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Booster predictions remembered per feature row (gpurec.model.rowmemo) are the booster's:
    estimates with the memo (filling it, then from it alone, then mixed) equal those of the
    boosters called on every row, and rows seen before never reach a booster again."""
    import warnings

    from gpurec.model.rowmemo import RowMemo

    first = [(random_mobilenet(41), (2, 3, 64, 64)), ("resnet18", (2, 3, 64, 64))]
    mixed = [(random_mobilenet(42), (2, 3, 64, 64)), *first, (random_mobilenet(41), (4, 3, 64, 64))]

    def answers(cands: list) -> list:  # noqa: ANN001
        out = small_predictor.predict_many(cands, mode="training", gpu=gpu)
        return [(e.as_dict(), e.per_op.drop(columns="uncovered_reason").to_numpy().tolist()) for e in out]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # coverage warnings of the small fixture model
        small_predictor.clear_cache()
        with monkeypatch.context() as m:  # the straightforward path: every row through the booster
            m.setattr(RowMemo, "predict", lambda self, X, margin: self.model.predict(X, margin))
            plain_first, plain_mixed = answers(first), answers(mixed)
        small_predictor.clear_cache()
        calls: list[int] = []
        real = RowMemo.predict

        def counted(self, X, margin):  # noqa: ANN001, ANN202
            inner = self.model.predict
            self.model.predict = lambda X_, m_: calls.append(len(X_)) or inner(X_, m_)
            try:
                return real(self, X, margin)
            finally:
                del self.model.predict

        monkeypatch.setattr(RowMemo, "predict", counted)
        assert answers(first) == plain_first and calls  # filling the memo
        calls.clear()
        assert answers(first) == plain_first and calls == []  # from the memo alone
        assert answers(mixed) == plain_mixed and 0 < sum(calls)  # new rows only
    assert all(len(routes["training"]) > 0 for routes in small_predictor._boosters.values())
    small_predictor.clear_cache()
    assert all(len(memo) == 0 for routes in small_predictor._boosters.values() for memo in routes.values())


def test_row_memo_matches_its_model_row_by_row_and_forgets_when_full() -> None:
    from gpurec.model.rowmemo import RowMemo

    class Model:
        calls = 0

        def predict(self, X: np.ndarray, margin: np.ndarray) -> np.ndarray:
            Model.calls += 1
            return np.nansum(X, axis=1) * 3.0 + np.asarray(margin, dtype=np.float32)

    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 4)).astype(np.float32)
    X[::7, 2] = np.nan
    margin = rng.normal(size=50)
    memo = RowMemo(Model(), max_rows=60)
    assert np.array_equal(memo.predict(X, margin), Model().predict(X, margin))
    assert np.array_equal(memo.predict(X[::-1], margin[::-1]), Model().predict(X[::-1], margin[::-1]))
    assert len(memo) == 50
    other = memo.predict(X, margin + 1.0)  # the same rows with another margin are other predictions
    assert np.array_equal(other, Model().predict(X, margin + 1.0)) and len(memo) == 50  # 100 > 60: forgotten first
    assert memo.predict(X[:0], margin[:0]).shape == (0,)


def test_row_memo_sends_a_new_row_repeated_in_one_call_through_its_model_once() -> None:
    from gpurec.model.rowmemo import RowMemo

    class Model:
        rows = 0

        def predict(self, X: np.ndarray, margin: np.ndarray) -> np.ndarray:
            Model.rows += len(X)
            return X[:, 0] * 2.0 + X[:, 1] - np.asarray(margin)

    rng = np.random.default_rng(1)
    distinct = rng.normal(size=(5, 3))
    X = distinct[[0, 1, 0, 2, 1, 0, 3, 4, 4]]
    margin = np.array([0.5, 1.0, 0.5, 0.0, 1.0, 0.5, 2.0, 3.0, 3.0])
    memo = RowMemo(Model())
    assert np.array_equal(memo.predict(X, margin), Model().predict(X, margin))
    Model.rows = 0
    fresh = RowMemo(Model())
    assert np.array_equal(fresh.predict(X, margin), X[:, 0] * 2.0 + X[:, 1] - margin)
    assert Model.rows == 5 and len(fresh) == 5  # 9 rows, 5 distinct (row, margin) pairs
    X2, m2 = X.copy(), margin.copy()
    m2[2] = 9.0  # the same features with another margin is another prediction
    assert np.array_equal(fresh.predict(X2, m2), X2[:, 0] * 2.0 + X2[:, 1] - m2) and Model.rows == 6


class _Wired(nn.Module):
    """Leaf calls that share type, settings and input shapes but not their record: the same
    bilinear layer on (x, x) and on (x, y); the same convolution frozen and training; a
    convolution first on the network's input (no gradient) and then on an activation."""

    def __init__(self) -> None:
        super().__init__()
        self.bil = nn.Bilinear(8, 8, 8)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.twin = nn.Conv2d(8, 8, 3, padding=1)
        self.frozen = nn.Conv2d(8, 8, 3, padding=1)
        self.frozen.requires_grad_(False)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.act(self.conv(x))
        c = self.act(self.twin(c)) + self.frozen(c)
        v = torch.flatten(c.mean(dim=(2, 3)), 1)
        return self.bil(v, v) + self.bil(v, v * 2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("make, shape", [
    (_Wired, (2, 8, 6, 6)),
    (lambda: random_mobilenet(2), (2, 3, 64, 64)),
    (lambda: random_mobilenet(2), (2, 3, 64, 64)),  # everything recorded above: all copies
    (lambda: __import__("torchvision").models.get_model("resnet18"), (2, 3, 64, 64)),
    (lambda: nn.Sequential(nn.Linear(16, 32), nn.TransformerEncoder(
        nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2)), (2, 5, 16)),
])
def test_shared_records_are_the_records_of_the_long_way(make, shape, mode: str) -> None:
    """Operations copied from an earlier identical leaf call (shared_records, what prediction
    uses) equal, field by field and in signature and feature row, those recorded anew."""
    import dataclasses

    from gpurec.model.features import OpBlock

    model = make()
    fast = extract_operations(model, shape, mode=mode, keep_sources=False, shared_records=True)
    again = extract_operations(model, shape, mode=mode, keep_sources=False, shared_records=True)
    slow = extract_operations(model, shape, mode=mode, keep_sources=False)

    def fields(op):  # noqa: ANN001, ANN202
        return {f.name: getattr(op, f.name) for f in dataclasses.fields(op)} | {"signature": op.signature}

    for ops in (fast, again):
        assert [fields(op) for op in ops] == [fields(op) for op in slow]
        a, b = OpBlock.from_operations(ops, mode), OpBlock.from_operations(slow, mode)
        assert np.array_equal(a.values, b.values) and a.signatures == b.signatures and a.names == b.names
    from gpurec.ops.extract import _RECORD_MEMO

    assert any(template.kind == "Conv2d" for template, *_ in _RECORD_MEMO.values())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name, shapes", [
    ("mobilenet_v2", [(2, 3, 64, 64), (3, 3, 64, 64), (3, 3, 96, 80)]),
    ("bert_d256_post", [(2, 64), (5, 32)]),
])
def test_a_named_model_at_new_input_shapes_records_what_the_long_way_does(name: str, shapes, mode: str) -> None:
    """A model by name is traced once and interpreted again at every new input shape, its leaves'
    settings kept from the first interpretation: each shape's operations equal, field by field
    and in signature and feature row, those of the long way (no shared records) at that shape."""
    import dataclasses

    from gpurec.model.features import OpBlock

    def fields(op):  # noqa: ANN001, ANN202
        return {f.name: getattr(op, f.name) for f in dataclasses.fields(op)} | {"signature": op.signature}

    for shape in shapes:
        fast = extract_operations(name, shape, mode=mode, keep_sources=False, shared_records=True)
        slow = extract_operations(name, shape, mode=mode, keep_sources=False)
        assert [fields(op) for op in fast] == [fields(op) for op in slow]
        a, b = OpBlock.from_operations(fast, mode), OpBlock.from_operations(slow, mode)
        assert np.array_equal(a.values, b.values) and a.signatures == b.signatures


@pytest.mark.parametrize("mode", MODES)
def test_predictions_with_shared_records_are_those_of_the_long_way(small_predictor, mode: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """predict_many extracts with shared records; every estimate and per-operation row equals
    what extraction recording every call gives."""
    import warnings

    import gpurec.ops.extract as ex

    frozen = random_mobilenet(6)
    frozen[0].requires_grad_(False)
    candidates = [(random_mobilenet(6), (2, 3, 64, 64)), (frozen, (2, 3, 64, 64)), (_Wired(), (2, 8, 6, 6)),
                  (random_mobilenet(8), (2, 3, 64, 64))]
    shared: list[bool] = []
    real = ex.extract_at_resolved_precision  # what predict extracts with (the precision resolved first)

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        shared.append(kwargs.get("shared_records", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(ex, "extract_at_resolved_precision", spy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # coverage warnings of the small fixture model
        small_predictor.clear_cache()
        fast = small_predictor.predict_many(candidates, mode=mode, gpu="H100")
        assert shared == [True] * len(candidates)
        monkeypatch.setattr(ex, "extract_at_resolved_precision",
                            lambda *a, **k: real(*a, **{**k, "shared_records": False}))
        small_predictor.clear_cache()
        slow = small_predictor.predict_many(candidates, mode=mode, gpu="H100")
    assert all(e.ok for e in fast)
    assert [e.as_dict() for e in fast] == [e.as_dict() for e in slow]
    for a, b in zip(fast, slow, strict=True):
        assert a.per_op.equals(b.per_op)


def test_coverage_by_kind_is_the_per_operation_rule() -> None:
    """Predictor._make_entry judges all operations of a kind at once; the verdicts and reasons
    are those of the rule applied operation by operation: a kind absent from the training
    ranges, a feature above the highest seen times the tolerance, one below the lowest over it."""
    from types import SimpleNamespace

    from gpurec.model.features import OpBlock
    from gpurec.model.predictor import Predictor

    ops = extract_operations(random_mobilenet(11), (8, 3, 224, 224), mode="inference", keep_sources=False)
    block = OpBlock.from_operations(ops, "inference")
    feats = ["flops_total", "bytes_total"]
    vals = np.stack([block.column(f) for f in feats], axis=1)
    kinds = sorted(set(block.kinds))
    rng = np.random.default_rng(0)
    ranges = {}
    for n, kind in enumerate(kinds[1:]):  # the first kind is left out of the training ranges
        v = vals[block.kinds == kind]
        lo, hi = v.min(axis=0) * rng.uniform(0.2, 3, 2), v.max(axis=0) * rng.uniform(0.1, 2, 2)
        ranges[kind] = np.concatenate([lo if n % 3 else np.zeros(2), hi])
    tol = 2.0
    fake = SimpleNamespace(_ranges={"inference": ranges}, _range_feats=feats, _range_tol=tol, recurrent=None)
    entry = Predictor._make_entry(fake, "m", block, "inference")
    expected_covered, expected_reason = [], []
    for i, kind in enumerate(block.kinds):  # the rule, one operation at a time
        r = ranges.get(kind)
        if r is None:
            expected_covered.append(False)
            expected_reason.append(f"kind '{kind}' not in training data (inference)")
            continue
        lo, hi, v = r[:2], r[2:], vals[i]
        bad = [feats[j] for j in range(2) if v[j] > hi[j] * tol + 1e-9 or (lo[j] > 0 and v[j] < lo[j] / tol - 1e-9)]
        expected_covered.append(not bad)
        expected_reason.append(f"{', '.join(bad)} outside training range x{tol:g}" if bad else "")
    assert entry.covered.tolist() == expected_covered
    assert entry.reason.tolist() == expected_reason
    assert 0 < sum(expected_covered) < len(ops) and any("," in r for r in expected_reason)


def _module_layout(m: nn.Module) -> tuple:
    """Everything extraction reads of a built module: its tree, settings, tensors' shapes and flags."""
    return (repr(m), [(n, type(s).__qualname__, s.training) for n, s in m.named_modules()],
            [(n, tuple(p.shape), p.dtype, p.requires_grad, type(p), p.device.type) for n, p in m.named_parameters()],
            [(n, tuple(b.shape), b.dtype, type(b), b.device.type) for n, b in m.named_buffers()])


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "efficientnet_b0", "vit_b_16", "squeezenet1_1"])
def test_meta_build_without_initialisation_is_the_initialised_build(name: str) -> None:
    import torchvision.models as tvm

    from gpurec.ops.extract import _fresh_meta

    with torch.device("meta"):
        initialised = tvm.get_model(name, weights=None)
    assert _module_layout(_fresh_meta(name)) == _module_layout(initialised)


def test_meta_build_skips_initialisation_of_meta_tensors_only() -> None:
    from gpurec.ops.extract import _building_on_meta

    calls: list[tuple[str, str]] = []
    watched = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.fill_, nn.init.normal_, nn.init.uniform_,
               nn.init.kaiming_uniform_, nn.init.constant_}

    class Spy(torch.overrides.TorchFunctionMode):  # below the skipping mode: sees what it lets through
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            kwargs = kwargs or {}
            if func in watched:
                calls.append((func.__name__, (args[0] if args else kwargs["tensor"]).device.type))
            return func(*args, **kwargs)

    cpu = torch.zeros(3)
    with Spy(), _building_on_meta():
        lin = nn.Linear(4, 5)  # kaiming_uniform_ and uniform_ on meta: skipped
        w = torch.empty(2, 2)
        assert nn.init.normal_(w) is w and w.is_meta  # the tensor, as the in-place call returns it
        assert nn.init.constant_(tensor=w, val=1.0) is w  # by keyword, as nn.init passes it on
        cpu.fill_(2.0)  # a real tensor is filled
        torch.nn.init.normal_(torch.empty(2, device="cpu"))
    assert lin.weight.is_meta and tuple(lin.weight.shape) == (5, 4) and lin.weight.requires_grad
    assert cpu.tolist() == [2.0, 2.0, 2.0]
    assert calls == [("fill_", "cpu"), ("normal_", "cpu")]  # only the CPU tensors' calls ran


def test_structure_key_memo_keys_on_private_attributes_that_extra_repr_reads() -> None:
    from gpurec.model.predictor import structure_key

    class Scaled(nn.Module):
        def __init__(self, k: int) -> None:
            super().__init__()
            self._k = k

        def extra_repr(self) -> str:
            return f"k={self._k}"

    Scaled.__module__ = "torch.nn.modules.testing"  # remembered as torch.nn's own leaves are
    assert structure_key(Scaled(2)) == structure_key(Scaled(2))
    assert structure_key(Scaled(2)) != structure_key(Scaled(3))
