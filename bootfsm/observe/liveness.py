"""Is a run still alive? Tells "in progress" from "killed" without taking the node lock.

Holders are read from ``/proc/locks``: taking the lock, even for an instant, could make a
run starting at that moment exit 11. Without ``/proc/locks`` the pid is probed (signal 0)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from bootfsm.core.errors import BootError
from bootfsm.host.host import Host

if TYPE_CHECKING:  # a run reads boot_id from here; it never loads the trace reader
    from bootfsm.observe.trace import TraceReport

__all__ = ["annotate", "boot_id", "lock_holders", "pid_exists", "run_alive"]

PROC_LOCKS = Path("/proc/locks")


def lock_holders(lock: Path, proc_locks: Path = PROC_LOCKS) -> set[int] | None:
    """Pids holding an flock on ``lock`` (empty: nobody); None when it cannot be told."""
    try:
        st = os.stat(lock)
    except FileNotFoundError:
        return set()
    except OSError:
        return None
    try:
        table = proc_locks.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    exact: set[int] = set()
    by_inode: set[int] = set()
    for line in table.splitlines():
        held = _flock(line)
        if held is None or held[2] != st.st_ino:
            continue
        pid, dev, _ = held
        by_inode.add(pid)
        if dev == (os.major(st.st_dev), os.minor(st.st_dev)):
            exact.add(pid)
    # overlay filesystems report another device than stat(); trust the inode alone then
    return exact or by_inode


def _flock(line: str) -> tuple[int, tuple[int, int] | None, int] | None:
    """(pid, device, inode) of "1: FLOCK  ADVISORY  WRITE 28018 fe:00:2148802 0 EOF" (/proc/locks);
    None for any other line (POSIX lock, "->" waiter); pid -1, device None when unreadable."""
    parts = line.split()
    if len(parts) < 6 or parts[1] != "FLOCK" or parts[2] == "->":
        return None
    dev_ino = parts[5].split(":")
    if len(dev_ino) != 3 or not dev_ino[2].isdigit():
        return None
    pid = int(parts[4]) if parts[4].isdigit() else -1
    try:
        dev: tuple[int, int] | None = (int(dev_ino[0], 16), int(dev_ino[1], 16))
    except ValueError:
        dev = None
    return pid, dev, int(dev_ino[2])


def pid_exists(pid: int) -> bool | None:
    """True/False when signal 0 can tell; None when it cannot."""
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return None
    return True


def run_alive(lock: Path, pid: int | None) -> bool | None:
    """Is the run with ``pid`` still running on the node whose lock file is ``lock``?"""
    holders = lock_holders(lock)
    if holders is not None:
        if not holders:
            return False  # nobody holds the lock: no run is in progress
        if pid is None:
            return None
        return pid in holders or -1 in holders
    return pid_exists(pid) if pid is not None else None


def annotate(report: TraceReport, lock: Path) -> TraceReport:
    """Turn a report without ``run.end`` into ``running`` (alive) or ``killed`` (not)."""
    if report.outcome != "running":
        return report
    alive = run_alive(lock, report.pid)
    report.alive = alive
    note = f"{report.source}: no run.end event: the run is still in progress or was killed"
    report.warnings = [w for w in report.warnings if w != note]
    if alive is False:
        report.outcome = "killed"
        for s in report.spans:
            if s.outcome == "running":
                s.outcome = "interrupted"
        report.warnings.append(
            f"{report.source}: no run.end and no process holds the node lock: the run was "
            "killed, crashed or the node lost power"
        )
    elif alive is True:
        report.warnings.append(f"{report.source}: run in progress (pid {report.pid})")
    else:
        report.warnings.append(note + " (cannot tell which)")
    return report


def boot_id(host: Host) -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``, new at every boot); '' if unknown."""
    try:
        return (host.read_text("/proc/sys/kernel/random/boot_id") or "").strip()
    except BootError:
        return ""
