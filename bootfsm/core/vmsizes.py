"""Does a VM of this Azure size have an NVIDIA GPU (else a GPU-less node is a CPU node)?

The rule is Azure's naming: the N-series families NC, ND and NV carry GPUs, NVIDIA's
unless the size names an AMD accelerator (NVv4 ``NV4as_v4``..., ``V620``, ``V710``,
``MI300X``); NG (AMD Radeon PRO V620), NM (AMD Xilinx MA35D) and NP (AMD Xilinx Alveo
U250 FPGAs) carry none. No list of sizes is kept, so a new NVIDIA size of NC, ND or NV
counts the day it ships and a lost GPU is never a CPU node. tests/vmsizes/ holds every
size of AgentBaker's and karpenter-provider-azure's lists (at the commits they cite)
and the non-NVIDIA N-series, against this rule.
"""

from __future__ import annotations

import re

__all__ = ["has_nvidia_gpu"]

# <family><subfamily><vCPUs>[-<constrained>]<features>_<accelerator>..._<version>, of the
# families with NVIDIA GPUs (NCC: confidential NC)
_NVIDIA_FAMILY = re.compile(r"standard_n[cdv][a-z]?\d+(-\d+)?[a-z]*(_.*)?")
# an AMD accelerator within them: NVv4 (NV4as_v4 ... NV32as_v4, and NVas_v4 in some
# listings), Radeon PRO V620/V710, Instinct MI300X and later
_AMD_NVV4 = re.compile(r"standard_nv\d*as_v4")
_AMD_PART = re.compile(r"v620|v710|mi\d+[a-z]*")


def has_nvidia_gpu(size: str) -> bool:
    """Whether a VM of this Azure size has an NVIDIA GPU (see the module's rule)."""
    s = size.strip().lower().removesuffix("_promo")  # as AgentBaker compares sizes
    if _NVIDIA_FAMILY.fullmatch(s) is None or _AMD_NVV4.fullmatch(s) is not None:
        return False
    return not any(_AMD_PART.fullmatch(part) for part in s.split("_")[2:])
