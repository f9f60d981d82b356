"""driver.source = "ubuntu-signed" on simulated nodes: Canonical's signed module for the
running kernel and its exact user-space from an Ubuntu-archive-shaped mirror
(bootfsm/sim/artifacts_ubuntu.py: gpg-signed InRelease, Packages.xz, dpkg-deb packages
shaped like the real ones), installed by dpkg with no compile; 46 and 47 before any
package download; bake, then a boot into a newer kernel; uninstall and the real
`apt-get check`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.run.session import SessionResult
from bootfsm.sim.node import simulate_reboot
from bootfsm.sim.skus import SKUS
from bootfsm.sim.world import DRIVER_VERSION, World
from tests.conftest import MakeWorld, installer_calls, run_in_process
from tests.test_bake import _bake
from tests.test_imex_apt import REAL_APT_GET, apt_check
from tests.test_uninstall import REAL_DPKG, cli, env_of, query, real_dpkg_path

KERNEL = SKUS["h100-pcie"].kernel  # 5.15.0-1089-azure, Ubuntu 22.04 (jammy)
NEW_KERNEL = "5.15.0-1090-azure"
X = "580.196.07"
OLD = "580.178.04"
V = f"{X}-0ubuntu0.22.04.1"
MODULE = f"linux-modules-nvidia-580-server-open-{KERNEL}"
STACK = [
    "nvidia-firmware-580-server-580.196.07",
    "nvidia-kernel-common-580-server",
    MODULE,
    "libnvidia-compute-580-server",
    "nvidia-utils-580-server",
    "nvidia-compute-utils-580-server",
    "libnvidia-cfg1-580-server",
]


def _events(result: Any, name: str) -> list[dict[str, Any]]:
    assert result.journal is not None
    lines = Path(result.journal).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _debs_fetched(w: World) -> list[str]:
    return [e.path.rsplit("/", 1)[-1] for e in w.mirror.log if e.path.endswith(".deb")]


def _signed(make_world: MakeWorld, kernels: dict[str, str], *listed: str) -> World:
    return make_world("h100-pcie", ubuntu_kernels=kernels, ubuntu_userspace=listed)


def _ok(result: SessionResult) -> None:
    assert result.outcome.ok, (result.outcome.code, result.outcome.message)


def test_the_kernels_signed_module_and_its_userspace_install_with_no_compile(
    make_world: MakeWorld,
) -> None:
    w = _signed(make_world, {KERNEL: X})
    result = run_in_process(w)
    _ok(result)
    [done] = _events(result, "driver.signed_installed")
    assert done["installed"] == STACK  # dependencies first
    assert done["userspace"] == X and done["module"] == MODULE
    assert done["versions"]["libnvidia-compute-580-server"] == V
    assert installer_calls(w) == [] and not [c for c in w.calls() if c["cmd"] == "dkms"]
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == X
    # the caller asked for 580.159.04 (GPU_DV): one warning with both numbers
    [warn] = [e for e in _events(result, "warning") if "GPU_DV" in e["message"]]
    assert (warn["configured"], warn["installing"]) == (DRIVER_VERSION, X)
    # every index through its signed InRelease; the uncompressed Packages never asked for
    verified = {e["index"] for e in _events(result, "index.verified")}
    assert {"ubuntu_jammy_restricted", "ubuntu_jammy-updates_restricted"} <= verified
    assert not [e for e in w.mirror.log if e.path.endswith("binary-amd64/Packages")]
    again = run_in_process(w)  # run twice: everything satisfied, nothing installed again
    _ok(again)
    assert _events(again, "driver.signed_installed") == []


def test_userspace_no_longer_listed_fails_47_before_any_package(make_world: MakeWorld) -> None:
    w = _signed(make_world, {KERNEL: OLD}, X)
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.SIGNED_USERSPACE_MISSING, "fetch")
    assert KERNEL in result.outcome.message
    assert OLD in result.outcome.message and V in result.outcome.message
    assert _debs_fetched(w) == []
    assert len(_events(result, "state.failed")) == 1  # permanent: not retried


def test_no_module_for_the_kernel_fails_46_before_any_package(make_world: MakeWorld) -> None:
    w = _signed(make_world, {NEW_KERNEL: X})
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.SIGNED_MODULE_MISSING, "fetch")
    assert f"kernel {KERNEL}" in result.outcome.message
    assert NEW_KERNEL in result.outcome.message  # the kernel that has one
    assert _debs_fetched(w) == []


def test_a_node_without_a_base_dependency_fails_before_dpkg(make_world: MakeWorld) -> None:
    w = _signed(make_world, {KERNEL: X})
    status = w.root / "var/lib/dpkg/status"
    stanzas = status.read_text().split("\n\n")
    status.write_text("\n\n".join(s for s in stanzas if "ocl-icd-libopencl1" not in s))
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.DRIVER_INSTALL_FAILED, "driver")
    assert "ocl-icd-libopencl1" in result.outcome.message
    assert not [c for c in w.calls() if c["cmd"] == "dpkg" and "-i" in c["argv"]]


def test_bake_then_a_newer_kernel_installs_only_its_module(make_world: MakeWorld) -> None:
    w = _signed(make_world, {KERNEL: X, NEW_KERNEL: X})
    baked = _bake(w)
    assert baked.ok, baked.message
    assert installer_calls(w) == []
    boot = run_in_process(w)
    _ok(boot)
    [first] = _events(boot, "driver.signed_installed")
    assert first["installed"] == []  # the bake's packages serve: loaded, nothing installed
    _reboot_into(w, NEW_KERNEL)
    before = len(w.mirror.log)
    result = run_in_process(w)
    _ok(result)
    [done] = _events(result, "driver.signed_installed")
    new_module = f"linux-modules-nvidia-580-server-open-{NEW_KERNEL}"
    assert done["installed"] == [new_module]
    fetched = [e.path for e in w.mirror.log[before:] if e.path.endswith(".deb")]
    assert [p.rsplit("/", 1)[-1].split("_")[0] for p in fetched] == [new_module]
    assert installer_calls(w) == []


def test_uninstall_removes_every_package_and_apt_get_check_is_clean(
    make_world: MakeWorld, tmp_path: Path
) -> None:
    """With the real dpkg on the node: installed, `apt-get check` clean, uninstalled."""
    if REAL_DPKG is None or REAL_APT_GET is None:
        pytest.skip("the real dpkg and apt-get are not installed")
    w = _signed(make_world, {KERNEL: X})
    path = real_dpkg_path(w, tmp_path)
    result = run_in_process(w, env=env_of(w, path))
    _ok(result)
    for name in STACK:
        assert query(w, name).startswith("ii "), name
    assert query(w, MODULE) == "ii 5.15.0-1089.97+1"
    check = apt_check(w, "amd64")
    assert check.returncode == 0, check.stdout + check.stderr
    r = cli(w, path, "uninstall")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [n for n in STACK if query(w, n)] == []
    assert not (w.root / f"lib/modules/{KERNEL}/kernel/nvidia-580srv-open").exists()
    check = apt_check(w, "amd64")
    assert check.returncode == 0, check.stdout + check.stderr
    assert query(w, "libc6").startswith("ii")  # the node's own packages stay


def test_upgrade_in_place_takes_the_kernels_respin_and_apt_get_check_stays_clean(
    make_world: MakeWorld, tmp_path: Path
) -> None:
    """Canonical respins the running kernel's module against a newer user-space (as
    6.8.0-1074.83+1 was for 580.196.07) and the operator asks for it (driver.version, as
    for the runfile): the next run, same boot, reads the archive again, unloads the old
    module, installs the respin and its user-space with the real dpkg, and loads it."""
    if REAL_DPKG is None or REAL_APT_GET is None:
        pytest.skip("the real dpkg and apt-get are not installed")
    w = _signed(make_world, {KERNEL: OLD})
    path = real_dpkg_path(w, tmp_path)
    _ok(run_in_process(w, env=env_of(w, path)))
    assert query(w, "nvidia-utils-580-server") == f"ii {OLD}-0ubuntu0.22.04.1"
    assert query(w, MODULE) == "ii 5.15.0-1089.97+1"
    w.ubuntu_kernels, w.ubuntu_userspace = {KERNEL: X}, (OLD, X)
    w.publish_ubuntu_archive()
    before = len(w.mirror.log)
    unchanged = run_in_process(w, env=env_of(w, path))  # same config: cached, no network
    _ok(unchanged)
    assert [e.path for e in w.mirror.log[before:] if e.path.startswith("/ubuntu/")] == []
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == OLD
    w.config_overrides = {"driver": {"version": X}}
    w.write_config()
    n, seen = len(w.calls()), len(w.mirror.log)
    result = run_in_process(w, env=env_of(w, path))
    _ok(result)
    assert [e.path for e in w.mirror.log[seen:] if e.path.endswith("InRelease")]
    removed = [c["argv"] for c in w.calls()[n:] if c["cmd"] == "modprobe" and "-r" in c["argv"]]
    assert removed, "the old module was never unloaded"
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == X
    [done] = _events(result, "driver.signed_installed")
    assert MODULE in done["installed"] and "nvidia-utils-580-server" in done["installed"]
    assert query(w, MODULE) == "ii 5.15.0-1089.97+2"
    for name in STACK[1:]:
        if name != MODULE:
            assert query(w, name) == f"ii {V}", name
    check = apt_check(w, "amd64")
    assert check.returncode == 0, check.stdout + check.stderr


def test_debian_is_refused_clearly(make_world: MakeWorld) -> None:
    w = _signed(make_world, {KERNEL: X})
    (w.root / "etc/os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.UNSUPPORTED_OS, "detect")
    assert "ubuntu-signed" in result.outcome.message
    assert _debs_fetched(w) == []


def _reboot_into(w: World, kernel: str) -> None:
    """An unattended upgrade installed ``kernel``'s image; the node reboots into it."""
    status = w.root / "var/lib/dpkg/status"
    old = status.read_text().split(f"Package: linux-image-{KERNEL}\n", 1)[1].split("\n\n")[0]
    status.write_text(status.read_text() + f"\nPackage: linux-image-{kernel}\n{old}\n")
    (w.root / f"lib/modules/{kernel}").mkdir(parents=True, exist_ok=True)
    (w.root / "proc/sys/kernel/osrelease").write_text(f"{kernel}\n")
    simulate_reboot(w.root)


def test_prefetch_takes_both_kernels_then_boots_download_no_package(
    make_world: MakeWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    from bootfsm.cli import main

    w = _signed(make_world, {KERNEL: X, NEW_KERNEL: X})
    argv = ["fetch", "--prefetch", "--kernel", NEW_KERNEL, "--root", str(w.root)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("bootfsm: prefetch OK") == 2
    fetched = [p.split("_")[0] for p in _debs_fetched(w)]
    assert f"linux-modules-nvidia-580-server-open-{NEW_KERNEL}" in fetched and MODULE in fetched
    served = len(_debs_fetched(w))
    _ok(run_in_process(w))
    _reboot_into(w, NEW_KERNEL)
    result = run_in_process(w)
    _ok(result)
    [done] = _events(result, "driver.signed_installed")
    assert done["installed"] == [f"linux-modules-nvidia-580-server-open-{NEW_KERNEL}"]
    assert len(_debs_fetched(w)) == served  # both boots from the prefetched cache


def test_fabric_manager_and_nscq_come_from_multiverse_at_the_same_version(
    make_world: MakeWorld,
) -> None:
    """An NVSwitch HGX node: the driver state installs multiverse's fabric manager and
    NSCQ with the stack; the fabric state starts the packaged unit."""
    w = make_world("h100-hgx", ubuntu_kernels={KERNEL: X})
    result = run_in_process(w)
    _ok(result)
    [done] = _events(result, "driver.signed_installed")
    for name in ("nvidia-fabricmanager-580", "libnvidia-nscq-580"):
        assert done["versions"][name] == V
    [fm] = _events(result, "fabricmanager.installed")
    assert (fm["version"], fm["package"]) == (X, "nvidia-fabricmanager-580")
    assert not [e for e in w.mirror.log if "/redist/" in e.path]  # not NVIDIA's redist


def test_plan_lists_the_signed_stack_and_fails_fast_with_47(make_world: MakeWorld) -> None:
    import subprocess
    import sys

    def plan(w: World) -> dict[str, Any]:
        argv = [sys.executable, "-m", "bootfsm", "plan", "--json", "--root", str(w.root)]
        r = subprocess.run(argv, env=w.env(), capture_output=True, text=True, timeout=300)
        return dict(json.loads(r.stdout))

    ok = plan(_signed(make_world, {KERNEL: X}))
    assert [a["name"] for a in ok["artifacts"] if a["role"] == "signed"] == STACK
    stale = plan(_signed(make_world, {KERNEL: OLD}, X))
    assert (stale["fail_fast"]["state"], stale["fail_fast"]["code"]) == ("fetch", 47)


def test_nvlink5_is_refused_clearly_before_any_package(make_world: MakeWorld) -> None:
    """NVLSM is not in Ubuntu's archive: a B200 HGX node fails 55 naming it, no traceback."""
    w = make_world("b200-hgx", ubuntu_kernels={SKUS["b200-hgx"].kernel: X})
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.NVLSM_INSTALL_FAILED, "fetch")
    assert "NVLSM" in result.outcome.message
    assert _debs_fetched(w) == []
