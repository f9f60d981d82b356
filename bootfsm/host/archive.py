"""Archive safety rules, pure: which tar members may be extracted."""

from __future__ import annotations

import copy
import lzma
import posixpath
import tarfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.core.excerpt import excerpt

__all__ = [
    "FILTER_ERRORS",
    "HAS_EXTRACTION_FILTER",
    "check_member",
    "check_members",
    "extract_bounded",
    "extract_members",
    "filter_is_sound",
]


def filter_is_sound() -> bool:
    """Whether Python's ``data`` filter accepts an inside relative link (CPython gh-107845:
    3.10.12 and 3.11.4, Ubuntu 22.04's python3 among them, resolve it against the target)."""
    info = tarfile.TarInfo("a/b/link")
    info.type, info.linkname = tarfile.SYMTYPE, "../c"
    try:
        tarfile.data_filter(info, "/nonexistent/dest")  # type: ignore[attr-defined,unused-ignore]
    except tarfile.FilterError:  # type: ignore[attr-defined,unused-ignore]
        return False
    return True


HAS_EXTRACTION_FILTER: bool = (
    hasattr(tarfile, "data_filter") and hasattr(tarfile, "FilterError") and filter_is_sound()
)
"""Python's tar extraction filters (PEP 706) exist from 3.11.4 (and in 3.8.17+, 3.9.17+,
3.10.12+ backports); Debian 12's python3 is 3.11.2 and has none, and where the filter
refuses inside links (filter_is_sound) it is not used either: bootfsm's own member
checks apply. The feature is detected, never the version string."""

FILTER_ERRORS: tuple[type[Exception], ...] = (
    (tarfile.FilterError,) if HAS_EXTRACTION_FILTER else ()  # type: ignore[attr-defined,unused-ignore]
)
"""What the ``data`` filter raises; empty where the filter does not exist."""

_ALLOWED = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE}


def _escapes(path: str) -> bool:
    norm = posixpath.normpath(path)
    return norm == ".." or norm.startswith("../") or posixpath.isabs(path)


def check_member(name: str, type_: bytes, linkname: str = "") -> str | None:
    """Why member ``name`` is unsafe (absolute, ``..`` out, device, FIFO, link out), or None."""
    if not name or "\x00" in name:
        return f"empty or NUL in member name {excerpt(name)}"
    if posixpath.isabs(name) or _escapes(name) or ".." in name.split("/"):
        return f"member {excerpt(name)} leaves the target directory (absolute or '..')"
    if type_ not in _ALLOWED:
        return f"member {excerpt(name)} is a device, FIFO or unknown type"
    if type_ == tarfile.SYMTYPE:
        target = posixpath.join(posixpath.dirname(name), linkname)
        if posixpath.isabs(linkname) or _escapes(target):
            return f"symlink {excerpt(name)} -> {excerpt(linkname)} leaves the target directory"
    if type_ == tarfile.LNKTYPE and (
        posixpath.isabs(linkname) or _escapes(linkname) or ".." in linkname.split("/")
    ):
        return f"hard link {excerpt(name)} -> {excerpt(linkname)} leaves the target directory"
    return None


def _through(path: str, links: set[str]) -> str | None:
    """The archive symlink that ``path`` (relative to the target) passes through, if any."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        prefix = posixpath.normpath("/".join(parts[:i]))
        if prefix in links:
            return prefix
    return None


def check_members(members: Iterable[tuple[str, bytes, str]]) -> str | None:
    """Why an archive of (name, type, linkname) members is unsafe, or None: ``check_member``
    for each, and no path through a symlink the archive itself creates, wherever it comes."""
    rows = list(members)
    for name, type_, linkname in rows:
        problem = check_member(name, type_, linkname)
        if problem:
            return problem
    links = {posixpath.normpath(n) for n, t, _ in rows if t == tarfile.SYMTYPE}
    for name, type_, linkname in rows:
        paths = [name]
        if type_ == tarfile.SYMTYPE:
            paths.append(posixpath.join(posixpath.dirname(name), linkname))
        elif type_ == tarfile.LNKTYPE:
            paths.append(linkname)
        for path in paths:
            via = _through(path, links)
            if via is not None:
                return (
                    f"member {excerpt(name)} goes through the archive's own symlink {excerpt(via)}"
                )
    return None


def _sanitized(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """What the ``data`` filter does to a member already judged safe: no setuid, setgid
    or sticky bit, no group/other write, owned by whoever extracts (root here)."""
    clean = member.replace(deep=False) if hasattr(member, "replace") else copy.copy(member)
    if clean.isreg() or clean.islnk():
        clean.mode = (clean.mode & 0o755) | 0o600
    elif clean.isdir():
        clean.mode = (clean.mode & 0o755) | 0o700
    clean.uid = clean.gid = 0
    clean.uname = clean.gname = "root"
    return clean


def extract_members(
    tf: tarfile.TarFile,
    target: str,
    members: list[tarfile.TarInfo],
    *,
    use_filter: bool,
    check_time: Callable[[], None] = lambda: None,
) -> None:
    """Extract members the caller checked into ``target``; the ``data`` filter too when
    ``use_filter``, else modes and owners cleaned as it would; ``check_time`` per member."""
    for m in members:
        check_time()
        if use_filter:
            tf.extractall(target, members=[m], filter="data")
        else:  # checked by check_members (absolute, "..", links, devices refused)
            tf.extractall(target, members=[_sanitized(m)])  # noqa: S202


def extract_bounded(
    archive: Path,
    target: Path,
    *,
    make_dest: Callable[[], object],
    max_members: int,
    max_bytes: int,
    deadline: float | None,
    monotonic: Callable[[], float],
    on_timeout: Callable[[], BootError] | None,
) -> list[str]:
    """List (one member at a time, bounded), check and extract ``archive`` into ``target``;
    ``make_dest`` runs only once every member passed; ``deadline`` bounds all of it."""

    def check_time() -> None:
        if deadline is not None and monotonic() > deadline:
            raise (on_timeout() if on_timeout else BootError(
                Code.DEADLINE_EXCEEDED, f"no time left to extract {archive.name}"
            ))  # fmt: skip

    def refuse(problem: str) -> BootError:
        return BootError(Code.UNSAFE_ARCHIVE, f"refusing archive {archive.name}: {problem}")

    def unreadable(exc: Exception) -> BootError:  # the bytes hashed were not an archive
        why = excerpt(str(exc) or type(exc).__name__, 120)
        return BootError(Code.ARCHIVE_INVALID, f"{archive.name} is not a readable archive: {why}")

    try:
        with tarfile.open(archive, "r:*") as tf:
            members: list[tarfile.TarInfo] = []
            total = 0
            for m in tf:
                check_time()
                members.append(m)
                total += m.size if m.isreg() else 0
                if len(members) > max_members:
                    raise refuse(f"more than {max_members} members")
                if total > max_bytes:
                    raise refuse(
                        f"more than {max_bytes} bytes uncompressed (its size with a margin)"
                    )
            problem = check_members((m.name, m.type, m.linkname) for m in members)
            if problem:
                raise refuse(problem)
            make_dest()
            extract_members(
                tf, str(target), members, use_filter=HAS_EXTRACTION_FILTER, check_time=check_time
            )
    except FILTER_ERRORS as exc:
        raise refuse(str(exc)) from exc
    except (tarfile.TarError, lzma.LZMAError, zlib.error, EOFError) as exc:
        raise unreadable(exc) from exc
    except OSError as exc:  # with no errno: a decompressor's word on the bytes (gzip, bz2)
        if exc.errno is None:
            raise unreadable(exc) from exc
        raise BootError(Code.HOST_IO_ERROR, f"cannot extract {archive.name}: {exc}") from exc
    return [m.name for m in members]
