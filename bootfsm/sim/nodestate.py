"""The state of a simulated node, kept entirely in its node directory.

Shared by the stand-in commands and :mod:`bootfsm.sim.node`. Node facts (kernel, arch,
PCI devices) are read from the node's own files every time, so a test that edits the
node directory changes what the stand-ins report. Runtime state (active units, the
loaded driver, counters) lives where Linux keeps it: under ``run/``, ``sys/``,
``proc/`` and ``dev/``, which a reboot clears.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bootfsm
from bootfsm.core.hardware import Family, model_for
from bootfsm.sim.skus import SKUS, Sku, smi_product_name

__all__ = [
    "CALLS_LOG",
    "RUN_DIR",
    "SIM_DIR",
    "SIM_STATE",
    "UNIT_DIRS",
    "Module",
    "Node",
    "log_call",
    "smi_bus_id",
    "unit_name",
]

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
UNIT_DIRS = (
    "etc/systemd/system",
    "run/systemd/system",
    "lib/systemd/system",
    "usr/lib/systemd/system",
)
_UNIT_SUFFIXES = frozenset(
    {"service", "socket", "target", "path", "timer", "mount", "device", "slice", "scope"}
)
FABRIC_MANAGER = "nvidia-fabricmanager.service"
NVLSM = "nvlsm.service"
_FM_CMD = "/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg"
_NOTHING_TO_DO = (
    "request to query NVSwitch device information from NVSwitch driver failed with"
    " error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]"
)
_GCC = {
    "22.04": "gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)",
    "24.04": "gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)",
}
_BUILD_DATE = "Wed Jan  1 00:00:00 UTC 2025"
UVM_MAJOR = 510
NVSWITCH_MAJOR = 509


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


def unit_name(arg: str) -> str:
    """Normalise a unit argument: "containerd" -> "containerd.service"."""
    if "." in arg and arg.rsplit(".", 1)[1] in _UNIT_SUFFIXES:
        return arg
    return f"{arg}.service"


def smi_bus_id(address: str) -> str:
    """sysfs "0001:00:00.0" -> nvidia-smi "00000001:00:00.0" (8-digit domain, upper case)."""
    domain, rest = address.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


@dataclass(frozen=True)
class Module:
    """An nvidia kernel module: its version and "open" or "proprietary"."""

    version: str
    module_type: str


class Node:
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

    def recommended_module_type(self) -> str:
        """What nvidia-installer recommends: open when any GPU is Blackwell."""
        return "open" if self.blackwell_gpu() is not None else "proprietary"

    def gpu_uuid(self, address: str) -> str:
        """A stable GPU UUID derived from the node's VM size and the PCI address."""
        return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'bootfsm-sim:{self.sku.vm_size}:{address}')}"

    def product_name(self, device: int) -> str:
        """nvidia-smi product name of a device id."""
        return smi_product_name(device)

    # ------------------------------------------------------------------ driver

    def module_path(self, kernel: str) -> str:
        """Node path of the DKMS-installed nvidia.ko for a kernel."""
        return f"lib/modules/{kernel}/updates/dkms/nvidia.ko"

    def built_module(self, kernel: str | None = None) -> Module | None:
        """The nvidia module installed for a kernel (default: the running one)."""
        text = self.read(self.module_path(kernel or self.kernel))
        if text is None:
            return None
        fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        if "version" not in fields:
            return None
        return Module(fields["version"], fields.get("module_type", "proprietary"))

    def loaded_module(self) -> Module | None:
        """The loaded nvidia module (sys/module/nvidia/version), or None."""
        version = self.read("sys/module/nvidia/version")
        if version is None:
            return None
        proc = self.read("proc/driver/nvidia/version") or ""
        kind = "open" if "Open Kernel Module" in proc else "proprietary"
        return Module(version.strip(), kind)

    def proc_version_text(self, module: Module) -> str:
        """/proc/driver/nvidia/version as the real driver words it for each flavour."""
        gcc = _GCC.get(self.sku.os_version, _GCC["24.04"])
        if module.module_type == "open":
            first = (
                f"NVRM version: NVIDIA UNIX Open Kernel Module for {self.arch}  {module.version}"
                f"  Release Build  (dvs-builder@U22-I3-AF03-09-1)  {_BUILD_DATE}"
            )
        else:
            first = (
                f"NVRM version: NVIDIA UNIX {self.arch} Kernel Module  {module.version}"
                f"  {_BUILD_DATE}"
            )
        return f"{first}\nGCC version:  {gcc}\n"

    def load_module(self, *, force: bool = False) -> str | None:
        """Load the module built for the running kernel; None on success, else the error text.

        A proprietary module refuses to load on a node with a Blackwell GPU (unless force).
        """
        if self.loaded_module() is not None:
            return None
        module = self.built_module()
        if module is None:
            return (
                "modprobe: FATAL: Module nvidia not found in directory"
                f" /lib/modules/{self.kernel}\n"
            )
        blackwell = self.blackwell_gpu()
        if module.module_type == "proprietary" and blackwell is not None and not force:
            address, device = blackwell
            self.journal(
                f"kernel: NVRM: The NVIDIA GPU {address} (PCI ID: 10de:{device:04x})"
                " installed in this system requires use of the NVIDIA open kernel modules."
            )
            return (
                f"NVRM: The NVIDIA GPU {address} (PCI ID: 10de:{device:04x})\n"
                "NVRM: installed in this system requires use of the NVIDIA open kernel modules.\n"
                "modprobe: ERROR: could not insert 'nvidia': No such device\n"
            )
        self.write("sys/module/nvidia/version", f"{module.version}\n")
        self.write("sys/module/nvidia/refcnt", "0\n")
        self.write("proc/driver/nvidia/version", self.proc_version_text(module))
        for index, (address, _device) in enumerate(self.visible_gpus()):
            self.write(f"dev/nvidia{index}", "")
            self.write(
                f"proc/driver/nvidia/gpus/{address}/information", f"Bus Location: {address}\n"
            )
        # nvidia_uvm has no PCI alias, so loading nvidia (udev, modprobe) never creates
        # /dev/nvidia-uvm: only `nvidia-modprobe -u -c0` does (NVIDIA/nvidia-modprobe).
        self.write("dev/nvidiactl", "")
        switches = self.nvswitches()
        for index, address in enumerate(switches):
            self.write(f"proc/driver/nvidia-nvswitch/devices/{address}", f"Device: {index}\n")
            self.write(f"dev/nvidia-nvswitch{index}", "")
        if switches:
            self.write("dev/nvidia-nvswitchctl", "")
        if self.p("etc/udev/rules.d/71-nvidia-dev-char.rules").exists():
            self.create_dev_char_links()
        return None

    def unload_module(self) -> None:
        """Forget the loaded modules (device nodes stay, as mknod'ed nodes do)."""
        for path in ("sys/module/nvidia", "proc/driver/nvidia", "proc/driver/nvidia-nvswitch"):
            self.remove(path)
        for dependent in self.p("sys/module").glob("nvidia_*"):
            self.remove(str(dependent.relative_to(self.root)))

    def nvml_version(self) -> str | None:
        """Version of the installed NVML (libnvidia-ml.so.1 -> libnvidia-ml.so.<ver>)."""
        link = self.p(f"{self.libdir}/libnvidia-ml.so.1")
        if not link.exists():
            return None
        target = os.readlink(link) if link.is_symlink() else link.name
        prefix = "libnvidia-ml.so."
        name = Path(target).name
        return (
            name[len(prefix) :] if name.startswith(prefix) and name != "libnvidia-ml.so.1" else None
        )

    def create_dev_char_links(self) -> list[str]:
        """Create dev/char/<major>:<minor> links for every NVIDIA device node present."""
        created: list[str] = []
        dev = self.p("dev")
        if not dev.is_dir():
            return created
        for node in sorted(dev.iterdir()):
            name = node.name
            if name.startswith("nvidia-nvswitch") and name[15:].isdigit():
                number = f"{NVSWITCH_MAJOR}:{name[15:]}"
            elif name.startswith("nvidia") and name[6:].isdigit():
                number = f"195:{name[6:]}"
            else:
                number = {
                    "nvidiactl": "195:255",
                    "nvidia-uvm": f"{UVM_MAJOR}:0",
                    "nvidia-uvm-tools": f"{UVM_MAJOR}:1",
                    "nvidia-nvswitchctl": f"{NVSWITCH_MAJOR}:255",
                }.get(name, "")
            if number:
                self.symlink(f"../{name}", f"dev/char/{number}")
                created.append(f"/dev/char/{number}")
        return created

    # ------------------------------------------------------------------ units

    def is_masked(self, unit: str) -> bool:
        """A /dev/null symlink for the unit in etc/ or run/systemd/system."""
        for base in ("etc/systemd/system", "run/systemd/system"):
            path = self.p(f"{base}/{unit}")
            if path.is_symlink() and os.readlink(path) == "/dev/null":
                return True
        return False

    def unit_file(self, unit: str) -> str | None:
        """Node path of the unit file systemd would load (masks ignored), or None."""
        for base in UNIT_DIRS:
            path = self.p(f"{base}/{unit}")
            if path.is_symlink() and os.readlink(path) == "/dev/null":
                continue
            if path.is_file() or path.is_symlink():
                return f"/{base}/{unit}"
        return None

    def _read_in_root(self, node_path: str) -> str | None:
        """Read a node file, following symlinks inside the root (never onto the host)."""
        path = self.p(node_path)
        for _ in range(8):
            if not path.is_symlink():
                break
            target = os.readlink(path)
            path = self.p(target) if target.startswith("/") else path.parent / target
        try:
            return path.read_text()
        except OSError:
            return None

    def _install_section(self, unit: str) -> dict[str, list[str]]:
        """[Install] keys of a unit file (WantedBy=, RequiredBy=, Alias=)."""
        node_path = self.unit_file(unit)
        text = self._read_in_root(node_path) if node_path else None
        keys: dict[str, list[str]] = {}
        section = ""
        for raw in (text or "").splitlines():
            line = raw.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
            elif section == "Install" and "=" in line:
                key, value = line.split("=", 1)
                keys.setdefault(key.strip(), []).extend(value.split())
        return keys

    def wanted_by(self, unit: str) -> list[str]:
        """Targets whose .wants/ gets the unit's enable symlink (empty: static unit)."""
        install = self._install_section(unit)
        return install.get("WantedBy", []) + install.get("RequiredBy", [])

    def enable_links(self, unit: str) -> list[Path]:
        """Existing enable symlinks of the unit under etc/systemd/system/*.{wants,requires}.

        The links point at node-absolute paths, so they dangle from the host's view:
        existence is tested with lexists.
        """
        base = self.p("etc/systemd/system")
        if not base.is_dir():
            return []
        dirs = [d for d in base.iterdir() if d.name.endswith((".wants", ".requires"))]
        return sorted(d / unit for d in dirs if os.path.lexists(d / unit))

    def is_enabled(self, unit: str) -> bool:
        """Whether an enable symlink exists (and the unit is not masked)."""
        return not self.is_masked(unit) and bool(self.enable_links(unit))

    def enabled_units(self) -> list[str]:
        """Every unit with an enable symlink, sorted."""
        base = self.p("etc/systemd/system")
        if not base.is_dir():
            return []
        dirs = [d for d in base.iterdir() if d.name.endswith((".wants", ".requires"))]
        return sorted({link.name for d in dirs if d.is_dir() for link in d.iterdir()})

    def unit_state(self, unit: str) -> str:
        """active, failed or inactive."""
        if self.p(f"{RUN_DIR}/active/{unit}").exists():
            return "active"
        if self.p(f"{RUN_DIR}/failed/{unit}").exists():
            return "failed"
        return "inactive"

    def set_unit_state(self, unit: str, state: str) -> None:
        """Record active / failed / inactive for a unit."""
        for kind in ("active", "failed"):
            if kind == state:
                self.write(f"{RUN_DIR}/{kind}/{unit}", f"{time.time():.3f}\n")
            else:
                self.remove(f"{RUN_DIR}/{kind}/{unit}")

    def start_unit(self, unit: str, verb: str = "start") -> tuple[int, str]:
        """Start (or restart) a unit as systemctl would: (exit code, stderr text)."""
        if self.is_masked(unit):
            return 1, f"Failed to {verb} {unit}: Unit {unit} is masked.\n"
        if self.unit_file(unit) is None:
            return 5, f"Failed to {verb} {unit}: Unit {unit} not found.\n"
        reason = self._start_failure(unit, verb)
        if reason is not None:
            self.set_unit_state(unit, "failed")
            self.journal(f"{unit.removesuffix('.service')}: {reason}")
            self.journal(
                f"systemd[1]: {unit}: Control process exited, code=exited, status=1/FAILURE"
            )
            return 1, (
                f"Job for {unit} failed because the control process exited with error code.\n"
                f'See "systemctl status {unit}" and "journalctl -xeu {unit}" for details.\n'
            )
        self.set_unit_state(unit, "active")
        if unit == FABRIC_MANAGER and self.nvlink5():
            self.set_unit_state(NVLSM, "active")
        self.journal(f"systemd[1]: Started {unit}.")
        return 0, ""

    def _start_failure(self, unit: str, verb: str) -> str | None:
        """Why starting this unit fails on this node, or None when it starts."""
        if unit == FABRIC_MANAGER:
            return self.fabric_manager_failure()
        if unit == NVLSM and not self.nvlink5():
            return "no NVLink5 switch-management port found"
        if unit == "nvidia-persistenced.service":
            return self.persistenced_failure()
        if unit == "nvidia-imex.service" and self.loaded_module() is None:
            return "IMEX failed to open the NVIDIA driver: driver not loaded"
        if unit == "nvidia-cdi-refresh.service" and (
            self.fault("cdi-fails") or self.loaded_module() is None
        ):
            return "failed to generate CDI spec: failed to initialize NVML: ERROR_UNKNOWN"
        if (
            unit == "containerd.service"
            and verb == "restart"
            and self.fault("containerd-restart-fails")
        ):
            return "failed to load TOML: /etc/containerd/config.toml: invalid plugin configuration"
        return None

    def persistenced_failure(self) -> str | None:
        """Why nvidia-persistenced.service does not start, or None. References: systemd
        exits 203/EXEC when ExecStart's binary is missing; NVIDIA/nvidia-persistenced's
        nvidia-persistenced.c prints "nvidia-persistenced failed to initialize. Check
        syslog for more details." when the daemon cannot open the devices (a real
        journal shows it after "Please ensure that the NVIDIA device files (/dev/nvidia*)
        exist")."""
        if not self.p("usr/bin/nvidia-persistenced").exists():
            return "Failed to execute /usr/bin/nvidia-persistenced: No such file or directory"
        if self.loaded_module() is None or not self.p("dev/nvidiactl").exists():
            return "nvidia-persistenced failed to initialize. Check syslog for more details."
        return None

    def fabric_manager_failure(self) -> str | None:
        """Why fabric manager cannot start here (no switches, no driver; on NVLink5 the
        start script's precheck: ib_umad loaded, NVLSM installed), or None."""
        if not self.nvswitches() and not self.nvlink5():
            return _NOTHING_TO_DO
        if self.nvlink5() and not self.p("sys/module/ib_umad").exists():
            # fm_failure_and_status_excerpts.txt [D]
            return 'Kernel module "ib_umad" has not been loaded, fabric manager cannot be started'
        if self.nvlink5() and not self.p("opt/nvidia/nvlsm/sbin/nvlsm").exists():
            return (
                '"/opt/nvidia/nvlsm/sbin/nvlsm" does not exist. Please install'
                ' "Nvidia NVLink Subnet Manager" (nvlsm) package'
            )
        if self.loaded_module() is None:
            return (
                "fabric manager failed to open the NVIDIA driver (/dev/nvidiactl):"
                " the nvidia kernel module is not loaded"
            )
        return None

    def fabric_start_script(self, mode: str = "start") -> tuple[int, str, str]:
        """nvidia-fabricmanager-start.sh --mode start|precheck: (exit code, stdout, stderr).

        Run by hand, the script starts the daemons outside systemd: the unit stays as it
        was (``start_unit`` runs it as the unit's ExecStartPre/ExecStart)."""
        if self.nvlink5():
            out = (
                "Polling for at least one Infiniband device before starting Fabric Manager...\n"
                "Checking mlx5_0...\nDetected NVL5+ system\n"
            )
        else:
            out = "Detected Pre-NVL5 system\n"
        reason = self.fabric_manager_failure()
        if reason is not None:
            return 1, out, f'{reason}\n"{_FM_CMD}" failed! Exit code: 1\n'
        if mode == "precheck":
            return 0, out, ""
        if self.nvlink5():
            out += 'Started "NVLink Subnet Manager"\n'
        self.write(f"{RUN_DIR}/fm-daemon", "started by nvidia-fabricmanager-start.sh\n")
        return 0, out + 'Started "Nvidia Fabric Manager"\n', ""

    def stop_unit(self, unit: str, verb: str = "stop") -> tuple[int, str]:
        """Stop a unit: (exit code, stderr text)."""
        if self.unit_file(unit) is None and self.unit_state(unit) == "inactive":
            return 5, f"Failed to {verb} {unit}: Unit {unit} not loaded.\n"
        self.set_unit_state(unit, "inactive")
        if unit == FABRIC_MANAGER:
            self.set_unit_state(NVLSM, "inactive")
        return 0, ""

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

    # ------------------------------------------------------------------ boot

    def boot(self) -> None:
        """What systemd does at boot: load the driver if built, start enabled units."""
        self.p(f"{RUN_DIR}/active").mkdir(parents=True, exist_ok=True)
        for address, _device in self.gpus():
            current, pending = self.mig_mode(address)
            if current != pending:  # a pending MIG mode takes effect at the GPU's reset
                self.set_mig_mode(address, pending, pending)
        if self.built_module() is not None:
            self.load_module()
        for unit in self.enabled_units():
            if not self.is_masked(unit):
                self.start_unit(unit)


_SHEBANG_MAX = 255


def standin_script(name: str, root: Path, python: str = sys.executable) -> str:
    """Text of a stand-in executable: runs ``bootfsm.sim.standins.main(name, root, argv)``.

    The node root and the directory holding the ``bootfsm`` package are baked in, so the
    script works from any PATH or working directory. Raises ValueError when the
    interpreter path cannot go on a shebang line.
    """
    shebang = f"#!{python}"
    if any(c.isspace() for c in python) or len(shebang) > _SHEBANG_MAX:
        raise ValueError(f"interpreter path unusable on a shebang line: {python!r}")
    package_parent = Path(bootfsm.__file__).resolve().parent.parent
    return (
        f"{shebang}\n"
        f'"""bootfsm simulator stand-in for {name}."""\n'
        "import sys\n\n"
        f"sys.path.insert(0, {str(package_parent)!r})\n"
        "from bootfsm.sim.standins import main\n\n"
        f"sys.exit(main({name!r}, {str(Path(root).absolute())!r}, sys.argv[1:]))\n"
    )
