"""Durable file primitives: atomic replace (old or new bytes, never a mix, across a crash)
and durable append (a crash tears at most the last line, which lacks its newline)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["append_line", "fsync_dir", "publish", "sweep"]


def sweep(p: Path) -> None:
    """Remove the temporaries a killed run left for target ``p`` (``.NAME.*.tmp`` of a
    write, ``.NAME.*.lnk`` of a link; bootfsm holds the node lock, so no other writer
    owns them). One directory listing."""
    prefix = f".{p.name}."
    try:
        with os.scandir(p.parent) as it:
            stale = [
                e.path
                for e in it
                if e.name.startswith(prefix) and e.name.endswith((".tmp", ".lnk"))
            ]
    except FileNotFoundError:
        return
    for path in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def publish(
    p: Path,
    fill: Callable[[IO[bytes]], object],
    mode: int,
    *,
    durable: bool = True,
    sync_dir: bool = True,
) -> None:
    """Give ``p`` new content atomically: temporary, chmod, fsync, rename, directory fsync.
    ``durable=False`` skips the fsyncs (for files checked when read); ``sync_dir=False``
    leaves the directory's fsync to the caller. A stale ``.NAME.*.tmp`` is removed."""
    p.parent.mkdir(parents=True, exist_ok=True)
    sweep(p)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fill(fh)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable and sync_dir:
        fsync_dir(p.parent)


def append_line(p: Path, line: str) -> os.stat_result:
    """Append ``line`` (whole lines, each with its newline) to the existing regular file
    ``p`` in one write, fsync it, and return its status after. A link in its place is
    refused (ELOOP, never followed); a short write is an OSError (ENOSPC). A crash can
    tear only the last line of the write, which a reader drops (no newline)."""
    if not line.endswith("\n"):
        raise ValueError("append_line takes whole lines, each newline included")
    data = line.encode()
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        written = os.write(fd, data)
        if written != len(data):
            os.ftruncate(fd, os.fstat(fd).st_size - written)  # no torn line left behind
            raise OSError(28, f"short write to {p} ({written} of {len(data)} bytes)")
        os.fsync(fd)
        return os.fstat(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives a crash."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
