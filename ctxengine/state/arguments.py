"""Checks of the numbers a caller of the Python API passes, before any reaches the native
core (which would raise pybind11's TypeError, naming no argument, for a float)."""
from __future__ import annotations

from numbers import Integral
from typing import Any

from ..errors import RequestError


def checked_count(value: Any, most: int, param: str) -> int:
    """``value`` as an int in [0, most]; else a RequestError naming ``param`` (a bool, a float,
    a string, a context, a number out of range)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or not 0 <= value <= most:
        raise RequestError(f"{param} must be an int in [0, {most}], not {value!r}"[:300], param=param)
    return int(value)
