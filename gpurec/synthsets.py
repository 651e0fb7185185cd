"""Hand-written architectures and operation sweeps for the operation kinds that carry the
whole-network time error on unseen networks.

Held-out torchvision networks are mispredicted most where they lean on kinds the training
architectures hold few shapes of: grouped and depthwise convolutions with many groups (RegNet,
ResNeXt), channel concatenation in training (DenseNet, Inception), window attention with its
roll, pad and window partition (Swin, MaxViT), squeeze-excite blocks (EfficientNet, RegNetY)
and stochastic depth.  Rather than measuring more torchvision classifiers (which must stay
unseen), these small networks put many shapes of exactly those kinds into the training data:

* ``sweepgconv``: one input through parallel 3x3/5x5 convolutions whose groups run from 1 to
  depthwise, at several widths (an operation sweep: each branch is a distinct operation);
* ``sweepfewgroups``: few-group 3x3 convolutions (2 to 16 groups of 8 to 64 channels) on
  112x112 maps, stride 1 and 2, over batches 1 to 32: cuDNN picks a different algorithm for
  them from one batch to the next (in an unseen network a 64-channel, 4-group one measured
  0.94 ms at batch 8 and 0.28 ms at batch 64), and the training data held them at few batches;
  ``sweepmidgroups`` the same on 56x56 maps at widths 64 to 256; ``sweepdepthwise`` depthwise
  3x3 and 5x5 convolutions on 112x112 to 14x14 maps at mobile networks' widths; and
  ``sweeplategroups`` grouped convolutions of later stages (28x28 and 14x14, 5 to 64 groups);
* ``sweepdense``: dense 1x1 convolutions between every pair of a stage's widths, 1x1 stride-2
  projections and 3x3 convolutions (stride 1 and 2), on 224x224 to 7x7 maps at widths 32 to
  2048, over batches between the training sets' (the unseen networks' wide 1x1 convolutions at
  batch 64 were 15-22% under: the training data held them at batches 32 and 128 only);
  ``sweepnarrow`` the same for mobile networks' narrow widths (16 to 320) with their 4x and 6x
  expansions;
* ``sweepwindow``: window attention over several window sizes and shifts (roll, pad, window
  partition and reverse, attention, projection);
* ``synthgconv``, ``synthdense``, ``synthwin``, ``synthse``, ``synthsd``: small networks
  built from grouped-conv, dense-concat, shifted-window, squeeze-excite and stochastic-depth
  blocks, measured whole and per operation like the dataset architectures.

Names hold no digit or underscore, so each is its own family (gpurec.model.fitting.evaluate.family).
CPU side: torch only, no torchvision classifier is built here.  gpurec.sets lists the names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _stem(out_ch: int, stride: int = 4) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, out_ch, stride, stride=stride, bias=False), nn.BatchNorm2d(out_ch),
                         nn.ReLU(inplace=True))


class _BranchSweep(nn.Module):
    """Stems (``self.stems``), each feeding its list of parallel branches (``self.branches``),
    each branch's output pooled (``self.pool``) and all of them concatenated: every branch is a
    distinct operation, measured on its own by the collector.  Without ``flatten_branches`` the
    pooled maps are concatenated as they are: fewer trivial operations to measure for as many
    branches (the earlier sweeps keep their flatten, so their measured operations keep their names)."""

    stems: nn.ModuleList
    branches: nn.ModuleList
    pool: nn.Module
    flatten_branches: bool = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = []
        for stem, branches in zip(self.stems, self.branches, strict=True):
            h = stem(x)
            for b in branches:
                pooled = self.pool(b(h))
                out.append(pooled.flatten(1) if self.flatten_branches else pooled)
        return torch.cat(out, 1)


class GroupedConvSweep(_BranchSweep):
    """Parallel grouped convolutions on one input, groups from 1 to depthwise, summed."""

    def __init__(self, widths: tuple[int, ...] = (64, 256, 512), kernels: tuple[int, ...] = (3, 5)) -> None:
        super().__init__()
        self.stems = nn.ModuleList()
        self.branches = nn.ModuleList()
        for c in widths:
            self.stems.append(_stem(c))
            groups = sorted({g for g in (1, 2, 4, 8, 16, 32, 64, c // 8, c // 2, c) if c % g == 0 and g <= c})
            self.branches.append(nn.ModuleList(
                nn.Sequential(nn.Conv2d(c, c, k, stride=s, padding=k // 2, groups=g, bias=False), nn.BatchNorm2d(c))
                for g in groups for k in kernels for s in (1, 2)))
        self.pool = nn.AdaptiveAvgPool2d(1)


class FewGroupConvSweep(_BranchSweep):
    """Parallel grouped 3x3 convolutions, stride 1 and 2, on the maps of a stride-``stem`` stem
    (112x112 to 14x14 at 224), each pooled: for every width, the groups whose group width is one
    of ``group_widths`` and that number 2 to ``max_groups``."""

    def __init__(self, widths: tuple[int, ...] = (32, 48, 64, 96, 128), stem: int = 2,
                 group_widths: tuple[int, ...] = (8, 16, 24, 32, 64), max_groups: int = 16) -> None:
        super().__init__()
        self.stems = nn.ModuleList(nn.Conv2d(3, c, stem, stride=stem, bias=False) for c in widths)
        self.branches = nn.ModuleList(
            nn.ModuleList(nn.Conv2d(c, c, 3, stride=s, padding=1, groups=c // gw, bias=False)
                          for gw in group_widths if c % gw == 0 and 2 <= c // gw <= max_groups for s in (1, 2))
            for c in widths)
        self.pool = nn.AdaptiveAvgPool2d(1)


class DepthwiseConvSweep(_BranchSweep):
    """Parallel depthwise 3x3 and 5x5 convolutions, stride 1 and 2, each pooled, at the widths
    mobile networks use on 112x112, 56x56, 28x28 and 14x14 maps (stems of stride 2 to 16)."""

    def __init__(self, stages: tuple[tuple[int, tuple[int, ...]], ...] = (
            (2, (16, 32, 96)), (4, (72, 144, 240)), (8, (120, 240, 480)), (16, (480, 672, 960)))) -> None:
        super().__init__()
        self.stems = nn.ModuleList(nn.Conv2d(3, c, stride, stride=stride, bias=False)
                                   for stride, widths in stages for c in widths)
        self.branches = nn.ModuleList(
            nn.ModuleList(nn.Conv2d(c, c, k, stride=s, padding=k // 2, groups=c, bias=False)
                          for k in (3, 5) for s in (1, 2))
            for _, widths in stages for c in widths)
        self.pool = nn.AdaptiveAvgPool2d(1)


class DenseConvSweep(_BranchSweep):
    """Parallel dense convolutions on the maps of stride-1 to stride-32 stems: per width ``c`` of
    a stage, 1x1 convolutions to every width of the stage, a 1x1 stride-2 projection to ``2c``
    and 3x3 convolutions ``c -> c`` at stride 1 and 2; the first two stages (224x224, 112x112)
    hold only 3x3 ones, as networks do there.  ``expansions`` add 1x1 convolutions ``c -> e c``
    (a mobile block's expansion; its projection back is a pair of the stage's widths)."""

    flatten_branches = False

    def __init__(self, stages: tuple[tuple[int, tuple[int, ...]], ...] = (
            (1, (32, 64)), (2, (64, 128)), (4, (64, 128, 256)), (8, (128, 256, 512)), (16, (256, 512, 1024)),
            (32, (512, 1024, 2048))), expansions: tuple[int, ...] = (), strides_3x3: tuple[int, ...] = (1, 2),
            projection: bool = True) -> None:
        super().__init__()
        self.stems = nn.ModuleList(nn.Conv2d(3, c, stride, stride=stride, bias=False)
                                   for stride, widths in stages for c in widths)
        branches = []
        for stride, widths in stages:
            for c in widths:
                convs = [nn.Conv2d(c, c, 3, stride=s, padding=1, bias=False) for s in strides_3x3]
                if stride >= 4:
                    convs += [nn.Conv2d(c, o, 1, bias=False) for o in (*widths, *(e * c for e in expansions))]
                    if projection:
                        convs.append(nn.Conv2d(c, 2 * c, 1, stride=2, bias=False))
                branches.append(nn.ModuleList(convs))
        self.branches = nn.ModuleList(branches)
        self.pool = nn.AdaptiveAvgPool2d(1)


def _window_partition(x: torch.Tensor, w: int) -> torch.Tensor:
    """(B, H, W, C) -> (B * H/w * W/w, w*w, C); H and W multiples of w."""
    b, h, wd, c = x.shape
    x = x.view(b, h // w, w, wd // w, w, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, w * w, c)


def _window_reverse(x: torch.Tensor, w: int, b: int, h: int, wd: int) -> torch.Tensor:
    c = x.shape[-1]
    x = x.view(b, h // w, wd // w, w, w, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, wd, c)


class WindowAttention(nn.Module):
    """Swin-style (shifted) window attention on a (B, H, W, C) map: pad to a multiple of the
    window, roll by the shift, partition, attend, reverse, roll back, crop, project; pre-norm
    residual with an MLP."""

    def __init__(self, dim: int, heads: int, window: int, shift: int, pad: int) -> None:
        super().__init__()
        self.window, self.shift, self.pad = window, shift, pad
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, wd, c = x.shape
        y = self.norm1(x)
        y = F.pad(y, (0, 0, 0, self.pad, 0, self.pad))
        hp, wp = h + self.pad, wd + self.pad
        y = torch.roll(y, shifts=(-self.shift, -self.shift), dims=(1, 2))
        win = _window_partition(y, self.window)
        win = self.attn(win, win, win, need_weights=False)[0]
        y = _window_reverse(win, self.window, b, hp, wp)
        y = torch.roll(y, shifts=(self.shift, self.shift), dims=(1, 2))
        if self.pad:  # a constructor constant, so tracing sees no branch on a tensor
            y = y[:, :-self.pad, :-self.pad, :].contiguous()
        x = x + y
        return x + self.mlp(self.norm2(x))


class WindowNet(nn.Module):
    """Patch embedding, then window-attention blocks (window, shift, pad per block), then a head.
    With the 4x4 patch stem, 224 px gives a 56x56 map: pads make it a multiple of each window."""

    def __init__(self, dim: int, heads: int, blocks: tuple[tuple[int, int, int], ...], classes: int = 1000) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, 4, stride=4)
        self.blocks = nn.Sequential(*(WindowAttention(dim, heads, w, s, p) for w, s, p in blocks))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).permute(0, 2, 3, 1)
        x = self.blocks(x)
        return self.head(self.norm(x).mean(dim=(1, 2)))


class SqueezeExcite(nn.Module):
    def __init__(self, ch: int, squeeze: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(ch, squeeze, 1)
        self.act = nn.SiLU(inplace=True)
        self.fc2 = nn.Conv2d(squeeze, ch, 1)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))


class Block(nn.Module):
    """A residual bottleneck: 1x1 expand, kxk grouped (or depthwise) conv, optional
    squeeze-excite, 1x1 project; optional stochastic depth on the residual branch."""

    def __init__(self, cin: int, cout: int, expand: int, groups_width: int, kernel: int, stride: int,
                 se: bool, drop: float) -> None:
        super().__init__()
        mid = cin * expand
        groups = mid // groups_width if groups_width else mid
        layers: list[nn.Module] = [
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU(inplace=True),
            nn.Conv2d(mid, mid, kernel, stride=stride, padding=kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(mid), nn.SiLU(inplace=True)]
        if se:
            layers.append(SqueezeExcite(mid, max(8, cin // 4)))
        layers += [nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout
        self.drop = _stochastic_depth(drop) if self.residual and drop > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        if not self.residual:
            return y
        return x + (self.drop(y) if self.drop is not None else y)


def _stochastic_depth(p: float) -> nn.Module:
    from torchvision.ops import StochasticDepth  # the op, not a classifier

    return StochasticDepth(p, "row")


class BlockNet(nn.Module):
    """Stem, stages of Blocks (cout, repeats, stride), pooled linear head."""

    def __init__(self, stages: tuple[tuple[int, int, int], ...], expand: int, groups_width: int, kernel: int,
                 se: bool, drop: float, stem: int = 32, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(stem),
                                  nn.SiLU(inplace=True))
        blocks: list[nn.Module] = []
        cin = stem
        n_blocks = sum(r for _, r, _ in stages)
        i = 0
        for cout, repeats, stride in stages:
            for r in range(repeats):
                blocks.append(Block(cin, cout, expand, groups_width, kernel, stride if r == 0 else 1, se,
                                    drop * i / max(n_blocks - 1, 1)))
                cin = cout
                i += 1
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.blocks(self.stem(x))).flatten(1))


class DenseNet(nn.Module):
    """Dense blocks: each layer's output is concatenated to its input (the channel concatenation
    whose training cost the operation sum misses), with transitions between blocks.

    ``list_concat``: each layer concatenates the list of every earlier feature map of its block
    (torchvision's DenseNet does), so a feature map has one consumer per later layer and training
    accumulates its gradient once per consumer; the k-th layer concatenates k maps and a block of
    n layers ends with a concatenation of n+1.  Without it, each layer concatenates two tensors
    (the running map and its own output)."""

    def __init__(self, growth: int = 32, layers: tuple[int, ...] = (4, 8, 8), stem: int = 64,
                 classes: int = 1000, list_concat: bool = False) -> None:
        super().__init__()
        self.list_concat = list_concat
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(stem),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        self.blocks = nn.ModuleList()
        self.transitions = nn.ModuleList()
        ch = stem
        for j, n in enumerate(layers):
            block = nn.ModuleList()
            for _ in range(n):
                block.append(nn.Sequential(nn.BatchNorm2d(ch), nn.ReLU(inplace=True),
                                           nn.Conv2d(ch, 4 * growth, 1, bias=False), nn.BatchNorm2d(4 * growth),
                                           nn.ReLU(inplace=True),
                                           nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)))
                ch += growth
            self.blocks.append(block)
            if j < len(layers) - 1:
                self.transitions.append(nn.Sequential(nn.BatchNorm2d(ch), nn.Conv2d(ch, ch // 2, 1, bias=False),
                                                      nn.AvgPool2d(2, stride=2)))
                ch //= 2
        self.norm = nn.BatchNorm2d(ch)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(ch, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for j, block in enumerate(self.blocks):
            if self.list_concat:
                features = [x]
                for layer in block:
                    features.append(layer(torch.cat(features, 1)))
                x = torch.cat(features, 1)
            else:
                for layer in block:
                    x = torch.cat([x, layer(x)], 1)
            if j < len(self.transitions):
                x = self.transitions[j](x)
        return self.head(self.pool(F.relu(self.norm(x))).flatten(1))


def _late_groups() -> nn.Module:
    """Grouped convolutions of later stages: 28x28 and 14x14 maps, 5 to 64 groups."""
    gw = (8, 16, 24, 32, 48, 64)
    return _Parallel(FewGroupConvSweep((160, 240, 320, 448), stem=8, group_widths=gw, max_groups=64),
                     FewGroupConvSweep((384, 528, 672, 1008), stem=16, group_widths=gw, max_groups=64))


class _Parallel(nn.Module):
    """Several sweeps on one input, their pooled outputs concatenated."""

    def __init__(self, *parts: nn.Module) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], 1)


# name -> builder.  Window blocks: (window, shift, pad) with 56 + pad a multiple of the window.
SYNTH_BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "sweepgconv": lambda: GroupedConvSweep(),
    "sweepfewgroups": lambda: FewGroupConvSweep(),
    "sweepmidgroups": lambda: FewGroupConvSweep((64, 128, 192, 256), stem=4),
    "sweepdepthwise": lambda: DepthwiseConvSweep(),
    "sweeplategroups": lambda: _late_groups(),
    "sweepdense": lambda: DenseConvSweep(),
    "sweepnarrow": lambda: DenseConvSweep(((4, (16, 24, 40)), (8, (40, 64, 96)), (16, (80, 112, 160)),
                                           (32, (160, 192, 320))), expansions=(4, 6), strides_3x3=(1,),
                                          projection=False),
    "sweepwindow": lambda: WindowNet(96, 3, ((7, 0, 0), (7, 3, 0), (8, 0, 0), (8, 4, 0), (12, 6, 4), (14, 7, 0),
                                              (16, 8, 8))),
    "synthgconv": lambda: BlockNet(((64, 2, 2), (128, 3, 2), (256, 4, 2), (512, 2, 2)), expand=1, groups_width=16,
                                   kernel=3, se=False, drop=0.0),
    "synthdense": lambda: DenseNet(),
    # torchvision's concatenation pattern, with deeper blocks than densenet121's (24 layers) and
    # another growth rate, so concatenations of up to 37 inputs and their gradient accumulation
    "synthdensecat": lambda: DenseNet(growth=24, layers=(6, 12, 36, 28), stem=48, list_concat=True),
    "synthwin": lambda: WindowNet(128, 4, ((7, 0, 0), (7, 3, 0), (7, 0, 0), (7, 3, 0))),
    "synthse": lambda: BlockNet(((24, 2, 2), (48, 3, 2), (96, 3, 2), (160, 2, 1)), expand=4, groups_width=0,
                                kernel=5, se=True, drop=0.0),
    "synthsd": lambda: BlockNet(((48, 2, 2), (96, 3, 2), (192, 4, 2), (384, 2, 1)), expand=4, groups_width=0,
                                kernel=3, se=True, drop=0.2),
}


def build_synthetic(name: str, **kwargs: Any) -> nn.Module:
    """A fresh (CPU, or under the active torch.device) instance of a hand-written architecture;
    KeyError names the choices."""
    try:
        builder = SYNTH_BUILDERS[name]
    except KeyError:
        raise KeyError(f"unknown hand-written architecture {name!r}; choices: {', '.join(SYNTH_BUILDERS)}") from None
    return builder(**kwargs)
