"""Parse PCI facts: sysfs hex attributes and InfiniBand VPD bytes."""

from __future__ import annotations

import re

from bootfsm.core.excerpt import excerpt
from bootfsm.parsers import ParseError

__all__ = ["parse_sysfs_hex", "vpd_has_sw_mng"]

_SYSFS_HEX = re.compile(r"(?:0[xX])?([0-9a-fA-F]{1,16})")


def parse_sysfs_hex(text: str, *, what: str) -> int:
    """Parse a sysfs hex attribute such as "0x10de\\n"; `what` names it in errors."""
    match = _SYSFS_HEX.fullmatch(text.strip())
    if match is None:
        raise ParseError(f"{what}: expected a hex value like 0x10de, got {excerpt(text, 40)}")
    return int(match.group(1), 16)


def vpd_has_sw_mng(data: bytes) -> bool:
    """Tell whether binary InfiniBand VPD carries the NVLink5 `SW_MNG` marker."""
    return b"SW_MNG" in data
