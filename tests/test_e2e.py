"""End to end on simulated nodes: every SKU boots, every fault has its documented outcome."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.observe.trace import load_run
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, installer_calls, run_in_process


def _cmds(w: World, name: str) -> list[list[str]]:
    return [c["argv"] for c in w.calls() if c["cmd"] == name]


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _fm_touched(w: World) -> bool:
    fm = "nvidia-fabricmanager"
    acts = {"enable", "start", "restart"}
    starts = [a for a in _cmds(w, "systemctl") if any(fm in x for x in a) and acts & set(a)]
    return bool(starts) or (w.root / "usr/bin/nv-fabricmanager").exists()


@pytest.mark.parametrize("sku", ["gb200", "gb300"])
def test_arm64_boots_with_imex_masked_and_never_fabric_manager(
    make_world: MakeWorld, sku: str
) -> None:
    w = make_world(sku)
    result = run_in_process(w)
    assert result.outcome.code is Code.OK, result.outcome.message
    assert not _fm_touched(w)
    assert not any("fabricmanager" in e.get("url", "") for e in _events(result.journal))  # type: ignore[arg-type]
    assert (w.root / "usr/bin/nvidia-imex").exists()
    unit = w.root / "etc/systemd/system/nvidia-imex.service"
    assert unit.is_symlink() and os.readlink(unit) == "/dev/null"  # masked
    # nvidia-imex without --force-depends: dpkg knows the runfile's nvidia-modprobe first
    installs = [c for c in _cmds(w, "dpkg") if c[0] == "-i"]
    assert [Path(c[-1]).name.split("_")[0] for c in installs[-2:]] == [
        "nvidia-modprobe",
        "nvidia-imex",
    ]
    assert not any(a.startswith("--force") for a in installs[-1])
    assert (w.root / "var/lib/bootfsm/ready").exists()


def test_h100_hgx_installs_and_starts_fabric_manager(make_world: MakeWorld) -> None:
    w = make_world("h100-hgx")
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert (w.root / "usr/bin/nv-fabricmanager").exists()
    assert (w.root / "lib/systemd/system/nvidia-fabricmanager.service").exists()
    assert ["start", "nvidia-fabricmanager.service"] in _cmds(w, "systemctl")
    wants = w.root / "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service"
    assert wants.is_symlink()
    assert not (w.root / "usr/bin/nvidia-imex").exists()


def test_b200_nvlink5_starts_through_the_unit(make_world: MakeWorld) -> None:
    """The archive's unit runs the start script (precheck, start); bootfsm starts the
    unit, after ib_umad (tests/test_fabric_nvlink5.py has the details)."""
    w = make_world("b200-hgx")
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert _cmds(w, "nvidia-fabricmanager-start.sh") == []
    assert ["start", "nvidia-fabricmanager.service"] in _cmds(w, "systemctl")
    assert (
        "--kernel-module-type=open" in installer_calls(w)[0]["argv"]
    )  # Blackwell: the installer recommends open


def test_h100_pcie_leaves_fabric_manager_off(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert not _fm_touched(w)
    guards = [
        e
        for e in _events(result.journal)  # type: ignore[arg-type]
        if e["event"] == "transition" and e["guards"] and e["source"] == "driver"
    ]
    assert guards[0]["dest"] == "verify" and guards[0]["guards"]["no_nvlink_fabric"] is True


def test_stale_fabric_manager_unit_is_disabled_on_pcie(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("stale-fabricmanager-unit",))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert ["disable", "--now", "nvidia-fabricmanager.service"] in _cmds(w, "systemctl")
    assert not (
        w.root / "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service"
    ).exists()


def test_grid_on_arm64_fails_in_detect_before_any_download(make_world: MakeWorld) -> None:
    w = make_world("gb300", driver_kind="grid")
    result = run_in_process(w)
    assert result.outcome.code is Code.DRIVER_KIND_UNSUPPORTED_ON_ARCH
    assert result.outcome.state == "detect"
    downloads = [e for e in w.mirror.log if not e.path.startswith(("/metadata", "/healthz"))]
    assert downloads == []
    assert installer_calls(w) == [] and w.calls() == []


FAULTS = [
    # (fault, sku, code, state)
    ("artifact-404", "gb300", Code.ARTIFACT_NOT_FOUND, "fetch"),
    ("checksum-mismatch", "gb300", Code.CHECKSUM_MISMATCH, "fetch"),
    ("dpkg-lock-held", "gb300", Code.DPKG_LOCK_TIMEOUT, "driver"),
    ("installer-fails", "h100-pcie", Code.DRIVER_INSTALL_FAILED, "driver"),
    ("installer-hangs", "h100-pcie", Code.DRIVER_INSTALL_TIMEOUT, "driver"),
    ("inforom-corrupted", "h100-pcie", Code.INFOROM_CORRUPTED, "driver"),
    ("fabric-in-progress-forever", "h100-hgx", Code.FABRIC_NOT_READY, "verify"),
    ("kubelet-unhealthy", "h100-pcie", Code.KUBELET_NOT_HEALTHY, "join"),
    ("stale-driver-in-use", "h100-pcie", Code.REBOOT_REQUIRED, "driver"),
    ("gpu-missing", "h100-pcie", Code.GPU_COUNT_MISMATCH, "verify"),
    ("containerd-restart-fails", "h100-pcie", Code.CONTAINERD_RESTART_FAILED, "join"),
    ("kernel-headers-missing", "h100-pcie", Code.KERNEL_HEADERS_MISSING, "detect"),
    ("secure-boot", "h100-pcie", Code.SECURE_BOOT_NEEDS_SIGNED_MODULE, "detect"),
]


@pytest.mark.parametrize(("fault", "sku", "code", "state"), FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_gives_its_documented_outcome(
    make_world: MakeWorld, fault: str, sku: str, code: Code, state: str
) -> None:
    overrides = {"driver": {"command_timeout": 2.0}} if fault == "installer-hangs" else {}
    w = make_world(sku, (fault,), config_overrides=overrides)
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (code, state), result.outcome.message
    report = load_run(result.journal)  # type: ignore[arg-type]
    assert report.outcome == "failed" and report.code == int(code) and report.failed_state == state


def test_permanent_fetch_failures_are_not_retried(make_world: MakeWorld) -> None:
    w = make_world("gb300", ("artifact-404",))
    run_in_process(w)
    runfile_gets = [e for e in w.mirror.log if e.path.endswith(".run")]
    assert len(runfile_gets) == 1
    assert installer_calls(w) == []


@pytest.mark.parametrize("fault", ["http-503x3", "drop-mid-body"])
def test_transient_faults_recover_and_the_journal_shows_attempts(
    make_world: MakeWorld, fault: str
) -> None:
    w = make_world("gb300", (fault,))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    events = _events(result.journal)  # type: ignore[arg-type]
    retries = [e for e in events if e["event"] == "state.retry" and e["state"] == "fetch"]
    expected = 3 if fault == "http-503x3" else 1
    assert len(retries) == expected
    assert all(e["code"] == "DOWNLOAD_RETRIES_EXHAUSTED" for e in retries)
    fetched = next(
        e for e in events if e["event"] == "artifact.fetched" and e["artifact"] == "runfile"
    )
    if fault == "drop-mid-body":
        assert fetched["resumed_bytes"] > 0  # the second attempt resumed, not restarted


def test_stale_driver_is_unloaded_then_replaced(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("stale-driver",))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert ["-r", "nvidia"] in _cmds(w, "modprobe")
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == "580.159.04"


def test_rerun_on_a_provisioned_node_invokes_no_installer(make_world: MakeWorld) -> None:
    w = make_world("h100-hgx")
    assert run_in_process(w).outcome.ok
    before = len(w.calls())
    second = run_in_process(w)
    assert second.outcome.ok
    new = w.calls()[before:]
    assert [c for c in new if c["cmd"] in ("nvidia-installer", "dpkg", "update-initramfs")] == []
    skipped = [e["state"] for e in _events(second.journal) if e["event"] == "state.skip"]  # type: ignore[arg-type]
    assert skipped == ["fetch", "driver", "fabric", "verify", "join"]
    # each postcondition asks its own question, and only reads: one `systemctl show` of
    # every daemon each for driver's (persistenced), fabric's and verify's (the fabric
    # manager), one `dpkg-query` for driver's packages
    asked = [" ".join(c["argv"]) for c in new if c["cmd"] == "systemctl"]
    show = (
        "show -p Id -p UnitFileState -p ActiveState nvidia-persistenced.service"
        " nvidia-fabricmanager.service nvidia-imex.service containerd.service kubelet.service"
    )
    assert asked == [show] * 3
    # verify's three: the plain table (the one that reports a corrupted infoROM), -q -x,
    # and the linker cache (only the loaded driver's libraries resolve)
    assert [c["cmd"] for c in new] == [
        "dpkg-query", "dkms", *["systemctl"] * 3, *["nvidia-smi"] * 2, "ldconfig"
    ]  # fmt: skip


def test_gb300_rerun_asks_nine_commands(make_world: MakeWorld) -> None:
    """Grace-Blackwell: driver's toolkit question and imex's nvidia-imex question are a
    `dpkg-query` each; the persistence daemon (driver), the fabric manager that must stay
    off (the transition to imex) and the masked IMEX unit (imex) a `systemctl show` each."""
    w = make_world("gb300")
    assert run_in_process(w).outcome.ok
    before = len(w.calls())
    assert run_in_process(w).outcome.ok
    new = w.calls()[before:]
    # verify's three: the plain table (the one that reports a corrupted infoROM), -q -x,
    # and the linker cache (`ldconfig -p`: only the loaded driver's libraries resolve)
    assert [c["cmd"] for c in new] == [
        "dpkg-query", "dkms", "systemctl", "systemctl", "dpkg-query", "systemctl",
        *["nvidia-smi"] * 2, "ldconfig",
    ]  # fmt: skip
    query = [c["argv"] for c in new if c["cmd"] == "dpkg-query"][-1]
    assert "nvidia-imex" in query and "nvidia-container-toolkit" in query


def _journal_has(w: World, event: str) -> bool:
    for j in w.journals():
        for line in j.read_text().splitlines():
            if f'"event": "{event}"' in line:
                return True
    return False


def test_sigkill_in_the_middle_of_driver_then_rerun_ends_done(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", compile_seconds=30.0)
    proc = subprocess.Popen(
        w.argv(),
        env=w.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _journal_has(w, "driver.install"):
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail("the installer never started")
            time.sleep(0.05)
        time.sleep(0.5)  # the DKMS build is under way
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    killed = load_run(w.journals()[-1])
    assert killed.outcome == "running" and killed.spans[-1].state == "driver"
    assert not (w.root / "var/lib/dkms/nvidia").exists()  # the build never finished
    sim = json.loads((w.root / "var/lib/bootfsm-sim/sim.json").read_text())
    sim["compile_seconds"] = 0.05
    (w.root / "var/lib/bootfsm-sim/sim.json").write_text(json.dumps(sim))
    rerun = w.run_cli()
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert len(w.journals()) == 2


def test_global_deadline_names_the_running_state(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", compile_seconds=20.0, config_overrides={"run": {"deadline": 3.0}})
    result = run_in_process(w)
    assert result.outcome.code is Code.DEADLINE_EXCEEDED
    assert result.outcome.state == "driver"
    assert "global deadline of 3 s ran out in state driver" in result.outcome.message
    assert load_run(result.journal).duration_s < 10  # type: ignore[arg-type,operator]
