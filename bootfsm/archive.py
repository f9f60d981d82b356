"""Archive safety rules, pure: which tar members may be extracted."""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterable

__all__ = ["check_member", "check_members"]

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
