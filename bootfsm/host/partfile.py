"""A download in progress: the ``.part`` file, its ``.part.meta`` sidecar (validators,
size, a source id, never the URL) and the hashing writer. Knows nothing of HTTP."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import queue
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_url

__all__ = [
    "CHUNK",
    "BadResume",
    "PartWriter",
    "StreamResult",
    "accept",
    "check_space",
    "content_range",
    "discard",
    "entity",
    "guarded_io",
    "if_range",
    "int_or_none",
    "meta_path",
    "partial_source",
    "read_meta",
    "same_entity",
    "url_id",
    "whole_or_discard",
    "write_error",
    "write_meta",
    "write_new",
    "wrong_size",
]

CHUNK = 256 << 10  # fits the CPU cache while it is hashed and written; 1 MiB was slower
_BUFFERS = 16  # read-ahead between the socket and the writer (4 MiB)
_T = TypeVar("_T")
_Chunk = tuple[bytes | bytearray, int]  # a buffer and how many of its bytes count


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


def entity(headers: Mapping[str, str], total: int | None, url: str) -> dict[str, Any]:
    """What a sidecar records of the entity its bytes belong to."""
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    return {
        "validator": etag or modified,
        "etag": etag,
        "last_modified": modified,
        "size": total,
        "source": url_id(url),
    }


def write_meta(path: Path, headers: Mapping[str, str], total: int | None, url: str) -> None:
    """Record the entity the bytes about to be written belong to (before writing them)."""
    write_new(path, json.dumps(entity(headers, total, url)))


def write_new(path: Path, text: str) -> None:
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


class BadResume(TransientError):
    """A resume answered with bytes that do not continue the file: the part is gone."""


def accept(
    status: int,
    headers: Mapping[str, str],
    part: Path,
    have: int,
    meta: Mapping[str, Any],
    url: str,
) -> tuple[int, int | None]:
    """(bytes resumed from disk, total size or None) for a 200/206; never splices."""
    length = int_or_none(headers.get("Content-Length"))
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
        raise (BadResume if have else TransientError)(
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


def guarded_io(part: Path, fn: Callable[[], _T]) -> _T:
    """``fn()``, its OSError raised as ``write_error``'s."""
    try:
        return fn()
    except OSError as exc:
        raise write_error(part, exc) from exc


def wrong_size(url: str, got: int | None, want: int | None) -> BootError:
    """CHECKSUM_MISMATCH: the server's size of ``url`` is not the one its index states."""
    return BootError(
        Code.CHECKSUM_MISMATCH,
        f"{redact_url(url)} is {got} B but its index says {want} B",
        wrong_size=True,
    )


def write_error(part: Path, exc: OSError) -> BootError:
    """The error for a failed write; a full disk also drops the partial file."""
    if exc.errno == errno.ENOSPC:
        discard(part)
        return BootError(Code.INSUFFICIENT_SPACE, f"disk full writing {part.name}")
    return BootError(Code.HOST_IO_ERROR, f"cannot write {part.name}: {exc.strerror or exc}")


class PartWriter:
    """Hashes chunks on one helper thread and writes them on another (sha256 alone is about
    as slow as a fast network). ``buffer``/``put``/``give_back`` recycle the buffers; a
    write error is raised by the next ``put`` or ``close`` (the threads keep draining)."""

    def __init__(self, fh: IO[bytes], digest: Any) -> None:
        self.fh = fh
        self.digest = digest
        self.error: OSError | None = None
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(_BUFFERS):
            self._free.put(bytearray(CHUNK))
        self._q: queue.SimpleQueue[_Chunk | None] = queue.SimpleQueue()
        self._written: queue.SimpleQueue[_Chunk | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._hash, name="bootfsm-hasher", daemon=True),
            threading.Thread(target=self._drain, name="bootfsm-writer", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _hash(self) -> None:
        while (item := self._q.get()) is not None:
            buf, n = item
            if self.error is None:
                with memoryview(buf)[:n] as view:
                    self.digest.update(view)
            self._written.put(item)
        self._written.put(None)

    def _drain(self) -> None:
        while (item := self._written.get()) is not None:
            buf, n = item
            if self.error is None:
                with memoryview(buf)[:n] as view:
                    try:
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
        for t in self._threads:
            t.join()
        if self.error is not None:
            raise self.error


def content_range(value: str) -> tuple[int | None, int | None]:
    """(first byte, total) of ``bytes 100-199/1000`` or ``bytes */1000``."""
    m = re.fullmatch(r"\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)\s*", value)
    if m is None:
        return None, None
    return int_or_none(m.group(1)), int_or_none(m.group(2))


def int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
