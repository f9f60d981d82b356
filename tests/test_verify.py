"""The verify state on real `nvidia-smi -q -x` captures, through a real Host.

A stand-in `nvidia-smi` on PATH prints, call after call, the outputs a test lines up
(real captures, or real captures with one value changed), so verify reads exactly what
a node would print, whole. The clock is fake: waits cost no time.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.archnames import normalize_arch
from bootfsm.core.codes import Code
from bootfsm.core.config import Config, VerifySpec
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.hardware import model_for
from bootfsm.host.host import Host
from bootfsm.machine.context import Context
from bootfsm.node.facts import NodeFacts, PciGpu
from bootfsm.observe.journal import Journal
from bootfsm.parsers.nvidia_smi import wrong_module_type
from bootfsm.states import verify
from tests.samples import sample

XML = "nvidia-smi/k8s-test-infra_hardware_xml/"
OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.105.08  Release Build"
    "  (dvs-builder@U22-I3-AF03-09-1)  Thu Oct  2 18:16:26 UTC 2025\n"
)
PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.105.08  Thu Oct  2 2025\n"

# refuses anything but -q -x as the real 580.159.04 refuses an unknown option with its
# driver loaded (tests/captures/h200_580.159.04/smi-bogus.txt: the line, a blank line, 255)
FAKE_SMI = """\
import os, pathlib, sys
d = pathlib.Path(os.environ["FAKE_SMI_DIR"])
if sys.argv[1:] != ["-q", "-x"]:
    print(f"ERROR: Option {sys.argv[1]} is not recognized. Please run 'nvidia-smi -h'.\\n")
    sys.exit(255)
calls = d / "calls"
n = int(calls.read_text()) if calls.exists() else 0
calls.write_text(str(n + 1))
outs = sorted(d.glob("out-*.txt"))
out = outs[min(n, len(outs) - 1)]
sys.stdout.buffer.write(out.read_bytes())
rc = out.with_suffix(".rc")
sys.exit(int(rc.read_text()) if rc.exists() else 0)
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# The fabric manager's unit, enabled and active: `systemctl show -p UnitFileState -p
# ActiveState UNIT` prints the properties in systemd's own order (ActiveState first),
# `systemctl is-active UNIT` the state alone (systemctl(1)); nothing else is asked here.
FAKE_SYSTEMCTL = """import sys
args = sys.argv[1:]
if args[:1] == ["show"]:
    print("ActiveState=active")
    print("UnitFileState=enabled")
elif args[:1] == ["is-active"]:
    print("active")
else:
    sys.exit("systemctl stand-in of test_verify: only show and is-active")
"""


class Node:
    """A node directory with stand-in nvidia-smi and systemctl, and a Context on it."""

    def __init__(self, tmp_path: Path, arch: str, device_id: int, n: int, switches: int = 0):
        self.root = tmp_path / "root"
        self.bin = tmp_path / "bin"
        self.smi = tmp_path / "smi"
        for d in (self.root, self.bin, self.smi):
            d.mkdir()
        self._script("nvidia-smi", FAKE_SMI)
        self._script("systemctl", FAKE_SYSTEMCTL)
        self.clock = Clock()
        self.host = Host(
            self.root,
            env={"PATH": str(self.bin), "FAKE_SMI_DIR": str(self.smi)},
            monotonic=self.clock.monotonic,
            sleep=self.clock.sleep,
        )
        self.journal_path = tmp_path / "journal.jsonl"
        cfg = replace(Config(), verify=VerifySpec(fabric_timeout=60.0, fabric_poll_interval=5.0))
        self.ctx = Context.create(cfg, self.host, Journal(self.journal_path, run_id="t"))
        self.ctx.state = "verify"
        self.ctx.facts_ = NodeFacts(
            raw_arch=arch,
            arch=normalize_arch(arch),
            os_id="ubuntu",
            os_version="24.04",
            kernel="6.8.0-1025-azure",
            gpus=tuple(
                PciGpu(f"{i + 1:04x}:00:00.0", device_id, model_for(device_id)) for i in range(n)
            ),
            nvswitches=tuple(f"{0x100 + i:04x}:00:00.0" for i in range(switches)),
            nvlink5=False,
            loaded_driver=None,
        )

    def _script(self, name: str, body: str) -> None:
        p = self.bin / name
        p.write_text(f"#!{sys.executable}\n{body}\n")
        p.chmod(0o755)

    def outputs(self, *texts: str, rc: int = 0) -> None:
        for i, text in enumerate(texts):
            (self.smi / f"out-{i:02d}.txt").write_text(text)
            if rc:
                (self.smi / f"out-{i:02d}.rc").write_text(str(rc))

    @property
    def calls(self) -> int:
        p = self.smi / "calls"
        return int(p.read_text()) if p.exists() else 0

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = self.journal_path.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e.get("event") == name]


def test_gb300_capture_passes_and_journals_clique_and_cluster_per_gpu(tmp_path: Path) -> None:
    node = Node(tmp_path, "aarch64", 0x31C2, 4)
    node.outputs(sample(XML + "qx-gb300.xml"))
    assert verify.satisfied(node.ctx)
    verify.run(node.ctx)
    (event,) = node.events("fabric.gpus")
    assert [(g["bus_id"], g["clique_id"], g["cluster_uuid"]) for g in event["gpus"]] == [
        (bus, "32766", "00000001-0000-0000-0000-000000000001")
        for bus in ("00000008:06:00.0", "00000009:06:00.0", "00000018:06:00.0", "00000019:06:00.0")
    ]
    assert node.events("warning") == [] and node.events("fabric.waiting") == []


def test_full_size_8x_b200_capture(tmp_path: Path) -> None:
    text = sample(XML + "qx-b200.xml")
    assert len(text) > 350_000  # far beyond any tail
    node = Node(tmp_path, "x86_64", 0x2901, 8)
    node.outputs(text)
    verify.run(node.ctx)
    assert node.calls == 1


def test_zero_clique_on_grace_blackwell_is_warned(tmp_path: Path) -> None:
    text = sample(XML + "qx-gb200.xml").replace("<cliqueId>2<", "<cliqueId>0<")
    text = text.replace(
        "00000001-0000-0000-0000-000000000001", "0" * 8 + "-0000" * 3 + "-" + "0" * 12
    )
    node = Node(tmp_path, "aarch64", 0x2941, 4)
    node.outputs(text)
    verify.run(node.ctx)
    warnings = node.events("warning")
    assert len(warnings) == 4 and "CliqueId 0" in warnings[0]["message"]


def test_in_progress_waits_then_passes(tmp_path: Path) -> None:
    done = sample(XML + "qx-h100.xml")
    node = Node(tmp_path, "x86_64", 0x2330, 8, switches=4)
    waiting_all = done.replace("<state>Completed<", "<state>In Progress<")
    node.outputs(
        waiting_all, waiting_all, done.replace("<state>Completed<", "<state>In Progress<", 3), done
    )
    assert not verify.satisfied(node.ctx)
    verify.run(node.ctx)
    (waiting,) = node.events("fabric.waiting")
    assert waiting["fabric"] == {"In Progress/Success": 8} and waiting["verdict"] == "waiting"
    assert node.events("fabric.ready") and node.calls == 4  # satisfied, run, 2 polls
    assert node.clock.now - 1000.0 == 5.0  # the first poll is at once, the second 5 s later


def test_in_progress_forever_on_a_lone_vm_gpu_times_out(tmp_path: Path) -> None:
    # [G]: one H100 SXM in a VM, no NVSwitch: no guard sends it to fabric, verify still waits.
    text = sample(XML + "qx-h100.xml")
    first = text.index('\t<gpu id="00000000:64:00.0">')
    one = text[:first].replace("<attached_gpus>8<", "<attached_gpus>1<") + "</nvidia_smi_log>\n"
    node = Node(tmp_path, "x86_64", 0x2330, 1)
    node.outputs(one.replace("<state>Completed</state>\n\t\t\t<status>Success<",
                             "<state>In Progress</state>\n\t\t\t<status>N/A<"))  # fmt: skip
    with pytest.raises(BootError) as err:
        verify.run(node.ctx)
    assert err.value.code is Code.FABRIC_NOT_READY
    assert "00000000:53:00.0: In Progress/N/A" in err.value.message
    assert node.clock.now - 1000.0 >= 60.0


def test_completed_with_another_status_is_final(tmp_path: Path) -> None:
    text = sample(XML + "qx-h100.xml").replace(
        "<status>Success</status>", "<status>Insufficient Resources</status>", 1
    )
    node = Node(tmp_path, "x86_64", 0x2330, 8, switches=4)
    node.outputs(text)
    with pytest.raises(BootError) as err:
        verify.run(node.ctx)
    assert err.value.code is Code.FABRIC_STATUS_FAILED
    assert "00000000:53:00.0: Completed with Status Insufficient Resources" in err.value.message
    assert node.calls == 1 and node.clock.now == 1000.0  # no polling


def test_status_failure_while_waiting_ends_the_wait(tmp_path: Path) -> None:
    text = sample(XML + "qx-h100.xml")
    node = Node(tmp_path, "x86_64", 0x2330, 8, switches=4)
    node.outputs(text.replace("<state>Completed<", "<state>In Progress<"),
                 text.replace("<status>Success<", "<status>Failure<"))  # fmt: skip
    with pytest.raises(BootError) as err:
        verify.run(node.ctx)
    assert err.value.code is Code.FABRIC_STATUS_FAILED and node.calls == 2


def test_unhealthy_gb200_is_not_ready(tmp_path: Path) -> None:
    text = sample(XML + "qx-gb200.xml").replace(
        "<summary>Healthy</summary>", "<summary>Unhealthy</summary>", 1
    )
    node = Node(tmp_path, "aarch64", 0x2941, 4)
    node.outputs(text)
    assert not verify.satisfied(node.ctx)
    with pytest.raises(BootError) as err:
        verify.run(node.ctx)
    assert err.value.code is Code.FABRIC_UNHEALTHY
    assert "00000000:29:00.0: Health Summary Unhealthy" in err.value.message


def test_ampere_with_nvswitch_does_not_wait(tmp_path: Path) -> None:
    # A100 reports Fabric N/A even with NVSwitch and fabric manager (p4d, ND96asr_v4).
    node = Node(tmp_path, "x86_64", 0x20B0, 1, switches=6)
    node.outputs(sample(XML + "qx-a100.xml"))
    verify.run(node.ctx)
    assert node.events("fabric.waiting") == [] and node.calls == 1


def test_gpu_count_mismatch(tmp_path: Path) -> None:
    node = Node(tmp_path, "aarch64", 0x31C2, 5)
    node.outputs(sample(XML + "qx-gb300.xml"))
    with pytest.raises(BootError) as err:
        verify.run(node.ctx)
    assert err.value.code is Code.GPU_COUNT_MISMATCH


@pytest.mark.parametrize(
    ("device", "proc", "wrong"),
    [(0x2901, PROPRIETARY, True), (0x2901, OPEN, False), (0x2330, PROPRIETARY, False),
     (0x3182, PROPRIETARY, True), (0x2909, PROPRIETARY, True)],
)  # fmt: skip
def test_no_devices_found(tmp_path: Path, device: int, proc: str, wrong: bool) -> None:
    node = Node(tmp_path, "x86_64", device, 8)
    (node.root / "proc/driver/nvidia").mkdir(parents=True)
    (node.root / "proc/driver/nvidia/version").write_text(proc)
    node.outputs("No devices were found\n", rc=6)
    if wrong:
        with pytest.raises(BootError) as err:
            verify.run(node.ctx)
        assert err.value.code is Code.WRONG_MODULE_TYPE
        assert "proprietary nvidia module 580.105.08" in err.value.message
        assert f"({device:#06x}) needs the open kernel modules" in err.value.message
    else:
        with pytest.raises(TransientError) as terr:
            verify.run(node.ctx)
        assert terr.value.code is Code.DRIVER_NOT_STARTED


def test_wrong_module_type_is_pure() -> None:
    assert wrong_module_type("No devices were found\n", [0x2941], PROPRIETARY)
    assert wrong_module_type("No devices were found\n", [0x2941], OPEN) is None
    assert wrong_module_type("No devices were found\n", [0x2941], "garbage") is None
    assert wrong_module_type("some other failure", [0x2941], PROPRIETARY) is None
    assert wrong_module_type("No devices were found\n", [0x2342, 0x20B0], PROPRIETARY) is None


def test_garbled_output_is_transient(tmp_path: Path) -> None:
    node = Node(tmp_path, "aarch64", 0x31C2, 4)
    text = sample(XML + "qx-gb300.xml")
    node.outputs(text[: len(text) // 3])
    with pytest.raises(TransientError) as err:
        verify.run(node.ctx)
    assert err.value.code is Code.DRIVER_NOT_STARTED
    assert "unreadable" in err.value.message


def test_a_real_h200_nodes_own_report_passes(tmp_path: Path) -> None:
    """tests/captures/h200_580.159.04: one H200 SXM in a VM without NVSwitch (fabric N/A),
    its `nvidia-smi -q -x` as it printed it there: nothing to wait for, nothing warned."""
    capture = Path(__file__).resolve().parent / "captures/h200_580.159.04/smi-qx.xml"
    node = Node(tmp_path, "x86_64", 0x2335, 1)
    node.outputs(capture.read_text())
    assert verify.satisfied(node.ctx)
    verify.run(node.ctx)
    assert node.events("warning") == [] and node.events("fabric.waiting") == []
    assert node.calls == 2
