"""Integer argument checks shared by the public API.

One rule decides what an integer is: an object with ``__index__`` (Python
and NumPy integers) that is not a bool (Python's or NumPy's). The messages
differ from call site to call site because loaderx 2.0.0's do, and
``tests/test_errors_parity.py`` holds every one of them to its first words;
each call site passes its own.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

__all__ = ["U64_MAX", "bounded", "integer", "u64"]

U64_MAX = 2**64 - 1


def integer(name: str, value: Any, *, noun: str = "an int") -> int:
    """``value`` as an int; TypeError in Python's (and 2.0.0's) words otherwise:
    ``'float' object cannot be interpreted as an integer: {name} must be {noun}``.

    A bool is refused too (2.0.0 takes True as 1; here it is a mistake,
    docs/compatibility.md).
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not bool")
    try:
        return operator.index(value)
    except TypeError as e:
        raise TypeError(f"{e}: {name} must be {noun}") from None


def u64(name: str, value: Any, low: int = 0, *, noun: str = "an int") -> int:
    """An :func:`integer` in ``low..2**64-1``; outside it raises ValueError."""
    number = integer(name, value, noun=noun)
    if not low <= number <= U64_MAX:
        raise ValueError(f"{name} must be in {low}..2^64-1, got {number}")
    return number


def bounded(
    name: str,
    value: Any,
    low: int = 1,
    high: int | None = None,
    *,
    type_message: str = "{name} must be an int, got {type}",
    range_message: str = "{name} must be at least {low}, got {value}",
    type_error: type[Exception] = TypeError,
) -> int:
    """``value`` as an int in ``low..high`` (``high`` None: no upper bound).

    A value that is not an integer raises ``type_error(type_message)``; one
    out of range, ValueError(range_message). Both messages are
    :meth:`str.format` templates over ``name``, ``value``, ``type`` (the
    value's type name), ``low`` and ``high``.
    """
    fields = {"name": name, "value": value, "type": type(value).__name__, "low": low, "high": high}
    if isinstance(value, (bool, np.bool_)) or not hasattr(value, "__index__"):
        raise type_error(type_message.format(**fields))
    try:
        number = operator.index(value)
    except TypeError:
        raise type_error(type_message.format(**fields)) from None
    if number < low or (high is not None and number > high):
        raise ValueError(range_message.format(**fields))
    return number
