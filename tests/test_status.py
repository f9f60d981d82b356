"""`bootfsm status [--wait --timeout]`: one exit code per situation, never an endless wait."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bootfsm.cli import main
from bootfsm.commands.status import DONE, KILLED, NEVER_STARTED, RUNNING
from bootfsm.core.codes import Code
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, run_in_process


def _status(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> tuple[int, Any]:
    rc = main(["status", "--root", str(root), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def _status_child(w: World, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "bootfsm", "status", "--root", str(w.root), *extra]
    return subprocess.Popen(argv, env=w.env(), stdout=subprocess.PIPE, text=True)


def test_exit_codes_are_distinct_and_documented(capsys: pytest.CaptureFixture[str]) -> None:
    """3, 4, 5 mean nothing in the exit-code table nor in the reserved ranges; --help says."""
    ours = {RUNNING, NEVER_STARTED, KILLED}
    assert DONE == 0 and len(ours) == 3
    assert not ours & {int(c) for c in Code}
    assert not ours & {1, 2, *range(64, 79), *range(124, 166), *range(200, 245), 255}
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    text = capsys.readouterr().out
    for code in (0, 3, 4, 5):
        assert f"\n  {code}  " in text
    assert "10-110" in text


def test_never_started(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No checkpoint, no journal: 4 at once, and 4 after --wait gives up (bounded)."""
    rc, data = _status(capsys, tmp_path)
    assert rc == NEVER_STARTED and data["status"] == "never-started" and not data["timed_out"]
    rc, data = _status(capsys, tmp_path, "--wait", "--timeout", "0.3")
    assert rc == NEVER_STARTED and data["timed_out"] and data["waited_s"] >= 0.3


def test_wait_until_a_run_succeeds(
    make_world: MakeWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    """A waiter started with the run returns 0 when the node is provisioned."""
    w = make_world("h100-pcie")
    waiter = _status_child(w, "--wait", "--timeout", "120")
    run = subprocess.run(w.argv("--quiet"), env=w.env(), capture_output=True, timeout=120)
    assert run.returncode == 0
    out, _ = waiter.communicate(timeout=60)
    assert waiter.returncode == DONE, out
    assert "done: run" in out
    rc, data = _status(capsys, w.root)
    assert rc == DONE and data["status"] == "done" and data["code"] == 0


def test_failed_run_exits_with_its_own_code(
    make_world: MakeWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 404 ends the run with 30; status says so, with the message and the hint."""
    w = make_world("h100-pcie", ("artifact-404",))
    result = run_in_process(w)
    rc, data = _status(capsys, w.root, "--wait", "--timeout", "5")
    assert rc == 30 == int(result.outcome.code)
    assert data["status"] == "failed" and data["state"] == "fetch"
    assert data["run_id"] == result.run_id and "HTTP 404" in data["message"] and data["hint"]
    assert not data["timed_out"]
    assert main(["status", "--root", str(w.root)]) == 30
    assert "code=30 ARTIFACT_NOT_FOUND state=fetch" in capsys.readouterr().out


def test_running_at_timeout_then_interrupted(
    make_world: MakeWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    """The installer hangs: --wait gives up with 3 while the run is in driver; a waiter
    still blocked when SIGTERM stops the run returns the run's code, 12."""
    slow = {"driver": {"command_timeout": 120.0}}
    w = make_world("h100-pcie", ("installer-hangs",), config_overrides=slow)
    run = subprocess.Popen(
        w.argv("--quiet"), env=w.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        checkpoint = w.root / "var/lib/bootfsm/checkpoint.json"
        deadline = time.monotonic() + 60
        while not (w.journals() and '"driver.install"' in w.journals()[-1].read_text()):
            assert run.poll() is None and time.monotonic() < deadline, "the installer never started"
            time.sleep(0.05)
        rc, data = _status(capsys, w.root, "--wait", "--timeout", "0.5")
        assert rc == RUNNING, data
        assert data["status"] == "running" and data["state"] == "driver" and data["timed_out"]
        assert data["pid"] == run.pid == json.loads(checkpoint.read_text())["pid"]
        assert main(["status", "--root", str(w.root)]) == RUNNING
        assert "running: run" in capsys.readouterr().out
        waiter = _status_child(w, "--wait", "--timeout", "120")
        time.sleep(0.3)  # the waiter is polling
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) == int(Code.INTERRUPTED)
        out, _ = waiter.communicate(timeout=60)
        assert waiter.returncode == int(Code.INTERRUPTED), out
        rc, data = _status(capsys, w.root)
        assert rc == 12 and data["status"] == "interrupted"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def test_killed_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The checkpoint says running but nobody holds the node lock: killed, 5."""
    state = tmp_path / "var/lib/bootfsm"
    state.mkdir(parents=True)
    (state / "lock").write_text("")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cp = {
        "run_id": "ab12cd34",
        "journal": "",
        "pid": dead.pid,
        "state": "driver",
        "outcome": "running",
    }
    (state / "checkpoint.json").write_text(json.dumps(cp))
    rc, data = _status(capsys, tmp_path, "--wait", "--timeout", "5")
    assert rc == KILLED and data["status"] == "killed" and data["state"] == "driver"
    assert not data["timed_out"] and data["run_id"] == "ab12cd34"


def test_torn_checkpoint_falls_back_to_the_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unreadable checkpoint: the newest journal decides."""
    state, log = tmp_path / "var/lib/bootfsm", tmp_path / "var/log/bootfsm"
    state.mkdir(parents=True)
    log.mkdir(parents=True)
    (state / "checkpoint.json").write_text('{"run_id": "ab')
    name = "KUBELET_NOT_HEALTHY"
    events = [
        {"event": "run.start", "t": 0, "run_id": "ab12cd34", "pid": os.getpid()},
        {"event": "state.failed", "t": 1, "state": "join", "code": 91, "code_name": name},
        {"event": "run.end", "t": 1, "outcome": "failed", "code": 91, "code_name": name,
         "state": "join", "message": "kubelet not healthy", "duration_s": 1},
    ]  # fmt: skip
    (log / "run-20260101T000000Z-ab12cd34.jsonl").write_text(
        "\n".join(json.dumps(e) for e in events) + "\n"
    )
    rc, data = _status(capsys, tmp_path)
    assert rc == 91 and data["state"] == "join" and data["message"] == "kubelet not healthy"


def test_a_run_that_ends_between_the_two_reads_is_not_called_killed(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status reads the record, then the lock. A run that writes its last record and
    lets the lock go between those two reads leaves a "running" record and a free lock:
    the record is read again, and the run is done, not killed."""
    from bootfsm.commands import status as st_mod
    from bootfsm.core.config_files import load_config
    from bootfsm.host.host import Host

    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok
    cfg = load_config(w.config_path, required=True)
    cp = w.root / cfg.run.state_dir.lstrip("/") / "checkpoint.json"
    final = cp.read_text()
    cp.write_text(json.dumps({**json.loads(final), "outcome": "running", "state": "join"}))
    real = st_mod.lock_holders

    def run_ends_now(lock: Path) -> set[int] | None:
        cp.write_text(final)  # the run's last record, then it lets the lock go
        return real(lock)

    monkeypatch.setattr(st_mod, "lock_holders", run_ends_now)
    st = st_mod.probe(Host(w.root), cfg)
    assert (st.status, st.code) == ("done", DONE)


def test_a_run_that_starts_between_the_two_reads_is_not_called_killed(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other window (the flake this order fixes): the lock is seen free just before
    a new run takes it and writes its first "running" record. Read in the other order,
    that is a record without a lock holder: "killed" for a run that has just begun."""
    from bootfsm.commands import status as st_mod
    from bootfsm.core.config_files import load_config
    from bootfsm.host.host import Host

    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok
    cfg = load_config(w.config_path, required=True)
    cp = w.root / cfg.run.state_dir.lstrip("/") / "checkpoint.json"
    first = {**json.loads(cp.read_text()), "run_id": "newrun01", "state": "detect"}

    def run_starts_now(lock: Path) -> set[int] | None:
        cp.write_text(json.dumps({**first, "outcome": "running"}))  # right after this read
        return set()

    monkeypatch.setattr(st_mod, "lock_holders", run_starts_now)
    st = st_mod.probe(Host(w.root), cfg)
    assert st.status != "killed", st
