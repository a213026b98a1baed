"""What a decode step costs, per row count, as measured on this model and machine.

Speculative decoding verifies ``k`` drafted tokens in one step of ``k + 1``
rows, and whether that pays depends on how much more such a step takes than a
step of one row: on SmolLM2 (49,152-token output projection) a few more rows
cost little, on Gemma 3 (262,144 tokens, 178 MB of Q8_0 multiplied once per
row) each costs a good share of a step, and past 8 rows the multi-row matmuls
stop being bound by the weight read on both. So the scheduler times every step
whose rows are all decode rows (each computes its logits) and the draft length
reads those times here (engine/speculative.py ``DraftLength``).

A row count's cost is the least of its last ``WINDOW`` times: a shared
machine only adds time, so the least is close to the step's own cost, and the
last few follow a load that lasts, alike for every row count measured lately
(the least of all time would not: one row, timed thousands of times, would
keep a quiet moment's time that the rarer counts never had). A row count is
trusted after ``TRUSTED`` samples; before that it is never taken to cost more
than the line through its trusted neighbours (or the prior slope past the
last), so a step slowed once by another process does not rule its row count
out. And each row costs at least ``MIN_SLOPE`` of a one-row step: times of
different moments must never make a draft look free.
"""
from __future__ import annotations

WINDOW = 8          # recent times kept per row count
TRUSTED = 3         # samples before a row count's own times are believed over its neighbours'
PRIOR_SLOPE = 0.1   # each row past the largest trusted count, as a share of one row's step
MIN_SLOPE = 0.1     # the least any row adds, as a share of one row's step
MAX_ROWS = 64       # larger decode steps are not recorded (no draft makes them)


class StepCost:
    """Seconds of a decode step of n rows; call it as ``cost(n)``. Written by the
    scheduler's thread, read by the generating ones: each row count's record is
    one tuple, replaced whole, so a reader never sees one half-written."""

    def __init__(self):
        self._times: list[tuple[float, ...]] = [()] * (MAX_ROWS + 1)  # [rows] -> the last WINDOW seconds
        self._version = 0  # bumped by every observation
        # (version, rows, curve): the last curve made, reused until a step is observed (the
        # generating threads ask once per drafted token, the scheduler observes once per step)
        self._made: tuple[int, int, list[float]] = (-1, 0, [])

    def observe(self, rows: int, seconds: float) -> None:
        if 1 <= rows <= MAX_ROWS:
            self._times[rows] = (*self._times[rows][1 - WINDOW:], seconds)
            self._version += 1

    def curve(self, rows: int) -> list[float]:
        """Seconds of a step of 0, 1, ..., rows rows. Never less for more rows: a step's
        work only grows with its rows, each row by at least MIN_SLOPE of one."""
        version = self._version  # read first: a curve made from newer times is only made again
        made_at, made_rows, made = self._made
        if made_at == version and made_rows >= rows:
            return made[:rows + 1]
        out = self._make(rows)
        self._made = (version, rows, out)
        return out[:]

    def _make(self, rows: int) -> list[float]:
        least = [(len(t), min(t, default=0.0)) for t in self._times]  # each tuple whole, as it was
        trusted = {r: t for r, (n, t) in enumerate(least) if n >= TRUSTED}
        if 1 not in trusted:  # one row anchors the line even before it is trusted
            n, t = least[1]
            guesses = [s / (1 + PRIOR_SLOPE * (r - 1)) for r, (m, s) in enumerate(least) if m]
            trusted[1] = t if n else min(guesses, default=1.0)  # nothing measured: 1
        counts = sorted(trusted)
        out = [0.0]
        for r in range(1, rows + 1):
            n, t = least[r] if r <= MAX_ROWS else (0, 0.0)
            if n >= TRUSTED:
                own = t
            else:
                line = _line(trusted, counts, r)
                own = min(t, line) if n else line
            floor = out[-1] + MIN_SLOPE * out[1] if r > 1 else 0.0
            out.append(max(own, floor))
        return out

    def __call__(self, rows: int) -> float:
        return self.curve(rows)[rows]


def _line(trusted: dict[int, float], counts: list[int], rows: int) -> float:
    """The cost at rows on the line through the trusted counts around it, or, with
    none above, the prior slope from the nearest below."""
    below = max(r for r in counts if r <= rows)
    above = [r for r in counts if r > rows]
    if not above:
        return trusted[below] + PRIOR_SLOPE * trusted[1] * (rows - below)
    hi = above[0]
    return trusted[below] + (rows - below) / (hi - below) * (trusted[hi] - trusted[below])
