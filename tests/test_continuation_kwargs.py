"""A named context opened under one face's template variables and continued under another's:
OpenAI's route renders Qwen3 with its defaults, Anthropic's with enable_thinking false, whose
opening of a reply is longer ("<|im_start|>assistant\\n" then "<think>\\n\\n</think>\\n\\n").
A request with no new messages on a context whose reply is open goes on with that reply, whichever
opened it; it used to open a second assistant turn when the open reply was the shorter one."""
import pytest

from test_continuation_templates import renderer

QWEN3 = "Qwen-Qwen3-0.6B"
ASK = [{"role": "user", "content": "What is 2+2?"}]
OFF = {"enable_thinking": False}


@pytest.mark.parametrize("opened_with, continued_with", [({}, OFF), (OFF, {}), (OFF, OFF), ({}, {})],
                         ids=["default-then-off", "off-then-default", "off", "default"])
def test_an_open_reply_goes_on_under_other_template_variables(opened_with, continued_with):
    r = renderer(QWEN3)
    tokens = r.tokenizer.encode(r.render(ASK, template_kwargs=opened_with))
    assert r.render([], after=tokens, template_kwargs=continued_with) == ""
    # a reply cut short (some of it written) goes on too
    cut = tokens + r.tokenizer.encode("The answer")
    assert r.render([], after=cut, template_kwargs=continued_with) == ""


def test_a_closed_reply_still_gets_a_new_turn_under_the_other_variables():
    r = renderer(QWEN3)
    tokens = r.tokenizer.encode(r.render(ASK)) + r.tokenizer.encode("4") + [0]  # 0: the end of generation
    follow = r.render([{"role": "user", "content": "And 3+3?"}], after=tokens, template_kwargs=OFF)
    assert "<|im_start|>user\nAnd 3+3?" in follow and follow.endswith("<think>\n\n</think>\n\n")
