"""The collection plan (work order) for the dataset and test-set model-input sets.

The plan is computed here with the local torch; on the GPU machine the worker re-extracts
each set with its own torch and fails a row loudly if a signature differs, which is how
signature agreement between torch versions is checked in the field.  Run through
``gpurec tools plan``.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_PLAN = Path("datasets") / "plans" / "main.json"


def write_main_plan(out: Path | str = DEFAULT_PLAN) -> dict[str, int]:
    """Write the plan: network rows of every dataset and test set, then operation rows of the
    dataset sets.  Returns how many items of each kind it holds."""
    import torch

    from gpurec.collect.plan import (
        DATASET_ARCHS,
        DATASET_BATCH_SIZES,
        MODES,
        TEST_ARCHS,
        TEST_BATCH_SIZES,
        build_plan,
        model_input_sets,
    )
    from gpurec.dataset.store import atomic_write_json

    sets = model_input_sets(DATASET_ARCHS, DATASET_BATCH_SIZES)
    items = build_plan(sets, MODES, networks=True, operations=False)
    items += build_plan(model_input_sets(TEST_ARCHS, TEST_BATCH_SIZES), MODES, networks=True, operations=False)
    items += build_plan(sets, MODES, networks=False, operations=True)
    atomic_write_json(Path(out), {"torch": torch.__version__, "items": [w.as_dict() for w in items]})
    kinds: dict[str, int] = {"items": len(items)}
    for w in items:
        kinds[w.item] = kinds.get(w.item, 0) + 1
    return kinds


PEAKS_PLAN = Path("datasets") / "plans" / "peaks.json"


def write_peaks_plan(out: Path | str = PEAKS_PLAN) -> dict[str, int]:
    """Write the peak-memory plan: one item per network of the main plan (every dataset and
    test set, both modes)."""
    import torch

    from gpurec.collect.plan import (
        DATASET_ARCHS,
        DATASET_BATCH_SIZES,
        MODES,
        TEST_ARCHS,
        TEST_BATCH_SIZES,
        model_input_sets,
        peak_items,
    )
    from gpurec.dataset.store import atomic_write_json

    sets = model_input_sets(DATASET_ARCHS, DATASET_BATCH_SIZES) + model_input_sets(TEST_ARCHS, TEST_BATCH_SIZES)
    items = peak_items(sets, MODES)
    atomic_write_json(Path(out), {"torch": torch.__version__, "items": [w.as_dict() for w in items]})
    return {"items": len(items), "peak": len(items)}
