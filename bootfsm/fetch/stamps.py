"""A cached artifact's sha256 kept in a ``<file>.sha256`` sidecar, so a rerun reads none.

Trusted only while the file's stat stamp is unchanged; what is used is hashed anyway.
"""

from __future__ import annotations

import json
import os
import stat

from bootfsm.core.errors import BootError
from bootfsm.machine.context import Context

__all__ = ["SUFFIX", "known_sha256", "remember", "stamp"]

SUFFIX = ".sha256"

Stamp = tuple[int, int, int, int]


def stamp(st: os.stat_result) -> Stamp:
    """The stat fields that change whenever a file's bytes can have changed (ctime: any
    write, rename over, chmod or touch sets it, and user space cannot set it back)."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def remember(ctx: Context, node_path: str, st: os.stat_result, sha256: str) -> None:
    """Keep ``sha256`` for ``node_path`` as it is now (``st``, its lstat) in its sidecar
    (atomic, 0600; fsynced only with ``fetch.fsync``: a lost sidecar is a hash redone)."""
    doc: dict[str, int | str] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    doc |= {"ino": st.st_ino, "ctime_ns": st.st_ctime_ns, "sha256": sha256}
    text = json.dumps(doc, sort_keys=True) + "\n"
    ctx.host.write_atomic(node_path + SUFFIX, text, mode=0o600, durable=ctx.config.fetch.fsync)


def known_sha256(ctx: Context, node_path: str, st: os.stat_result) -> str | None:
    """The sha256 its sidecar holds while the file is unchanged; None: hash it."""
    side = node_path + SUFFIX
    sst = ctx.host.stat(side, follow=False)
    if sst is None or not stat.S_ISREG(sst.st_mode) or sst.st_uid != st.st_uid:
        return None
    try:
        doc = json.loads(ctx.host.read_bytes(side, limit=4096) or b"")
        then = (doc["size"], doc["mtime_ns"], doc["ino"], doc["ctime_ns"])
        sha = doc["sha256"]
    except (BootError, ValueError, KeyError, TypeError):  # unreadable: hash again
        return None
    if then != stamp(st) or not isinstance(sha, str):
        return None
    return sha
