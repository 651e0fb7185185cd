"""The counter-twins plan: the same layers at bf16-mixed as the fp32 operations already profiled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpurec.collect.plan import WorkItem
from gpurec.tools.plan import write_counter_twins_plan

PLANS = Path(__file__).resolve().parents[1] / "datasets" / "plans"


def test_twins_are_the_same_layer_and_its_casts_at_the_lower_precision(tmp_path: Path) -> None:
    items = [WorkItem(**d) for d in json.loads((PLANS / "main.json").read_text())["items"]]
    conv = next(w for w in items if w.item == "op" and w.kind == "Conv2d" and w.set_key.startswith("resnet18:"))
    counters = tmp_path / "counters.jsonl"
    counters.write_text(json.dumps({"id": conv.id}) + "\n")
    out = tmp_path / "twins.json"
    counts = write_counter_twins_plan(out, counters, source=PLANS / "main.json",
                                      twins_from=PLANS / "bf16_mixed_operations.json")
    twins = [WorkItem(**d) for d in json.loads(out.read_text())["items"]]
    assert counts["fp32_profiled"] == 1 and counts["twins_not_in_plan"] == 0 and counts["fp32_not_extracted"] == 0
    assert {w.precision for w in twins} == {"bf16-mixed"} and {w.mode for w in twins} == {conv.mode}
    # the convolution itself and the cast autocast makes of its weight (its input arrives in bf16)
    assert sorted(w.kind for w in twins) == ["Conv2d", "autocast_cast"]


def test_nothing_profiled_says_what_to_run(tmp_path: Path) -> None:
    counters = tmp_path / "counters.jsonl"
    counters.write_text(json.dumps({"id": "op:0000000000000000:inference"}) + "\n")
    with pytest.raises(ValueError, match="gpurec counters"):
        write_counter_twins_plan(tmp_path / "t.json", counters, source=PLANS / "main.json",
                                 twins_from=PLANS / "bf16_mixed_operations.json")
