"""``CONFIG_GPU_DRIVER_IF_NEEDED=false`` as AgentBaker means it: the image's driver first.

Read at Azure/AgentBaker 06836ee2301e362039418c3a7ed0fe6004a641fd,
parts/linux/cloud-init/artifacts/cse_config.sh: ``ensureGPUDrivers`` runs
``validateGPUDrivers`` when ``CONFIG_GPU_DRIVER_IF_NEEDED`` is not true, and that is
``retrycmd_if_failure 24 5 25 nvidia-modprobe -u -c0 && echo "gpu driver loaded" ||
configGPUDrivers``: the caller's driver (``GPU_DV``) is looked at only when the image's
module does not load. So an image whose driver loads needs nothing of ``GPU_DV``: no pin,
no download, no mirror at all. Each test runs the hook line through tests/cse_caller.sh.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bootfsm.sim.node import simulate_reboot
from bootfsm.sim.nodestate import Node
from bootfsm.sim.world import DRIVER_VERSION, World
from tests.conftest import MakeWorld, installer_calls
from tests.test_hook_callers import (
    aks_env,
    bootfsm,
    fresh_aks_node,
    last_run,
    run_caller,
    summary,
)

IMAGE_DRIVER = "535.183.01"  # the "stale-driver" image's own driver (bootfsm/sim/skus.py)
UNPINNED = "595.58.03"  # a GPU_DV the node's config has no sha256 for


def _toolkit_in_image(w: World) -> None:
    """The image build installed NVIDIA's container toolkit (dpkg -i of the toolkit debs,
    as a GPU VHD carries it), so a run that keeps the image's driver needs nothing."""
    debs = sorted(str(p) for p in (w.docroot / "toolkit").glob("*/*.deb"))
    assert len(debs) == 4, debs
    p = subprocess.run(
        ["dpkg", "-i", *debs], env=w.env(), capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, (p.stdout, p.stderr)


def _unload_image_driver(w: World) -> None:
    """The image's module built but not loaded when CSE runs (nothing autoloaded it)."""
    p = subprocess.run(
        ["modprobe", "-r", "nvidia"], env=w.env(), capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert not (w.root / "sys/module/nvidia").exists()


def _downloads(w: World) -> list[str]:
    """Every request the mirror saw but IMDS's (the caller and detect read the VM tags)."""
    return [e.path for e in w.mirror.log if not e.path.startswith("/metadata")]


def _events(w: World, name: str) -> list[dict[str, Any]]:
    return [e for e in last_run(w) if e["event"] == name]


def _commands(w: World, cmd: str, state: str) -> list[dict[str, Any]]:
    return [e for e in _events(w, "command") if e["argv"][0] == cmd and e["state"] == state]


def _skip(w: World, state: str) -> str:
    [skip] = [e for e in _events(w, "state.skip") if e["state"] == state]
    return str(skip["reason"])


def _kept_node(make_world: MakeWorld, *, loaded: bool = True) -> World:
    w = make_world("h100-pcie", ("stale-driver",))
    _toolkit_in_image(w)
    if not loaded:
        _unload_image_driver(w)
    fresh_aks_node(w)
    w.mirror.log.clear()
    return w


def _unpinned_keep_env(w: World) -> dict[str, str]:
    return aks_env(w, CONFIG_GPU_DRIVER_IF_NEEDED="false", GPU_DRIVER_VERSION=UNPINNED)


def _assert_kept(w: World, p: subprocess.CompletedProcess[str], how: str) -> None:
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == IMAGE_DRIVER
    assert installer_calls(w) == []
    [kept] = _events(w, "driver.image_kept")
    assert (kept["version"], kept["configured"], kept["how"]) == (IMAGE_DRIVER, UNPINNED, how)
    assert _skip(w, "fetch") == (
        f"driver.keep_image_driver: the image's driver {IMAGE_DRIVER} is kept (it loads, as "
        f"validateGPUDrivers checks), so nothing of driver {UNPINNED} is fetched; the "
        "container toolkit is in place"
    )
    assert _events(w, "driver.prebaked") == []  # no build decision for GPU_DV at all
    assert not [e for e in last_run(w) if e["event"].startswith("artifact.")]
    assert Node(w.root).unit_state("kubelet.service") == "active"  # ensureKubelet's


def test_an_unpinned_gpu_dv_keeps_the_loaded_image_driver_without_a_download(
    make_world: MakeWorld,
) -> None:
    """validateGPUDrivers on an image whose 535 driver is loaded, with a GPU_DV the image
    pins no sha256 for: CSE ends 0, the mirror sees no request, the journal says the
    image's driver was kept and why fetch did nothing, and ensureKubelet starts kubelet
    (before: 19 DRIVER_VERSION_UNPINNED in detect, CSE 84)."""
    w = _kept_node(make_world)
    p = run_caller(w, _unpinned_keep_env(w))
    _assert_kept(w, p, "loaded at boot")
    assert _downloads(w) == []
    assert _commands(w, "nvidia-modprobe", "detect") == []  # loaded: nothing to try
    # the next boot (bootfsm.service, the drop-in keeps GPU_DV and the key) keeps it too
    simulate_reboot(w.root)
    again = bootfsm(w, "run", "--no-start-kubelet")
    assert again.returncode == 0, again.stdout
    assert _downloads(w) == [] and installer_calls(w) == []
    assert _events(w, "driver.image_kept")[0]["configured"] == UNPINNED


def test_the_image_driver_that_loads_with_nvidia_modprobe_is_kept(make_world: MakeWorld) -> None:
    """The image's module is built but not loaded: nvidia-modprobe -u -c0 (the check
    validateGPUDrivers makes) loads it, once, in detect; it is kept, nothing fetched."""
    w = _kept_node(make_world, loaded=False)
    p = run_caller(w, _unpinned_keep_env(w))
    _assert_kept(w, p, "loaded by nvidia-modprobe -u -c0")
    assert _downloads(w) == []
    assert [e["argv"] for e in _commands(w, "nvidia-modprobe", "detect")] == [
        ["nvidia-modprobe", "-u", "-c0"]
    ]
    assert _events(w, "driver.image_kept")[0]["state"] == "detect"
    loaded = (w.root / "run/bootfsm/driver-loaded").read_text().split()
    assert "nvidia" in loaded  # bootfsm's command loaded it: recorded as bootfsm's


def test_an_unreachable_mirror_does_not_matter_when_the_image_driver_is_kept(
    make_world: MakeWorld,
) -> None:
    """Every source points at a port nothing listens on: the kept image driver needs
    none of them, so CSE still ends 0."""
    w = make_world("h100-pcie", ("stale-driver",))
    _toolkit_in_image(w)
    dead = "http://127.0.0.1:9"
    w.config_overrides = {
        "sources": {
            "runfile_base": f"{dead}/tesla",
            "redist_base": f"{dead}/redist",
            "cuda_repo": f"{dead}/cuda",
            "toolkit_repo": f"{dead}/toolkit/{{debian_arch}}",
            "grid_runfile_url": f"{dead}/grid/x.run",
        }
    }
    w.write_config()
    fresh_aks_node(w)
    p = run_caller(w, _unpinned_keep_env(w))
    _assert_kept(w, p, "loaded at boot")


def test_a_kept_image_driver_without_the_toolkit_fetches_the_toolkit_alone(
    make_world: MakeWorld,
) -> None:
    """The image ships a driver but no container toolkit: fetch reads the toolkit's
    index and its four debs, and nothing of GPU_DV (no runfile, no pin needed)."""
    w = make_world("h100-pcie", ("stale-driver",))
    fresh_aks_node(w)
    w.mirror.log.clear()
    p = run_caller(w, _unpinned_keep_env(w))
    assert p.returncode == 0, (p.stdout, p.stderr)
    got = _downloads(w)
    assert got and all(path.startswith("/toolkit/") for path in got), got
    debs = [path.rsplit("/", 1)[-1].split("_", 1)[0] for path in got if path.endswith(".deb")]
    assert sorted(debs) == [  # sources.toolkit_packages' default
        "libnvidia-container-tools",
        "libnvidia-container1",
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
    ]
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == IMAGE_DRIVER
    assert installer_calls(w) == []


def test_an_image_driver_that_does_not_load_still_needs_the_pin(make_world: MakeWorld) -> None:
    """The same caller on an image with no driver: nvidia-modprobe loads nothing, so
    GPU_DV is what would be installed, and its missing pin ends the run as before: 19
    in detect (CSE 84), nothing downloaded, nothing installed."""
    w = make_world("h100-pcie")
    fresh_aks_node(w)
    w.mirror.log.clear()
    p = run_caller(w, _unpinned_keep_env(w))
    assert p.returncode == 84, (p.stdout, p.stderr)
    assert "code=19 DRIVER_VERSION_UNPINNED state=detect: " in summary(p)
    [missing] = _events(w, "driver.image_not_loaded")
    assert missing["install"] == UNPINNED
    assert _events(w, "driver.image_kept") == []
    assert _downloads(w) == []
    assert installer_calls(w) == []


def test_an_image_driver_that_does_not_load_installs_the_pinned_gpu_dv(
    make_world: MakeWorld,
) -> None:
    """...and with GPU_DV pinned (the configured driver), it is fetched and built."""
    w = make_world("h100-pcie")
    fresh_aks_node(w)
    p = run_caller(w, aks_env(w, CONFIG_GPU_DRIVER_IF_NEEDED="false"))
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert [g for g in _downloads(w) if g.endswith(".run")] == [
        f"/tesla/{DRIVER_VERSION}/NVIDIA-Linux-x86_64-{DRIVER_VERSION}.run"
    ]
    assert len(installer_calls(w)) == 1


def _plan(w: World) -> tuple[int, dict[str, Any]]:
    p = subprocess.run(
        [sys.executable, "-m", "bootfsm", "plan", "--json", "--root", str(w.root)],
        env=w.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return p.returncode, json.loads(p.stdout)


def _keep_unpinned_config(w: World) -> None:
    w.config_overrides = {
        "driver": {"keep_image_driver": True, "version": UNPINNED},
        "sources": {"runfile_sha256": ""},
    }
    w.write_config()


def test_plan_says_a_loaded_image_driver_is_kept_and_nothing_is_fetched(
    make_world: MakeWorld,
) -> None:
    """`bootfsm plan` on the node with the loaded image driver: no fail-fast 19, fetch
    and driver satisfied, no index or artifact of driver.version."""
    w = make_world("h100-pcie", ("stale-driver",))
    _toolkit_in_image(w)
    _keep_unpinned_config(w)
    rc, plan = _plan(w)
    assert rc == 0, plan
    assert plan["fail_fast"] is None
    assert plan["image_driver"] == {"keep": True, "kept": IMAGE_DRIVER}
    states = {s["state"]: s["would_run"] for s in plan["states"]}
    assert states["fetch"] is False
    assert list(plan["indexes"]) == ["toolkit_packages"]
    assert all(a["role"] == "toolkit" for a in plan["artifacts"])
    text = bootfsm(w, "plan").stdout
    assert f"image driver: {IMAGE_DRIVER} loaded, kept (driver.keep_image_driver)\n" in text
    assert "  fetch    skip (satisfied)\n" in text and "would fail" not in text


def test_plan_says_the_pin_matters_only_if_the_image_driver_does_not_load(
    make_world: MakeWorld,
) -> None:
    """Not loaded yet: plan loads nothing (read-only), so it says the run checks the
    image's driver first and fails 19 only when that does not load."""
    w = make_world("h100-pcie", ("stale-driver",))
    _unload_image_driver(w)
    _keep_unpinned_config(w)
    rc, plan = _plan(w)
    assert rc == 19, plan
    assert plan["image_driver"] == {"keep": True, "kept": None}
    text = bootfsm(w, "plan").stdout
    assert "image driver: none loaded; the run tries nvidia-modprobe -u -c0 first" in text
    assert plan["fail_fast"]["message"].startswith(
        "if the image's driver does not load (the run tries nvidia-modprobe -u -c0 first): "
        f"no sha256 is pinned for the cuda driver {UNPINNED} runfile"
    )


def test_an_nvswitch_node_installs_gpu_dv_since_its_fabric_manager_must_match(
    make_world: MakeWorld,
) -> None:
    """HGX H100 (NVSwitch): fabric manager must be the driver's exact version and bootfsm
    installs it for GPU_DV alone, so the image's 535 driver is not kept: the journal
    says why, GPU_DV is built, and its fabric manager runs beside it."""
    w = make_world("h100-hgx", ("stale-driver",))
    fresh_aks_node(w)
    p = run_caller(w, aks_env(w, CONFIG_GPU_DRIVER_IF_NEEDED="false"))
    assert p.returncode == 0, (p.stdout, p.stderr)
    [why] = _events(w, "driver.image_not_kept")
    assert why["reason"] == (
        "this node's fabric manager must match the driver exactly and bootfsm installs it "
        f"for driver.version ({DRIVER_VERSION}) only, so that driver is installed"
    )
    assert _events(w, "driver.image_kept") == []
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == DRIVER_VERSION
    assert len(installer_calls(w)) == 1
    assert Node(w.root).unit_state("nvidia-fabricmanager.service") == "active"
