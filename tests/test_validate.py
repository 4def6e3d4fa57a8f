"""The shared integer checks (loaderx._validate): one rule for what an
integer is, each call site's own messages."""
from __future__ import annotations

import numpy as np
import pytest

from loaderx import _validate


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3)])
def test_integers_of_every_kind_pass(value):
    assert _validate.integer("n", value) == 3
    assert _validate.u64("n", value, 1) == 3
    assert _validate.bounded("n", value, 1, 3) == 3
    assert type(_validate.bounded("n", value)) is int


@pytest.mark.parametrize("value", [True, np.bool_(True), 3.0, "3", None])
def test_non_integers_and_bools_are_refused(value):
    with pytest.raises(TypeError, match="^n must be an int, got "):
        _validate.bounded("n", value)
    with pytest.raises(ValueError, match="^n must be an int >= 0, got "):
        _validate.bounded("n", value, 0, type_message="{name} must be an int >= 0, got {value!r}",
                          type_error=ValueError)


def test_messages():
    with pytest.raises(TypeError, match="^n must be an integer, not bool$"):
        _validate.integer("n", True)
    with pytest.raises(TypeError, match="^'float' object cannot be interpreted as an integer: n must be an int$"):
        _validate.integer("n", 1.5)
    with pytest.raises(TypeError, match="^'float' object cannot be interpreted as an integer: n must be an integer$"):
        _validate.u64("n", 1.5, noun="an integer")
    with pytest.raises(ValueError, match=r"^n must be in 1\.\.2\^64-1, got 0$"):
        _validate.u64("n", 0, 1)
    with pytest.raises(ValueError, match=r"^n must be in 0\.\.2\^64-1, got 18446744073709551616$"):
        _validate.u64("n", 2**64)
    with pytest.raises(ValueError, match="^n must be at least 2, got 1$"):
        _validate.bounded("n", 1, 2)
    with pytest.raises(ValueError, match=r"^n must be in 1\.\.4, got 5$"):
        _validate.bounded("n", 5, 1, 4, range_message="{name} must be in {low}..{high}, got {value}")
