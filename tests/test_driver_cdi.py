"""`nvidia-ctk cdi generate` failures: the one documented harmless case (issue 11 item 12).

MIG mode on with no MIG instances leaves the spec's devices empty and nvidia-ctk exits 1
("invalid device, empty device edits"; Azure/AgentBaker PR #8736 and #9150 tolerate it
on MIG nodes). The same message with MIG off hides GPUs from pods
(kaito-project/kaito#2326): 92. MIG modes are read from real `nvidia-smi -q` captures.
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
A100 = "nvidia-smi/thamada/A100SXMx4_gls_q.txt"


def test_mig_modes_from_real_captures() -> None:
    # read by hand: 4 GPUs, "MIG Mode / Current : Disabled" each; the A10 says N/A
    assert mig_modes(sample(A100)) == ["Disabled"] * 4
    assert mig_modes(sample("nvidia-smi/q_8xH100-HBM3_hgx_535.183.01_gpud.txt")) == ["Disabled"] * 8
    assert mig_modes(sample("nvidia-smi/q_1xA10_535.129.03_gpud.txt")) == ["N/A"]
    assert mig_modes("") == []


def test_only_mig_on_without_instances_is_tolerated() -> None:
    on = sample(A100).replace(
        "Current                           : Disabled", "Current : Enabled", 1
    )
    assert mig_modes(on)[0] == "Enabled"
    assert tolerated_case(CTK_EMPTY, mig_modes(on)) == MIG_NO_INSTANCES
    assert tolerated_case(CTK_EMPTY, mig_modes(sample(A100))) is None  # MIG off: real failure
    nvml = 'level=error msg="failed to generate CDI spec: failed to initialize NVML: ERROR_UNKNOWN"'
    assert tolerated_case(nvml, ["Enabled"]) is None
    assert tolerated_case(CTK_EMPTY, []) is None  # MIG mode unknown: not assumed


def _shims(w: World, mig: str) -> dict[str, str]:
    """nvidia-ctk whose `cdi generate` fails as above; nvidia-smi -q adding a MIG block."""
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
            "import subprocess, sys\n"
            f"r = subprocess.run([{str(real_smi)!r}, *sys.argv[1:]])\n"
            "if '-q' in sys.argv[1:] and '-x' not in sys.argv[1:] and r.returncode == 0:\n"
            f"    print('    MIG Mode\\n        Current                           : {mig}')\n"
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
