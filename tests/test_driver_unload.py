"""Unloading a driver for an upgrade or a rebuild (issue 31 items 2 and 3).

Item 2: kmod's `modprobe -r nvidia_uvm` removes nvidia too when nothing else uses it
(modprobe(8), -r), and a later `modprobe -r nvidia` exits 0 without a word, or 1 with
"modprobe: FATAL: Module nvidia is not in kernel." when --first-time is in effect (here
through $MODPROBE_OPTIONS, which kmod prepends to every command line): the outcome is
judged by what is loaded afterwards, never by that exit status
(tests/sim/test_sim_modprobe_real.py checks the stand-in against the real kmod).

Item 3: nvidia-persistenced and fabric manager, which bootfsm started, hold /dev/nvidia*
open; they are stopped first, in the order NVIDIA's driver container stops them
(persistence daemon, then fabric manager with NVLSM), and come back with the new driver.
A holder bootfsm did not start keeps the run at 42, named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.sim.nodestate import Node
from bootfsm.sim.skus import STALE_DRIVER_VERSION
from bootfsm.sim.world import DRIVER_VERSION, World
from tests.conftest import MakeWorld, installer_calls, run_in_process

PERSISTENCED = "nvidia-persistenced.service"
FM = "nvidia-fabricmanager.service"


def _index(calls: list[dict[str, Any]], cmd: str, *argv: str) -> int:
    for i, c in enumerate(calls):
        if c["cmd"] == cmd and c["argv"][: len(argv)] == list(argv):
            return i
    raise AssertionError(f"{cmd} {' '.join(argv)} was never called")


def _events(journal: str | None, name: str) -> list[dict[str, Any]]:
    assert journal is not None
    lines = Path(journal).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _with_env(w: World, **extra: str) -> None:
    env = {**w.env(), **extra}
    w.env = lambda: env  # type: ignore[method-assign]  # run_in_process reads w.env()


def test_upgrade_is_judged_by_what_is_loaded_not_by_modprobes_exit(
    make_world: MakeWorld,
) -> None:
    w = make_world("h100-pcie", ("stale-driver",))
    w.config_overrides = {"driver": {"install": False, "persistenced": False}}
    w.write_config()
    assert run_in_process(w).outcome.ok  # the image's old driver, nvidia_uvm by bootfsm
    w.config_overrides = {"driver": {"persistenced": False}}
    w.write_config()
    _with_env(w, MODPROBE_OPTIONS="--first-time")  # kmod: fail on "nothing to do"
    n = len(w.calls())
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    removed = [(c["argv"], c["rc"]) for c in w.calls()[n:] if c["cmd"] == "modprobe"]
    # nvidia left with nvidia_uvm: no `modprobe -r nvidia` (which would fail "not in
    # kernel" here) is needed, and nothing about the old driver remains
    assert removed[0] == (["-r", "nvidia_uvm"], 0)
    assert (["-r", "nvidia"], 1) not in removed
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == DRIVER_VERSION
    [unloaded] = _events(result.journal, "driver.unloaded")
    assert unloaded["version"] == STALE_DRIVER_VERSION


def test_bootfsms_own_daemons_are_stopped_for_a_rebuild_and_come_back(
    make_world: MakeWorld,
) -> None:
    w = make_world("h100-hgx")
    assert run_in_process(w).outcome.ok  # open module; persistenced and fabric manager up
    node = Node(w.root)
    assert node.unit_state(PERSISTENCED) == node.unit_state(FM) == "active"
    w.config_overrides = {"driver": {"module_type": "proprietary"}}  # the marker says open
    w.write_config()
    n = len(w.calls())
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    calls = w.calls()[n:]
    stop_pd = _index(calls, "systemctl", "stop", PERSISTENCED)
    stop_fm = _index(calls, "systemctl", "stop", FM)
    unload = _index(calls, "modprobe", "-r", "nvidia_uvm")
    build = calls.index(installer_calls(w)[-1])
    load = _index(calls, "nvidia-modprobe", "-u", "-c0")
    start_pd = _index(calls, "systemctl", "start", PERSISTENCED)
    start_fm = _index(calls, "systemctl", "start", FM)
    # NVIDIA's driver container order: persistence daemon, fabric manager; the modules;
    # then the daemons again once the new module is loaded
    assert stop_pd < stop_fm < unload < build < load < start_pd < start_fm
    assert node.unit_state(PERSISTENCED) == node.unit_state(FM) == "active"
    assert "Open Kernel Module" not in (w.root / "proc/driver/nvidia/version").read_text()
    [stopped] = _events(result.journal, "driver.daemons_stopped")
    assert stopped["units"] == [PERSISTENCED, FM]


def test_a_process_bootfsm_did_not_start_keeps_42_and_is_named(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("stale-driver-in-use",))  # python3 (pid 4242) on /dev/nvidia0
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.REBOOT_REQUIRED, "driver")
    assert "held by python3 (pid 4242)" in result.outcome.message
    assert [c for c in w.calls() if c["cmd"] == "systemctl" and c["argv"][0] == "stop"] == []


def test_a_daemon_the_image_started_is_not_stopped_and_is_named(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("stale-driver",))
    node = Node(w.root)
    node.write(f"lib/systemd/system/{PERSISTENCED}", "[Service]\nType=forking\n")
    node.set_unit_state(PERSISTENCED, "active")  # the image's own, not bootfsm's
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.REBOOT_REQUIRED, "driver")
    assert f"held by {PERSISTENCED}" in result.outcome.message
    assert node.unit_state(PERSISTENCED) == "active"
    assert ["stop", PERSISTENCED] not in [c["argv"] for c in w.calls() if c["cmd"] == "systemctl"]
