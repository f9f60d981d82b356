"""nvidia-smi's report types, and the classifier of its plain output.

The report is read only from `nvidia-smi -q -x` (:mod:`bootfsm.parsers.nvidia_smi_xml`);
plain output is classified, never parsed.
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
    "wrong_module_type",
]

_INFOROM_WARNING = re.compile(r"\s*WARNING: infoROM is corrupted at gpu\s*(.*)")
_PCI_DEVICE_ID = re.compile(r"(?:0x)?([0-9A-Fa-f]{4})10DE", re.IGNORECASE)


@dataclass(frozen=True)
class SmiGpu:
    """One GPU; values as printed, "" when absent; ``device_id`` is the PCI id, 0 if absent."""

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
    license_status: str | None = None
    """vGPU Software Licensed Product / License Status as printed (a vGPU guest:
    "Licensed (Expiry: 2025-3-19 7:29:4 GMT)", "Unlicensed (Unrestricted)"...); None when
    the report has no such block (no vGPU guest: no licence will ever be reported)."""
    virtualization_mode: str = ""
    """GPU Virtualization Mode as printed ("None", "Pass-Through", "VGPU"...)."""


@dataclass(frozen=True)
class SmiReport:
    """A whole `nvidia-smi -q -x` report plus any infoROM corruption warnings mixed into it."""

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
    return next((failure for message, failure in _FAILURE_MESSAGES if message in text), None)


def inforom_warnings(text: str) -> tuple[str, ...]:
    """The bus ids of every ``WARNING: infoROM is corrupted at gpu <bus id>`` line, in order."""
    # plain nvidia-smi prints it after its table and exits 14 (nvml_error_excerpts.txt [E])
    found = (_INFOROM_WARNING.fullmatch(line.rstrip()) for line in text.splitlines())
    return tuple(m[1].strip() for m in found if m is not None)


def licensed(status: str) -> bool:
    """True for ``Licensed``, with or without ``(Expiry: ...)``; ``Unlicensed...`` is False."""
    return status == "Licensed" or status.startswith("Licensed (")


def device_id_of(value: str) -> int:
    """The PCI device id in nvidia-smi's "0x233010DE" (text) or "233010DE" (XML); 0 if not so."""
    match = _PCI_DEVICE_ID.fullmatch(value.strip())
    return int(match[1], 16) if match else 0


def wrong_module_type(smi_output: str, pci_device_ids: list[int], proc_version: str) -> str | None:
    """Why `No devices were found` means the proprietary module on a Blackwell-or-later GPU
    (device id >= 0x2900), or None. Pure: the caller reads the inputs."""
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
