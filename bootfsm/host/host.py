"""The I/O boundary: node files under ``root``, commands on PATH, the clock.

Node paths are absolute (``/etc/os-release``) and joined under ``root`` here only;
the network half is ``bootfsm.host.http``."""

from __future__ import annotations

import errno
import fcntl
import glob as _glob
import hashlib
import os
import shutil
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import IO, TypeVar

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.host.atomic import append_line, fsync_dir, publish, sweep
from bootfsm.host.owndir import check_chain, check_dir
from bootfsm.host.process import OUTPUT_LIMIT_BYTES, OUTPUT_TAIL_BYTES, CommandResult, Commands

_T = TypeVar("_T")

__all__ = ["OUTPUT_LIMIT_BYTES", "OUTPUT_TAIL_BYTES", "CommandResult", "Host", "fsync_dir"]


class Host(Commands):
    """Files under ``root``, commands found on PATH, and a monotonic clock."""

    def __init__(
        self,
        root: Path | str = "/",
        *,
        env: Mapping[str, str] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.root = Path(root).resolve()
        self.env = dict(os.environ if env is None else env)
        self.monotonic = monotonic
        self.wall = wall
        self.sleep = sleep
        self.on_command: Callable[[CommandResult], None] | None = None
        self._child = None

    # -- paths -------------------------------------------------------------------------
    def path(self, node_path: str) -> Path:
        """The real path of absolute node path ``node_path`` under the root."""
        if not node_path.startswith("/"):
            raise ValueError(f"node path must be absolute: {node_path!r}")
        parts = [p for p in node_path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ValueError(f"node path must not contain '..': {node_path!r}")
        return self.root.joinpath(*parts)

    def node_path(self, real: Path) -> str:
        """Inverse of ``path``: the node path of a real path under the root."""
        rel = Path(real).resolve().relative_to(self.root)
        return "/" + rel.as_posix() if str(rel) != "." else "/"

    # -- reading -----------------------------------------------------------------------
    def read_text(self, node_path: str) -> str | None:
        """File content, or None when the file does not exist."""
        p = self.path(node_path)
        return _or_none(node_path, "read", lambda: p.read_text(encoding="utf-8", errors="replace"))

    def read_bytes(self, node_path: str, limit: int = 1 << 20) -> bytes | None:
        """Up to ``limit`` bytes of a file, or None when it does not exist."""
        return _or_none(node_path, "read", partial(_head, self.path(node_path), limit))

    def sha256(self, node_path: str) -> str | None:
        """sha256 (hex) of a regular file, links not followed; None when there is none."""
        h = hashlib.sha256()
        try:
            fd = os.open(self.path(node_path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as fh:
                while block := fh.read(1 << 20):
                    h.update(block)
        except OSError as exc:  # absent, a directory, a link (ELOOP): not a file of ours
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ELOOP):
                return None
            raise BootError(Code.HOST_IO_ERROR, f"cannot read {node_path}: {exc}") from exc
        return h.hexdigest()

    def exists(self, node_path: str) -> bool:
        """True when the node path exists (links are followed)."""
        return self.path(node_path).exists()

    def mtime(self, node_path: str) -> float | None:
        """Modification time of a file (links followed), or None when it does not exist."""
        st = self.stat(node_path)
        return st.st_mtime if st else None

    def stat(self, node_path: str, *, follow: bool = True) -> os.stat_result | None:
        """The node path's stat (``follow=False``: the link itself), or None when absent."""
        p = self.path(node_path)
        return _or_none(node_path, "stat", lambda: os.stat(p, follow_symlinks=follow))

    def is_file(self, node_path: str) -> bool:
        """True when the node path is a regular file (links followed)."""
        st = self.stat(node_path)
        return st is not None and stat.S_ISREG(st.st_mode)

    def is_symlink(self, node_path: str) -> bool:
        """True when the node path is a symbolic link."""
        return self.path(node_path).is_symlink()

    def readlink(self, node_path: str) -> str | None:
        """The target of a symbolic link, or None."""
        try:
            return os.readlink(self.path(node_path))
        except OSError:
            return None

    def glob(self, pattern: str) -> list[str]:
        """Sorted node paths matching an absolute glob pattern."""
        real = _glob.glob(str(self.path(pattern)))
        return sorted("/" + os.path.relpath(p, self.root) for p in real)

    def listdir(self, node_path: str) -> list[str]:
        """Sorted names in a directory; empty when it does not exist."""
        try:
            return sorted(os.listdir(self.path(node_path)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def free_bytes(self, node_path: str) -> int:
        """Free bytes on the filesystem holding ``node_path`` (or its nearest parent)."""
        p = self.path(node_path)
        while not p.exists() and p != self.root:
            p = p.parent
        st = os.statvfs(p)
        return st.f_bavail * st.f_frsize

    # -- bootfsm's own directories ------------------------------------------------------
    def own_dir(self, node_path: str, mode: int = 0o700) -> Path:
        """Create (``mode``, root-owned) or check one of bootfsm's own directories; its real path.
        Not a symlink, root-owned, not group/other-writable, nor any directory above it, else
        ``UNSAFE_STATE_DIR``; nothing is repaired (it may already hold what others planted)."""
        p = self.path(node_path)
        parent = p.parent
        try:
            if not os.path.lexists(parent):
                os.makedirs(parent, mode=0o755)
            check_chain(self.root, Path(os.path.realpath(parent)), node_path)
            try:
                os.mkdir(p, mode)
                os.chmod(p, mode, follow_symlinks=False)
            except FileExistsError:
                pass
            st = os.lstat(p)
        except OSError as exc:
            raise BootError(
                Code.HOST_IO_ERROR, f"cannot create {node_path}: {exc.strerror or exc}"
            ) from exc
        check_dir(st, node_path, "")
        return p

    def own_file(self, node_path: str) -> Path | None:
        """The real path of a file in a bootfsm directory when it is a regular file;
        None when it does not exist; ``BootError(UNSAFE_STATE_FILE)`` for a symlink, a
        FIFO, a device or a directory planted in its place."""
        p = self.path(node_path)
        try:
            st = os.lstat(p)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise BootError(
                Code.UNSAFE_STATE_FILE,
                f"{node_path} is {what}; bootfsm never follows a link in its own directories",
            )
        return p

    def private_copy(self, src: str, dst_dir: str, sha256: str) -> Path:
        """Copy node file ``src`` into ``dst_dir`` (0700), hashing the bytes copied (one
        descriptor, no links followed); the copy when they match ``sha256``. Run the copy."""
        out_dir = self.own_dir(dst_dir)
        sp = self.path(src)
        name = sp.name
        try:
            fd = os.open(sp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            code = Code.UNSAFE_STATE_FILE if exc.errno == errno.ELOOP else Code.HOST_IO_ERROR
            raise BootError(code, f"cannot open {src}: {exc.strerror or exc}") from exc
        h = hashlib.sha256()
        dst = out_dir / name
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise BootError(Code.UNSAFE_STATE_FILE, f"{src} is not a regular file")

            def fill(out: IO[bytes]) -> None:
                while block := os.read(fd, 1 << 20):
                    h.update(block)
                    out.write(block)

            publish(dst, fill, 0o700, durable=False)  # executed now, copied anew each time
        except OSError as exc:
            raise BootError(
                Code.HOST_IO_ERROR, f"cannot copy {src} to {dst_dir}: {exc.strerror or exc}"
            ) from exc
        finally:
            os.close(fd)
        if sha256 and h.hexdigest() != sha256:  # "" only with sources.allow_unverified
            dst.unlink(missing_ok=True)
            raise BootError(
                Code.CHECKSUM_MISMATCH, f"{src} changed while it was copied to run: refused"
            )
        return dst

    # -- writing -----------------------------------------------------------------------
    def makedirs(self, node_path: str, mode: int = 0o755) -> Path:
        """Create a directory (and parents) under the root; return its real path."""
        p = self.path(node_path)
        try:
            p.mkdir(parents=True, exist_ok=True, mode=mode)
        except OSError as exc:
            raise BootError(Code.HOST_IO_ERROR, f"cannot create {node_path}: {exc}") from exc
        return p

    def write_atomic(
        self, node_path: str, data: bytes | str, mode: int = 0o644, *, durable: bool = True
    ) -> None:
        """Write a file: readers see the old or the new content, never a mix (``publish``)."""
        p = self.path(node_path)
        payload = data.encode() if isinstance(data, str) else data
        try:
            publish(p, lambda fh: fh.write(payload), mode, durable=durable)
        except OSError as exc:
            what = "disk full" if exc.errno == errno.ENOSPC else str(exc)
            raise BootError(Code.HOST_IO_ERROR, f"cannot write {node_path}: {what}") from exc

    def append_line(self, node_path: str, line: str) -> os.stat_result:
        """Append whole lines (newlines included) to an existing file durably: one write,
        one fsync, a link never followed. Returns the file's status after the write."""
        try:
            return append_line(self.path(node_path), line)
        except OSError as exc:
            what = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
            raise BootError(Code.HOST_IO_ERROR, f"cannot append to {node_path}: {what}") from exc

    def symlink_atomic(self, target: str, node_path: str) -> None:
        """Point ``node_path`` at ``target`` (kept verbatim), replacing what was there."""
        p = self.path(node_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        sweep(p)
        tmp = p.parent / f".{p.name}.{os.getpid()}.lnk"
        tmp.unlink(missing_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, p)

    def remove(self, node_path: str) -> bool:
        """Remove a file or link; return True when something was removed."""
        try:
            self.path(node_path).unlink()
            return True
        except FileNotFoundError:
            return False

    def rename(self, src: str, dst: str) -> None:
        """Atomically move node path ``src`` to ``dst`` and fsync the directory."""
        try:
            os.replace(self.path(src), self.path(dst))
        except OSError as exc:
            raise BootError(Code.HOST_IO_ERROR, f"cannot rename {src} to {dst}: {exc}") from exc
        fsync_dir(self.path(dst).parent)

    def chmod(self, node_path: str, mode: int) -> None:
        """Set a file's permission bits."""
        os.chmod(self.path(node_path), mode)

    def rmtree(self, node_path: str) -> None:
        """Remove a directory tree if it exists (a symlink in its place: the link only)."""
        p = self.path(node_path)
        if p.is_symlink():
            p.unlink()
            return
        shutil.rmtree(p, ignore_errors=True)

    def install_files(self, files: Sequence[tuple[str, str, int | None]]) -> None:
        """Copy each node file ``src`` to ``dst`` atomically (temp, fsync, rename; mode
        ``mode``, else the source's), links kept as links; each directory is fsynced
        once after all of them (an archive's files share a few directories)."""
        dirs: dict[Path, None] = {}
        for src, dst, mode in files:
            sp, dp = self.path(src), self.path(dst)
            if sp.is_symlink():
                self.symlink_atomic(os.readlink(sp), dst)
                continue
            try:
                keep = mode if mode is not None else (sp.stat().st_mode & 0o7777)
                with sp.open("rb") as inp:
                    publish(dp, partial(_copy_from, inp), keep, sync_dir=False)
            except OSError as exc:
                raise BootError(Code.HOST_IO_ERROR, f"cannot install {dst}: {exc}") from exc
            dirs[dp.parent] = None
        for d in dirs:
            fsync_dir(d)

    def extract_tar(
        self,
        archive: Path,
        dest: str,
        *,
        max_members: int = 10_000,
        max_bytes: int | None = None,
        deadline: float | None = None,
        on_timeout: Callable[[], BootError] | None = None,
    ) -> list[str]:
        """Extract a verified tar under node dir ``dest``; ``UNSAFE_ARCHIVE`` for unsafe members
        (``archive.check_members``, the ``data`` filter) or more than ``max_members`` or
        ``max_bytes`` (default 32x the archive, at least 64 MiB), before anything is written.
        ``deadline`` (monotonic) bounds it: ``on_timeout()``, else DEADLINE_EXCEEDED."""
        from bootfsm.host import archive as archive_rules  # tarfile: only when extracting

        parent = dest.rsplit("/", 1)[0]
        if parent:  # bootfsm's extract dir: never a planted link (the root is the caller's)
            self.own_dir(parent)
        limit = max_bytes if max_bytes is not None else max(64 << 20, 32 * archive.stat().st_size)
        return archive_rules.extract_bounded(
            archive,
            self.path(dest),
            make_dest=lambda: self.own_dir(dest),
            max_members=max_members,
            max_bytes=limit,
            deadline=deadline,
            monotonic=self.monotonic,
            on_timeout=on_timeout,
        )

    def lock_is_free(self, node_path: str) -> bool:
        """Probe a POSIX (fcntl) lock, as dpkg takes it, without waiting for it."""
        p = self.path(node_path)
        if not p.exists():
            return True
        fd = os.open(p, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN)
            return True
        finally:
            os.close(fd)


def _copy_from(inp: IO[bytes], out: IO[bytes]) -> None:
    shutil.copyfileobj(inp, out, 1 << 20)


def _or_none(node_path: str, what: str, fn: Callable[[], _T]) -> _T | None:
    """``fn()``; None when the node path does not exist, HOST_IO_ERROR on other errors."""
    try:
        return fn()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise BootError(Code.HOST_IO_ERROR, f"cannot {what} {node_path}: {exc}") from exc


def _head(p: Path, limit: int) -> bytes:
    with p.open("rb") as fh:
        return fh.read(limit)
