"""Azure VM sizes and their GPUs: does a VM of this size have an NVIDIA GPU?

One image boots GPU and CPU VM sizes alike (AKS builds one VHD for both); detect asks
this rule, with IMDS ``compute.vmSize``, whether a node without a GPU on its PCI bus
should have had one (a GPU that fell off the bus: 22 NO_GPU) or never had one (a CPU
node: nothing to provision).

The rule is Azure's naming: the N-series ("Standard_N...") are the GPU sizes, and of
those the AMD ones (NVv4's Radeon Instinct MI25, NGads V620, NVads V710, ND MI300X) have
no NVIDIA GPU. Every size AKS provisions with NVIDIA drivers (karpenter-provider-azure
pkg/utils/supported-gpus.yaml and gpu.go, AgentBaker's GPU SKU maps: NC, ND, NV from K80
to GB300 and RTX PRO 6000) is an N-series size, so no list of them is kept: a new NVIDIA
size is a GPU size the day it ships, and a GPU missing from one is never mistaken for a
CPU node.
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
