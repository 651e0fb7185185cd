"""Operations: torchvision name or nn.Module + input shape -> the operations it executes.

Names load on first use (torch comes with ``gpurec.ops.extract``), so importing a light
submodule such as ``gpurec.ops.operation`` or ``gpurec.ops.cache`` does not load torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpurec.sets import MODES

if TYPE_CHECKING:
    from gpurec.ops.cache import SetOperations
    from gpurec.ops.extract import (
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

__all__ = [
    "MODES",
    "ExtractionError",
    "UnknownModel",
    "Operation",
    "FEATURE_NAMES",
    "SetOperations",
    "classification_models",
    "extract_operations",
    "network_totals",
    "reference_flops",
    "signature_of",
    "unique_operations",
    "ModuleTracer",
    "build_torchvision_meta",
]

_WHERE = {
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
    "SetOperations": "gpurec.ops.cache",
}
# Public names other packages use for helpers ``gpurec.ops.extract`` keeps private: the
# module tracer (in-network attribution walks the same graph) and the meta-device build of a
# torchvision classifier (the coverage sweep times it).
_PUBLIC_ALIASES = {"ModuleTracer": ("gpurec.ops.extract", "_Tracer"),
                   "build_torchvision_meta": ("gpurec.ops.extract", "_build_torchvision_meta")}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    if name in _PUBLIC_ALIASES:
        import importlib

        module, attr = _PUBLIC_ALIASES[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gpurec.ops' has no attribute {name!r}")
