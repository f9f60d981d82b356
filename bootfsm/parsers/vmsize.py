"""Parse the VM size out of an Azure IMDS instance (or compute) document."""

from __future__ import annotations

import re

from bootfsm.core.excerpt import excerpt
from bootfsm.parsers import ParseError
from bootfsm.parsers.imds_tags import imds_compute

__all__ = ["parse_imds_vm_size"]

# Azure size names: "Standard_ND96isr_H100_v5", "Standard_ND128isr_NDR_GB200_v6".
_VM_SIZE = re.compile(r"[A-Za-z0-9_-]{1,100}")


def parse_imds_vm_size(text: str) -> str:
    """The lower-cased `compute.vmSize` of an IMDS instance (or bare compute) document."""
    size = imds_compute(text).get("vmSize")
    if not isinstance(size, str) or not _VM_SIZE.fullmatch(size):
        raise ParseError(f"IMDS document: compute.vmSize is missing or malformed: {excerpt(size)}")
    return size.lower()
