"""A reader of `nvidia-smi -q` text, for the tests: most real captures of older layouts
(460-570: A100 HGX, H100 HGX/NVL, H200, GH200, RTX 5090, TITAN V, A10) exist only as
`-q` text. bootfsm itself reads only `nvidia-smi -q -x`
(bootfsm.parsers.nvidia_smi_xml); this reader gives the same SmiReport, so the product's
judgements (fabric, MIG layout, licences) are checked on every capture.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import SmiGpu, SmiReport, device_id_of

__all__ = ["parse_smi_query"]

_BUS_ID = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
_GPU_HEADER = re.compile(rf"GPU ({_BUS_ID})\s*")
_KEY_VALUE = re.compile(r"( *)([^:\s][^:]*?) *:(?: (.*))?")
_INFOROM_WARNING = re.compile(r"\s*WARNING: infoROM is corrupted at gpu\s*(.*)")

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
    license_status: str | None = None  # None: no licence section (no vGPU guest)
    virtualization_mode: str = ""

    def feed(self, indent: int, key: str, value: str | None) -> None:
        """Take one line of this GPU's block."""
        if indent <= 4:
            self.section = key if indent == 4 and value is None else ""
            self.subsection = ""
            if indent == 4 and key == "Product Name":
                self.product_name = value or ""
            if self.section == "Fabric":
                self.fabric = ["", "", "", "", ""]
            if self.section == _LICENSED and self.license_status is None:
                self.license_status = ""  # the section is there: a vGPU guest
            return
        if indent == 8:
            self.subsection = key if value is None else ""
        if self.section == "PCI" and indent == 8 and key == "Device Id":
            self.device_id = device_id_of(value or "")
        elif self.section == _LICENSED and indent == 8 and key == "License Status":
            self.license_status = value or ""
        elif self.section == "GPU Virtualization Mode" and key == "Virtualization Mode":
            self.virtualization_mode = value or ""
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
            self.virtualization_mode,
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
