"""The sidecar of a segmented ``.part``: the plan (``segment_plan``), per-segment progress
(``write_segments``/``resume_segments``, with validators) and the hashing ``Frontier``."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bootfsm.host.partfile import CHUNK, entity, meta_path, read_meta, write_error, write_new

_PIECE_MIN, _PIECE_MAX = 1 << 20, 32 << 20  # one ranged request each

__all__ = ["Frontier", "bytes_on_disk", "resume_segments", "segment_plan", "write_segments"]


def segment_plan(size: int, count: int) -> list[list[int]]:
    """``[start, end, done]`` pieces (end exclusive) covering ``size`` in order, for
    ``count`` connections: about eight pieces per connection, 1-32 MiB each, so the
    pieces complete roughly in file order and the hasher follows right behind them."""
    piece = min(max(size // (max(1, count) * 8), _PIECE_MIN), _PIECE_MAX)
    piece = -(-piece // CHUNK) * CHUNK
    return [[s, min(s + piece, size), 0] for s in range(0, size, piece)]


def write_segments(
    part: Path, headers: Mapping[str, str], size: int, url: str, segments: list[list[int]]
) -> None:
    """Record the entity and each segment's progress in ``part``'s sidecar, atomically
    (tmp, rename); a failure is ``write_error``'s."""
    path = meta_path(part)
    tmp = path.with_name(path.name + ".tmp")
    data = {**entity(headers, size, url), "segments": segments}
    try:
        write_new(tmp, json.dumps(data))  # never through a planted link
        os.replace(tmp, path)
    except OSError as exc:
        raise write_error(part, exc) from exc


def resume_segments(meta: Mapping[str, Any], size: int) -> list[list[int]] | None:
    """The segments a sidecar records for a file of ``size`` B, or None (start over)."""
    segs = meta.get("segments")
    if meta.get("size") != size or not isinstance(segs, list) or not segs:
        return None
    out, at = [], 0
    for seg in segs:
        if (
            not isinstance(seg, list)
            or len(seg) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in seg)
        ):
            return None
        start, end, done = seg
        if start != at or end <= start or not 0 <= done <= end - start:
            return None
        out.append([start, end, done])
        at = end
    return out if at == size else None


def bytes_on_disk(part: Path) -> int:
    """Bytes of a ``.part`` that hold downloaded data (a preallocated segmented file
    counts only what its sidecar records)."""
    try:
        size = part.stat().st_size
    except OSError:
        return 0
    meta = read_meta(meta_path(part))
    segs = resume_segments(meta, size) if "segments" in meta else None
    return sum(s[2] for s in segs) if segs is not None else size


class Frontier:
    """Per-segment progress of one file, and a thread hashing its contiguous prefix from disk
    (``advance(i, n)`` after each write), so the sha256 covers the file as it is on disk."""

    def __init__(self, fd: int, segments: list[list[int]], size: int) -> None:
        self.fd = fd
        self.segments = segments
        self.size = size
        self.digest = hashlib.sha256()
        self.hashed = 0
        self.error: OSError | None = None
        self._open = 0  # the first segment not yet complete (segments only grow)
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._hash, name="bootfsm-hasher", daemon=True)
        self._thread.start()

    def done(self) -> int:
        """Bytes downloaded so far, all segments together."""
        return sum(s[2] for s in self.segments)

    def snapshot(self) -> list[list[int]]:
        """A copy of the segments for the sidecar."""
        with self._cond:
            return [list(s) for s in self.segments]

    def advance(self, i: int, n: int) -> None:
        with self._cond:
            self.segments[i][2] += n
            if i == self._open:  # only the segment at the hashed edge moves it
                self._cond.notify()

    def _edge(self) -> int:
        while self._open < len(self.segments):
            start, end, done = self.segments[self._open]
            if start + done < end:
                return start + done
            self._open += 1
        return self.size

    def _hash(self) -> None:
        buf = bytearray(1 << 20)
        while True:
            with self._cond:
                while not self._stop and self._edge() <= self.hashed:
                    self._cond.wait()
                if self._stop:
                    return
                edge = self._edge()
            while self.hashed < edge:
                want = min(len(buf), edge - self.hashed)
                try:
                    n = os.preadv(self.fd, [memoryview(buf)[:want]], self.hashed)
                except OSError as exc:
                    self.error = exc
                    return
                if n <= 0:
                    self.error = OSError(errno.EIO, "short read hashing the part file")
                    return
                self.digest.update(memoryview(buf)[:n])
                self.hashed += n
            if self.hashed >= self.size:
                return

    def finish(self) -> str:
        """Wait until the whole file is hashed (every segment complete); its sha256."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        if self.hashed != self.size:
            raise OSError(errno.EIO, f"hashed {self.hashed} of {self.size} B")
        return self.digest.hexdigest()

    def stop(self) -> None:
        """Stop the hasher without a result (a segment failed or was cancelled)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join()
