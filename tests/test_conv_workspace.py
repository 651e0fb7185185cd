"""The convolution workspace probe's grids (gpurec.collect.conv_workspace; the probe itself needs a GPU)."""

from __future__ import annotations

import pytest

from gpurec.collect.conv_workspace import _grid


def test_grids_hold_only_buildable_convolutions_under_the_memory_cap() -> None:
    for name in ("main", "narrow"):
        configs = _grid(name)
        assert configs and len(set(configs)) == len(configs)
        for prec, batch, cin, cout, hw, k, s, groups in configs:
            assert prec in ("fp32", "bf16-mixed")
            assert cin % groups == 0 and cout % groups == 0
            out_hw = (hw + 2 * (k // 2) - k) // s + 1
            assert batch * (cin * hw * hw + cout * out_hw * out_hw) * 4 <= 12e9
    main = _grid("main")
    # depthwise layers and RGB stems are both in the main grid; a stem is never depthwise
    assert any(g == cin > 1 for _, _, cin, _, _, _, _, g in main)
    assert all(g == 1 for _, _, cin, _, _, _, _, g in main if cin == 3)
    assert {p for p, *_ in main} == {"fp32", "bf16-mixed"}


def test_an_unknown_grid_says_which_exist() -> None:
    with pytest.raises(ValueError, match="main or narrow"):
        _grid("wide")
