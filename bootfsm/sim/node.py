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

from bootfsm.sim.node_layout import apply_build_faults, write_layout
from bootfsm.sim.nodestate import CALLS_LOG, SIM_STATE, Node, standin_script
from bootfsm.sim.skus import FAULTS, SKUS, Sku
from bootfsm.sim.standins import PATH_STANDINS

__all__ = [
    "BIN_DIR",
    "FAULTS",
    "SKUS",
    "VM_SIZE",
    "VM_TAGS",
    "DpkgLockHolder",
    "Sku",
    "build_node",
    "calls",
    "imds_instance",
    "kubelet_healthz",
    "simulate_kernel_upgrade",
    "simulate_reboot",
    "standin_script",
]

BIN_DIR = "opt/bootfsm-sim/bin"
"""Node path of the stand-in executables (returned by build_node)."""
VM_TAGS = "opt/bootfsm-sim/vm-tags.json"
"""Node path of the VM's extra IMDS tags (a JSON list of [name, value]; World.vm_tags)."""
VM_SIZE = "opt/bootfsm-sim/vm-size"
"""Node path of a VM size IMDS reports instead of the SKU's (World.vm_size)."""

_SHEBANG_MAX = 255


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
    write_layout(node, sku, faults)
    apply_build_faults(node, faults)
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
    processes = node.p("proc").glob("[0-9]*")  # no process outlives a reboot
    for path in [*node.p("sys/module").glob("nvidia*"), *node.p("proc/driver").glob("nvidia*"),
                 *processes]:  # fmt: skip
        node.remove(str(path.relative_to(node.root)))
    node.boot()


def simulate_kernel_upgrade(root: Path, kernel: str) -> list[str]:
    """An unattended kernel upgrade: the new kernel and its headers installed, then the
    kernel's postinst hooks; return the DKMS modules built for it ("module/version").

    Reference: dkms's kernel hook (/etc/kernel/postinst.d/dkms, dkms 3.0.10 on Debian 12
    and Ubuntu) runs `dkms autoinstall` for the new kernel, which builds and installs
    every module registered in /var/lib/dkms (a ``source`` link to /usr/src/<m>-<v>)
    whose dkms.conf says ``AUTOINSTALL="yes"`` (nvidia-installer --dkms writes it). A
    module installed without DKMS (``--no-dkms``) is not rebuilt. The new kernel runs
    only after a reboot (write proc/sys/kernel/osrelease, then ``simulate_reboot``)."""
    from bootfsm.sim.standin_installer import dkms_build  # the stand-ins' own builder

    node = Node(Path(root))
    node.write(f"lib/modules/{kernel}/build/Makefile", f"# headers {kernel}\n")
    built: list[str] = []
    dkms = node.p("var/lib/dkms")
    sources = [v / "source" for m in (dkms.iterdir() if dkms.is_dir() else ()) for v in m.iterdir()]
    for tree in sorted(t for t in sources if t.is_symlink()):  # links to /usr/src/<m>-<v>
        conf = node.read(f"{os.readlink(tree).lstrip('/')}/dkms.conf") or ""
        if 'AUTOINSTALL="yes"' not in conf:
            continue
        module, version = tree.parent.parent.name, tree.parent.name
        old = sorted(tree.parent.glob(f"*/{node.arch}/module/nvidia.ko"))
        text = old[0].read_text() if old else ""
        kind = "open" if "module_type=open" in text else "proprietary"
        dkms_build(node, version, kernel, kind)
        built.append(f"{module}/{version}")
    return built


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
    extra, size = root / VM_TAGS, root / VM_SIZE
    tags = [("aks-managed-poolName", "gpu")]
    trusted = node.fault("secure-boot")
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
        # Trusted Launch turns on Secure Boot and the vTPM (Microsoft's IMDS reference,
        # samples azure-imds/imds_compute_docs_sample_linux.json: strings, not booleans)
        "securityProfile": {
            "secureBootEnabled": "true" if trusted else "false",
            "virtualTpmEnabled": "true" if trusted else "false",
            "encryptionAtHost": "false",
            "securityType": "TrustedLaunch" if trusted else "",
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
        "vmSize": size.read_text().strip() if size.exists() else sku.vm_size,
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
