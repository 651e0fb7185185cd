"""Write the collection plan (work order) for the dataset and test-set model-input sets.

The plan is computed here with the local torch; on the GPU machine the worker re-extracts
each set with its own torch and fails a row loudly if a signature differs, which is how
signature agreement between torch versions is checked in the field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


def main(out: str = "datasets/plans/main.json") -> None:
    sets = model_input_sets(DATASET_ARCHS, DATASET_BATCH_SIZES)
    items = build_plan(sets, MODES, networks=True, operations=False)
    items += build_plan(model_input_sets(TEST_ARCHS, TEST_BATCH_SIZES), MODES, networks=True, operations=False)
    items += build_plan(sets, MODES, networks=False, operations=True)
    import torch

    atomic_write_json(Path(out), {"torch": torch.__version__, "items": [w.as_dict() for w in items]})
    kinds: dict[str, int] = {}
    for w in items:
        kinds[w.item] = kinds.get(w.item, 0) + 1
    print(json.dumps({"items": len(items), **kinds}))


if __name__ == "__main__":
    main(*sys.argv[1:])
