"""A local unprivileged user against bootfsm: every attack performed for real.

A real second uid (``setpriv --reuid 65534``: nobody), real symlinks, real loose modes.
bootfsm must refuse (UNSAFE_STATE_DIR 105, UNSAFE_STATE_FILE 106) before it writes
anything through what was planted, and what it executes is what it hashed.
docs/security.md, *Local users*, lists these attacks with what bootfsm does.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.fetch.artifacts import sha256_of
from bootfsm.host.host import Host
from bootfsm.sim.world import World

NOBODY = 65534
STATE_DIR = "var/lib/bootfsm"
CACHE_DIR = "var/cache/bootfsm"
LOG_DIR = "var/log/bootfsm"
SETPRIV = shutil.which("setpriv")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None, reason="needs root and setpriv (a real second uid)"
)


def as_nobody(*argv: str) -> list[str]:
    """argv run as uid/gid 65534 with no supplementary groups."""
    assert SETPRIV is not None
    return [SETPRIV, "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", *argv]


@pytest.fixture
def base() -> Iterator[Path]:
    """A root-owned 0711 directory that nobody can traverse (pytest's tmp is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="bootfsm-local-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def world(base: Path) -> Iterator[World]:
    w = World(base / "w", "h100-hgx", ()).__enter__()
    for p in (w.base, w.root):
        p.chmod(0o711)
    yield w
    w.__exit__(None, None, None)


def run(w: World) -> subprocess.CompletedProcess[str]:
    r = w.run_cli()
    r.stderr = r.stdout + r.stderr  # the messages, wherever the CLI prints them
    return r


def installer_ran(w: World) -> bool:
    return any("nvidia-installer" in " ".join(c.get("argv", [])) for c in w.calls())


def bucket(w: World) -> Path:
    return w.root / CACHE_DIR / w.runfile_sha256[:16]


def runfile_name(w: World) -> str:
    [genuine] = w.docroot.rglob("NVIDIA-Linux-*.run")
    return genuine.name


# -- loose or foreign directories -----------------------------------------------------
@pytest.mark.parametrize("rel", [STATE_DIR, CACHE_DIR, LOG_DIR])
def test_world_writable_own_dir_is_refused(world: World, rel: str) -> None:
    d = world.root / rel
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o777)
    r = run(world)
    assert r.returncode == Code.UNSAFE_STATE_DIR, r.stdout + r.stderr
    assert "writable by group or others (mode 0777)" in r.stderr
    assert f"/{rel}" in r.stderr
    assert not installer_ran(world)


@pytest.mark.parametrize("rel", [STATE_DIR, CACHE_DIR])
def test_own_dir_owned_by_another_uid_is_refused(world: World, rel: str) -> None:
    d = world.root / rel
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chown(d, NOBODY, NOBODY)
    r = run(world)
    assert r.returncode == Code.UNSAFE_STATE_DIR, r.stdout + r.stderr
    assert f"owned by uid {NOBODY}, not root" in r.stderr


def test_sticky_1777_parent_is_not_trusted(world: World) -> None:
    """state_dir under a /tmp-like 1777 parent: the parent's owner controls the name."""
    (world.root / "var/lib/bootfsm").mkdir(parents=True, exist_ok=True)
    (world.root / "var/lib").chmod(0o1777)
    r = run(world)
    assert r.returncode == Code.UNSAFE_STATE_DIR, r.stdout + r.stderr
    assert "/var/lib (above /var/lib/bootfsm)" in r.stderr and "sticky" in r.stderr


def test_group_writable_system_parent_is_accepted_like_ubuntus_var_log(base: Path) -> None:
    """Ubuntu's /var/log is 0775 root:syslog: group write above the own dir is allowed for
    a system group only; a user group (gid >= 1000) there, or on the own dir, is refused."""
    root = base / "root"
    (root / "var/log").mkdir(parents=True)
    root.chmod(0o711)
    (root / "var/log").chmod(0o775)
    os.chown(root / "var/log", 0, 104)  # a system group, like syslog
    host = Host(root)
    assert stat.S_IMODE(host.own_dir("/var/log/bootfsm").stat().st_mode) == 0o700
    os.chown(root / "var/log", 0, 1000)
    with pytest.raises(BootError) as ei:
        host.own_dir("/var/log/bootfsm")
    assert ei.value.code is Code.UNSAFE_STATE_DIR
    os.chown(root / "var/log", 0, 104)
    (root / "var/log/bootfsm").chmod(0o770)
    with pytest.raises(BootError) as ei:
        host.own_dir("/var/log/bootfsm")
    assert "mode 0770" in ei.value.message


def test_own_dirs_are_created_0700_root(world: World) -> None:
    r = run(world)
    assert r.returncode == 0, r.stdout + r.stderr
    for rel in (STATE_DIR, CACHE_DIR, LOG_DIR, f"{STATE_DIR}/extract"):
        st = (world.root / rel).lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0
        assert stat.S_IMODE(st.st_mode) == 0o700, rel


# -- planted symlinks -------------------------------------------------------------------
def test_symlink_at_the_lock_is_not_written_through(world: World, base: Path) -> None:
    victim = base / "victim"
    victim.write_text("precious\n")
    state = world.root / STATE_DIR
    state.mkdir(parents=True, mode=0o700)
    (state / "lock").symlink_to(victim)
    r = run(world)
    assert r.returncode == Code.UNSAFE_STATE_FILE, r.stdout + r.stderr
    assert "lock is a symlink" in r.stderr
    assert victim.read_text() == "precious\n"


def test_symlinked_cache_bucket_lands_nothing_outside(world: World, base: Path) -> None:
    outside = base / "outside"
    outside.mkdir(mode=0o700)
    cache = world.root / CACHE_DIR
    cache.mkdir(parents=True, mode=0o700)
    bucket(world).symlink_to(outside)
    r = run(world)
    assert r.returncode == Code.UNSAFE_STATE_DIR, r.stdout + r.stderr
    assert "is a symlink" in r.stderr
    assert list(outside.iterdir()) == []


def test_symlinked_part_file_lands_nothing_outside(world: World, base: Path) -> None:
    victim = base / "victim"
    victim.write_text("precious\n")
    b = bucket(world)
    b.mkdir(parents=True, mode=0o700)
    b.parent.chmod(0o700)
    (b / f"{runfile_name(world)}.part").symlink_to(victim)
    r = run(world)
    assert r.returncode == Code.UNSAFE_STATE_FILE, r.stdout + r.stderr
    assert ".part is a symlink" in r.stderr
    assert victim.read_text() == "precious\n"


def test_symlinked_extract_dir_extracts_nothing_there(world: World, base: Path) -> None:
    open_dir = base / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    state = world.root / STATE_DIR
    state.mkdir(parents=True, mode=0o700)
    (state / "extract").symlink_to(open_dir)
    r = run(world)
    assert r.returncode == Code.UNSAFE_STATE_DIR, r.stdout + r.stderr
    assert "/extract is a symlink" in r.stderr
    assert list(open_dir.iterdir()) == []
    assert not installer_ran(world)


# -- swap after hash ----------------------------------------------------------------------
SWAPPER = """
import os, sys
d, name, a, b = sys.argv[1:5]
blobs = [open(a, "rb").read(), open(b, "rb").read()]
os.makedirs(d, exist_ok=True)
i = 0
while True:
    tmp = os.path.join(d, ".swap%d" % (i % 2))
    with open(tmp, "wb") as fh:
        fh.write(blobs[i % 2])
    os.chmod(tmp, 0o777)
    os.replace(tmp, os.path.join(d, name))
    i += 1
"""


def _swapper(d: Path, name: str, genuine: Path, payload: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        as_nobody("/usr/bin/python3", "-c", SWAPPER, str(d), name, str(genuine), str(payload)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _payload(base: Path) -> tuple[Path, Path]:
    marker = base / "PWNED"
    payload = base / "payload.run"
    payload.write_text(f"#!/bin/sh\ntouch {marker}\necho payload\n")
    payload.chmod(0o755)
    return payload, marker


def test_swap_after_hash_with_a_0777_cache_never_runs_the_payload(world: World, base: Path) -> None:
    """nobody plants the genuine runfile in a 0777 cache and swaps it for a payload in a
    loop while bootfsm runs: bootfsm refuses the cache; the payload never runs as root."""
    [genuine] = world.docroot.rglob("NVIDIA-Linux-*.run")
    shutil.copy(genuine, base / "genuine.run")
    (base / "genuine.run").chmod(0o644)
    payload, marker = _payload(base)
    cache = world.root / CACHE_DIR
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    proc = _swapper(bucket(world), genuine.name, base / "genuine.run", payload)
    try:
        r = run(world)
    finally:
        proc.kill()
        proc.wait()
    assert (bucket(world) / genuine.name).stat().st_uid == NOBODY  # the attack was real
    assert r.returncode == Code.UNSAFE_STATE_DIR, r.stdout + r.stderr
    assert not marker.exists()
    assert not installer_ran(world)


def test_the_bytes_executed_are_the_bytes_hashed(base: Path) -> None:
    """The installer runs from a private copy hashed as it is copied: with its source in
    a 0777 directory swapped by nobody in a loop, every copy either hashes to the genuine
    sha256 (and runs the genuine script) or is refused; the payload never runs."""
    root = base / "root"
    root.mkdir(mode=0o711)
    host = Host(root)
    host.own_dir("/state")
    drop = root / "drop"
    drop.mkdir()
    drop.chmod(0o777)
    genuine = base / "genuine.run"
    genuine.write_text("#!/bin/sh\necho genuine\n")
    genuine.chmod(0o644)
    payload, marker = _payload(base)
    sha = sha256_of(genuine)
    proc = _swapper(drop, "x.run", genuine, payload)
    ran = refused = 0
    try:
        for _ in range(200):  # the attacker is at work before bootfsm looks
            if (drop / "x.run").exists():
                break
            time.sleep(0.05)
        while ran + refused < 60:
            try:
                copy = host.private_copy("/drop/x.run", "/state/extract", sha)
            except BootError as exc:
                assert exc.code in (Code.CHECKSUM_MISMATCH, Code.HOST_IO_ERROR), exc.message
                refused += 1
                continue
            r = host.run([str(copy)], timeout=10)
            assert r.output == "genuine\n"
            assert stat.S_IMODE(copy.stat().st_mode) == 0o700 and copy.stat().st_uid == 0
            ran += 1
    finally:
        proc.kill()
        proc.wait()
    assert (drop / "x.run").stat().st_uid == NOBODY
    assert not marker.exists()
    assert refused > 0, "the swapper never raced a copy: the test proved nothing"


# -- exec errors --------------------------------------------------------------------------
def test_not_an_executable_is_exec_failed(tmp_path: Path) -> None:
    f = tmp_path / "garbage.run"
    f.write_bytes(b"\x7fELF\x00\x00garbage")
    f.chmod(0o700)
    with pytest.raises(BootError) as ei:
        Host(tmp_path).run([str(f)], timeout=5)
    assert ei.value.code is Code.EXEC_FAILED
    assert "not an executable" in ei.value.message


def test_text_file_busy_is_exec_failed(tmp_path: Path) -> None:
    f = tmp_path / "busy.run"
    f.write_text("#!/bin/sh\necho hi\n")
    f.chmod(0o700)
    with open(f, "ab"), pytest.raises(BootError) as ei:  # held open for writing
        Host(tmp_path).run([str(f)], timeout=5)
    assert ei.value.code is Code.EXEC_FAILED
    assert "text file busy" in ei.value.message


# -- read-only state dir ------------------------------------------------------------------
@pytest.mark.parametrize("cmd", [("fetch",), ("bake",)])
def test_read_only_state_dir_is_host_io_error(world: World, cmd: tuple[str, ...]) -> None:
    state = world.root / STATE_DIR
    state.mkdir(parents=True, mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,mode=0700", "tmpfs", str(state)], check=False
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        r = subprocess.run(
            [*world.argv()[:3], *cmd, "--root", str(world.root)],
            env=world.env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        subprocess.run(["umount", str(state)], check=True)
    r.stderr = r.stdout + r.stderr
    assert r.returncode == Code.HOST_IO_ERROR, r.stdout + r.stderr
    assert "Read-only file system" in r.stderr
    assert "Traceback" not in r.stderr
