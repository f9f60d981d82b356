"""Build simulated GPU nodes: a node is a directory plus stand-in commands.

:func:`build_node` lays out, under a root directory, every file bootfsm reads (see
docs/node-contract.md) for one :class:`Sku`, and writes the stand-in executables that
bootfsm runs instead of the real tools; callers put the returned bin dir first on PATH.
The stand-ins keep their state in the node directory, so what ``nvidia-smi`` reports
follows from what the installer installed and what ``systemctl`` started.
"""

from __future__ import annotations

import json
import os
import select
import subprocess  # noqa: TID251 - bootfsm/sim spawns the lock-holder child
import sys
from collections.abc import Collection
from pathlib import Path
from types import TracebackType
from typing import Any

from bootfsm.sim.nodestate import CALLS_LOG, SIM_STATE, Node, standin_script
from bootfsm.sim.skus import FAULTS, SKUS, STALE_DRIVER_VERSION, Sku, pci_layout
from bootfsm.sim.standin_installer import install_driver_files
from bootfsm.sim.standins import PATH_STANDINS

__all__ = [
    "BIN_DIR",
    "FAULTS",
    "SKUS",
    "VM_TAGS",
    "DpkgLockHolder",
    "Sku",
    "build_node",
    "calls",
    "imds_instance",
    "kubelet_healthz",
    "simulate_reboot",
    "standin_script",
]

BIN_DIR = "opt/bootfsm-sim/bin"
"""Node path of the stand-in executables (returned by build_node)."""
VM_TAGS = "opt/bootfsm-sim/vm-tags.json"
"""Node path of the VM's extra IMDS tags (a JSON list of [name, value]; World.vm_tags)."""

_OS_RELEASE = {
    "22.04": (
        'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\n'
        'VERSION="22.04.5 LTS (Jammy Jellyfish)"\nVERSION_CODENAME=jammy\nID=ubuntu\n'
        'ID_LIKE=debian\nHOME_URL="https://www.ubuntu.com/"\n'
        'SUPPORT_URL="https://help.ubuntu.com/"\nBUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"\n'
        'PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"\n'
        "UBUNTU_CODENAME=jammy\n"
    ),
    "24.04": (
        'PRETTY_NAME="Ubuntu 24.04.2 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
        'VERSION="24.04.2 LTS (Noble Numbat)"\nVERSION_CODENAME=noble\nID=ubuntu\n'
        'ID_LIKE=debian\nHOME_URL="https://www.ubuntu.com/"\n'
        'SUPPORT_URL="https://help.ubuntu.com/"\nBUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"\n'
        'PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"\n'
        "UBUNTU_CODENAME=noble\nLOGO=ubuntu-logo\n"
    ),
}

_CONTAINERD_UNIT = """\
# Copyright The containerd Authors.
# Licensed under the Apache License, Version 2.0 (the "License");

[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target local-fs.target dbus.service

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/bin/containerd

Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
"""

_KUBELET_UNIT = """\
[Unit]
Description=Kubelet
ConditionPathExists=/usr/local/bin/kubelet
Wants=network-online.target containerd.service
After=network-online.target containerd.service

[Service]
Restart=always
RestartSec=2
EnvironmentFile=/etc/default/kubelet
SuccessExitStatus=143
ExecStart=/usr/local/bin/kubelet \\
        --enable-server \\
        --node-labels="${KUBELET_NODE_LABELS}" \\
        --v=2 \\
        $KUBELET_CONFIG_FILE_FLAGS \\
        $KUBELET_CONTAINERD_FLAGS \\
        $KUBELET_FLAGS

[Install]
WantedBy=multi-user.target
"""

_OLD_FABRICMANAGER_UNIT = """\
[Unit]
Description=NVIDIA fabric manager service
After=network-online.target
Requires=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking

ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg

LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""

_CONTAINERD_CONFIG = {
    "1": (
        # as AgentBaker writes it: no imports line (the drop-in needs one added)
        'version = 2\noom_score = -999\n\n[plugins."io.containerd.grpc.v1.cri"]\n'
        '  sandbox_image = "mcr.microsoft.com/oss/kubernetes/pause:3.6"\n'
        '  [plugins."io.containerd.grpc.v1.cri".containerd]\n    default_runtime_name = "runc"\n'
        '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        '      runtime_type = "io.containerd.runc.v2"\n'
        '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        '      BinaryName = "/usr/bin/runc"\n      SystemdCgroup = true\n'
    ),
    "2": (
        'version = 3\noom_score = -999\n\n[plugins."io.containerd.cri.v1.images".pinned_images]\n'
        '  sandbox = "mcr.microsoft.com/oss/kubernetes/pause:3.6"\n\n'
        '[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "runc"\n'
        '  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]\n'
        '    runtime_type = "io.containerd.runc.v2"\n'
        '  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\n'
        '    BinaryName = "/usr/bin/runc"\n    SystemdCgroup = true\n'
    ),
}

_SHEBANG_MAX = 255


def _vpd(sw_mng: bool) -> bytes:
    """Binary PCI VPD of a ConnectX-7: ident string, VPD-R keywords, RV checksum, end tag."""
    ident = b"NVIDIA ConnectX-7 HHHL adapter card, 400Gb/s NDR IB, single-port OSFP"
    model = b"SW_MNG" if sw_mng else b"CX75310A"
    keywords = [
        (b"PN", b"MCX75310AAS-NEAT"),
        (b"EC", b"A7"),
        (b"V2", b"MCX75310AAS-NEAT"),
        (b"SN", b"MT2412X00001"),
        (b"V3", b"4b1c8e3a0f2d11efa9f27cfe90c31a42"),
        (b"VA", b"MLX:MN=MLNX:CSKU=V2:UUID=V3:PCI=V0:MODL=" + model),
        (b"V0", b"PCIeGen5 x16"),
    ]
    body = b"".join(k + bytes([len(v)]) + v for k, v in keywords)
    head = b"\x82" + len(ident).to_bytes(2, "little") + ident
    rv_len = 1
    vpd_r_len = len(body) + 3 + rv_len
    partial = head + b"\x90" + vpd_r_len.to_bytes(2, "little") + body + b"RV" + bytes([rv_len])
    checksum = (-sum(partial)) & 0xFF
    return partial + bytes([checksum]) + b"\x78"


def _layout(node: Node, sku: Sku, faults: Collection[str]) -> None:
    """Write the static node files for a SKU."""
    node.write("proc/sys/kernel/arch", f"{sku.arch}\n")
    node.write("proc/sys/kernel/osrelease", f"{sku.kernel}\n")
    node.write("usr/lib/os-release", _OS_RELEASE[sku.os_version])
    node.symlink("../usr/lib/os-release", "etc/os-release")
    for func in pci_layout(sku):
        base = f"sys/bus/pci/devices/{func.address}"
        node.write(f"{base}/vendor", f"0x{func.vendor:04x}\n")
        node.write(f"{base}/device", f"0x{func.device:04x}\n")
        node.write(f"{base}/class", f"0x{func.pci_class:06x}\n")
    node.write("sys/class/infiniband/mlx5_0/device/vpd", _vpd(sku.nvlink5))
    modules = f"lib/modules/{sku.kernel}"
    node.write(
        f"{modules}/modules.dep", "kernel/drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko:\n"
    )
    if "kernel-headers-missing" not in faults:
        node.write(
            f"{modules}/build/Makefile",
            f"# Linux kernel headers for {sku.kernel}\nVERSION = {sku.kernel.split('.')[0]}\n",
        )
        node.write(f"{modules}/build/.config", "CONFIG_MODULES=y\nCONFIG_MODULE_UNLOAD=y\n")
    node.write(f"boot/vmlinuz-{sku.kernel}", "")
    node.write(f"boot/initrd.img-{sku.kernel}", f"initramfs for {sku.kernel} (bootfsm simulator)\n")
    node.write("var/lib/dpkg/status", "")
    node.write("var/lib/dpkg/lock-frontend", "", 0o640)
    node.write("var/lib/dpkg/lock", "", 0o640)
    node.write("lib/systemd/system/containerd.service", _CONTAINERD_UNIT)
    node.write("lib/systemd/system/kubelet.service", _KUBELET_UNIT)
    node.write("etc/containerd/config.toml", _CONTAINERD_CONFIG[sku.containerd_version[0]])
    for directory in ("etc/systemd/system/multi-user.target.wants", "etc/modprobe.d",
                      "etc/udev/rules.d", "var/lib/dpkg/info", "var/log", "dev", "run",
                      f"usr/lib/{sku.arch}-linux-gnu", "usr/bin", "usr/src"):  # fmt: skip
        node.p(directory).mkdir(parents=True, exist_ok=True)
    node.symlink(
        "/lib/systemd/system/containerd.service",
        "etc/systemd/system/multi-user.target.wants/containerd.service",
    )


def _apply_build_faults(node: Node, faults: Collection[str]) -> None:
    """Faults that are part of the image: a stale driver, a stale fabric manager unit."""
    if "stale-driver" in faults or "stale-driver-in-use" in faults:
        install_driver_files(node, STALE_DRIVER_VERSION, node.kernel, "proprietary")
        node.load_module(force=True)
    if "stale-fabricmanager-unit" in faults:
        node.write("lib/systemd/system/nvidia-fabricmanager.service", _OLD_FABRICMANAGER_UNIT)
        node.symlink(
            "/lib/systemd/system/nvidia-fabricmanager.service",
            "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service",
        )


def build_node(
    root: Path,
    sku: Sku,
    faults: Collection[str] = (),
    *,
    compile_seconds: float = 0.05,
    python: str = sys.executable,
) -> Path:
    """Lay out a booted node of `sku` under `root` (created) and return its stand-in bin dir.

    The node comes up as after a boot: containerd enabled and active, kubelet installed
    but disabled, no NVIDIA driver (unless a stale-driver fault puts an old one there).
    Raises ValueError for an unknown fault name.
    """
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; known: {sorted(FAULTS)}")
    if SKUS.get(sku.name) != sku:
        raise ValueError(f"sku {sku.name!r} is not one of SKUS (the stand-ins look it up by name)")
    root = Path(root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    state = {
        "sku": sku.name,
        "faults": sorted(set(faults)),
        "compile_seconds": compile_seconds,
        "fabric_in_progress_calls": 2,
    }
    (root / SIM_STATE).parent.mkdir(parents=True, exist_ok=True)
    (root / SIM_STATE).write_text(json.dumps(state, indent=2) + "\n")
    node = Node(root)
    _layout(node, sku, faults)
    _apply_build_faults(node, faults)
    node.boot()
    bin_dir = root / BIN_DIR
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in PATH_STANDINS:
        node.write(f"{BIN_DIR}/{name}", standin_script(name, root, python), 0o755)
    return bin_dir


def simulate_reboot(root: Path) -> None:
    """Reboot the node: clear run/, dev/ and the loaded driver, then boot as systemd would.

    Boot loads the nvidia module when one is built for the running kernel (a proprietary
    module on a Blackwell node stays unloaded) and starts every enabled, unmasked unit;
    units that cannot start end up failed.
    """
    node = Node(Path(root))
    for volatile in ("run", "dev"):
        node.remove(volatile)
        node.p(volatile).mkdir(parents=True)
    for path in [*node.p("sys/module").glob("nvidia*"), *node.p("proc/driver").glob("nvidia*")]:
        node.remove(str(path.relative_to(node.root)))
    node.boot()


def calls(root: Path) -> list[dict[str, Any]]:
    """Every stand-in invocation so far: {"cmd", "argv", "rc", "t", "dt"} in call order.

    A hanging installer killed by SIGTERM is logged with rc -15; one killed by SIGKILL
    only is not logged.
    """
    path = Path(root) / CALLS_LOG
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kubelet_healthz(root: Path) -> tuple[int, dict[str, str], bytes]:
    """kubelet's /healthz: 200 "ok" while kubelet.service is active and healthy, else 500."""
    node = Node(Path(root))
    headers = {"Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"}
    if node.unit_state("kubelet.service") == "active" and not node.fault("kubelet-unhealthy"):
        return 200, headers, b"ok"
    return 500, headers, b"[-]ping failed"


def imds_instance(root: Path) -> tuple[int, dict[str, str], bytes]:
    """Azure IMDS /metadata/instance document for the node's SKU (compute.vmSize set)."""
    node = Node(Path(root))
    sku = node.sku
    plan = {"name": "", "product": "", "publisher": ""}
    extra = root / VM_TAGS
    tags = [("aks-managed-poolName", "gpu")]
    if extra.exists():
        tags += [(str(k), str(v)) for k, v in json.loads(extra.read_text())]
    compute: dict[str, Any] = {
        "azEnvironment": "AzurePublicCloud",
        "additionalCapabilities": {"hibernationEnabled": "false"},
        "evictionPolicy": "",
        "isHostCompatibilityLayerVm": "false",
        "licenseType": "",
        "location": "southcentralus",
        "name": f"aks-gpu-{sku.name}-vmss000000",
        "offer": "",
        "osProfile": {
            "adminUsername": "azureuser",
            "computerName": f"aks-gpu-{sku.name}-vmss000000",
            "disablePasswordAuthentication": "true",
        },
        "osType": "Linux",
        "placementGroupId": "",
        "plan": plan,
        "platformFaultDomain": "0",
        "platformUpdateDomain": "0",
        "priority": "Regular",
        "provider": "Microsoft.Compute",
        "publicKeys": [],
        "publisher": "",
        "resourceGroupName": "mc_bootfsm_sim_southcentralus",
        "resourceId": (
            "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/"
            f"mc_bootfsm_sim_southcentralus/providers/Microsoft.Compute/virtualMachineScaleSets/"
            f"aks-gpu-{sku.name}-vmss/virtualMachines/0"
        ),
        "securityProfile": {
            "secureBootEnabled": "false",
            "virtualTpmEnabled": "false",
            "encryptionAtHost": "false",
            "securityType": "",
        },
        "sku": "",
        "storageProfile": {
            "imageReference": {"id": "", "offer": "", "publisher": "", "sku": "", "version": ""},
            "osDisk": {
                "caching": "ReadOnly",
                "createOption": "FromImage",
                "diskSizeGB": "128",
                "name": f"aks-gpu-{sku.name}-osdisk",
                "osType": "Linux",
            },
            "resourceDisk": {"size": "2969600"},
        },
        "subscriptionId": "00000000-0000-0000-0000-000000000000",
        # IMDS gives the tags twice: "name:value;..." and, since api-version 2019-06-04,
        # tagsList (Microsoft's IMDS reference; AgentBaker's should_skip_nvidia_drivers
        # reads tagsList at api-version 2021-02-01)
        "tags": ";".join(f"{k}:{v}" for k, v in tags),
        "tagsList": [{"name": k, "value": v} for k, v in tags],
        "version": "",
        "vmId": node.gpu_uuid("vm").removeprefix("GPU-"),
        "vmScaleSetName": f"aks-gpu-{sku.name}-vmss",
        "vmSize": sku.vm_size,
        "zone": "",
    }
    ipv4 = {
        "ipAddress": [{"privateIpAddress": "10.224.0.4", "publicIpAddress": ""}],
        "subnet": [{"address": "10.224.0.0", "prefix": "16"}],
    }
    interface = {"ipv4": ipv4, "ipv6": {"ipAddress": []}, "macAddress": "6045BDA1B2C3"}
    network = {"interface": [interface]}
    body = json.dumps({"compute": compute, "network": network}).encode()
    return 200, {"Content-Type": "application/json; charset=utf-8"}, body


_HOLDER = (
    "import fcntl, os, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)\n"
    "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
    "sys.stdout.write('locked\\n')\n"
    "sys.stdout.flush()\n"
    "sys.stdin.read()\n"
)


class DpkgLockHolder:
    """Context manager: a child process holds the node's dpkg frontend lock while inside.

    The lock is a POSIX ``fcntl.lockf`` lock on ``<root>/var/lib/dpkg/lock-frontend``,
    as apt and dpkg take it; ``__enter__`` returns once the child really holds it
    (RuntimeError if it cannot within `timeout_s`); ``__exit__`` kills the child.
    """

    def __init__(
        self, root: Path, *, python: str = sys.executable, timeout_s: float = 10.0
    ) -> None:
        self.path = Path(root) / "var/lib/dpkg/lock-frontend"
        self._python = python
        self._timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """PID of the holder (what dpkg reports as holding the lock)."""
        if self._proc is None:
            raise RuntimeError("DpkgLockHolder is not active")
        return self._proc.pid

    def __enter__(self) -> DpkgLockHolder:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [self._python, "-c", _HOLDER, str(self.path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._proc = proc
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], self._timeout_s)
        line = os.read(proc.stdout.fileno(), 64) if ready else b""
        if line.strip() != b"locked":
            self._stop()
            raise RuntimeError(f"lock holder did not take {self.path} within {self._timeout_s}s")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
