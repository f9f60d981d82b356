"""The mig state on simulated MIG nodes (H100: the stand-in `nvidia-smi mig` over the
node's MIG state), on real `-q -x` captures of GPUs without MIG, and the stand-in's own
grammar and wording."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.config import ConfigError, parse_config
from bootfsm.sim.node import simulate_reboot
from bootfsm.sim.nodestate import SIM_STATE
from bootfsm.sim.world import World
from bootfsm.states import mig
from tests.conftest import MakeWorld, run_in_process
from tests.samples import sample
from tests.test_verify import XML, Node


def smi(w: World, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nvidia-smi", *argv], env=w.env(), capture_output=True, text=True)


def smi_calls(w: World) -> list[list[str]]:
    return [c["argv"] for c in w.calls() if c["cmd"] == "nvidia-smi"]


def events(journal: Path, name: str) -> list[dict[str, Any]]:
    return [e for e in map(json.loads, journal.read_text().splitlines()) if e["event"] == name]


def gi_profiles(w: World) -> list[str]:
    """Profile ids column of `nvidia-smi mig -lgi`, read off the table."""
    out = smi(w, "mig", "-lgi").stdout.splitlines()
    return [line.split()[4] for line in out if line.startswith("|   0  MIG")]


def test_uniform_layout_from_config_partitions_and_joins(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", config_overrides={"mig": {"profile": "MIG1g"}})
    r = run_in_process(w)
    assert (r.outcome.code, r.outcome.state) == (Code.OK, "done"), r.outcome.message
    assert gi_profiles(w) == ["19"] * 7  # AgentBaker's MIG1g: seven 1g instances
    calls = smi_calls(w)
    assert ["-i", "0", "-mig", "1"] in calls
    assert ["mig", "-i", "0", "-cgi", "19,19,19,19,19,19,19", "-C"] in calls
    (profile,) = events(r.journal, "mig.profile")  # type: ignore[arg-type]
    assert (profile["profile"], profile["source"]) == ("MIG1g", "config mig.profile")
    lci = smi(w, "mig", "-lci").stdout
    assert lci.count("MIG 1g.10gb") == 7
    q = smi(w, "-q").stdout
    assert "        Current                           : Enabled" in q


def test_rerun_on_a_partitioned_node_does_nothing(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", config_overrides={"mig": {"profile": "3g.40gb,MIG 3g.40gb"}})
    assert run_in_process(w).outcome.code is Code.OK
    before = len(w.calls())
    r = run_in_process(w)
    assert r.outcome.code is Code.OK
    skipped = [e["state"] for e in events(r.journal, "state.skip")]  # type: ignore[arg-type]
    assert "mig" in skipped
    changes = [c["argv"] for c in w.calls()[before:] if "-cgi" in c["argv"] or "-mig" in c["argv"]]
    assert changes == [] and gi_profiles(w) == ["9", "9"]


def test_pending_mode_ends_with_reset_required_then_the_reboot_finishes(
    make_world: MakeWorld,
) -> None:
    w = make_world("h100-pcie", ("mig-gpu-in-use",), config_overrides={"mig": {"profile": "19"}})
    r = run_in_process(w)
    assert (r.outcome.code, r.outcome.state) == (Code.MIG_RESET_REQUIRED, "mig")
    assert "reset or reboot required" in r.outcome.message
    assert "Disabled/Enabled" in r.outcome.message  # current/pending as -q -x shows them
    [enable] = events(r.journal, "mig.enable")  # type: ignore[arg-type]
    assert "pending enable state" in enable["output"]
    # the client is gone after the reboot; the pending mode is current
    state = json.loads((w.root / SIM_STATE).read_text())
    state["faults"] = []
    (w.root / SIM_STATE).write_text(json.dumps(state))
    simulate_reboot(w.root)
    r = run_in_process(w)
    assert r.outcome.code is Code.OK, r.outcome.message
    assert gi_profiles(w) == ["19"]


def test_a100_in_a_vm_needs_the_reboot_agentbaker_does(make_world: MakeWorld) -> None:
    """8x A100: `-mig 1` stays pending (the VM cannot reset the GPU): 26, as cse_main.sh's
    REBOOTREQUIRED; after the reboot the run creates AgentBaker's MIG1g layout on all 8."""
    w = make_world("a100-ndv4", config_overrides={"mig": {"profile": "MIG1g"}})
    r = run_in_process(w)
    assert (r.outcome.code, r.outcome.state) == (Code.MIG_RESET_REQUIRED, "mig")
    assert "pending on 8 GPU(s)" in r.outcome.message
    enables = events(r.journal, "mig.enable")  # type: ignore[arg-type]
    assert len(enables) == 8 and all(":Not Supported" in e["output"] for e in enables)
    simulate_reboot(w.root)
    r = run_in_process(w)
    assert r.outcome.code is Code.OK, r.outcome.message
    lgi = smi(w, "mig", "-lgi").stdout
    assert lgi.count("MIG 1g.5gb          19") == 56  # 7 per GPU, A100 40GB profile 19
    assert [c for c in smi_calls(w) if "-cgi" in c] == [
        ["mig", "-i", str(i), "-cgi", "19,19,19,19,19,19,19", "-C"] for i in range(8)
    ]


def test_profile_from_the_vm_tag_and_config_wins(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", vm_tags={"GpuInstanceProfile": "MIG7g"})
    r = run_in_process(w)
    assert r.outcome.code is Code.OK, r.outcome.message
    assert gi_profiles(w) == ["0"]
    (profile,) = events(r.journal, "mig.profile")  # type: ignore[arg-type]
    assert profile["source"] == "VM tag GpuInstanceProfile"
    w2 = make_world(
        "h100-pcie",
        vm_tags={"GpuInstanceProfile": "MIG7g"},
        config_overrides={"mig": {"profile": "14"}},
    )
    assert run_in_process(w2).outcome.code is Code.OK
    assert gi_profiles(w2) == ["14"]


@pytest.mark.parametrize(
    ("tag", "words"),
    [
        ("MIG 9g.99gb", "offers no MIG profile MIG 9g.99gb"),
        ("banana", "'banana' is not a MIG profile"),
        ("19,19,19,19,19,19,19,19", "at most 7"),
    ],
)
def test_bogus_profile_is_profile_invalid(make_world: MakeWorld, tag: str, words: str) -> None:
    w = make_world("h100-pcie", vm_tags={"GpuInstanceProfile": tag})
    r = run_in_process(w)
    assert (r.outcome.code, r.outcome.state) == (Code.MIG_PROFILE_INVALID, "mig")
    assert words in r.outcome.message
    assert [c for c in smi_calls(w) if "-cgi" in c] == []


def test_bogus_config_profile_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"mig\.profile: 'banana' is not a MIG profile"):
        parse_config({"mig": {"profile": "banana"}})
    with pytest.raises(ConfigError, match=r"mig\.profile: empty"):
        parse_config({"mig": {"profile": "19,,19"}})
    assert parse_config({"mig": {"profile": "MIG 1g.10gb, 19,1g.20gb"}}).mig.profile


def test_no_profile_goes_from_verify_to_join(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    r = run_in_process(w)
    assert r.outcome.code is Code.OK
    assert [c for c in smi_calls(w) if c[:1] == ["mig"] or "-mig" in c] == []
    states = [e["state"] for e in events(r.journal, "state.enter")]  # type: ignore[arg-type]
    assert "mig" not in states


def test_other_partition_is_reconfigured(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", config_overrides={"mig": {"profile": "MIG7g"}})
    assert run_in_process(w).outcome.code is Code.OK
    w.config_overrides = {"mig": {"profile": "MIG3g"}}
    w.write_config()
    r = run_in_process(w)
    assert r.outcome.code is Code.OK, r.outcome.message
    assert gi_profiles(w) == ["9", "9"]
    [change] = events(r.journal, "mig.reconfigure")  # type: ignore[arg-type]
    assert (change["have"], change["want"]) == ([0], [9, 9])


def test_partition_in_use_is_not_destroyed(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", config_overrides={"mig": {"profile": "MIG7g"}})
    assert run_in_process(w).outcome.code is Code.OK
    state = json.loads((w.root / SIM_STATE).read_text())
    state["faults"] = ["mig-gpu-in-use"]
    (w.root / SIM_STATE).write_text(json.dumps(state))
    w.config_overrides = {"mig": {"profile": "MIG2g"}}
    w.write_config()
    r = run_in_process(w)
    assert (r.outcome.code, r.outcome.state) == (Code.MIG_CONFIG_FAILED, "mig")
    assert "In use by another client" in r.outcome.message
    assert gi_profiles(w) == ["0"]


@pytest.mark.parametrize("capture", ["qx-t4.xml", "qx-l40s.xml"])
def test_gpu_without_mig_is_profile_invalid(tmp_path: Path, capture: str) -> None:
    """Real captures of GPUs without MIG (<current_mig>N/A</current_mig>)."""
    node = Node(tmp_path, "x86_64", 0x1EB8, 1)
    node.ctx.state = "mig"
    node.ctx.facts_ = dataclasses.replace(
        node.ctx.facts, mig_profile="MIG1g", mig_profile_source="config mig.profile"
    )
    node.outputs(sample(XML + capture))
    assert not mig.satisfied(node.ctx)
    with pytest.raises(Exception) as info:
        mig.run(node.ctx)
    assert getattr(info.value, "code", None) is Code.MIG_PROFILE_INVALID
    assert "MIG is not supported (MIG Mode N/A)" in str(info.value)


# ---------------------------------------------------------------- the stand-in


def test_standin_refuses_bogus_flags_with_the_real_words(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.code is Code.OK
    p = smi(w, "mig", "-cgix", "19")
    assert p.returncode == 2
    assert p.stdout == (
        "ERROR: Option -cgix is not recognized. Please run 'nvidia-smi mig -h' for help.\n"
    )
    p = smi(w, "mig", "-cgi")
    assert p.returncode == 2 and "Option -cgi is missing its value" in p.stdout
    p = smi(w, "mig", "-lgi", "-lci")
    assert p.returncode == 2 and p.stdout.startswith("Invalid combination of input arguments.")
    p = smi(w, "-mig", "2")
    assert p.returncode == 2 and p.stdout.startswith("Invalid combination of input arguments.")
    # MIG still off: every mig command answers as the real tool does
    p = smi(w, "mig", "-lgi")
    assert (p.returncode, p.stdout) == (6, "No MIG-enabled devices found.\n")


def test_standin_create_errors_and_messages(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.code is Code.OK
    p = smi(w, "-i", "0", "-mig", "1")
    bus = "00000001:00:00.0"
    assert (p.returncode, p.stdout) == (0, f"Enabled MIG Mode for GPU {bus}\nAll done.\n")
    p = smi(w, "mig", "-lgi")
    assert (p.returncode, p.stdout) == (6, "No GPU instances found: Not Found\n")
    p = smi(w, "mig", "-cgi", "9,3g.40gb,19", "-C")
    assert p.returncode == 255
    assert p.stdout.splitlines() == [
        "Successfully created GPU instance ID  2 on GPU  0 using profile MIG 3g.40gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  2 using"
        " profile MIG 3g.40gb (ID  2)",
        "Successfully created GPU instance ID  1 on GPU  0 using profile MIG 3g.40gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  1 using"
        " profile MIG 3g.40gb (ID  2)",
        "Unable to create a GPU instance on GPU  0 using profile 19: Insufficient Resources",
        "Failed to create GPU instances: Insufficient Resources",
    ]
    p = smi(w, "mig", "-cgi", "42")
    assert p.returncode == 2
    assert "using profile 42: Invalid Argument" in p.stdout
    p = smi(w, "mig", "-dgi")
    assert p.returncode == 255 and "In use by another client" in p.stdout  # CIs first
    assert smi(w, "mig", "-dci").returncode == 0
    p = smi(w, "mig", "-dgi")
    assert p.stdout.splitlines() == [
        "Successfully destroyed GPU instance ID  2 from GPU  0",
        "Successfully destroyed GPU instance ID  1 from GPU  0",
    ]
