"""Model-input sets and modes, as the model package sees them.

TEMPORARY shim (issue 16 item 1): ``gpurec/sets.py`` is the neutral home of MODES,
``ModelInputSet``, ``DATASET_ARCHS`` and ``TEST_ARCHS``. Until it exists, the lists come from
``gpurec.collect.plan``, imported lazily so that loading a predictor never imports collect.
Once ``gpurec/sets.py`` is in, delete the fallback branch.
"""

from __future__ import annotations

from typing import Any

try:
    from gpurec.sets import MODES  # type: ignore[import-not-found]
except ImportError:  # before issue 16 item 1 lands: the one definition in gpurec.model
    MODES: tuple[str, ...] = ("inference", "training")  # type: ignore[no-redef]


def _sets_module() -> Any:
    try:
        import gpurec.sets as sets  # type: ignore[import-not-found]
    except ImportError:  # before issue 16 item 1 lands
        import gpurec.collect.plan as sets
    return sets


def dataset_arch_names() -> tuple[str, ...]:
    return tuple(_sets_module().DATASET_ARCHS)


def test_arch_names() -> tuple[str, ...]:
    return tuple(_sets_module().TEST_ARCHS)


def parse_set(set_key: str) -> Any:
    """A ``ModelInputSet`` from its key (``arch:b<batch>:r<resolution>``)."""
    return _sets_module().ModelInputSet.parse(set_key)
