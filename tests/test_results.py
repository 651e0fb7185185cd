"""gpurec.results: one StepCost for estimates, measured networks and ranked GPUs; one bound rule."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from gpurec.results import HOST_BOUND_RATIO, StepCost, bound_of, bounds_of, compare


def test_one_bound_rule_for_scalars_and_arrays() -> None:
    assert HOST_BOUND_RATIO == pytest.approx(1.2)
    assert bound_of(1.2, 1.0) == "host" and bound_of(1.19, 1.0) == "gpu"
    got = bounds_of([1.2, 1.19, 5.0, 1.0], [1.0, 1.0, 0.0, np.nan])
    assert list(got) == ["host", "gpu", "", ""]
    from gpurec.model.timeline import Timeline
    from gpurec.model.timeline import bound_of as timeline_bound_of

    assert timeline_bound_of is bound_of  # the timeline re-exports the rule, never copies it
    tl = Timeline(gpu_time_ms=np.array([1.0, 1.0]), time_ms=np.array([1.2, 1.19]), host_time_ms=np.zeros(2),
                  gpu_wait_ms=np.zeros(2))
    assert list(tl.bound) == ["host", "gpu"]


def test_measured_cost_from_a_collected_row() -> None:
    row = {"time_ms": 3.0, "energy_mj": 900.0, "power_w": 300.0, "gpu_time_ms": 2.0, "gpu_energy_mj": 700.0,
           "host_ms": 2.5}
    c = StepCost.measured(row)
    assert (c.time_ms, c.host_time_ms, c.bound) == (3.0, 2.5, "host")  # 3.0 >= 1.2 x 2.0
    assert c.gpu_power_w == pytest.approx(350.0)
    eager_only = StepCost.measured({"time_ms": 2.0, "energy_mj": 100.0})
    assert eager_only.power_w == pytest.approx(50.0) and eager_only.bound is None and eager_only.gpu_time_ms is None
    with pytest.raises(ValueError, match="time_ms and energy_mj"):
        StepCost.measured({"time_ms": float("nan"), "energy_mj": 1.0})
    # a step that could not be captured: its gpu_time_ms is the eager fallback, not host-free
    eager_fallback = StepCost.measured({**row, "captured": False})
    assert eager_fallback.gpu_time_ms is None and eager_fallback.gpu_energy_mj is None
    assert eager_fallback.bound is None and eager_fallback.host_time_ms == 2.5


def test_compare_is_field_by_field() -> None:
    pred = StepCost(time_ms=2.2, energy_mj=110.0, power_w=50.0, gpu_time_ms=1.0, gpu_energy_mj=55.0,
                    host_time_ms=None, bound="host")
    meas = StepCost.measured({"time_ms": 2.0, "energy_mj": 100.0, "gpu_time_ms": 1.25, "gpu_energy_mj": 50.0})
    got = compare(pred, meas)
    assert got["time_error_pct"] == pytest.approx(10.0) and got["energy_error_pct"] == pytest.approx(10.0)
    assert got["gpu_time_error_pct"] == pytest.approx(-20.0) and got["gpu_energy_error_pct"] == pytest.approx(10.0)
    assert got["bound_right"] is True  # 2.0 >= 1.2 x 1.25
    assert "host_time_error_pct" not in got  # neither side's unknowns are compared


def test_estimate_and_ranked_gpu_carry_a_step_cost() -> None:
    from gpurec.model.predictor import Estimate
    from gpurec.recommend.ranking import RankedGPU

    for cls in (Estimate, RankedGPU):
        # every field a placeholder number, the cost fields set: the cost must come from these
        req = {f.name: 1.0 for f in fields(cls) if f.init}
        req.update(time_ms=2.0, energy_mj=100.0, power_w=50.0, gpu_time_ms=1.0, gpu_energy_mj=60.0,
                   host_time_ms=1.5, bound="host")
        obj = cls(**req)
        cost = obj.cost
        assert isinstance(cost, StepCost)
        assert (cost.time_ms, cost.gpu_time_ms, cost.host_time_ms, cost.bound) == (2.0, 1.0, 1.5, "host")
        assert cost.gpu_power_w == pytest.approx(60.0)
    assert StepCost.of({"time_ms": 1, "energy_mj": 2, "power_w": 2, "bound": None}).bound is None
