"""Archive safety rules, pure: which tar members may be extracted."""

from __future__ import annotations

import copy
import posixpath
import tarfile
from collections.abc import Iterable

__all__ = [
    "FILTER_ERRORS",
    "HAS_EXTRACTION_FILTER",
    "check_member",
    "check_members",
    "extract_members",
]

HAS_EXTRACTION_FILTER: bool = hasattr(tarfile, "data_filter") and hasattr(tarfile, "FilterError")
"""Python's tar extraction filters (PEP 706) exist from 3.11.4 (and in 3.8.17+, 3.9.17+,
3.10.12+ backports); Debian 12's python3 is 3.11.2 and has none. The feature is
detected, never the version string."""

FILTER_ERRORS: tuple[type[Exception], ...] = (
    (tarfile.FilterError,) if HAS_EXTRACTION_FILTER else ()  # type: ignore[attr-defined,unused-ignore]
)
"""What the ``data`` filter raises; empty where the filter does not exist."""

_ALLOWED = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE}


def _escapes(path: str) -> bool:
    norm = posixpath.normpath(path)
    return norm == ".." or norm.startswith("../") or posixpath.isabs(path)


def check_member(name: str, type_: bytes, linkname: str = "") -> str | None:
    """Why member ``name`` is unsafe, or None when it may be extracted.

    Refused: absolute names, names with ``..`` that leave the target, devices, FIFOs,
    and symbolic or hard links whose target leaves the target directory.
    """
    if not name or "\x00" in name:
        return f"empty or NUL in member name {name!r}"
    if posixpath.isabs(name) or _escapes(name) or ".." in name.split("/"):
        return f"member {name!r} leaves the target directory (absolute or '..')"
    if type_ not in _ALLOWED:
        return f"member {name!r} is a device, FIFO or unknown type"
    if type_ == tarfile.SYMTYPE:
        target = posixpath.join(posixpath.dirname(name), linkname)
        if posixpath.isabs(linkname) or _escapes(target):
            return f"symlink {name!r} -> {linkname!r} leaves the target directory"
    if type_ == tarfile.LNKTYPE and (
        posixpath.isabs(linkname) or _escapes(linkname) or ".." in linkname.split("/")
    ):
        return f"hard link {name!r} -> {linkname!r} leaves the target directory"
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
    """Why an archive of (name, type, linkname) members is unsafe, or None.

    ``check_member`` for each, and no name, hard link or symlink target may pass through
    a symlink the archive itself creates: such a path is inside lexically but can land
    anywhere on disk (``d/up -> ..`` then ``d/up/../x``).
    """
    links: set[str] = set()
    for name, type_, linkname in members:
        problem = check_member(name, type_, linkname)
        if problem:
            return problem
        paths = [name]
        if type_ == tarfile.SYMTYPE:
            paths.append(posixpath.join(posixpath.dirname(name), linkname))
        elif type_ == tarfile.LNKTYPE:
            paths.append(linkname)
        for path in paths:
            via = _through(path, links)
            if via is not None:
                return f"member {name!r} goes through the archive's own symlink {via!r}"
        if type_ == tarfile.SYMTYPE:
            links.add(posixpath.normpath(name))
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
    tf: tarfile.TarFile, target: str, members: list[tarfile.TarInfo], *, use_filter: bool
) -> None:
    """Extract members that ``check_members`` accepted (the caller's duty) into ``target``.

    With ``use_filter`` (``HAS_EXTRACTION_FILTER``) Python's ``data`` filter applies as
    well; without it bootfsm's own rules (already applied by the caller) are the only
    gate and the members' modes and owners are cleaned as the filter would.
    """
    if use_filter:
        tf.extractall(target, members=members, filter="data")
        return
    # members were checked by check_members (absolute, "..", links, devices refused)
    tf.extractall(target, members=[_sanitized(m) for m in members])  # noqa: S202
