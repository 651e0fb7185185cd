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


TARGETED_PLAN = Path("datasets") / "plans" / "targeted.json"


def write_targeted_plan(out: Path | str = TARGETED_PLAN, main: Path | str | None = DEFAULT_PLAN) -> dict[str, int]:
    """Write the targeted plan: the hand-written architectures of gpurec.sets (SYNTH_ARCHS, as
    networks and per operation) and the operation sweeps (SWEEP_ARCHS, per operation only),
    which cover the operation kinds that carry the whole-network error (gpurec.synthsets).
    Items already in the ``main`` plan are left out (the runner would skip them anyway).
    Returns how many items of each kind it holds."""
    import json

    import torch

    from gpurec.collect.plan import MODES, build_plan, model_input_sets
    from gpurec.dataset.store import atomic_write_json
    from gpurec.sets import SWEEP_ARCHS, SWEEP_BATCH_SIZES, SYNTH_ARCHS, SYNTH_BATCH_SIZES

    synth = model_input_sets(SYNTH_ARCHS, SYNTH_BATCH_SIZES)
    sweeps = model_input_sets(SWEEP_ARCHS, SWEEP_BATCH_SIZES)
    items = build_plan(synth, MODES, networks=True, operations=False)
    items += build_plan(synth + sweeps, MODES, networks=False, operations=True)
    known: set[str] = set()
    if main is not None and Path(main).is_file():
        known = {f"{w['item']}:{w['key']}:{w['mode']}" for w in json.loads(Path(main).read_text())["items"]}
    items = [w for w in items if w.id not in known]
    atomic_write_json(Path(out), {"torch": torch.__version__, "items": [w.as_dict() for w in items]})
    kinds: dict[str, int] = {"items": len(items), "in_main_plan_left_out": len(known) and
                             sum(1 for w in build_plan(synth, MODES, networks=False, operations=True)
                                 if w.id in known)}
    for w in items:
        kinds[w.item] = kinds.get(w.item, 0) + 1
    return kinds
