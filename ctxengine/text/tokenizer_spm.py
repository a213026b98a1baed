"""SentencePiece-style BPE by scores (``tokenizer.ggml.model = "llama"``), as
llama.cpp's llm_tokenizer_spm runs it.

A fragment's spaces become "▁" (and a "▁" is put in front when
``add_space_prefix`` is set and the fragment starts the text or follows a
special token). Then, starting from single characters, the adjacent pair whose
concatenation is the highest-scoring token is merged until no pair is a token.
A symbol left that is not a token falls back to ``<0xXX>`` byte tokens.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ctxengine.text.tokenizer_bpe import merge_symbols
from ctxengine.errors import TokenizerError

SPACE = "\u2581"  # "▁", SentencePiece's visible space
_BYTE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class SpmEncoder:
    """Encodes text fragments (special tokens already cut out) to token ids."""

    def __init__(self, token_to_id: Mapping[str, int], scores: Sequence[float],
                 byte_ids: Sequence[int | None], add_space_prefix: bool):
        self._token_to_id = token_to_id
        self._scores = scores
        self._byte_ids = byte_ids
        self._add_space_prefix = add_space_prefix

    def encode(self, text: str, after_special: bool) -> list[int]:
        """``after_special``: the fragment starts the text or follows a special token."""
        if self._add_space_prefix and after_special:
            text = " " + text
        ids: list[int] = []
        for symbol in merge_symbols(list(text.replace(" ", SPACE)), self._priority):
            token = self._token_to_id.get(symbol)
            if token is not None:
                ids.append(token)
            else:
                ids.extend(self._byte_tokens(symbol))
        return ids

    def _priority(self, left: str, right: str) -> float | None:
        # Any token counts, control tokens included, as in llama.cpp.
        token = self._token_to_id.get(left + right)
        return None if token is None else -self._scores[token]

    def _byte_tokens(self, symbol: str) -> list[int]:
        # Merged symbols are always tokens, so this is one character that is not:
        # llama.cpp's rev_merge re-segmentation never applies to valid UTF-8.
        ids = []
        for b in symbol.encode("utf-8", "surrogatepass"):
            token = self._byte_ids[b]
            if token is None:
                raise TokenizerError(f"the vocabulary has no byte token for 0x{b:02X}")
            ids.append(token)
        return ids


def byte_token_ids(token_to_id: Mapping[str, int]) -> list[int | None]:
    """Byte value -> its fallback token: ``<0xXX>``, else the one-character token
    for an ASCII byte (llama_vocab::byte_to_token), else ``<0xxx>`` (hex digits in
    lower case, which llama.cpp reads as the byte but does not look up), else None.

    A vocabulary with byte tokens (``<0xXX>``) is read as one that falls back to
    bytes: one missing among them is a TokenizerError now, naming the key (the
    loader adds the file), not a text that cannot be encoded on first use."""
    ids: list[int | None] = []
    for b in range(256):
        token = token_to_id.get(f"<0x{b:02X}>")
        if token is None and b < 0x80:
            token = token_to_id.get(chr(b))
        if token is None:
            token = token_to_id.get(f"<0x{b:02x}>")
        ids.append(token)
    spelled = [b for b in range(256) if f"<0x{b:02X}>" in token_to_id]
    missing = [b for b in range(256) if ids[b] is None]
    if spelled and missing:
        shown = ", ".join(f"<0x{b:02X}>" for b in missing[:8])
        shown += f" and {len(missing) - 8} more" if missing[8:] else ""
        odd = [f"{t!r} (id {i})" for t, i in token_to_id.items() if t.startswith("<0x") and not _BYTE.fullmatch(t)]
        hint = f" (these spell no byte: {', '.join(odd[:4])})" if odd else ""
        raise TokenizerError(f"tokenizer.ggml.tokens has byte tokens (<0x{spelled[0]:02X}>...) but none for "
                             f"{len(missing)} of the 256 bytes: {shown}{hint}; text with those bytes could not "
                             "be encoded")
    return ids
