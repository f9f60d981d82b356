"""Which Azure VM sizes have an NVIDIA GPU, held against the published lists (issue 40 item 5).

tests/vmsizes/ holds, as data with the commit each was read at, every size of AgentBaker's
GPU lists and of karpenter-provider-azure's pkg/utils/supported-gpus.yaml, and the N-series
sizes without an NVIDIA GPU (AMD's NGads V620 with its ``_v1`` suffix, NVv4, the MA35D,
the NP FPGA sizes). A size whose GPU is not NVIDIA's must not make a GPU-less node a
GPU node whose GPUs fell off the bus (``22 NO_GPU``): on a shared image it is a CPU node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bootfsm.core.vmsizes import has_nvidia_gpu

DATA = Path(__file__).parent / "vmsizes"
VENDORS = {"nvidia", "amd", "xilinx"}


def sizes(name: str) -> list[tuple[str, str]]:
    """(size, vendor) of each data line of tests/vmsizes/<name>."""
    out = []
    for line in (DATA / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            size, vendor = line.split()
            assert vendor in VENDORS, line
            out.append((size, vendor))
    return out


def cited_commit(name: str) -> str:
    """The 40-hex commit a data file's header names."""
    words = (DATA / name).read_text().split()
    return next(w for w in words if len(w) == 40 and all(c in "0123456789abcdef" for c in w))


FILES = ("agentbaker.txt", "karpenter.txt", "non_nvidia.txt")
ALL = [(f, s, v) for f in FILES for s, v in sizes(f)]


def test_the_lists_are_whole_and_cited() -> None:
    """Counted from the upstream files: AgentBaker's three maps twice (datamodel and
    aks-node-controller), its last nvidiaEnabledSKUs, the NCv1 rule, the MA35D; karpenter's
    89 entries, 82 NVIDIA and 7 AMD."""
    karpenter = sizes("karpenter.txt")
    assert len(karpenter) == 89
    assert sum(v == "amd" for _, v in karpenter) == 7
    assert cited_commit("karpenter.txt") == "352646f599290c3a6d2f9710fb535a7b288f88ed"
    agentbaker = sizes("agentbaker.txt")
    assert ("standard_nv36adms_a10_v5", "nvidia") in agentbaker
    assert ("standard_nd96isrf_h200_v5", "nvidia") in agentbaker
    assert ("standard_nc288lds_xl_rtxpro6000bse_v6", "nvidia") in agentbaker
    assert ("Standard_NM16ads_MA35D", "amd") in agentbaker
    assert cited_commit("agentbaker.txt") == "06836ee2301e362039418c3a7ed0fe6004a641fd"


@pytest.mark.parametrize(("source", "size", "vendor"), ALL, ids=[f"{f}:{s}" for f, s, _ in ALL])
def test_every_listed_size_is_judged_by_its_vendor(source: str, size: str, vendor: str) -> None:
    assert has_nvidia_gpu(size) is (vendor == "nvidia")


@pytest.mark.parametrize(
    "size",
    [
        "Standard_NG8ads_V620_v1",  # the _v1 suffix slipped past the old rule
        "Standard_NM16ads_MA35D",
        "Standard_NP10s",
        "Standard_NP40s",
        " standard_ng32adms_v620_v1\n",  # IMDS's value, lower-cased, with whitespace
    ],
)
def test_the_non_nvidia_n_series_has_no_nvidia_gpu(size: str) -> None:
    assert not has_nvidia_gpu(size)


@pytest.mark.parametrize(
    "size",
    [
        "Standard_NCC40ads_H100_v5",  # confidential H100: a subfamily letter
        "Standard_ND128isr_NDR_GB200_v6",  # IMDS's spelling (azure_gpu_vmsize_strings.txt)
        "Standard_ND96isr_H200_v5",
        "Standard_NV12_Promo",
        "Standard_NC8ads_L40S_v9",  # a size that does not exist yet: NC is NVIDIA's family
    ],
)
def test_nvidia_sizes_not_on_the_lists_count_by_their_family(size: str) -> None:
    assert has_nvidia_gpu(size)


@pytest.mark.parametrize("size", ["Standard_D4s_v5", "Standard_HB176rs_v4", "Standard_M8-2ms", ""])
def test_other_families_have_no_nvidia_gpu(size: str) -> None:
    assert not has_nvidia_gpu(size)
