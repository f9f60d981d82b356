"""The download writer: every byte hashed and written in order, hashing never waits on a
slow disk, and a write error surfaces without hanging the reader (issue 16)."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from bootfsm.host.partfile import _BUFFERS, CHUNK, PartWriter

WAIT_S = 10.0  # how long a test waits for a thread before calling it stuck (never a speed bound)


def _fill(w: PartWriter, pieces: list[bytes]) -> None:
    for piece in pieces:
        buf = w.buffer()
        buf[: len(piece)] = piece
        w.put(buf, len(piece))


def test_every_byte_is_hashed_and_written_in_order(tmp_path: Path) -> None:
    pieces = [os.urandom(n) for n in (CHUNK, 1, CHUNK - 7, 0, 12345)] * 9  # > _BUFFERS chunks
    digest = hashlib.sha256()
    with (tmp_path / "f.part").open("wb") as fh:
        w = PartWriter(fh, digest)
        _fill(w, pieces)
        w.put(b"tail as bytes", 13)
        w.close()
    want = b"".join(pieces) + b"tail as bytes"
    assert (tmp_path / "f.part").read_bytes() == want
    assert digest.hexdigest() == hashlib.sha256(want).hexdigest()


class _Disk:
    """A file whose first write blocks until released; records the order of events."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.blocked = threading.Event()
        self.data = bytearray()
        self.log: list[str] = []

    def write(self, view: Any) -> int:
        if not self.data and not self.release.is_set():
            self.blocked.set()
            assert self.release.wait(WAIT_S)
        self.data += view
        self.log.append(f"write {len(view)}")
        return len(view)


class _Digest:
    def __init__(self) -> None:
        self.inner = hashlib.sha256()
        self.hashed = 0
        self.second = threading.Event()

    def update(self, view: Any) -> None:
        self.inner.update(view)
        self.hashed += 1
        if self.hashed == 2:
            self.second.set()


def test_hashing_goes_on_while_the_disk_is_slow() -> None:
    """Chunk 2 is hashed while chunk 1 is still being written: the hash and the write
    are separate stages, so the slower of the two sets the pace, not their sum."""
    disk, digest = _Disk(), _Digest()
    w = PartWriter(disk, digest)  # type: ignore[arg-type]
    _fill(w, [b"a" * 100, b"b" * 200])
    assert disk.blocked.wait(WAIT_S)
    assert digest.second.wait(WAIT_S), "the second chunk waited for the first one's write"
    assert disk.data == b""  # the first write is still blocked
    disk.release.set()
    w.close()
    assert bytes(disk.data) == b"a" * 100 + b"b" * 200
    assert digest.inner.hexdigest() == hashlib.sha256(disk.data).hexdigest()


class _FullDisk:
    def __init__(self, room: int) -> None:
        self.room = room

    def write(self, view: Any) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= 1
        return len(view)


def test_a_write_error_reaches_the_reader_and_nothing_hangs() -> None:
    w = PartWriter(_FullDisk(room=2), hashlib.sha256())  # type: ignore[arg-type]
    raised: list[OSError] = []

    def reader() -> None:  # far more chunks than buffers: it would block if nothing drained
        try:
            _fill(w, [b"x" * 10] * (_BUFFERS * 4))
        except OSError as exc:
            raised.append(exc)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(WAIT_S)
    assert not t.is_alive(), "the reader blocked after the write error"
    with pytest.raises(OSError) as exc:
        w.close()
    assert exc.value.errno == errno.ENOSPC
    assert all(e.errno == errno.ENOSPC for e in raised)
