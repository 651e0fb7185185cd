"""Collection: per-operation and whole-network time, power and energy on a real GPU."""

from gpurec.collect.measure import WindowConfig, measure_idle, measure_step
from gpurec.collect.plan import (
    DATASET_ARCHS,
    DATASET_BATCH_SIZES,
    TEST_ARCHS,
    TEST_BATCH_SIZES,
    ModelInputSet,
    WorkItem,
    build_plan,
    model_input_sets,
    parse_shard,
    shard_items,
)
from gpurec.collect.runner import CollectConfig, run_worker

__all__ = [
    "DATASET_ARCHS",
    "DATASET_BATCH_SIZES",
    "TEST_ARCHS",
    "TEST_BATCH_SIZES",
    "CollectConfig",
    "ModelInputSet",
    "WindowConfig",
    "WorkItem",
    "build_plan",
    "measure_idle",
    "measure_step",
    "model_input_sets",
    "parse_shard",
    "run_worker",
    "shard_items",
]
