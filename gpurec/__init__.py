"""gpurec: which GPU runs your PyTorch network fastest or with the least energy.

Nothing heavy happens at import: torch, pandas and xgboost load on first use.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__version__ = "0.1.0"

__all__ = ["ChannelsLastWarning", "CompiledModuleWarning", "LowCoverageWarning", "PackedSequenceWarning", "checkpoint_blocks", "extract_operations",
           "load_dataset", "load_predictor", "recommend", "__version__"]


def extract_operations(model: Any, input_shape: Any = None, mode: str = "inference", dtype: Any = None,
                       example_inputs: Any = None, **kwargs: Any) -> Any:
    """Operations a forward (and, in training, backward) of ``model`` executes; see gpurec.ops.

    ``dtype`` is the input's dtype (``torch.long`` for token ids); ``example_inputs`` (a
    tensor, a tuple of tensors or a dict of them by keyword) replaces ``input_shape`` for
    several or non-float inputs.
    """
    from gpurec.ops import extract_operations as _extract

    if dtype is not None:
        kwargs["dtype"] = dtype
    return _extract(model, input_shape, mode=mode, example_inputs=example_inputs, **kwargs)


def checkpoint_blocks(model: Any) -> list[str]:
    """Run every repeated block of ``model`` inside torch.utils.checkpoint (in place), as gradient
    checkpointing does; returns the blocks' names.  See gpurec.ops.checkpointing."""
    from gpurec.ops.checkpointing import checkpoint_blocks as _wrap

    return _wrap(model)


def __getattr__(name: str) -> Any:
    if name == "LowCoverageWarning":
        from gpurec.ops.coverage import LowCoverageWarning

        return LowCoverageWarning
    if name == "ChannelsLastWarning":
        from gpurec.ops.extract import ChannelsLastWarning

        return ChannelsLastWarning
    if name == "CompiledModuleWarning":
        from gpurec.ops.extract import CompiledModuleWarning

        return CompiledModuleWarning
    if name == "PackedSequenceWarning":
        from gpurec.ops.extract import PackedSequenceWarning

        return PackedSequenceWarning
    raise AttributeError(f"module 'gpurec' has no attribute {name!r}")


def load_dataset(gpu: str | None = None, **kwargs: Any) -> Any:
    """The shipped per-operation measurements as a pandas DataFrame; see gpurec.dataset."""
    from gpurec.dataset import load_dataset as _load

    return _load(gpu=gpu, **kwargs)


def load_predictor(path: Any = None, **kwargs: Any) -> Any:
    """The shipped predictors (``models/``) or those at ``path``; see gpurec.model."""
    from gpurec.model import load_predictor as _load

    return _load(path, **kwargs)


def recommend(model: Any, input_shape: Any = None, mode: str = "inference", objective: str = "energy",
              gpus: Any = None, **kwargs: Any) -> Any:
    """Rank GPUs for ``model`` (a gpurec.recommend.Ranking); see gpurec.recommend.recommend.

    Importing the subpackage gpurec.recommend replaces this name with the package, which is
    callable with the same arguments.
    """
    from gpurec.recommend import recommend as _recommend

    return _recommend(model, input_shape, mode=mode, objective=objective, gpus=gpus, **kwargs)


class _Package(types.ModuleType):
    """Keeps ``gpurec.recommend`` the function: importing the ``gpurec.recommend`` subpackage
    would otherwise replace it with the module, and a second call would fail."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "recommend" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
