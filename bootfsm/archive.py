"""Archive safety rules, pure: which tar members may be extracted."""

from __future__ import annotations

import posixpath
import tarfile

__all__ = ["check_member"]

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
    if posixpath.isabs(name) or _escapes(name):
        return f"member {name!r} leaves the target directory"
    if type_ not in _ALLOWED:
        return f"member {name!r} is a device, FIFO or unknown type"
    if type_ == tarfile.SYMTYPE:
        target = posixpath.join(posixpath.dirname(name), linkname)
        if posixpath.isabs(linkname) or _escapes(target):
            return f"symlink {name!r} -> {linkname!r} leaves the target directory"
    if type_ == tarfile.LNKTYPE and (posixpath.isabs(linkname) or _escapes(linkname)):
        return f"hard link {name!r} -> {linkname!r} leaves the target directory"
    return None
