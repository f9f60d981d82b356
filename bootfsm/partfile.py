"""A download in progress: the ``.part`` file, its sidecar metadata, the hashing writer.

``<name>.part.meta`` (JSON) records what the bytes on disk are: the validators the
server sent (ETag, Last-Modified), the total size and which URL they came from (an id,
never the URL: it may carry a signature). ``PartWriter`` hashes and writes chunks on a
helper thread while the caller reads the socket, in recycled buffers (no allocation per
chunk). This module knows nothing of HTTP libraries; ``bootfsm.http`` drives it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import queue
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bootfsm.codes import Code
from bootfsm.errors import BootError, TransientError
from bootfsm.redact import redact_url

__all__ = [
    "CHUNK",
    "Frontier",
    "PartWriter",
    "StreamResult",
    "accept",
    "bytes_on_disk",
    "check_space",
    "content_range",
    "discard",
    "if_range",
    "meta_path",
    "partial_source",
    "read_meta",
    "resume_segments",
    "same_entity",
    "segment_plan",
    "url_id",
    "whole_or_discard",
    "write_error",
    "write_meta",
    "write_segments",
]

CHUNK = 256 << 10  # fits the CPU cache while it is hashed and written; 1 MiB was slower
_PIECE_MIN, _PIECE_MAX = 1 << 20, 32 << 20  # one ranged request each (segmented downloads)
_BUFFERS = 16  # read-ahead between the socket and the writer (4 MiB)


@dataclass(frozen=True)
class StreamResult:
    """A finished download: size, sha256 of the whole file, bytes resumed from disk."""

    size: int
    sha256: str
    resumed_bytes: int
    transferred: int


def url_id(url: str) -> str:
    """A short stable id of a URL without its query (which mirror a partial file is from)."""
    return hashlib.sha256(url.split("?", 1)[0].encode()).hexdigest()[:16]


def meta_path(part: Path) -> Path:
    """The sidecar of a ``.part`` file."""
    return part.with_name(part.name + ".meta")


def discard(part: Path) -> None:
    """Remove a partial file and its sidecar."""
    part.unlink(missing_ok=True)
    meta_path(part).unlink(missing_ok=True)


def read_meta(path: Path) -> dict[str, Any]:
    """The sidecar's data; ``{}`` when missing or unreadable (nothing can be resumed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            data = json.loads(fh.read(1 << 20))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    old = data.get("validator")  # written by earlier versions: ETag or Last-Modified
    if isinstance(old, str) and old and not data.get("etag") and not data.get("last_modified"):
        data["etag" if old.startswith(('"', "W/")) else "last_modified"] = old
    return data


def write_meta(path: Path, headers: Mapping[str, str], total: int | None, url: str) -> None:
    """Record the entity the bytes about to be written belong to (before writing them)."""
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    data = {
        "validator": etag or modified,
        "etag": etag,
        "last_modified": modified,
        "size": total,
        "source": url_id(url),
    }
    _write_new(path, json.dumps(data))


def _write_new(path: Path, text: str) -> None:
    """Write ``path`` as a new 0600 file: whatever was there (a planted symlink too) is
    removed first and the file is created O_EXCL | O_NOFOLLOW, never written through."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def partial_source(part: Path) -> str | None:
    """The ``url_id`` of the URL a ``.part`` file was being downloaded from, if any."""
    source = read_meta(meta_path(part)).get("source") if part.exists() else None
    return source if isinstance(source, str) else None


def if_range(meta: Mapping[str, Any]) -> str | None:
    """A strong ETag, else Last-Modified; a weak ETag cannot validate a range."""
    etag, modified = meta.get("etag"), meta.get("last_modified")
    if isinstance(etag, str) and etag.startswith('"'):
        return etag
    return modified if isinstance(modified, str) and modified else None


def same_entity(meta: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
    """A 206 continues the bytes on disk only if a validator confirms it."""
    for key, header in (("etag", "ETag"), ("last_modified", "Last-Modified")):
        mine, theirs = meta.get(key), headers.get(header)
        if mine and theirs:
            return bool(mine == theirs)
    return False


def accept(
    status: int,
    headers: Mapping[str, str],
    part: Path,
    have: int,
    meta: Mapping[str, Any],
    url: str,
) -> tuple[int, int | None]:
    """(bytes resumed from disk, total size or None) for a 200/206; never splices."""
    length = _int(headers.get("Content-Length"))
    if status != 206:
        return 0, length
    start, total = content_range(headers.get("Content-Range", ""))
    why = ""
    if start != have:
        why = f"Content-Range starts at {start}, the file has {have} B"
    elif not same_entity(meta, headers):
        why = "the validator changed"
    elif meta.get("size") not in (None, total):
        why = f"the size changed ({meta.get('size')} -> {total} B)"
    if why:
        discard(part)
        raise TransientError(
            Code.DOWNLOAD_RETRIES_EXHAUSTED,
            f"cannot resume {redact_url(url)}: {why}; partial file discarded",
        )
    return have, total


def whole_or_discard(
    part: Path, have: int, meta: Mapping[str, Any], headers: Mapping[str, str], url: str
) -> StreamResult:
    """416 to ``bytes=have-``: the file is whole when the total equals what is on disk."""
    _, total = content_range(headers.get("Content-Range", ""))
    if have and total == have and meta.get("size") in (None, total):
        digest = hashlib.sha256()
        with part.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
        return StreamResult(have, digest.hexdigest(), have, 0)
    discard(part)
    raise TransientError(
        Code.DOWNLOAD_RETRIES_EXHAUSTED,
        f"HTTP 416 resuming {redact_url(url)}: partial file discarded",
    )


def check_space(part: Path, need: int, *, freed: int) -> None:
    """INSUFFICIENT_SPACE unless ``need`` bytes fit (``freed``: bytes about to be dropped)."""
    st = os.statvfs(part.parent)
    free = st.f_bavail * st.f_frsize + freed
    if need > free:
        raise BootError(
            Code.INSUFFICIENT_SPACE,
            f"{part.name} needs {need} B; {part.parent} has {free} B free",
        )


def write_error(part: Path, exc: OSError) -> BootError:
    """The error for a failed write; a full disk also drops the partial file."""
    if exc.errno == errno.ENOSPC:
        discard(part)
        return BootError(Code.INSUFFICIENT_SPACE, f"disk full writing {part.name}")
    return BootError(Code.HOST_IO_ERROR, f"cannot write {part.name}: {exc.strerror or exc}")


class PartWriter:
    """Hashes and writes chunks on a helper thread; the caller fills the buffers.

    ``buffer()`` hands out a free buffer (blocking while all are in flight),
    ``put(buf, n)`` queues its first ``n`` bytes, ``give_back(buf)`` returns an unused
    one; ``put`` also takes plain ``bytes``. After a write error the thread keeps
    draining (so the caller never blocks forever) and the error is raised by the next
    ``put`` or by ``close``.
    """

    def __init__(self, fh: IO[bytes], digest: Any) -> None:
        self.fh = fh
        self.digest = digest
        self.error: OSError | None = None
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(_BUFFERS):
            self._free.put(bytearray(CHUNK))
        self._q: queue.SimpleQueue[tuple[bytes | bytearray, int] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._drain, name="bootfsm-writer", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while (item := self._q.get()) is not None:
            buf, n = item
            if self.error is None:
                with memoryview(buf)[:n] as view:
                    try:
                        self.digest.update(view)
                        self.fh.write(view)
                    except OSError as exc:
                        self.error = exc
            if isinstance(buf, bytearray):
                self._free.put(buf)

    def buffer(self) -> bytearray:
        """A free buffer of ``CHUNK`` bytes to read into."""
        return self._free.get()

    def give_back(self, buf: bytearray) -> None:
        """Return a buffer that was not filled."""
        self._free.put(buf)

    def put(self, buf: bytes | bytearray, n: int) -> None:
        """Queue the first ``n`` bytes of ``buf``; raise an earlier write error."""
        if self.error is not None:
            raise self.error
        self._q.put((buf, n))

    def close(self) -> None:
        """Wait until every queued chunk is hashed and written; raise a write error."""
        self._q.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error


def content_range(value: str) -> tuple[int | None, int | None]:
    """(first byte, total) of ``bytes 100-199/1000`` or ``bytes */1000``."""
    m = re.fullmatch(r"\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)\s*", value)
    if m is None:
        return None, None
    return _int(m.group(1)), _int(m.group(2))


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


# -- segmented downloads -----------------------------------------------------------------


def segment_plan(size: int, count: int) -> list[list[int]]:
    """``[start, end, done]`` pieces (end exclusive) covering ``size`` in order, for
    ``count`` connections: about eight pieces per connection, 1-32 MiB each, so the
    pieces complete roughly in file order and the hasher follows right behind them."""
    piece = min(max(size // (max(1, count) * 8), _PIECE_MIN), _PIECE_MAX)
    piece = -(-piece // CHUNK) * CHUNK
    return [[s, min(s + piece, size), 0] for s in range(0, size, piece)]


def write_segments(
    path: Path, headers: Mapping[str, str], size: int, url: str, segments: list[list[int]]
) -> None:
    """Record the entity and each segment's progress, atomically (tmp, rename)."""
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    data = {
        "validator": etag or modified,
        "etag": etag,
        "last_modified": modified,
        "size": size,
        "source": url_id(url),
        "segments": segments,
    }
    tmp = path.with_name(path.name + ".tmp")
    _write_new(tmp, json.dumps(data))
    os.replace(tmp, path)


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
    """Per-segment progress of one file, and a thread hashing its contiguous prefix.

    Receivers call ``advance(i, n)`` after each write of ``n`` bytes at the end of
    segment ``i``; the hasher reads the file from disk up to the first byte not yet
    written, so the sha256 covers every byte of the file as it is on disk (resumed
    segments included), in order, while the later segments are still arriving.
    """

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
