"""Install records: what bootfsm put on this node, the only list `bootfsm uninstall` trusts.

``<run.state_dir>/installed.json`` (0600, written atomically: temporary, fsync, rename)
holds one entry per thing installed, in the order it was installed:

- ``file``: a file bootfsm wrote (``sha256`` of what it wrote; ``before``: what was
  there first, null when nothing was, else its sha256, mode and, up to 1 MiB, its bytes
  in base64 so that uninstall can put them back; ``then``: a command to run once it is
  removed, e.g. ``update-initramfs -u`` after the nouveau blacklist; ``edit``: for
  config.toml, the imports text bootfsm changed, undone alone if the file was edited
  since);
- ``link``: a symbolic link bootfsm made (``target``);
- ``package``: a Debian package bootfsm's ``dpkg -i`` installed that was not installed
  before (``name``, ``version``); a package that was there before is never recorded;
- ``dkms``: the module/version DKMS built (``module``, ``version``, ``kernel``);
- ``unit``: ``enable``, ``start`` or ``mask`` of a systemd unit that was not so before;
- ``module``: a kernel module bootfsm loaded.

An entry is written right after the action it records, so a crash in between leaves at
most that one thing unrecorded (it is then left on the node, never removed blindly).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host
from bootfsm.install.marker import PEER_MARKER, Marker, marker_path, write_marker
from bootfsm.machine.context import Context

__all__ = [
    "KINDS",
    "RESTORE_LIMIT",
    "RecordsError",
    "add",
    "install_file",
    "load",
    "parse_records",
    "record_dkms",
    "record_module",
    "records_path",
    "render_records",
    "save",
    "snapshot",
    "track",
    "unit_done",
    "write_file",
    "write_markers",
]

SCHEMA = 1
RESTORE_LIMIT = 1 << 20
"""Files up to this size are kept whole in ``before`` (restored on uninstall)."""
KINDS = {
    "file": ("path", "sha256"),
    "link": ("path", "target"),
    "package": ("name", "version"),
    "dkms": ("module", "version"),
    "unit": ("unit", "action"),
    "module": ("name",),
}
UNIT_ACTIONS = ("enable", "start", "mask")


class RecordsError(ValueError):
    """installed.json is not what bootfsm writes; the message says why."""


def records_path(cfg: Config) -> str:
    """Node path of the install records: ``<run.state_dir>/installed.json``."""
    return f"{cfg.run.state_dir}/installed.json"


def parse_records(text: str) -> list[dict[str, Any]]:
    """The entries of an installed.json text (pure); RecordsError on anything else."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RecordsError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise RecordsError(f"not a schema {SCHEMA} bootfsm.installed object")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise RecordsError("'entries' is not a list")
    for i, e in enumerate(entries):
        kind = e.get("kind") if isinstance(e, dict) else None
        if kind not in KINDS:
            raise RecordsError(f"entry {i}: unknown kind {str(kind)[:40]!r}")
        for key in KINDS[kind]:
            if not isinstance(e.get(key), str) or not e[key]:
                raise RecordsError(f"entry {i} ({kind}): {key!r} is not a string")
        if kind in ("file", "link") and not e["path"].startswith("/"):
            raise RecordsError(f"entry {i}: path {e['path'][:80]!r} is not absolute")
        if kind == "unit" and e["action"] not in UNIT_ACTIONS:
            raise RecordsError(f"entry {i}: unknown unit action {e['action'][:40]!r}")
        before = e.get("before")
        if kind == "file" and before is not None and not isinstance(before, dict):
            raise RecordsError(f"entry {i}: 'before' is not an object")
        if not isinstance(e.get("edit", {}), dict):
            raise RecordsError(f"entry {i}: 'edit' is not an object")
    return entries


def render_records(entries: Sequence[Mapping[str, Any]]) -> str:
    """installed.json for ``entries`` (the inverse of ``parse_records``)."""
    doc = {"schema": SCHEMA, "kind": "bootfsm.installed", "entries": list(entries)}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def load(host: Host, cfg: Config) -> list[dict[str, Any]]:
    """The node's records ([] when none); BootError(UNINSTALL_FAILED) when unreadable,
    UNSAFE_STATE_FILE when not a regular file (a link planted in bootfsm's state dir is
    never followed)."""
    path = records_path(cfg)
    if host.own_file(path) is None:  # UNSAFE_STATE_FILE for a link or a non-file
        return []
    try:
        return parse_records(host.read_text(path) or "")
    except RecordsError as exc:
        raise BootError(Code.UNINSTALL_FAILED, f"{path}: {exc}") from exc


def save(host: Host, cfg: Config, entries: Sequence[Mapping[str, Any]]) -> None:
    """Write the records atomically (0600), or remove the file when there are none."""
    path = records_path(cfg)
    if not entries:
        host.remove(path)
        return
    host.own_dir(cfg.run.state_dir)
    host.write_atomic(path, render_records(entries), 0o600)


def _key(e: Mapping[str, Any]) -> tuple[str, ...]:
    if e["kind"] == "dkms":
        return ("dkms", e["module"], e["version"])
    return (e["kind"], *(str(e[k]) for k in KINDS[e["kind"]] if k not in ("sha256", "target")))


def add(ctx: Context, entry: dict[str, Any]) -> None:
    """Record ``entry`` after what it describes was done. A file or link recorded before
    keeps its first ``before`` (what the node had before bootfsm) and takes the new
    content; a package recorded before takes the new version."""
    try:
        entries = load(ctx.host, ctx.config)
    except BootError as exc:  # garbage: set aside (never lost), new records begin
        if exc.code is not Code.UNINSTALL_FAILED:
            raise
        bad = records_path(ctx.config) + ".bad"
        ctx.host.rename(records_path(ctx.config), bad)
        ctx.warn(f"{exc.message}; moved to {bad}, new install records begin")
        entries = []
    key = _key(entry)
    for i, old in enumerate(entries):
        if _key(old) == key:
            keep: dict[str, Any] = {k: old[k] for k in ("before", "edit") if k in old}
            entries[i] = {**entry, **keep}
            break
    else:
        entries.append(entry)
    save(ctx.host, ctx.config, entries)


def snapshot(host: Host, path: str) -> dict[str, Any] | None:
    """What is at ``path`` now, as a file entry's ``before``: None when nothing is; a
    link's target; else the file's sha256, mode and (up to RESTORE_LIMIT) bytes."""
    if host.is_symlink(path):
        return {"link": host.readlink(path) or ""}
    sha = host.sha256(path)
    if sha is None:
        return None
    data = host.read_bytes(path, limit=RESTORE_LIMIT + 1) or b""
    mode = host.path(path).stat().st_mode & 0o7777
    keep = base64.b64encode(data).decode() if len(data) <= RESTORE_LIMIT else None
    return {"sha256": sha, "mode": mode, "b64": keep}


def _recorded(ctx: Context, kind: str, path: str) -> bool:
    return any(e["kind"] == kind and e["path"] == path for e in load(ctx.host, ctx.config))


def write_file(
    ctx: Context,
    path: str,
    data: bytes | str,
    mode: int = 0o644,
    then: Sequence[str] = (),
    edit: Mapping[str, Any] | None = None,
) -> None:
    """``host.write_atomic`` and record it (``then``: run after its removal; ``edit``:
    the one change made to a file that was there, undone alone when the file was edited
    since, e.g. ``containerd.import_edit``)."""
    first = not _recorded(ctx, "file", path)
    before = snapshot(ctx.host, path) if first else None
    ctx.host.write_atomic(path, data, mode)
    payload = data.encode() if isinstance(data, str) else data
    entry: dict[str, Any] = {"kind": "file", "path": path, "before": before, "by": ctx.state}
    entry["sha256"] = hashlib.sha256(payload).hexdigest()
    if then:
        entry["then"] = list(then)
    if edit is not None and first:
        entry["edit"] = dict(edit)
    add(ctx, entry)


def track(ctx: Context, path: str, before: dict[str, Any] | None) -> None:
    """Record a file another program wrote for bootfsm (``before``: its ``snapshot``
    taken first), e.g. the CDI spec `nvidia-ctk cdi generate` writes."""
    sha = ctx.host.sha256(path)
    if sha is None or (before is not None and before.get("sha256") == sha):
        return  # nothing written, or the same bytes as before
    add(ctx, {"kind": "file", "path": path, "sha256": sha, "before": before, "by": ctx.state})


def install_file(ctx: Context, src: str, dst: str, mode: int | None = None) -> None:
    """``host.install_file`` (a link stays a link) and record the result."""
    before = None if _recorded(ctx, "file", dst) else snapshot(ctx.host, dst)
    ctx.host.install_file(src, dst, mode)
    if ctx.host.is_symlink(dst):
        target = ctx.host.readlink(dst) or ""
        add(ctx, {"kind": "link", "path": dst, "target": target, "before": before})
    else:
        track(ctx, dst, before)


def record_dkms(ctx: Context, module: str, version: str, kernel: str) -> None:
    """Record the module/version DKMS built (for ``kernel``)."""
    add(ctx, {"kind": "dkms", "module": module, "version": version, "kernel": kernel})


def record_module(ctx: Context, name: str) -> None:
    """Record a kernel module bootfsm loaded."""
    add(ctx, {"kind": "module", "name": name, "by": ctx.state})


def unit_done(ctx: Context, action: str, name: str) -> None:
    """Record that bootfsm did ``systemctl enable|start|mask UNIT`` (it was not so
    already): bootfsm.install.daemons asks, acts and calls this."""
    add(ctx, {"kind": "unit", "unit": name, "action": action, "by": ctx.state})


def write_markers(ctx: Context, m: Marker) -> list[str]:
    """``marker.write_marker`` (bootfsm's marker, and the peer's when configured), each
    file recorded; uninstall removes them last."""
    paths = [marker_path(ctx.config), PEER_MARKER]
    before = {p: snapshot(ctx.host, p) for p in paths}
    written = write_marker(ctx.host, ctx.config, m)
    for p in written:
        track(ctx, p, before[p])
    return written
