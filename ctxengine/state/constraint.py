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

from typing import TYPE_CHECKING, Sequence

from ..text.closing import Closer
from ..text.grammar import Constraint, Grammar
from ..text.tokenizer import Tokenizer

if TYPE_CHECKING:
    from ..text.lazy_calls import LazyCalls

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


class Steering:
    """What steers one generate(): the grammar it runs under (a new one, or an unfinished one
    going on), the closer that ends a JSON reply within its budget (text/closing.py), and the
    calls the model may begin of its own accord (text/lazy_calls.py), each constrained from
    its tag to its end. ``kept`` is the constraint the context holds after it."""

    def __init__(self, held: Held, grammar: Grammar | None, tokenizer: Tokenizer, tokens: Sequence[int],
                 close_json: bool, calls: "LazyCalls | None" = None):
        self._tok, self._close_json = tokenizer, close_json
        self.constraint = started_constraint(held, grammar, tokenizer, tokens)
        open_call = self.constraint is not None and self.constraint.call_skip is not None  # cut by max_tokens
        self._calls = calls if self.constraint is None or open_call else None  # else the reply is the grammar's
        if self._calls is not None:
            self._calls.watch(tokens)
        self._closer = self._closer_of(tokens)
        # Stop strings never cut a reply that must parse (docs/agents.md), only free text and GBNF.
        self.stops_apply = self.constraint is None or not self.constraint.grammar.is_json

    def _closer_of(self, tokens: Sequence[int]) -> Closer | None:
        c = self.constraint
        return Closer(c, self._tok, tokens[c.start:]) if self._close_json and c is not None and c.grammar.is_json \
            else None

    def forced(self, left: int) -> int | None:
        """The token to emit instead of sampling (the JSON's completion), or None."""
        return self._closer.next_token(left) if self._closer is not None else None

    def checked(self, token: int, left: int) -> int:
        """The sampled token, or the completion's where it would leave the JSON unclosable."""
        if self._closer is not None and not self._closer.keep(token, left):
            return self._closer.next_token(left)
        return token

    def advance(self, token: int) -> None:
        if self.constraint is not None:
            self.constraint.advance(token)
            if self._closer is not None:
                self._closer.consumed(token)

    def appended(self, tokens: Sequence[int]) -> None:
        """After a token is appended: a call that began starts its grammar, one that ended
        lets the reply go on free."""
        if self._calls is None:
            return
        if self.constraint is None:
            self.constraint = self._calls.started(tokens)
            self._closer = self._closer_of(tokens) if self.constraint is not None else None
        elif self.constraint.done and self._calls.single:
            self._calls = None  # the one call is made: the reply ends with it (done)
        elif self.constraint.done:
            self.constraint = self._closer = None
            self._calls.watch(tokens)

    @property
    def done(self) -> bool:
        """The grammar is complete: only an end of turn could follow (after a call the reply goes
        on, unless that was the one call it may make)."""
        return self._calls is None and self.constraint is not None and self.constraint.done

    @property
    def kept(self) -> Constraint | None:
        """The constraint the context holds now (a call's too: a fork, or the next generate(),
        goes on with the call constrained)."""
        return self.constraint
