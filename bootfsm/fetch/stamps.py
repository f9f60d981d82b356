"""What bootfsm already knows about a cached artifact's bytes, so a rerun reads none.

A download hashes every byte as it arrives; after the rename, the file's stat stamp
(size, mtime_ns, inode, ctime_ns) and that sha256 are kept twice: in the run's memory
(``ctx.scratch``) and in a sidecar ``<file>.sha256`` (JSON, 0600) beside it in the
cache, which is root's and closed (0700). The fetch postcondition trusts a sidecar only
while the file's stamp is unchanged: any write, truncation, rename over, chmod or touch
changes ctime, which user space cannot set back. So a rerun whose states are all
satisfied checks the cache with one stat per artifact and reads no artifact.

What is used is still hashed when it is used: the runfile as it is copied to the
private copy that runs (``Host.private_copy``), the debs just before dpkg gets them
(``bootfsm.fetch.store.verified``, which trusts only this run's own memory).
"""

from __future__ import annotations

import json
import os
import stat

from bootfsm.machine.context import Context

__all__ = ["MEMO", "SUFFIX", "known_sha256", "remember", "stamp"]

MEMO = "fetch.verified"  # ctx.scratch: real path -> (size, mtime_ns, inode, ctime_ns, sha256)
SUFFIX = ".sha256"

Stamp = tuple[int, int, int, int]


def stamp(st: os.stat_result) -> Stamp:
    """The stat fields that change whenever a file's bytes can have changed."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def remember(ctx: Context, node_path: str, st: os.stat_result, sha256: str) -> None:
    """Keep ``sha256`` for the file at ``node_path`` as it is now (``st``, its lstat):
    in this run's memory and in its sidecar (atomic, 0600; fsynced only with
    ``fetch.fsync``, like the artifact: a sidecar lost is a hash made again)."""
    ctx.scratch.setdefault(MEMO, {})[str(ctx.host.path(node_path))] = (*stamp(st), sha256)
    doc: dict[str, int | str] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    doc |= {"ino": st.st_ino, "ctime_ns": st.st_ctime_ns, "sha256": sha256}
    text = json.dumps(doc, sort_keys=True) + "\n"
    ctx.host.write_atomic(node_path + SUFFIX, text, mode=0o600, durable=ctx.config.fetch.fsync)


def known_sha256(
    ctx: Context, node_path: str, st: os.stat_result, *, sidecar: bool = True
) -> str | None:
    """The sha256 of the file's bytes if this run hashed them, or (``sidecar``) a past
    run did and the file has not changed since; None when it must be hashed."""
    now = stamp(st)
    seen = ctx.scratch.get(MEMO, {}).get(str(ctx.host.path(node_path)))
    if seen is not None and tuple(seen[:4]) == now:
        return str(seen[4])
    if not sidecar:
        return None
    side = ctx.host.path(node_path + SUFFIX)
    try:
        sst = side.lstat()
        if not stat.S_ISREG(sst.st_mode) or sst.st_uid != st.st_uid or sst.st_size > 4096:
            return None
        doc = json.loads(side.read_text(encoding="utf-8"))
        then = (doc["size"], doc["mtime_ns"], doc["ino"], doc["ctime_ns"])
        sha = doc["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if then != now or not isinstance(sha, str):
        return None
    ctx.scratch.setdefault(MEMO, {})[str(ctx.host.path(node_path))] = (*now, sha)
    return sha
