"""Killing bootfsm while nvidia-installer runs (issue 11 item 10).

A real `bootfsm run` child, in a process group of its own, is SIGKILLed as a group (what
systemd's KillMode=control-group or an operator's `kill -- -PGID` does) while the
installer stand-in hangs. Commands run in their own session, so the group kill does not
reach them; the parent-death signal does. The rerun then finds no installer beside its
own, and `trace --history` keeps the state the killed run was in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from bootfsm.sim.world import World
from tests.conftest import MakeWorld
from tests.test_lock_signals import WAIT_S, catches_sigterm, clear_faults, node_procs, wait_for


def _gone(w: World, pids: list[int], within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not any(p in node_procs(w, "--dkms") for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_group_kill_mid_install_leaves_no_installer_and_history_keeps_the_state(
    make_world: MakeWorld,
) -> None:
    w = make_world(
        "h100-pcie", ("installer-hangs",), config_overrides={"driver": {"command_timeout": 300}}
    )
    run = subprocess.Popen(
        w.argv(),
        env=w.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # bootfsm leads a group of its own, as under systemd
    )
    try:
        hung = wait_for(
            "installer hanging",
            lambda: [p for p in node_procs(w, "--dkms") if catches_sigterm(p)],
            None,
        )
        os.killpg(run.pid, signal.SIGKILL)
        assert run.wait(timeout=WAIT_S) == -signal.SIGKILL
    finally:
        if run.poll() is None:
            run.kill()
    assert _gone(w, hung), f"installer {hung} outlived the killed bootfsm"

    history = subprocess.run(
        [sys.executable, "-m", "bootfsm", "trace", "--root", str(w.root), "--history", "--json"],
        env=w.env(),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    runs = json.loads(history.stdout)["runs"]
    assert [(r["outcome"], r["state"]) for r in runs] == [("killed", "driver")], runs

    clear_faults(w, "installer-hangs")
    rerun = w.run_cli("--wait-lock", "0")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr[-2000:]
    assert node_procs(w, "--dkms") == []
