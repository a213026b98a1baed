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

import json
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

    def walk(self) -> list["Node"]:
        """This node and every node below it, parents before children (no recursion:
        a chain of forks makes a tree thousands of levels deep)."""
        out, stack = [], [self]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out

    def all_items(self) -> list[Item]:
        return [i for node in self.walk() for i in node.items]

    def as_json(self) -> dict:
        # Bottom up, once: each node's shared pages are the meet of its own items' and its children's.
        done: dict[int, tuple[dict, _Meet, _Meet]] = {}
        for node in reversed(self.walk()):
            below = [done.pop(id(c)) for c in node.children]
            live = _Meet.of([i.pages for i in node.items if i.pages is not None], [b[1] for b in below])
            stored = _Meet.of([i.page_keys for i in node.items if i.card["kind"] == "snapshot" and i.page_keys],
                              [b[2] for b in below])
            done[id(node)] = ({"n_tokens": node.n_tokens, "items": [i.card for i in node.items],
                               "shared_pages": live.n_shared, "shared_stored_pages": stored.n_shared,
                               "children": [b[0] for b in below]}, live, stored)
        return done[id(self)][0]


@dataclass
class _Meet:
    """The page sets of ``n`` items below a node, met: the pages all of them hold."""

    n: int = 0
    pages: frozenset | None = None  # None while n == 0

    @property
    def n_shared(self) -> int:
        return len(self.pages) if self.n > 1 else 0

    @staticmethod
    def of(own: list[frozenset], below: list["_Meet"]) -> "_Meet":
        sets = own + [m.pages for m in below if m.n]
        return _Meet(len(own) + sum(m.n for m in below), frozenset.intersection(*sets) if sets else None)


def build_tree(items: list[Item]) -> Node:
    """The compressed prefix tree of these items (the root is the empty prefix)."""
    root = Node(0)
    # Every item of a pending (node, items, depth) shares tokens[:depth]; those that end at depth
    # stay at the node, the rest are grouped by their next token, and each group's common prefix
    # is its node. A stack, not recursion: the tree is as deep as the longest chain of forks.
    pending = [(root, items, 0)]
    while pending:
        node, group_items, depth = pending.pop()
        groups: dict[int, list[Item]] = {}
        for item in group_items:
            if len(item.tokens) == depth:
                node.items.append(item)
            else:
                groups.setdefault(item.tokens[depth], []).append(item)
        for group in groups.values():
            n = _common_prefix(group, depth + 1)
            child = Node(n)
            node.children.append(child)
            pending.append((child, group, n))
        node.children.sort(key=lambda c: c.n_tokens)
    return root


def dumps(value) -> str:
    """``value`` as JSON text, however deeply it nests (``json.dumps`` stops at ~1000 levels)."""
    out: list[str] = []
    stack: list = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, _Text):
            out.append(v)
        elif isinstance(v, dict) and v:
            stack.append(_Text("}"))
            for k, (key, val) in reversed(list(enumerate(v.items()))):
                stack += [val, _Text(("," if k else "{") + json.dumps(str(key)) + ":")]
        elif isinstance(v, (list, tuple)) and v:
            stack.append(_Text("]"))
            for k, val in reversed(list(enumerate(v))):
                stack += [val, _Text("," if k else "[")]
        else:
            out.append(json.dumps(v))
    return "".join(out)


class _Text(str):
    """JSON text already written (a marker on ``dumps``'s stack)."""


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
