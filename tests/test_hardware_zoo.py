"""The hardware zoo: the whole decision over every real capture, one row per sample.

For each capture: the node facts such a node shows on PCI (arch, the GPUs' device ids
as the capture reports them, NVSwitches, NVLink5 switch management), which guard the
table takes after the driver (fabric manager / IMEX / none), and what verify makes of
the GPUs' Fabric blocks. Every expected value is written by hand from the sample (and,
for the NVSwitch count, from what that node model has), never from the code's output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from bootfsm.core.archnames import normalize_arch
from bootfsm.core.hardware import model_for
from bootfsm.node.fabric import FabricVerdict, judge_fabric
from bootfsm.node.facts import NodeFacts, PciGpu
from bootfsm.node.guards import GUARDS
from bootfsm.parsers.nvidia_smi import SmiReport
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml
from tests.samples import sample
from tests.smi_excerpts import parse_fabric_block
from tests.smi_text import parse_smi_query

SMI = "nvidia-smi/"
XML = SMI + "k8s-test-infra_hardware_xml/"
EXCERPTS = SMI + "fabric_state_excerpts.txt"

NONE, READY, WAITING = FabricVerdict.NONE, FabricVerdict.READY, FabricVerdict.WAITING
UNHEALTHY, FAILED = FabricVerdict.UNHEALTHY, FabricVerdict.FAILED
FM, IMEX, NO_FABRIC = "needs_fabric_manager", "needs_imex", "no_nvlink_fabric"


@dataclass(frozen=True)
class Row:
    """One real capture and its expected verdict."""

    label: str
    source: str  # a sample path, or "excerpt:<tag>:<device id>" for a Fabric block
    arch: str
    gpus: int  # GPU count the capture reports
    device_id: int  # as the capture reports it (Device Id / pci_device_id)
    nvswitches: int  # NVSwitch functions such a node shows on PCI
    nvlink5: bool
    guard: str
    verdict: FabricVerdict
    warnings: int = 0


ROWS = [
    # Ampere: the fabric probe is Hopper and newer; N/A (or no block at all) with NVSwitch.
    Row("A100 HGX ND96asr_v4 (460, no Fabric block, 6 NVSwitch)",
        SMI + "azhpc-diagnostics/q_8xA100-SXM4-40GB_ndv4_460.32.03.txt",
        "x86_64", 8, 0x20B0, 6, False, FM, NONE),
    Row("A100 HGX p4d ([I]: N/A with fabric manager) as the 4x A100 SXM4 capture",
        SMI + "thamada/A100SXMx4_gls_q.txt", "x86_64", 4, 0x20B2, 6, False, FM, NONE),
    Row("A100 SXM4 1x VM (-q -x 570)", XML + "qx-a100.xml", "x86_64", 1, 0x20B0, 0, False,
        NO_FABRIC, NONE),
    Row("H100 HGX 535.161", SMI + "q_8xH100-HBM3_hgx_535.161.08_gpud.txt",
        "x86_64", 8, 0x2330, 4, False, FM, READY),
    Row("H100 HGX 535.183", SMI + "q_8xH100-HBM3_hgx_535.183.01_gpud.txt",
        "x86_64", 8, 0x2330, 4, False, FM, READY),
    Row("H100 HGX 565 (clique 0, zero UUID: not Grace, no warning)",
        SMI + "thamada/H100SXMx8_nvidia-smi-repo_q.txt", "x86_64", 8, 0x2330, 4, False, FM,
        READY),
    Row("H100 HGX 580 (-q -x)", XML + "qx-h100.xml", "x86_64", 8, 0x2330, 4, False, FM, READY),
    Row("H100 NVL x2 (no NVSwitch, Fabric N/A)", SMI + "thamada/H100NVLx2_gls_q.txt",
        "x86_64", 2, 0x2321, 0, False, NO_FABRIC, NONE),
    Row("H200 1x VM (Completed/Success without NVSwitch in the guest)",
        SMI + "thamada/H200x1_gls_q.txt", "x86_64", 1, 0x2335, 0, False, NO_FABRIC, READY),
    Row("GH200 standalone (Grace Hopper: no IMEX, Fabric N/A)", SMI + "thamada/GH200x1_gls_q.txt",
        "aarch64", 1, 0x2342, 0, False, NO_FABRIC, NONE),
    Row("B200 HGX (NVLink5 switch management)", XML + "qx-b200.xml", "x86_64", 8, 0x2901, 0,
        True, FM, READY),
    Row("GB200 tray (clique 2)", XML + "qx-gb200.xml", "aarch64", 4, 0x2941, 0, False, IMEX,
        READY),
    Row("GB300 tray (clique 32766)", XML + "qx-gb300.xml", "aarch64", 4, 0x31C2, 0, False, IMEX,
        READY),
    Row("L40S", XML + "qx-l40s.xml", "x86_64", 1, 0x26B9, 0, False, NO_FABRIC, NONE),
    Row("T4", XML + "qx-t4.xml", "x86_64", 1, 0x1EB8, 0, False, NO_FABRIC, NONE),
    Row("A10", SMI + "q_1xA10_535.129.03_gpud.txt", "x86_64", 1, 0x2236, 0, False, NO_FABRIC,
        NONE),
    Row("RTX 5090 (Blackwell, Fabric N/A)", SMI + "thamada/RTX5090x1_gls_q.txt", "x86_64", 1,
        0x2B85, 0, False, NO_FABRIC, NONE),
    Row("TITAN V", SMI + "q_1xTITANV_560.35.03_gpud.txt", "x86_64", 1, 0x1D81, 0, False,
        NO_FABRIC, NONE),
    # Fabric excerpts: one pasted block each, on the node the excerpt names.
    Row("[A] p5 H100 before fabric manager: In Progress", "excerpt:A:0x2330", "x86_64", 1,
        0x2330, 4, False, FM, WAITING),
    Row("[B] p5 H100 after fabric manager: Completed", "excerpt:B:0x2330", "x86_64", 1, 0x2330,
        4, False, FM, READY),
    Row("[D] GB200 Completed/Success, Health Unhealthy", "excerpt:D:0x2941", "aarch64", 1,
        0x2941, 0, False, IMEX, UNHEALTHY),
    Row("[E] Azure ND Completed / Insufficient Resources", "excerpt:E:0x2330", "x86_64", 1,
        0x2330, 4, False, FM, FAILED),
    Row("[G] H100 SXM alone in a VM: In Progress, no NVSwitch", "excerpt:G:0x2330", "x86_64",
        1, 0x2330, 0, False, NO_FABRIC, WAITING),
    Row("[H] B300 alone in a VM: In Progress", "excerpt:H:0x3182", "x86_64", 1, 0x3182, 0,
        False, NO_FABRIC, WAITING),
    Row("[C] GB300 NVL72 tray without its domain: In Progress", "excerpt:C:0x31C2", "aarch64",
        1, 0x31C2, 0, False, IMEX, WAITING),
]  # fmt: skip


def _excerpt_block(tag: str) -> str:
    text = sample(EXCERPTS)
    start = text.index(f"# --- [{tag}]")
    end = text.find("# --- [", start + 1)
    block = text[start : end if end != -1 else len(text)]
    return "\n".join(ln for ln in block.splitlines() if not ln.startswith(("#", "$", "--")))


def _report(row: Row) -> SmiReport:
    if row.source.startswith("excerpt:"):
        _, tag, device = row.source.split(":")
        gpu = replace(parse_fabric_block(_excerpt_block(tag)), device_id=int(device, 16))
        return SmiReport("", "", 1, (gpu,), ())
    text = sample(row.source)
    return parse_smi_xml(text) if row.source.endswith(".xml") else parse_smi_query(text)


def _facts(row: Row, report: SmiReport) -> NodeFacts:
    gpus = tuple(
        PciGpu(f"{i:04x}:00:00.0", g.device_id, model_for(g.device_id))
        for i, g in enumerate(report.gpus)
    )
    return NodeFacts(
        raw_arch=row.arch,
        arch=normalize_arch(row.arch),
        os_id="ubuntu",
        os_version="22.04",
        kernel="6.8.0-1025-azure",
        gpus=gpus,
        nvswitches=tuple(f"{0x100 + i:04x}:00:00.0" for i in range(row.nvswitches)),
        nvlink5=row.nvlink5,
        loaded_driver=None,
    )


@pytest.mark.parametrize("row", ROWS, ids=[r.label for r in ROWS])
def test_zoo(row: Row) -> None:
    report = _report(row)
    assert len(report.gpus) == row.gpus
    assert {g.device_id for g in report.gpus} == {row.device_id}
    facts = _facts(row, report)
    taken = [
        name for name, guard in GUARDS.items() if guard(facts) and name in (FM, IMEX, NO_FABRIC)
    ]
    assert taken == [row.guard]
    judgement = judge_fabric(report)
    assert judgement.verdict is row.verdict, judgement
    assert len(judgement.warnings) == row.warnings


def test_zoo_covers_every_real_capture() -> None:
    from tests.samples import SAMPLES

    base = SAMPLES / "nvidia-smi"
    captures = {
        str(p.relative_to(SAMPLES))
        for p in [*base.rglob("*_q.txt"), *base.glob("q_*.txt"), *base.rglob("*.xml"),
                  *base.rglob("q_*.txt")]
        if "truncated_invalid" not in p.name
    }  # fmt: skip
    if not captures:
        pytest.skip("samples absent")
    assert captures <= {r.source for r in ROWS}
    tags = {r.source.split(":")[1] for r in ROWS if r.source.startswith("excerpt:")}
    assert tags == {"A", "B", "C", "D", "E", "G", "H"}  # [F] is NVML JSON, [I] prose (row 2)


def test_zero_clique_on_a_grace_blackwell_tray_is_a_warning() -> None:
    zero = "00000000-0000-0000-0000-000000000000"
    text = sample(XML + "qx-gb300.xml").replace("<cliqueId>32766<", "<cliqueId>0<")
    text = text.replace("00000001-0000-0000-0000-000000000001", zero)
    judgement = judge_fabric(parse_smi_xml(text))
    assert judgement.verdict is READY
    assert len(judgement.warnings) == 4
    assert "00000008:06:00.0: CliqueId 0 and an all-zero ClusterUUID" in judgement.warnings[0]
