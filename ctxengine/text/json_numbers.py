"""The bounds a JSON Schema's numbers get before they become a grammar (json_bounds.py
bounds the rest of a schema): the caps an unbounded integer or number gets, exclusive
bounds made inclusive ones llguidance reads exactly, bounds it could not keep moved
inward to ones it can, and the grid a number's fraction is written on.

llguidance builds number ranges in 64-bit integers read through doubles: a bound past
+-MAX_BOUND is clamped (a minimum of 1e19 let 2**63 - 1 through) or, below -2**63,
crashes the process; past 2**53 a bound that is no double is read as the nearest one
(a maximum of 9007199254740999 let 9007199254741000 through).
"""
from __future__ import annotations

import math
from typing import Any

MAX_INT_DIGITS = 15
MAX_FRACTION_DIGITS = 6
INT_CAP = 10 ** MAX_INT_DIGITS - 1  # an unbounded integer's or number's added bound, each side
# A bound beyond this (a double, 2**63 less 4096) is refused, and the caps added stay within it.
MAX_BOUND = 2 ** 63 - 4096
# Integers a double holds exactly: llguidance holds const and enum values, and reads bounds, as doubles.
MAX_EXACT_INT = 2 ** 53


def bound_number(s: dict, out: dict, exact: bool) -> None:
    """``out`` (the bounded copy of number schema ``s``) with its bounds kept or added; ``exact``: an integer."""
    if exact:  # an integer's exclusive bound as the inclusive one, which llguidance reads exactly
        for word, plain, inside, pick in (("exclusiveMinimum", "minimum", lambda x: math.floor(x) + 1, max),
                                          ("exclusiveMaximum", "maximum", lambda x: math.ceil(x) - 1, min)):
            if is_num(x := out.pop(word, None)):
                out[plain] = pick(inside(x), out[plain]) if is_num(out.get(plain)) else inside(x)
    _kept_bounds(out)
    lo, hi = _edge(out, "minimum", "exclusiveMinimum", -1), _edge(out, "maximum", "exclusiveMaximum", 1)
    if lo is None:  # the added cap, or twice the schema's upper bound where that is below it
        lo = out["minimum"] = -INT_CAP if hi is None or hi >= -INT_CAP else _far(hi, exact)
    if hi is None:
        hi = out["maximum"] = INT_CAP if lo <= INT_CAP else _far(lo, exact)
    if exact:
        return
    for word, plain, pick in (("exclusiveMinimum", "minimum", max), ("exclusiveMaximum", "maximum", min)):
        x = out.get(word)
        if is_num(x):  # a number written next to x may parse as x itself
            del out[word]
            # (next to 0, the unit is a tenth of the range, for a range as narrow as (0, 1e-20))
            unit = _ulp15(x) if x else min(1e-14, abs(hi if pick is max else lo) / 10 or 1e-14)
            inside = x + unit * (1 if pick is max else -1)
            out[plain] = pick(inside, out[plain]) if is_num(out.get(plain)) else inside
    if "multipleOf" not in s:
        step = _grid(out.get("minimum", lo), out.get("maximum", hi))
        if step is not None:
            out["multipleOf"] = step


def _kept_bounds(out: dict) -> None:
    """Each bound llguidance would not keep exactly moved inside the range to the nearest
    one it keeps (_kept): maximum 2**63 - 1 (int64's, common in generated schemas) becomes
    MAX_BOUND, a maximum of 9007199254740999 the double 9007199254740998. Every value then
    allowed, the schema allows. A bound with none on its side, or whose move would empty
    the range, is left for check_exact to name."""
    moved = dict(out)
    for words, side in ((("minimum", "exclusiveMinimum"), 1), (("maximum", "exclusiveMaximum"), -1)):
        for word in words:
            if is_num(x := moved.get(word)) and (kept := _kept(x, side)) is not None:
                moved[word] = kept
    lo, hi = _edge(moved, "minimum", "exclusiveMinimum", -1), _edge(moved, "maximum", "exclusiveMaximum", 1)
    if lo is None or hi is None or lo <= hi:
        out.update(moved)


def _kept(x: float, side: int) -> float | None:
    """The bound nearest x on the inside of the range (side 1: x bounds it below, -1: above)
    that llguidance keeps exactly: x itself within +-2**53 or where it is a double within
    +-MAX_BOUND, else the next double inward; None where that is past +-MAX_BOUND."""
    if abs(x) <= MAX_EXACT_INT or (abs(x) <= MAX_BOUND and float(x) == x):
        return x
    if x * side > MAX_BOUND:
        return None
    if abs(x) > MAX_BOUND:
        return -side * MAX_BOUND
    f = float(x)
    return int(f if (f - x) * side > 0 else math.nextafter(f, side * math.inf))  # past 2**53 a double is an integer


def _edge(s: dict, plain: str, exclusive: str, side: int) -> float | None:
    """The schema's own bound on one side (either keyword), or None."""
    found = [s[k] for k in (plain, exclusive) if is_num(s.get(k))]
    return (max(found) if side < 0 else min(found)) if found else None


def _far(bound: float, exact: bool) -> float:
    """A cap for the other side of a bound beyond the added ones: twice it, within
    +-MAX_BOUND."""
    far = int(bound) * 2 if exact else bound * 2.0
    return max(-MAX_BOUND, min(MAX_BOUND, far))


def _ulp15(x: float) -> float:
    """A unit of the 15th significant digit of x: numbers that far from x parse as other doubles."""
    return 10.0 ** (math.floor(math.log10(abs(x))) + 1 - 15)


def _grid(lo: float, hi: float) -> float | None:
    """The coarsest step 10**-k (MAX_FRACTION_DIGITS <= k <= 10: llguidance refuses finer ones,
    1e-11 being 9.999999999999999e-12) with a multiple in [lo, hi]."""
    for k in range(MAX_FRACTION_DIGITS, 11):
        step = 10.0 ** -k
        if math.ceil(lo / step) <= math.floor(hi / step):
            return step
    return None


def is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
