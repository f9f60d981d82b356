"""Parse (and, for the simulator, render) `nvidia-smi -q` text; classify its failure output."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from bootfsm.parsers import ParseError

__all__ = [
    "SmiFailure",
    "SmiGpu",
    "SmiReport",
    "classify_smi_failure",
    "parse_smi_query",
    "render_smi_query",
]

_BUS_ID = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
_GPU_HEADER = re.compile(rf"GPU ({_BUS_ID})\s*")
_KEY_VALUE = re.compile(r"( *)([^:\s][^:]*?) *:(?: (.*))?")
_INFOROM_WARNING = re.compile(r"\s*WARNING: infoROM is corrupted at gpu\s*(.*)")
_KEY_WIDTH = 42  # the colon sits in column 42 in every real layout


@dataclass(frozen=True)
class SmiGpu:
    """One GPU block; fabric values are as printed, "" when the Fabric block is absent."""

    bus_id: str
    product_name: str
    fabric_state: str
    fabric_status: str


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


_FAILURE_MESSAGES: tuple[tuple[str, SmiFailure], ...] = (
    (
        "Failed to initialize NVML: Driver/library version mismatch",
        SmiFailure.DRIVER_LIBRARY_MISMATCH,
    ),
    ("couldn't communicate with the NVIDIA driver", SmiFailure.NO_DRIVER),
    ("infoROM is corrupted", SmiFailure.INFOROM_CORRUPTED),
)


def classify_smi_failure(text: str) -> SmiFailure | None:
    """Name the failure nvidia-smi printed (first match in the order above), or None."""
    for message, failure in _FAILURE_MESSAGES:
        if message in text:
            return failure
    return None


@dataclass
class _GpuBuilder:
    """Mutable accumulator for one GPU block while scanning."""

    bus_id: str
    product_name: str = ""
    fabric_state: str = ""
    fabric_status: str = ""
    in_fabric: bool = False

    def feed(self, indent: int, key: str, value: str | None) -> None:
        """Take one line of this GPU's block."""
        if indent <= 4:
            self.in_fabric = indent == 4 and key == "Fabric" and value is None
            if indent == 4 and key == "Product Name":
                self.product_name = value or ""
        elif self.in_fabric and indent == 8:
            if key == "State":
                self.fabric_state = value or ""
            elif key == "Status":
                self.fabric_status = value or ""

    def build(self) -> SmiGpu:
        """Freeze the block."""
        return SmiGpu(self.bus_id, self.product_name, self.fabric_state, self.fabric_status)


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


def _kv(indent: int, key: str, value: str) -> str:
    """Format one key/value line with the colon in the real column."""
    return f"{' ' * indent}{key}".ljust(_KEY_WIDTH) + f": {value}".rstrip()


def _check_renderable(value: str, what: str) -> None:
    """Refuse values that could not survive a render -> parse round trip."""
    if value != value.strip() or len(f"<{value}>".splitlines()) != 1:
        raise ValueError(f"render_smi_query: {what} {value!r} is not a single trimmed line")


def render_smi_query(
    driver_version: str,
    cuda_version: str,
    gpus: Sequence[SmiGpu],
    *,
    timestamp: str = "Thu Jan  1 00:00:00 1970",
) -> str:
    """Write `nvidia-smi -q` text in the 560 layout, which parse_smi_query reads back."""
    if not driver_version:
        raise ValueError("render_smi_query: driver_version is empty")
    for what, value in (
        ("driver_version", driver_version),
        ("cuda_version", cuda_version),
        ("timestamp", timestamp),
    ):
        _check_renderable(value, what)
    lines = [
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", timestamp),
        _kv(0, "Driver Version", driver_version),
        _kv(0, "CUDA Version", cuda_version),
        "",
        _kv(0, "Attached GPUs", str(len(gpus))),
    ]
    for gpu in gpus:
        if re.fullmatch(_BUS_ID, gpu.bus_id) is None:
            raise ValueError(f"render_smi_query: bad bus id {gpu.bus_id!r}")
        _check_renderable(gpu.product_name, "product_name")
        _check_renderable(gpu.fabric_state, "fabric_state")
        _check_renderable(gpu.fabric_status, "fabric_status")
        lines += [f"GPU {gpu.bus_id}", _kv(4, "Product Name", gpu.product_name)]
        if gpu.fabric_state or gpu.fabric_status:
            lines += [
                "    Fabric",
                _kv(8, "State", gpu.fabric_state),
                _kv(8, "Status", gpu.fabric_status),
                _kv(8, "CliqueId", "N/A"),
                _kv(8, "ClusterUUID", "N/A"),
            ]
    return "\n".join(lines) + "\n"
