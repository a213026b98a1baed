"""engine/hashed_writer.py: what the receiving thread hands over is written in
order and hashed on the writer thread; a full disk stops it and is raised to
the receiver; an exception on the way out keeps what was received; an earlier
pull's partial file is hashed, or dropped when it cannot be right."""
import errno
import hashlib
import os

import pytest

from ctxengine.engine.hashed_writer import LIMIT, HashedWriter, hash_partial


def test_buffers_are_written_in_order_hashed_counted_and_released(tmp_path):
    pieces = [os.urandom(n) for n in (1, 5000, 1 << 20, 3, 70_000)] * 4
    counted, released = [], []
    with open(tmp_path / "f", "wb") as out, HashedWriter(out, hashlib.sha256(), counted.append) as writer:
        for i, piece in enumerate(pieces):
            writer.write(memoryview(piece), release=lambda i=i: released.append(i))
        writer.wait()
        digest = writer.sha256.hexdigest()
    whole = b"".join(pieces)
    assert (tmp_path / "f").read_bytes() == whole and digest == hashlib.sha256(whole).hexdigest()
    assert sum(counted) == len(whole) and released == list(range(len(pieces)))


def test_a_full_disk_is_raised_to_the_receiver_and_buffers_still_come_back():
    released = []
    with open("/dev/full", "wb", buffering=0) as out:  # every write fails with ENOSPC, as a full disk's
        writer = HashedWriter(out, hashlib.sha256())
        writer.write(b"x" * 4096, release=lambda: released.append(0))
        with pytest.raises(OSError) as failed:
            writer.wait()
        assert failed.value.errno == errno.ENOSPC
        with pytest.raises(OSError):
            writer.write(b"y")
        with pytest.raises(OSError):
            writer.close()
    assert released == [0]


def test_progress_that_refuses_to_go_on_stops_the_writer_and_reaches_the_receiver(tmp_path):
    # A server's pull whose client left: its progress raises on the writer thread; the
    # receiver gets that exception, the buffers written so far stay, none after them.
    class Left(Exception):
        pass

    def progress(n):
        if sum(seen) >= 3 << 20:
            raise Left()
        seen.append(n)

    seen, released = [], []
    with pytest.raises(Left):
        with open(tmp_path / "f", "wb") as out, HashedWriter(out, hashlib.sha256(), progress) as writer:
            for i in range(16):
                writer.write(os.urandom(1 << 20), release=lambda i=i: released.append(i))
    assert (tmp_path / "f").stat().st_size == 4 << 20 and sorted(released) == list(range(len(released)))


def test_leaving_by_an_exception_keeps_what_was_received(tmp_path):
    with pytest.raises(ConnectionResetError):
        with open(tmp_path / "f", "wb") as out, HashedWriter(out, hashlib.sha256()) as writer:
            for _ in range(3 * LIMIT // (1 << 20)):
                writer.write(b"a" * (1 << 20))
            raise ConnectionResetError("the server went away")
    assert (tmp_path / "f").read_bytes() == b"a" * 3 * LIMIT


def test_rewind_starts_file_and_hash_over(tmp_path):
    with open(tmp_path / "f", "wb") as out, HashedWriter(out, hashlib.sha256()) as writer:
        writer.write(b"bytes a server sent before ignoring a range")
        writer.rewind()
        writer.write(b"the whole file")
        writer.wait()
        digest = writer.sha256.hexdigest()
    assert (tmp_path / "f").read_bytes() == b"the whole file"
    assert digest == hashlib.sha256(b"the whole file").hexdigest()


def test_hash_partial_of_what_an_earlier_pull_left(tmp_path):
    partial = tmp_path / "blob-partial"
    h, have = hash_partial(partial, 10)
    assert have == 0 and h.hexdigest() == hashlib.sha256().hexdigest()
    partial.write_bytes(b"012345")
    h, have = hash_partial(partial, 10)
    assert have == 6 and h.hexdigest() == hashlib.sha256(b"012345").hexdigest()
    h, have = hash_partial(partial, 4)  # longer than the file it is part of: not part of it
    assert have == 0 and partial.stat().st_size == 0  # emptied in place: a lock on it still holds
