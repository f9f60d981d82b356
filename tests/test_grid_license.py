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

from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.config import parse_config
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host
from bootfsm.install.grid_license import no_vgpu, problems, wait_licensed
from bootfsm.machine.context import Context
from bootfsm.observe.journal import Journal
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
    assert no_vgpu(report) == []  # the element is there: a vGPU guest


# every real `-q -x` capture: (file, GPUs, virtualization mode), read from each file; none
# has a vgpu_software_licensed_product element (bare metal or whole-GPU passthrough)
CAPTURES = [
    ("nvidia-smi/k8s-test-infra_hardware_xml/qx-a100.xml", 1, "Pass-Through"),
    ("nvidia-smi/k8s-test-infra_hardware_xml/qx-b200.xml", 8, "Pass-Through"),
    ("nvidia-smi/k8s-test-infra_hardware_xml/qx-gb200.xml", 4, "Pass-Through"),
    ("nvidia-smi/k8s-test-infra_hardware_xml/qx-gb300.xml", 4, "None"),
    ("nvidia-smi/k8s-test-infra_hardware_xml/qx-h100.xml", 8, "Pass-Through"),
    (L40S, 1, "Pass-Through"),
    ("nvidia-smi/k8s-test-infra_hardware_xml/qx-t4.xml", 1, "Pass-Through"),
    ("tests/captures/h200_580.159.04/smi-qx.xml", 1, "Pass-Through"),
]


def _capture(name: str) -> str:
    if name.startswith("tests/"):
        return (Path(__file__).parents[1] / name).read_text()
    return sample(name)


@pytest.mark.parametrize(("name", "count", "mode"), CAPTURES, ids=[c[0] for c in CAPTURES])
def test_a_report_without_the_element_is_no_vgpu_guest(name: str, count: int, mode: str) -> None:
    """No element: not a vGPU guest, no licence will ever come, nothing to wait for."""
    report = parse_smi_xml(_capture(name))
    assert len(report.gpus) == count
    assert all(g.license_status is None for g in report.gpus)
    assert problems(report) == []
    assert no_vgpu(report) == [f"{g.bus_id}: virtualization mode {mode}" for g in report.gpus]


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


def test_a_grid_driver_on_a_passthrough_gpu_waits_for_no_licence(make_world: MakeWorld) -> None:
    """GRID on a GPU passed through whole: the report has no licence element, so verify
    journals that and goes on; it does not wait out verify.license_timeout for a licence
    nvidia-smi will never report (once 300 s of the run's deadline, and 57 at its end)."""
    w = make_world(
        "a10-nvads",
        ("grid-passthrough",),
        driver_kind="grid",
        config_overrides={"verify": {"license_timeout": 2, "license_poll_interval": 0.05}},
    )
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [skip] = [e for e in _events(result.journal, "state.skip") if e["state"] == "verify"]
    assert skip["reason"] == (
        "GRID driver, no vGPU licence element (00000001:00:00.0: virtualization mode "
        "Pass-Through): none to wait for"
    )
    assert _events(result.journal, "grid.license_waiting") == []


class _Clock:
    """A monotonic clock that sleeping advances: the wait's bound without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _node_with_smi(tmp_path: Path, report: str) -> tuple[Host, _Clock]:
    """A node whose nvidia-smi prints ``report`` for ``-q -x``: a stand-in for NVIDIA's
    nvidia-smi that prints a real capture (the L40S `-q -x` of k8s-test-infra) as is."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "report.xml").write_text(report)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n# nvidia-smi -q -x: a real capture, printed whole\n"
        f'[ "$*" = "-q -x" ] || exit 2\nexec /bin/cat {tmp_path / "report.xml"}\n'
    )
    smi.chmod(0o755)
    clock = _Clock()
    host = Host(tmp_path, env={"PATH": str(bin_dir)}, monotonic=clock, sleep=clock.sleep)
    return host, clock


def test_an_unlicensed_vgpu_waits_bounded_by_the_runs_deadline(tmp_path: Path) -> None:
    """A vGPU guest's element says Unlicensed and stays so; the run (CSE's budget under the
    hook) has 40 s left and verify.license_timeout is 300: the wait asks nvidia-smi again
    and again, then ends GRID_NOT_LICENSED within the 40 s, saying which bound it hit."""
    host, clock = _node_with_smi(tmp_path, _with_block("Unlicensed (Unrestricted)"))
    cfg = parse_config({"driver": {"kind": "grid"}, "verify": {"license_poll_interval": 5}})
    ctx = Context.create(cfg, host, Journal(None, run_id="t"), deadline_s=40)
    start = clock.now
    with pytest.raises(BootError) as err:
        wait_licensed(ctx, parse_smi_xml(_with_block("Unlicensed (Unrestricted)")))
    assert err.value.code is Code.GRID_NOT_LICENSED
    assert "within the 35 s left of the run's deadline (40 s)" in err.value.message
    assert "00000000:30:00.0: Unlicensed (Unrestricted)" in err.value.message
    assert clock.now - start <= 40
    assert clock.now - start >= 35  # it did wait, polling


def test_a_passthrough_report_asks_nothing_and_takes_no_time(tmp_path: Path) -> None:
    """The real L40S report as is (no element) under a GRID config: no query, no sleep."""
    host, clock = _node_with_smi(tmp_path, "not a report")
    cfg = parse_config({"driver": {"kind": "grid"}})
    ctx = Context.create(cfg, host, Journal(None, run_id="t"), deadline_s=600)
    start = clock.now
    wait_licensed(ctx, parse_smi_xml(sample(L40S)))
    assert clock.now == start
