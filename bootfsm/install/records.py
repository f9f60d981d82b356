"""Install records: what bootfsm put on this node, the only list `bootfsm uninstall` trusts.

``<run.state_dir>/installed.jsonl`` (0600, docs/node-contract.md): a header line, then one
entry (KINDS) appended and fsynced right after each action, so a crash leaves at most one
thing unrecorded (left on the node, never removed blindly); a later entry with the same key
updates the earlier one, keeping its first ``before``.
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
    "add_many",
    "install_files",
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

SCHEMA = 2
_HEADER = {"kind": "bootfsm.installed", "schema": SCHEMA}
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
    """installed.jsonl is not what bootfsm writes; the message says why."""


def records_path(cfg: Config) -> str:
    """Node path of the install records: ``<run.state_dir>/installed.jsonl``."""
    return f"{cfg.run.state_dir}/installed.jsonl"


def parse_records(text: str) -> list[dict[str, Any]]:
    """The entries of an installed.jsonl text, same keys folded (pure); a torn last line is
    dropped, RecordsError on anything else."""
    lines = text.split("\n")
    lines.pop()  # the text after the last newline: "" or a torn append
    if not lines:
        raise RecordsError("empty (no header line)")
    try:
        head = json.loads(lines[0])
    except ValueError as exc:
        raise RecordsError(f"line 1: not JSON: {exc}") from exc
    if head != _HEADER:
        raise RecordsError(f"line 1: not the schema {SCHEMA} bootfsm.installed header")
    entries: list[dict[str, Any]] = []
    for i, line in enumerate(lines[1:], start=2):
        try:
            e = json.loads(line)
        except ValueError as exc:
            raise RecordsError(f"line {i}: not JSON: {exc}") from exc
        _check(e, f"line {i}")
        _fold(entries, e)
    return entries


def _check(e: Any, where: str) -> None:
    """RecordsError unless ``e`` is an entry bootfsm writes."""
    kind = e.get("kind") if isinstance(e, dict) else None
    if kind not in KINDS:
        raise RecordsError(f"{where}: unknown kind {str(kind)[:40]!r}")
    for key in KINDS[kind]:
        if not isinstance(e.get(key), str) or not e[key]:
            raise RecordsError(f"{where} ({kind}): {key!r} is not a string")
    if kind in ("file", "link") and not e["path"].startswith("/"):
        raise RecordsError(f"{where}: path {e['path'][:80]!r} is not absolute")
    if kind == "unit" and e["action"] not in UNIT_ACTIONS:
        raise RecordsError(f"{where}: unknown unit action {e['action'][:40]!r}")
    before = e.get("before")
    if kind == "file" and before is not None and not isinstance(before, dict):
        raise RecordsError(f"{where}: 'before' is not an object")
    if not isinstance(e.get("edit", {}), dict):
        raise RecordsError(f"{where}: 'edit' is not an object")


def _fold(entries: list[dict[str, Any]], entry: dict[str, Any]) -> None:
    """Add ``entry``; one under the same key keeps its first ``before`` and ``edit``."""
    key = _key(entry)
    for i, old in enumerate(entries):
        if _key(old) == key:
            keep: dict[str, Any] = {k: old[k] for k in ("before", "edit") if k in old}
            entries[i] = {**entry, **keep}
            return
    entries.append(entry)


def _line(e: Mapping[str, Any]) -> str:
    return json.dumps(e, sort_keys=True, separators=(",", ":")) + "\n"


def render_records(entries: Sequence[Mapping[str, Any]]) -> str:
    """installed.jsonl for ``entries`` (the inverse of ``parse_records``)."""
    return _line(_HEADER) + "".join(_line(e) for e in entries)


def load(host: Host, cfg: Config) -> list[dict[str, Any]]:
    """The node's records ([] when none); UNINSTALL_FAILED when unreadable,
    UNSAFE_STATE_FILE when not a regular file (a planted link is never followed)."""
    return _read(host, cfg)[0]


def _read(host: Host, cfg: Config) -> tuple[list[dict[str, Any]], bool]:
    """``load``'s entries, and whether the file ends with a whole line (True when none)."""
    path = records_path(cfg)
    if host.own_file(path) is None:  # UNSAFE_STATE_FILE for a link or a non-file
        return [], True
    text = host.read_text(path) or ""
    try:
        return parse_records(text), text.endswith("\n")
    except RecordsError as exc:
        raise BootError(Code.UNINSTALL_FAILED, f"{path}: {exc}") from exc


def save(host: Host, cfg: Config, entries: Sequence[Mapping[str, Any]]) -> None:
    """Rewrite the records atomically (0600), or remove the file when there are none."""
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
    """Record ``entry`` after what it describes was done (one append, one fsync);
    unreadable records are set aside as ``.bad``, never lost, and new ones begin."""
    add_many(ctx, [entry])


def add_many(ctx: Context, new: Sequence[dict[str, Any]]) -> None:
    """``add`` of several entries in one append and one fsync."""
    if not new:
        return
    host, path = ctx.host, records_path(ctx.config)
    try:
        entries, clean = _read(host, ctx.config)
    except BootError as exc:  # garbage: set aside (never lost), new records begin
        if exc.code is not Code.UNINSTALL_FAILED:
            raise
        bad = path + ".bad"
        host.rename(path, bad)
        ctx.warn(f"{exc.message}; moved to {bad}, new install records begin")
        entries, clean = [], True
    for entry in new:
        _check(entry, "new record")
    first = not entries
    for entry in new:
        _fold(entries, entry)
    if first or not clean:  # the first records, or a torn last line to drop
        save(host, ctx.config, entries)
        return
    host.append_line(path, "".join(_line(e) for e in new))


def snapshot(host: Host, path: str) -> dict[str, Any] | None:
    """What is at ``path`` now, as a file entry's ``before``: None, a link's target, or
    sha256, mode and (up to RESTORE_LIMIT) base64 bytes."""
    if host.is_symlink(path):
        return {"link": host.readlink(path) or ""}
    sha = host.sha256(path)
    if sha is None:
        return None
    data = host.read_bytes(path, limit=RESTORE_LIMIT + 1) or b""
    st = host.stat(path)
    mode = st.st_mode & 0o7777 if st else 0o644
    keep = base64.b64encode(data).decode() if len(data) <= RESTORE_LIMIT else None
    return {"sha256": sha, "mode": mode, "b64": keep}


def _file(ctx: Context, path: str, sha: str, before: dict[str, Any] | None) -> dict[str, Any]:
    return {"kind": "file", "path": path, "sha256": sha, "before": before, "by": ctx.state}


def _recorded(ctx: Context, path: str) -> bool:
    return any(e["kind"] == "file" and e["path"] == path for e in load(ctx.host, ctx.config))


def write_file(
    ctx: Context,
    path: str,
    data: bytes | str,
    mode: int = 0o644,
    then: Sequence[str] = (),
    edit: Mapping[str, Any] | None = None,
) -> None:
    """``host.write_atomic`` and record it (``then``: run after its removal; ``edit``: the
    one change to undo alone when the file was edited since)."""
    first = not _recorded(ctx, path)
    before = snapshot(ctx.host, path) if first else None
    ctx.host.write_atomic(path, data, mode)
    payload = data.encode() if isinstance(data, str) else data
    entry = _file(ctx, path, hashlib.sha256(payload).hexdigest(), before)
    if then:
        entry["then"] = list(then)
    if edit is not None and first:
        entry["edit"] = dict(edit)
    add(ctx, entry)


def track(ctx: Context, path: str, before: dict[str, Any] | None) -> None:
    """Record a file another program wrote for bootfsm (``before``: its earlier ``snapshot``)."""
    sha = ctx.host.sha256(path)
    if sha is None or (before is not None and before.get("sha256") == sha):
        return  # nothing written, or the same bytes as before
    add(ctx, _file(ctx, path, sha, before))


def install_files(ctx: Context, files: Sequence[tuple[str, str, int | None]]) -> None:
    """``host.install_files`` (a link stays a link), all recorded first in one append."""
    # recorded before placed: uninstall keeps a record's file found gone or unchanged
    entries: list[dict[str, Any]] = []
    for src, dst, _ in files:
        before = None if _recorded(ctx, dst) else snapshot(ctx.host, dst)
        if ctx.host.is_symlink(src):
            target = ctx.host.readlink(src) or ""
            entries.append({"kind": "link", "path": dst, "target": target, "before": before})
            continue
        sha = ctx.host.sha256(src)
        if sha is not None and (before is None or before.get("sha256") != sha):
            entries.append(_file(ctx, dst, sha, before))
    add_many(ctx, entries)
    ctx.host.install_files(files)


def record_dkms(ctx: Context, module: str, version: str, kernel: str) -> None:
    """Record the module/version DKMS built (for ``kernel``)."""
    add(ctx, {"kind": "dkms", "module": module, "version": version, "kernel": kernel})


def record_module(ctx: Context, name: str) -> None:
    """Record a kernel module bootfsm loaded."""
    add(ctx, {"kind": "module", "name": name, "by": ctx.state})


def unit_done(ctx: Context, action: str, name: str) -> None:
    """Record that bootfsm did ``systemctl enable|start|mask UNIT`` (it was not so already)."""
    add(ctx, {"kind": "unit", "unit": name, "action": action, "by": ctx.state})


def write_markers(ctx: Context, m: Marker) -> list[str]:
    """``marker.write_marker``, each file recorded; uninstall removes them last."""
    paths = [marker_path(ctx.config), PEER_MARKER]
    before = {p: snapshot(ctx.host, p) for p in paths}
    written = write_marker(ctx.host, ctx.config, m)
    for p in written:
        track(ctx, p, before[p])
    return written
