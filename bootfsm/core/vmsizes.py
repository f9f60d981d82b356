"""Does a VM of this Azure size have an NVIDIA GPU (else a GPU-less node is a CPU node)?

The rule is Azure's naming: every N-series size but the AMD ones. No list of sizes is
kept, so a new NVIDIA size counts the day it ships and a lost GPU is never a CPU node.
"""

from __future__ import annotations

import re

__all__ = ["has_nvidia_gpu"]

# N-series sizes whose GPUs are AMD's: NVv4 (Standard_NV4as_v4 ... NV32as_v4), NGads
# V620, NVads V710 v5, ND MI300X v5
_AMD = re.compile(r"standard_nv\d+as_v4|.*_v620(_|$)|.*_v710_v5|.*_mi300x_v5")


def has_nvidia_gpu(size: str) -> bool:
    """Whether a VM of this Azure size has an NVIDIA GPU (see the module's rule)."""
    s = size.strip().lower().removesuffix("_promo")  # as AgentBaker compares sizes
    return s.startswith("standard_n") and _AMD.fullmatch(s) is None
