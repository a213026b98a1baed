"""What the studio draws, computed from token ids alone: the tree of every
context and snapshot of one model, and the messages of one context.

**The tree** is a compressed prefix tree over token sequences. A node is a
branch point: its ``n_tokens`` is the length of the prefix every item below
it shares, its ``items`` are the contexts and snapshots that end exactly
there, its ``children`` the branches that go on. Live contexts do not record
which context they were forked from, and they need not: a fork shares its
parent's prefix, so the tree of shared prefixes *is* the fork history (and
two conversations typed twice the same way show up as what they are, shared
prefixes). ``shared_pages`` counts the KV pages in the pool that every live
context below a node holds at once (copy-on-write forks share them; a
conversation typed twice does not), ``shared_stored_pages`` the page keys
every snapshot below it names (the store keeps those once).

**Messages** are found by splitting the tokens at the token that opens a
turn in the model's chat template (``<|im_start|>`` in ChatML,
``<start_of_turn>`` in Gemma's): the first control token of a rendered user
turn. The role is the first line of the turn's text. A model without a chat
template (or whose template opens turns with no control token) gives one
message holding the whole text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..errors import CtxError

_PROBE = "ctx-studio-probe"


@dataclass
class Item:
    """A context or snapshot placed in the tree; ``card`` is what the client gets."""

    tokens: Sequence[int]
    card: dict
    pages: frozenset | None = None        # live: pool page ids (None: in use, not read)
    page_keys: frozenset = frozenset()    # stored: page keys


@dataclass
class Node:
    n_tokens: int
    items: list[Item] = field(default_factory=list)
    children: list["Node"] = field(default_factory=list)

    def all_items(self) -> list[Item]:
        out = list(self.items)
        for c in self.children:
            out += c.all_items()
        return out

    def as_json(self) -> dict:
        below = self.all_items()
        live = [i.pages for i in below if i.pages is not None]
        stored = [i.page_keys for i in below if i.card["kind"] == "snapshot" and i.page_keys]
        return {"n_tokens": self.n_tokens, "items": [i.card for i in self.items],
                "shared_pages": len(frozenset.intersection(*live)) if len(live) > 1 else 0,
                "shared_stored_pages": len(frozenset.intersection(*stored)) if len(stored) > 1 else 0,
                "children": [c.as_json() for c in self.children]}


def build_tree(items: list[Item]) -> Node:
    """The compressed prefix tree of these items (the root is the empty prefix)."""
    root = Node(0)
    _grow(root, items, 0)
    return root


def _grow(node: Node, items: list[Item], depth: int) -> None:
    # Every item here shares tokens[:depth]; those that end at depth stay at this node,
    # the rest are grouped by their next token, and each group's common prefix is its node.
    groups: dict[int, list[Item]] = {}
    for item in items:
        if len(item.tokens) == depth:
            node.items.append(item)
        else:
            groups.setdefault(item.tokens[depth], []).append(item)
    for group in groups.values():
        n = _common_prefix(group, depth + 1)
        child = Node(n)
        _grow(child, group, n)
        node.children.append(child)
    node.children.sort(key=lambda c: c.n_tokens)


def _common_prefix(items: list[Item], start: int) -> int:
    """The longest prefix all items share, knowing they share tokens[:start]."""
    first = items[0].tokens
    n = min(len(i.tokens) for i in items)
    for i in items[1:]:
        t = i.tokens
        k = start
        while k < n and t[k] == first[k]:
            k += 1
        n = k
    return n


def turn_opener(model) -> int | None:
    """The control token that opens a turn in this model's chat template, if any:
    the first one in the text a user turn adds to a conversation (its BOS, or a
    default system turn the template puts first, left out)."""
    if model.chat_template is None:
        return None
    try:
        text = model.chat.render([{"role": "user", "content": _PROBE}], after=(), generation_prompt=False)
    except CtxError:  # a template that cannot render a turn on its own: no turns to find
        return None
    tok = model.tokenizer
    return next((t for t in model.tokenize(text, parse_special=True) if tok.is_control(t)), None)


def messages(model, tokens: Sequence[int]) -> list[dict]:
    """The turns of a context: role, text, and the token range [start, end) each spans.

    ``end`` is where a fork "after this message" keeps up to (the turn's closing
    tokens included); a leading BOS belongs to the first turn."""
    tok = model.tokenizer
    opener = turn_opener(model)
    opens = [i for i, t in enumerate(tokens) if t == opener] if opener is not None else []
    segments: list[tuple[int, int | None, int]] = []  # (start, opener's position or None, end)
    if not opens:
        segments.append((0, None, len(tokens)))
    else:
        lead = tokens[:opens[0]]
        first = 0
        if lead and not all(tok.is_control(t) for t in lead):
            segments.append((0, None, opens[0]))
            first = opens[0]
        for k, (o, end) in enumerate(zip(opens, [*opens[1:], len(tokens)])):
            segments.append((first if k == 0 else o, o, end))
    out = []
    for start, o, end in segments:
        if start == end:
            continue
        role, text = "text", tok.decode(tokens[start:end], skip_special=True)
        if o is not None:
            role, _, text = tok.decode(tokens[o + 1:end], skip_special=True).partition("\n")
            role = role.strip() or "text"
        out.append({"index": len(out), "role": role, "text": text.strip(), "start": start, "end": end})
    return out
