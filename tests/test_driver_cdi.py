"""`nvidia-ctk cdi generate` failures: the one documented harmless case (issue 11 item 12).

MIG mode on with no MIG instances leaves the spec's devices empty and nvidia-ctk exits 1
("invalid device, empty device edits"; Azure/AgentBaker PR #8736 and #9150 tolerate it
on MIG nodes). The same message with MIG off hides GPUs from pods
(kaito-project/kaito#2326): 92. MIG modes are read from real `nvidia-smi -q -x` captures.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.install.cdi import MIG_NO_INSTANCES, mig_modes, tolerated_case
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, run_in_process
from tests.samples import sample

# the error as kaito-project/kaito#2326 quotes nvidia-ctk 1.19.1 failing on an AKS A100
CTK_EMPTY = (
    'time="2026-09-07T10:00:00Z" level=error msg="failed to generate CDI spec: '
    'invalid device, empty device edits"'
)
XML = "nvidia-smi/k8s-test-infra_hardware_xml"
A100 = f"{XML}/qx-a100.xml"


def test_mig_modes_from_real_captures() -> None:
    # read by hand: <mig_mode><current_mig>Disabled on each GPU; the L40S and T4 say N/A
    assert mig_modes(sample(A100)) == ["Disabled"]
    assert mig_modes(sample(f"{XML}/qx-h100.xml")) == ["Disabled"] * 8
    assert mig_modes(sample(f"{XML}/qx-gb300.xml")) == ["Disabled"] * 4
    assert mig_modes(sample(f"{XML}/qx-l40s.xml")) == ["N/A"]
    assert mig_modes(sample(f"{XML}/qx-t4.xml")) == ["N/A"]
    assert mig_modes("") == []


def test_only_mig_on_without_instances_is_tolerated() -> None:
    on = sample(A100).replace(
        "<current_mig>Disabled</current_mig>", "<current_mig>Enabled</current_mig>", 1
    )
    assert mig_modes(on)[0] == "Enabled"
    assert tolerated_case(CTK_EMPTY, mig_modes(on)) == MIG_NO_INSTANCES
    assert tolerated_case(CTK_EMPTY, mig_modes(sample(A100))) is None  # MIG off: real failure
    nvml = 'level=error msg="failed to generate CDI spec: failed to initialize NVML: ERROR_UNKNOWN"'
    assert tolerated_case(nvml, ["Enabled"]) is None
    assert tolerated_case(CTK_EMPTY, []) is None  # MIG mode unknown: not assumed


def _shims(w: World, mig: str) -> dict[str, str]:
    """nvidia-ctk whose `cdi generate` fails as above; nvidia-smi -q -x showing the first
    GPU's current MIG mode as ``mig``."""
    shim = w.base / "shim-cdi"
    shim.mkdir(exist_ok=True)
    real_ctk, real_smi = w.bin_dir / "nvidia-ctk", w.bin_dir / "nvidia-smi"
    scripts = {
        "nvidia-ctk": (
            "import os, sys\n"
            "if sys.argv[1:3] == ['cdi', 'generate']:\n"
            f"    print({CTK_EMPTY!r}, file=sys.stderr); sys.exit(1)\n"
            f"os.execv({str(real_ctk)!r}, [{str(real_ctk)!r}, *sys.argv[1:]])\n"
        ),
        "nvidia-smi": (
            "import re, subprocess, sys\n"
            f"r = subprocess.run([{str(real_smi)!r}, *sys.argv[1:]],\n"
            "                   capture_output=True, text=True)\n"
            "out = r.stdout\n"
            "if sys.argv[1:] == ['-q', '-x'] and r.returncode == 0:\n"
            "    out = re.sub('<current_mig>[^<]*</current_mig>',\n"
            f"                 '<current_mig>{mig}</current_mig>', out, count=1)\n"
            "sys.stdout.write(out); sys.stderr.write(r.stderr)\n"
            "sys.exit(r.returncode)\n"
        ),
    }
    for name, body in scripts.items():
        path = shim / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = w.env()
    env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    return env


@pytest.mark.parametrize("mig", ["Enabled", "Disabled"])
def test_cdi_failure_on_a_node(make_world: MakeWorld, mig: str) -> None:
    w = make_world("h100-pcie")
    env = _shims(w, mig)
    w.env = lambda: env  # type: ignore[method-assign]  # run_in_process reads w.env()
    result = run_in_process(w)
    assert result.journal is not None
    events = [json.loads(line) for line in Path(result.journal).read_text().splitlines()]
    tolerated = [e for e in events if e["event"] == "cdi.tolerated"]
    if mig == "Enabled":
        assert result.outcome.ok, result.outcome.message
        assert [(e["case"], e["rc"]) for e in tolerated] == [(MIG_NO_INSTANCES, 1)]
    else:
        assert (result.outcome.code, result.outcome.state) == (Code.CDI_REFRESH_FAILED, "join")
        assert "empty device edits" in result.outcome.message and tolerated == []
