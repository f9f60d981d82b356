"""Archives a hostile mirror could serve (with a matching sha256, say after a key leak):
member-count and size bombs, a deadline that must hold while the listing is read, and
an order-dependent symlink chain. Each archive is a real tar.xz made here; extraction
runs through Host.extract_tar as the fabric state uses it."""

from __future__ import annotations

import io
import lzma
import tarfile
import time
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host


def _txz(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes] | None = None) -> Path:
    with tarfile.open(path, "w:xz", preset=0) as tf:
        for m in members:
            body = (data or {}).get(m.name)
            if body is not None:
                m.size = len(body)
            tf.addfile(m, io.BytesIO(body) if body is not None else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.mode = tarfile.REGTYPE, 0o644
    return m


def _link(name: str, target: str) -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.linkname = tarfile.SYMTYPE, target
    return m


@pytest.fixture
def host(tmp_path: Path) -> Host:
    root = tmp_path / "node"
    (root / "var/lib/bootfsm/extract").mkdir(parents=True, mode=0o700)
    for d in (root, root / "var", root / "var/lib", root / "var/lib/bootfsm"):
        d.chmod(0o755 if d != root / "var/lib/bootfsm" else 0o700)
    return Host(root)


DEST = "/var/lib/bootfsm/extract/fm"


def test_too_many_members_is_refused_before_anything_is_written(host: Host, tmp_path: Path) -> None:
    archive = _txz(tmp_path / "many.tar.xz", [_file(f"top/f{i}") for i in range(1200)])
    with pytest.raises(BootError) as err:
        host.extract_tar(archive, DEST, max_members=1000)
    assert err.value.code is Code.UNSAFE_ARCHIVE and "more than 1000 members" in str(err.value)
    assert not host.exists(DEST)


def test_an_xz_bomb_is_refused_from_its_listing(host: Host, tmp_path: Path) -> None:
    """96 MiB of zeros packs into a few KiB: over 32 times the archive's size (and the
    64 MiB floor), refused from the member header, nothing extracted."""
    zeros = bytes(96 << 20)
    archive = _txz(tmp_path / "bomb.tar.xz", [_file("top/zeros")], {"top/zeros": zeros})
    assert archive.stat().st_size < 64 << 10
    with pytest.raises(BootError) as err:
        host.extract_tar(archive, DEST)
    assert err.value.code is Code.UNSAFE_ARCHIVE and "uncompressed" in str(err.value)
    assert not host.exists(DEST)


def test_the_deadline_holds_while_the_listing_is_read(host: Host, tmp_path: Path) -> None:
    archive = _txz(tmp_path / "slow.tar.xz", [_file(f"top/f{i}") for i in range(3000)])
    clock = [0.0]

    def tick() -> float:  # every look at the clock costs 10 ms of simulated time
        clock[0] += 0.01
        return clock[0]

    slow = Host(host.root, monotonic=tick)
    seen = BootError(Code.STATE_TIMEOUT, "state fabric ran out of its time limit")
    with pytest.raises(BootError) as err:
        slow.extract_tar(archive, DEST, deadline=5.0, on_timeout=lambda: seen)
    assert err.value is seen
    assert clock[0] < 6.0  # stopped at the deadline, not after reading all 3000 members


def test_order_dependent_symlink_chain_is_refused(host: Host, tmp_path: Path) -> None:
    """`p/q -> ../r` is inside while `p` is a directory; a later `p -> ..` makes `p/q`
    land outside. Every symlink counts, wherever it comes in the archive."""
    d = tarfile.TarInfo("top/p")
    d.type, d.mode = tarfile.DIRTYPE, 0o755
    members = [d, _link("top/p/q", "../r"), _link("top/p", "..")]
    archive = _txz(tmp_path / "chain.tar.xz", members)
    with pytest.raises(BootError) as err:
        host.extract_tar(archive, DEST)
    assert err.value.code is Code.UNSAFE_ARCHIVE and "own symlink" in str(err.value)
    assert not host.exists(DEST)


def test_a_normal_archive_extracts(host: Host, tmp_path: Path) -> None:
    members = [_file("top/bin/nv-fabricmanager"), _link("top/lib/libnvfm.so", "libnvfm.so.1")]
    archive = _txz(tmp_path / "ok.tar.xz", members, {"top/bin/nv-fabricmanager": b"\x7fELF"})
    t0 = time.monotonic()
    names = host.extract_tar(archive, DEST, deadline=time.monotonic() + 30)
    assert names == ["top/bin/nv-fabricmanager", "top/lib/libnvfm.so"]
    assert host.read_bytes(f"{DEST}/top/bin/nv-fabricmanager") == b"\x7fELF"
    assert time.monotonic() - t0 < 30
    assert lzma.is_check_supported(lzma.CHECK_CRC64)
