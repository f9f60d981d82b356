"""GRID (vGPU) licences (issue 31 item 8).

AKS's GRID nodes came up "Unlicensed", CUDA reporting the device busy (Azure/AKS 4870,
4880; Azure/aks-gpu#90). On a GRID driver verify waits, bounded, for `nvidia-smi -q` to
show each GPU's licence acquired and ends 57 GRID_NOT_LICENSED when it is not.

The block's real wording: NVIDIA/gpu-operator #220 (a vGPU guest's `nvidia-smi -q`,
quoted by the reporter) for an unlicensed guest, and NVIDIA's vGPU licensing guides
("when licensed, an expiration date appears in the license status") for a licensed one.
"""

from __future__ import annotations

import pytest

from bootfsm.core.codes import Code
from bootfsm.parsers.nvidia_smi import licensed, parse_smi_query
from tests.conftest import MakeWorld, run_in_process
from tests.samples import sample
from tests.test_kernel_patch import _events

# NVIDIA/gpu-operator #220 (snelis, 2021-07-06), verbatim
UNLICENSED_220 = """\
    vGPU Software Licensed Product
        Product Name                      : NVIDIA Virtual Compute Server
        License Status                    : Unlicensed
"""
# the licensed form in public vGPU guides (e.g. a GPU Operator vGPU guide's V100D-8C guest)
LICENSED = """\
    vGPU Software Licensed Product
        Product Name                      : NVIDIA Virtual Compute Server
        License Status                    : Licensed (Expiry: 2025-3-19 7:29:4 GMT)
"""
A10_Q = "nvidia-smi/q_1xA10_535.129.03_gpud.txt"


def _with_block(block: str) -> str:
    """The real A10 `-q` with a vGPU guest's licence block where guests print it: after
    the GPU Virtualization Mode section (before GPU Reset Status)."""
    text = sample(A10_Q)
    assert text.count("    GPU Reset Status\n") == 1
    return text.replace("    GPU Reset Status\n", block + "    GPU Reset Status\n")


@pytest.mark.parametrize(
    ("block", "status", "ok"),
    [(UNLICENSED_220, "Unlicensed", False), (LICENSED, "Licensed (Expiry: 2025-3-19 7:29:4 GMT)",
                                               True)],
)  # fmt: skip
def test_the_licence_block_is_read_from_a_real_report(block: str, status: str, ok: bool) -> None:
    [gpu] = parse_smi_query(_with_block(block)).gpus
    assert gpu.license_status == status
    assert licensed(gpu.license_status) is ok


def test_a_report_without_the_block_has_no_licence() -> None:
    [gpu] = parse_smi_query(sample(A10_Q)).gpus  # a CUDA driver, passthrough: no block
    assert gpu.license_status == "" and not licensed("")


@pytest.mark.parametrize(
    "status", ["Unlicensed", "Unlicensed (Unrestricted)", "Unlicensed (Restricted)", "Licensed!"]
)
def test_only_licensed_is_licensed(status: str) -> None:
    assert not licensed(status)
    assert licensed("Licensed")


def test_a_grid_node_waits_for_its_licence(make_world: MakeWorld) -> None:
    w = make_world(
        "a10-nvads",
        driver_kind="grid",
        config_overrides={"verify": {"license_poll_interval": 0.05}},
    )
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [waiting] = _events(result.journal, "grid.license_waiting")
    assert waiting["gpus"] == ["00000001:00:00.0: Unlicensed (Unrestricted)"]
    assert len(_events(result.journal, "grid.licensed")) == 1
    again = run_in_process(w)  # a rerun: licensed, verify satisfied
    assert "verify" in {e["state"] for e in _events(again.journal, "state.skip")}


def test_a_licence_never_acquired_ends_57_in_verify(make_world: MakeWorld) -> None:
    w = make_world(
        "a10-nvads",
        ("grid-unlicensed",),
        driver_kind="grid",
        config_overrides={"verify": {"license_timeout": 0.5, "license_poll_interval": 0.05}},
    )
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.GRID_NOT_LICENSED, "verify")
    assert "verify.license_timeout = 0.5 s" in result.outcome.message
    assert "Unlicensed (Unrestricted)" in result.outcome.message


def test_a_cuda_node_asks_no_licence(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok
    assert [c for c in w.calls() if c["cmd"] == "nvidia-smi" and c["argv"] == ["-q"]] == []
