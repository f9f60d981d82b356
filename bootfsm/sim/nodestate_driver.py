"""The simulated node's NVIDIA driver: built and loaded modules, /proc, NVML, /dev.

:class:`NodeDriver` adds to :class:`nodestate_base.NodeBase` the kernel module as Linux
shows it (the built module under lib/modules, the loaded one under sys/module and
proc/driver/nvidia, the device files under dev/) and the NVML library version the
installed user-space reports. Runtime state lives where Linux keeps it (``sys/``,
``proc/``, ``dev/``), which a reboot clears.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from bootfsm.sim.nodestate_kmod import DEVICE_CREATE, NodeKmod

__all__ = ["LINKER_CACHE", "NVSWITCH_MAJOR", "UVM_MAJOR", "Module", "NodeDriver"]

_GCC = {
    "22.04": "gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)",
    "24.04": "gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)",
}
_BUILD_DATE = "Wed Jan  1 00:00:00 UTC 2025"
UVM_MAJOR = 510
LINKER_CACHE = "etc/ld.so.cache"
NVSWITCH_MAJOR = 509


# /proc/driver/nvidia/params as the loaded module prints it: the keys, order and defaults of
# a real 580.159.04 open module (tests/captures/h200_580.159.04/kernel.txt); the string
# ones in double quotes. CoherentGPUMemoryMode is printed by 580 and later only.
_PARAMS = (
    ("ResmanDebugLevel", "4294967295"), ("RmLogonRC", "1"), ("ModifyDeviceFiles", "1"),
    ("DeviceFileUID", "0"), ("DeviceFileGID", "0"), ("DeviceFileMode", "438"),
    ("InitializeSystemMemoryAllocations", "1"), ("UsePageAttributeTable", "4294967295"),
    ("EnableMSI", "1"), ("EnablePCIeGen3", "0"), ("MemoryPoolSize", "0"),
    ("KMallocHeapMaxSize", "0"), ("VMallocHeapMaxSize", "0"), ("IgnoreMMIOCheck", "0"),
    ("EnableStreamMemOPs", "0"), ("EnableUserNUMAManagement", "1"), ("NvLinkDisable", "0"),
    ("RmProfilingAdminOnly", "0"), ("PreserveVideoMemoryAllocations", "0"),
    ("EnableS0ixPowerManagement", "0"), ("S0ixPowerManagementVideoMemoryThreshold", "256"),
    ("DynamicPowerManagement", "3"), ("DynamicPowerManagementVideoMemoryThreshold", "200"),
    ("RegisterPCIDriver", "1"), ("EnablePCIERelaxedOrderingMode", "0"),
    ("EnableResizableBar", "0"), ("EnableGpuFirmware", "18"), ("EnableGpuFirmwareLogs", "2"),
    ("RmNvlinkBandwidthLinkCount", "0"), ("EnableDbgBreakpoint", "0"),
    ("OpenRmEnableUnsupportedGpus", "1"), ("DmaRemapPeerMmio", "1"),
    ("ImexChannelCount", "2048"), ("CreateImexChannel0", "0"),
    ("GrdmaPciTopoCheckOverride", "0"), ("CoherentGPUMemoryMode", '""'),
    ("RegistryDwords", '""'), ("RegistryDwordsPerDevice", '""'), ("RmMsg", '""'),
    ("GpuBlacklist", '""'), ("TemporaryFilePath", '""'), ("ExcludedGpus", '""'),
)  # fmt: skip
_MODPROBE_DIRS = ("etc/modprobe.d", "run/modprobe.d", "lib/modprobe.d", "usr/lib/modprobe.d")


@dataclass(frozen=True)
class Module:
    """An nvidia kernel module: its version and "open" or "proprietary"."""

    version: str
    module_type: str


class NodeDriver(NodeKmod):
    """A node with its driver state (see the module docstring)."""

    def built_module(self, kernel: str | None = None) -> Module | None:
        """The nvidia module installed for a kernel (default: the running one)."""
        fields = self.module_info(kernel)
        if fields is None or "version" not in fields:
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

        A proprietary module refuses to load on a node with a Blackwell GPU, an open one on
        a node with a GPU older than Turing (unless force).
        """
        if self.loaded_module() is not None:
            return None
        module = self.built_module()
        if module is None:
            return (
                "modprobe: FATAL: Module nvidia not found in directory"
                f" /lib/modules/{self.kernel}\n"
            )
        fields = self.module_info() or {}
        # module_sig_check comes first in load_module (kernel/module/main.c)
        refused = self._signature_refused(fields) or self._format_refused(fields)
        if refused is not None:
            return refused
        blackwell = self.blackwell_gpu()
        if module.module_type == "proprietary" and blackwell is not None and not force:
            address, device = blackwell
            self.kernel_log(
                f"NVRM: The NVIDIA GPU {address} (PCI ID: 10de:{device:04x})"
                " installed in this system requires use of the NVIDIA open kernel modules."
            )
            return (
                f"NVRM: The NVIDIA GPU {address} (PCI ID: 10de:{device:04x})\n"
                "NVRM: installed in this system requires use of the NVIDIA open kernel modules.\n"
                "modprobe: ERROR: could not insert 'nvidia': No such device\n"
            )
        older = self.pre_turing_gpu()
        if module.module_type == "open" and older is not None and not force:
            address, device = older
            # open-gpu-kernel-modules kernel-open/nvidia/nv.c, the probe of a GPU with no GSP
            lines = (
                f"NVRM: The NVIDIA GPU {address} (PCI ID: 10de:{device:04x})",
                "NVRM: installed in this system is not supported by open",
                "NVRM: nvidia.ko because it does not include the required GPU",
                "NVRM: System Processor (GSP).",
            )
            for line in lines:
                self.kernel_log(line)
            return (
                "\n".join(lines) + "\nmodprobe: ERROR: could not insert 'nvidia': No such device\n"
            )
        self.write("sys/module/nvidia/version", f"{module.version}\n")
        self.write("sys/module/nvidia/refcnt", "0\n")
        self.write("proc/driver/nvidia/version", self.proc_version_text(module))
        self._write_params(module.version)
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
        # the driver's "add" uevent (/bus/pci/drivers/nvidia): Ubuntu's udev rule
        if self.udev_runs("/bus/pci/drivers/nvidia", DEVICE_CREATE):
            self.device_create()
        return None

    def device_create(self) -> None:
        """What Ubuntu's /sbin/ub-device-create (nvidia-kernel-common-580-server 580.178.04,
        run by its 71-nvidia.rules) makes: nothing without the nvidia module ("No nvidia
        module is loaded. Aborting."), else /dev/nvidiaN for each NVIDIA GPU bound to the
        driver, /dev/nvidiactl, and /dev/nvidia-uvm and /dev/nvidia-uvm-tools while
        nvidia_uvm is loaded, /dev/nvidia-modeset while nvidia_modeset is (the strings of
        the real binary; it reads /proc/modules, /proc/devices and the PCI bus)."""
        if self.loaded_module() is None:
            return
        for index, _gpu in enumerate(self.visible_gpus()):
            self.write(f"dev/nvidia{index}", "")
        self.write("dev/nvidiactl", "")
        if self.p("sys/module/nvidia_uvm").is_dir():
            self.write("dev/nvidia-uvm", "")
            self.write("dev/nvidia-uvm-tools", "")
        if self.p("sys/module/nvidia_modeset").is_dir():
            self.write("dev/nvidia-modeset", "")

    def device_processes(self) -> list[tuple[int, str]]:
        """(pid, comm) of every process with a /dev/nvidia* file open, as Linux shows it:
        /proc/<pid>/fd/<n> links to the device, /proc/<pid>/comm names the process (what
        fuser(1) and lsof(8) read)."""
        found: list[tuple[int, str]] = []
        for proc in sorted(self.p("proc").glob("[0-9]*")):
            fds = proc / "fd"
            links = (
                [os.readlink(f) for f in fds.iterdir() if f.is_symlink()] if fds.is_dir() else []
            )
            if any(t.startswith("/dev/nvidia") for t in links):
                comm = (proc / "comm").read_text().strip() if (proc / "comm").exists() else "?"
                found.append((int(proc.name), comm))
        return found

    def modprobe_options(self, module: str) -> dict[str, str]:
        """The ``options <module> K=V ...`` of modprobe.d (modprobe.d(5): the *.conf files of
        /etc, /run, /lib and /usr/lib/modprobe.d, a name in /etc hiding the same name
        further down, read in name order), as modprobe, udev and nvidia-modprobe load it."""
        files: dict[str, Path] = {}
        for base in _MODPROBE_DIRS:
            for conf in sorted(self.p(base).glob("*.conf")):
                files.setdefault(conf.name, conf)
        out: dict[str, str] = {}
        for name in sorted(files):
            for line in files[name].read_text().splitlines():
                words = line.split("#", 1)[0].split()
                if words[:2] == ["options", module]:
                    out.update(w.partition("=")[::2] for w in words[2:] if "=" in w)
        return out

    def _write_params(self, version: str) -> None:
        """/proc/driver/nvidia/params with the NVreg_ options modprobe.d gave the load
        (an option the branch lacks is ignored, as the kernel ignores unknown ones)."""
        options = self.modprobe_options("nvidia")
        branch = int(version.split(".", 1)[0])
        lines = []
        for key, default in _PARAMS:
            if key == "CoherentGPUMemoryMode" and branch < 580:
                continue
            given = options.get(f"NVreg_{key}")
            if given is not None:
                default = f'"{given}"' if default.startswith('"') else given
            lines.append(f"{key}: {default}\n")
        self.write("proc/driver/nvidia/params", "".join(lines))

    def unload_module(self) -> None:
        """Forget the loaded modules (device nodes stay, as mknod'ed nodes do)."""
        for path in ("sys/module/nvidia", "proc/driver/nvidia", "proc/driver/nvidia-nvswitch"):
            self.remove(path)
        for dependent in self.p("sys/module").glob("nvidia_*"):
            self.remove(str(dependent.relative_to(self.root)))

    def resolve_library(self, name: str) -> Path | None:
        """Where the loader finds ``name``: the first entry of the linker cache whose file
        exists (ld.so's cache lookup), else the trusted multiarch directory (its default
        path search), else None."""
        for entry, path in self.linker_cache() or []:
            if entry == name and self.p(path.lstrip("/")).exists():
                return self.p(path.lstrip("/"))
        fallback = self.p(f"{self.libdir}/{name}")
        return fallback if fallback.exists() else None

    def linker_cache(self) -> list[tuple[str, str]] | None:
        """The simulated /etc/ld.so.cache (bootfsm/sim/standin_ldconfig.py writes it as
        JSON; the real one is binary): (name, path) entries in the loader's order, or None
        without a cache. A real glibc cache (the booted lane's images run glibc's
        ldconfig) is not read here: [], and the library's own directory decides."""
        try:
            text = self.read(LINKER_CACHE)
        except UnicodeDecodeError:  # glibc's binary "glibc-ld.so.cache1.1"
            return []
        if text is None:
            return None
        try:
            return [(n, p) for n, p in json.loads(text)["simulated ld.so.cache"]]
        except (ValueError, KeyError, TypeError):
            return []

    def nvml_version(self) -> str | None:
        """Version of the NVML the loader resolves (libnvidia-ml.so.1 -> .so.<ver>)."""
        link = self.resolve_library("libnvidia-ml.so.1")
        if link is None:
            return None
        name = Path(os.path.realpath(link)).name
        prefix = "libnvidia-ml.so."
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
