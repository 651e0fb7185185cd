"""Model-input sets and modes as the model package uses them, from the neutral
``gpurec.sets`` (so loading a predictor never imports collection code)."""

from __future__ import annotations

from gpurec.sets import DATASET_ARCHS, MODES, SYNTH_ARCHS, TEST_ARCHS, ModelInputSet

__all__ = ["MODES", "dataset_arch_names", "parse_set", "test_arch_names"]


def dataset_arch_names() -> tuple[str, ...]:
    """The training architectures: the torchvision dataset ones and the hand-written ones
    (gpurec.synthsets; the sweeps have no network rows)."""
    return (*DATASET_ARCHS, *SYNTH_ARCHS)


def test_arch_names() -> tuple[str, ...]:
    return tuple(TEST_ARCHS)


def parse_set(set_key: str) -> ModelInputSet:
    """A ``ModelInputSet`` from its key (``arch:b<batch>:r<resolution>``)."""
    return ModelInputSet.parse(set_key)
