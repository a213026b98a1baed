"""Token sampling with explicit, portable RNG state, and stop strings.

The chain, in llama.cpp's default order (less the samplers we do not have):

0. logit_bias: each listed token's logit plus its bias, in float32 (OpenAI's
   ``logit_bias``; llama.cpp adds it before the rest of the chain too);
1. penalties: repeat (llama.cpp: ``logit > 0 ? logit / p : logit * p``), then
   frequency and presence (OpenAI: ``logit -= count * freq + (count > 0) * presence``),
   all over the distinct ids among the last ``repeat_last_n`` tokens of the
   history (0: no penalties, -1: the whole history) -- llama.cpp's window;
2. top_k: the k largest logits (ties at the cut: lowest ids);
3. top_p: the shortest prefix, in the order below, whose probability at
   temperature 1, renormalised over the top-k survivors, reaches top_p;
4. min_p: logits with probability >= min_p * the largest one;
5. temperature: divide the survivors' logits by it;
6. softmax in float64;
7. draw: one uniform u in [0, 1) (below) and the first candidate, in order of
   probability descending then id ascending, whose cumulative weight exceeds
   u * total (inverse CDF).

top_p 0 keeps only the first candidate in that order (a target of 0 is reached
by the first weight), as llama.cpp keeps at least one.

temperature 0 is greedy: the argmax of the biased, penalised logits (ties: lowest id),
with no draw.  Every other call draws exactly once, even when a single
candidate survives, so the RNG position is the number of sampled tokens.

The RNG is splitmix64 (Steele, Lea & Flood 2014; Vigna's reference constants)
in pure Python: the state is one 64-bit integer, saved as 16 hex digits, so a
snapshot continues identically on any machine and numpy version.  A uniform is
the output's top 53 bits times 2**-53 (exact in a double).

Penalties and top_k work on the float32 logits (penalised values rounded to
float32, as llama.cpp keeps them, and held within its finite range); the softmax and everything after, on the
survivors in float64.  The arithmetic is deterministic given the numpy build:
element-wise operations, and sums in a fixed order.  ``np.exp`` may differ in
the last ulp between numpy builds (SIMD variants); that moves a CDF boundary
by ~1e-16 relative, so a draw could differ with about that probability per
token.

Speed: nothing is sorted but the candidates a step needs.  top_k selects with
a partition; top_p and the draw sort only the head of the order up to where
their running sum crosses (see ``prefix_to``), so even with every filter off
a 262k vocabulary is rarely sorted whole.
"""
from __future__ import annotations

import math
import numbers
import operator
import secrets
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import CtxError, RequestError

STATE_FORMAT = "ctxengine.sampler/1"
_MASK64 = (1 << 64) - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


# -- the RNG --------------------------------------------------------------------
def splitmix64(state: int) -> tuple[int, int]:
    """One step of splitmix64: (next state, 64-bit output)."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def uniform(bits: int) -> float:
    """A float in [0, 1) from 64 random bits: the top 53, exactly."""
    return (bits >> 11) * (1.0 / (1 << 53))


# -- parameters -------------------------------------------------------------------
def _real(name: str, v: Any, ok, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not ok(v):
        raise RequestError(f"sampling option {name} must be {what}, got {v!r}", param=name)
    return float(v)


def _int(name: str, v: Any, ok, what: str) -> int:
    try:
        if isinstance(v, bool):
            raise TypeError
        n = operator.index(v)
    except TypeError:
        raise RequestError(f"sampling option {name} must be an integer, got {v!r}", param=name) from None
    if not ok(n):
        raise RequestError(f"sampling option {name} must be {what}, got {n}", param=name)
    return n


BIAS_LIMIT = 100.0  # OpenAI's range for a logit bias: -100 bans a token, 100 all but forces it


def _logit_bias(v: Any) -> tuple[tuple[int, float], ...]:
    """logit_bias as (token id, bias) pairs by ascending id, from {id: bias} (ids may be
    strings of digits, as JSON object keys are) or [[id, bias], ...]."""
    what = "a map of token ids to numbers in [-100, 100]"
    if isinstance(v, (str, bytes)):
        raise RequestError(f"sampling option logit_bias must be {what}, got {v!r}", param="logit_bias")
    try:
        pairs = [tuple(item) for item in (v.items() if isinstance(v, Mapping) else v)]
    except TypeError:
        raise RequestError(f"sampling option logit_bias must be {what}, got {v!r}", param="logit_bias") from None
    out: dict[int, float] = {}
    for pair in pairs:
        if len(pair) != 2:
            raise RequestError(f"sampling option logit_bias must be {what}, got the entry {list(pair)!r}",
                               param="logit_bias")
        key, bias = pair
        if isinstance(key, str) and key.isascii() and key.isdigit():
            key = int(key)
        token = _int("logit_bias", key, lambda n: 0 <= n < 2**31, "keyed by token ids (0 to 2^31 - 1)")
        out[token] = _real(f"logit_bias[{token}]", bias, lambda x: abs(x) <= BIAS_LIMIT, "in [-100, 100]")
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class SamplerParams:
    temperature: float = 0.8     # 0 → greedy
    top_k: int = 40              # 0 → off
    top_p: float = 0.95          # 1 → off; 0 → the most likely token only (llama.cpp's reading)
    min_p: float = 0.05          # 0 → off
    repeat_penalty: float = 1.0  # 1 → off
    repeat_last_n: int = 64      # penalty window; 0 → no penalties, -1 → whole history
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None      # None → drawn when a Sampler is made, and recorded
    logit_bias: tuple = ()       # ((token id, bias), ...) by id; {id: bias} is taken too

    def __post_init__(self):
        # Normalise types (so to_dict() is plain JSON) and refuse nonsense early.
        checked = {
            "temperature": _real("temperature", self.temperature, lambda x: x >= 0, ">= 0"),
            "top_k": _int("top_k", self.top_k, lambda n: n >= 0, ">= 0"),
            "top_p": _real("top_p", self.top_p, lambda x: 0 <= x <= 1, "in [0, 1]"),
            "min_p": _real("min_p", self.min_p, lambda x: 0 <= x <= 1, "in [0, 1]"),
            "repeat_penalty": _real("repeat_penalty", self.repeat_penalty, lambda x: x > 0, "> 0"),
            "repeat_last_n": _int("repeat_last_n", self.repeat_last_n, lambda n: n >= -1, ">= -1"),
            "presence_penalty": _real("presence_penalty", self.presence_penalty, lambda x: True, "finite"),
            "frequency_penalty": _real("frequency_penalty", self.frequency_penalty, lambda x: True, "finite"),
            "seed": None if self.seed is None else _int(
                "seed", self.seed, lambda n: 0 <= n <= _MASK64, "None or in [0, 2**64)"),
            "logit_bias": _logit_bias(self.logit_bias),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict:
        return {**asdict(self), "logit_bias": [list(pair) for pair in self.logit_bias]}  # as JSON reads it back

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SamplerParams":
        if not isinstance(d, Mapping):
            raise CtxError(f"sampler params must be a mapping, got {type(d).__name__}")
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise CtxError(f"unknown sampling option(s): {', '.join(sorted(map(str, unknown)))}")
        return cls(**d)


# -- the chain, as pure functions -------------------------------------------------
def checked_logits(logits: np.ndarray) -> np.ndarray:
    """The logits as float32; NaN, +inf or nothing finite means the forward pass went wrong."""
    x = np.asarray(logits, dtype=np.float32)
    if x.ndim != 1 or x.size == 0:
        raise CtxError(f"logits must be a non-empty vector, got shape {x.shape}")
    if not np.all(x < np.inf):  # False for NaN too
        raise CtxError("logits contain NaN or +inf")
    if not np.any(x > -np.inf):
        raise CtxError("every logit is -inf: nothing can be sampled")
    return x


def apply_bias(x: np.ndarray, ids: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """x with bias[i] added to x[ids[i]] in float32 (a copy)."""
    if ids[-1] >= len(x):
        raise CtxError(f"logit_bias names token id {int(ids[-1])}, outside the vocabulary (0..{len(x) - 1})")
    x = x.copy()
    x[ids] += bias
    return x


def apply_penalties(x: np.ndarray, history: Sequence[int], p: SamplerParams) -> np.ndarray:
    """Repeat, frequency and presence penalties over the window's distinct ids (a copy if any apply).

    Computed in float64 and stored as float32, the logits' own precision, as llama.cpp does.
    """
    if p.repeat_last_n == 0 or len(history) == 0 or (
            p.repeat_penalty == 1 and p.presence_penalty == 0 and p.frequency_penalty == 0):
        return x
    window = history if p.repeat_last_n < 0 else history[-p.repeat_last_n:]
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    if ids[0] < 0 or ids[-1] >= len(x):
        bad = ids[0] if ids[0] < 0 else ids[-1]
        raise CtxError(f"history token id {bad} is outside the vocabulary (0..{len(x) - 1})")
    v = x[ids].astype(np.float64)
    banned = np.isneginf(v)  # a grammar's mask: no penalty brings such a token back
    # Any finite penalty is taken (Ollama's options have no range): a result beyond float32
    # saturates at its largest value, so a huge penalty bans a token or all but forces it,
    # never turning a logit into an infinity (or a NaN) that the rest of the chain cannot use.
    with np.errstate(over="ignore"):
        if p.repeat_penalty != 1:
            v = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
        penalty = counts * p.frequency_penalty + p.presence_penalty  # every count here is > 0
        v = np.clip(v, -FLOAT32_MAX, FLOAT32_MAX) - np.clip(penalty, -FLOAT32_MAX, FLOAT32_MAX)
    x = x.copy()
    x[ids] = np.where(banned, -np.inf, np.clip(v, -FLOAT32_MAX, FLOAT32_MAX))
    return x


def top_k_ids(x: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values, ascending; ties at the cut go to the lowest positions.

    So they are exactly the first k of the draw order (value descending, position ascending).
    """
    n = len(x)
    if k == 0 or k >= n:
        return np.arange(n)
    kth = np.partition(x, n - k)[n - k]  # O(n); argpartition's own tie choice is unspecified
    above = np.flatnonzero(x > kth)
    ties = np.flatnonzero(x == kth)[: k - len(above)]
    return np.sort(np.concatenate([above, ties]))


def prefix_to(ids: np.ndarray, v: np.ndarray, weight, target: float, side: str):
    """Candidates (``ids`` ascending, logits ``v``) in draw order, up to and including the
    first whose running weight passes ``target`` (>= for side "left", > for "right"); all
    of them if none does.

    Both top_p and the draw need only such a prefix, so this sorts the top m
    candidates and widens m only when the crossing lies beyond them: a full sort
    of the vocabulary is rare even with every filter off.
    """
    m = 256
    while True:
        head = top_k_ids(v, m)
        order = head[np.argsort(-v[head], kind="stable")]  # stable on ascending ids: ties by id
        cum = np.cumsum(weight(v[order]))
        n = int(np.searchsorted(cum, target, side=side)) + 1
        if n <= len(order) or len(order) == len(v):
            return ids[order[:n]], v[order[:n]]
        m *= 16


def sample_candidates(x: np.ndarray, p: SamplerParams, u: float) -> int:
    """top_k, top_p, min_p, temperature, softmax and the draw at u, over float32 logits x."""
    if 0 < p.top_k < len(x):
        ids = top_k_ids(x, p.top_k)
        v = x[ids].astype(np.float64)
    else:  # the whole vocabulary: skip the gather
        ids, v = np.arange(len(x)), x.astype(np.float64)
    top = v.max()  # survives every filter, so every weight is <= 1 and the total >= 1
    # top_p's target is over the top-k survivors at temperature 1.  min_p keeps
    # a prefix of the same order (logit >= top + ln min_p), so applying it
    # before top_p's cut gives the same set and leaves less to sort.
    target = p.top_p * np.exp(v - top).sum() if p.top_p < 1 else None
    if p.min_p > 0:
        keep = np.flatnonzero(v >= top + math.log(p.min_p))
        ids, v = ids[keep], v[keep]
    if target is not None:
        ids, v = prefix_to(ids, v, lambda s: np.exp(s - top), target, "left")
        order = np.argsort(ids)  # back to ascending ids, as prefix_to wants them
        ids, v = ids[order], v[order]

    def weight(s):
        return np.exp((s - top) / p.temperature)

    ids, v = prefix_to(ids, v, weight, u * weight(v).sum(), "right")
    # u * total can round up to the total: then never pick a token of weight 0.
    w = weight(v)
    return int(ids[len(w) - 1 if w[-1] > 0 else np.count_nonzero(w) - 1])


# -- the sampler --------------------------------------------------------------------
class Sampler:
    """The chain above with its RNG; ``state()`` / ``from_state()`` continue it exactly."""

    def __init__(self, params: SamplerParams):
        if not isinstance(params, SamplerParams):
            raise CtxError(f"Sampler needs SamplerParams, got {type(params).__name__}")
        if params.seed is None:
            # 53 bits: the recorded seed stays exact in any JSON reader.
            params = replace(params, seed=secrets.randbits(53))
        self.params = params
        self._rng = params.seed
        self._bias_ids = np.array([i for i, _ in params.logit_bias], dtype=np.int64)
        self._bias = np.array([b for _, b in params.logit_bias], dtype=np.float32)

    def _uniform(self) -> float:
        self._rng, bits = splitmix64(self._rng)
        return uniform(bits)

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        p = self.params
        x = checked_logits(logits)
        if len(self._bias_ids):
            x = apply_bias(x, self._bias_ids, self._bias)
        x = apply_penalties(x, history, p)
        if p.temperature == 0:
            return int(np.argmax(x))  # first maximum: the lowest id
        return sample_candidates(x, p, self._uniform())

    def with_params(self, params: SamplerParams) -> "Sampler":
        """New settings on this RNG stream, continued; a params.seed restarts it instead."""
        if params.seed is not None:
            return Sampler(params)
        s = Sampler(replace(params, seed=self.params.seed))  # seed: where the stream began
        s._rng = self._rng
        return s

    def state(self) -> dict:
        return {"format": STATE_FORMAT, "params": self.params.to_dict(),
                "rng": {"algorithm": "splitmix64", "state": f"{self._rng:016x}"}}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "Sampler":
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            got = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise CtxError(f"not a sampler state of format {STATE_FORMAT!r} (got {got!r})")
        rng = state.get("rng")
        if not isinstance(rng, Mapping) or rng.get("algorithm") != "splitmix64":
            raise CtxError(f"sampler state has an unknown RNG: {rng!r}")
        hex_state = rng.get("state")
        if not (isinstance(hex_state, str) and len(hex_state) == 16
                and all(c in "0123456789abcdef" for c in hex_state)):
            raise CtxError(f"sampler RNG state must be 16 lowercase hex digits, got {hex_state!r}")
        s = cls(SamplerParams.from_dict(state.get("params", {})))
        s._rng = int(hex_state, 16)
        return s

    @classmethod
    def continuing(cls, state: Mapping[str, Any] | None, options: Mapping[str, Any]) -> "Sampler":
        """A generation's sampler: ``options`` (SamplerParams fields; a ValueError names an
        unknown one) on the RNG stream ``state`` left (a context's last generation), or a
        new stream where there is none or ``options`` seed one."""
        unknown = set(options) - set(SamplerParams.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sampling option(s): {', '.join(sorted(unknown))}")
        params = SamplerParams(**options)
        return cls.from_state(state).with_params(params) if params.seed is None and state is not None else cls(params)

    def __repr__(self) -> str:
        return f"Sampler({self.params!r})"


# -- stop strings ---------------------------------------------------------------------
class StopMatcher:
    """Cut a text stream at the first stop string.

    ``push`` returns what is safe to emit now, holding back the longest tail
    that could begin a stop string, so no stop is ever split across pieces
    already emitted; on a hit it emits the text before the stop and reports
    True, and everything after is dropped.
    """

    def __init__(self, stops: Sequence[str] | None, *, active: bool = True):
        """``stops``: None or a sequence of non-empty strings (a RequestError names ``stop``
        otherwise); ``active`` False checks them and then cuts nothing."""
        what = "None or a sequence of non-empty strings"
        if isinstance(stops, (str, bytes, bytearray)) or not isinstance(stops, (Iterable, type(None))):
            raise RequestError(f"stop must be {what}, not {type(stops).__name__} {stops!r:.40}", param="stop")
        self.stops = list(() if stops is None else stops)
        for s in self.stops:
            if not isinstance(s, str) or not s:
                raise RequestError(f"stop must be {what}; it holds {s!r:.40}", param="stop")
        if not active:
            self.stops = []
        self._held = ""
        self.hit = False

    def push(self, text: str) -> tuple[str, bool]:
        if self.hit:
            return "", True
        buf = self._held + text
        # Any stop starting in emitted text would have been held back, so the
        # earliest stop of the whole stream, if any, starts inside buf.
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if found:
            self.hit, self._held = True, ""
            return buf[: min(found)], True
        hold = max((n for s in self.stops for n in range(min(len(s) - 1, len(buf)), 0, -1)
                    if buf.endswith(s[:n])), default=0)
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        """The held-back tail, once the stream has ended without a stop."""
        rest, self._held = self._held, ""
        return rest
