"""Limits on rendering a chat template: it is code from a model file.

Jinja's sandbox stops a template from reaching Python's insides, but not from
running long or filling memory: ``range()`` is capped at 100,000 items a call,
so two nested loops make 10^10 steps; ``10 ** (10 ** 9)`` and ``'x' *
10 ** 9`` compute for minutes or allocate gigabytes. A render here is
bounded instead (each bound far above what a real template needs, a
conversation's worth of loops and text):

* the items every ``range()`` of one render yields together, :data:`MAX_STEPS`;
* its wall time, :data:`MAX_SECONDS`, and the growth of the process's peak
  memory, :data:`MAX_GROWTH`, checked as ranges step and as output arrives;
* a sequence repeated by ``*`` at most :data:`MAX_SEQUENCE` long, a power's
  result at most :data:`MAX_POWER_BITS` bits;
* the output, :data:`MAX_OUTPUT` characters.

Crossing one raises :class:`TemplateLimit`; ``ChatTemplate.render`` words it.
"""
from __future__ import annotations

import math
import resource
import threading
import time
from typing import Any, Iterator

from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

MAX_STEPS = 1_000_000
MAX_SECONDS = 10.0
MAX_GROWTH = 1 << 30   # bytes of peak resident memory a render may add
MAX_SEQUENCE = 1 << 20
MAX_POWER_BITS = 4096
MAX_OUTPUT = 16 << 20

_current = threading.local()


class TemplateLimit(Exception):
    """A render went past one of the bounds (the message says which)."""


class _Budget:
    def __init__(self):
        self.steps = 0
        self.deadline = time.monotonic() + MAX_SECONDS
        self.peak = _peak_rss()

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateLimit(f"its loops ran more than {MAX_STEPS:,} range() steps")
        self.check()  # every step: a loop can double a string each time (a namespace's ``~``)

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"it ran for more than {MAX_SECONDS:g} s")
        if _peak_rss() - self.peak > MAX_GROWTH:
            raise TemplateLimit(f"it took more than {MAX_GROWTH >> 20} MiB of memory")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _check() -> None:
    budget = getattr(_current, "budget", None)
    if budget is not None:
        budget.check()


class _Range:
    """``range()`` for templates: indexable and sized as a range, each item it yields a step."""

    def __init__(self, *args: int):
        self._r = safe_range(*args)

    def __iter__(self) -> Iterator[int]:
        return self._stepped(iter(self._r))

    def __reversed__(self) -> Iterator[int]:
        return self._stepped(reversed(self._r))

    @staticmethod
    def _stepped(items: Iterator[int]) -> Iterator[int]:
        budget = getattr(_current, "budget", None)
        for x in items:
            if budget is not None:
                budget.step()
            yield x

    def __len__(self) -> int:
        return len(self._r)

    def __getitem__(self, i):
        return self._r[i]

    def __contains__(self, x: Any) -> bool:
        return x in self._r


class LimitedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with ``*`` and ``**`` bounded and ``range()`` stepped."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.globals["range"] = _Range

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _check()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_SEQUENCE:
                    raise TemplateLimit(f"a sequence repeated {n:,} times is longer than {MAX_SEQUENCE:,}")
        if operator == "**" and _power_bits(left, right) > MAX_POWER_BITS:
            raise TemplateLimit(f"{left!r} ** {right!r} is larger than {MAX_POWER_BITS} bits")
        return super().call_binop(context, operator, left, right)


def _power_bits(base: Any, exponent: Any) -> float:
    """About how many bits an integer power takes (0 for what is not one, or stays small)."""
    if not isinstance(base, int) or not isinstance(exponent, int) or exponent <= 0 or abs(base) < 2:
        return 0.0
    return exponent * math.log2(abs(base))


def render_limited(template, variables: dict) -> str:
    """The template rendered under the bounds; TemplateLimit when it crosses one."""
    _current.budget = budget = _Budget()
    out, size = [], 0
    try:
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > MAX_OUTPUT:
                raise TemplateLimit(f"its output passed {MAX_OUTPUT:,} characters")
            budget.check()
            out.append(chunk)
    finally:
        _current.budget = None
    return "".join(out)
