"""The unfinished grammar a context carries between generations.

A generation under a grammar (``generate(grammar=...)`` or ``json_schema=``)
leaves its constraint in the context while the output is unfinished (cut by
max_tokens): the next ``generate()`` without a grammar continues it, a fork
forks it, a snapshot stores it and a restore replays it (see
text/grammar.py). Appending ends it: appended text is the caller's, not the
grammar's.

A context holds it as a live ``Constraint``, or as the state a snapshot stores
(a dict), replayed over the context's tokens when a generation first needs it.
"""
from __future__ import annotations

from typing import Sequence

from ..text.grammar import Constraint, Grammar
from ..text.tokenizer import Tokenizer

Held = Constraint | dict | None


def started_constraint(held: Held, grammar: Grammar | None, tokenizer: Tokenizer,
                       tokens: Sequence[int]) -> Constraint | None:
    """A new grammar starts at the current end; without one, an unfinished one goes on."""
    if grammar is not None:
        return Constraint(grammar, tokenizer, len(tokens))
    if isinstance(held, dict):  # restored: replay the tokens consumed under it
        return Constraint.from_state(held, tokenizer, tokens)
    return held


def forked_constraint(held: Held, keep: int, n_tokens: int, share: bool = False) -> Held:
    """The constraint of the first ``keep`` of ``n_tokens`` tokens (``share``: this one, rolled back)."""
    if held is None:
        return None
    start = held.start if isinstance(held, Constraint) else held["start"]
    if keep < start:
        return None
    if isinstance(held, dict):
        return dict(held)  # replayed over the (shorter) tokens when next used
    if keep == n_tokens:
        return held if share else held.fork()
    return held.state()  # replayed over the first keep tokens when next used


def stored_constraint(held: Held) -> dict | None:
    """The unfinished grammar, as a snapshot stores it (None: there is none)."""
    return held.state() if isinstance(held, Constraint) else held
