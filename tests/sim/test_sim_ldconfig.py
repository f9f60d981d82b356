"""The `ldconfig` stand-in against glibc's own ldconfig on the same node: the cache's
entries and order, and the SONAME links it makes (bootfsm/sim/standin_ldconfig.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bootfsm.sim.aksgpu import stage_aks_gpu_prebake
from bootfsm.sim.elf import shared_object
from bootfsm.sim.node import SKUS, build_node
from bootfsm.sim.nodestate import Node
from tests.samples import on_ci

LIBDIR = "usr/lib/x86_64-linux-gnu"


def _real_ldconfig() -> str:
    found = shutil.which("ldconfig", path="/sbin:/usr/sbin:/usr/bin")
    if found is None or os.geteuid() != 0:  # `ldconfig -r` chroots: root only
        if on_ci():
            pytest.fail("the real ldconfig (as root) is needed", pytrace=False)
        pytest.skip("the real ldconfig -r needs root")
    return found


def _links(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): os.readlink(p)
        for d in (LIBDIR, "usr/bin/lib64", "usr/bin/lib64/lib64")
        for p in sorted((root / d).glob("lib*"))
        if p.is_symlink()
    }


def test_the_stand_in_builds_the_cache_the_real_ldconfig_builds(tmp_path: Path) -> None:
    """An aks-gpu CUDA prebake that booted once (its libraries copied into the multiarch
    directory), a GRID 570 beside it and a library straight in /usr/bin/lib64, which
    aks-gpu's nvidia.conf names and reads before x86_64-linux-gnu.conf."""
    ldconfig = _real_ldconfig()
    root = tmp_path / "sim"
    bin_dir = build_node(root, SKUS["a10-nvads"])
    node = Node(root)
    stage_aks_gpu_prebake(node, "580.159.04", initialized=True)
    for name, soname in (
        (f"{LIBDIR}/libnvidia-ml.so.570.211.01", "libnvidia-ml.so.1"),
        ("usr/bin/lib64/libcuda.so.535.261.03", "libcuda.so.1"),
    ):
        (root / name).write_bytes(shared_object(soname, "x86_64"))
    real = tmp_path / "real"
    shutil.copytree(root, real, symlinks=True, ignore=shutil.ignore_patterns("proc", "sys", "dev"))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    sim = subprocess.run(["ldconfig"], env=env, capture_output=True, text=True)
    assert sim.returncode == 0, sim.stderr
    subprocess.run([ldconfig, "-r", str(real)], check=True)
    want = subprocess.run([ldconfig, "-r", str(real), "-p"], check=True, capture_output=True,
                          text=True).stdout  # fmt: skip
    got = subprocess.run(["ldconfig", "-p"], env=env, capture_output=True, text=True).stdout
    assert got.splitlines()[:-1] == want.splitlines()[:-1]  # the trailer names each build
    assert got.splitlines()[1] == (
        "\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    )
    assert _links(root) == _links(real)
    assert _links(root)[f"{LIBDIR}/libnvidia-ml.so.1"] == "libnvidia-ml.so.580.159.04"  # newest


def test_print_cache_without_a_cache_is_the_real_error(tmp_path: Path) -> None:
    root = tmp_path / "sim"
    bin_dir = build_node(root, SKUS["a10-nvads"])
    (root / "etc/ld.so.cache").unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(["ldconfig", "-p"], env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert out.stderr.endswith(
        "ldconfig: Can't open cache file /etc/ld.so.cache\n: No such file or directory\n"
    )


def test_a_cache_written_by_the_real_ldconfig_does_not_break_the_simulated_gpu(
    tmp_path: Path,
) -> None:
    """On the booted lane's images glibc's own ldconfig writes /etc/ld.so.cache (binary,
    "glibc-ld.so.cache1.1"): the simulated driver still finds its NVML, in its directory."""
    ldconfig = _real_ldconfig()
    root = tmp_path / "sim"
    build_node(root, SKUS["a10-nvads"])
    node = Node(root)
    (root / LIBDIR).mkdir(parents=True, exist_ok=True)
    (root / f"{LIBDIR}/libnvidia-ml.so.580.159.04").write_bytes(
        shared_object("libnvidia-ml.so.1", "x86_64")
    )
    subprocess.run([ldconfig, "-r", str(root)], check=True)
    assert (root / "etc/ld.so.cache").read_bytes().startswith(b"glibc-ld.so.cache")
    assert node.linker_cache() == []
    assert node.nvml_version() == "580.159.04"
