"""How close our logits are to a reference's: the measures the anchor tests
assert (teacher-forced top-1 agreement, mean |Δ log p| at the reference's
top-1 token, greedy agreement up to a near-tie), in one place."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NEAR_TIE = 0.05  # log-prob gap below which two greedy choices are a tie that rounding may break


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def log_normalizers(logits: np.ndarray) -> np.ndarray:
    """Each row's log of the sum of exp (log_softmax is the row less it): log_softmax's to
    ~3e-8 (the float32 exps' rounding; the anchors' smallest bar is 1e-3), and 15x faster
    on Gemma 3's 262,144-wide rows, whose float64 copy and logaddexp took some 4 s a chunk
    of 256 positions. The largest logit is taken out, the exps (each <= 1) made in float32
    and summed in float64."""
    top = logits.max(axis=-1, keepdims=True)
    sums = np.exp(logits - top).sum(axis=-1, dtype=np.float64)
    return top[..., 0].astype(np.float64) + np.log(sums)


@dataclass
class Agreement:
    """Accumulates, position by position, ours against a reference's top-1."""
    agree: int = 0
    gaps: list[float] = field(default_factory=list)
    where: list[tuple[str, int]] = field(default_factory=list)

    def add(self, label: str, start: int, our_logits: np.ndarray, ref_top1: np.ndarray, ref_top1_lp: np.ndarray):
        """our_logits: (n, n_vocab) for positions start..start+n; ref_*: (n,) for the same positions."""
        rows = np.arange(len(our_logits))
        self.agree += int(np.sum(our_logits.argmax(axis=1) == ref_top1))
        ours = our_logits[rows, ref_top1].astype(np.float64) - log_normalizers(our_logits)
        self.gaps.extend(np.abs(ours - ref_top1_lp).tolist())
        self.where.extend((label, start + i) for i in rows)

    @property
    def n(self) -> int:
        return len(self.gaps)

    @property
    def top1(self) -> float:
        return self.agree / self.n

    @property
    def mean_gap(self) -> float:
        return float(np.mean(self.gaps))

    def summary(self) -> str:
        worst = int(np.argmax(self.gaps))
        return (f"top-1 agreement {self.top1:.4f} over {self.n} positions; mean |d log p| {self.mean_gap:.3g}; "
                f"max {self.gaps[worst]:.3g} at {self.where[worst]}")


def first_parting(ours: list[int], theirs: list[int]) -> int | None:
    """Index of the first step where two greedy runs differ, or None if one is a prefix of the other."""
    return next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)


def tie_gap(last_logits: np.ndarray, a: int, b: int) -> float:
    lp = log_softmax(last_logits)
    return float(abs(lp[a] - lp[b]))
