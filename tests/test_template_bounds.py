"""A chat template's code runs only when it renders, and no call in it allocates past the bounds
(text/template_limits.py): nothing when it compiles (inside ``ctxengine.load``), no number past the
output bound to a call or a filter, no ``%`` or ``str.format`` width past it."""
import json
import subprocess
import sys

import pytest
from jinja2.defaults import DEFAULT_FILTERS

from ctxengine.errors import CtxError
from ctxengine.text.chat_template import ChatTemplate

# Each case runs in a child with 2 GiB of address space and a time limit, so code that does allocate
# or hang (as before these bounds) fails the test instead of taking the machine.
_CHILD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from ctxengine.text.chat_template import ChatTemplate
from ctxengine.errors import CtxError
t0 = time.monotonic()
template = ChatTemplate.for_model({"tokenizer.chat_template": sys.argv[1]}, str)  # as Engine.__init__ does
t1 = time.monotonic()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    said = "rendered " + template.render([{"role": "user", "content": "hi"}])[:80]
except CtxError as err:
    said = str(err)
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) >> 10
print(json.dumps({"load_s": t1 - t0, "render_s": time.monotonic() - t1, "grew_mib": grew, "said": said}))
"""


def _run_in_child(src: str) -> dict:
    r = subprocess.run([sys.executable, "-c", _CHILD, src], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("src, says", [
    # Jinja folded these into constants while compiling: 4.7 s and 3.8 GiB, and over 60 s, in ctxengine.load.
    ("{{ 'x'|center(4000000000)|length }}", "the center filter was given the number 4,000,000,000"),
    ("{{ 'x'|center(20000000)|wordwrap(1)|length }}", "the center filter was given the number 20,000,000"),
    ("{{ ('%03000000000d' % 1)|length }}", "the format '%03000000000' is wider than"),
    ("{{ 'x'|center(16000000)|wordwrap(1)|length }}", "the wordwrap filter would copy about"),
    ("{% autoescape 'x'|center(4000000000) %}{% endautoescape %}", "the center filter was given the number"),
])
def test_loading_a_template_runs_none_of_its_code(src, says):
    out = _run_in_child(src)
    assert out["load_s"] < 2 and out["said"].startswith("chat template stopped: ") and says in out["said"], out


@pytest.mark.parametrize("src, says", [
    # Each grew memory by gigabytes (11 GB for tojson) before the 1 GiB bound was checked.
    ("{{ messages|tojson(indent=3000000000) }}", "the tojson filter was given the number 3,000,000,000"),
    ("{{ 'x'.ljust(3000000000)|length }}", "ljust() was given the number 3,000,000,000"),
    ("{{ ('x'|center(width=3000000000))|length }}", "the center filter was given the number 3,000,000,000"),
    ("{{ ('a\nb'|indent(3000000000))|length }}", "the indent filter was given the number 3,000,000,000"),
    ("{{ (['x']|batch(400000000, 'y')|list)|length }}", "the batch filter was given the number 400,000,000"),
    ("{{ '{:>3000000000}'.format(1)|length }}", "the format spec '>3000000000' is wider than"),
    ("{{ '{:.3000000000f}'.format(1.5)|length }}", "the format spec '.3000000000f' is wider than"),
    ("{{ '{:>{w}}'.format(1, w=3000000000)|length }}", "the format spec '>3000000000' is wider than"),
    ("{{ '{0[x]:>{0[w]}}'.format({'w': 3000000000, 'x': 1})|length }}", "the format spec '>3000000000'"),
    ("{{ '{w:>{w}}'.format_map({'w': 3000000000})|length }}", "the format spec '>3000000000'"),
    ("{{ ('%0*d' % (3000000000, 1))|length }}", "a '%*' width was given the number 3,000,000,000"),
    ("{{ ('%(a).3000000000f' % {'a': 1.5})|length }}", "the format '%(a).3000000000' is wider than"),
    ("{{ ('%3000000000d'|format(1))|length }}", "the format '%3000000000' is wider than"),
    ("{{ (('x' * 1000)|replace('', 'y' * 1000000))|length }}", "the replace filter would make about 1,001,001,000"),
    ("{{ ('x' * 1000).replace('', 'y' * 1000000)|length }}", "replace() would make about 1,001,001,000"),
    ("{{ ('\n' * 1000000)|indent('y' * 1000000)|length }}", "the indent filter would make about"),
    ("{{ (('x' * 1000000)|list|join('y' * 1000))|length }}", "the join filter would make about 1,000,000,000"),
    ("{{ ('y' * 1000).join(('x' * 1000000)|list)|length }}", "join() would make about 1,000,000,000"),
    ("{{ ('\t' * 1000000).expandtabs(16000000)|length }}", "expandtabs() would make about"),
    ("{{ lipsum(3000000)|length }}", "lipsum() would make about"),
    ("{{ ('x' * 1000000)|wordwrap(10)|length }}", "the wordwrap filter would copy about"),
])
def test_a_call_past_the_bounds_is_refused_before_it_allocates(src, says):
    out = _run_in_child(src)
    assert out["said"].startswith("chat template stopped: ") and says in out["said"], out
    assert out["grew_mib"] < 200 and out["render_s"] < 5, out


def test_compiling_calls_no_filter(monkeypatch):
    calls, center = [], DEFAULT_FILTERS["center"]

    def spy(value, *args):
        calls.append(value)
        return center(value, *args)
    monkeypatch.setitem(DEFAULT_FILTERS, "center", spy)
    t = ChatTemplate("{{ 'ab'|center(6) }}|{% autoescape 'x'|center(1) == 'x' %}{{ '<' }}{% endautoescape %}")
    assert calls == []
    assert t.render([]) == "  ab  |&lt;" and calls == ["ab", "x"]


@pytest.mark.parametrize("src, text", [
    ("{{ 'ab'|center(6) }}|{{ 'ab'.ljust(4) }}|{{ 'ab'.rjust(4, '.') }}|{{ '7'.zfill(3) }}", "  ab  |ab  |..ab|007"),
    ("{{ '%5d|%-3s|%.2f|%(a)s' % (1, 'x', 2.5, 'y') if false else '%5d|%-3s|%.2f' % (1, 'x', 2.5) }}",
     "    1|x  |2.50"),
    ("{{ '%(a)s=%(b)03d'|format(a='n', b=7) }}|{{ '%d%%'|format(50) }}|{{ '%%3000000000d' % () }}",
     "n=007|50%|%3000000000d"),
    ("{{ '%d'|format(10 ** 12) }}|{{ '%d' % 10 ** 12 }}|{{ '%*d' % (3, 1) }}", "1000000000000|1000000000000|  1"),
    ("{{ '{:>5}|{:.3f}|{:,}'.format('a', 1.5, 10 ** 12) }}|{{ '{0[x]:>{0[w]}}'.format({'w': 3, 'x': 1}) }}",
     "    a|1.500|1,000,000,000,000|  1"),
    ("{{ 'a\nb'|indent(2) }}|{{ 'a\nb'|indent('> ', first=true) }}", "a\n  b|> a\n> b"),
    ("{{ 'abc'|replace('b', 'x') }}|{{ 'aaa'.replace('a', 'bb', 2) }}|{{ ['a', 'b']|join(', ') }}",
     "axc|bbbba|a, b"),
    ("{{ ', '.join(['a', 'b']) }}|{{ 'a\tb'.expandtabs(4) }}|{{ 'a b c'|wordwrap(3) }}", "a, b|a   b|a b\nc"),
    ("{% for i in range(100000000, 100000003) %}{{ i }},{% endfor %}{{ 10 ** 10 }}", "100000000,100000001,100000002,"
     "10000000000"),
    ("{{ messages|tojson(indent=2) }}", '[\n  {\n    "role": "user",\n    "content": "hi"\n  }\n]'),
    ("{{ 'x'|center(100000)|length }}", "100000"),
    # numbers that are data, not sizes: a tool call's argument handed to a macro, a namespace's value
    ("{% macro r(x) %}{{ x }}{% endmacro %}{{ r(5000000000) }}|{{ namespace(v=10 ** 10).v }}|{{ [5000000000]|tojson }}",
     "5000000000|10000000000|[5000000000]"),
])
def test_templates_within_the_bounds_render_as_before(src, text):
    assert ChatTemplate(src).render([{"role": "user", "content": "hi"}]) == text


def test_the_refusal_is_a_ctx_error_naming_what_was_too_large():
    with pytest.raises(CtxError, match=r"chat template stopped: ljust\(\) was given the number 3,000,000,000, "
                                       r"more than the 16,777,216 characters a render may output"):
        ChatTemplate("{{ 'x'.ljust(3000000000) }}").render([])
    with pytest.raises(CtxError, match="a 11,959-bit number"):  # too big for str(): said by its size
        ChatTemplate("{{ 'x'.ljust((10 ** 1200) * (10 ** 1200) * (10 ** 1200)) }}").render([])
