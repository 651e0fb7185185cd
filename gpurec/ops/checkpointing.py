"""Activation checkpointing as users switch it on: every repeated block of a network run inside
``torch.utils.checkpoint``, the way ``gradient_checkpointing_enable()`` does it for a transformer.

Why: checkpointing trades time for memory (backward runs each block's forward again, autograd
keeps only each block's input), and the question a user asks is whether that trade lets a larger
batch fit and at what cost in time and energy.  ``checkpoint_blocks`` makes the checkpointed
network from the plain one, so ``predict`` answers the question for any ``nn.Module`` and
``gpurec validate --checkpoint-blocks`` measures the same network on a GPU.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


class NoRepeatedBlocks(ValueError):
    """The network has no repeated block to checkpoint."""


class Checkpointed(nn.Module):
    """``block`` run inside ``torch.utils.checkpoint`` (non-reentrant, as PyTorch recommends)
    whenever autograd records; a plain call under ``no_grad`` or ``inference_mode``, where
    checkpointing saves nothing."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def __getattr__(self, name: str) -> Any:
        """The block's attributes read through the wrapper: a parent that looks into its children
        (``nn.TransformerEncoder`` reads ``layers[0].self_attn``) sees the block it wrapped."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("block"), name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.block(*args, **kwargs)
        # backward calls the block again on the same argument objects: a list the caller appends
        # to after this call (DenseNet's layers take the growing list of features) is copied here,
        # so the recomputation sees what the forward saw
        args = tuple(list(a) if isinstance(a, list) else a for a in args)
        kwargs = {k: list(v) if isinstance(v, list) else v for k, v in kwargs.items()}
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def _is_block(m: nn.Module) -> bool:
    """A composite module with parameters that is not a plain container."""
    return (not isinstance(m, (*_CONTAINERS, Checkpointed)) and next(m.children(), None) is not None
            and next(m.parameters(), None) is not None)


def checkpoint_blocks(model: nn.Module) -> list[str]:
    """Wrap, in place, each repeated block of ``model`` in :class:`Checkpointed`; return the
    wrapped blocks' names (as ``model.named_modules()`` named them before).  A second call
    changes nothing and returns the same names.

    A block is a composite module with parameters (not a Sequential, ModuleList or ModuleDict)
    whose class occurs at least twice among its parent's children: a ResNet's bottlenecks, a
    ViT's or a BERT's encoder layers, a GPT's decoder blocks, a MobileNet's inverted residuals.
    Blocks are not nested: a wrapped block's insides stay as they are.  Raises NoRepeatedBlocks
    where there is none (an LSTM language model, a VGG): wrap your own modules in
    ``torch.utils.checkpoint`` there; gpurec predicts any checkpoint call its forward makes.
    """
    wrapped: list[str] = []

    def visit(parent: nn.Module, prefix: str) -> None:
        children = list(parent.named_children())
        counts = Counter(type(c) for _, c in children if _is_block(c))
        for name, child in children:
            path = f"{prefix}{name}"
            if isinstance(child, Checkpointed):  # checkpointed before: kept as it is
                wrapped.append(path)
            elif counts.get(type(child), 0) >= 2:
                parent.add_module(name, Checkpointed(child))  # same slot: Sequential order kept
                wrapped.append(path)
            else:
                visit(child, f"{path}.")

    visit(model, "")
    if not wrapped:
        raise NoRepeatedBlocks(
            f"{type(model).__name__} has no repeated block (a composite module with parameters whose class occurs "
            "twice among its parent's children) to checkpoint; call torch.utils.checkpoint.checkpoint on the parts "
            "you want recomputed in your forward instead: gpurec predicts those calls as they are")
    return wrapped


def checkpointed(model: str | nn.Module) -> tuple[nn.Module, list[str]]:
    """``model`` with its repeated blocks checkpointed, and the blocks' names: a name (torchvision,
    gpurec.sets) is built on meta first; a module is wrapped in place (``checkpoint_blocks``)."""
    if isinstance(model, str):
        from gpurec.ops.extract import resolve_model

        model = resolve_model(model)[1]
    return model, checkpoint_blocks(model)
