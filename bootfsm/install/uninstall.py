"""Undo what the install records list (bootfsm/install/records.py), newest first.

``plan`` only reads; ``execute`` drops each record as its step settles it, so a crash or
failed step leaves exactly what is still to do. Nothing unrecorded is touched; a file is
removed only while it has the sha256 bootfsm wrote (else kept, with a warning); markers last.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.install import records
from bootfsm.install.containerd import undo_import
from bootfsm.install.daemons import CONTAINERD
from bootfsm.install.dpkg import installed_version, wait_for_lock
from bootfsm.install.marker import PEER_MARKER, marker_path
from bootfsm.install.units import enabled_state, is_active
from bootfsm.machine.context import Context

__all__ = ["Step", "execute", "plan", "run"]

DKMS_TREE = "/var/lib/dkms"
_TIMEOUTS = {"dkms-remove": 600.0, "purge": 300.0, "run": 300.0}


@dataclass(frozen=True)
class Step:
    """One thing uninstall does (or decides not to do) and the records it settles."""

    action: str
    """stop, disable, unmask, unload, dkms-remove, purge, remove, restore, unedit (undo
    only bootfsm's config.toml imports edit in a file edited since), keep, skip,
    run (a command a removed file asked for), daemon-reload, ldconfig, restart"""
    target: str
    argv: tuple[str, ...] = ()
    reason: str = ""
    settles: tuple[int, ...] = ()

    def line(self) -> str:
        """The step as one line of `bootfsm uninstall --plan`."""
        how = f" ({' '.join(self.argv)})" if self.argv else ""
        why = f": {self.reason}" if self.reason else ""
        return f"{self.action} {self.target}{how}{why}"

    def as_json(self) -> dict[str, Any]:
        """The step in `--json` output."""
        d = asdict(self)
        d["argv"] = list(self.argv)
        d["settles"] = list(self.settles)
        return d


def _unit_step(ctx: Context, i: int, e: dict[str, Any]) -> Step:
    u, action = e["unit"], e["action"]
    if action == "start":
        stop = Step("stop", u, ("systemctl", "stop", u), settles=(i,))
        return _if(is_active(ctx, u), stop, "not active")
    state, want = enabled_state(ctx, u), {"enable": "enabled", "mask": "masked"}[action]
    if state != want:
        return Step("skip", u, reason=f"is {state or 'unknown'}, not {want}", settles=(i,))
    verb = "disable" if action == "enable" else "unmask"
    return Step(verb, u, ("systemctl", verb, u), settles=(i,))


def _content_step(ctx: Context, i: int, e: dict[str, Any]) -> Step:
    """remove, restore, keep or skip for a file or link bootfsm wrote."""
    path, before = e["path"], e.get("before")
    host = ctx.host
    if e["kind"] == "link":
        now_ours = host.is_symlink(path) and host.readlink(path) == e["target"]
        gone = not host.is_symlink(path) and not host.exists(path)
    else:
        sha = None if host.is_symlink(path) else host.sha256(path)
        now_ours, gone = sha == e["sha256"], sha is None and not host.is_symlink(path)
    if gone:
        return Step("skip", path, reason="already gone", settles=(i,))
    if not now_ours and e.get("edit") and _undone(ctx, path, e["edit"]) is not None:
        why = "edited since: only bootfsm's imports edit is undone"
        return Step("unedit", path, reason=why, settles=(i,))
    if not now_ours:
        return Step("keep", path, reason="changed since bootfsm wrote it", settles=(i,))
    if before is None:
        return Step("remove", path, settles=(i,))
    if "link" in before:
        return Step("restore", path, reason=f"the link to {before['link']} it was", settles=(i,))
    if before.get("b64") is None:
        why = "it was there before bootfsm (over 1 MiB: its bytes were not kept)"
        return Step("keep", path, reason=why, settles=(i,))
    return Step("restore", path, reason="the bytes it had before bootfsm", settles=(i,))


def _undone(ctx: Context, path: str, edit: dict[str, Any]) -> str | None:
    text = ctx.host.read_text(path)
    return undo_import(text, edit) if text is not None else None


def _package_steps(ctx: Context, found: list[tuple[int, dict[str, Any]]]) -> list[Step]:
    out, names, settles = [], [], []
    for i, e in found:
        have = installed_version(ctx, e["name"])
        if have is None:
            out.append(Step("skip", e["name"], reason="not installed", settles=(i,)))
        elif have != e["version"]:
            why = f"now at {have}, not the {e['version']} bootfsm installed"
            out.append(Step("keep", e["name"], reason=why, settles=(i,)))
        else:
            names.append(e["name"])
            settles.append(i)
    if names:
        argv = ("dpkg", "--purge", *names)
        out.insert(0, Step("purge", " ".join(names), argv, settles=tuple(settles)))
    return out


def plan(ctx: Context, entries: Sequence[dict[str, Any]]) -> list[Step]:
    """The steps that undo ``entries`` on this node now, in order (read-only)."""
    host, steps = ctx.host, []
    markers = {marker_path(ctx.config), PEER_MARKER}
    packages = [(i, e) for i, e in enumerate(entries) if e["kind"] == "package"][::-1]
    last: list[Step] = []
    for i in reversed(range(len(entries))):
        e = entries[i]
        kind = e["kind"]
        if kind == "unit":
            steps.append(_unit_step(ctx, i, e))
        elif kind == "module":
            name = e["name"]
            unload = Step("unload", name, ("modprobe", "-r", name), settles=(i,))
            steps.append(_if(host.exists(f"/sys/module/{name}"), unload, "not loaded"))
        elif kind == "dkms":
            mv = f"{e['module']}/{e['version']}"
            argv = ("dkms", "remove", "-m", e["module"], "-v", e["version"], "--all")
            remove = Step("dkms-remove", mv, argv, settles=(i,))
            steps.append(_if(host.exists(f"{DKMS_TREE}/{mv}"), remove, "not in the DKMS tree"))
        elif kind == "package":
            if packages and packages[0][0] == i:  # the newest package: all purged here
                steps += _package_steps(ctx, packages)
        else:
            (last if e["path"] in markers else steps).append(_content_step(ctx, i, e))
    return steps + _after(ctx, entries, steps) + last


def _if(present: bool, step: Step, absent: str) -> Step:
    """``step``, or a skip of its target for the reason ``absent``."""
    return step if present else Step("skip", step.target, reason=absent, settles=step.settles)


def _after(ctx: Context, entries: Sequence[dict[str, Any]], steps: list[Step]) -> list[Step]:
    """The commands the removals call for, each once."""
    out: list[Step] = []
    gone = [s for s in steps if s.action in ("remove", "restore", "unedit")]
    for s in gone:
        argv = tuple(entries[s.settles[0]].get("then") or ())
        if argv and all(o.argv != argv for o in out):
            out.append(Step("run", argv[0], argv, reason=f"{s.target} changed"))
    if any("/systemd/" in s.target for s in gone):
        out.append(Step("daemon-reload", "systemd", ("systemctl", "daemon-reload")))
    if any(".so" in s.target.rsplit("/", 1)[-1] for s in gone):
        out.append(Step("ldconfig", "linker cache", ("ldconfig",)))
    unit = CONTAINERD.unit
    if any(s.target.startswith("/etc/containerd/") for s in gone) and CONTAINERD.running(ctx):
        out.append(Step("restart", unit, ("systemctl", "restart", unit)))
    return out


def _restore(ctx: Context, path: str, before: dict[str, Any]) -> None:
    if "link" in before:
        ctx.host.remove(path)
        ctx.host.symlink_atomic(before["link"], path)
        return
    data = base64.b64decode(before["b64"])
    ctx.host.write_atomic(path, data, int(before.get("mode", 0o644)))


def execute(
    ctx: Context,
    entries: list[dict[str, Any]],
    steps: Sequence[Step],
    on_step: Callable[[Step], None] | None = None,
) -> list[Step]:
    """Run ``steps``, dropping the records each settles; return the steps kept (warned).
    UNINSTALL_FAILED on the first failed command (the rest stays recorded)."""
    left = dict(enumerate(entries))
    kept: list[Step] = []
    for step in steps:
        ctx.event("uninstall.step", **{k: v for k, v in step.as_json().items() if k != "settles"})
        if on_step is not None:
            on_step(step)
        if not _do(ctx, step, entries, left):
            kept.append(step)
        for i in step.settles:
            left.pop(i, None)
        if step.settles:
            records.save(ctx.host, ctx.config, list(left.values()))
    return kept


def _do(ctx: Context, step: Step, entries: list[dict[str, Any]], left: dict[int, Any]) -> bool:
    """Carry out one step; False when its target is kept (with a warning)."""
    if step.action == "keep":
        ctx.warn(f"uninstall kept {step.target}: {step.reason}")
        return False
    if step.action == "remove":
        ctx.host.remove(step.target)
    elif step.action == "restore":
        _restore(ctx, step.target, entries[step.settles[0]]["before"])
    elif step.action == "unedit":
        undone = _undone(ctx, step.target, entries[step.settles[0]]["edit"])
        if undone is None:  # edited again since the plan: keep it
            ctx.warn(f"uninstall kept {step.target}: changed while uninstalling")
            return False
        st = ctx.host.stat(step.target)
        ctx.host.write_atomic(step.target, undone, st.st_mode & 0o7777 if st else 0o644)
    elif step.argv:
        _command(ctx, step, left)
    return True


def _command(ctx: Context, step: Step, left: dict[int, Any]) -> None:
    """Run a step's command; a module in use stays loaded (warned), else UNINSTALL_FAILED."""
    if step.action == "purge":
        wait_for_lock(ctx)
    r = ctx.run(list(step.argv), timeout=_TIMEOUTS.get(step.action, 60.0))
    if r.ok:
        return
    if step.action == "unload":
        ctx.warn(f"{step.target} stays loaded (in use?): {r.output.strip()[-200:]}")
        return
    records.save(ctx.host, ctx.config, list(left.values()))
    raise BootError(
        Code.UNINSTALL_FAILED,
        f"uninstall step {step.action} {step.target} failed: "
        f"`{' '.join(step.argv)}` exit {r.returncode}",
        output=r.output[-1500:],
    )


def run(
    ctx: Context, on_step: Callable[[Step], None] | None = None
) -> tuple[list[Step], list[Step]]:
    """Plan and execute the uninstall, journaled; return (steps, kept).
    UNINSTALL_FAILED as ``execute``, or for unreadable records."""
    entries = records.load(ctx.host, ctx.config)
    steps = plan(ctx, entries)
    ctx.event("uninstall.planned", durable=True, records=len(entries), steps=len(steps))
    kept = execute(ctx, entries, steps, on_step)
    done = [s for s in steps if s.action not in ("keep", "skip")]
    ctx.journal.event(
        "uninstall.done",
        durable=True,
        state=ctx.state,
        steps=len(done),
        kept=[s.target for s in kept],
    )
    return steps, kept
