"""The simulated node's files, host facts and MIG state: :class:`NodeBase`.

Everything is kept in the node directory. Node facts (kernel, arch, PCI devices) are
read from the node's own files every time, so a test that edits the node directory
changes what the stand-ins report; the MIG mode survives a reboot (var/lib), the MIG
instances do not (run/). Also the paths every stand-in shares (the calls log, the
simulator's state file) and :func:`log_call`. The driver and the units build on this
(:mod:`nodestate_driver`, :mod:`nodestate_units`); :class:`nodestate.Node` is the whole.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bootfsm.core.hardware import Family, model_for
from bootfsm.sim.skus import SKUS, Sku, smi_product_name

__all__ = [
    "CALLS_LOG",
    "IB_PORT_GUID",
    "JOURNAL",
    "MIG_INSTANCES",
    "MIG_MODES",
    "RUN_DIR",
    "SIM_DIR",
    "SIM_STATE",
    "UNIT_JOURNAL",
    "NodeBase",
    "log_call",
    "smi_bus_id",
]

# the simulated ConnectX-7 port (node_layout writes its sysfs; the fabric manager start
# script stand-in names it as the real one does from ibstat)
IB_PORT_GUID = "0x0820e703007b9d9a"
SIM_DIR = "var/lib/bootfsm-sim"
SIM_STATE = f"{SIM_DIR}/sim.json"
CALLS_LOG = f"{SIM_DIR}/calls.jsonl"
RUN_DIR = "run/bootfsm-sim"
MIG_MODES = f"{SIM_DIR}/mig-mode.json"
"""Each GPU's MIG mode, {address: [current, pending]}: the GPU keeps it across reboots."""
MIG_INSTANCES = f"{RUN_DIR}/mig-instances.json"
"""GPU and compute instances, {address: [{"gi", "profile", "start", "size", "cis"}]}: they
live in the driver, so a reboot (or a driver reload) leaves none."""
JOURNAL = "var/log/bootfsm-sim/journal.log"
UNIT_JOURNAL = "var/log/bootfsm-sim/unit-journal.jsonl"
"""The systemd journal's entries as JSON lines (the fields journalctl matches on)."""


def log_call(root: Path, cmd: str, argv: list[str], rc: int, started: float) -> None:
    """Append one stand-in invocation to calls.jsonl (a single O_APPEND write)."""
    record = {
        "cmd": cmd,
        "argv": argv,
        "rc": rc,
        "t": started,
        "dt": round(time.time() - started, 4),
    }
    path = root / CALLS_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def smi_bus_id(address: str) -> str:
    """sysfs "0001:00:00.0" -> nvidia-smi "00000001:00:00.0" (8-digit domain, upper case)."""
    domain, rest = address.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


class NodeBase:
    """A simulated node rooted at ``root`` (the directory bootfsm sees as ``/``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        data = json.loads((root / SIM_STATE).read_text())
        self.sku: Sku = SKUS[data["sku"]]
        self.faults: frozenset[str] = frozenset(data.get("faults", ()))
        self.compile_seconds = float(data.get("compile_seconds", 0.05))
        self.fabric_in_progress_calls = int(data.get("fabric_in_progress_calls", 2))

    # ------------------------------------------------------------------ files

    def p(self, node_path: str) -> Path:
        """The real path of a node path ("/etc/x" or "etc/x")."""
        return self.root / node_path.lstrip("/")

    def write(self, node_path: str, data: str | bytes, mode: int = 0o644) -> Path:
        """Write a node file (parents created), replacing it atomically."""
        path = self.p(node_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.sim-tmp")
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(data)
        tmp.chmod(mode)
        os.replace(tmp, path)
        return path

    def read(self, node_path: str) -> str | None:
        """A node file's text, or None when it is absent."""
        try:
            return self.p(node_path).read_text()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def remove(self, node_path: str) -> None:
        """Remove a node file, symlink or tree; absent is fine."""
        path = self.p(node_path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()

    def symlink(self, target: str, node_path: str) -> None:
        """Create (or replace) a symlink at node_path pointing at target (kept verbatim)."""
        path = self.p(node_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(path):
            path.unlink()
        os.symlink(target, path)

    def journal(self, line: str) -> None:
        """Append one line to the simulated journal (var/log/bootfsm-sim/journal.log)."""
        path = self.p(JOURNAL)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(f"{time.strftime('%b %d %H:%M:%S')} {line}\n")

    def kernel_log(self, message: str) -> None:
        """A kernel message (printk): in the journal with _TRANSPORT=kernel, as journald
        reads /dev/kmsg (systemd.journal-fields(7)), what `journalctl -k` shows."""
        self.journal(f"kernel: {message}")
        path = self.p(UNIT_JOURNAL)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"_TRANSPORT": "kernel", "SYSLOG_IDENTIFIER": "kernel", "MESSAGE": message}
        with path.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")

    def fault(self, name: str) -> bool:
        """Whether a node-side fault is injected."""
        return name in self.faults

    # ------------------------------------------------------------------ host facts

    @property
    def kernel(self) -> str:
        """Running kernel release (/proc/sys/kernel/osrelease)."""
        return (self.read("proc/sys/kernel/osrelease") or self.sku.kernel).strip()

    @property
    def arch(self) -> str:
        """Kernel architecture (/proc/sys/kernel/arch): x86_64 or aarch64."""
        return (self.read("proc/sys/kernel/arch") or self.sku.arch).strip()

    @property
    def deb_arch(self) -> str:
        """Debian architecture name: amd64 or arm64."""
        return {"x86_64": "amd64", "aarch64": "arm64"}.get(self.arch, self.arch)

    @property
    def libdir(self) -> str:
        """Node path of the multiarch library directory."""
        return f"usr/lib/{self.arch}-linux-gnu"

    def _pci(self) -> Iterator[tuple[str, int, int, int]]:
        """(address, vendor, device, class) of every PCI function in sysfs, sorted."""
        base = self.p("sys/bus/pci/devices")
        if not base.is_dir():
            return
        for dev in sorted(base.iterdir()):
            try:
                vendor, device, cls = (
                    int((dev / attr).read_text().strip(), 16)
                    for attr in ("vendor", "device", "class")
                )
            except (OSError, ValueError):
                continue
            yield dev.name, vendor, device, cls

    def gpus(self) -> list[tuple[str, int]]:
        """(address, device id) of every NVIDIA GPU on the PCI bus."""
        return [
            (a, d)
            for a, v, d, c in self._pci()
            if v == 0x10DE and c & 0xFFFF00 in (0x030200, 0x030000)
        ]

    def visible_gpus(self) -> list[tuple[str, int]]:
        """GPUs the driver sees: one fewer than PCI under the gpu-missing fault."""
        gpus = self.gpus()
        return gpus[:-1] if self.fault("gpu-missing") and gpus else gpus

    def nvswitches(self) -> list[str]:
        """Addresses of NVSwitch functions on the PCI bus."""
        return [a for a, v, _d, c in self._pci() if v == 0x10DE and c & 0xFFFF00 == 0x068000]

    def nvlink5(self) -> bool:
        """An InfiniBand port whose VPD carries SW_MNG (NVLink5 switch management)."""
        base = self.p("sys/class/infiniband")
        if not base.is_dir():
            return False
        for dev in base.iterdir():
            try:
                if b"SW_MNG" in (dev / "device" / "vpd").read_bytes():
                    return True
            except OSError:
                continue
        return False

    def blackwell_gpu(self) -> tuple[str, int] | None:
        """The first GPU that only the open kernel module can drive, if any."""
        for address, device in self.gpus():
            if model_for(device).family is Family.BLACKWELL:
                return address, device
        return None

    def pre_turing_gpu(self) -> tuple[str, int] | None:
        """The first GPU without a GSP (older than Turing: every device id below 0x1e00,
        pci.ids: Volta's GV100 is 0x1dxx, Turing's TU102 0x1e02), which the open kernel
        modules refuse, if any."""
        return next(((a, d) for a, d in self.gpus() if d < 0x1E00), None)

    def recommended_module_type(self) -> str:
        """What nvidia-installer recommends: open when any GPU is Blackwell."""
        return "open" if self.blackwell_gpu() is not None else "proprietary"

    def gpu_uuid(self, address: str) -> str:
        """A stable GPU UUID derived from the node's VM size and the PCI address."""
        import uuid  # only nvidia-smi asks

        return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'bootfsm-sim:{self.sku.vm_size}:{address}')}"

    def product_name(self, device: int) -> str:
        """nvidia-smi product name of a device id."""
        return smi_product_name(device)

    # ------------------------------------------------------------------ MIG

    def mig_mode(self, address: str) -> tuple[bool, bool]:
        """(current, pending) MIG mode of a GPU; both off until something enables it."""
        modes = json.loads(self.read(MIG_MODES) or "{}")
        current, pending = modes.get(address, [False, False])
        return bool(current), bool(pending)

    def set_mig_mode(self, address: str, current: bool, pending: bool) -> None:
        """Record a GPU's MIG mode."""
        modes = json.loads(self.read(MIG_MODES) or "{}")
        modes[address] = [current, pending]
        self.write(MIG_MODES, json.dumps(modes, sort_keys=True))

    def mig_instances(self, address: str) -> list[dict[str, Any]]:
        """The GPU instances on a GPU (each with its compute instance ids), in placement
        order (as `nvidia-smi mig -lgi` lists them)."""
        every = json.loads(self.read(MIG_INSTANCES) or "{}")
        return sorted(every.get(address, []), key=lambda gi: int(gi["start"]))

    def set_mig_instances(self, address: str, instances: list[dict[str, Any]]) -> None:
        """Replace a GPU's GPU instances."""
        every = json.loads(self.read(MIG_INSTANCES) or "{}")
        every[address] = instances
        self.write(MIG_INSTANCES, json.dumps(every, sort_keys=True))
