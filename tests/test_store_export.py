"""Portable snapshot files: round trip, and every kind of damage refused with nothing stored."""
import io
import os
import random
import stat
import struct
import subprocess
import sys

import pytest

from ctxengine.errors import CorruptDataError, InvalidNameError, StoreError
from ctxengine.store import Manifest, Store, page_key
from ctxengine.store import exportfile

PAGE = 368 * 1024


def make_snapshot(store: Store, rng: random.Random, n_big=3, ref="main") -> tuple[str, list[bytes]]:
    # Big incompressible pages, a compressible one, a repeated one (stored once in the file).
    raws = [rng.randbytes(PAGE) for _ in range(n_big)] + [bytes(PAGE // 2) + b"\1" * (PAGE // 2)]
    keys = [page_key(r) for r in raws] + [page_key(raws[0])]
    n = len(keys) * 16 - 5
    m = Manifest(weight_id="ab" * 32, model_name="smollm2", arch={"n_layer": 30}, kv_dtype="f16",
                 page_tokens=16, token_ids=list(range(n + 1)), page_keys=keys, page_size=PAGE,
                 n_tokens=n, sampler_state={"seed": 1}, labels={"note": "exported"})
    return store.snapshot(m, raws, ref=ref), raws


def contents(store: Store):
    return store.snapshots(), store.page_keys(), store.refs()


@pytest.fixture
def exported(tmp_path):
    rng = random.Random(7)
    with Store(tmp_path / "src") as src:
        sid, raws = make_snapshot(src, rng)
        buf = io.BytesIO()
        src.export("main", buf)
    return sid, raws, buf.getvalue()


def test_round_trip_into_second_store(tmp_path):
    rng = random.Random(1)
    with Store(tmp_path / "a") as a, Store(tmp_path / "b") as b:
        sid, raws = make_snapshot(a, rng)
        calls = []
        a.export(sid[:10], tmp_path / "snap.ctx", progress=lambda d, t: calls.append((d, t)))
        assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
        assert not (tmp_path / "snap.ctx.partial").exists()
        got = b.import_file(tmp_path / "snap.ctx", ref="imported/main")
        assert got == sid and b.resolve("imported/main") == sid
        assert b.get_manifest(sid) == a.get_manifest(sid)
        assert b.get_pages(b.get_manifest(sid).page_keys) == raws + raws[:1]
        # Importing again (into a store that has everything) is a no-op that still moves refs.
        assert b.import_file(tmp_path / "snap.ctx", ref="again") == sid
        assert sorted(b.refs()) == ["again", "imported/main"]
        assert len(b.page_keys()) == 4


def test_import_from_unseekable_stream(exported, tmp_path):
    sid, raws, data = exported

    class Pipe(io.RawIOBase):  # a socket-like stream: no seek, short reads
        def __init__(self, data):
            self.data, self.pos = data, 0

        def readable(self):
            return True

        def readinto(self, b):
            n = min(len(b), 100_000, len(self.data) - self.pos)
            b[:n] = self.data[self.pos:self.pos + n]
            self.pos += n
            return n

    with Store(tmp_path / "dst") as dst:
        assert dst.import_file(Pipe(data)) == sid
        assert dst.get_page(page_key(raws[1])) == raws[1]


def _cut_points(data: bytes) -> dict[str, list[int]]:
    """Offsets at which to truncate, by the section the cut falls in."""
    (mlen,) = struct.unpack_from("<I", data, 12)
    pages_at = 16 + mlen
    first_rec = pages_at + 4 + 36
    trailer = len(data) - 40
    return {
        "header": [0, 1, 7, 11],
        "manifest": [12, 14, 16, 16 + mlen // 2, pages_at - 1],
        "page": [pages_at, pages_at + 2, pages_at + 4, pages_at + 20, first_rec,
                 first_rec + 10, first_rec + PAGE // 2, trailer - 1],
        "trailer": [trailer, trailer + 4, trailer + 8, len(data) - 1],
    }


@pytest.mark.parametrize("section", ["header", "manifest", "page", "trailer"])
def test_truncated_file_refused_and_nothing_stored(exported, tmp_path, section):
    sid, _, data = exported
    with Store(tmp_path / "dst") as dst:
        before = contents(dst)
        for cut in _cut_points(data)[section]:
            with pytest.raises(CorruptDataError):
                dst.import_file(io.BytesIO(data[:cut]), ref="main")
            assert contents(dst) == before, f"cut at {cut} left something behind"


def test_flipped_byte_anywhere_refused(exported, tmp_path):
    sid, _, data = exported
    rng = random.Random(3)
    (mlen,) = struct.unpack_from("<I", data, 12)
    # Every byte of the header and manifest, and a sample of the rest, one at a time.
    spots = list(range(16 + mlen)) + rng.sample(range(16 + mlen, len(data)), 150) + \
        list(range(len(data) - 40, len(data)))
    with Store(tmp_path / "dst") as dst:
        # Store one of the pages first: a damaged file must not add the others.
        dst.put_page(page_key(exported[1][0]), exported[1][0])
        before = contents(dst)
        for at in spots:
            bad = bytearray(data)
            bad[at] ^= 0x01
            with pytest.raises(CorruptDataError):
                dst.import_file(io.BytesIO(bytes(bad)), ref="main")
        assert contents(dst) == before
        with pytest.raises(CorruptDataError, match="after its trailer"):
            dst.import_file(io.BytesIO(data + b"\0"))
        with pytest.raises(CorruptDataError, match="not a ctx snapshot"):
            dst.import_file(io.BytesIO(b"PK\3\4" + data[4:]))
        assert contents(dst) == before
        assert dst.import_file(io.BytesIO(data)) == sid  # the intact file still imports


def test_consistent_but_forged_file_refused(exported, tmp_path):
    """A forger who recomputes the checksum still cannot pass off a wrong page."""
    sid, raws, data = exported
    (mlen,) = struct.unpack_from("<I", data, 12)
    rec_at = 16 + mlen + 4 + 36
    body = bytearray(data[:-40])
    body[rec_at + 100] ^= 0xFF
    import blake3
    forged = bytes(body) + exportfile.TRAILER_MAGIC + blake3.blake3(bytes(body)).digest()
    with Store(tmp_path / "dst") as dst:
        with pytest.raises(CorruptDataError, match=page_key(raws[0])):
            dst.import_file(io.BytesIO(forged))
        assert contents(dst) == ([], [], {})


def test_export_errors(tmp_path):
    with Store(tmp_path / "s") as s:
        with pytest.raises(StoreError):
            s.export("nope", tmp_path / "x.ctx")
        assert not list(tmp_path.glob("x.ctx*"))
        with pytest.raises(InvalidNameError):
            s.import_file(io.BytesIO(b""), ref="../evil")
        with pytest.raises(StoreError, match="cannot read"):
            s.import_file(tmp_path / "missing.ctx")


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory", "partial symlink"])
def test_export_refuses_to_replace_what_is_not_a_regular_file(tmp_path, kind):
    """A FIFO, device, directory or link at the name stays as it was (as root, /dev/null would have
    become a file); a link is refused even to a regular file, which keeps its bytes."""
    target = tmp_path / "keep.txt"
    target.write_text("keep")
    out = tmp_path / "out.ctx"
    if kind == "fifo":
        os.mkfifo(out)
    elif kind == "symlink":
        out.symlink_to(target)
    elif kind == "directory":
        out.mkdir()
    else:
        (tmp_path / "out.ctx.partial").symlink_to(target)
    with Store(tmp_path / "s") as s:
        make_snapshot(s, random.Random(5), n_big=1)
        with pytest.raises(StoreError, match="not a regular file"):
            s.export("main", out)
    assert target.read_text() == "keep"
    if kind == "fifo":
        assert stat.S_ISFIFO(out.lstat().st_mode)
    elif kind == "symlink":
        assert out.is_symlink()
    elif kind == "directory":
        assert out.is_dir()
    assert (tmp_path / "out.ctx.partial").is_symlink() == (kind == "partial symlink")


@pytest.mark.parametrize("name", ["", "/"])
def test_ctx_export_to_no_file_name_is_one_line(tmp_path, name):
    with Store(tmp_path / "s") as s:
        make_snapshot(s, random.Random(6), n_big=1)
    r = subprocess.run([sys.executable, "-m", "ctxengine.cli.main", "export", "main", name, "--store",
                        str(tmp_path / "s")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and not r.stdout
    assert r.stderr == f"ctx export: error: cannot write {name!r}: it names no file\n", r.stderr
