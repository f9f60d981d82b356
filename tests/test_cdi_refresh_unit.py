"""The toolkit's CDI refresh unit and `nvidia-ctk cdi generate` are judged alike
(issue 31 item 9).

Toolkit 1.18+ ships nvidia-cdi-refresh.service (NVIDIA/nvidia-container-toolkit
deployments/systemd: Type=oneshot, ``ExecStart=/usr/bin/nvidia-ctk cdi generate``). With
MIG mode on and no MIG instances yet, that command fails "invalid device, empty device
edits" (kaito-project/kaito#2326) on either path; AgentBaker tolerates it (PR #8736 on
the generate path, a drop-in ``SuccessExitStatus=1 2 127`` on the unit, PR #9150).
bootfsm tolerates exactly that case on both paths: on the unit path it reads what the
failed run printed from the journal of the unit's invocation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.install.cdi import MIG_NO_INSTANCES
from bootfsm.sim.nodestate import Node
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, run_in_process
from tests.samples import on_ci

# NVIDIA/nvidia-container-toolkit deployments/systemd/nvidia-cdi-refresh.service (its
# [Unit], [Service] and [Install] keys; the licence header left out)
REFRESH_UNIT = """\
[Unit]
Description=Refresh NVIDIA CDI specification file
ConditionPathExists=|/usr/bin/nvidia-smi
ConditionPathExists=|/usr/sbin/nvidia-smi
ConditionPathExists=/usr/bin/nvidia-ctk
After=multi-user.target

[Service]
Type=oneshot
Environment=NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml
EnvironmentFile=-/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env
ExecCondition=/usr/bin/grep -qE '/(nvidia|nvidia-current)\\\\.ko' /lib/modules/%v/modules.dep
ExecStart=/usr/bin/nvidia-ctk cdi generate
CapabilityBoundingSet=CAP_SYS_MODULE CAP_SYS_ADMIN CAP_MKNOD
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""


def _events(journal: str | Path | None, name: str) -> list[dict[str, Any]]:
    assert journal is not None
    lines = Path(journal).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _mig_on_without_instances(w: World) -> None:
    node = Node(w.root)
    for address, _device in node.gpus():
        node.set_mig_mode(address, True, True)  # enabled and current (after its reset)


def _with_unit(w: World) -> None:
    (w.root / "lib/systemd/system/nvidia-cdi-refresh.service").write_text(REFRESH_UNIT)


@pytest.mark.parametrize("path", ["unit", "nvidia-ctk"])
def test_mig_on_without_instances_is_tolerated_on_both_paths(
    make_world: MakeWorld, path: str
) -> None:
    w = make_world("h100-pcie")
    if path == "unit":
        _with_unit(w)
    _mig_on_without_instances(w)
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [tolerated] = _events(result.journal, "cdi.tolerated")
    assert (tolerated["case"], tolerated["rc"]) == (MIG_NO_INSTANCES, 1)
    assert "invalid device, empty device edits" in tolerated["output"]
    assert tolerated["via"] == ("systemctl" if path == "unit" else "nvidia-ctk")
    if path == "unit":
        asked = [c["argv"] for c in w.calls() if c["cmd"] == "journalctl"]
        assert len(asked) == 1 and asked[0][0].startswith("_SYSTEMD_INVOCATION_ID=")


def test_the_same_unit_failure_with_mig_off_is_92(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("cdi-fails",))  # NVML ERROR_UNKNOWN, MIG off
    _with_unit(w)
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.CDI_REFRESH_FAILED, "join")
    assert "failed to initialize NVML" in result.outcome.message
    assert _events(result.journal, "cdi.tolerated") == []


def _journalctl() -> str:
    found = shutil.which("journalctl")
    if found is None:
        if on_ci():
            pytest.fail("journalctl (systemd) is not installed", pytrace=False)
        pytest.skip("journalctl (systemd) is not installed")
    return found


@pytest.mark.parametrize("argv", [["--bogus"], ["foo", "-o", "cat", "--no-pager"]])
def test_the_journalctl_stand_in_refuses_what_journalctl_refuses(
    make_world: MakeWorld, argv: list[str]
) -> None:
    real = subprocess.run(
        [_journalctl(), *argv], capture_output=True, text=True, timeout=30, check=False
    )
    w = make_world("h100-pcie")
    env = {**os.environ, "PATH": f"{w.bin_dir}{os.pathsep}{os.environ['PATH']}"}
    sim = subprocess.run(
        ["journalctl", *argv], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    # getopt names the program as invoked: the real one by its path, the stand-in by its own
    real_err = real.stderr.replace(_journalctl(), "journalctl")
    sim_err = sim.stderr.replace(str(w.bin_dir / "journalctl"), "journalctl")
    assert (sim.returncode, sim.stdout, sim_err) == (real.returncode, real.stdout, real_err)
