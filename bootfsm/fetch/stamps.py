"""What bootfsm already knows about a cached artifact's bytes, so a rerun reads none.

A download hashes every byte as it arrives; after the rename, the file's stat stamp
(size, mtime_ns, inode, ctime_ns) and that sha256 are kept in a sidecar
``<file>.sha256`` (JSON, 0600) beside it in the cache, which is root's and closed
(0700). A sidecar is trusted only while the file's stamp is unchanged: any write,
truncation, rename over, chmod or touch changes ctime, which user space cannot set
back. So a rerun whose states are all satisfied checks the cache with one stat per
artifact and reads no artifact.

What is used is still hashed when it is used: the runfile as it is copied to the
private copy that runs (``Host.private_copy``), every artifact a state uses
(``bootfsm.fetch.store.verified``).
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
    """The stat fields that change whenever a file's bytes can have changed."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def remember(ctx: Context, node_path: str, st: os.stat_result, sha256: str) -> None:
    """Keep ``sha256`` for the file at ``node_path`` as it is now (``st``, its lstat) in
    its sidecar (atomic, 0600; fsynced only with ``fetch.fsync``, like the artifact: a
    sidecar lost is a hash made again)."""
    doc: dict[str, int | str] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    doc |= {"ino": st.st_ino, "ctime_ns": st.st_ctime_ns, "sha256": sha256}
    text = json.dumps(doc, sort_keys=True) + "\n"
    ctx.host.write_atomic(node_path + SUFFIX, text, mode=0o600, durable=ctx.config.fetch.fsync)


def known_sha256(ctx: Context, node_path: str, st: os.stat_result) -> str | None:
    """The sha256 of the file's bytes if a run (this one or a past one) hashed them and
    the file has not changed since (its sidecar); None when it must be hashed
    (``bootfsm.fetch.store.verified`` hashes what is used, whatever a sidecar says)."""
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
