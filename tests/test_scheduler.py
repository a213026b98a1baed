"""Continuous batching: concurrent forwards share native steps and give exactly
what each would alone (ctxengine/engine/scheduler.py)."""
import random
import threading
import time

import numpy as np
import pytest

import ctxengine as ce
from ctxengine.engine.scheduler import cancelled_when
from ctxengine.errors import CancelledError


@pytest.fixture(scope="module")
def model(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    yield m
    m.close()


def concurrently(fns):
    """Run every fn in its own thread, released together; their results in order."""
    out, errs = [None] * len(fns), [None] * len(fns)
    gate = threading.Barrier(len(fns))

    def run(i):
        gate.wait()
        try:
            out[i] = fns[i]()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            errs[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return out, errs


def test_batched_forward_is_bit_identical_to_alone(model):
    eng = model.engine
    rng = random.Random(6)
    for _ in range(3):
        lengths = [rng.choice([1, 2, 7, 40, 130, 300]) for _ in range(rng.randint(2, 6))]
        prompts = [[rng.randrange(eng.config.n_vocab) for _ in range(n)] for n in lengths]
        alone = []
        for p in prompts:
            seq = eng.new_sequence()
            alone.append((eng.forward(seq, p, all_logits=True), eng.forward(seq, [42]), seq))
        seqs = [eng.new_sequence() for _ in prompts]

        def job(seq, p):
            return lambda: (eng.forward(seq, p, all_logits=True), eng.forward(seq, [42]))

        out, errs = concurrently([job(s, p) for s, p in zip(seqs, prompts)])
        assert errs == [None] * len(prompts)
        for (a_all, a_next, a_seq), (b_all, b_next), seq in zip(alone, out, seqs):
            assert np.array_equal(a_all, b_all) and np.array_equal(a_next, b_next)
            assert seq.n_tokens == a_seq.n_tokens


def test_forks_in_one_step_get_their_own_logits_bit_for_bit(model):
    # Rows of forks over one prefix are attended together, the prefix's
    # shared pages read once for all of them (Model::attention's bundles),
    # and a prompt's rows likewise; every row must get the logits it gets
    # alone, bit for bit. The fork point is mid-page, so each fork's last
    # pages are its own copies.
    eng = model.engine
    rng = random.Random(16)
    prefix = eng.new_sequence()
    eng.forward(prefix, [rng.randrange(eng.config.n_vocab) for _ in range(150)])
    steps = [[rng.randrange(eng.config.n_vocab) for _ in range(6)] for _ in range(3)]
    prompt = [rng.randrange(eng.config.n_vocab) for _ in range(37)]
    alone = []
    for b in range(6):
        seq = prefix.fork()
        alone.append([eng.forward(seq, [step[b]]).copy() for step in steps])
    alone_prompt = eng.forward(prefix.fork(), prompt, all_logits=True)
    forks = [prefix.fork() for _ in range(6)]
    with_prompt = prefix.fork()
    for i, step in enumerate(steps):
        bufs = [np.empty((1, eng.config.n_vocab), np.float32) for _ in forks]
        batch = [(s, np.array([t], np.int32), buf, False, None) for s, t, buf in zip(forks, step, bufs)]
        if i == 0:  # a prompt's rows in the same step
            prompt_buf = np.empty((len(prompt), eng.config.n_vocab), np.float32)
            batch.append((with_prompt, np.array(prompt, np.int32), prompt_buf, True, None))
        eng._core.forward(batch)
        for b, buf in enumerate(bufs):
            assert np.array_equal(buf[0].view(np.uint32), np.asarray(alone[b][i], np.float32).view(np.uint32)), (i, b)
    assert np.array_equal(prompt_buf.view(np.uint32), np.asarray(alone_prompt, np.float32).view(np.uint32))


def test_forward_hidden_and_last_logits_through_chunks(model):
    eng = model.engine
    ids = list(range(100, 700))  # over two step budgets: split into chunks
    ref = eng.new_sequence()
    ref_logits = [eng.forward(ref, ids[i:i + 64], all_logits=True) for i in range(0, len(ids), 64)]
    last = eng.forward(eng.new_sequence(), ids)
    assert np.array_equal(last, ref_logits[-1][-1])
    h1 = eng.forward_hidden(eng.new_sequence(), ids)
    h2 = np.concatenate([eng.forward_hidden(s := eng.new_sequence(), ids[:10]), eng.forward_hidden(s, ids[10:])])
    assert h1.shape == (len(ids), eng.config.n_embd) and np.array_equal(h1, h2)


def _generate(model, name, prompt, n, base=None, **sampling):
    ctx = model.context(name) if base is None else base.fork(name)
    if prompt:
        ctx.append(prompt)
    ids = [p.token_id for p in ctx.generate(n, **sampling)]
    ctx.delete()
    return ids


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.9, top_k=40, seed=11)])
def test_eight_threads_generate_exactly_as_sequential(model, sampling):
    sched = model.engine.scheduler
    base = model.context("sched-base")
    base.append("The three most useful kitchen tools are")
    prompts = [f"Write line {i} of a poem about {w}:" for i, w in enumerate("sea sky hill rain wind fog sun moon".split())]
    jobs = [lambda i=i, p=p: _generate(model, f"s{i}", p, 24, **sampling) for i, p in enumerate(prompts)]
    jobs += [lambda i=i: _generate(model, f"f{i}", f" number {i}" if i % 2 else "", 24, base=base, **sampling)
             for i in range(8)]
    sequential = [job() for job in jobs]
    steps0 = sched.steps
    for lo in (0, 8):  # separate contexts, then forks of one
        out, errs = concurrently(jobs[lo:lo + 8])
        assert errs == [None] * 8
        assert out == sequential[lo:lo + 8]
    requests = sum(len(ids) for ids in sequential) + len(jobs)  # one forward per token plus the prompt
    assert sched.steps - steps0 < requests / 2, "concurrent requests did not share steps"
    base.delete()


def test_long_prompt_does_not_stall_decoders(model):
    sched = model.engine.scheduler
    long_prompt = [1] + [random.Random(3).randrange(1000, 20000) for _ in range(1500)]
    decoding = threading.Barrier(5)

    def decoder(i):
        ctx = model.context(f"d{i}")
        ctx.append(f"Count to ten in language {i}:")
        ids = []
        for piece in ctx.generate(48, temperature=0):
            ids.append(piece.token_id)
            if len(ids) == 2:
                decoding.wait(30)  # every stream is decoding before the long prompt comes
        ctx.delete()
        return ids

    def long_job():
        decoding.wait(30)
        return model.engine.forward(model.engine.new_sequence(), long_prompt)

    sched.history.clear()
    out, errs = concurrently([lambda i=i: decoder(i) for i in range(4)] + [long_job])
    assert errs == [None] * 5
    both = [(d, p) for d, p in sched.history if d and p]
    # The 1500-token prompt took several steps, and the decoders got a row in each.
    assert len(both) >= 4, list(sched.history)
    assert max(d + p for d, p in sched.history) <= sched.step_tokens


def test_error_reaches_only_its_caller(model):
    eng = model.engine
    V, n_ctx = eng.config.n_vocab, eng.config.n_ctx
    good = [eng.new_sequence() for _ in range(4)]
    bad, long_bad, too_long = eng.new_sequence(), eng.new_sequence(), eng.new_sequence()
    ref = eng.forward(eng.new_sequence(), [1, 2, 3], all_logits=True)
    jobs = [lambda s=s: eng.forward(s, [1, 2, 3], all_logits=True) for s in good]
    jobs.append(lambda: eng.forward(bad, [1, V + 5, 2]))
    jobs.append(lambda: eng.forward(long_bad, list(range(1, 600)) + [-1]))
    jobs.append(lambda: eng.forward(too_long, [1] * (n_ctx + 1)))
    out, errs = concurrently(jobs)
    for o, e in zip(out[:4], errs[:4]):
        assert e is None and np.array_equal(o, ref)
    assert isinstance(errs[4], IndexError) and "outside the vocabulary" in str(errs[4])
    assert isinstance(errs[5], IndexError)
    assert isinstance(errs[6], ValueError) and "context length exceeded" in str(errs[6])
    assert bad.n_tokens == long_bad.n_tokens == too_long.n_tokens == 0
    # The loop lives on.
    assert np.array_equal(eng.forward(bad, [1, 2, 3], all_logits=True), ref)


def test_close_stops_the_loop(smollm2_path):
    m = ce.load(smollm2_path, threads=2)
    eng = m.engine
    eng.forward(eng.new_sequence(), [1, 2])  # a lone caller runs its step itself
    assert eng.scheduler._thread is None
    for _ in range(20):  # concurrent callers start the loop thread
        concurrently([lambda: eng.forward(eng.new_sequence(), [1, 2, 3] * 20) for _ in range(4)])
        if eng.scheduler._thread is not None:
            break
    thread = eng.scheduler._thread
    assert thread.daemon and thread.is_alive()
    m.close()
    assert not thread.is_alive()
    with pytest.raises(ce.CtxError, match="the model is closed"):
        eng.forward(eng.new_sequence(), [1])


def test_pages_are_reserved_when_a_request_is_admitted(model):
    """schedule() calls a request's reserve once, with the pages its tokens may take,
    before its first chunk; a refusal fails the request before any KV is written."""
    from ctxengine.errors import ContextError

    eng = model.engine
    pt = eng.pool.page_tokens
    seq = eng.new_sequence()
    asked = []
    eng.forward(seq, list(range(1, 600)), reserve=asked.append)  # three chunks, one admission
    assert asked == [-(-599 // pt)]  # a new sequence: no shared page to copy

    def refuse(n):
        raise ContextError(f"no room for {n} pages")

    with pytest.raises(ContextError, match="no room"):
        eng.forward(seq, [1, 2, 3], reserve=refuse)
    assert seq.n_tokens == 599
    _, errs = concurrently([lambda: eng.forward(eng.new_sequence(), [1, 2], reserve=refuse),
                            lambda: eng.forward(eng.new_sequence(), [1, 2, 3])])
    assert isinstance(errs[0], ContextError) and errs[1] is None


def test_a_pool_holds_as_many_tokens_as_its_pages(smollm2_path, model):
    """Every page of a pool can be filled: a reservation counts one more page only to copy
    a partly filled last page that a fork shares (always one more left the last page
    unused: a context could never fill a pool of its own)."""
    from ctxengine.engine.engine import Engine
    from ctxengine.errors import ContextError

    small = ce.Model(Engine(smollm2_path, threads=1, kv_budget=16 * model.engine.pool.page_bytes))
    try:
        pool, pt = small.engine.pool, small.engine.pool.page_tokens
        whole = small.context("whole")
        whole.append(list(range(100, 100 + 16 * pt)))  # all 16 pages
        assert pool.n_used == 16 and whole.n_cached == 16 * pt
        whole.delete()
        ctx = small.context("a")
        ctx.append(list(range(100, 100 + 7 * pt + 3)))  # 8 pages, the last partly filled
        fork = ctx.fork("b")
        seq = fork._kv.seq
        asked = []
        small.engine.forward(seq, [5, 6], reserve=asked.append)  # the shared last page is copied first
        assert asked == [1] and pool.n_used == 9
        asked.clear()
        small.engine.forward(seq, [7], reserve=asked.append)  # now its own
        assert asked == [0]
        ctx.append(list(range(200, 200 + 8 * pt - 3)))  # its own last page, and 7 more: 16 in all
        assert pool.n_used == 16
        with pytest.raises(ContextError, match="pool"):
            ctx.append([1])
    finally:
        small.close()


def test_sequences_let_go_of_give_their_pages_back_without_another_step(model):
    """The scheduler's thread does not hold the last step's sequences while it
    waits for the next: a deleted context's pages go back to the pool at once,
    not when some later request comes."""
    eng = model.engine
    before = eng.pool.n_used
    seqs = [eng.new_sequence() for _ in range(3)]
    _, errs = concurrently([lambda s=s: eng.forward(s, list(range(100, 150))) for s in seqs])
    assert errs == [None] * 3 and eng.pool.n_used > before
    del seqs
    deadline = time.monotonic() + 5
    while eng.pool.n_used != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert eng.pool.n_used == before


def test_a_given_up_prompt_stops_between_steps_and_leaves_its_kv(model):
    """cancelled_when: a long prompt whose caller gives up stops at the next step,
    its sequence's KV back where it was; the same sequence then goes on as if
    the cancelled request had never been made."""
    eng, sched = model.engine, model.engine.scheduler
    rng = random.Random(8)
    prefix = [rng.randrange(eng.config.n_vocab) for _ in range(10)]
    prompt = [rng.randrange(eng.config.n_vocab) for _ in range(5 * sched.step_tokens)]
    seq = eng.new_sequence()
    eng.forward(seq, prefix)
    start_steps, start_rows = sched.steps, sched.rows
    with cancelled_when(lambda: sched.steps - start_steps >= 2):
        with pytest.raises(CancelledError, match="after 512 of its 1280 tokens"):
            eng.forward(seq, prompt)
    assert seq.n_tokens == len(prefix)
    assert sched.steps - start_steps == 2 and sched.rows - start_rows == 2 * sched.step_tokens
    went_on = eng.forward(seq, prompt)
    fresh = eng.new_sequence()
    assert np.array_equal(went_on, eng.forward(fresh, prefix + prompt))


def test_a_request_given_up_before_it_runs_runs_nothing(model):
    eng, sched = model.engine, model.engine.scheduler
    seq, steps = eng.new_sequence(), sched.steps
    with cancelled_when(lambda: True), pytest.raises(CancelledError, match="before it ran"):
        eng.forward(seq, [1, 2, 3])
    assert seq.n_tokens == 0 and sched.steps == steps


def test_giving_up_stops_only_its_own_request(model):
    """Two long prompts batched in the same steps: the one given up stops, the
    other runs to its end with exactly the logits it gets alone."""
    eng = model.engine
    rng = random.Random(9)
    prompts = [[rng.randrange(eng.config.n_vocab) for _ in range(3 * eng.scheduler.step_tokens)] for _ in range(2)]
    alone = eng.forward(eng.new_sequence(), prompts[1])
    seqs, rows = [eng.new_sequence(), eng.new_sequence()], eng.scheduler.rows

    def given_up():  # once a step has run
        with cancelled_when(lambda: eng.scheduler.rows > rows):
            return eng.forward(seqs[0], prompts[0])

    out, errs = concurrently([given_up, lambda: eng.forward(seqs[1], prompts[1])])
    assert isinstance(errs[0], CancelledError) and seqs[0].n_tokens == 0
    assert errs[1] is None and np.array_equal(out[1], alone)


def test_a_context_append_given_up_keeps_neither_tokens_nor_kv(model):
    """A context whose append was given up goes on exactly as one that never saw it."""
    long_text = " ".join(f"word{i}" for i in range(200))  # 690 tokens: more than a step takes
    ctx, ref = model.context(None), model.context(None)
    try:
        for c in (ctx, ref):
            c.append("The capital of France is")
        before = ctx.tokens
        with cancelled_when(lambda: True), pytest.raises(CancelledError):
            ctx.append(long_text)
        assert ctx.tokens == before and ctx.n_cached == len(before)
        for c in (ctx, ref):
            c.append(long_text)
        assert ctx.tokens == ref.tokens
        replies = ["".join(p.text for p in c.generate(8, temperature=0.0)) for c in (ctx, ref)]
        assert replies[0] == replies[1]
    finally:
        ctx.delete()
        ref.delete()
