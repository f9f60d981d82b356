"""Parse `nvidia-smi -q` text and classify nvidia-smi's failure output.

verify reads the structured `nvidia-smi -q -x` (:mod:`bootfsm.parsers.nvidia_smi_xml`);
the text reader stays because most real captures of older layouts (460-570: A100 HGX,
H100 HGX/NVL, H200, GH200, RTX 5090, TITAN V, A10) exist only as `-q` text, and both
readers give the same :class:`SmiReport`, so one judgement covers every capture.
A lone Fabric block as people paste it is read by tests/smi_excerpts.py (a test helper).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bootfsm.core.hardware import blackwell_or_later, model_for
from bootfsm.core.strenum import StrEnum
from bootfsm.parsers import ParseError
from bootfsm.parsers.driver_info import parse_proc_driver_version

__all__ = [
    "SmiFailure",
    "SmiGpu",
    "SmiReport",
    "classify_smi_failure",
    "device_id_of",
    "inforom_warnings",
    "licensed",
    "parse_smi_query",
    "wrong_module_type",
]

_BUS_ID = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
_GPU_HEADER = re.compile(rf"GPU ({_BUS_ID})\s*")
_KEY_VALUE = re.compile(r"( *)([^:\s][^:]*?) *:(?: (.*))?")
_INFOROM_WARNING = re.compile(r"\s*WARNING: infoROM is corrupted at gpu\s*(.*)")
_PCI_DEVICE_ID = re.compile(r"(?:0x)?([0-9A-Fa-f]{4})10DE", re.IGNORECASE)


@dataclass(frozen=True)
class SmiGpu:
    """One GPU; fabric values are as printed, "" when the Fabric block (or a line) is absent.

    ``device_id`` is the PCI device id (0x2330 from "Device Id : 0x233010DE"), 0 when
    the report does not give it.
    """

    bus_id: str
    product_name: str
    fabric_state: str
    fabric_status: str
    device_id: int = 0
    clique_id: str = ""
    cluster_uuid: str = ""
    health_summary: str = ""
    mig_current: str = ""
    """MIG Mode Current as printed ("Enabled", "Disabled", "N/A": no MIG); "" when absent."""
    mig_pending: str = ""
    """MIG Mode Pending: what the next GPU reset or reboot makes current."""
    license_status: str = ""
    """vGPU Software Licensed Product / License Status as printed (a GRID driver:
    "Licensed (Expiry: 2025-3-19 7:29:4 GMT)", "Unlicensed (Unrestricted)"...); "" when
    the block is absent (not a GRID driver)."""


@dataclass(frozen=True)
class SmiReport:
    """A whole `nvidia-smi -q` report plus any infoROM corruption warnings mixed into it."""

    driver_version: str
    cuda_version: str
    attached_gpus: int
    gpus: tuple[SmiGpu, ...]
    inforom_corrupted: tuple[str, ...]


class SmiFailure(StrEnum):
    """A recognised nvidia-smi failure."""

    DRIVER_LIBRARY_MISMATCH = "driver_library_mismatch"
    NO_DRIVER = "no_driver"
    INFOROM_CORRUPTED = "inforom_corrupted"
    NO_DEVICES = "no_devices"


_FAILURE_MESSAGES: tuple[tuple[str, SmiFailure], ...] = (
    (
        "Failed to initialize NVML: Driver/library version mismatch",
        SmiFailure.DRIVER_LIBRARY_MISMATCH,
    ),
    ("couldn't communicate with the NVIDIA driver", SmiFailure.NO_DRIVER),
    ("infoROM is corrupted", SmiFailure.INFOROM_CORRUPTED),
    # nvidia-smi's words (exit 6) when the driver is loaded but manages no GPU, e.g. the
    # proprietary module on a Blackwell GPU, which only the open module supports.
    ("No devices were found", SmiFailure.NO_DEVICES),
)


def classify_smi_failure(text: str) -> SmiFailure | None:
    """Name the failure nvidia-smi printed (first match in the order above), or None."""
    for message, failure in _FAILURE_MESSAGES:
        if message in text:
            return failure
    return None


def inforom_warnings(text: str) -> tuple[str, ...]:
    """The bus ids of every ``WARNING: infoROM is corrupted at gpu <bus id>`` line, in
    order (plain `nvidia-smi` prints it after its table and exits 14: samples
    nvidia-smi/nvml_error_excerpts.txt [E] and
    azhpc-diagnostics/table_8xV100_inforom-warning_460.32.03.txt)."""
    found = (_INFOROM_WARNING.fullmatch(line.rstrip()) for line in text.splitlines())
    return tuple(m[1].strip() for m in found if m is not None)


def licensed(status: str) -> bool:
    """A License Status that says the vGPU licence is acquired: ``Licensed``, with or
    without ``(Expiry: ...)`` (NVIDIA's vGPU licensing guides; gpu-operator #220 shows the
    4-space block of a guest that has none: ``License Status : Unlicensed``)."""
    return status == "Licensed" or status.startswith("Licensed (")


def device_id_of(value: str) -> int:
    """The PCI device id in nvidia-smi's "0x233010DE" (text) or "233010DE" (XML); 0 if not so."""
    match = _PCI_DEVICE_ID.fullmatch(value.strip())
    return int(match[1], 16) if match else 0


_FABRIC_KEYS = {"State": 0, "Status": 1, "CliqueId": 2, "ClusterUUID": 3}
_LICENSED = "vGPU Software Licensed Product"


@dataclass
class _GpuBuilder:
    """Mutable accumulator for one GPU block while scanning."""

    bus_id: str
    product_name: str = ""
    device_id: int = 0
    fabric: list[str] | None = None  # State, Status, CliqueId, ClusterUUID, Health Summary
    section: str = ""
    subsection: str = ""
    mig: tuple[str, str] = ("", "")
    license_status: str = ""

    def feed(self, indent: int, key: str, value: str | None) -> None:
        """Take one line of this GPU's block."""
        if indent <= 4:
            self.section = key if indent == 4 and value is None else ""
            self.subsection = ""
            if indent == 4 and key == "Product Name":
                self.product_name = value or ""
            if self.section == "Fabric":
                self.fabric = ["", "", "", "", ""]
            return
        if indent == 8:
            self.subsection = key if value is None else ""
        if self.section == "PCI" and indent == 8 and key == "Device Id":
            self.device_id = device_id_of(value or "")
        elif self.section == _LICENSED and indent == 8 and key == "License Status":
            self.license_status = value or ""
        elif self.section == "MIG Mode" and indent == 8 and key in ("Current", "Pending"):
            current, pending = self.mig
            self.mig = (value or "", pending) if key == "Current" else (current, value or "")
        elif self.section == "Fabric" and self.fabric is not None:
            if indent == 8 and key in _FABRIC_KEYS:
                self.fabric[_FABRIC_KEYS[key]] = value or ""
            elif indent == 12 and self.subsection == "Health" and key == "Summary":
                self.fabric[4] = value or ""

    def build(self) -> SmiGpu:
        """Freeze the block."""
        state, status, clique, cluster, health = self.fabric or ["", "", "", "", ""]
        return SmiGpu(
            self.bus_id,
            self.product_name,
            state,
            status,
            self.device_id,
            clique,
            cluster,
            health,
            *self.mig,
            self.license_status,
        )


def _split(line: str) -> tuple[int, str, str | None]:
    """Split a line into (indent, key, value); value is None for section headings."""
    match = _KEY_VALUE.fullmatch(line)
    if match is None:
        stripped = line.lstrip(" ")
        return len(line) - len(stripped), stripped, None
    return len(match[1]), match[2], (match[3] or "").strip()


def parse_smi_query(text: str) -> SmiReport:
    """Parse `nvidia-smi -q`; ParseError when the header is incomplete or GPU blocks are missing."""
    header: dict[str, str] = {}
    warnings: list[str] = []
    gpus: list[_GpuBuilder] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        warning = _INFOROM_WARNING.match(line)
        if warning is not None:
            warnings.append(warning[1].strip())
            continue
        if not line.strip():
            continue
        gpu_header = _GPU_HEADER.fullmatch(line)
        if gpu_header is not None:
            gpus.append(_GpuBuilder(gpu_header[1]))
            continue
        indent, key, value = _split(line)
        if gpus:
            gpus[-1].feed(indent, key, value)
        elif indent == 0 and value is not None:
            header.setdefault(key, value)
    return _report(header, gpus, warnings)


def _report(header: dict[str, str], gpus: list[_GpuBuilder], warnings: list[str]) -> SmiReport:
    """Check the scanned pieces against each other and build the report."""
    attached = header.get("Attached GPUs")
    if attached is None:
        raise ParseError("nvidia-smi -q: no 'Attached GPUs' line (not -q output?)")
    if not attached.isascii() or not attached.isdigit():
        raise ParseError(f"nvidia-smi -q: 'Attached GPUs' is not a number: {attached!r}")
    driver = header.get("Driver Version", "")
    if not driver:
        raise ParseError("nvidia-smi -q: no 'Driver Version' line")
    if int(attached) != len(gpus):
        raise ParseError(
            f"nvidia-smi -q: 'Attached GPUs' says {int(attached)} but {len(gpus)} GPU blocks"
            " were found (truncated output?)"
        )
    bus_ids = [g.bus_id for g in gpus]
    if len(set(bus_ids)) != len(bus_ids):
        raise ParseError(f"nvidia-smi -q: duplicate GPU bus ids in {bus_ids}")
    return SmiReport(
        driver_version=driver,
        cuda_version=header.get("CUDA Version", ""),
        attached_gpus=int(attached),
        gpus=tuple(g.build() for g in gpus),
        inforom_corrupted=tuple(warnings),
    )


def wrong_module_type(smi_output: str, pci_device_ids: list[int], proc_version: str) -> str | None:
    """Why `No devices were found` means the wrong kernel module, or None when it does not.

    True when nvidia-smi found no devices, the PCI bus has a Blackwell-or-later GPU
    (device id >= 0x2900) and /proc/driver/nvidia/version names the proprietary module.
    Pure: the caller reads the inputs (the driver state's post-load check can use it too).
    """
    if classify_smi_failure(smi_output) is not SmiFailure.NO_DEVICES:
        return None
    newer = sorted({d for d in pci_device_ids if blackwell_or_later(d)})
    if not newer:
        return None
    try:
        loaded = parse_proc_driver_version(proc_version)
    except ParseError:
        return None
    if loaded.open_module:
        return None
    names = ", ".join(f"{model_for(d).name} ({d:#06x})" for d in newer)
    return (
        f"nvidia-smi: No devices were found: the proprietary nvidia module {loaded.version}"
        f" is loaded, but {names} needs the open kernel modules"
    )
