"""``Model.close()`` while streams run on other threads (found by a probe, 2026-12-07):
it freed the weights under a lone stream's step running on its own thread (a segfault),
hung when a step run that way ended without waking the closing scheduler, and a stream
whose context it deleted mid-step raised an internal InvalidTransition. Now it waits for
the steps in flight, and every stream ends in a ContextError. Each case runs in a child
process, so that a crash fails the test instead of ending the suite."""
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent('''
    import sys, threading, time
    import ctxengine as ce
    m = ce.load(sys.argv[1], threads=1)
    never_ends = {t: -100.0 for t in m.engine.tokenizer.eog_ids}
    streams, errors = int(sys.argv[2]), []
    def stream(ctx):
        try:
            for _ in ctx.generate(400, temperature=0.0, logit_bias=never_ends):
                pass
            errors.append("it ran to its end")
        except ce.CtxError as err:
            errors.append("ContextError")
        except BaseException as err:
            errors.append(f"{type(err).__name__}: {err}")
    if sys.argv[4] == "loop":  # two streams at once first: the scheduler's loop thread runs, then waits
        for _ in range(20):
            pair = [m.context(f"warm{i}") for i in range(2)]
            for c in pair:
                c.append("Once upon a time")
            pair = [threading.Thread(target=lambda c=c: list(c.generate(8, temperature=0.0))) for c in pair]
            for t in pair:
                t.start()
            for t in pair:
                t.join()
            if m.engine.scheduler._thread is not None:
                break
        assert m.engine.scheduler._thread is not None
    contexts = [m.context(f"stream{i}") for i in range(streams)]
    for c in contexts:
        c.append("Write a long story about a dragon who lives under a bridge and")
    threads = [threading.Thread(target=stream, args=(c,)) for c in contexts]
    for t in threads:
        t.start()
    time.sleep(float(sys.argv[3]))
    m.close()
    for t in threads:
        t.join(60)
    print(errors)
''')


@pytest.mark.parametrize("streams, after, loop", [(1, 1.0, ""), (1, 0.5, "loop"), (3, 1.0, "loop")])
def test_closing_a_model_under_running_streams(smollm2_path, streams, after, loop):
    run = subprocess.run([sys.executable, "-c", CHILD, str(smollm2_path), str(streams), str(after), loop or "-"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == str(["ContextError"] * streams), run.stdout + run.stderr[-2000:]
