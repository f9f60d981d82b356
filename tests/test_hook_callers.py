"""The real callers: the hook inside AgentBaker's own order, one image for GPU and CPU VM
sizes, and the choices the provisioning script makes per VM size.

Each test plays the caller as AKS runs it (Azure/AgentBaker 06836ee2301e): tests/cse_caller.sh
installs kubelet's binary first (configureKubeletAndKubectl, into /opt/bin/kubelet), reads
the SkipGpuDriverInstall tag from IMDS, runs the documented hook line where cse_main.sh
runs ensureGPUDrivers, with the environment cse_cmd.sh and cse_helpers.sh export, then
ensureKubelet (which alone writes /etc/default/kubelet) against kubelet.service as
AgentBaker ships it (``ConditionPathExists=/opt/bin/kubelet``,
``EnvironmentFile=/etc/default/kubelet`` without a "-"), under the simulator's systemctl,
which honours both as systemd does. IMDS answers on loopback only with the
``Metadata: true`` header, as Azure's does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bootfsm.commands.unit import HOOK_CHOICES
from bootfsm.core.config_files import load_config
from bootfsm.image.bake import BakeOptions, bake
from bootfsm.install.containerd import DROPIN
from bootfsm.sim import artifacts as art
from bootfsm.sim.node import simulate_reboot, standin_script
from bootfsm.sim.node_layout import KUBELET_BIN
from bootfsm.sim.nodestate import Node
from bootfsm.sim.world import DRIVER_VERSION, World
from tests.conftest import MakeWorld, installer_calls, no_gpus
from tests.test_hook import CALLER, hook_argv

EVENTS_DIR = "var/log/azure/Microsoft.Azure.Extensions.CustomScript/events"
HOOK_JOURNALS = "var/log/azure/bootfsm"
DROPIN_FILE = "etc/bootfsm/config.d/50-provisioning-hook.toml"
REBOOT_REQUEST = "run/bootfsm/reboot-required"


def fresh_aks_node(w: World) -> None:
    """The node as CSE finds it on a fresh VHD: kubelet's binary still in the image's
    cache (configureKubeletAndKubectl installs it before the GPU step) and no
    /etc/default/kubelet (ensureKubelet writes it, after the GPU step)."""
    cache = w.root / "opt/kube/kubelet"
    cache.parent.mkdir(parents=True, exist_ok=True)
    (w.root / KUBELET_BIN.lstrip("/")).rename(cache)
    (w.root / "etc/default/kubelet").unlink()


def aks_env(w: World, **changes: str) -> dict[str, str]:
    """What cse_cmd.sh hands the provisioning script for this VM size (AgentBaker's
    values: the cuda-lts driver 580.159.04, fabric manager on NVSwitch sizes)."""
    needs_fm = "true" if w.sku_name in ("h100-hgx", "a100-ndv4", "b200-hgx") else "false"
    env = {
        "GPU_NODE": "true",
        "GPU_DRIVER_VERSION": DRIVER_VERSION,
        "GPU_DRIVER_TYPE": "cuda-lts",
        "GPU_NEEDS_FABRIC_MANAGER": needs_fm,
        "MIG_NODE": "false",
        "GPU_INSTANCE_PROFILE": "",
        "CONFIG_GPU_DRIVER_IF_NEEDED": "true",
        "CSE_STARTTIME_SECONDS": str(int(time.time())),
        "IMDS_URL": f"{w.mirror.url}/metadata/instance?api-version=2021-02-01",
    }
    return {**env, **changes}


def run_caller(
    w: World, env: dict[str, str], line: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = hook_argv() if line is None else line
    hook = [sys.executable, "-m", "bootfsm", *argv[1:], "--root", str(w.root)]
    return subprocess.run(
        ["bash", str(CALLER), str(w.root), *hook],
        env={**w.env(), **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def bootfsm(w: World, *args: str) -> subprocess.CompletedProcess[str]:
    """A bootfsm command on the node, with no caller environment (an on-call engineer,
    or bootfsm.service at boot)."""
    return subprocess.run(
        [sys.executable, "-m", "bootfsm", *args, "--root", str(w.root)],
        env=w.env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def last_run(w: World) -> list[dict[str, Any]]:
    return events(w.journals()[-1])


def summary(p: subprocess.CompletedProcess[str]) -> str:
    [line] = [ln for ln in p.stdout.splitlines() if ln.startswith("bootfsm: ")]
    return line


# -------------------------------------------------------------- 1. kubelet is the caller's


@pytest.mark.parametrize("sku", ["h100-pcie", "h100-hgx"])
def test_the_hook_in_cse_order_leaves_kubelet_to_ensure_kubelet(
    make_world: MakeWorld, sku: str
) -> None:
    """On a fresh VHD the hook does the whole GPU step (containerd runtime, device links,
    CDI) and never touches kubelet; ensureKubelet then starts it."""
    w = make_world(sku)
    fresh_aks_node(w)
    p = run_caller(w, aks_env(w))
    assert p.returncode == 0, (p.stdout, p.stderr)
    said = [ln for ln in p.stdout.splitlines() if not ln.startswith("bootfsm: ")]
    assert said[0] == "caller: skip_nvidia_driver_install=false"
    assert said[1].startswith("caller: check_cse_timeout passes as the GPU step returns (")
    assert said[2:] == [
        "caller: GPU step done",
        "caller: configureManagedGPUExperience (ENABLE_MANAGED_GPU=)",
        "caller: continuing with kubelet",
        "caller: kubelet started",
    ]
    assert summary(p).startswith("bootfsm: OK code=0 OK state=done: node provisioned in ")
    calls = w.calls()
    first_caller = calls.index(  # ensureKubelet's `systemctl restart --no-block kubelet`
        next(c for c in calls if c["cmd"] == "systemctl" and c["argv"][-1:] == ["kubelet"])
    )
    reads = ("show", "is-active", "is-enabled", "status")  # asking is not touching
    touched = [c for c in calls[:first_caller] if "kubelet" in " ".join(c["argv"])]
    assert touched and [c for c in touched if c["argv"][0] not in reads] == []
    node = Node(w.root)
    assert node.unit_state("kubelet.service") == "active"
    # everything of the GPU step, done by the hook
    assert (w.root / DROPIN.lstrip("/")).is_file()
    assert (w.root / "etc/cdi/nvidia.yaml").is_file()
    assert ["system", "create-dev-char-symlinks", "--create-all"] in [
        c["argv"] for c in calls[:first_caller] if c["cmd"] == "nvidia-ctk"
    ]
    assert node.unit_state("containerd.service") == "active"
    if sku == "h100-hgx":
        assert node.unit_state("nvidia-fabricmanager.service") == "active"


def test_the_old_hook_line_starts_kubelet_too_early_and_fails_the_node(
    make_world: MakeWorld,
) -> None:
    """The control for the test above: the line documented before --hook has join start
    kubelet after configureKubeletAndKubectl put its binary in place (the unit's
    condition holds) but before ensureKubelet wrote its EnvironmentFile; kubelet.service
    fails to start ("Failed to load environment files", as systemd says) and the node
    ends 34."""
    w = make_world("h100-pcie")
    fresh_aks_node(w)
    old = [
        "bootfsm",
        "run",
        "--quiet",
        "--exit-codes",
        "cse",
        "--wait-lock",
        "30",
        "--deadline",
        "600",
    ]
    p = run_caller(w, aks_env(w), line=old)
    assert p.returncode == 34, (p.stdout, p.stderr)
    assert "code=91 KUBELET_NOT_HEALTHY" in summary(p)
    assert Node(w.root).unit_state("kubelet.service") == "failed"
    journal = (w.root / "var/log/bootfsm-sim/journal.log").read_text()
    assert "kubelet.service: Failed to load environment files: No such file or directory" in (
        journal
    )


# -------------------------------------------------------- 2. one image, GPU and CPU sizes


def test_a_cpu_vm_size_booting_the_shared_image_has_nothing_to_provision(
    make_world: MakeWorld,
) -> None:
    """bootfsm.service's own command line on a CPU VM size: exit 0, journaled, nothing
    installed; kubelet's Requires=bootfsm.service is met."""
    w = make_world("cpu-d4s")
    p = bootfsm(w, "run", "--no-start-kubelet")
    assert p.returncode == 0, p.stderr
    line = p.stdout.strip().splitlines()[-1]
    assert line.startswith(
        "bootfsm: OK code=0 OK state=done: nothing to provision: VM size standard_d4s_v5 "
        "has no NVIDIA GPU in "
    ), line
    run = last_run(w)
    [nothing] = [e for e in run if e["event"] == "detect.nothing_to_provision"]
    assert nothing["reason"] == "VM size standard_d4s_v5 has no NVIDIA GPU"
    assert [(e["source"], e["dest"]) for e in run if e["event"] == "transition"] == [
        ("detect", "done")
    ]
    assert w.calls() == []  # no command at all: nothing installed, nothing started
    fetched = [e.path for e in w.mirror.log if not e.path.startswith("/metadata")]
    assert fetched == []
    imds = [e for e in w.mirror.log if e.path.startswith("/metadata")]
    assert [e.status for e in imds] == [200]  # asked with Metadata: true


def test_a_cpu_node_in_cse_order_never_runs_the_hook(make_world: MakeWorld) -> None:
    """GPU_NODE=false (a CPU size in the provisioning script's table): cse_main.sh's GPU
    block, where the hook line sits, is not entered; kubelet starts and AgentBaker's
    cleanUpGPUDrivers runs after ensureKubelet, as it does today."""
    w = make_world("cpu-d4s")
    fresh_aks_node(w)
    p = run_caller(w, aks_env(w, GPU_NODE="false", GPU_DRIVER_VERSION="", GPU_DRIVER_TYPE=""))
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "bootfsm: " not in p.stdout and w.journals() == []
    assert p.stdout.splitlines()[-2:] == [
        "caller: kubelet started",
        "caller: cleanUpGPUDrivers (GPU_NODE=false, skip_nvidia_driver_install=false)",
    ]
    assert installer_calls(w) == []
    assert Node(w.root).unit_state("kubelet.service") == "active"


@pytest.mark.parametrize(
    ("tag", "value", "skipped"),
    [
        ("skipgpudriverinstall", "True", True),  # get_imds_vm_tag_value: any case, both
        ("SkipGpuDriverInstall", "false", False),
    ],
)
def test_the_skip_tag_is_cse_mains_test_before_the_hook(
    make_world: MakeWorld, tag: str, value: str, skipped: bool
) -> None:
    """A GPU VM size whose IMDS compute.tagsList carries SkipGpuDriverInstall: cse_main.sh
    reads it (get_imds_vm_tag_value's jq filter) before its GPU block; "true" skips the
    block, so the hook never runs and cleanUpGPUDrivers runs after ensureKubelet, as
    today; "false" runs the hook."""
    w = make_world("h100-pcie", vm_tags={tag: value})
    fresh_aks_node(w)
    p = run_caller(w, aks_env(w))
    assert p.returncode == 0, (p.stdout, p.stderr)
    said = p.stdout.splitlines()
    assert said[0] == f"caller: skip_nvidia_driver_install={str(skipped).lower()}"
    assert Node(w.root).unit_state("kubelet.service") == "active"
    if skipped:
        assert "bootfsm: " not in p.stdout and w.journals() == [] and installer_calls(w) == []
        assert said[-1] == (
            "caller: cleanUpGPUDrivers (GPU_NODE=true, skip_nvidia_driver_install=true)"
        )
    else:
        assert summary(p).startswith("bootfsm: OK code=0 OK state=done: node provisioned")
        assert len(installer_calls(w)) == 1 and "cleanUpGPUDrivers" not in p.stdout


def test_the_hook_itself_on_a_cpu_node_is_no_gpu_step(make_world: MakeWorld) -> None:
    """The hook line run with GPU_NODE=false anyway (a caller that runs it on every node):
    0, "nothing to provision", nothing installed."""
    w = make_world("cpu-d4s")
    env = aks_env(w, GPU_NODE="false", GPU_DRIVER_VERSION="", GPU_DRIVER_TYPE="")
    p = subprocess.run(
        [sys.executable, "-m", "bootfsm", *hook_argv()[1:], "--root", str(w.root)],
        env={**w.env(), **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "nothing to provision: not a GPU node (detect.gpu_node = no)" in summary(p)
    assert installer_calls(w) == []


def test_no_gpu_and_nothing_says_there_should_be_one_is_nothing_to_provision(
    make_world: MakeWorld,
) -> None:
    """IMDS off (not Azure, or unreachable) on a node without a GPU: 0, and why."""
    w = make_world("cpu-d4s", config_overrides={"detect": {"imds": False}})
    p = bootfsm(w, "run", "--no-start-kubelet")
    assert p.returncode == 0, p.stderr
    assert "nothing to provision: no NVIDIA GPU on PCI, and neither the VM size (IMDS) nor" in (
        p.stdout
    )


@pytest.mark.parametrize(
    ("how", "env"),
    [
        ("unit", None),  # the VM size (IMDS) says this node has GPUs
        ("hook", {}),  # and so does the provisioning script (GPU_NODE=true)
    ],
)
def test_a_gpu_vm_size_whose_gpus_left_the_bus_stays_22(
    make_world: MakeWorld, how: str, env: dict[str, str] | None
) -> None:
    w = make_world("h100-pcie", ("gpus-off-bus",))
    if env is None:
        p = bootfsm(w, "run", "--no-start-kubelet")
        assert p.returncode == 22, p.stdout
    else:
        p = run_caller(w, aks_env(w))
        assert p.returncode == 84, (p.stdout, p.stderr)
        assert (
            p.stdout.splitlines()[-1]
            == "caller: provisioning failed: exit 84 ERR_GPU_DRIVERS_START_FAIL"
        )
    assert "code=22 NO_GPU state=detect: no NVIDIA GPU" in p.stdout
    assert "should have one (VM size standard_nc40ads_h100_v5 has NVIDIA GPUs)" in p.stdout
    assert installer_calls(w) == []


def test_gpu_node_true_without_imds_and_without_gpus_is_22(make_world: MakeWorld) -> None:
    w = make_world("cpu-d4s", config_overrides={"detect": {"imds": False}})
    p = run_caller(w, aks_env(w))
    assert p.returncode == 84, (p.stdout, p.stderr)
    assert "code=22 NO_GPU state=detect: " in p.stdout
    assert "(detect.gpu_node = yes)" in p.stdout


def test_imds_without_the_metadata_header_is_refused_as_azure_does(
    make_world: MakeWorld,
) -> None:
    """The loopback IMDS is as strict as Azure's: no Metadata header, 400."""
    import urllib.request

    w = make_world("cpu-d4s")
    url = f"{w.mirror.url}/metadata/instance?api-version=2021-02-01"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url, timeout=5)
    assert err.value.code == 400
    assert json.loads(err.value.read()) == {
        "error": "Bad request. Required metadata header not specified"
    }


# ----------------------------------------------- 3. the caller's choices per VM size


def test_the_callers_choices_are_used_journaled_and_kept_for_the_next_boot(
    make_world: MakeWorld,
) -> None:
    """The script's driver (GPU_DV, NVIDIA_GPU_DRIVER_TYPE) is installed, each value's
    source is journaled, and the choices survive into the unit's run at the next boot."""
    w = make_world("h100-pcie")
    fresh_aks_node(w)
    p = run_caller(w, aks_env(w))
    assert p.returncode == 0, (p.stdout, p.stderr)
    [start] = [e for e in last_run(w) if e["event"] == "run.start"]
    assert start["hook"] is True
    sources = start["config_sources"]
    assert sources["driver.version"] == f"GPU_DV={DRIVER_VERSION}"
    assert sources["driver.kind"] == "NVIDIA_GPU_DRIVER_TYPE=cuda-lts"
    assert sources["detect.gpu_node"] == "GPU_NODE=true"
    assert sources["join.start_kubelet"] == "--hook"
    assert sources["sources.runfile_sha256"].endswith("etc/bootfsm/config.toml")
    [install] = installer_calls(w)
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == DRIVER_VERSION
    assert HOOK_CHOICES == "/" + DROPIN_FILE  # what `install-unit --after-hook` waits for
    dropin = (w.root / DROPIN_FILE).read_text()
    assert f'version = "{DRIVER_VERSION}"  # GPU_DV={DRIVER_VERSION}' in dropin
    assert 'gpu_node = "yes"  # GPU_NODE=true' in dropin
    assert "start_kubelet" not in dropin  # the unit's own flag decides that
    # the next boot: bootfsm.service's command line, no caller environment
    simulate_reboot(w.root)
    again = bootfsm(w, "run", "--no-start-kubelet")
    assert again.returncode == 0, again.stdout
    run = last_run(w)
    [start] = [e for e in run if e["event"] == "run.start"]
    assert start["config_sources"]["driver.version"].endswith(DROPIN_FILE)
    assert installer_calls(w) == [install]  # nothing rebuilt
    assert w.journals()[-1].parent == w.root / HOOK_JOURNALS  # the drop-in keeps log_dir


def test_another_driver_with_a_pin_is_installed_exactly(make_world: MakeWorld) -> None:
    """The script picks another version (as it does per VM size); the image pins that
    version's runfile in sources.runfile_pins: exactly it is fetched, built and loaded,
    and the configured driver's runfile is never asked for."""
    other = "580.126.09"
    w = make_world("h100-pcie")
    runfile = art.build_runfile(
        w.docroot / "tesla" / other,
        version=other,
        runfile_arch="x86_64",
        installer_source=standin_script("nvidia-installer", w.root),
        blob_bytes=1 << 16,
    )
    w.config_overrides = {
        "sources": {"runfile_pins": [f"cuda {other} x86_64 {art.sha256_file(runfile)}"]}
    }
    w.write_config()
    p = run_caller(w, aks_env(w, GPU_DRIVER_VERSION=other))
    assert p.returncode == 0, (p.stdout, p.stderr)
    gets = [e.path for e in w.mirror.log if e.path.endswith(".run")]
    assert gets == [f"/tesla/{other}/NVIDIA-Linux-x86_64-{other}.run"]
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == other
    [start] = [e for e in last_run(w) if e["event"] == "run.start"]
    assert start["config_sources"]["sources.runfile_sha256"] == (
        f"pins cuda {DRIVER_VERSION}, not the caller's cuda {other}"
    )


def test_an_unpinned_choice_fails_fast_and_installs_nothing(make_world: MakeWorld) -> None:
    """GPU_DV names a driver this image has no sha256 for: 19 in detect, before any
    download; the configured driver is not installed instead."""
    w = make_world("h100-pcie")
    p = run_caller(w, aks_env(w, GPU_DRIVER_VERSION="595.58.03", GPU_DRIVER_TYPE="grid-v20"))
    assert p.returncode == 84, (p.stdout, p.stderr)
    line = summary(p)
    assert "code=19 DRIVER_VERSION_UNPINNED state=detect: " in line
    assert '"grid 595.58.03 x86_64 <sha256>"' in line
    assert [e for e in w.mirror.log if not e.path.startswith("/metadata")] == []
    assert w.calls() == []


def test_a_bad_caller_value_is_config_invalid_naming_the_variable(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    p = run_caller(w, aks_env(w, GPU_DRIVER_TYPE="vgpu"))
    assert p.returncode == 84
    assert "code=10 CONFIG_INVALID" in summary(p)
    assert "NVIDIA_GPU_DRIVER_TYPE: expected one of cuda, cuda-lts, grid, grid-v20, got 'vgpu'" in (
        p.stdout
    )
    assert w.calls() == []


@pytest.mark.parametrize(
    ("sku", "flag", "started"),
    [
        ("h100-hgx", "false", True),  # NVSwitches on PCI: fabric manager runs anyway
        ("h100-pcie", "true", False),  # no NVSwitch: it is not started
    ],
)
def test_the_hardware_decides_fabric_manager_and_a_disagreement_is_journaled(
    make_world: MakeWorld, sku: str, flag: str, started: bool
) -> None:
    w = make_world(sku)
    p = run_caller(w, aks_env(w, GPU_NEEDS_FABRIC_MANAGER=flag))
    assert p.returncode == 0, (p.stdout, p.stderr)
    state = Node(w.root).unit_state("nvidia-fabricmanager.service")
    assert (state == "active") is started
    [warning] = [
        e for e in last_run(w) if e["event"] == "warning" and "fabric manager" in e["message"]
    ]
    yes_no = "yes" if flag == "true" else "no"
    assert warning["message"].startswith(f"detect.fabric_manager = {yes_no}, but the hardware")
    assert warning["message"].endswith("fabric manager: the hardware decides")


# ---------------------------------------------------------------- 4. MIG mode pending


def test_a_pending_mig_mode_is_success_and_a_reboot_request(make_world: MakeWorld) -> None:
    """An A100 in a VM leaves MIG mode pending: the hook ends 0, asks the caller for the
    reboot (cse_main.sh reboots at its end when REBOOTREQUIRED), the GPU step is
    otherwise complete; after the reboot bootfsm.service partitions the GPUs."""
    w = make_world("a100-ndv4")
    fresh_aks_node(w)
    p = run_caller(w, aks_env(w, MIG_NODE="true", GPU_INSTANCE_PROFILE="MIG1g"))
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.splitlines()[-1] == "reboot required, rebooting node in 1 minute"
    line = summary(p)
    assert "node provisioned; reboot required: MIG mode pending on 8 GPU(s)" in line
    assert (w.root / REBOOT_REQUEST).is_file()
    run = last_run(w)
    assert [e["event"] for e in run if e["event"] == "mig.reboot_requested"]
    assert [e["source"] for e in run if e["event"] == "transition"][-1] == "join"  # went on
    assert (w.root / DROPIN.lstrip("/")).is_file()
    # ensureKubelet then starts kubelet, whose Requires= starts bootfsm.service in this
    # same boot (its --after-hook condition is met now): it waits for the same reboot
    unit = bootfsm(w, "run", "--no-start-kubelet")
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "node provisioned; reboot required: MIG mode pending on 8 GPU(s)" in unit.stderr
    # the caller reboots; bootfsm.service runs at boot with the persisted MIG layout
    simulate_reboot(w.root)
    assert not (w.root / REBOOT_REQUEST).exists()
    again = bootfsm(w, "run", "--no-start-kubelet")
    assert again.returncode == 0, again.stdout
    ready = [e for e in last_run(w) if e["event"] == "mig.gpu_ready"]
    assert len(ready) == 8 and all(e["changed"] for e in ready)


# -------------------------------------------------------- 5. on-call finds it all


def test_journal_and_events_go_where_aks_collects_and_trace_finds_them(
    make_world: MakeWorld,
) -> None:
    w = make_world("h100-pcie")
    p = run_caller(w, aks_env(w))
    assert p.returncode == 0, (p.stdout, p.stderr)
    [journal] = (w.root / HOOK_JOURNALS).glob("run-*.jsonl")  # /var/log/azure/*/*
    run_id = events(journal)[0]["run_id"]
    files = sorted((w.root / EVENTS_DIR).glob("*.json"))  # /var/log/azure/*/*/*
    tasks = [json.loads(f.read_text())["TaskName"] for f in files]
    assert tasks[-1] == "bootfsm.run" and "bootfsm.detect" in tasks
    last = json.loads(files[-1].read_text())
    assert last["Message"].startswith("Completed: bootfsm ") and run_id in last["Message"]
    # the on-call engineer's plain `bootfsm trace` finds the hook's run
    trace = bootfsm(w, "trace")
    assert trace.returncode == 0, trace.stderr
    assert trace.stdout.startswith(f"run {run_id}")


# ------------------------------------------------------- 6. artifacts come with the image


def _bake(w: World) -> None:
    with no_gpus(w):
        baked = bake(
            load_config(w.config_path, required=True), BakeOptions(root=w.root, env=w.env())
        )
    assert baked.ok, baked.message


def test_a_baked_image_boots_through_the_hook_without_a_download(make_world: MakeWorld) -> None:
    """The AKS path: bake in the image build, then the hook at boot: not one request to
    a mirror (IMDS aside), no compile."""
    w = make_world("h100-hgx")
    _bake(w)
    fresh_aks_node(w)
    before = len(w.mirror.log)
    builds = len(installer_calls(w))
    p = run_caller(w, aks_env(w))
    assert p.returncode == 0, (p.stdout, p.stderr)
    after = [e.path for e in w.mirror.log[before:] if not e.path.startswith("/metadata")]
    assert after == []
    assert len(installer_calls(w)) == builds
    assert [e for e in last_run(w) if e["event"] == "fetch.offline"]


def test_a_boot_that_must_download_without_its_keyring_fails_fast(make_world: MakeWorld) -> None:
    """Not baked, and the toolkit repository's keyring is not installed: 18 before any
    download, the hint naming bake and prefetch."""
    w = make_world("h100-pcie")
    (w.root / "usr/share/keyrings/nvidia-container-toolkit-keyring.gpg").unlink()
    p = run_caller(w, aks_env(w))
    assert p.returncode == 84, (p.stdout, p.stderr)
    line = summary(p)
    assert "code=18 REPO_KEYRING_MISSING state=fetch: " in line
    assert "nvidia-container-toolkit-keyring.gpg is not installed" in line
    assert "hint: bake the image (`bootfsm bake`" in line and "bootfsm fetch --prefetch" in line
    assert [e for e in w.mirror.log if not e.path.startswith("/metadata")] == []
