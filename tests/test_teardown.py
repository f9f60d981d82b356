"""Every node that gets no driver is left as AgentBaker's cleanUpPrebakedGPUDriver leaves
it (Azure/AgentBaker 06836ee, ubuntu/cse_install_ubuntu.sh), and a node whose driver kind
or version changes ends with only its own driver's libraries resolvable (Azure/AKS#5860,
#5869, #5871).

The images are staged as their builders leave them: aks-gpu's prebake by
bootfsm/sim/aksgpu.py (its install.sh's real paths and ld.so.conf.d line), bootfsm's by
`bake`. What the loader resolves is read from `ldconfig -p`, and where this machine runs
as root, from the real ldconfig run over the same node.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.config_files import load_config
from bootfsm.image.bake import BakeOptions, bake
from bootfsm.parsers.ldconfig import parse_ldconfig_p
from bootfsm.run.session import SessionResult
from bootfsm.sim.aksgpu import MARKER, NVIDIA_CONF, stage_aks_gpu_prebake
from bootfsm.sim.elf import shared_object
from bootfsm.sim.node import VM_SIZE
from bootfsm.sim.nodestate import Node
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, installer_calls, no_gpus, run_in_process

CUDA = "580.159.04"  # the cuda-lts prebake of Azure/AKS#5869
GRID = "570.211.01"  # the GRID driver the A10 node installs there
LIBDIR = "usr/lib/x86_64-linux-gnu"
SKIP = {"SkipGpuDriverInstall": "true"}


def _events(result: SessionResult, name: str) -> list[dict[str, Any]]:
    assert result.journal is not None
    return [
        e for e in map(json.loads, result.journal.read_text().splitlines()) if e["event"] == name
    ]


def _resolvable(w: World) -> dict[str, str]:
    """libnvidia-ml.so.1 and libcuda.so.1 as `ldconfig -p` lists them first -> the file."""
    out = subprocess.run(
        ["ldconfig", "-p"], env=w.env(), capture_output=True, text=True, check=True
    )
    first: dict[str, str] = {}
    for e in parse_ldconfig_p(out.stdout):
        if e.name in ("libnvidia-ml.so.1", "libcuda.so.1") and e.name not in first:
            first[e.name] = os.path.realpath(w.root / e.path.lstrip("/")).rsplit("/", 1)[1]
    return first


def _nvidia_files(w: World) -> list[str]:
    """Every NVIDIA driver file of the prebake left on the node (relative paths)."""
    globs = ("var/lib/dkms/nvidia", "lib/modules/*/updates/dkms/nvidia*.ko", "usr/bin/lib64",
             f"{LIBDIR}/libnvidia-ml.so*", f"{LIBDIR}/libcuda.so*", NVIDIA_CONF, MARKER,
             "usr/bin/nvidia-smi", "usr/bin/nvidia-modprobe", "usr/bin/nvidia-persistenced",
             "var/lib/bootfsm/bake.marker")  # fmt: skip
    return sorted(str(p.relative_to(w.root)) for g in globs for p in w.root.glob(g))


def _stage(w: World, version: str = CUDA, *, initialized: bool = False) -> None:
    stage_aks_gpu_prebake(Node(w.root), version, initialized=initialized)
    assert (w.root / NVIDIA_CONF).read_text() == "/usr/bin/lib64\n"  # aks-gpu's line


def _hold_device(w: World, pid: int = 4242) -> None:
    """A process with /dev/nvidia0 open (what fuser and lsof read under /proc)."""
    (w.root / f"proc/{pid}/fd").mkdir(parents=True)
    (w.root / f"proc/{pid}/comm").write_text("dcgm-exporter\n")
    os.symlink("/dev/nvidia0", w.root / f"proc/{pid}/fd/3")


# ----------------------------------------------------------- nodes that get no driver


def test_a_cpu_vm_size_of_an_aks_gpu_image_loses_the_prebake(make_world: MakeWorld) -> None:
    """The default: a CPU VM size booting aks-gpu's CUDA image ends 0 with the DKMS tree,
    the modules, /usr/bin/lib64, the binaries, nvidia.conf and the marker gone; nouveau
    stays blacklisted, as AgentBaker leaves it."""
    w = make_world("cpu-d4s")
    _stage(w)
    assert len(_nvidia_files(w)) > 8
    result = run_in_process(w)
    assert result.outcome.ok and result.outcome.message.startswith("nothing to provision")
    assert _nvidia_files(w) == []
    assert _resolvable(w) == {}
    assert (w.root / "etc/modprobe.d/blacklist-nouveau.conf").exists()
    [done] = _events(result, "teardown.done")
    assert (done["status"], done["kept"]) == ("cleaned", [])
    assert installer_calls(w) == []


def test_a_cpu_vm_size_of_a_bootfsm_baked_image_loses_the_prebake(make_world: MakeWorld) -> None:
    """`bootfsm bake` then a CPU VM size: what bake recorded and what the runfile put
    beside it (its libraries, binaries, the setuid nvidia-modprobe) go."""
    w = make_world("h100-pcie")
    with no_gpus(w):
        assert bake(
            load_config(w.config_path, required=True), BakeOptions(root=w.root, env=w.env())
        ).ok
    assert (w.root / LIBDIR / f"libnvidia-ml.so.{CUDA}").exists()
    assert (w.root / "usr/bin/nvidia-modprobe").exists()
    (w.root / VM_SIZE).write_text("Standard_D4s_v5\n")
    with no_gpus(w):
        result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert _nvidia_files(w) == []
    assert not (w.root / "var/lib/bootfsm/installed.jsonl").exists()
    assert [e["status"] for e in _events(result, "teardown.done")] == ["cleaned"]


def test_the_skip_tag_on_a_gpu_vm_size_unloads_and_removes(make_world: MakeWorld) -> None:
    """SkipGpuDriverInstall on a GPU VM (its owner runs the GPU Operator): the CUDA
    prebake autoloaded at boot, idle; it is unloaded and removed, so the Operator's driver
    container finds no nvidia.ko to load; no installer runs."""
    w = make_world("h100-pcie", vm_tags=SKIP)
    _stage(w, initialized=True)
    assert Node(w.root).load_module() is None  # udev's modalias load at boot
    result = run_in_process(w)
    assert result.outcome.ok and "GPU driver install skipped" in result.outcome.message
    assert not (w.root / "sys/module/nvidia").exists()
    assert _nvidia_files(w) == []
    assert not list(w.root.glob("lib/modules/*/updates/dkms/*.ko"))
    unloads = [c["argv"] for c in w.calls() if c["cmd"] == "modprobe"]
    assert ["-r", "nvidia"] in unloads
    assert installer_calls(w) == []


def test_a_module_in_use_stays_journaled_and_the_next_run_finishes(make_world: MakeWorld) -> None:
    """A process holds /dev/nvidia0: the module stays loaded, the files go, the marker
    stays (the next run's flag) and the run warns; it still ends 0. Once the holder is
    gone the next run unloads it and drops the marker."""
    w = make_world("h100-pcie", vm_tags=SKIP)
    _stage(w)
    assert Node(w.root).load_module() is None
    _hold_device(w)
    first = run_in_process(w)
    assert first.outcome.ok, first.outcome.message
    assert (w.root / "sys/module/nvidia").exists()
    assert _nvidia_files(w) == [MARKER]
    [done] = _events(first, "teardown.done")
    assert done["status"] == "incomplete"
    assert done["kept"] == ["module nvidia (held by dcgm-exporter (pid 4242))"]
    assert done["markers_kept"] == ["/" + MARKER]
    assert any("teardown incomplete" in e["message"] for e in _events(first, "warning"))
    assert not [c for c in w.calls() if c["cmd"] == "modprobe"]  # not while held
    shutil.rmtree(w.root / "proc/4242")
    second = run_in_process(w)
    assert [e["status"] for e in _events(second, "teardown.done")] == ["cleaned"]
    assert not (w.root / "sys/module/nvidia").exists() and _nvidia_files(w) == []


def test_the_key_off_leaves_the_prebake(make_world: MakeWorld) -> None:
    """detect.cleanup_on_no_gpu = false: nothing of the prebake is touched."""
    w = make_world("cpu-d4s", config_overrides={"detect": {"cleanup_on_no_gpu": False}})
    _stage(w)
    before = _nvidia_files(w)
    result = run_in_process(w)
    assert result.outcome.ok and _nvidia_files(w) == before
    assert _events(result, "teardown.done") == []


# ------------------------------------------------------- a driver of another kind or version


def _grid_world(make_world: MakeWorld) -> World:
    w = make_world("a10-nvads", driver_kind="grid", driver_version=GRID,
                   config_overrides={"verify": {"license_poll_interval": 0.05}})  # fmt: skip
    _stage(w, initialized=True)  # a CUDA prebake that booted once through aks-gpu
    assert _resolvable(w) == {"libnvidia-ml.so.1": f"libnvidia-ml.so.{CUDA}",
                              "libcuda.so.1": f"libcuda.so.{CUDA}"}  # fmt: skip
    return w


def test_grid_on_a_cuda_prebake_leaves_only_grid_libraries(make_world: MakeWorld) -> None:
    w = _grid_world(make_world)
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert _resolvable(w) == {"libnvidia-ml.so.1": f"libnvidia-ml.so.{GRID}",
                              "libcuda.so.1": f"libcuda.so.{GRID}"}  # fmt: skip
    left = [p.name for p in (w.root / LIBDIR).glob("lib*.so.*") if CUDA in p.name]
    assert left == []
    assert not (w.root / "usr/bin/lib64").exists() and not (w.root / NVIDIA_CONF).exists()
    assert not (w.root / MARKER).exists()  # it described a driver no longer here
    [superseded] = _events(result, "driver.superseded")
    assert superseded["prebake"] == [CUDA]


@pytest.mark.skipif(os.geteuid() != 0, reason="the real ldconfig -r needs root")
def test_the_real_ldconfig_resolves_only_grid_after_it(
    make_world: MakeWorld, tmp_path: Path
) -> None:
    """The same node under glibc's own ldconfig (chrooted into it): only GRID's files."""
    w = _grid_world(make_world)
    assert run_in_process(w).outcome.ok
    real = tmp_path / "real"
    shutil.copytree(
        w.root, real, symlinks=True, ignore=shutil.ignore_patterns("proc", "sys", "dev")
    )
    ldconfig = shutil.which("ldconfig", path="/sbin:/usr/sbin") or "ldconfig"
    subprocess.run([ldconfig, "-r", str(real)], check=True)
    out = subprocess.run(
        [ldconfig, "-r", str(real), "-p"], check=True, capture_output=True, text=True
    )
    nvidia = [
        e for e in parse_ldconfig_p(out.stdout) if e.name.startswith(("libnvidia", "libcuda"))
    ]
    assert [(e.name, os.readlink(real / e.path.lstrip("/"))) for e in nvidia] == [
        ("libnvidia-ml.so.1", f"libnvidia-ml.so.{GRID}"), ("libcuda.so.1", f"libcuda.so.{GRID}"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("stale", "winner"),
    [
        (CUDA, CUDA),
        ("535.261.03", GRID),
    ],  # a newer version takes the SONAME link; an older sits beside
)
def test_verify_fails_60_when_another_drivers_libraries_resolve(
    make_world: MakeWorld, stale: str, winner: str
) -> None:
    """After a good GRID boot a peer copies another driver's libraries into the multiarch
    directory and runs ldconfig (aks-gpu's ``cp -r /usr/bin/lib64/lib64/*``): the next run
    fails verify with 60, naming the file, whether or not it won the SONAME link."""
    w = make_world("a10-nvads", driver_kind="grid", driver_version=GRID,
                   config_overrides={"verify": {"license_poll_interval": 0.05}})  # fmt: skip
    assert run_in_process(w).outcome.ok
    for lib in ("libnvidia-ml.so", "libcuda.so"):
        (w.root / LIBDIR / f"{lib}.{stale}").write_bytes(shared_object(f"{lib}.1", "x86_64"))
    subprocess.run(["ldconfig"], env=w.env(), check=True)
    assert _resolvable(w)["libnvidia-ml.so.1"] == f"libnvidia-ml.so.{winner}"
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.DRIVER_LIBRARY_MISMATCH, "verify")
    assert (
        f"/{LIBDIR}/libnvidia-ml.so.{stale} (driver {stale}) is resolvable"
        in result.outcome.message
    )
