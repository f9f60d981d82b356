"""The parsers on a real H200 node's own output (tests/captures/h200_580.159.04, made by
tests/real_node/check.sh; its README says how). Expected values are read from the files
by hand: `nvidia-smi -q` line 26-27 and the XML's <gpu id=...>, the `-lgip` table, the
first line of /proc/driver/nvidia/version."""

from __future__ import annotations

import json
from pathlib import Path

from bootfsm.host.host import Host
from bootfsm.node.facts import gather_facts
from bootfsm.parsers.driver_info import parse_proc_driver_version
from bootfsm.parsers.nvidia_smi import classify_smi_failure
from bootfsm.parsers.nvidia_smi_mig import parse_lgip
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml
from tests.smi_text import parse_smi_query

CAPTURE = Path(__file__).resolve().parents[1] / "captures" / "h200_580.159.04"


def _read(name: str) -> str:
    return (CAPTURE / name).read_text()


def test_the_xml_and_the_text_report_say_the_same_of_the_one_h200() -> None:
    for report in (parse_smi_xml(_read("smi-qx.xml")), parse_smi_query(_read("smi-q.txt"))):
        assert (report.driver_version, report.cuda_version, report.attached_gpus) == (
            "580.159.04",
            "13.0",
            1,
        )
        [gpu] = report.gpus
        assert (gpu.bus_id, gpu.product_name, gpu.device_id) == (
            "00000000:00:06.0",
            "NVIDIA H200",
            0x2335,
        )
        # no NVSwitch in this VM: the fabric probe answers N/A, MIG is off and not pending
        assert (gpu.fabric_state, gpu.fabric_status, gpu.clique_id) == ("N/A", "N/A", "N/A")
        assert (gpu.mig_current, gpu.mig_pending) == ("Disabled", "Disabled")
        assert report.inforom_corrupted == ()


def test_a_healthy_nodes_plain_and_error_output_is_no_known_failure() -> None:
    for name in ("smi-plain.txt", "smi-q.txt", "smi-qx.xml"):
        assert classify_smi_failure(_read(name)) is None, name
    # an unknown option: exit 255 and one line that names it (exit-status.txt)
    assert "smi-bogus.txt 255" in _read("exit-status.txt").splitlines()
    assert _read("smi-bogus.txt").startswith(
        "ERROR: Option --no-such-option is not recognized. Please run 'nvidia-smi -h'."
    )


def test_the_h200_mig_profiles() -> None:
    rows = [
        (p.profile_id, p.name, p.free, p.total, p.memory_gib)
        for p in parse_lgip(_read("smi-mig-lgip.txt"))
    ]
    assert rows == [
        (19, "MIG 1g.18gb", 7, 7, 16.0),
        (20, "MIG 1g.18gb+me", 1, 1, 16.0),
        (15, "MIG 1g.35gb", 4, 4, 32.5),
        (14, "MIG 2g.35gb", 3, 3, 32.5),
        (9, "MIG 3g.71gb", 2, 2, 69.75),
        (5, "MIG 4g.71gb", 1, 1, 69.75),
        (0, "MIG 7g.141gb", 1, 1, 140.0),
    ]


def test_the_loaded_module_is_the_open_580() -> None:
    kernel = _read("kernel.txt")
    proc_version = kernel.split("== /proc/driver/nvidia/version\n", 1)[1].split("== ", 1)[0]
    info = parse_proc_driver_version(proc_version)
    assert (info.version, info.open_module) == ("580.159.04", True)


def test_detect_reads_the_real_nodes_facts(tmp_path: Path) -> None:
    """A node directory holding the real node's sysfs ids, os-release, kernel release and
    module version (kernel.txt, os-release.txt, uname.txt): detect's facts are what
    `plan` printed there (plan.json)."""
    kernel = _read("kernel.txt")
    pci = kernel.split("== PCI functions of vendor 0x10de\n", 1)[1].splitlines()[0]
    bdf, *pairs = pci.split()
    ids = dict(p.split("=", 1) for p in pairs)
    files = {
        f"sys/bus/pci/devices/{bdf}/vendor": ids["vendor"] + "\n",
        f"sys/bus/pci/devices/{bdf}/device": ids["device"] + "\n",
        f"sys/bus/pci/devices/{bdf}/class": ids["class"] + "\n",
        "sys/module/nvidia/version": kernel.split("== /sys/module/nvidia/version\n")[1].split(
            "== "
        )[0],
        "etc/os-release": _read("os-release.txt"),
        "proc/sys/kernel/arch": _read("uname.txt").split()[-2] + "\n",
        "proc/sys/kernel/osrelease": _read("uname.txt").split()[2] + "\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    facts = gather_facts(Host(tmp_path)).summary()
    seen = json.loads(_read("plan.json"))["facts"]
    assert {k: facts[k] for k in seen} == seen  # the capture predates the no_gpu fact
    assert facts["no_gpu"] is None
    assert (facts["gpu_count"], facts["gpu_model"], facts["loaded_driver"]) == (
        1,
        "H200 SXM",
        "580.159.04",
    )
