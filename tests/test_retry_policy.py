"""Retries follow each state's policy: a boot where every first attempt succeeds retries
nothing, a transient failure gets the policy's retries, waits and events, and a state
that stays transient stops after exactly its attempts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def _events(journal: object) -> list[dict[str, Any]]:
    return [json.loads(x) for x in Path(str(journal)).read_text().splitlines() if x.strip()]


def test_a_boot_without_failures_retries_nothing(make_world: MakeWorld) -> None:
    w = make_world("h100-hgx")
    for _ in range(2):  # the first boot, then the rerun where every state is satisfied
        r = run_in_process(w)
        assert r.outcome.code is Code.OK
        events = _events(r.journal)
        assert not [e for e in events if e["event"] == "state.retry"]
        assert all(e["attempt"] == 1 for e in events if e["event"] == "state.attempt")


def test_a_transient_failure_retries_by_the_policy(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", faults=("http-503x3",))
    r = run_in_process(w)  # the sim's backoff is scaled down
    assert r.outcome.code is Code.OK
    fetch = [e for e in _events(r.journal) if e.get("state") == "fetch"]
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
    events = _events(r.journal)
    tries = [
        e["attempt"] for e in events if e["event"] == "state.attempt" and e["state"] == "fetch"
    ]
    assert tries == [1, 2, 3, 4, 5]
