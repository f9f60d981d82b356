"""Hardware knowledge table: NVIDIA PCI ids, GPU families and device roles."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from bootfsm.core.strenum import StrEnum

__all__ = [
    "BLACKWELL_FIRST_DEVICE_ID",
    "GPU_MODELS",
    "MELLANOX_VENDOR",
    "NVIDIA_VENDOR",
    "NVSWITCH_CLASS",
    "NVSWITCH_MODELS",
    "SUPPORTED_BRANCHES",
    "TURING_FIRST_DEVICE_ID",
    "DeviceRole",
    "Family",
    "GpuModel",
    "blackwell_or_later",
    "branch_problem",
    "classify",
    "has_fabric_probe",
    "model_for",
    "requires_open_module",
    "requires_proprietary_module",
]

NVIDIA_VENDOR = 0x10DE
MELLANOX_VENDOR = 0x15B3

# 24-bit PCI classes as sysfs prints them (class, subclass, prog-if).
_GPU_CLASSES = frozenset({0x030200, 0x030000})  # 3D controller, VGA controller
NVSWITCH_CLASS = 0x068000


class Family(StrEnum):
    """GPU architecture generation, as far as provisioning cares."""

    MAXWELL = "maxwell"
    PASCAL = "pascal"
    VOLTA = "volta"
    TURING = "turing"
    AMPERE = "ampere"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"
    UNKNOWN = "unknown"


class DeviceRole(StrEnum):
    """What an NVIDIA PCI function is to the provisioner."""

    GPU = "gpu"
    NVSWITCH = "nvswitch"
    OTHER = "other"


@dataclass(frozen=True)
class GpuModel:
    """One GPU PCI device id; `grace` marks a Grace superchip tray (arm64, C2C-attached)."""

    device_id: int
    name: str
    family: Family
    grace: bool


_A, _H, _B = Family.AMPERE, Family.HOPPER, Family.BLACKWELL
_M, _P, _V, _T = Family.MAXWELL, Family.PASCAL, Family.VOLTA, Family.TURING

# Names only (plus family and Grace for the guards): rules that must hold for future
# parts go by device id (``blackwell_or_later``), not by membership in this table.
# Device ids from pci.ids (GB300 31c2 "GB110 [GB300]" is there; 31c3 is reported by
# NVIDIA's driver README list), B300 3182 from a B300 audit capture (lspci -nn
# "[10de:3182]"), RTX 5090 2b85 from its nvidia-smi -q ("Device Id : 0x2B8510DE").
# The parts before Turing (Azure NV v1 M60, NCv2 P100, ND P40, NCv3 V100) and the T4
# (NCasT4_v3) by their pci.ids names: tests/test_hardware.py reads pci.ids to check them.
# Each row: device id, name, family, Grace tray, then the (first, last) NVIDIA driver
# branch that drives it, last None while NVIDIA ships new branches for it. From the
# "Hardware Supported" lists of NVIDIA's Data Center GPU driver release notes: Ampere from
# R450 (A100) and R460 (A10), Hopper from R525 (H100) and R535 (H200, GH200), Blackwell
# from R570 (B200, GB200, GeForce RTX 50), and B300 / GB300 only from R580, the branch AKS
# runs them on (AgentBaker's GB image, aks-gpu's cuda-lts 580.159.04). R580 is the last
# branch for Maxwell, Pascal and Volta (NVIDIA's CUDA 12.8 / R580 notices).
_MODELS: tuple[tuple[int, str, Family, bool, int, int | None], ...] = (
    (0x13F2, "Tesla M60", _M, False, 346, 580),
    (0x15F7, "Tesla P100 PCIe 12GB", _P, False, 361, 580),
    (0x15F8, "Tesla P100 PCIe 16GB", _P, False, 361, 580),
    (0x15F9, "Tesla P100 SXM2 16GB", _P, False, 361, 580),
    (0x1B38, "Tesla P40", _P, False, 367, 580),
    (0x1BB3, "Tesla P4", _P, False, 367, 580),
    (0x1D81, "TITAN V", _V, False, 387, 580),
    (0x1DB1, "Tesla V100 SXM2 16GB", _V, False, 384, 580),
    (0x1DB4, "Tesla V100 PCIe 16GB", _V, False, 384, 580),
    (0x1DB5, "Tesla V100 SXM2 32GB", _V, False, 384, 580),
    (0x1DB6, "Tesla V100 PCIe 32GB", _V, False, 384, 580),
    (0x1DB8, "Tesla V100 SXM3 32GB", _V, False, 384, 580),
    (0x1DF6, "Tesla V100S PCIe 32GB", _V, False, 384, 580),
    (0x1EB8, "Tesla T4", _T, False, 410, None),
    (0x20B0, "A100 SXM4 40GB", _A, False, 450, None),
    (0x20B2, "A100 SXM4 80GB", _A, False, 450, None),
    (0x2236, "A10", _A, False, 460, None),
    (0x2330, "H100 SXM5", _H, False, 525, None),
    (0x2331, "H100 PCIe", _H, False, 525, None),
    (0x2321, "H100 NVL", _H, False, 525, None),
    (0x2335, "H200 SXM", _H, False, 535, None),
    (0x233B, "H200 NVL", _H, False, 535, None),
    (0x2342, "GH200 480GB", _H, True, 535, None),
    (0x2348, "GH200 144GB HBM3e", _H, True, 535, None),
    (0x2901, "B200", _B, False, 570, None),
    (0x2941, "GB200", _B, True, 570, None),
    (0x2B85, "GeForce RTX 5090", _B, False, 570, None),
    (0x3182, "B300 SXM6 AC", _B, False, 580, None),
    (0x31C2, "GB300", _B, True, 580, None),
    (0x31C3, "GB300", _B, True, 580, None),
)
GPU_MODELS: Mapping[int, GpuModel] = MappingProxyType({r[0]: GpuModel(*r[:4]) for r in _MODELS})
SUPPORTED_BRANCHES: Mapping[int, tuple[int, int | None]] = MappingProxyType(
    {row[0]: row[4:] for row in _MODELS}
)


def branch_problem(version: str, models: Iterable[GpuModel]) -> str | None:
    """Why driver ``version`` (e.g. "570.211.01") has a branch outside one model's supported
    range, or None; unknown ids are not judged."""
    branch = int(version.split(".", 1)[0])
    for m in models:
        first, last = SUPPORTED_BRANCHES.get(m.device_id, (0, None))
        if branch < first:
            return f"{m.name} needs driver branch R{first} or newer; {version} is R{branch}"
        if last is not None and branch > last:
            return f"{m.name} is supported up to driver branch R{last}; {version} is R{branch}"
    return None


NVSWITCH_MODELS: Mapping[int, str] = MappingProxyType(
    {0x1AF1: "A100 NVSwitch", 0x22A3: "H100 NVSwitch"}
)


def classify(vendor: int, pci_class: int) -> DeviceRole:
    """A PCI function's role from vendor and class (24-bit sysfs or 16-bit lspci; prog-if
    ignored); the class decides, not the device id, so a future GPU is still a GPU."""
    if vendor != NVIDIA_VENDOR:
        return DeviceRole.OTHER
    # a 16-bit lspci class (0x0302) widened to the 24-bit sysfs form (0x030200)
    base = (pci_class << 8 if pci_class <= 0xFFFF else pci_class) & 0xFFFF00
    if base in _GPU_CLASSES:
        return DeviceRole.GPU
    if base == NVSWITCH_CLASS:
        return DeviceRole.NVSWITCH
    return DeviceRole.OTHER


def model_for(device_id: int) -> GpuModel:
    """Look up a GPU device id; unknown ids give family unknown and a name like "NVIDIA 0x1234"."""
    unknown = GpuModel(device_id, f"NVIDIA {device_id:#06x}", Family.UNKNOWN, grace=False)
    return GPU_MODELS.get(device_id, unknown)


BLACKWELL_FIRST_DEVICE_ID = 0x2900
"""Every NVIDIA GPU device id from 0x2900 up is Blackwell or later (GB100 is 0x29xx;
Ada's last ids are 0x28xx): the open kernel module is the only one that drives them."""


def blackwell_or_later(device_id: int) -> bool:
    """True for a device id of Blackwell or a later generation, named in the table or not."""
    return device_id >= BLACKWELL_FIRST_DEVICE_ID


TURING_FIRST_DEVICE_ID = 0x1E00
"""Every NVIDIA GPU device id below 0x1e00 is older than Turing (Volta's GV100 is 0x1dxx,
Turing's TU102 0x1e02; tests/test_hardware.py checks it on every GPU in pci.ids). The
open kernel modules need the GSP that Turing introduced: NVIDIA's driver README ("Open
Linux Kernel Modules": "The open flavor of kernel modules supports Turing and later
GPUs. The open kernel modules cannot support GPUs before Turing")."""


def requires_open_module(models: Iterable[GpuModel]) -> bool:
    """Tell whether any GPU needs the open kernel module (every id >= 0x2900 does)."""
    return any(blackwell_or_later(m.device_id) for m in models)


def requires_proprietary_module(models: Iterable[GpuModel]) -> bool:
    """Whether any GPU is older than Turing (no GSP), so needs the proprietary module."""
    return any(m.device_id < TURING_FIRST_DEVICE_ID for m in models)


def has_fabric_probe(model: GpuModel) -> bool:
    """Whether the GPU's fabric state is worth judging; unknown ids are judged by what they say."""
    # Ampere has no GPU fabric probe: it says Fabric N/A even with fabric manager running
    return model.family is not Family.AMPERE
