"""Node facts read through a Host: only read here; judging them is detect's job."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from bootfsm.core.archnames import ArchNames, normalize_arch
from bootfsm.core.hardware import DeviceRole, GpuModel, classify, model_for
from bootfsm.host.host import Host
from bootfsm.parsers import ParseError
from bootfsm.parsers.driver_info import parse_module_version
from bootfsm.parsers.osrelease import parse_os_release
from bootfsm.parsers.pci import parse_sysfs_hex, vpd_has_sw_mng
from bootfsm.parsers.secureboot import (
    EFI_GLOBAL_GUID,
    MOK_GUID,
    mok_certificates,
    parse_efi_secure_boot,
    parse_lockdown,
    parse_sig_enforce,
)

__all__ = [
    "DKMS_SIGNING_CERTS",
    "NodeFacts",
    "PciGpu",
    "SecureBoot",
    "gather_facts",
    "loaded_module_version",
    "read_secure_boot",
]

T = TypeVar("T")
SECURE_BOOT_VAR = f"/sys/firmware/efi/efivars/SecureBoot-{EFI_GLOBAL_GUID}"
MOK_LIST_VAR = f"/sys/firmware/efi/efivars/MokListRT-{MOK_GUID}"
LOCKDOWN = "/sys/kernel/security/lockdown"
SIG_ENFORCE = "/sys/module/module/parameters/sig_enforce"
DKMS_SIGNING_CERTS = ("/var/lib/dkms/mok.pub", "/var/lib/shim-signed/mok/MOK.der")
"""The certificates DKMS signs the modules it builds with (DER): dkms 3's
``mok_certificate`` default, and Ubuntu's (its dkms and update-secureboot-policy)."""


@dataclass(frozen=True)
class SecureBoot:
    """Secure Boot and module signature enforcement as the node shows them."""

    enabled: bool | None = None
    """On or off, None when nothing says (no UEFI variable, no IMDS answer)."""
    source: str = ""
    """Who said: "efi" (the firmware's variable wins), "imds", or "" (unknown)."""
    lockdown: str | None = None
    """The kernel's lockdown mode (none, integrity, confidentiality), None unreadable."""
    sig_enforce: bool | None = None
    """module.sig_enforce, None unreadable (a kernel without CONFIG_MODULE_SIG)."""
    dkms_key_enrolled: bool = False
    """A DKMS signing certificate of this node is in shim's MokListRT."""

    @property
    def enforced(self) -> bool:
        """The kernel refuses an unsigned module: module.sig_enforce, a lockdown mode
        other than none (kernel/module/signing.c), or Secure Boot on with neither
        readable (the distributions' kernels lock down under Secure Boot)."""
        if self.sig_enforce or self.lockdown in ("integrity", "confidentiality"):
            return True
        return bool(self.enabled) and self.lockdown is None and self.sig_enforce is None

    def with_imds(self, imds: bool | None) -> SecureBoot:
        """These facts with IMDS's word, used only when the EFI variable is unreadable."""
        if self.source == "efi" or imds is None:
            return self
        return replace(self, enabled=imds, source="imds")


@dataclass(frozen=True)
class PciGpu:
    """An NVIDIA GPU on the PCI bus."""

    bdf: str
    device_id: int
    model: GpuModel


@dataclass(frozen=True)
class NodeFacts:
    """What detect found on the node."""

    raw_arch: str
    arch: ArchNames | None
    os_id: str
    os_version: str
    kernel: str
    gpus: tuple[PciGpu, ...]
    nvswitches: tuple[str, ...]
    nvlink5: bool
    loaded_driver: str | None
    vm_size: str | None = None
    skip_gpu_install: str | None = None
    """Why the GPU driver install is skipped (the SkipGpuDriverInstall VM tag), or None."""
    no_gpu: str | None = None
    """Why this node has no GPU to provision (a VM size without an NVIDIA GPU, detect.
    gpu_node = no, or no GPU with nothing saying there should be one), or None."""
    mig_profile: str | None = None
    """The MIG layout asked for (mig.profile, else the VM tag named by mig.tag), or None."""
    mig_profile_source: str | None = None
    """Where ``mig_profile`` came from: "config mig.profile" or "VM tag NAME"."""
    secure_boot: SecureBoot = field(default_factory=SecureBoot)

    @property
    def gpu_model(self) -> str:
        """The most common GPU model name, or '' without GPUs."""
        names = [g.model.name for g in self.gpus]
        return max(set(names), key=names.count) if names else ""

    def summary(self) -> dict[str, Any]:
        """Flat, JSON-able facts for the journal and `plan`."""
        return {
            "arch": self.raw_arch,
            "os": f"{self.os_id}:{self.os_version}",
            "kernel": self.kernel,
            "gpu_count": len(self.gpus),
            "gpu_model": self.gpu_model,
            "gpu_family": self.gpus[0].model.family.value if self.gpus else "",
            "grace": any(g.model.grace for g in self.gpus),
            "nvswitches": len(self.nvswitches),
            "nvlink5": self.nvlink5,
            "loaded_driver": self.loaded_driver,
            "vm_size": self.vm_size,
            "skip_gpu_install": self.skip_gpu_install,
            "no_gpu": self.no_gpu,
            "mig_profile": self.mig_profile,
            "mig_profile_source": self.mig_profile_source,
            "secure_boot": self.secure_boot.enabled,
            "secure_boot_source": self.secure_boot.source,
            "lockdown": self.secure_boot.lockdown,
            "module_sig_enforce": self.secure_boot.sig_enforce,
            "module_signatures_enforced": self.secure_boot.enforced,
            "dkms_key_enrolled": self.secure_boot.dkms_key_enrolled,
            "gpus": [{"bdf": g.bdf, **asdict(g.model)} for g in self.gpus],
        }


def loaded_module_version(host: Host) -> str | None:
    """The loaded ``nvidia`` module's version (/sys/module/nvidia/version), or None."""
    try:  # an empty or missing file is no version either
        return parse_module_version(host.read_text("/sys/module/nvidia/version") or "")
    except ParseError:
        return None


def _pci(host: Host) -> tuple[list[PciGpu], list[str]]:
    gpus: list[PciGpu] = []
    switches: list[str] = []
    for dev in host.glob("/sys/bus/pci/devices/*"):
        bdf = dev.rsplit("/", 1)[-1]
        attrs = {f: host.read_text(f"{dev}/{f}") for f in ("vendor", "device", "class")}
        if None in attrs.values():
            continue
        try:
            vendor, device, cls = (
                parse_sysfs_hex(t or "", what=f"{dev}/{f}") for f, t in attrs.items()
            )
        except ParseError:
            continue  # a garbled non-essential device must not stop the boot
        role = classify(vendor, cls)
        if role is DeviceRole.GPU:
            gpus.append(PciGpu(bdf, device, model_for(device)))
        elif role is DeviceRole.NVSWITCH:
            switches.append(bdf)
    return gpus, switches


def _parsed(text: str | None, parse: Callable[[str], T]) -> T | None:
    try:
        return None if text is None else parse(text)
    except ParseError:
        return None  # unreadable is unknown, never a guess


def read_secure_boot(host: Host) -> SecureBoot:
    """Secure Boot from the EFI variable, the lockdown mode, module.sig_enforce and
    whether a DKMS signing certificate is enrolled (IMDS is detect's, ``with_imds``)."""
    raw = host.read_bytes(SECURE_BOOT_VAR, limit=64)
    enabled: bool | None = None
    if raw is not None:
        with contextlib.suppress(ParseError):
            enabled = parse_efi_secure_boot(raw)
    enrolled = False
    moks = host.read_bytes(MOK_LIST_VAR, limit=1 << 20)
    if moks:
        try:
            certs = mok_certificates(moks)
        except ParseError:
            certs = []
        enrolled = any(host.read_bytes(p, limit=1 << 16) in certs for p in DKMS_SIGNING_CERTS)
    return SecureBoot(
        enabled=enabled,
        source="efi" if enabled is not None else "",
        lockdown=_parsed(host.read_text(LOCKDOWN), parse_lockdown),
        sig_enforce=_parsed(host.read_text(SIG_ENFORCE), parse_sig_enforce),
        dkms_key_enrolled=enrolled,
    )


def gather_facts(host: Host) -> NodeFacts:
    """Read arch, OS, kernel, GPUs, NVSwitches, NVLink5 and the loaded driver."""
    raw_arch = (host.read_text("/proc/sys/kernel/arch") or "").strip()
    osr_text = host.read_text("/etc/os-release") or host.read_text("/usr/lib/os-release") or ""
    try:
        osr = parse_os_release(osr_text)
        os_id, os_version = osr.id, osr.version_id
    except ParseError:
        os_id, os_version = "", ""
    gpus, switches = _pci(host)
    switches = switches or host.listdir("/proc/driver/nvidia-nvswitch/devices")
    nvlink5 = any(
        vpd_has_sw_mng(host.read_bytes(p) or b"")
        for p in host.glob("/sys/class/infiniband/*/device/vpd")
    )
    loaded = loaded_module_version(host)
    return NodeFacts(
        raw_arch=raw_arch,
        arch=normalize_arch(raw_arch) if raw_arch else None,
        os_id=os_id,
        os_version=os_version,
        kernel=(host.read_text("/proc/sys/kernel/osrelease") or "").strip(),
        gpus=tuple(gpus),
        nvswitches=tuple(switches),
        nvlink5=nvlink5,
        loaded_driver=loaded,
        secure_boot=read_secure_boot(host),
    )
