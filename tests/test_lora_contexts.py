"""A context's adapters are part of its identity: it keeps them for life,
its forks keep them, snapshots record them and restore refuses others."""
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import ctxengine as ce
from ctxengine.errors import ContextError, CtxError, RequestError, WeightMismatchError
from ctxengine.serving.lora import LoraSpec
from ctxengine.store import Store
from lora_files import ALL, ATTN, random_lora, write_lora
from test_lora import CFG, shapes
from tiny_models import make_weights, write_gguf

PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66, 67, 1, 2, 3, 200] * 2


@pytest.fixture
def model(tmp_path):
    write_gguf(tmp_path / "tiny.gguf", CFG, make_weights(CFG))
    paths = {}
    for name, seed, targets in (("one", 1, ALL), ("two", 2, ATTN)):
        paths[name] = tmp_path / f"{name}.gguf"
        write_lora(paths[name], CFG.arch, random_lora(shapes(CFG), CFG.n_layer, 4, targets, seed=seed, size=0.3))
    m = ce.load(tmp_path / "tiny.gguf", threads=2, lora=paths)
    yield m
    m.close()


def test_context_keeps_its_adapters(model):
    base = model.context("base")
    tuned = model.context("tuned", lora={"one": 1.0})
    base.append(PROMPT)
    tuned.append(PROMPT)
    assert not np.array_equal(base._sync(), tuned._sync())
    assert model.context("tuned") is tuned and model.context("tuned", lora={"one": 1.0}) is tuned
    with pytest.raises(ContextError, match="context 'tuned' runs with one .* x 1.0; its adapters cannot change "
                                           "to no adapters"):
        model.context("tuned", lora={})
    with pytest.raises(ContextError, match="cannot change to one .* x 0.5"):
        model.context("tuned", lora={"one": 0.5})
    branch = tuned.fork("branch")
    assert branch.lora == tuned.lora
    branch.append([5, 6, 7])
    fresh = model.context("fresh", lora={"one": 1.0})
    fresh.append(PROMPT + [5, 6, 7])
    assert np.array_equal(branch._sync(), fresh._sync())
    with pytest.raises(RequestError, match="unknown LoRA adapter 'nope'"):
        model.context("x", lora={"nope": 1.0})
    assert "x" not in model.contexts


def test_snapshot_restore_with_adapters(model, tmp_path):
    c = model.context("c", lora={"one": 0.5, "two": 1.5})
    c.append(PROMPT)
    logits = c._sync().copy()
    with Store(tmp_path / "store") as store:
        sid = c.snapshot(store, ref="tuned")
        assert store.get_manifest(sid).arch["lora"] == c.lora.identity
        with pytest.raises(WeightMismatchError, match=r"made with LoRA [0-9a-f]{12} x [01].5, [0-9a-f]{12} x "
                                                      r"[01].5, but the restore asks for no adapters"):
            model.restore(store, "tuned", name="r0", lora={})
        with pytest.raises(WeightMismatchError, match=r"but the restore asks for one \([0-9a-f]{12}\) x 0.5;"):
            model.restore(store, "tuned", name="r1", lora={"one": 0.5})
        assert "r0" not in model.contexts and "r1" not in model.contexts
        r = model.restore(store, "tuned", name="r", lora={"two": 1.5, "one": 0.5})
        assert r.lora == c.lora
        assert np.array_equal(r._sync(), logits)
        c.append([9, 10, 11])
        r.append([9, 10, 11])
        assert np.array_equal(c._sync(), r._sync())
        # Without lora=, a restore takes the adapters the snapshot records, if they are loaded.
        same = model.restore(store, "tuned", name="same")
        assert same.lora == c.lora and np.array_equal(same._sync(), logits)
        bare = ce.load(model.path, threads=1, lora={"one": model.adapters["one"].path})
        try:
            with pytest.raises(WeightMismatchError, match=r"made with LoRA .*, but the model has not loaded them "
                                                          r"\(loaded adapters: one \([0-9a-f]{12}\)\)"):
                bare.restore(store, "tuned")
        finally:
            bare.close()
        base = model.context("base")
        base.append(PROMPT)
        sid_base = base.snapshot(store)
        assert "lora" not in store.get_manifest(sid_base).arch
        assert not model.restore(store, sid_base).lora
        with pytest.raises(WeightMismatchError, match="made with LoRA no adapters, but the restore asks for one"):
            model.restore(store, sid_base, lora={"one": 0.5})


def test_concurrent_sequences_with_other_adapters_share_steps(model):
    """Through the scheduler: streams with other adapters (or none) decode in the
    same steps, and each stream's logits equal its run alone."""
    sets = [None, {"one": 1.0}, {"one": 0.5, "two": 1.0}, {"two": 2.0}]

    def run(i, lora):
        c = model.context(f"s{i}", lora=lora)
        c.append(PROMPT[: 8 + i])
        out = []
        for t in range(12):
            out.append(c._sync().copy())
            c.append([int(out[-1].argmax())])
        c.delete()
        return out

    alone = [run(i, s) for i, s in enumerate(sets)]
    steps = model.engine.scheduler.steps
    with ThreadPoolExecutor(len(sets)) as pool:
        together = list(pool.map(lambda a: run(*a), enumerate(sets)))
    shared = sum(1 for d, p in list(model.engine.scheduler.history)[-(model.engine.scheduler.steps - steps):]
                 if d + p > 1)
    assert shared > 0  # some steps held rows of several streams
    for a, b in zip(alone, together):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_ctx_run_with_lora(tmp_path, model):
    c = model.context("ref", lora={"one": 1.0})
    c.append("Hi")
    want = "".join(p.text for p in c.generate(6, temperature=0.0))
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "run", "-m", str(model.path), "--raw", "-n", "6",
                        "--temperature", "0", "--lora", f"one={model.adapters['one'].path}:1", "Hi"],
                       capture_output=True, text=True, env={**os.environ, "CTX_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == want
    bad = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "run", "-m", str(model.path), "--raw",
                          "--lora", f"x={tmp_path / 'nothing.gguf'}", "Hi"],
                         capture_output=True, text=True, env={**os.environ, "CTX_HOME": str(tmp_path)})
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


@pytest.mark.parametrize("text,want", [
    ("tuned=a/b.gguf", ("tuned", "a/b.gguf", 1.0)),
    ("tuned=a/b.gguf:0.5", ("tuned", "a/b.gguf", 0.5)),
    ("t=C:/x/b.gguf", ("t", "C:/x/b.gguf", 1.0)),   # a colon that is not a scale stays in the path
    ("dir/b.gguf", ("b", "dir/b.gguf", 1.0)),        # llama-server's bare path, named after its file
])
def test_lora_spec_parse(text, want):
    spec = LoraSpec.parse(text)
    assert (spec.name, str(spec.path), spec.scale) == want


@pytest.mark.parametrize("text", ["=x.gguf", "a=", "a=x.gguf:nan"])
def test_lora_spec_refused(text):
    with pytest.raises(CtxError, match="--lora"):
        LoraSpec.parse(text)
