"""Hand-written architectures and operation sweeps for the kinds that carry the error
(gpurec.synthsets), and the targeted plan that measures them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_names_are_registered_unique_and_not_torchvision() -> None:
    from gpurec.ops.extract import classification_models
    from gpurec.sets import DATASET_ARCHS, SWEEP_ARCHS, SYNTH_ARCHS, TEST_ARCHS
    from gpurec.synthsets import SYNTH_BUILDERS

    names = (*SYNTH_ARCHS, *SWEEP_ARCHS)
    assert set(names) == set(SYNTH_BUILDERS)
    assert not set(names) & set(classification_models()), "a torchvision classifier would leak into training"
    assert not set(names) & (set(DATASET_ARCHS) | set(TEST_ARCHS))
    from gpurec.model.fitting.evaluate import family

    assert len({family(n) for n in names}) == len(names), "each hand-written architecture is its own family"


# kind -> what an architecture must contain to cover it
TARGETS = {
    "sweepgconv": lambda ops: len({o.settings.get("groups") for o in ops if o.kind == "Conv2d"}) >= 8,
    "synthgconv": lambda ops: any(o.kind == "Conv2d" and o.settings.get("groups", 1) > 1 for o in ops),
    "synthdense": lambda ops: sum(o.kind == "cat" for o in ops) >= 10,
    "synthdensecat": lambda ops: max(len(o.input_shapes) for o in ops if o.kind == "cat") > 33,
    "sweepfewgroups": lambda ops: sum(o.kind == "Conv2d" and o.settings.get("groups", 1) > 1 for o in ops) >= 30,
    "sweepmidgroups": lambda ops: sum(o.kind == "Conv2d" and o.settings.get("groups", 1) > 1 for o in ops) >= 20,
    "sweepdepthwise": lambda ops: sum(o.kind == "Conv2d" and o.settings["groups"] == o.settings["in_channels"] > 1
                                      for o in ops) >= 40,
    "sweeplategroups": lambda ops: len({o.settings.get("groups") for o in ops if o.kind == "Conv2d"}) >= 20,
    "sweepdense": lambda ops: sum(o.kind == "Conv2d" and o.settings["groups"] == 1 and o.settings["in_channels"] > 3
                                  for o in ops) >= 70 and {o.settings["kernel_size"][0] for o in ops
                                                           if o.kind == "Conv2d" and o.settings["in_channels"] > 3} == {1, 3},
    "sweepnarrow": lambda ops: sum(o.kind == "Conv2d" and o.settings["groups"] == 1 and 3 < o.settings["in_channels"]
                                   <= 320 for o in ops) >= 60,
    "sweepwindow": lambda ops: {"roll", "pad", "MultiheadAttention"} <= {o.kind for o in ops},
    "synthwin": lambda ops: {"roll", "pad", "MultiheadAttention"} <= {o.kind for o in ops},
    "synthse": lambda ops: {"Sigmoid", "mul", "AdaptiveAvgPool2d"} <= {o.kind for o in ops},
    "synthsd": lambda ops: "StochasticDepth" in {o.kind for o in ops},
}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_each_architecture_extracts_and_holds_its_target_kind(name: str) -> None:
    from gpurec.ops import extract_operations

    ops = extract_operations(name, (2, 3, 224, 224), mode="training", keep_sources=False)
    assert len(ops) > 10
    assert TARGETS[name](ops), f"{name}: {Counter(o.kind for o in ops).most_common(10)}"


def test_synthetic_network_runs_a_training_step_as_the_collector_builds_it() -> None:
    """The GPU side builds these by name (collect.runner.NetworkUnit); a step runs on CPU."""
    from gpurec.collect.runner import NetworkUnit

    unit = NetworkUnit("synthwin", (1, 3, 224, 224), "training", "cpu")
    unit.step()
    assert unit.param_bytes() > 0


def test_targeted_plan_holds_only_hand_written_sets() -> None:
    from gpurec.sets import SWEEP_ARCHS, SYNTH_ARCHS

    plan = json.loads((ROOT / "datasets" / "plans" / "targeted.json").read_text())
    items = plan["items"]
    archs = Counter(w["set_key"].split(":")[0] for w in items)
    assert set(archs) <= set(SYNTH_ARCHS) | set(SWEEP_ARCHS) and set(archs) >= set(SYNTH_ARCHS) | set(SWEEP_ARCHS)
    nets = {w["key"].split(":")[0] for w in items if w["item"] == "network"}
    assert nets == set(SYNTH_ARCHS), "sweeps are measured per operation only"
    ids = [f"{w['item']}:{w['key']}:{w['mode']}" for w in items]
    assert len(ids) == len(set(ids))
    main = json.loads((ROOT / "datasets" / "plans" / "main.json").read_text())["items"]
    assert not set(ids) & {f"{w['item']}:{w['key']}:{w['mode']}" for w in main}


def test_few_group_sweep_spans_batches_that_no_unseen_network_is_measured_at() -> None:
    """The sweep is for the batch dependence of few-group convolutions; its operations must not
    be an unseen network's (batch is part of every operation's signature)."""
    from gpurec.ops import extract_operations
    from gpurec.sets import SWEEP_BATCH_SIZES_BY_ARCH, TEST_BATCH_SIZES

    for name in ("sweepfewgroups", "sweepmidgroups", "sweepdepthwise", "sweeplategroups", "sweepdense",
                 "sweepnarrow"):
        batches = SWEEP_BATCH_SIZES_BY_ARCH[name]
        assert len(batches) >= 3 and not set(batches) & set(TEST_BATCH_SIZES)
    ops = extract_operations("sweepfewgroups", (2, 3, 224, 224), mode="inference", keep_sources=False)
    convs = [o for o in ops if o.kind == "Conv2d" and o.settings.get("groups", 1) > 1]
    assert {o.settings["groups"] for o in convs} >= {2, 4, 8, 16}
    assert all(2 <= o.settings["groups"] <= 16 for o in convs)
    assert {tuple(o.settings["stride"]) for o in convs} == {(1, 1), (2, 2)}


def test_hand_written_architectures_added_later_avoid_the_unseen_networks_batches() -> None:
    """Their operations must not be an unseen network's (batch is part of every signature)."""
    from gpurec.sets import SYNTH_ARCHS, SYNTH_BATCH_SIZES_BY_ARCH, TEST_BATCH_SIZES

    assert "synthdensecat" in SYNTH_BATCH_SIZES_BY_ARCH and set(SYNTH_BATCH_SIZES_BY_ARCH) <= set(SYNTH_ARCHS)
    for arch, batches in SYNTH_BATCH_SIZES_BY_ARCH.items():
        assert batches and not set(batches) & set(TEST_BATCH_SIZES), arch
