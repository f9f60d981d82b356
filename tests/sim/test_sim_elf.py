"""The simulator's driver libraries are real ELF shared objects: the real ldconfig
caches them by their SONAME, the real readelf reads their dynamic section."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bootfsm.sim.elf import shared_object
from tests.samples import real_tool


def test_real_ldconfig_caches_the_library_by_its_soname(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnvidia-ml.so.580.95.05").write_bytes(shared_object("libnvidia-ml.so.1", "x86_64"))
    (lib / "not-elf").mkdir()
    (lib / "libfake.so.1").write_text("a text file is not a library\n")
    conf = tmp_path / "ld.so.conf"
    conf.write_text(f"{lib}\n")
    cache = tmp_path / "ld.so.cache"
    ldconfig = real_tool("ldconfig")
    subprocess.run([ldconfig, "-C", str(cache), "-f", str(conf)], check=True, capture_output=True)
    listed = subprocess.run(
        [ldconfig, "-p", "-C", str(cache)], check=True, capture_output=True, text=True
    ).stdout
    assert f"libnvidia-ml.so.1 (libc6,x86-64) => {lib}/libnvidia-ml.so.1" in listed
    assert (lib / "libnvidia-ml.so.1").is_symlink()  # ldconfig made the SONAME link
    assert "libfake" not in listed  # what the simulator used to write: skipped


@pytest.mark.parametrize(("arch", "machine"), [("x86_64", "X86-64"), ("aarch64", "AArch64")])
def test_readelf_sees_a_shared_object_with_the_soname(
    tmp_path: Path, arch: str, machine: str
) -> None:
    path = tmp_path / "libcuda.so.580.95.05"
    path.write_bytes(shared_object("libcuda.so.1", arch))
    readelf = real_tool("readelf")
    header = subprocess.run([readelf, "-h", str(path)], capture_output=True, text=True).stdout
    assert "DYN (Shared object file)" in header and machine in header
    dynamic = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True).stdout
    assert "Library soname: [libcuda.so.1]" in dynamic
