"""Model-input sets and modes as the model package uses them, from the neutral
``gpurec.sets`` (so loading a predictor never imports collection code)."""

from __future__ import annotations

from gpurec.sets import (
    DATASET_ARCHS,
    MODES,
    SEQ_DATASET_ARCHS,
    SEQ_TEST_ARCHS,
    SYNTH_ARCHS,
    TEST_ARCHS,
    AnyInputSet,
    parse_set_key,
)

__all__ = ["MODES", "dataset_arch_names", "parse_set", "test_arch_names"]


def dataset_arch_names() -> tuple[str, ...]:
    """The training architectures: torchvision's, the sequence models' and the hand-written ones
    (gpurec.sets; the sweeps have no network rows)."""
    return (*DATASET_ARCHS, *SEQ_DATASET_ARCHS, *SYNTH_ARCHS)


def test_arch_names() -> tuple[str, ...]:
    """Held-out architectures, never trained on: torchvision's and the sequence models'."""
    return tuple(TEST_ARCHS) + tuple(SEQ_TEST_ARCHS)


def parse_set(set_key: str) -> AnyInputSet:
    """A model-input set from its key (``arch:b<batch>:r<resolution>`` or ``arch:b<batch>:s<seq>``)."""
    return parse_set_key(set_key)
