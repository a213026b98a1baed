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
* the output, :data:`MAX_OUTPUT` characters; and since one call can allocate
  before any check above sees it (``'x'.ljust(n)``, ``center(n)``,
  ``tojson(indent=n)``, ``'%0*d'``, ``'{:>n}'.format``), no number past that
  bound reaches a filter or a call of Python's own (a macro's or a namespace's
  numbers are data: a tool call's argument), nor a width or precision a ``%`` or
  ``str.format`` spec, and no ``replace``, ``indent``, ``join`` or
  ``expandtabs`` is run that would make more than that output;
* a ``wordwrap``'s work (it copies the rest of a long word for each line it
  breaks off): :data:`MAX_WRAP_WORK`.

None of it runs while a template compiles: Jinja folds constant expressions
then (``{{ 'x'|center(4000000000) }}`` would allocate inside ``ctxengine.load``),
so the optimizer is off, output is finalized with the context (never at
compile time), every filter takes the context (so none is folded) and ``%`` is
intercepted like ``*`` and ``**`` (intercepted operators are not folded).

Crossing one raises :class:`TemplateLimit`; ``ChatTemplate.render`` words it.
"""
from __future__ import annotations

import functools
import math
import re
import resource
import threading
import time
import types
from typing import Any, Callable, Iterator, Mapping

from jinja2 import pass_context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter, safe_range
from jinja2.utils import _PassArg, generate_lorem_ipsum

MAX_STEPS = 1_000_000
MAX_SECONDS = 10.0
MAX_GROWTH = 1 << 30   # bytes of peak resident memory a render may add
MAX_SEQUENCE = 1 << 20
MAX_POWER_BITS = 4096
MAX_OUTPUT = 16 << 20
MAX_WRAP_WORK = 10 ** 10  # characters squared over width: ~2 s at worst (a run of spaces)

# What Python itself runs (str.ljust, int.to_bytes, a builtin): a number given to it is a size.
_NATIVE = (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
           types.MethodDescriptorType, types.WrapperDescriptorType)

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
    """The sandbox, with ``*``, ``**`` and ``%`` bounded, ``range()`` stepped, the numbers calls and
    filters get bounded, and no template code run at compile time (``filters``: added to Jinja's)."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def __init__(self, *args, filters: Mapping[str, Callable] | None = None, **kwargs):
        super().__init__(*args, optimized=False, finalize=_finalize, **kwargs)
        self.globals["range"] = _Range
        self.filters = {name: _bounded_filter(name, f) for name, f in {**self.filters, **(filters or {})}.items()}

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _check()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_SEQUENCE:
                    raise TemplateLimit(f"a sequence repeated {_number(n)} times is longer than {MAX_SEQUENCE:,}")
        if operator == "**" and _power_bits(left, right) > MAX_POWER_BITS:
            raise TemplateLimit(f"{_number(left)} ** {_number(right)} is larger than {MAX_POWER_BITS} bits")
        if operator == "%" and isinstance(left, str):
            check_percent_format(left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (as Jinja's)
        _check()
        name = getattr(__obj, "__name__", "a function")
        # Python's own functions and methods (str.ljust, say) make what a number asks for at
        # once; a macro's or namespace's numbers are data (a tool call's argument may be 10**10),
        # and range() is bounded by the steps it yields instead.
        if isinstance(__obj, _NATIVE) and not getattr(__obj, "checks_its_widths", False):
            check_numbers(f"{name}()", args, kwargs)
        if isinstance(getattr(__obj, "__self__", None), str) and name in _METHOD_SIZES:
            _check_size(f"{name}()", _METHOD_SIZES[name](__obj.__self__, args, kwargs))
        if __obj is generate_lorem_ipsum:  # lipsum(n, html, min, max): up to n * max words
            _check_size("lipsum()", _lipsum_size(args, kwargs))
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        fmt = super().wrap_str_format(value)
        if fmt is None:
            return None
        spec_check, is_map = _SpecCheck(self), value.__name__ == "format_map"

        @functools.wraps(fmt)
        def bounded(*args: Any, **kwargs: Any) -> str:
            if is_map and len(args) == 1 and not kwargs:
                spec_check.vformat(value.__self__, (), args[0])
            elif not is_map:
                spec_check.vformat(value.__self__, args, kwargs)
            return fmt(*args, **kwargs)
        bounded.checks_its_widths = True  # so a number it formats (not a width) may be large
        return bounded


@pass_context
def _finalize(context, value: Any) -> Any:
    # Taking the context keeps Jinja from rendering a constant ``{{ ... }}`` when it compiles.
    return value


def _bounded_filter(name: str, func: Callable) -> Callable:
    """``func`` refusing, before it runs, a number, width or result past the bounds; it takes the context,
    so Jinja never folds it into a constant while compiling (``_PassArg``: how Jinja reads what it takes)."""
    pass_arg = _PassArg.from_obj(func)

    @pass_context
    def bounded(context, value: Any, *args: Any, **kwargs: Any) -> Any:
        _check()
        if name == "format":  # value % (kwargs or args): only its widths are bounded, not what it formats
            check_percent_format(str(value), kwargs or args)
        else:
            check_numbers(f"the {name} filter", args, kwargs)
        if name in _FILTER_SIZES:
            _check_size(f"the {name} filter", _FILTER_SIZES[name](value, args, kwargs))
        if name == "wordwrap":
            _check_wrap(value, _arg(args, kwargs, 0, "width", 79))
        if pass_arg is _PassArg.context:
            return func(context, value, *args, **kwargs)
        if pass_arg is _PassArg.eval_context:
            return func(context.eval_ctx, value, *args, **kwargs)
        if pass_arg is _PassArg.environment:
            return func(context.environment, value, *args, **kwargs)
        return func(value, *args, **kwargs)
    return bounded


def check_numbers(what: str, args: tuple, kwargs: Mapping[str, Any]) -> None:
    """Refuses an int argument past MAX_OUTPUT: as a width, count or indent it allocates that much in one call."""
    for n in (*args, *kwargs.values()):
        if isinstance(n, int) and abs(n) > MAX_OUTPUT:
            raise TemplateLimit(f"{what} was given the number {_number(n)}, more than the {MAX_OUTPUT:,} "
                                "characters a render may output")


# %[(key)][flags][width][.precision]type, or %%; a width or precision may be * (taken from the values)
_PERCENT_SPEC = re.compile(r"%(?:%|(?:\([^)]*\))?[#0 +-]*(\*|\d*)(?:\.(\*|\d*))?)")


def check_percent_format(fmt: str, values: Any) -> None:
    """Refuses a ``fmt % values`` whose widths or precisions pass MAX_OUTPUT."""
    for spec in _PERCENT_SPEC.finditer(fmt):
        for digits in spec.groups():
            if digits == "*":
                check_numbers("a '%*' width", values if isinstance(values, tuple) else (values,), {})
            elif digits and _too_wide(digits):
                raise TemplateLimit(f"the format {spec.group()[:40]!r} is wider than the {MAX_OUTPUT:,} "
                                    "characters a render may output")


class _SpecCheck(SandboxedFormatter):
    """Formats as the sandbox does (a nested ``{}`` spec is formatted first, then used), refusing a spec
    with a width or precision past MAX_OUTPUT before it is used."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if any(_too_wide(digits) for digits in re.findall(r"\d+", format_spec)):
            raise TemplateLimit(f"the format spec {format_spec[:40]!r} is wider than the {MAX_OUTPUT:,} "
                                "characters a render may output")
        return super().format_field(value, format_spec)


def _check_size(what: str, size: int) -> None:
    if size > MAX_OUTPUT:
        raise TemplateLimit(f"{what} would make about {size:,} characters, more than the {MAX_OUTPUT:,} "
                            "a render may output")


def _check_wrap(value: Any, width: Any) -> None:
    if isinstance(width, int) and len(str(value)) ** 2 / max(width, 1) > MAX_WRAP_WORK:
        raise TemplateLimit(f"the wordwrap filter would copy about {len(str(value)) ** 2 // max(width, 1):,} "
                            f"characters wrapping {len(str(value)):,} at width {width}, more than {MAX_WRAP_WORK:,}")


def _arg(args: tuple, kwargs: Mapping[str, Any], i: int, key: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(key, default)


# About how many characters a call makes, from (the value or str it is called on, args, kwargs), for the
# filters and str methods whose output grows by the product of two of their inputs.
def _replaced_size(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> int:
    s, old, new = str(value), str(_arg(args, kwargs, 0, "old", "")), str(_arg(args, kwargs, 1, "new", ""))
    count = _arg(args, kwargs, 2, "count")
    n = len(s) + 1 if old == "" else s.count(old)
    return len(s) + (min(n, count) if isinstance(count, int) and count >= 0 else n) * len(new)


def _indented_size(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> int:
    s, width = str(value), _arg(args, kwargs, 0, "width", 4)
    per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    return len(s) + (s.count("\n") + 1) * per_line


def _joined_size(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> int:
    n = len(value) if hasattr(value, "__len__") else 0
    return n * len(str(_arg(args, kwargs, 0, "d", "")))


def _lipsum_size(args: tuple, kwargs: Mapping[str, Any]) -> int:
    n, most = _arg(args, kwargs, 0, "n", 5), _arg(args, kwargs, 3, "max", 100)
    return n * most * 12 if isinstance(n, int) and isinstance(most, int) else 0  # ~12 characters a word


def _str_join_size(sep: str, args: tuple, kwargs: Mapping[str, Any]) -> int:
    return _joined_size(args[0], (sep,), {}) if args else 0


def _tab_expanded_size(s: str, args: tuple, kwargs: Mapping[str, Any]) -> int:
    tabsize = _arg(args, kwargs, 0, "tabsize", 8)
    return len(s) + s.count("\t") * (tabsize if isinstance(tabsize, int) else 0)


_FILTER_SIZES = {"replace": _replaced_size, "indent": _indented_size, "join": _joined_size}
_METHOD_SIZES = {"replace": _replaced_size, "join": _str_join_size, "expandtabs": _tab_expanded_size}


def _too_wide(digits: str) -> bool:
    digits = digits.lstrip("0")
    return len(digits) > len(str(MAX_OUTPUT)) or int(digits or "0") > MAX_OUTPUT


def _number(n: Any) -> str:
    """``n`` for a message: a huge int by its size (str() refuses past 4,300 digits)."""
    if isinstance(n, int) and n.bit_length() > 64:
        return f"a {n.bit_length():,}-bit number"
    return f"{n:,}" if isinstance(n, int) else repr(n)[:40]


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
