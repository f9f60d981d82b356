"""Simulated node models (SKUs), their PCI layout and the node-side faults.

Re-exported by :mod:`bootfsm.sim.node`; kept apart so the stand-in commands can look a
SKU up by name without importing the node builder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

__all__ = [
    "FAULTS",
    "SKUS",
    "STALE_DRIVER_VERSION",
    "PciFunction",
    "Sku",
    "pci_layout",
    "smi_product_name",
]

STALE_DRIVER_VERSION = "535.183.01"
"""Version of the old proprietary driver the stale-driver faults leave on the node."""


@dataclass(frozen=True)
class Sku:
    """One simulated node model; every field is a fact a real node of that model shows."""

    name: str
    arch: Literal["x86_64", "aarch64"]
    gpu_device_id: int
    gpu_count: int
    nvswitch_device_id: int | None
    nvswitch_count: int
    nvlink5: bool
    os_id: str
    os_version: str
    kernel: str
    containerd_version: str
    vm_size: str
    amd_gpu_device_id: int | None = None
    """An AMD GPU function on PCI (vendor 0x1002) instead of NVIDIA's, on an AMD VM size."""
    clique_id: int = 0
    """Fabric CliqueId once Completed: a Grace-Blackwell NVLink domain's clique (GB200
    capture: 2, GB300 capture: 32766); 0 on single-node NVSwitch/NVLink5 systems."""


def _skus(*skus: Sku) -> Mapping[str, Sku]:
    return MappingProxyType({s.name: s for s in skus})


SKUS: Mapping[str, Sku] = _skus(
    Sku(
        name="h100-hgx",
        arch="x86_64",
        gpu_device_id=0x2330,
        gpu_count=8,
        nvswitch_device_id=0x22A3,
        nvswitch_count=4,
        nvlink5=False,
        os_id="ubuntu",
        os_version="22.04",
        kernel="5.15.0-1089-azure",
        containerd_version="1.7.27",
        vm_size="Standard_ND96isr_H100_v5",
    ),
    Sku(
        name="h100-pcie",
        arch="x86_64",
        gpu_device_id=0x2331,
        gpu_count=1,
        nvswitch_device_id=None,
        nvswitch_count=0,
        nvlink5=False,
        os_id="ubuntu",
        os_version="22.04",
        kernel="5.15.0-1089-azure",
        containerd_version="1.7.27",
        vm_size="Standard_NC40ads_H100_v5",
    ),
    Sku(
        name="b200-hgx",
        arch="x86_64",
        gpu_device_id=0x2901,
        gpu_count=8,
        nvswitch_device_id=None,
        nvswitch_count=0,
        nvlink5=True,
        os_id="ubuntu",
        os_version="24.04",
        kernel="6.8.0-1021-azure",
        containerd_version="2.0.4",
        # No Azure B200 size string exists in the samples; this one is Azure-shaped only.
        vm_size="Standard_ND128isr_B200_v6",
    ),
    Sku(
        name="gb200",
        arch="aarch64",
        gpu_device_id=0x2941,
        gpu_count=4,
        nvswitch_device_id=None,
        nvswitch_count=0,
        nvlink5=False,
        os_id="ubuntu",
        os_version="24.04",
        kernel="6.8.0-1025-azure",
        containerd_version="2.0.4",
        vm_size="Standard_ND128isr_NDR_GB200_v6",
        clique_id=2,
    ),
    Sku(
        name="gb300",
        arch="aarch64",
        gpu_device_id=0x31C2,
        gpu_count=4,
        nvswitch_device_id=None,
        nvswitch_count=0,
        nvlink5=False,
        os_id="ubuntu",
        os_version="24.04",
        kernel="6.8.0-1025-azure",
        containerd_version="2.1.1",
        vm_size="Standard_ND128isr_GB300_v6",
        clique_id=32766,
    ),
    Sku(
        # 8x A100 SXM4 40GB and 6 A100 NVSwitches (0x1af1, as in the ND96asr A100 lspci
        # capture), the MIG node AgentBaker's cse_main.sh comment describes
        name="a100-ndv4",
        arch="x86_64",
        gpu_device_id=0x20B0,
        gpu_count=8,
        nvswitch_device_id=0x1AF1,
        nvswitch_count=6,
        nvlink5=False,
        os_id="ubuntu",
        os_version="22.04",
        kernel="5.15.0-1089-azure",
        containerd_version="1.7.27",
        vm_size="Standard_ND96asr_v4",
    ),
    Sku(
        # Azure NDv2: 8x V100 SXM2 32GB (0x1db5) in PCI domains 0001-0008, as the
        # azhpc-diagnostics 8x V100 table capture shows them; no NVSwitch (hybrid cube
        # mesh NVLink), so no fabric manager. Older than Turing: proprietary modules only.
        name="v100-ndv2",
        arch="x86_64",
        gpu_device_id=0x1DB5,
        gpu_count=8,
        nvswitch_device_id=None,
        nvswitch_count=0,
        nvlink5=False,
        os_id="ubuntu",
        os_version="22.04",
        kernel="5.15.0-1089-azure",
        containerd_version="1.7.27",
        vm_size="Standard_ND40rs_v2",
    ),
    Sku(
        # Azure NVadsA10 v5: one A10 (0x2236) vGPU partition, driven by the GRID driver
        # (AKS issues 4870/4880: "Standard_NV36ads_A10_v5", licensing through gridd)
        name="a10-nvads",
        arch="x86_64",
        gpu_device_id=0x2236,
        gpu_count=1,
        nvswitch_device_id=None,
        nvswitch_count=0,
        nvlink5=False,
        os_id="ubuntu",
        os_version="22.04",
        kernel="5.15.0-1089-azure",
        containerd_version="1.7.27",
        vm_size="Standard_NV36ads_A10_v5",
    ),
    Sku(
        # a CPU VM size booting the same image (AKS builds one VHD for GPU and CPU sizes):
        # no NVIDIA function on PCI, a general-purpose D-series size in IMDS
        name="cpu-d4s",
        arch="x86_64",
        gpu_device_id=0,
        gpu_count=0,
        nvswitch_device_id=None,
        nvswitch_count=0,
        nvlink5=False,
        os_id="ubuntu",
        os_version="22.04",
        kernel="5.15.0-1089-azure",
        containerd_version="1.7.27",
        vm_size="Standard_D4s_v5",
    ),
    Sku(
        # an AMD GPU VM size booting the same image: Azure NGads V620 (a quarter of a Radeon
        # PRO V620, passed in as its SR-IOV function, pci.ids 1002:73ae "Navi 21 [Radeon Pro
        # V620 MxGPU]"), no NVIDIA function on PCI
        name="amd-ngads-v620",
        arch="x86_64",
        gpu_device_id=0,
        gpu_count=0,
        nvswitch_device_id=None,
        nvswitch_count=0,
        nvlink5=False,
        os_id="ubuntu",
        os_version="22.04",
        kernel="5.15.0-1089-azure",
        containerd_version="1.7.27",
        vm_size="Standard_NG8ads_V620_v1",
        amd_gpu_device_id=0x73AE,
    ),
)

FAULTS: Mapping[str, str] = MappingProxyType(
    {
        "inforom-corrupted": "nvidia-smi warns 'infoROM is corrupted' for the first GPU",
        "fabric-in-progress-forever": "on NVLink nodes the GPU fabric never leaves 'In Progress'",
        "kubelet-unhealthy": "kubelet /healthz answers 500 even while the unit is active",
        "installer-fails": "nvidia-installer fails the DKMS build (exit 1)",
        "installer-hangs": "nvidia-installer never returns (dies on SIGTERM/SIGKILL)",
        "stale-driver-in-use": (
            f"a {STALE_DRIVER_VERSION} proprietary driver is built and loaded;"
            " a process (python3, pid 4242) holds /dev/nvidia0, so `modprobe -r nvidia`"
            " fails 'in use'"
        ),
        "stale-driver": (
            f"a {STALE_DRIVER_VERSION} proprietary driver is built and loaded (unloadable)"
        ),
        "gpu-missing": "nvidia-smi and the driver see one GPU fewer than PCI shows",
        "stale-fabricmanager-unit": (
            "an old nvidia-fabricmanager.service unit is installed and enabled"
        ),
        "containerd-restart-fails": "`systemctl restart containerd` fails",
        "ib-umad-missing": "the kernel has no ib_umad module (modprobe ib_umad fails)",
        "cdi-fails": "`nvidia-ctk cdi generate` fails",
        "gpus-off-bus": "the GPUs are missing from PCI (fell off the bus) on a GPU VM size",
        "kernel-headers-missing": "/lib/modules/<kernel>/build is absent (no DKMS build)",
        "grid-passthrough": (
            "a GRID driver on a GPU passed through whole, no vGPU: nvidia-smi shows"
            " Virtualization Mode Pass-Through and no vGPU Software Licensed Product block"
        ),
        "grid-unlicensed": (
            "a GRID guest's vGPU licence is never acquired (nvidia-smi -q: License Status"
            " Unlicensed (Unrestricted))"
        ),
        "secure-boot": (
            "a Trusted Launch VM with Secure Boot on: the EFI variable SecureBoot is 1, the"
            " kernel locked down (integrity) and enforcing module signatures, IMDS"
            ' secureBootEnabled "true"; an unsigned nvidia module is refused at load'
            " ('Key was rejected by service')"
        ),
        "mig-gpu-in-use": (
            "a client holds the GPUs: `nvidia-smi -mig 1` leaves MIG mode pending and MIG"
            " instances cannot be created or destroyed ('In use by another client')"
        ),
    }
)


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as sysfs shows it under /sys/bus/pci/devices/<address>."""

    address: str
    vendor: int
    device: int
    pci_class: int


_NVIDIA = 0x10DE
_AMD = 0x1002
_MELLANOX = 0x15B3
_MICROSOFT = 0x1414


def pci_layout(sku: Sku) -> tuple[PciFunction, ...]:
    """PCI functions of a SKU: GPUs, NVSwitches, then Mellanox and Hyper-V devices.

    x86 Azure guests put every passed-through function in its own PCI domain
    (0001:00:00.0, 0002:00:00.0, ...); Grace trays use domains like 0008:01:00.0.
    """
    funcs: list[PciFunction] = []
    for i in range(sku.gpu_count):
        if sku.arch == "aarch64":
            address = f"{0x0008 + 0x10 * (i // 2) + i % 2:04x}:01:00.0"
        else:
            address = f"{i + 1:04x}:00:00.0"
        funcs.append(PciFunction(address, _NVIDIA, sku.gpu_device_id, 0x030200))
    if sku.nvswitch_device_id is not None:
        for i in range(sku.nvswitch_count):
            address = f"{sku.gpu_count + i + 1:04x}:00:00.0"
            funcs.append(PciFunction(address, _NVIDIA, sku.nvswitch_device_id, 0x068000))
    if sku.amd_gpu_device_id is not None:
        funcs.append(PciFunction("0001:00:00.0", _AMD, sku.amd_gpu_device_id, 0x038000))
    funcs += [
        PciFunction("0101:00:00.0", _MELLANOX, 0x101E, 0x020700),  # ConnectX-7 VF (InfiniBand)
        PciFunction("c941:00:02.0", _MELLANOX, 0x1016, 0x020000),  # ConnectX-4 Lx VF (Ethernet)
        PciFunction("30c3:00:00.0", _MICROSOFT, 0xB111, 0x010802),  # Hyper-V NVMe
    ]
    return tuple(funcs)


_SMI_NAMES: Mapping[int, str] = MappingProxyType(
    {
        0x1DB5: "Tesla V100-SXM2-32GB",  # azhpc-diagnostics 8x V100 table (truncated there)
        0x2236: "NVIDIA A10-24Q",  # the NVadsA10 v5 vGPU profile of a whole A10
        0x20B0: "NVIDIA A100-SXM4-40GB",
        0x2330: "NVIDIA H100 80GB HBM3",
        0x2331: "NVIDIA H100 PCIe",
        0x2321: "NVIDIA H100 NVL",
        0x2335: "NVIDIA H200",
        0x2901: "NVIDIA B200",
        0x2941: "NVIDIA GB200",
        0x31C2: "NVIDIA GB300",
        0x31C3: "NVIDIA GB300",
    }
)


def smi_product_name(device_id: int) -> str:
    """The "Product Name" nvidia-smi prints for a GPU device id."""
    return _SMI_NAMES.get(device_id, f"NVIDIA Device {device_id:04X}")
