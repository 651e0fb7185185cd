"""Operations: torchvision name or nn.Module + input shape -> the operations it executes.

Names load on first use, so ``import gpurec.ops.names`` (the CLI's quick name check) does
not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpurec.ops.extract import (
        MODES,
        ExtractionError,
        UnknownModel,
        classification_models,
        extract_operations,
        network_totals,
        reference_flops,
        unique_operations,
    )
    from gpurec.ops.features import FEATURE_NAMES
    from gpurec.ops.operation import Operation, signature_of

_WHERE = {
    "MODES": "gpurec.ops.extract",
    "ExtractionError": "gpurec.ops.extract",
    "UnknownModel": "gpurec.ops.extract",
    "classification_models": "gpurec.ops.extract",
    "extract_operations": "gpurec.ops.extract",
    "network_totals": "gpurec.ops.extract",
    "reference_flops": "gpurec.ops.extract",
    "unique_operations": "gpurec.ops.extract",
    "FEATURE_NAMES": "gpurec.ops.features",
    "Operation": "gpurec.ops.operation",
    "signature_of": "gpurec.ops.operation",
}

__all__ = ["FEATURE_NAMES", "MODES", "ExtractionError", "Operation", "UnknownModel", "classification_models",
           "extract_operations", "network_totals", "reference_flops", "signature_of", "unique_operations"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpurec.ops' has no attribute {name!r}")
