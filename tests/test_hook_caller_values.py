"""The caller's values as AgentBaker sends them, and the VM sizes it sends them for
(issue 40 items 5 and 6).

Read at Azure/AgentBaker 06836ee2301e362039418c3a7ed0fe6004a641fd: cse_cmd.sh exports
``GPU_NODE``, ``GPU_DRIVER_VERSION``, ``CONFIG_GPU_DRIVER_IF_NEEDED``; cse_helpers.sh
``export GPU_DV="${GPU_DRIVER_VERSION:=}"`` (empty when the bootstrap config has none);
aks-node-controller/pkg/gpu/gpu.go gives the retired NCv1 sizes ``cuda-470.82.01``
(``Nvidia470CudaDriverVersion``); cse_config.sh ``ensureGPUDrivers`` runs
``configGPUDrivers`` when ``CONFIG_GPU_DRIVER_IF_NEEDED`` is true, else
``validateGPUDrivers``: ``nvidia-modprobe -u -c0`` and, only when that fails,
``configGPUDrivers``. Each test runs the hook line through tests/cse_caller.sh.
"""

from __future__ import annotations

import pytest

from bootfsm.sim.node import simulate_reboot
from bootfsm.sim.nodestate import Node
from bootfsm.sim.world import DRIVER_VERSION
from tests.conftest import MakeWorld, installer_calls
from tests.test_hook_callers import aks_env, bootfsm, fresh_aks_node, last_run, run_caller, summary

# ----------------------------------------------------- item 5: an AMD size, one image


def test_an_amd_vm_size_booting_the_shared_image_has_nothing_to_provision(
    make_world: MakeWorld,
) -> None:
    """bootfsm.service on an NGads V620 VM (an AMD GPU on PCI, no NVIDIA one): IMDS says
    Standard_NG8ads_V620_v1, whose ``_v1`` suffix once made it an NVIDIA size and the
    node 22 with kubelet never started. Now: 0, nothing to provision, nothing run."""
    w = make_world("amd-ngads-v620")
    p = bootfsm(w, "run", "--no-start-kubelet")
    assert p.returncode == 0, p.stdout
    assert (
        p.stdout.strip()
        .splitlines()[-1]
        .startswith(
            "bootfsm: OK code=0 OK state=done: nothing to provision: VM size "
            "standard_ng8ads_v620_v1 has no NVIDIA GPU in "
        )
    )
    run = last_run(w)
    [facts] = [e for e in run if e["event"] == "node.facts"]
    assert facts["vm_size"] == "standard_ng8ads_v620_v1"
    assert w.calls() == []
    assert (w.root / "sys/bus/pci/devices/0001:00:00.0/vendor").read_text().strip() == "0x1002"


def test_the_hook_on_an_amd_vm_size_goes_on_to_kubelet(make_world: MakeWorld) -> None:
    """AKS's provisioning script on the same VM: GPU_NODE=false (its EnableNvidia is false
    for an AMD size), no driver values: cse_main.sh does not enter its GPU block (the hook
    does not run, AgentBaker 06836ee), and ensureKubelet starts kubelet."""
    w = make_world("amd-ngads-v620")
    fresh_aks_node(w)
    env = aks_env(w, GPU_NODE="false", GPU_DRIVER_VERSION="", GPU_DRIVER_TYPE="")
    p = run_caller(w, env)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "bootfsm: " not in p.stdout and w.journals() == []
    assert installer_calls(w) == []
    assert Node(w.root).unit_state("kubelet.service") == "active"


# ------------------------------------------------------- item 6: the caller's values


def test_the_ncv1_driver_is_an_unsupported_branch_not_an_invalid_config(
    make_world: MakeWorld,
) -> None:
    """GPU_DV=cuda-470.82.01, as gpu.go gives the retired NCv1 sizes: 17
    DRIVER_BRANCH_UNSUPPORTED (CSE 84), nothing run, and the summary says why."""
    w = make_world("h100-pcie")
    p = run_caller(w, aks_env(w, GPU_DRIVER_VERSION="cuda-470.82.01", GPU_DRIVER_TYPE="cuda"))
    assert p.returncode == 84, (p.stdout, p.stderr)
    line = summary(p)
    assert "code=17 DRIVER_BRANCH_UNSUPPORTED" in line
    assert "GPU_DV=cuda-470.82.01: the R470 cuda driver AgentBaker pins for the retired NCv1" in (
        line
    )
    assert "CONFIG_INVALID" not in p.stdout + p.stderr
    assert w.calls() == []


def test_an_empty_gpu_dv_on_a_gpu_node_journals_the_configs_version(
    make_world: MakeWorld,
) -> None:
    """GPU_NODE=true and GPU_DV empty (cse_helpers.sh's ``${GPU_DRIVER_VERSION:=}`` when
    the bootstrap config named none): the config's driver is installed, and the run's
    journal says that is where the version came from; the drop-in does not pin it."""
    w = make_world("h100-pcie")
    fresh_aks_node(w)
    p = run_caller(w, aks_env(w, GPU_DRIVER_VERSION=""))
    assert p.returncode == 0, (p.stdout, p.stderr)
    [start] = [e for e in last_run(w) if e["event"] == "run.start"]
    assert start["config_sources"]["driver.version"] == (
        f"GPU_DV is empty (GPU_NODE=true): the config's {DRIVER_VERSION}"
    )
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == DRIVER_VERSION
    dropin = (w.root / "etc/bootfsm/config.d/50-provisioning-hook.toml").read_text()
    assert "version =" not in dropin


@pytest.mark.parametrize(("flag", "builds"), [("false", False), ("true", True)])
def test_validate_keeps_the_images_driver_that_loads(
    make_world: MakeWorld, flag: str, builds: bool
) -> None:
    """An image whose own driver (535.183.01) is built for the kernel: with
    CONFIG_GPU_DRIVER_IF_NEEDED=false it is checked (it loads) and kept, nothing built,
    as validateGPUDrivers does; with true the caller's driver is installed over it."""
    w = make_world("h100-pcie", ("stale-driver",))
    fresh_aks_node(w)
    p = run_caller(w, aks_env(w, CONFIG_GPU_DRIVER_IF_NEEDED=flag))
    assert p.returncode == 0, (p.stdout, p.stderr)
    loaded = (w.root / "sys/module/nvidia/version").read_text().strip()
    run = last_run(w)
    kept = [e for e in run if e["event"] == "driver.image_kept"]
    if builds:
        assert loaded == DRIVER_VERSION and len(installer_calls(w)) == 1
        assert kept == []
    else:
        assert loaded == "535.183.01" and installer_calls(w) == []
        assert [(e["version"], e["configured"]) for e in kept] == [("535.183.01", DRIVER_VERSION)]
    assert Node(w.root).unit_state("kubelet.service") == "active"


def test_validate_installs_when_the_images_module_does_not_load(make_world: MakeWorld) -> None:
    """CONFIG_GPU_DRIVER_IF_NEEDED=false on an image without a driver: nvidia-modprobe
    cannot load one, so the caller's driver is installed (configGPUDrivers), not 43."""
    w = make_world("h100-pcie")
    fresh_aks_node(w)
    p = run_caller(w, aks_env(w, CONFIG_GPU_DRIVER_IF_NEEDED="false"))
    assert p.returncode == 0, (p.stdout, p.stderr)
    run = last_run(w)
    [missing] = [e for e in run if e["event"] == "driver.image_not_loaded"]
    assert missing["install"] == DRIVER_VERSION
    assert len(installer_calls(w)) == 1
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == DRIVER_VERSION
    dropin = (w.root / "etc/bootfsm/config.d/50-provisioning-hook.toml").read_text()
    assert "keep_image_driver = true  # CONFIG_GPU_DRIVER_IF_NEEDED=false" in dropin
    # the next boot keeps the driver now loaded: nothing rebuilt
    simulate_reboot(w.root)
    again = bootfsm(w, "run", "--no-start-kubelet")
    assert again.returncode == 0, again.stdout
    assert len(installer_calls(w)) == 1
