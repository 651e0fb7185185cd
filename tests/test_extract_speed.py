"""The shortcuts that make extracting a never-seen module fast (issue 13's speed target) give
what the long way gives: the same fx graph, the same operations, the same features.

The speed itself is measured by `gpurec report speed --measure` (benchmarks/speed.json), not
here: a timed test on a shared machine could not fail for the right reason.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from gpurec.model.bench import random_mobilenet

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
        self.w = nn.Parameter(torch.ones(8, 8))
        self.skip = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x) * self.scale
        y = F.interpolate(y, scale_factor=0.5, mode="bilinear", align_corners=None)
        y = torch.cat([y, y[:, :4, ::2, ::2].repeat(1, 2, 2, 2)], dim=1) if self.skip else y
        z = torch.flatten(y, start_dim=2).transpose(1, 2)
        z = F.linear(z, self.w[:, :8].t().contiguous()).reshape(z.shape[0], -1, 8)
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
