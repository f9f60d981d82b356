"""GRID (vGPU) licences (issue 31 item 8).

AKS's GRID nodes came up "Unlicensed", CUDA reporting the device busy (Azure/AKS 4870,
4880; Azure/aks-gpu#90). On a GRID driver verify waits, bounded, for `nvidia-smi -q -x`
to show each GPU's licence acquired and ends 57 GRID_NOT_LICENSED when it is not.

The element's real form: NVML's own nvidia_smi.py (pynvml) writes
``<vgpu_software_licensed_product>`` after ``<gpu_virtualization_mode>`` with
``<licensed_product_name>`` and ``<license_status>``; a public 580.105.08 L40S-2Q
guest's `-q -x` shows ``Licensed (Expiry: 2026-7-7 16:1:44 GMT)``. ``Unlicensed`` is
the status NVIDIA/gpu-operator #220 quotes from a guest without a licence.
"""

from __future__ import annotations

import pytest

from bootfsm.core.codes import Code
from bootfsm.install.grid_license import problems
from bootfsm.parsers.nvidia_smi import licensed
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml
from tests.conftest import MakeWorld, run_in_process
from tests.samples import sample
from tests.test_kernel_patch import _events

L40S = "nvidia-smi/k8s-test-infra_hardware_xml/qx-l40s.xml"
BLOCK = """\
\t\t<vgpu_software_licensed_product>
\t\t\t<licensed_product_name>NVIDIA RTX Virtual Workstation</licensed_product_name>
\t\t\t<license_status>{}</license_status>
\t\t</vgpu_software_licensed_product>
"""


def _with_block(status: str) -> str:
    """The real L40S `-q -x` with a vGPU guest's licence element where NVML writes it:
    right after </gpu_virtualization_mode>."""
    text = sample(L40S)
    end = "\t\t</gpu_virtualization_mode>\n"
    assert text.count(end) == 1
    return text.replace(end, end + BLOCK.format(status))


@pytest.mark.parametrize(
    ("status", "ok"),
    [("Unlicensed", False), ("Licensed (Expiry: 2026-7-7 16:1:44 GMT)", True)],
)
def test_the_licence_element_is_read_from_a_real_report(status: str, ok: bool) -> None:
    report = parse_smi_xml(_with_block(status))
    [gpu] = report.gpus
    assert gpu.license_status == status
    assert licensed(gpu.license_status) is ok
    assert problems(report) == ([] if ok else [f"{gpu.bus_id}: {status}"])


def test_a_report_without_the_element_has_no_licence() -> None:
    report = parse_smi_xml(sample(L40S))  # a CUDA driver, passthrough: no element
    [gpu] = report.gpus
    assert gpu.license_status == "" and not licensed("")
    assert problems(report) == [f"{gpu.bus_id}: no vgpu_software_licensed_product element"]


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


def test_a_cuda_node_waits_for_no_licence(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    result = run_in_process(w)
    assert result.outcome.ok
    assert _events(result.journal, "grid.license_waiting") == []
    assert _events(result.journal, "grid.licensed") == []
