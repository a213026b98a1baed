"""Named-context continuations (text/chat.py ChatRenderer.render(..., after=)) with real chat templates:
a conversation built request by request (the first rendered whole, each later one appended after the
reply and its closing) is the conversation the template renders at once.

The templates are llama.cpp's models/templates (MIT), copied unchanged into tests/data/templates/
(SOURCES-continuation.md): every one there that Hugging Face renders a plain two-turn chat with."""
import re
from pathlib import Path

import pytest

from ctxengine.errors import CtxError
from ctxengine.text.chat import ChatRenderer
from ctxengine.text.chat_template import ChatTemplate

DATA = Path(__file__).parent / "data" / "templates"
TEMPLATES = sorted(p.name[:-len(".jinja")] for p in DATA.glob("*.jinja"))

# (bos, eos) as each model's Hugging Face tokenizer gives them, by name prefix
SPECIAL = {"Qwen": ("", "<|im_end|>"), "meta-llama": ("<|begin_of_text|>", "<|eot_id|>"),
           "meetkai": ("<|begin_of_text|>", "<|eot_id|>"), "google": ("<bos>", "<eos>"),
           "microsoft": ("<s>", "<|endoftext|>"), "deepseek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
           "llama-cpp-deepseek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
           "ibm": ("<|end_of_text|>", "<|end_of_text|>"), "Cohere": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>")}
# Templates that refuse a system message (raise_exception): tested without one only.
NO_SYSTEM = {"google-gemma-2-2b-it"}
# Templates that render earlier turns otherwise once more follow, so a context (which keeps its turns
# as first rendered: the KV cannot be rewritten) is not the whole rendering; each appended text is still
# what the whole rendering has after the reply it follows (test_each_append_is_what_follows_the_reply).
#  - a generation prompt that history does not repeat (thinking opened, a channel, a recipient):
REPLY_OPENS_OTHERWISE = {"Qwen-QwQ-32B", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
                         "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "llama-cpp-deepseek-r1", "llama-cpp-rwkv-world",
                         "meetkai-functionary-medium-v3.2", "NVIDIA-Nemotron-Nano-v2",
                         "CohereForAI-c4ai-command-r7b-12-2024-tool_use"}
#  - the system prompt moved into the last user turn (the context keeps it in the first):
SYSTEM_IN_LAST_USER_TURN = {"mistralai-Mistral-Nemo-Instruct-2407"}
#  - the last reply closed otherwise than earlier ones (gpt-oss: "<|return|>", the end-of-generation
#    token its model writes, then "<|end|>"): a context keeps the first, as the model wrote it.
LAST_REPLY_CLOSES = {"openai-gpt-oss-120b": ("<|return|>", "<|end|>")}

SYSTEM = {"role": "system", "content": "Be kind."}
TURNS = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi there."},
         {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "It is 4."},
         {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "That makes 6."},
         {"role": "user", "content": "Thanks, bye."}]
EOG = 0  # the model's end-of-generation token, text-less here: a closing keeps all it writes

# Control-token-like texts are one token each, any other character one token.
_PIECES = re.compile(r"<\|[^<>|]*\|>|<｜[^<>｜]*｜>|</?[A-Za-z_:0-9]+>|\[/?[A-Z_]+\]|.", re.S)


class _Tok:
    """What ChatRenderer reads of a tokenizer: encode (token boundaries, the reply's opening),
    decode and the end-of-generation ids."""
    eog_ids = frozenset({EOG})

    def __init__(self):
        self.ids: dict[str, int] = {"": EOG}
        self.texts: dict[int, str] = {EOG: ""}

    def encode(self, text, parse_special=False):
        out = []
        for piece in _PIECES.findall(text):
            if piece not in self.ids:
                self.ids[piece] = len(self.ids)
                self.texts[self.ids[piece]] = piece
            out.append(self.ids[piece])
        return out

    def decode(self, ids):
        return "".join(self.texts[i] for i in ids)


def renderer(name: str) -> ChatRenderer:
    """As engine/engine.py builds it: the file's template with its BOS/EOS token texts."""
    bos, eos = next((v for k, v in sorted(SPECIAL.items(), key=lambda kv: -len(kv[0])) if name.startswith(k)),
                    ("<s>", "</s>"))
    return ChatRenderer(ChatTemplate((DATA / f"{name}.jinja").read_text(), bos_token=bos, eos_token=eos),
                        _Tok(), name)


def turn_by_turn(r: ChatRenderer, system: list[dict]) -> list[str]:
    """What a context holds after each request, as the engine builds it: the first request's
    conversation whole; then per request the reply (ending on EOG), its closing
    (serving/generation.py _close_turn) and the next user turn rendered after the context."""
    tok = r.tokenizer
    text = r.render(system + TURNS[:1])
    tokens, held = tok.encode(text), [text]
    for i in range(1, len(TURNS), 2):
        reply = TURNS[i]["content"]
        tokens += tok.encode(reply) + [EOG]
        closing = r.render(after=tokens, closing=True, generation_prompt=False)
        tokens += tok.encode(closing)
        turn = r.render([TURNS[i + 1]], after=tokens)
        tokens += tok.encode(turn)
        held.append(reply + closing + turn)
    return held


CASES = [pytest.param(name, with_system, id=f"{name}-{'sys' if with_system else 'nosys'}")
         for name in TEMPLATES for with_system in (False, True) if not (with_system and name in NO_SYSTEM)]


def test_the_collection_is_here():
    assert len(TEMPLATES) == 24 and {"google-gemma-2-2b-it", "microsoft-Phi-3.5-mini-instruct",
                                     "mistralai-Mistral-Nemo-Instruct-2407", "NVIDIA-Nemotron-Nano-v2",
                                     "CohereForAI-c4ai-command-r7b-12-2024-tool_use"} <= set(TEMPLATES)


@pytest.mark.parametrize("name, with_system", CASES)
def test_a_conversation_appended_turn_by_turn_is_the_whole_conversation(name, with_system):
    r = renderer(name)
    system = [SYSTEM] if with_system else []
    held = "".join(turn_by_turn(r, system))
    whole = r.render(system + TURNS)
    if name in REPLY_OPENS_OTHERWISE or name in LAST_REPLY_CLOSES or (with_system and name in SYSTEM_IN_LAST_USER_TURN):
        assert held != whole  # documented above; the appends are checked in the next test
    else:
        assert held == whole


@pytest.mark.parametrize("name, with_system", CASES)
def test_each_append_is_what_follows_the_reply(name, with_system):
    """Each request's text past the reply (closing, the new turn, the opening of the next reply) is
    what the whole conversation up to that turn renders after that reply."""
    r = renderer(name)
    system = [SYSTEM] if with_system else []
    held = turn_by_turn(r, system)
    assert held[0] == r.render(system + TURNS[:1])
    for k, appended in enumerate(held[1:]):
        reply = TURNS[2 * k + 1]["content"]
        seen = [] if name in SYSTEM_IN_LAST_USER_TURN else system  # the context keeps it in the first turn
        whole = r.render(seen + TURNS[:2 * k + 3])
        if name in LAST_REPLY_CLOSES:
            appended = appended.replace(*LAST_REPLY_CLOSES[name], 1)
        assert appended == reply + whole[whole.rindex(reply) + len(reply):]


def test_gemma2_refuses_a_system_turn_in_a_continuation_too():
    r = renderer("google-gemma-2-2b-it")
    tokens = r.tokenizer.encode(r.render(TURNS[:1]) + "Hi there.") + [EOG]
    with pytest.raises(CtxError, match="System role not supported"):
        r.render([SYSTEM], after=tokens)


def test_phi3_a_context_never_holds_the_end_of_text_trailer():
    # Phi-3.5 writes eos_token at the end of a conversation rendered without a generation prompt;
    # the turns that follow would not have it, so neither the closing nor an unprompted turn has it.
    r = renderer("microsoft-Phi-3.5-mini-instruct")
    tokens = r.tokenizer.encode(r.render(TURNS[:1]) + "Hi there.") + [EOG]
    assert r.render(after=tokens, closing=True, generation_prompt=False) == "<|end|>\n"
    assert r.render([TURNS[2]], after=tokens, generation_prompt=False) == "<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n"
    assert r.render([TURNS[2]], after=tokens) == "<|end|>\n<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n"
