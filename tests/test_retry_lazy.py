"""The retry library is loaded only when a state must retry: a boot where every first
attempt succeeds never imports it (it is part of the engine's start-up cost on every
node), and a transient failure still gets the policy's retries, waits and events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.config import parse_config
from bootfsm.core.errors import BootError, TransientError
from bootfsm.host.host import Host
from bootfsm.machine.context import Context
from bootfsm.machine.engine import attempt
from bootfsm.machine.table import STATES
from bootfsm.observe.journal import Journal
from bootfsm.sim.mirror import Status
from tests.conftest import MakeWorld, run_in_process

PROBE = (
    "import sys; from bootfsm.cli import main; rc = main(sys.argv[1:]); "
    "print('TENACITY', 'tenacity' in sys.modules); sys.exit(rc)"
)


def _boot(w: object, *extra: str) -> tuple[int, bool, list[dict[str, object]]]:
    argv = [sys.executable, "-c", PROBE, *w.argv(*extra)[3:]]  # type: ignore[attr-defined]
    p = subprocess.run(argv, env=w.env(), capture_output=True, text=True, timeout=180)  # type: ignore[attr-defined]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("TENACITY ")]
    assert line, p.stdout + p.stderr
    logs = sorted((w.root / "var/log/bootfsm").glob("run-*.jsonl"))  # type: ignore[attr-defined]
    events = [json.loads(x) for x in logs[-1].read_text().splitlines() if x.strip()]
    return p.returncode, line[-1].split()[1] == "True", events


def test_a_boot_without_failures_never_loads_the_retry_library(make_world: MakeWorld) -> None:
    w = make_world("h100-hgx")
    rc, loaded, events = _boot(w)
    assert rc == 0 and not loaded
    assert not [e for e in events if e["event"] == "state.retry"]
    attempts = [e for e in events if e["event"] == "state.attempt"]
    assert attempts and all(e["attempt"] == 1 for e in attempts)
    rc, loaded, _ = _boot(w)  # the rerun: every state satisfied
    assert rc == 0 and not loaded


def test_a_transient_failure_loads_it_and_retries_by_the_policy(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", faults=("http-503x3",))
    rc, loaded, events = _boot(w)  # the sim's backoff is scaled down
    assert rc == 0 and loaded
    fetch = [e for e in events if e.get("state") == "fetch"]
    tries = [e["attempt"] for e in fetch if e["event"] == "state.attempt"]
    retries = [e for e in fetch if e["event"] == "state.retry"]
    assert tries == list(range(1, len(tries) + 1)) and len(tries) >= 2  # 1, 2, ... in order
    assert len(retries) == len(tries) - 1  # one retry event between two attempts
    assert all(r["code"] and r["sleep_s"] >= 0 for r in retries)


def test_a_state_that_stays_transient_stops_after_exactly_its_attempts(tmp_path: Path) -> None:
    """Every state of the table, its action failing transiently every time: the engine
    runs it exactly ``RetryPolicy.attempts`` times, then ends with the error's code,
    saying how many attempts it made."""
    ctx = Context.create(
        parse_config({"run": {"backoff_scale": 0.0}}), Host(tmp_path), Journal(None, run_id="t")
    )
    for srow in STATES:
        calls = 0

        def action() -> None:
            nonlocal calls
            calls += 1
            raise TransientError(Code.DOWNLOAD_RETRIES_EXHAUSTED, "still failing")

        ctx.state_deadline = None
        with pytest.raises((BootError, TransientError)) as err:
            attempt(ctx, srow, action)
        assert calls == srow.retry.attempts, srow.name
        if srow.retry.attempts > 1:  # a single attempt's error is the action's own
            assert f"gave up after {calls} attempt(s)" in str(err.value)


def test_a_mirror_that_stays_unavailable_gets_five_fetch_attempts(make_world: MakeWorld) -> None:
    """A runfile mirror answering 503 every time: fetch tries it 5 times (its policy,
    docs/machine.md), no more, then fails DOWNLOAD_RETRIES_EXHAUSTED."""
    w = make_world("h100-pcie")
    w.mirror.add_fault(".run", Status(503, times=1000))
    r = run_in_process(w)
    assert (r.outcome.state, r.outcome.code) == ("fetch", Code.DOWNLOAD_RETRIES_EXHAUSTED)
    assert "gave up after 5 attempt(s)" in r.outcome.message
    assert len([e for e in w.mirror.log if e.path.endswith(".run")]) == 5
    events = [json.loads(x) for x in Path(r.journal).read_text().splitlines()]  # type: ignore[arg-type]
    tries = [
        e["attempt"] for e in events if e["event"] == "state.attempt" and e["state"] == "fetch"
    ]
    assert tries == [1, 2, 3, 4, 5]
