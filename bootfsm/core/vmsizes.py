"""Azure VM sizes and their GPUs: does a VM of this size have an NVIDIA GPU?

One image boots GPU and CPU VM sizes alike (AKS builds one VHD for both); detect asks
this table, with IMDS ``compute.vmSize``, whether a node without a GPU on its PCI bus
should have had one (a GPU that fell off the bus: 22 NO_GPU) or never had one (a CPU
node: nothing to provision).

The named sizes are those AKS provisions with NVIDIA drivers (karpenter-provider-azure
pkg/utils/supported-gpus.yaml and gpu.go, kept in step with AgentBaker's GPU SKU maps).
Sizes it does not name are judged by Azure's naming: the N-series ("Standard_N...") are
the GPU sizes, and of those the AMD ones (NVv4's Radeon Instinct MI25, NGads V620,
NVads V710, ND MI300X) have no NVIDIA GPU. So a new NVIDIA size is a GPU size before
this table names it, and a GPU missing from one is never mistaken for a CPU node.
"""

from __future__ import annotations

import re

__all__ = ["NVIDIA_VM_SIZES", "has_nvidia_gpu", "normalize"]

NVIDIA_VM_SIZES = frozenset(
    {
        # NCv1 (K80), NC v2 (P100), NC v3 (V100), ND (P40), ND v2 / v3 (V100)
        *(f"standard_nc{n}" for n in (6, 12, 24, "24r")),
        *(f"standard_nc{n}s_v2" for n in (6, 12, 24, "24r")),
        *(f"standard_nc{n}s_v3" for n in (6, 12, 24, "24r")),
        *(f"standard_nd{n}s" for n in (6, 12, 24, "24r")),
        "standard_nd40rs_v2",
        "standard_nd40s_v3",
        # NV (M60), NV v3 (M60)
        *(f"standard_nv{n}" for n in (6, 12, 24, "24r")),
        *(f"standard_nv{n}s_v3" for n in (12, 24, 48)),
        # NCas T4 v3
        *(f"standard_nc{n}as_t4_v3" for n in (4, 8, 16, 64)),
        # NC A10 v4 and NVads A10 v5 (GRID sizes)
        *(f"standard_nc{n}ads_a10_v4" for n in (8, 16, 32)),
        *(f"standard_nv{n}ads_a10_v5" for n in (6, 12, 18, 36, 72)),
        "standard_nv36adms_a10_v5",
        # NC A100 v4, ND A100 v4, NDm A100 v4
        *(f"standard_nc{n}ads_a100_v4" for n in (24, 48, 96)),
        "standard_nd96asr_v4",
        "standard_nd112asr_a100_v4",
        "standard_nd120asr_a100_v4",
        "standard_nd96amsr_a100_v4",
        "standard_nd112amsr_a100_v4",
        "standard_nd120amsr_a100_v4",
        "standard_nd96ams_v4",
        "standard_nd96ams_a100_v4",
        "standard_nd96ams_a100_flex_v4",
        "standard_nd96amsf_a100_v4",
        "standard_nd96amsrf_a100_v4",
        # NC H100 v5, ND H100 v5, ND H200 v5
        "standard_nc40ads_h100_v5",
        "standard_nc80adis_h100_v5",
        "standard_nd96isr_h100_v5",
        "standard_nd96is_h100_v5",
        "standard_nd96is_noib_h100_v5",
        "standard_nd96is_flex_h100_v5",
        "standard_nd96isf_h100_v5",
        "standard_nd96isrf_h100_v5",
        "standard_nd96isr_h200_v5",
        "standard_nd96is_h200_v5",
        "standard_nd96isf_h200_v5",
        "standard_nd96isrf_h200_v5",
        # ND GB200 v6, ND GB300 v6
        "standard_nd128isr_ndr_gb200_v6",
        "standard_nd128isr_gb300_v6",
        # NC RTX PRO 6000 Blackwell Server Edition v6 (GRID v20 sizes)
        *(
            f"standard_nc{n}_xl_rtxpro6000bse_v6"
            for n in (
                "24lds",
                "36ds",
                "36lds",
                "72ds",
                "72lds",
                "128lds",
                "144ds",
                "144lds",
                "256lds",
                "288ds",
                "288lds",
                "320lds",
            )
        ),
    }
)

# N-series sizes whose GPUs are AMD's: NVv4 (Standard_NV4as_v4 ... NV32as_v4), NGads
# V620, NVads V710 v5, ND MI300X v5
_AMD = re.compile(r"standard_nv\d+as_v4|.*_v620(_|$)|.*_v710_v5|.*_mi300x_v5")


def normalize(size: str) -> str:
    """Lower case, without the optional "_promo" suffix (as AgentBaker compares sizes)."""
    return size.strip().lower().removesuffix("_promo")


def has_nvidia_gpu(size: str) -> bool:
    """Whether a VM of this Azure size has an NVIDIA GPU (see the module's rule)."""
    s = normalize(size)
    if s in NVIDIA_VM_SIZES:
        return True
    return s.startswith("standard_n") and _AMD.fullmatch(s) is None
