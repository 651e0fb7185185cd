"""gpurec.sets and the one extraction cache (gpurec.ops.cache) that collection and training share."""

from __future__ import annotations

import pytest

from gpurec.ops.cache import SetOperations
from gpurec.sets import MODES, ModelInputSet

SET = "resnet18:b2:r32"


def test_model_input_set_keys_round_trip_and_bad_keys_say_the_format() -> None:
    s = ModelInputSet("vit_b_16", 32, 224)
    assert s.key == "vit_b_16:b32:r224" and ModelInputSet.parse(s.key) == s and s.input_shape == (32, 3, 224, 224)
    for bad in ("resnet50", "resnet50:32:224", "resnet50:bx:r224"):
        with pytest.raises(ValueError, match="looks like 'resnet50:b32:r224'"):
            ModelInputSet.parse(bad)


def test_modes_are_defined_once() -> None:
    import gpurec.collect.plan as plan
    import gpurec.model.predictor as predictor
    import gpurec.ops.extract as extract
    import gpurec.profile.api as profile_api

    assert all(m.MODES is MODES for m in (plan, predictor, extract, profile_api))


def test_set_operations_extracts_each_set_once_and_finds_signatures() -> None:
    cache = SetOperations(keep_sources=True)
    ops = cache.operations(SET, "training")
    assert cache.operations(SET, "training") is ops and cache.extractions == 1
    op = cache.find(SET, "training", ops[3].signature)
    assert op.signature == ops[3].signature and op.source is not None and cache.extractions == 1
    with pytest.raises(LookupError, match="extraction differs"):
        cache.find(SET, "training", "f" * 16)
    cache.operations(SET, "inference")
    assert cache.extractions == 2


def test_set_operations_bounds_memory_least_recently_used_first() -> None:
    cache = SetOperations(keep_sources=False, max_sets=1)
    a = cache.operations(SET, "inference")
    cache.operations(SET, "training")  # evicts the inference extraction
    assert cache.operations(SET, "inference") is not a and cache.extractions == 3
    with pytest.raises(ValueError, match="max_sets"):
        SetOperations(max_sets=0)


def test_training_features_come_from_the_shared_cache() -> None:
    from gpurec.model.features import SetExtractor

    shared = SetOperations(keep_sources=False)
    ex = SetExtractor(sets=shared)
    block = ex.get(SET, "inference")
    assert block is not None and shared.extractions == 1
    assert block.signatures == [op.signature for op in shared.operations(SET, "inference")]
    assert ex.get(SET, "inference") is block and shared.extractions == 1
    assert ex.get("not_a_model:b1:r32", "inference") is None and ("not_a_model:b1:r32", "inference") in ex.errors


def test_model_input_sets_give_an_architecture_its_own_batches_where_asked() -> None:
    from gpurec.sets import model_input_sets

    sets = model_input_sets(("a", "b"), (8, 32), batch_sizes_by_arch={"b": (16,)})
    assert [(s.arch, s.batch) for s in sets] == [("a", 8), ("a", 32), ("b", 16)]
