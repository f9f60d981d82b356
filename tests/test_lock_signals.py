"""Single instance and signals, on real `bootfsm run` children and simulated nodes.

One run per node (flock; a second run exits 11 at once or waits, bounded); a lock left
by a SIGKILLed run never blocks. SIGTERM/SIGINT in every state, in a sleep (retry
backoff, fabric and kubelet waits), in an HTTP read and during a command: the run
stops its command's whole process group, journals what it interrupted, exits 12, and
the next run resumes to done. Each signal is sent once the child is provably at its
point (a request reached the mirror, a journal event, a process on /proc), never after
a guessed sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bootfsm.host.lock import NodeLock
from bootfsm.run.session import SessionResult
from bootfsm.sim.mirror import Fault, Stall, Status
from bootfsm.sim.nodestate import SIM_STATE
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, run_in_process

WAIT_S = 60.0  # a point not reached in this long fails the test instead of hanging it
LOCK = "var/lib/bootfsm/lock"


# -- observing a child run ------------------------------------------------------------
def wait_for(what: str, check: Callable[[], Any], proc: subprocess.Popen[str] | None) -> Any:
    """Poll ``check`` until truthy; fail early when ``proc`` exits first."""
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"run exited {proc.returncode} before {what}:\n{out}\n{err[-3000:]}")
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def events(w: World) -> list[dict[str, Any]]:
    """Events of the node's newest journal (last written: names sort by run id within
    a second)."""
    journals = w.journals()
    if not journals:
        return []
    newest = max(journals, key=lambda j: j.stat().st_mtime_ns)
    return [json.loads(line) for line in newest.read_text().splitlines() if line.endswith("}")]


def journaled(w: World, event: str, **fields: Any) -> Callable[[], bool]:
    """A check: the newest journal holds ``event`` with these fields."""
    return lambda: any(
        e["event"] == event and all(e.get(k) == v for k, v in fields.items()) for e in events(w)
    )


def node_procs(w: World, *needles: str, exclude: int = 0) -> list[int]:
    """Live processes whose command line names this node (stand-ins, shims), with every
    needle among their arguments; ``exclude`` is the run itself."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == exclude:
            continue
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(str(w.base) in a for a in args) and all(n in args for n in needles):
            found.append(int(pid))
    return found


def catches_sigterm(pid: int) -> bool:
    """True once process ``pid`` has a SIGTERM handler (the hung installer is hanging)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def holds_open(pid: int, path: Path) -> bool:
    """True when process ``pid`` has ``path`` open (it is inside NodeLock.acquire)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


def start(w: World, *extra: str, path_prefix: Path | None = None) -> subprocess.Popen[str]:
    """Start `bootfsm run` on the node as a child process."""
    env = w.env()
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    return subprocess.Popen(
        w.argv(*extra), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=WAIT_S)
    return proc.returncode, out, err


def clear_faults(w: World, *names: str) -> None:
    """Take node faults back out (the stand-ins read the sim state at every call)."""
    path = w.root / SIM_STATE
    data = json.loads(path.read_text())
    data["faults"] = [f for f in data["faults"] if f not in names]
    path.write_text(json.dumps(data))


def slow_shim(w: World, name: str, match: tuple[str, ...]) -> Path:
    """A PATH dir whose ``name`` blocks on a call with all ``match`` arguments: it starts
    a grandchild that ignores SIGTERM (same process group), then sleeps; other calls go
    to the stand-in. Returns the dir to put first on PATH."""
    shim_dir = w.base / f"shim-{name}"
    shim_dir.mkdir(exist_ok=True)
    stand_in = w.bin_dir / name  # else the real tool (dpkg-deb has no stand-in)
    real_tool = str(stand_in) if stand_in.exists() else shutil.which(name, path="/usr/bin:/bin")
    grandchild = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    )
    (shim_dir / name).write_text(
        f"#!{sys.executable}\nimport os, subprocess, sys, time\n"
        f"real = {real_tool!r}\n"
        f"if all(a in sys.argv[1:] for a in {list(match)!r}):\n"
        f"    args = [sys.executable, '-c', {grandchild!r}, 'grandchild', {str(w.base)!r}]\n"
        "    subprocess.Popen(args)\n"
        "    time.sleep(120)\n"
        "os.execv(real, [real, *sys.argv[1:]])\n"
    )
    (shim_dir / name).chmod(0o755)
    return shim_dir


def summary(out: str) -> str:
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return lines[0]


# -- SIGTERM / SIGINT in every state --------------------------------------------------
@dataclass(frozen=True)
class Point:
    """Where a signal lands: the world, what holds the run there, how to see it is there."""

    id: str
    sku: str
    state: str
    ready: Callable[[World, subprocess.Popen[str]], Callable[[], Any]]
    faults: tuple[str, ...] = ()
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    mirror: tuple[str, Fault] | None = None
    shim: tuple[str, tuple[str, ...]] | None = None
    command: str = ""  # basename of the command the signal must stop ('' = none running)
    sig: signal.Signals = signal.SIGTERM


def _requested(suffix: str) -> Callable[[World, subprocess.Popen[str]], Callable[[], Any]]:
    return lambda w, _p: lambda: w.mirror.requests(suffix) >= 1


def _grandchild(w: World, _p: subprocess.Popen[str]) -> Callable[[], Any]:
    return lambda: node_procs(w, "grandchild")


def _sleeping_after(event: str, cmd: str) -> Callable[[World, subprocess.Popen[str]], Any]:
    """A ``cmd`` run finished (journaled) after ``event`` and no command runs now: the
    run is in its poll sleep."""

    def ready(w: World, p: subprocess.Popen[str]) -> Callable[[], Any]:
        def check() -> bool:
            evs = events(w)
            after = next((i for i, e in enumerate(evs) if e["event"] == event), None)
            if after is None:
                return False
            probed = any(e["event"] == "command" and e["argv"][0] == cmd for e in evs[after:])
            return probed and not node_procs(w, exclude=p.pid)

        return check

    return ready


POINTS = (
    Point(
        "detect-imds-read",
        "h100-pcie",
        "detect",
        _requested("/metadata/instance"),
        overrides={"detect": {"imds_timeout": 60.0}},
        mirror=("/metadata/instance", Stall(60.0, times=1)),
        sig=signal.SIGINT,
    ),
    Point(
        "fetch-http-read",
        "h100-pcie",
        "fetch",
        _requested(".run"),
        # a download worker blocked in a stalled read stops at its read timeout
        overrides={"fetch": {"read_timeout": 2.0}},
        mirror=(".run", Stall(60.0)),  # every attempt stalls: the run stays in fetch
    ),
    Point(
        "fetch-retry-backoff",
        "h100-pcie",
        "fetch",
        lambda w, p: journaled(w, "state.retry", state="fetch"),
        overrides={"run": {"backoff_scale": 60.0}},
        mirror=(".run", Status(503, times=1)),
    ),
    Point(
        "driver-installer",
        "h100-pcie",
        "driver",
        lambda w, p: lambda: [q for q in node_procs(w, "--dkms") if catches_sigterm(q)],
        faults=("installer-hangs",),
        command="nvidia-installer",
    ),
    Point(
        "fabric-systemctl",
        "h100-hgx",
        "fabric",
        _grandchild,
        shim=("systemctl", ("start", "nvidia-fabricmanager.service")),
        command="systemctl",
    ),
    Point(
        "imex-dpkg",
        "gb300",
        "imex",
        _grandchild,
        # imex's first command: dpkg-deb building the runfile's nvidia-modprobe record
        shim=("dpkg-deb", ("--root-owner-group", "--build")),
        command="dpkg-deb",
    ),
    Point(
        "verify-fabric-wait",
        "gb300",
        "verify",
        _sleeping_after("fabric.waiting", "nvidia-smi"),
        faults=("fabric-in-progress-forever",),
        overrides={"verify": {"fabric_timeout": 60.0, "fabric_poll_interval": 30.0}},
    ),
    Point(
        "join-kubelet-wait",
        "h100-pcie",
        "join",
        _requested("/healthz"),
        faults=("kubelet-unhealthy",),
        overrides={"join": {"kubelet_timeout": 60.0, "kubelet_poll_interval": 30.0}},
    ),
)


@pytest.mark.parametrize("point", POINTS, ids=[p.id for p in POINTS])
def test_signal_stops_the_run_and_the_next_run_resumes(make_world: MakeWorld, point: Point) -> None:
    """The signal ends the run with 12 and a journal that says where; no process of
    the stopped command's group survives; a rerun ends done."""
    w = make_world(point.sku, faults=point.faults, config_overrides=point.overrides)
    if point.mirror:
        w.mirror.add_fault(*point.mirror)
    shim_dir = slow_shim(w, point.shim[0], point.shim[1]) if point.shim else None
    proc = start(w, path_prefix=shim_dir)
    wait_for(f"the run to reach {point.id}", point.ready(w, proc), proc)
    proc.send_signal(point.sig)
    rc, out, err = finish(proc)

    assert rc == 12, out + err[-2000:]
    line = summary(out)
    assert line.startswith(f"bootfsm: INTERRUPTED code=12 INTERRUPTED state={point.state}: ")
    assert f"interrupted by {point.sig.name} in state {point.state}" in line
    evs = events(w)
    assert evs[-1]["event"] == "run.end"
    assert (evs[-1]["outcome"], evs[-1]["code"], evs[-1]["state"]) == (
        "interrupted",
        12,
        point.state,
    )
    [what] = [e for e in evs if e["event"] == "run.interrupted"]
    assert what["signal"] == point.sig.name and what["state"] == point.state
    if point.command:
        assert os.path.basename(what["command"][0]) == point.command
    else:
        assert what["command"] == []
    checkpoint = json.loads((w.root / "var/lib/bootfsm/checkpoint.json").read_text())
    assert (checkpoint["outcome"], checkpoint["state"], checkpoint["code"]) == (
        "interrupted",
        point.state,
        12,
    )
    assert node_procs(w) == [], "a process of the stopped command survived"
    if point.command == "nvidia-installer":  # it saw SIGTERM first, not just SIGKILL
        assert [c["rc"] for c in w.calls() if c["cmd"] == "nvidia-installer"][-1] == -15

    clear_faults(w, *point.faults)
    w.mirror.clear_faults()
    again = run_in_process(w)
    assert again.outcome.ok, again.outcome
    if point.state not in ("detect", "fetch"):  # resumed: finished work is not redone
        assert journaled(w, "state.skip", state="fetch")()


def test_signal_between_states(make_world: MakeWorld) -> None:
    """A signal right after a transition: the terminal event names the next state as
    not started; the rerun ends done."""
    w = make_world("h100-pcie")

    def on_state(state: str) -> None:
        if state == "driver":
            os.kill(os.getpid(), signal.SIGTERM)

    result: SessionResult = run_in_process(w, on_state=on_state)
    assert result.outcome.code == 12 and result.outcome.state == "driver"
    assert "between states (fetch done, driver not started)" in result.outcome.message
    [what] = [e for e in events(w) if e["event"] == "run.interrupted"]
    assert what["between_states"] is True and what["command"] == []
    assert not any(e["event"] == "state.enter" and e["state"] == "driver" for e in events(w))
    assert run_in_process(w).outcome.ok


# -- one run per node -----------------------------------------------------------------
def test_second_run_exits_at_once_or_waits_bounded(make_world: MakeWorld) -> None:
    """While run A holds the node: B exits 11 at once (no journal), B with --wait-lock 1
    still exits 11, B with a longer --wait-lock waits, takes over when A is stopped,
    resumes and ends done."""
    w = make_world("h100-pcie", faults=("installer-hangs",))
    a = start(w)
    wait_for("A in the driver build", lambda: node_procs(w, "--dkms"), a)
    journals = len(w.journals())

    b = w.run_cli("--wait-lock", "0")
    assert b.returncode == 11
    line = summary(b.stdout)
    assert line.startswith("bootfsm: FAILED code=11 ANOTHER_RUN_IN_PROGRESS state=-: ")
    assert f"(pid {a.pid})" in line and "--wait-lock" in line  # who holds it, what to do
    assert w.run_cli("--wait-lock", "1").returncode == 11
    assert len(w.journals()) == journals  # a refused run writes no journal

    clear_faults(w, "installer-hangs")
    c = start(w, "--wait-lock", "120")
    wait_for("C waiting on the lock", lambda: holds_open(c.pid, w.root / LOCK), c)
    a.send_signal(signal.SIGTERM)
    assert finish(a)[0] == 12
    rc, out, err = finish(c)
    assert rc == 0, out + err[-2000:]
    assert summary(out).startswith("bootfsm: OK code=0 OK state=done")


def test_signal_while_waiting_for_the_lock(make_world: MakeWorld, tmp_path: Path) -> None:
    """SIGTERM during --wait-lock: exit 12 at once, saying it was waiting for the lock."""
    w = make_world("h100-pcie")
    holder = NodeLock(w.root / LOCK)
    assert holder.acquire()
    try:
        b = start(w, "--wait-lock", "120")
        wait_for("B waiting on the lock", lambda: holds_open(b.pid, w.root / LOCK), b)
        b.send_signal(signal.SIGTERM)
        rc, out, _ = finish(b)
    finally:
        holder.release()
    assert rc == 12
    assert "while waiting for the node lock" in summary(out)
    assert w.journals() == []


def test_stale_lock_of_a_killed_run_never_blocks(make_world: MakeWorld) -> None:
    """SIGKILL the holder mid-download: its lock file still names it, but the flock
    died with it, so the next run takes the lock at once and ends done."""
    w = make_world("h100-pcie")
    w.mirror.add_fault(".run", Stall(60.0, times=1))
    a = start(w)
    wait_for("A downloading", lambda: w.mirror.requests(".run") >= 1, a)
    a.send_signal(signal.SIGKILL)
    assert finish(a)[0] == -signal.SIGKILL
    assert NodeLock(w.root / LOCK).holder() == str(a.pid)  # the stale file is still there
    assert not any(e["event"] == "run.end" for e in events(w))  # it really crashed
    b = w.run_cli("--wait-lock", "0")
    assert b.returncode == 0, b.stdout + b.stderr[-2000:]
    assert summary(b.stdout).startswith("bootfsm: OK code=0")


def test_lock_in_process_is_exclusive_and_released(tmp_path: Path) -> None:
    """NodeLock: exclusive between holders, bounded wait, records the holder's pid."""
    path = tmp_path / "state/lock"
    first, second = NodeLock(path), NodeLock(path, sleep=lambda s: None)
    assert first.acquire()
    assert first.holder() == str(os.getpid())
    assert not second.acquire(0.0)
    assert not second.acquire(0.05)  # bounded: gives up
    first.release()
    assert second.acquire(0.0)
    second.release()


@pytest.fixture(autouse=True)
def _no_stray_children(tmp_path: Path) -> Iterator[None]:
    """Belt and braces: a failing test must not leave its hung stand-ins behind (only
    processes started for this test's nodes, under its tmp_path, are touched)."""
    yield
    mine = str(tmp_path).encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if mine in args and int(pid) != os.getpid():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
