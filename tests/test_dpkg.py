"""dpkg: both of its locks are waited on, an interrupted dpkg is repaired before the
next install. Checked against the real dpkg (``--root`` on a test directory) and real
POSIX lock holders, as dpkg itself takes them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.config import parse_config
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host
from bootfsm.install import dpkg
from bootfsm.install.dpkg import parse_query
from bootfsm.machine.context import Context
from bootfsm.observe.journal import Journal
from tests.conftest import MakeWorld, run_in_process

REAL_DPKG = shutil.which("dpkg", path="/usr/bin:/bin")
needs_dpkg = pytest.mark.skipif(REAL_DPKG is None, reason="the real dpkg is not installed")

_HOLD = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)\n"
    "fcntl.lockf(fd, fcntl.LOCK_EX)\n"  # F_SETLKW, the POSIX lock dpkg takes
    "print('locked', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
)


@contextmanager
def holding(path: Path, seconds: float = 60.0) -> Iterator[subprocess.Popen[str]]:
    """A real process holding a POSIX lock on ``path`` for ``seconds``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _ctx(root: Path, *, timeout: float = 1.5, path: str | None = None) -> Context:
    cfg = parse_config({"driver": {"dpkg_lock_timeout": timeout}})
    env = {**os.environ, **({"PATH": path} if path else {})}
    return Context.create(cfg, Host(root, env=env), Journal(None, run_id="test"))


def _stanza(name: str, state: str, version: str = "1.0") -> str:
    return (
        f"Package: {name}\nStatus: install ok {state}\nPriority: optional\nSection: misc\n"
        f"Maintainer: Test <t@example.com>\nArchitecture: all\nVersion: {version}\n"
        f"Description: {name} for the test\n"
    )


def _admin(root: Path, status: list[str], journal: list[str] = ()) -> Path:  # type: ignore[assignment]
    """A dpkg database under root/var/lib/dpkg with list and md5sums files for each
    package, so that only the states under test show in `dpkg --audit`."""
    admin = root / "var/lib/dpkg"
    (admin / "info").mkdir(parents=True, exist_ok=True)
    (admin / "updates").mkdir(exist_ok=True)
    (admin / "available").touch()
    (admin / "status").write_text("\n".join(status))
    for i, stanza in enumerate(journal):
        (admin / "updates" / f"{i:04d}").write_text(stanza)
    for text in [*status, *journal]:
        name = text.split("\n", 1)[0].removeprefix("Package: ")
        (admin / f"info/{name}.list").write_text("/.\n")
        (admin / f"info/{name}.md5sums").write_text("")
    return admin


def _real_dpkg_on_path(tmp_path: Path, root: Path) -> str:
    """A PATH whose `dpkg` is the real dpkg pointed at ``root`` (--root)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "dpkg"
    shim.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        f"os.execv({REAL_DPKG!r}, ['dpkg', '--root={root}', *sys.argv[1:]])\n"
    )
    shim.chmod(0o755)
    return f"{bin_dir}:{os.environ.get('PATH', '')}"


# -- locks ---------------------------------------------------------------------------------


def test_waits_on_the_database_lock_too(tmp_path: Path) -> None:
    """A process holding only var/lib/dpkg/lock (as dpkg does mid-transaction): bootfsm
    waits the whole dpkg_lock_timeout, then DPKG_LOCK_TIMEOUT naming that lock."""
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/lock-frontend").touch()
    with holding(tmp_path / "var/lib/dpkg/lock"):
        t0 = time.monotonic()
        with pytest.raises(BootError) as err:
            dpkg.wait_for_lock(_ctx(tmp_path, timeout=1.5))
        took = time.monotonic() - t0
    assert err.value.code is Code.DPKG_LOCK_TIMEOUT
    assert "/var/lib/dpkg/lock still held after 1.5 s" in err.value.message
    assert "lock-frontend" not in err.value.message
    assert 1.5 <= took < 4.0


@needs_dpkg
def test_real_dpkg_refuses_while_only_the_database_lock_is_held(tmp_path: Path) -> None:
    """Why both matter: the real dpkg itself stops on the database lock alone."""
    _admin(tmp_path, [_stanza("foo", "unpacked")])
    with holding(tmp_path / "var/lib/dpkg/lock") as holder:
        r = subprocess.run(
            [str(REAL_DPKG), f"--root={tmp_path}", "--configure", "-a"],
            capture_output=True,
            text=True,
        )
    assert r.returncode == 2
    assert f"dpkg database lock was locked by another process with pid {holder.pid}" in r.stderr


def test_lock_released_midway_is_taken(tmp_path: Path) -> None:
    with holding(tmp_path / "var/lib/dpkg/lock", seconds=0.6):
        t0 = time.monotonic()
        dpkg.wait_for_lock(_ctx(tmp_path, timeout=10.0))
        assert 0.3 <= time.monotonic() - t0 < 5.0


def test_both_locks_free_returns_at_once(tmp_path: Path) -> None:
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    for name in ("lock", "lock-frontend"):
        (tmp_path / "var/lib/dpkg" / name).touch()
    t0 = time.monotonic()
    dpkg.wait_for_lock(_ctx(tmp_path))
    assert time.monotonic() - t0 < 0.5


# -- dpkg --audit ----------------------------------------------------------------------------


@needs_dpkg
def test_parse_audit_on_the_real_dpkgs_output(tmp_path: Path) -> None:
    _admin(
        tmp_path,
        [
            _stanza("alpha", "installed"),
            _stanza("bravo", "unpacked"),
            _stanza("charlie", "half-configured"),
            _stanza("delta", "half-configured"),
            _stanza("echo", "half-installed"),
        ],
    )
    r = subprocess.run(
        [str(REAL_DPKG), f"--root={tmp_path}", "--audit"], capture_output=True, text=True
    )
    assert r.returncode == 0  # dpkg 1.21 exits 0 whatever it finds
    assert dpkg.parse_audit(r.stdout) == {
        "unpacked": ["bravo"],
        "half-configured": ["charlie", "delta"],
        "half-installed": ["echo"],
    }


@needs_dpkg
def test_parse_audit_of_a_sound_database_is_empty(tmp_path: Path) -> None:
    _admin(tmp_path, [_stanza("alpha", "installed")])
    r = subprocess.run(
        [str(REAL_DPKG), f"--root={tmp_path}", "--audit"], capture_output=True, text=True
    )
    assert r.stdout == "" and dpkg.parse_audit(r.stdout) == {}


def test_parse_audit_ignores_reinstall_only_sections() -> None:
    """Missing list/md5sums files need a reinstall, which --configure -a cannot do."""
    text = (
        "The following packages are missing the list control file in the\n"
        "database, they need to be reinstalled:\n foo                  x\n\n"
    )
    assert dpkg.parse_audit(text) == {}
    assert dpkg.parse_audit("garbage\n\x00\n") == {}


# -- repair with the real dpkg ---------------------------------------------------------------


@needs_dpkg
def test_interrupted_dpkg_is_repaired_with_the_real_dpkg(tmp_path: Path) -> None:
    """A journal left by a killed dpkg (updates/0000: foo half-configured): bootfsm runs
    `dpkg --configure -a`; the real dpkg configures foo and folds the journal in."""
    root = tmp_path / "root"
    admin = _admin(root, [_stanza("foo", "installed", "0.9")], [_stanza("foo", "half-configured")])
    ctx = _ctx(root, path=_real_dpkg_on_path(tmp_path, root))
    assert "1 journal file(s)" in (dpkg.interrupted(ctx) or "")
    assert dpkg.repair(ctx) is True
    assert list((admin / "updates").iterdir()) == []
    assert "Status: install ok installed\n" in (admin / "status").read_text()
    assert "Version: 1.0\n" in (admin / "status").read_text()
    assert dpkg.interrupted(ctx) is None and dpkg.repair(ctx) is False


@needs_dpkg
def test_unpacked_package_found_by_audit_is_configured(tmp_path: Path) -> None:
    root = tmp_path / "root"
    admin = _admin(root, [_stanza("bar", "unpacked")])
    ctx = _ctx(root, path=_real_dpkg_on_path(tmp_path, root))
    assert dpkg.interrupted(ctx) == "dpkg --audit lists packages left mid-install: bar (unpacked)"
    assert dpkg.repair(ctx) is True
    assert "Status: install ok installed\n" in (admin / "status").read_text()


def test_failed_repair_is_48(tmp_path: Path) -> None:
    """`dpkg --configure -a` failing ends the run with DPKG_REPAIR_FAILED."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "dpkg"
    fake.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "sys.stderr.write('dpkg: error processing package foo (--configure):\\n"
        " installed foo package post-installation script subprocess returned error exit "
        "status 1\\n')\nsys.exit(1)\n"
    )
    fake.chmod(0o755)
    _admin(tmp_path, [], [_stanza("foo", "half-configured")])
    with pytest.raises(BootError) as err:
        dpkg.repair(_ctx(tmp_path, path=f"{bin_dir}:{os.environ['PATH']}"))
    assert err.value.code is Code.DPKG_REPAIR_FAILED


# -- on a simulated node ---------------------------------------------------------------------


def test_node_with_an_interrupted_dpkg_boots_after_configure_a(make_world: MakeWorld) -> None:
    w = make_world("gb300", ("dpkg-interrupted",))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    argvs = [c["argv"] for c in w.calls() if c["cmd"] == "dpkg"]
    first_install = next(i for i, a in enumerate(argvs) if "-i" in a)
    assert ["--configure", "-a"] in argvs[:first_install]
    assert argvs.count(["--configure", "-a"]) == 1
    status = (w.root / "var/lib/dpkg/status").read_text()
    assert "Package: unattended-upgrades\nStatus: install ok installed\n" in status
    assert not any((w.root / "var/lib/dpkg/updates").iterdir())
    events = [e for e in result.journal.read_text().splitlines() if "dpkg.repaired" in e]  # type: ignore[union-attr]
    assert len(events) == 1


def test_node_with_the_database_lock_held_waits_the_timeout(make_world: MakeWorld) -> None:
    w = make_world("gb300", ("dpkg-db-lock-held",))
    t0 = time.monotonic()
    result = run_in_process(w)
    took = time.monotonic() - t0
    assert (result.outcome.code, result.outcome.state) == (Code.DPKG_LOCK_TIMEOUT, "driver")
    assert "/var/lib/dpkg/lock still held after 2 s" in result.outcome.message
    assert took >= 2.0
    assert not [c for c in w.calls() if c["cmd"] == "dpkg" and "-i" in c["argv"]]


# -- one dpkg-query for every package a postcondition asks about -------------------------


def test_installed_versions_from_the_real_dpkg_query() -> None:
    """This machine's own dpkg-query and database: what is installed answers with its
    version, what is unknown (dpkg-query prints to stderr and exits 1) answers None."""
    exe = shutil.which("dpkg-query")
    if exe is None:
        pytest.skip("no dpkg-query")
    fmt = "-f=${Package}|${db:Status-Abbrev}|${Version}\\n"
    names = ["dpkg", "bootfsm-no-such-package", "libc6"]
    real = subprocess.run([exe, "-W", fmt, *names], capture_output=True, text=True, check=False)
    assert (
        real.returncode == 1 and "no packages found matching bootfsm-no-such-package" in real.stderr
    )
    own = {
        n: subprocess.run(
            [exe, "-W", "-f=${Version}", n], capture_output=True, text=True, check=True
        ).stdout
        for n in ("dpkg", "libc6")
    }
    combined = real.stdout + real.stderr  # Host.run hands over both, interleaved
    assert parse_query(combined, names) == {
        "dpkg": own["dpkg"], "bootfsm-no-such-package": None, "libc6": own["libc6"]
    }  # fmt: skip


def test_parse_query_only_ii_is_installed() -> None:
    out = "a|ii |1.0-1\nb|iU |2.0-1\nc|rc |3.0\nd|iF |4\n"
    assert parse_query(out, ["a", "b", "c", "d", "e"]) == {
        "a": "1.0-1", "b": None, "c": None, "d": None, "e": None
    }  # fmt: skip
