"""Host faults: full disks, read-only state, corrupt files, clock jumps, missing or noisy
commands. Each ends with its documented exit code and a message naming the problem, or
the run recovers; nothing it had is lost.

Disk faults mount a small tmpfs over one node directory (the tests run as root on the
CI machine; they skip with the reason where mounting is not permitted).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.host.host import Host
from bootfsm.observe.trace import latest_journal, load_run
from bootfsm.run import session
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, run_in_process

STATE_DIR = "var/lib/bootfsm"
CACHE_DIR = "var/cache/bootfsm"
LOG_DIR = "var/log/bootfsm"
YEAR = 365 * 24 * 3600.0

Mount = Callable[..., Path]


@pytest.fixture
def tmpfs() -> Iterator[Mount]:
    """mount(path, size=None, ro=False): a tmpfs over ``path``, unmounted afterwards."""
    mounted: list[Path] = []

    def mount(path: Path, *, size: str | None = None, ro: bool = False) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        opts = ",".join(["mode=0700", *([f"size={size}"] if size else []), *(["ro"] * ro)])
        try:
            r = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                capture_output=True,
                text=True,
                check=False,
            )
        except FileNotFoundError:
            pytest.skip("no mount(8) on this machine")
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for p in reversed(mounted):
        subprocess.run(["umount", "-l", str(p)], check=False)


def remount(path: Path, size: str) -> None:
    """Give a mounted tmpfs more room (an operator freeing space)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


def cli(
    w: World, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`bootfsm run` (or another command with ``args``) on the world's node."""
    argv = w.argv() if not args else [sys.executable, "-m", "bootfsm", *args]
    return subprocess.run(
        argv, env=env or w.env(), capture_output=True, text=True, timeout=120, check=False
    )


def checkpoint(w: World) -> dict[str, Any]:
    return dict(json.loads((w.root / STATE_DIR / "checkpoint.json").read_text()))


def assert_clean_failure(r: subprocess.CompletedProcess[str], code: Code, *needles: str) -> None:
    """Exit code ``code``, the summary names it and each needle, no traceback anywhere."""
    assert r.returncode == code, r.stdout + r.stderr
    assert f"code={int(code)} {code.name}" in r.stdout, r.stdout
    for needle in needles:
        assert needle in r.stdout, r.stdout
    assert "Traceback" not in r.stdout + r.stderr


# -- full disks and read-only directories ---------------------------------------------
def test_cache_full_while_downloading_then_recovers(make_world: MakeWorld, tmpfs: Mount) -> None:
    """A full cache fails INSUFFICIENT_SPACE with bytes named; freed space, the rerun ends done."""
    w = make_world("h100-pcie")
    cache = tmpfs(w.root / CACHE_DIR, size="64k")
    r = cli(w)
    assert_clean_failure(r, Code.INSUFFICIENT_SPACE, "free")
    verified = [p for p in cache.glob("*/*") if not p.name.endswith((".part", ".part.meta"))]
    assert all(not p.name.endswith(".run") for p in verified), "a partial runfile got its name"
    remount(cache, "16m")
    again = cli(w)
    assert again.returncode == 0, again.stdout + again.stderr
    assert checkpoint(w)["outcome"] == "done"


def test_journal_disk_full_run_goes_on(make_world: MakeWorld, tmpfs: Mount) -> None:
    """The journal filling its disk warns once; the run ends done and the stub still reads."""
    w = make_world("h100-pcie")
    tmpfs(w.root / LOG_DIR, size="8k")
    r = cli(w)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "journal write failed, continuing without" in r.stderr
    assert checkpoint(w)["outcome"] == "done"  # the outcome is not lost
    [journal] = w.journals()
    report = load_run(journal)
    assert report.events > 0 and report.outcome == "running"
    assert any("no run.end" in x for x in report.warnings)
    trace = cli(w, "trace", "--root", str(w.root))
    assert trace.returncode == 0 and "warning" in trace.stdout, trace.stdout + trace.stderr


def test_read_only_log_dir_runs_console_only(make_world: MakeWorld, tmpfs: Mount) -> None:
    """No journal possible: the run says so and still provisions (checkpoint records it)."""
    w = make_world("h100-pcie")
    tmpfs(w.root / LOG_DIR, ro=True)
    r = cli(w)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "journal unavailable" in r.stderr and "console only" in r.stderr
    assert checkpoint(w)["outcome"] == "done"


def test_read_only_state_dir_is_host_io_error(make_world: MakeWorld, tmpfs: Mount) -> None:
    """A read-only state directory fails at once with HOST_IO_ERROR, naming the directory."""
    w = make_world("h100-pcie")
    tmpfs(w.root / STATE_DIR, ro=True)
    r = cli(w)
    assert_clean_failure(r, Code.HOST_IO_ERROR, "node lock", "Read-only file system", STATE_DIR)
    assert not w.calls(), "nothing may run without the node lock"


def test_full_state_dir_is_host_io_error_then_recovers(make_world: MakeWorld, tmpfs: Mount) -> None:
    """No room for resolved.json: HOST_IO_ERROR 'disk full'; no temp left; then done."""
    w = make_world("h100-pcie")
    state = tmpfs(w.root / STATE_DIR, size="4k")
    r = cli(w)
    assert_clean_failure(r, Code.HOST_IO_ERROR, "disk full")
    assert not list(state.glob(".*.tmp")), "a failed atomic write left its temporary file"
    remount(state, "16m")
    again = cli(w)
    assert again.returncode == 0, again.stdout + again.stderr


# -- corrupt files --------------------------------------------------------------------
def test_corrupt_checkpoint_is_absent_with_a_warning(make_world: MakeWorld) -> None:
    """A torn, truncated or empty checkpoint never breaks a run; status warns and uses
    the journal instead."""
    w = make_world("h100-pcie")
    cp = w.root / STATE_DIR / "checkpoint.json"
    cp.parent.mkdir(parents=True)
    cp.write_bytes(b'{"run_id": "0bad", "state": "dri\x00\xff')
    r = cli(w)
    assert r.returncode == 0, r.stdout + r.stderr
    whole = cp.read_text()
    assert checkpoint(w)["outcome"] == "done"
    for broken in (whole[: len(whole) // 2], "", "[1, 2]"):
        cp.write_text(broken)
        st = cli(w, "status", "--root", str(w.root))
        assert st.returncode == 0, st.stdout + st.stderr
        assert "done" in st.stdout
        assert "checkpoint.json is unreadable" in st.stderr and "treated as absent" in st.stderr


CONFIGS = {
    "unclosed table": (b"[run\ndeadline = 1\n", "invalid TOML"),
    "cut mid-string": (b'[sources]\nrunfile_base = "https://mirr', "invalid TOML"),
    "binary garbage": (b"\xff\xfe\x00[run]\x00\x9c", "not UTF-8"),
    "wrong type": (b'[run]\ndeadline = "soon"\n', "run.deadline"),
    "unknown section": (b"[nope]\n", "unknown section [nope]"),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_corrupt_config_is_config_invalid(tmp_path: Path, name: str) -> None:
    """Any broken config exits 10 with a message naming the file and the problem."""
    body, needle = CONFIGS[name]
    path = tmp_path / "etc/bootfsm/config.toml"
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    r = subprocess.run(
        [sys.executable, "-m", "bootfsm", "run", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = r.stdout + r.stderr
    assert r.returncode == Code.CONFIG_INVALID, out
    assert "config invalid" in out and str(path) in out and needle in out
    assert "Traceback" not in out


# -- clocks ---------------------------------------------------------------------------
def test_wall_clock_jumping_back_changes_nothing(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wall clock a year back that keeps jumping back (RTC reset, then NTP fights) leaves
    the outcome alone and never costs the run its journal (prune keeps the newest)."""
    w = make_world("h100-pcie", config_overrides={"run": {"keep_journals": 1}})
    first = run_in_process(w)
    assert first.outcome.ok
    calls = iter(range(1, 1_000_000))

    def wall() -> float:
        return time.time() - YEAR - 3600.0 * next(calls)

    def host(root: Path | str, *, env: Any = None) -> Host:
        return Host(root, env=env, wall=wall)

    monkeypatch.setattr(session, "Host", host)
    second = run_in_process(w)
    assert second.outcome.ok, second.outcome
    assert second.journal is not None and second.journal.exists(), "the run's journal was pruned"
    assert latest_journal(w.root / LOG_DIR) == second.journal
    assert w.journals() == [second.journal]
    assert load_run(second.journal).run_id == second.run_id


def test_journal_names_sort_in_start_order(tmp_path: Path) -> None:
    """Two runs in one second, or a clock set back: the new name still sorts last."""
    t = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    stamp = session.journal_stamp([], "run", t)
    assert stamp == "20270115T080000Z"
    names = [f"run-{stamp}-ffffffff.jsonl"]
    same_second = session.journal_stamp(names, "run", t + 0.5)
    back_a_year = session.journal_stamp(names, "run", t - YEAR)
    assert same_second == back_a_year == "20270115T080001Z"
    # each kind keeps its own order: a bake journal does not move a run's stamp
    assert session.journal_stamp(names, "bake", t) == "20270115T080000Z"
    names.append("run-garbage.jsonl")  # a name bootfsm did not make
    assert session.journal_stamp(names, "run", t) == "20270115T080000Z"


def test_deadlines_follow_the_monotonic_clock(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only host.monotonic moves deadlines: jumping it past the deadline in driver ends
    DEADLINE_EXCEEDED there (and the wall-clock test above shows wall jumps do not)."""
    w = make_world("h100-pcie")
    jumped: list[str] = []

    def mono() -> float:
        return time.monotonic() + (10_000.0 if jumped else 0.0)

    def host(root: Path | str, *, env: Any = None) -> Host:
        return Host(root, env=env, monotonic=mono)

    monkeypatch.setattr(session, "Host", host)
    result = run_in_process(w, on_state=lambda dest: jumped.append(dest) if dest == "driver" else 0)
    assert result.outcome.code is Code.DEADLINE_EXCEEDED, result.outcome
    assert result.outcome.state == "driver"
    assert "global deadline" in result.outcome.message


def test_no_deadline_reads_the_wall_clock() -> None:
    """The modules that compute deadlines and waits never read the wall clock."""
    root = Path(__file__).resolve().parents[1]
    for rel in (
        "bootfsm/core/deadline.py",
        "bootfsm/machine/context.py",
        "bootfsm/machine/engine.py",
    ):
        text = (root / rel).read_text()
        for wall in ("time.time(", ".wall(", "datetime.now(", "time.time\n"):
            assert wall not in text, f"{rel} reads the wall clock ({wall.strip()})"
    assert "monotonic" in (root / "bootfsm/core/deadline.py").read_text()


# -- commands -------------------------------------------------------------------------
def _path_without(w: World, name: str) -> dict[str, str]:
    env = w.env()
    system = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if d != str(w.bin_dir))
    if shutil.which(name, path=system):
        pytest.skip(f"this machine has a real {name} on PATH")
    return env


def test_command_missing_from_path(make_world: MakeWorld) -> None:
    """A tool the image lacks ends COMMAND_MISSING, naming the tool; nothing after it runs."""
    w = make_world("h100-pcie")
    env = _path_without(w, "update-initramfs")
    (w.bin_dir / "update-initramfs").unlink()
    r = cli(w, env=env)
    assert_clean_failure(r, Code.COMMAND_MISSING, "update-initramfs", "state=driver")
    assert not [c for c in w.calls() if c["cmd"] in ("dpkg", "nvidia-installer")]


_NOISY = """\
#!{python}
import os, sys
chunk = ("x" * 1023 + "\\n").encode()
for _ in range({kib}):
    sys.stdout.buffer.write(chunk)
sys.stdout.buffer.write(b"LAST LINE OF {what}\\n")
sys.stdout.flush()
if {rc}:
    sys.exit({rc})
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""


def _noisy(w: World, name: str, rc: int, tmp: Path) -> dict[str, str]:
    """Wrap stand-in ``name`` so it prints 5 MiB first (and fails with ``rc`` if set)."""
    wrap = tmp / "noisy"
    wrap.mkdir()
    script = wrap / name
    script.write_text(
        _NOISY.format(
            python=sys.executable, kib=5 << 10, what=name, rc=rc, real=str(w.bin_dir / name)
        )
    )
    script.chmod(0o755)
    env = w.env()
    env["PATH"] = f"{wrap}{os.pathsep}{env['PATH']}"
    return env


def _longest_line(journal: Path) -> int:
    return max(len(line) for line in journal.read_text().splitlines())


def test_command_printing_megabytes_is_bounded(make_world: MakeWorld, tmp_path: Path) -> None:
    """5 MiB of output: the run goes on, the journal keeps a small tail, its lines stay small."""
    w = make_world("h100-pcie")
    r = cli(w, env=_noisy(w, "update-initramfs", 0, tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    [journal] = w.journals()
    events = [json.loads(x) for x in journal.read_text().splitlines()]
    [cmd] = [e for e in events if e.get("argv", [""])[0] == "update-initramfs"]
    assert "LAST LINE OF update-initramfs" in cmd["output"] and len(cmd["output"]) <= 4096
    assert _longest_line(journal) < 16 << 10
    assert len(r.stderr) < 64 << 10  # the console does not get the megabytes either


def test_failing_command_printing_megabytes(make_world: MakeWorld, tmp_path: Path) -> None:
    """A failing noisy command: its code, the tail of its output in message and trace,
    a one-line summary and small journal lines."""
    w = make_world("h100-pcie")
    r = cli(w, env=_noisy(w, "update-initramfs", 3, tmp_path))
    assert_clean_failure(r, Code.DRIVER_INSTALL_FAILED, "update-initramfs")
    assert len(r.stdout) < 4096
    [journal] = w.journals()
    assert _longest_line(journal) < 16 << 10
    trace = cli(w, "trace", "--root", str(w.root))
    assert trace.returncode == 0 and "LAST LINE OF update-initramfs" in trace.stdout
    assert len(trace.stdout) < 32 << 10


# -- temporaries of killed runs -------------------------------------------------------
def test_next_write_removes_temporaries_a_killed_run_left(tmp_path: Path) -> None:
    """A SIGKILL mid-write can leave `.NAME.*.tmp` (or `.NAME.*.lnk`): the next write of
    NAME removes them, so a rerun leaves the node clean (the crash matrix found this)."""
    h = Host(tmp_path)
    d = tmp_path / "etc/modprobe.d"
    d.mkdir(parents=True)
    stale = [d / ".blacklist-nouveau.conf.k1ll3d.tmp", d / ".libnvfm.so.4242.lnk"]
    other = d / ".other.conf.x.tmp"  # another target's temporary is not ours to judge
    for p in [*stale, other]:
        p.write_text("half")
    h.write_atomic("/etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\n")
    h.symlink_atomic("libnvfm.so.1", "/etc/modprobe.d/libnvfm.so")
    assert sorted(p.name for p in d.iterdir()) == [
        ".other.conf.x.tmp",
        "blacklist-nouveau.conf",
        "libnvfm.so",
    ]
