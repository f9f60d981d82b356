"""Tests for bootfsm.sim.node: node layout per SKU, faults, reboot, calls log, HTTP facts."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
from pathlib import Path

import pytest

from bootfsm.parsers.pci import vpd_has_sw_mng
from bootfsm.parsers.vmsize import parse_imds_vm_size
from bootfsm.sim.node import (
    BIN_DIR,
    FAULTS,
    SKUS,
    DpkgLockHolder,
    build_node,
    calls,
    imds_instance,
    kubelet_healthz,
    simulate_reboot,
    standin_script,
)

FM_UNIT = """\
[Unit]
Description=NVIDIA fabric manager service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-fabricmanager-start.sh --mode start

[Install]
WantedBy=multi-user.target
"""


def _run(bin_dir: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        list(argv), env=env, capture_output=True, text=True, timeout=30, check=False
    )


def _read(root: Path, node_path: str) -> str:
    return (root / node_path).read_text()


def _pci(root: Path) -> dict[str, tuple[int, int, int]]:
    def attr(dev: Path, name: str) -> int:
        return int((dev / name).read_text(), 16)

    base = root / "sys/bus/pci/devices"
    return {
        d.name: (attr(d, "vendor"), attr(d, "device"), attr(d, "class")) for d in base.iterdir()
    }


@pytest.mark.parametrize("name", sorted(SKUS))
def test_build_node_lays_out_every_contract_fact(tmp_path: Path, name: str) -> None:
    sku = SKUS[name]
    root = tmp_path / "node"
    bin_dir = build_node(root, sku)

    assert bin_dir == root / BIN_DIR
    assert _read(root, "proc/sys/kernel/arch") == f"{sku.arch}\n"
    assert _read(root, "proc/sys/kernel/osrelease") == f"{sku.kernel}\n"
    os_release = _read(root, "etc/os-release")
    assert "ID=ubuntu\n" in os_release
    assert f'VERSION_ID="{sku.os_version}"' in os_release

    pci = _pci(root)
    gpus = {a: v for a, v in pci.items() if v[0] == 0x10DE and v[2] == 0x030200}
    switches = {a: v for a, v in pci.items() if v[0] == 0x10DE and v[2] == 0x068000}
    assert len(gpus) == sku.gpu_count
    assert all(v[1] == sku.gpu_device_id for v in gpus.values())
    assert len(switches) == sku.nvswitch_count
    nvidia = {0x10DE} if sku.gpu_count or sku.nvswitch_count else set()  # a CPU size: none
    amd = {0x1002} if sku.amd_gpu_device_id else set()  # AMD's V620 on the NG sizes
    assert {v[0] for v in pci.values()} == {*nvidia, *amd, 0x15B3, 0x1414}
    assert (0x15B3, 0x1016, 0x020000) in pci.values()
    if sku.gpu_count:
        first_gpu = sorted(gpus)[0]
        assert first_gpu == ("0008:01:00.0" if sku.arch == "aarch64" else "0001:00:00.0")
        assert _read(root, f"sys/bus/pci/devices/{first_gpu}/vendor") == "0x10de\n"

    vpd = (root / "sys/class/infiniband/mlx5_0/device/vpd").read_bytes()
    assert vpd.startswith(b"\x82") and vpd.endswith(b"\x78")
    assert vpd_has_sw_mng(vpd) is sku.nvlink5

    assert any((root / f"lib/modules/{sku.kernel}/build").iterdir())
    assert _read(root, "var/lib/dpkg/status") == ""
    assert (root / "var/lib/dpkg/lock-frontend").is_file()
    assert "[Install]" in _read(root, "lib/systemd/system/containerd.service")
    assert "[Install]" in _read(root, "lib/systemd/system/kubelet.service")
    assert (root / "etc/systemd/system").is_dir()
    assert not (root / "sys/module/nvidia").exists()

    state = json.loads(_read(root, "var/lib/bootfsm-sim/sim.json"))
    assert state["sku"] == name
    assert state["faults"] == []
    assert state["fabric_in_progress_calls"] == 2

    for exe in bin_dir.iterdir():
        assert os.access(exe, os.X_OK)
        assert exe.read_text().startswith("#!")
    assert {p.name for p in bin_dir.iterdir()} >= {"nvidia-smi", "systemctl", "dpkg", "modprobe"}
    assert (root / "run/bootfsm-sim/active/containerd.service").exists()
    assert not (root / "run/bootfsm-sim/active/kubelet.service").exists()


def test_build_node_rejects_unknown_fault(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        build_node(tmp_path, SKUS["h100-hgx"], ["no-such-fault"])
    assert "installer-hangs" in FAULTS and "cdi-fails" in FAULTS


def test_standin_script_bakes_name_root_and_interpreter(tmp_path: Path) -> None:
    text = standin_script("nvidia-installer", tmp_path, python="/usr/bin/python3")
    assert text.startswith("#!/usr/bin/python3\n")
    assert "main('nvidia-installer', " in text and repr(str(tmp_path)) in text
    compile(text, "nvidia-installer", "exec")
    with pytest.raises(ValueError, match="shebang"):
        standin_script("x", tmp_path, python="/opt/my python/bin/python")


def test_stale_driver_fault_leaves_old_proprietary_driver_loaded(tmp_path: Path) -> None:
    build_node(tmp_path, SKUS["h100-hgx"], ["stale-driver"])
    assert _read(tmp_path, "sys/module/nvidia/version") == "535.183.01\n"
    proc = _read(tmp_path, "proc/driver/nvidia/version")
    assert proc.startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  ")
    assert "Open Kernel Module" not in proc
    assert (tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.183.01").is_file()
    assert len(list((tmp_path / "proc/driver/nvidia-nvswitch/devices").iterdir())) == 4


def test_stale_fabricmanager_unit_fails_at_boot_without_nvswitch(tmp_path: Path) -> None:
    bin_dir = build_node(tmp_path, SKUS["h100-pcie"], ["stale-fabricmanager-unit"])
    assert _run(bin_dir, "systemctl", "is-enabled", "nvidia-fabricmanager").stdout == "enabled\n"
    active = _run(bin_dir, "systemctl", "is-active", "nvidia-fabricmanager")
    assert (active.returncode, active.stdout) == (3, "failed\n")


def test_dpkg_lock_holder_really_holds_the_posix_lock(tmp_path: Path) -> None:
    build_node(tmp_path, SKUS["h100-pcie"])
    lock = tmp_path / "var/lib/dpkg/lock-frontend"
    with DpkgLockHolder(tmp_path) as holder:
        assert holder.pid > 0
        fd = os.open(lock, os.O_RDWR)
        try:
            with pytest.raises(OSError) as caught:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert caught.value.errno in (errno.EACCES, errno.EAGAIN)
        finally:
            os.close(fd)
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def _install_driver(root: Path, bin_dir: Path, arch: str, module_type: str) -> None:
    extract = root / f"var/lib/bootfsm/extract/NVIDIA-Linux-{arch}-580.159.04"
    extract.mkdir(parents=True)
    installer = extract / "nvidia-installer"
    installer.write_text(standin_script("nvidia-installer", root))
    installer.chmod(0o755)
    done = _run(bin_dir, str(installer), "-s", "--dkms", f"--kernel-module-type={module_type}")
    assert done.returncode == 0, done.stderr


def test_simulate_reboot_loads_built_driver_and_starts_enabled_units(tmp_path: Path) -> None:
    bin_dir = build_node(tmp_path, SKUS["h100-hgx"])
    _install_driver(tmp_path, bin_dir, "x86_64", "proprietary")
    assert _run(bin_dir, "nvidia-modprobe", "-u", "-c0").returncode == 0
    (tmp_path / "lib/systemd/system/nvidia-fabricmanager.service").write_text(FM_UNIT)
    assert _run(bin_dir, "systemctl", "enable", "--now", "nvidia-fabricmanager").returncode == 0
    assert _run(bin_dir, "systemctl", "start", "kubelet").returncode == 0  # started, not enabled
    (tmp_path / "run/bootfsm-sim/marker").write_text("x")

    simulate_reboot(tmp_path)

    assert not (tmp_path / "run/bootfsm-sim/marker").exists()
    assert _read(tmp_path, "sys/module/nvidia/version") == "580.159.04\n"
    assert (tmp_path / "dev/nvidia7").exists()
    assert _run(bin_dir, "systemctl", "is-active", "nvidia-fabricmanager").stdout == "active\n"
    assert _run(bin_dir, "systemctl", "is-active", "containerd").stdout == "active\n"
    assert _run(bin_dir, "systemctl", "is-active", "kubelet").stdout == "inactive\n"


def test_simulate_reboot_leaves_proprietary_module_unloaded_on_blackwell(tmp_path: Path) -> None:
    bin_dir = build_node(tmp_path, SKUS["b200-hgx"])
    _install_driver(tmp_path, bin_dir, "x86_64", "proprietary")
    simulate_reboot(tmp_path)
    assert not (tmp_path / "sys/module/nvidia").exists()
    assert not (tmp_path / "dev/nvidia0").exists()


def test_simulate_reboot_restarts_grace_fabric_registration(tmp_path: Path) -> None:
    bin_dir = build_node(tmp_path, SKUS["gb200"])
    _install_driver(tmp_path, bin_dir, "aarch64", "open")
    assert _run(bin_dir, "nvidia-modprobe", "-u", "-c0").returncode == 0

    def state() -> str:
        out = _run(bin_dir, "nvidia-smi", "-q").stdout
        return next(
            ln.split(":", 1)[1].strip()
            for ln in out.splitlines()
            if ln.startswith("        State ")
        )

    assert [state(), state(), state()] == ["In Progress", "In Progress", "Completed"]
    simulate_reboot(tmp_path)
    assert state() == "In Progress"


def test_calls_log_records_every_standin_invocation(tmp_path: Path) -> None:
    bin_dir = build_node(tmp_path, SKUS["h100-pcie"])
    assert calls(tmp_path) == []
    _run(bin_dir, "nvidia-smi")
    _run(bin_dir, "systemctl", "is-active", "kubelet")
    log = calls(tmp_path)
    assert [(c["cmd"], c["argv"], c["rc"]) for c in log] == [
        ("nvidia-smi", [], 9),
        ("systemctl", ["is-active", "kubelet"], 3),
    ]
    assert all(isinstance(c["t"], float) for c in log)
    assert not [c for c in log if c["cmd"] == "nvidia-installer"]


def test_kubelet_healthz_follows_unit_and_fault(tmp_path: Path) -> None:
    bin_dir = build_node(tmp_path / "a", SKUS["h100-pcie"])
    assert kubelet_healthz(tmp_path / "a")[0] == 500
    assert _run(bin_dir, "systemctl", "start", "kubelet").returncode == 0
    status, headers, body = kubelet_healthz(tmp_path / "a")
    assert (status, body) == (200, b"ok")
    assert headers["Content-Type"].startswith("text/plain")

    bin_dir = build_node(tmp_path / "b", SKUS["h100-pcie"], ["kubelet-unhealthy"])
    assert _run(bin_dir, "systemctl", "start", "kubelet").returncode == 0
    assert kubelet_healthz(tmp_path / "b")[:3:2] == (500, b"[-]ping failed")


@pytest.mark.parametrize("name", ["h100-hgx", "gb200"])
def test_imds_instance_reports_the_sku_vm_size(tmp_path: Path, name: str) -> None:
    build_node(tmp_path, SKUS[name])
    status, headers, body = imds_instance(tmp_path)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    doc = json.loads(body)
    assert doc["compute"]["vmSize"] == SKUS[name].vm_size
    assert doc["compute"]["osType"] == "Linux"
    assert parse_imds_vm_size(body.decode()) == SKUS[name].vm_size.lower()
