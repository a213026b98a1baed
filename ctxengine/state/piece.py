"""What a generation streams: ``Context.generate`` yields pieces, and
``conversation.py`` joins them into a reply."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """One step of a stream. ``token_id`` is None only for a final piece that
    carries text held back until the end (an incomplete UTF-8 sequence or a
    possible start of a stop string)."""

    text: str
    token_id: int | None
