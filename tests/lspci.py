"""`lspci -nn` lines read into devices: a test helper for the lspci captures in the
samples (bootfsm reads the PCI bus from /sys/bus/pci/devices, never from lspci)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bootfsm.parsers import ParseError

__all__ = ["PciDevice", "parse_lspci_nn"]

# `lspci -nn` / `lspci -Dnn`:
#   0000:1b:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330]
# The domain is printed by -D, or by plain lspci whenever it is not 0000.
_LSPCI_NN = re.compile(
    r"(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bdf>[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
    r"\s+(?P<class_name>[^\[]*?)\s*\[(?P<class>[0-9a-fA-F]{4})\]:\s*"
    r"(?P<description>.*?)\s*\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]"
    r"(?P<rest>.*)"
)


@dataclass(frozen=True)
class PciDevice:
    """One `lspci -nn` device line.

    `address` is the full lower-case sysfs address (domain included, "0000:" added when
    lspci left it out); `class_code` is the 16-bit class+subclass printed in brackets,
    e.g. 0x0302 (sysfs `class` files hold the 24-bit form, 0x030200).
    """

    address: str
    class_code: int
    vendor: int
    device: int
    description: str


def _parse_lspci_line(line: str, lineno: int) -> PciDevice:
    """Parse one non-indented `lspci -nn` line."""
    match = _LSPCI_NN.fullmatch(line.rstrip())
    if match is None:
        raise ParseError(
            f"lspci -nn line {lineno}: expected 'ADDR CLASS [cccc]: DESC [vvvv:dddd]',"
            f" got {line[:120]!r}"
        )
    domain = (match["domain"] or "0000").lower()
    return PciDevice(
        address=f"{domain}:{match['bdf'].lower()}",
        class_code=int(match["class"], 16),
        vendor=int(match["vendor"], 16),
        device=int(match["device"], 16),
        description=match["description"],
    )


def parse_lspci_nn(text: str) -> list[PciDevice]:
    """Parse `lspci -nn` or `lspci -Dnn` output into devices, in output order.

    Blank lines and indented detail lines (from -v) are skipped; any other line that is
    not a device line raises ParseError, so plain `lspci` output (no ids) is refused
    rather than read as "no GPUs".
    """
    devices: list[PciDevice] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line[0] in " \t":
            continue
        devices.append(_parse_lspci_line(line, lineno))
    return devices
