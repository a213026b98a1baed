"""The thread pool's chunks (native/core/threads.h): every unit exactly once,
chunks starting on the grain, and guided chunks that shrink as the work runs
out. Which thread runs a chunk never changes a result (DESIGN.md); the
model's tests check that at every thread count."""
import pytest

from ctxengine import _core


def covers_once(chunks, n):
    units = sorted(u for b, e in chunks for u in range(b, e))
    return units == list(range(n))


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n, grain", [(1, 16), (16, 16), (17, 16), (576, 16), (960, 16), (49152, 16), (100, 7)])
def test_fixed_chunks_cover_every_unit_once(n, grain, threads):
    chunks = _core.parallel_chunks(n, grain, threads, False)
    assert covers_once(chunks, n)
    assert all(b % grain == 0 and (e - b == grain or e == n) for b, e in chunks)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("n, grain", [(1, 16), (16, 16), (17, 16), (576, 16), (960, 16), (49152, 16), (100, 7)])
def test_guided_chunks_cover_every_unit_once_and_shrink(n, grain, threads):
    chunks = sorted(_core.parallel_chunks(n, grain, threads, True))
    assert covers_once(chunks, n)
    assert all(b % grain == 0 for b, _ in chunks)
    if threads == 1 or n <= grain:
        assert chunks == [(0, n)]  # run on the caller, whole
        return
    for b, e in chunks:
        share = -(-(n - b) // (2 * threads))  # 1 / (2 * threads) of what is left, rounded up
        want = max(grain, -(-share // grain) * grain)
        assert e == min(n, b + want), (b, e, want)
    # the first chunk is a long run, the last ones as short as the grain allows
    assert chunks[0][1] - chunks[0][0] >= n // (2 * threads) and chunks[-1][1] - chunks[-1][0] <= grain
