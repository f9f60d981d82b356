"""The host boundary: node paths, atomic writes, bounded commands."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.host.host import OUTPUT_TAIL_BYTES, Host


def test_node_paths_stay_under_root(tmp_path: Path) -> None:
    h = Host(tmp_path)
    assert h.path("/etc/os-release") == tmp_path / "etc/os-release"
    with pytest.raises(ValueError):
        h.path("/etc/../../escape")
    with pytest.raises(ValueError):
        h.path("relative")


def test_write_atomic_replaces_whole_file_with_mode(tmp_path: Path) -> None:
    h = Host(tmp_path)
    h.write_atomic("/var/lib/x/state.json", "one", mode=0o600)
    h.write_atomic("/var/lib/x/state.json", "two", mode=0o600)
    p = tmp_path / "var/lib/x/state.json"
    assert p.read_text() == "two"
    assert p.stat().st_mode & 0o777 == 0o600
    assert [q.name for q in p.parent.iterdir()] == ["state.json"]  # no temp left


def test_missing_command_has_its_code(tmp_path: Path) -> None:
    h = Host(tmp_path, env={"PATH": str(tmp_path)})
    with pytest.raises(BootError) as info:
        h.run(["nvidia-smi"], timeout=5)
    assert info.value.code is Code.COMMAND_MISSING


def _script(tmp_path: Path, name: str, body: str) -> None:
    p = tmp_path / name
    p.write_text(f"#!{sys.executable}\n{body}\n")
    p.chmod(0o755)


def test_output_capture_is_bounded(tmp_path: Path) -> None:
    _script(tmp_path, "chatty", "import sys\nsys.stdout.write('x' * 5_000_000 + 'END')")
    h = Host(tmp_path, env={"PATH": str(tmp_path)})
    r = h.run(["chatty"], timeout=30)
    assert r.ok and len(r.output) == 5_000_003 and len(r.tail) == OUTPUT_TAIL_BYTES  # whole


def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    _script(
        tmp_path,
        "hang",
        "import subprocess, sys, time\n"
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(60)",
    )
    h = Host(tmp_path, env={"PATH": str(tmp_path)})
    r = h.run(["hang"], timeout=1.0)
    assert r.timed_out and not r.ok
    child = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(child, 0)
            import time

            time.sleep(0.1)


def test_commands_are_recorded(tmp_path: Path) -> None:
    _script(tmp_path, "hello", "print('hi'); raise SystemExit(3)")
    seen = []
    h = Host(tmp_path, env={"PATH": str(tmp_path)})
    h.on_command = seen.append
    r = h.run(["hello", "--flag"], timeout=10)
    assert r.returncode == 3 and r.output.strip() == "hi"
    assert seen[0].argv == ("hello", "--flag") and seen[0].duration_s >= 0


def test_lock_probe_sees_a_held_posix_lock(tmp_path: Path) -> None:
    import fcntl
    import subprocess

    h = Host(tmp_path)
    h.write_atomic("/var/lib/dpkg/lock-frontend", "")
    assert h.lock_is_free("/var/lib/dpkg/lock-frontend")
    lock = tmp_path / "var/lib/dpkg/lock-frontend"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(lock)!r}, os.O_RDWR)\n"
            "fcntl.lockf(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert not h.lock_is_free("/var/lib/dpkg/lock-frontend")
    finally:
        holder.kill()
        holder.wait()
    assert fcntl  # imported for clarity of what is probed


def _sleepers(tag: str) -> list[int]:
    """pids of `sleep TAG` processes."""
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            if len(argv) > 1 and argv[0].endswith(b"sleep") and argv[1] == tag.encode():
                out.append(int(d))
        except (OSError, ValueError):
            continue
    return out


@pytest.mark.parametrize(("die_with_bootfsm", "survives"), [(True, False), (False, True)])
def test_a_command_dies_with_bootfsm_unless_it_is_a_read_only_probe(
    die_with_bootfsm: bool, survives: bool
) -> None:
    """bootfsm SIGKILLed mid-command: an action (the default) gets the parent-death
    SIGKILL; a probe (``die_with_bootfsm=False``, how Context.run starts ``probe=True``
    commands, vfork-fast) is left to finish on its own."""
    import signal
    import subprocess
    import time

    # a `sleep` nobody else runs, long past the 5 s watched below whatever the pid
    tag = f"{1000 + os.getpid() % 1000}.{int(die_with_bootfsm)}7"
    code = (
        "from pathlib import Path; from bootfsm.host.host import Host; "
        f"Host(Path('/')).run(['sleep', {tag!r}], timeout=60, die_with_bootfsm={die_with_bootfsm})"
    )
    boot = subprocess.Popen([sys.executable, "-c", code])
    try:
        end = time.monotonic() + 20
        while not _sleepers(tag) and time.monotonic() < end:
            time.sleep(0.02)
        assert len(_sleepers(tag)) == 1
        boot.send_signal(signal.SIGKILL)
        boot.wait(timeout=10)
        end = time.monotonic() + 5
        while _sleepers(tag) and time.monotonic() < end:
            time.sleep(0.02)
        assert bool(_sleepers(tag)) is survives
    finally:
        for pid in _sleepers(tag):
            os.kill(pid, signal.SIGKILL)


def test_context_starts_probes_untied_and_actions_tied_to_bootfsm(tmp_path: Path) -> None:
    from bootfsm.core.config import parse_config
    from bootfsm.machine.context import Context
    from bootfsm.observe.journal import Journal

    seen: list[bool] = []

    class Recording(Host):
        def run(self, argv, *, timeout, die_with_bootfsm=True, **kw):  # type: ignore[no-untyped-def,override]
            seen.append(die_with_bootfsm)
            return super().run(argv, timeout=timeout, die_with_bootfsm=die_with_bootfsm, **kw)

    ctx = Context.create(parse_config({}), Recording(tmp_path), Journal(None, run_id="t"))
    ctx.run(["true"], timeout=10, probe=True)
    ctx.run(["true"], timeout=10)
    ctx.require(["true"], code=Code.HOST_IO_ERROR, timeout=10)
    ctx.run(["true"], timeout=10, die_with_bootfsm=False)  # a reader that is no probe
    ctx.require(["true"], code=Code.HOST_IO_ERROR, timeout=10, die_with_bootfsm=False)
    assert seen == [False, True, True, False, False]


def test_systemctl_verbs_are_not_tied_to_bootfsm(tmp_path: Path) -> None:
    """`systemctl start` asks PID 1, which carries the job out whether systemctl lives or
    not, so killing it with bootfsm would save nothing: it starts untied (vfork)."""
    from bootfsm.core.config import parse_config
    from bootfsm.install.units import systemctl
    from bootfsm.machine.context import Context
    from bootfsm.observe.journal import Journal

    seen: list[tuple[str, bool]] = []

    class Recording(Host):
        def run(self, argv, *, timeout, die_with_bootfsm=True, **kw):  # type: ignore[no-untyped-def,override]
            seen.append((argv[1], die_with_bootfsm))
            return super().run(argv, timeout=timeout, die_with_bootfsm=die_with_bootfsm, **kw)

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "systemctl").chmod(0o755)
    host = Recording(tmp_path, env={"PATH": str(bin_dir)})
    ctx = Context.create(parse_config({}), host, Journal(None, run_id="t"))
    systemctl(ctx, "start", "kubelet.service", code=Code.KUBELET_NOT_HEALTHY)
    systemctl(ctx, "daemon-reload", code=Code.KUBELET_NOT_HEALTHY)
    assert seen == [("start", False), ("daemon-reload", False)]


@pytest.mark.parametrize("die_with_bootfsm", [True, False])
def test_spawn_s_is_bootfsms_part_of_a_commands_duration(
    tmp_path: Path, die_with_bootfsm: bool
) -> None:
    """``spawn_s`` ends at the command's exec: a command that sleeps 0.3 s has a
    duration past 0.3 s and a spawn a small part of it, whichever way it started."""
    r = Host(tmp_path).run(["sleep", "0.3"], timeout=10, die_with_bootfsm=die_with_bootfsm)
    assert r.ok and r.duration_s >= 0.3
    assert 0 < r.spawn_s <= r.duration_s - 0.3, r
