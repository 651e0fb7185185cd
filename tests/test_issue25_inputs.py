"""Inputs the predictor must refuse rather than answer: shapes that are not positive integers, and
modules that run no operation."""

from __future__ import annotations

import math

import pytest
from torch import nn

import gpurec


@pytest.fixture(scope="module")
def predictor():  # noqa: ANN201
    return gpurec.load_predictor()


@pytest.mark.parametrize("shape, shown", [((2, 3, 2.7, 32), "2.7"), ((2, 3, math.nan, 32), "nan"),
                                          ((2.5, 3, 32, 32), "2.5"), ((2, 3, -32, 32), "-32")])
def test_a_shape_that_is_not_positive_integers_is_refused(predictor, shape: tuple, shown: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=rf"every dimension must be a positive integer \({shown} at position"):
        predictor.predict("resnet18", shape, gpu="H100")
    good, bad = predictor.predict_many([("resnet18", (2, 3, 32, 32)), ("resnet18", shape)], gpu="H100")
    assert good.ok and not bad.ok and bad.index == 1 and "positive integer" in bad.reason  # the others answered


@pytest.mark.parametrize("module", [nn.Identity(), nn.Sequential()], ids=["Identity", "empty Sequential"])
def test_a_module_with_no_operations_is_refused_not_estimated_at_zero(predictor, module: nn.Module) -> None:  # noqa: ANN001
    from gpurec.ops.extract import NoOperations

    with pytest.raises(NoOperations, match=rf"{type(module).__name__} runs no operations on input \[2, 3, 32, 32\]"):
        predictor.predict(module, (2, 3, 32, 32), gpu="H100")
    est = predictor.predict(nn.Sequential(nn.Conv2d(3, 8, 3)), (2, 3, 32, 32), gpu="H100")
    assert est.gpu_time_ms > 0  # a module with work is still estimated
