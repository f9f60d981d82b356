"""Kernel patches on a running fleet (issue 31 item 4).

An unattended kernel upgrade runs DKMS's kernel hook (/etc/kernel/postinst.d/dkms:
`dkms autoinstall` for the new kernel), which builds every module registered with DKMS
(``AUTOINSTALL="yes"``, as nvidia-installer --dkms registers it). A boot whose marker
differs only in the kernel then takes that build when version, kind, arch and module
type match (aks-gpu's fast path: `dkms status` and `modinfo -k` for the running
kernel), and compiles only when they do not. A shared image baked by bootfsm keeps no
NVIDIA DKMS registration (Azure/aks-gpu#191), so a CPU node of that image builds
nothing at its kernel updates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bootfsm.sim.node import simulate_kernel_upgrade, simulate_reboot
from bootfsm.sim.world import DRIVER_VERSION, World
from tests.conftest import MakeWorld, installer_calls, no_gpus, run_in_process
from tests.test_bake import _bake

NEW_KERNEL = "5.15.0-1090-azure"


def _events(journal: Path | str | None, name: str) -> list[dict[str, Any]]:
    assert journal is not None
    lines = Path(journal).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _boot_new_kernel(w: World) -> None:
    (w.root / "proc/sys/kernel/osrelease").write_text(f"{NEW_KERNEL}\n")
    simulate_reboot(w.root)


def test_a_dkms_build_for_the_patched_kernel_is_used(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok  # compiled at boot: registered with DKMS
    assert simulate_kernel_upgrade(w.root, NEW_KERNEL) == [f"nvidia/{DRIVER_VERSION}"]
    _boot_new_kernel(w)
    n = len(installer_calls(w))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert len(installer_calls(w)) == n  # nothing compiled
    [decision] = _events(result.journal, "driver.prebaked")
    assert (decision["build"], decision["via"], decision["field"]) == (False, "dkms", "")
    assert NEW_KERNEL in decision["reason"] and decision["marker"]["kernel"] != NEW_KERNEL
    version = (w.root / "sys/module/nvidia/version").read_text().strip()
    assert version == DRIVER_VERSION
    # and the rerun in the same boot is satisfied outright
    again = run_in_process(w)
    skipped = {e["state"] for e in _events(again.journal, "state.skip")}
    assert "driver" in skipped and len(installer_calls(w)) == n


def test_a_kernel_dkms_did_not_build_for_is_compiled(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok
    (w.root / f"lib/modules/{NEW_KERNEL}/build").mkdir(parents=True)  # headers, no hook ran
    (w.root / f"lib/modules/{NEW_KERNEL}/build/Makefile").write_text("# headers\n")
    _boot_new_kernel(w)
    n = len(installer_calls(w))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [install] = installer_calls(w)[n:]
    assert f"--kernel-name={NEW_KERNEL}" in install["argv"]
    [decision] = _events(result.journal, "driver.prebaked")
    assert (decision["build"], decision["field"]) == (True, "kernel")


def test_a_dkms_build_of_another_module_type_is_not_taken(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok  # open
    assert simulate_kernel_upgrade(w.root, NEW_KERNEL) == [f"nvidia/{DRIVER_VERSION}"]
    ko = w.root / f"lib/modules/{NEW_KERNEL}/updates/dkms/nvidia.ko"
    ko.write_text(ko.read_text().replace("Dual MIT/GPL", "NVIDIA"))  # proprietary somehow
    _boot_new_kernel(w)
    n = len(installer_calls(w))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert len(installer_calls(w)) == n + 1
    [decision] = _events(result.journal, "driver.prebaked")
    assert (decision["build"], decision["field"]) == (True, "kernel")
    assert "not open" in decision["reason"]


def test_a_cpu_node_of_a_baked_image_builds_nothing_at_a_kernel_update(
    make_world: MakeWorld,
) -> None:
    """bake leaves no NVIDIA DKMS registration, so the kernel hook builds nothing on a
    node that never runs the driver; a GPU node of the same image boots the bake's
    module, and after a kernel update compiles at boot (then DKMS takes over)."""
    w = make_world("h100-pcie")
    with no_gpus(w):
        assert _bake(w).ok
        install = installer_calls(w)[0]["argv"]
        assert "--no-dkms" in install and "--dkms" not in install
        assert not (w.root / "var/lib/dkms/nvidia").exists()
        assert simulate_kernel_upgrade(w.root, NEW_KERNEL) == []  # the CPU node's hook
        assert not (w.root / f"lib/modules/{NEW_KERNEL}/updates/dkms").exists()
    # the same image on a GPU node, on the baked kernel: no compile
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert len(installer_calls(w)) == 1
    [decision] = _events(result.journal, "driver.prebaked")
    assert (decision["build"], decision["via"]) == (False, "marker")
