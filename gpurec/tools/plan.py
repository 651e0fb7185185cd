"""The collection plan (work order) for the dataset and test-set model-input sets.

The plan is computed here with the local torch; on the GPU machine the worker re-extracts
each set with its own torch and fails a row loudly if a signature differs, which is how
signature agreement between torch versions is checked in the field.  Run through
``gpurec tools plan``.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_PLAN = Path("datasets") / "plans" / "main.json"
SEQ_PLAN = Path("datasets") / "plans" / "seq.json"


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
    sets = model_input_sets(DATASET_ARCHS, DATASET_BATCH_SIZES)
    items = build_plan(sets, MODES, networks=True, operations=False)
    items += build_plan(model_input_sets(TEST_ARCHS, TEST_BATCH_SIZES), MODES, networks=True, operations=False)
    items += build_plan(sets, MODES, networks=False, operations=True)
    return _write(Path(out), items, torch.__version__)


def write_seq_plan(out: Path | str = SEQ_PLAN) -> dict[str, int]:
    """Write the sequence plan: network rows of every sequence training and test set, then
    operation rows of the training sets (the test architectures stay unseen).  Returns how
    many items of each kind it holds."""
    import torch

    from gpurec.collect.plan import (
        MODES,
        SEQ_DATASET_ARCHS,
        SEQ_SHAPES,
        SEQ_TEST_ARCHS,
        SEQ_TEST_SHAPES,
        build_plan,
        sequence_input_sets,
    )

    sets = sequence_input_sets(SEQ_DATASET_ARCHS, SEQ_SHAPES)
    items = build_plan(sets, MODES, networks=True, operations=False)
    items += build_plan(sequence_input_sets(SEQ_TEST_ARCHS, SEQ_TEST_SHAPES), MODES, networks=True, operations=False)
    items += build_plan(sets, MODES, networks=False, operations=True)
    return _write(Path(out), items, torch.__version__)


def _write(out: Path, items: list, torch_version: str) -> dict[str, int]:
    from gpurec.dataset.store import atomic_write_json

    atomic_write_json(out, {"torch": torch_version, "items": [w.as_dict() for w in items]})
    kinds: dict[str, int] = {"items": len(items)}
    for w in items:
        kinds[w.item] = kinds.get(w.item, 0) + 1
    return kinds
