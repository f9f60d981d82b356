"""The provisioning hook: the exact command line of docs/provisioning-hook.md, run as a
child on simulated nodes: the CSE exit code of the same meaning for every fault, one
summary line naming bootfsm's own code too, deadline honoured, and an AgentBaker-style
caller (tests/cse_caller.sh) that gets the outcome it expects."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootfsm.core.codes import Code, info
from bootfsm.sim.nodestate import Node
from bootfsm.sim.world import FAULTS as SIM_FAULTS
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, installer_calls

DOC = Path(__file__).resolve().parent.parent / "docs/provisioning-hook.md"
CALLER = Path(__file__).resolve().parent / "cse_caller.sh"
RUN_ID = r"[0-9a-f]{8}"
# AgentBaker's names of the CSE codes these tests expect (tests/agentbaker_codes.py)
CSE = {0: "OK", 4: "ERR_SYSTEMCTL_START_FAIL", 34: "ERR_KUBELET_START_FAIL",
       83: "ERR_GPU_DOWNLOAD_TIMEOUT", 84: "ERR_GPU_DRIVERS_START_FAIL",
       85: "ERR_GPU_DRIVERS_INSTALL_TIMEOUT", 87: "ERR_GPU_INFO_ROM_CORRUPTED"}  # fmt: skip


def hook_argv() -> list[str]:
    """The documented hook line (the first line of the block after the marker)."""
    text = DOC.read_text()
    block = text[text.index("<!-- hook-command") :].split("```sh\n", 1)[1]
    argv = shlex.split(block.splitlines()[0])
    assert argv[:2] == ["bootfsm", "run"], argv
    return argv


def run_hook(
    w: World, argv: list[str] | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the hook line on the node; `bootfsm` is this checkout's `python -m bootfsm`."""
    line = argv if argv is not None else hook_argv()
    return subprocess.run(
        [sys.executable, "-m", "bootfsm", *line[1:], "--root", str(w.root)],
        env={**w.env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def only_line(p: subprocess.CompletedProcess[str]) -> str:
    """The hook's whole console: one line on stdout, nothing on stderr."""
    assert p.stderr == "", p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert len(lines) == 1, p.stdout
    return lines[0]


def test_hook_line_is_documented_with_a_budget() -> None:
    """The documented line is the hook's (CSE exit codes and the rest of --hook), quiet,
    bounded (deadline) and waits for the unit, briefly."""
    argv = hook_argv()
    assert "--quiet" in argv and "--hook" in argv
    deadline = float(argv[argv.index("--deadline") + 1])
    wait = float(argv[argv.index("--wait-lock") + 1])
    assert wait + deadline + 15 <= 780  # fits the CSE budget with room to exit


def test_hook_success_is_one_ok_line(make_world: MakeWorld) -> None:
    """A node that provisions: exit 0 and one OK line with the run id."""
    w = make_world("h100-pcie")
    p = run_hook(w)
    assert p.returncode == 0
    m = re.fullmatch(
        rf"bootfsm: OK code=0 OK state=done: node provisioned in (\d+\.\d) s \| run {RUN_ID}",
        only_line(p),
    )
    assert m is not None
    # where AKS's log collector gathers it (aks-log-collector.sh: /var/log/azure/*/*)
    [journal] = (w.root / "var/log/azure/bootfsm").glob("run-*.jsonl")
    assert not (w.root / "var/log/bootfsm").exists()
    end = json.loads(journal.read_text().splitlines()[-1])
    assert end["event"] == "run.end" and m[1] == f"{end['duration_s']:.1f}"  # the run's own


FAIL_FAST = [
    pytest.param("gb300", (), "grid", Code.DRIVER_KIND_UNSUPPORTED_ON_ARCH, "detect", id="grid"),
    pytest.param(
        "h100-pcie", ("artifact-404",), "cuda", Code.ARTIFACT_NOT_FOUND, "fetch", id="404"
    ),
    pytest.param(
        "h100-pcie", ("checksum-mismatch",), "cuda", Code.CHECKSUM_MISMATCH, "fetch", id="sha256"
    ),
]


@pytest.mark.parametrize(("sku", "faults", "kind", "code", "state"), FAIL_FAST)
def test_hook_fail_fast_codes_pass_through(
    make_world: MakeWorld,
    sku: str,
    faults: tuple[str, ...],
    kind: str,
    code: Code,
    state: str,
) -> None:
    """A permanent problem: the hook exits 84 (the GPU driver will not work), the one
    line names bootfsm's own code, name, state and hint and the CSE code, no driver build
    was attempted, and the trace reads."""
    w = make_world(sku, faults=faults, driver_kind=kind)
    p = run_hook(w)
    assert p.returncode == 84
    line = only_line(p)
    head = f"bootfsm: FAILED code={int(code)} {code.name} state={state}: "
    assert line.startswith(head), line
    tail = rf" \| hint: {re.escape(info(code).hint)} \| cse exit 84 {CSE[84]} \| run {RUN_ID}$"
    assert re.search(tail, line), line
    assert installer_calls(w) == []
    trace = subprocess.run(
        [sys.executable, "-m", "bootfsm", "trace", "--root", str(w.root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert trace.returncode == 0, trace.stderr
    assert f"{int(code)} {code.name}" in trace.stdout and "root cause" in trace.stdout


@pytest.mark.parametrize("how", ["flag", "env"])
def test_deadline_is_honoured_end_to_end(make_world: MakeWorld, how: str) -> None:
    """A driver build that never returns: the run stops at its deadline (flag, or
    BOOTFSM_DEADLINE) with 100 (CSE 85, install timeout), stopping the build, instead of
    hanging the hook."""
    w = make_world("h100-pcie", faults=("installer-hangs",))
    argv = hook_argv()
    i = argv.index("--deadline")
    if how == "flag":
        p = run_hook(w, [*argv[:i], "--deadline", "5", *argv[i + 2 :]])
    else:
        p = run_hook(w, [*argv[:i], *argv[i + 2 :]], env={"BOOTFSM_DEADLINE": "5"})
    assert p.returncode == 85, p.stdout
    line = only_line(p)
    assert line.startswith("bootfsm: FAILED code=100 DEADLINE_EXCEEDED state=driver: ")
    assert "global deadline of 5 s ran out in state driver" in line
    assert f"| cse exit 85 {CSE[85]} | run " in line
    # the deadline cut the command in flight: journaled as timed out, stopped by SIGTERM
    [journal] = w.journals()
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    assert events[-1]["event"] == "run.end" and events[-1]["code"] == 100
    [cut] = [e for e in events if e["event"] == "command" and e["timed_out"]]
    assert Path(cut["argv"][0]).name == "nvidia-installer" and cut["state"] == "driver"
    assert [c["rc"] for c in installer_calls(w)] == [-15]


@pytest.mark.parametrize(
    ("extra", "env", "says", "rc"),
    [
        ((), {"BOOTFSM_DEADLINE": "soon"}, "BOOTFSM_DEADLINE: expected seconds", 10),
        ((), {"BOOTFSM_DEADLINE": "-5"}, "BOOTFSM_DEADLINE: must be a positive", 10),
        (("--deadline", "0"), {}, "--deadline: must be a positive", 10),
        (("--deadline", "0", "--exit-codes", "cse"), {}, "--deadline: must be a positive", 84),
    ],
)
def test_bad_deadline_is_config_invalid(
    tmp_path: Path, extra: tuple[str, ...], env: dict[str, str], says: str, rc: int
) -> None:
    """A deadline that is not a positive number: 10 (CSE 84) and the summary line, no run."""
    p = subprocess.run(
        [sys.executable, "-m", "bootfsm", "run", "--quiet", "--root", str(tmp_path), *extra],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == rc
    line = only_line(p)
    assert line.startswith("bootfsm: FAILED code=10 CONFIG_INVALID state=-: ") and says in line
    assert not (tmp_path / "var/log/bootfsm").exists()


def test_exit_code_tables_name_real_codes() -> None:
    """Every `N NAME` the hook doc's tables name is a real bootfsm code, and the mapping
    table names every failure code."""
    text = DOC.read_text()
    pairs = re.findall(r"`(\d+) ([A-Z_]+)`", text[text.index("## Outcomes a CSE caller") :])
    assert pairs
    for number, name in pairs:
        assert Code[name] == int(number), (number, name)
    table = text[text.index("<!-- cse-table") : text.index("<!-- /cse-table")]
    named = set(re.findall(r"`\d+ ([A-Z_]+)`", table))
    assert named == {c.name for c in Code}


# Every fault the simulator has, on the hook line: (fault, sku, bootfsm code, state, CSE
# exit). The CSE column is written by hand from AgentBaker's meanings: a GPU step that
# fails is 84, a download / driver install that ran out of time 83 / 85, infoROM 87,
# kubelet 34, a service (containerd) that does not start 4.
EVERY_FAULT = [
    ("artifact-404", "h100-pcie", Code.ARTIFACT_NOT_FOUND, "fetch", 84),
    ("checksum-mismatch", "h100-pcie", Code.CHECKSUM_MISMATCH, "fetch", 84),
    ("http-503x3", "h100-pcie", Code.OK, "done", 0),
    ("drop-mid-body", "h100-pcie", Code.OK, "done", 0),
    ("dpkg-lock-held", "gb300", Code.DPKG_LOCK_TIMEOUT, "driver", 85),
    ("inforom-corrupted", "h100-pcie", Code.INFOROM_CORRUPTED, "driver", 87),
    ("fabric-in-progress-forever", "h100-hgx", Code.FABRIC_NOT_READY, "verify", 84),
    # the hook leaves kubelet to the caller (ensureKubelet starts it after the GPU step)
    ("kubelet-unhealthy", "h100-pcie", Code.OK, "done", 0),
    ("installer-fails", "h100-pcie", Code.DRIVER_INSTALL_FAILED, "driver", 84),
    ("installer-hangs", "h100-pcie", Code.DRIVER_INSTALL_TIMEOUT, "driver", 85),
    ("stale-driver-in-use", "h100-pcie", Code.REBOOT_REQUIRED, "driver", 84),
    ("stale-driver", "h100-pcie", Code.OK, "done", 0),
    ("gpu-missing", "h100-pcie", Code.GPU_COUNT_MISMATCH, "verify", 84),
    ("stale-fabricmanager-unit", "h100-pcie", Code.OK, "done", 0),
    ("containerd-restart-fails", "h100-pcie", Code.CONTAINERD_RESTART_FAILED, "join", 4),
    ("cdi-fails", "h100-pcie", Code.CDI_REFRESH_FAILED, "join", 84),
    ("kernel-headers-missing", "h100-pcie", Code.KERNEL_HEADERS_MISSING, "detect", 84),
    ("dpkg-db-lock-held", "gb300", Code.DPKG_LOCK_TIMEOUT, "driver", 85),
    ("dpkg-interrupted", "gb300", Code.OK, "done", 0),
    ("ib-umad-missing", "b200-hgx", Code.IB_UMAD_NOT_LOADED, "fabric", 84),
    # a MIG node (mig.profile set) whose GPU a client holds: MIG mode stays pending, which
    # the hook hands to the caller as a reboot request (cse_main.sh's REBOOTREQUIRED)
    ("mig-gpu-in-use", "h100-pcie", Code.OK, "done", 0),
    # a GPU VM size whose GPUs are missing from PCI: a GPU fell off the bus
    ("gpus-off-bus", "h100-pcie", Code.NO_GPU, "detect", 84),
    # a GRID guest (driver.kind = "grid") whose vGPU licence never comes
    ("grid-unlicensed", "a10-nvads", Code.GRID_NOT_LICENSED, "verify", 84),
    # Secure Boot on and the runfile chosen: refused in detect, before any download
    ("secure-boot", "h100-pcie", Code.SECURE_BOOT_NEEDS_SIGNED_MODULE, "detect", 84),
    # a GRID driver on a GPU passed through whole: no licence element, nothing to wait for
    ("grid-passthrough", "a10-nvads", Code.OK, "done", 0),
]


def test_every_simulator_fault_is_covered() -> None:
    assert sorted(f[0] for f in EVERY_FAULT) == sorted(SIM_FAULTS)


def _overrides(fault: str) -> dict[str, dict[str, object]]:
    # a hung installer is cut by driver.command_timeout (the state's own limit), quickly
    if fault == "mig-gpu-in-use":
        return {"mig": {"profile": "MIG1g"}}
    if fault in ("grid-unlicensed", "grid-passthrough"):
        return {"verify": {"license_timeout": 0.5, "license_poll_interval": 0.1}}
    return {"driver": {"command_timeout": 2.0}} if fault == "installer-hangs" else {}


@pytest.mark.parametrize(
    ("fault", "sku", "code", "state", "cse"), EVERY_FAULT, ids=[f[0] for f in EVERY_FAULT]
)
def test_hook_exits_with_the_cse_code_of_each_fault(
    make_world: MakeWorld, fault: str, sku: str, code: Code, state: str, cse: int
) -> None:
    """The documented line on a node with the fault: the CSE code of the same meaning
    as the exit status, bootfsm's own code, name and hint (and the CSE code) in the one
    line, and bootfsm's own code in the journal."""
    kind = "grid" if fault.startswith("grid-") else "cuda"
    w = make_world(sku, (fault,), driver_kind=kind, config_overrides=_overrides(fault))
    p = run_hook(w)
    line = only_line(p)
    assert p.returncode == cse, line
    if code is Code.OK:
        assert line.startswith("bootfsm: OK code=0 OK state=done: "), line
    else:
        assert line.startswith(f"bootfsm: FAILED code={int(code)} {code.name} state={state}: ")
        assert f" | hint: {info(code).hint} | cse exit {cse} {CSE[cse]} | run " in line, line
    [journal] = w.journals()
    end = json.loads(journal.read_text().splitlines()[-1])
    assert (end["event"], end["code"], end["code_name"]) == ("run.end", int(code), code.name)


# The cases the bash path is judged on (docs/provisioning-hook.md, "Outcomes a CSE caller
# sees"): (case, sku, faults, driver kind, bootfsm code, what the caller must end with)
CALLER_CASES = [
    ("success", "h100-pcie", (), "cuda", Code.OK, 0),
    ("grid-on-arm64", "gb300", (), "grid", Code.DRIVER_KIND_UNSUPPORTED_ON_ARCH, 84),
    ("404", "h100-pcie", ("artifact-404",), "cuda", Code.ARTIFACT_NOT_FOUND, 84),
    ("checksum", "h100-pcie", ("checksum-mismatch",), "cuda", Code.CHECKSUM_MISMATCH, 84),
    ("dkms-failure", "h100-pcie", ("installer-fails",), "cuda", Code.DRIVER_INSTALL_FAILED, 84),
    ("inforom", "h100-pcie", ("inforom-corrupted",), "cuda", Code.INFOROM_CORRUPTED, 87),
    ("timeout", "h100-pcie", ("installer-hangs",), "cuda", Code.DRIVER_INSTALL_TIMEOUT, 85),
]


def run_caller(
    w: World, env: dict[str, str], argv: list[str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """tests/cse_caller.sh on the node: kubelet's install, the hook line where cse_main.sh
    runs ensureGPUDrivers, then ensureKubelet, with the environment CSE exports for a GPU
    VM size (GPU_NODE=true, IMDS for the tags) plus ``env``."""
    line = argv if argv is not None else hook_argv()
    hook = [sys.executable, "-m", "bootfsm", *line[1:], "--root", str(w.root)]
    imds = f"{w.mirror.url}/metadata/instance?api-version=2021-02-01"
    return subprocess.run(
        ["bash", str(CALLER), str(w.root), *hook],
        env={**w.env(), "GPU_NODE": "true", "IMDS_URL": imds, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    ("case", "sku", "faults", "kind", "code", "cse"), CALLER_CASES, ids=[c[0] for c in CALLER_CASES]
)
def test_agentbaker_style_caller_gets_the_outcome_it_expects(
    make_world: MakeWorld,
    case: str,
    sku: str,
    faults: tuple[str, ...],
    kind: str,
    code: Code,
    cse: int,
) -> None:
    """The caller's `|| exit $?` sees a code from its own table: 0 goes on to kubelet, a
    failure ends provisioning with the ERR_* name it knows; the hook ran once (no retry
    wrapper: bootfsm retries what is transient inside its states)."""
    overrides = {"driver": {"command_timeout": 2.0}} if "installer-hangs" in faults else {}
    w = make_world(sku, faults, driver_kind=kind, config_overrides=overrides)
    p = run_caller(w, {"CSE_STARTTIME_SECONDS": str(int(time.time()))})
    assert p.returncode == cse, (p.stdout, p.stderr)
    out = p.stdout.splitlines()
    assert "not a code this caller knows" not in p.stdout
    summary = [line for line in out if line.startswith("bootfsm: ")]
    assert len(summary) == 1
    if code is Code.OK:
        assert out[-2:] == ["caller: continuing with kubelet", "caller: kubelet started"]
        assert summary[0].startswith("bootfsm: OK code=0 ")
    else:
        assert out[-1] == f"caller: provisioning failed: exit {cse} {CSE[cse]}"
        assert f"code={int(code)} {code.name} " in summary[0]
    assert len(w.journals()) == 1


@pytest.mark.parametrize("value", ["true", "false"])
def test_skip_gpu_driver_install_tag(make_world: MakeWorld, value: str) -> None:
    """AgentBaker's SkipGpuDriverInstall VM tag (IMDS tagsList), read by bootfsm itself
    (bootfsm.service at later boots has no cse_main.sh to read it): with "true" the hook
    exits 0 after detect, with nothing installed, and the journal names the reason.
    "false" provisions as usual."""
    w = make_world("h100-pcie", vm_tags={"SkipGpuDriverInstall": value})
    p = run_hook(w)
    assert p.returncode == 0, (p.stdout, p.stderr)
    events = [json.loads(x) for x in w.journals()[-1].read_text().splitlines()]
    names = [e["event"] for e in events]
    if value == "true":
        assert re.fullmatch(
            r"bootfsm: OK code=0 OK state=done: GPU driver install skipped \(VM tag "
            rf"SkipGpuDriverInstall=true\) in \d+\.\d s \| run {RUN_ID}",
            only_line(p),
        )
        [skip] = [e for e in events if e["event"] == "detect.skip_gpu_install"]
        assert skip["reason"] == "VM tag SkipGpuDriverInstall=true"
        assert installer_calls(w) == []
        assert [(e["source"], e["dest"]) for e in events if e["event"] == "transition"] == [
            ("detect", "done")
        ]
    else:
        assert "detect.skip_gpu_install" not in names
        assert len(installer_calls(w)) == 1


def test_skip_tag_ignored_when_switched_off(make_world: MakeWorld) -> None:
    """detect.skip_tag = false: the tag is not honoured and the driver installs."""
    w = make_world(
        "h100-pcie",
        vm_tags={"SkipGpuDriverInstall": "true"},
        config_overrides={"detect": {"skip_tag": False}},
    )
    p = run_hook(w)
    assert p.returncode == 0, p.stdout
    assert len(installer_calls(w)) == 1


def test_caller_leaves_nothing_of_the_gpu_step_to_the_bash(make_world: MakeWorld) -> None:
    """After the AgentBaker-style caller on an NVSwitch node, what ensureGPUDrivers and
    cse_main.sh would still do is done: nvidia-modprobe -u -c0 ran (nvidia_uvm loaded,
    /dev/nvidia-uvm and /dev/nvidiactl there; its unit's job), fabric manager's unit is
    enabled and active, nvidia-persistenced (which the runfile installed) is enabled and
    active, ldconfig and nvidia-smi ran: no line of the bash GPU step is left."""
    w = make_world("h100-hgx")
    p = run_caller(w, {"CSE_STARTTIME_SECONDS": str(int(time.time()))})
    assert p.returncode == 0, (p.stdout, p.stderr)
    node = Node(w.root)
    assert (w.root / "sys/module/nvidia_uvm").is_dir()
    assert (w.root / "dev/nvidia-uvm").exists() and (w.root / "dev/nvidiactl").exists()
    cmds = [(c["cmd"], c["argv"], c["rc"]) for c in w.calls()]
    assert ("nvidia-modprobe", ["-u", "-c0"], 0) in cmds
    assert any(c[0] == "ldconfig" and c[2] == 0 for c in cmds)
    assert any(c[0] == "nvidia-smi" and c[2] == 0 for c in cmds)
    for unit in ("nvidia-fabricmanager.service", "nvidia-persistenced.service"):
        assert node.is_enabled(unit), unit
        assert node.unit_state(unit) == "active", unit
    assert (w.root / "usr/bin/nvidia-persistenced").exists()  # from the runfile install
    assert node.unit_file("nvidia-persistenced.service") == (
        "/etc/systemd/system/nvidia-persistenced.service"
    )


def test_persistenced_is_left_alone_when_switched_off(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", config_overrides={"driver": {"persistenced": False}})
    assert run_hook(w).returncode == 0
    assert Node(w.root).unit_file("nvidia-persistenced.service") is None


def test_hook_doc_says_mig_is_handled() -> None:
    """The replaced-lines table gives ensureMigPartition to the mig state (26/27/28)."""
    text = DOC.read_text()
    assert "left to cse_main.sh (MIG" not in text
    row = next(line for line in text.splitlines() if line.startswith("| `ensureMigPartition`"))
    for words in ("`mig`", "26 MIG_RESET_REQUIRED", "27 MIG_PROFILE_INVALID", "28 MIG_CONFIG"):
        assert words in row
