"""Operations: torchvision name or nn.Module + input shape -> the operations it executes."""

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

__all__ = [
    "MODES",
    "ExtractionError",
    "UnknownModel",
    "Operation",
    "FEATURE_NAMES",
    "classification_models",
    "extract_operations",
    "network_totals",
    "reference_flops",
    "signature_of",
    "unique_operations",
]
