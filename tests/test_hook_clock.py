"""CSE's clock: the hook never outlives the provisioning script's budget.

AgentBaker (Azure/AgentBaker 06836ee2301e362039418c3a7ed0fe6004a641fd,
parts/linux/cloud-init/artifacts): cse_start.sh exports CSE_STARTTIME_SECONDS and runs
the script under ``timeout -k5s ${CSE_TIMEOUT:-15m}``; cse_helpers.sh's check_cse_timeout
fails once more than ${CSE_MAX_DURATION_SECONDS:-780} s have passed. tests/cse_caller.sh
plays both (the outer timeout counted from CSE_STARTTIME_SECONDS, check_cse_timeout as the
next retrycmd after the GPU step runs it), so a CSE that has already spent 700 of its 780 s
is a caller started with CSE_STARTTIME_SECONDS 700 s ago.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest

from bootfsm.core.codes import Code, info
from bootfsm.core.config import ConfigError
from bootfsm.core.cse_clock import CseBudget, hook_deadline, read_budget, timeout_seconds
from bootfsm.host.lock import NodeLock
from tests.conftest import MakeWorld, installer_calls
from tests.test_hook import CSE, hook_argv, run_caller

NOW = 1_800_000_000.0


# -- the clock as the environment gives it ------------------------------------------------
def test_the_budget_is_check_cse_timeouts_780_s_by_default() -> None:
    budget = read_budget({"CSE_STARTTIME_SECONDS": str(int(NOW) - 700)}, NOW)
    assert budget == CseBudget(
        int(NOW) - 700, 700.0, 780.0, "check_cse_timeout: CSE_MAX_DURATION_SECONDS unset, 780"
    )
    assert budget.left == 80.0


@pytest.mark.parametrize(
    ("env", "limit", "source"),
    [
        # cse_cmd.sh's CSE_TIMEOUT is whole seconds (GetCSETimeout: 900 by default)
        ({"CSE_TIMEOUT": "900"}, 780.0, "check_cse_timeout: CSE_MAX_DURATION_SECONDS unset, 780"),
        ({"CSE_TIMEOUT": "600"}, 600.0, "timeout: CSE_TIMEOUT=600"),
        ({"CSE_TIMEOUT": "10m"}, 600.0, "timeout: CSE_TIMEOUT=10m"),  # timeout(1)'s suffixes
        ({"CSE_MAX_DURATION_SECONDS": "1200"}, 900.0, "timeout: CSE_TIMEOUT unset, 15m"),
        (
            {"CSE_MAX_DURATION_SECONDS": "300", "CSE_TIMEOUT": ""},  # empty is unset, as in bash
            300.0,
            "check_cse_timeout: CSE_MAX_DURATION_SECONDS=300",
        ),
    ],
)
def test_the_budget_is_whichever_of_the_check_and_the_outer_timeout_comes_first(
    env: dict[str, str], limit: float, source: str
) -> None:
    budget = read_budget({"CSE_STARTTIME_SECONDS": str(int(NOW)), **env}, NOW)
    assert budget is not None and (budget.limit, budget.source) == (limit, source)


def test_no_start_time_is_no_cse_clock() -> None:
    """An image build or a run by hand (check_cse_timeout passes without it too)."""
    assert read_budget({}, NOW) is None
    assert read_budget({"CSE_STARTTIME_SECONDS": "", "CSE_TIMEOUT": "600"}, NOW) is None


def test_a_wall_clock_set_back_never_gives_more_than_the_budget() -> None:
    budget = read_budget({"CSE_STARTTIME_SECONDS": str(int(NOW) + 50)}, NOW)
    assert budget is not None and budget.elapsed == 0.0 and budget.left == 780.0


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"CSE_STARTTIME_SECONDS": "yesterday"}, "CSE_STARTTIME_SECONDS: expected whole seconds"),
        ({"CSE_STARTTIME_SECONDS": "-5"}, "CSE_STARTTIME_SECONDS: expected whole seconds"),
        ({"CSE_MAX_DURATION_SECONDS": "13m"}, "CSE_MAX_DURATION_SECONDS: expected whole"),
        ({"CSE_TIMEOUT": "15 minutes"}, "CSE_TIMEOUT: not a timeout(1) duration: '15 minutes'"),
    ],
)
def test_a_variable_that_does_not_parse_is_named(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=r"^" + says.replace("(", r"\(").replace(")", r"\)")):
        read_budget({"CSE_STARTTIME_SECONDS": str(int(NOW)), **env}, NOW)


def test_timeout_durations_as_coreutils_reads_them() -> None:
    assert [timeout_seconds(t) for t in ("90", "1.5m", "2h", "1d", ".5s")] == [
        90.0,
        90.0,
        7200.0,
        86400.0,
        0.5,
    ]
    assert timeout_seconds("0") == math.inf  # timeout(1): 0 disables the timeout
    for bad in ("", "m", "5x", "-5", "1e3"):
        with pytest.raises(ValueError):
            timeout_seconds(bad)


def test_the_deadline_is_what_is_left_less_the_reserve_capped_by_the_runs_own() -> None:
    spent_700 = CseBudget(int(NOW) - 700, 700.0, 780.0, "check")
    plan = hook_deadline(spent_700, 60.0, 600.0, "--deadline")
    assert (plan.seconds, plan.source, plan.spent) == (20.0, "CSE budget", "")
    assert plan.note == " (CSE's budget: 80 s left, 60 s kept for the steps after the GPU step)"
    assert plan.fields == {
        "started": int(NOW) - 700,
        "elapsed_s": 700.0,
        "budget_s": 780.0,
        "budget_source": "check",
        "left_s": 80.0,
        "reserve_s": 60.0,
        "deadline_s": 20.0,
        "deadline_source": "CSE budget",
    }
    fresh = CseBudget(int(NOW) - 30, 30.0, 780.0, "check")
    capped = hook_deadline(fresh, 60.0, 600.0, "--deadline")
    assert (capped.seconds, capped.source, capped.note) == (600.0, "--deadline", "")
    gone = hook_deadline(CseBudget(int(NOW) - 760, 760.0, 780.0, "check"), 60.0, 600.0, "x")
    assert gone.seconds == -40.0 and gone.fields["deadline_s"] == 0.0
    assert gone.spent.startswith("CSE's budget is spent: 760 s of 780 s (check) gone since ")


# -- the hook under the caller ------------------------------------------------------------
def prepared(
    make_world: MakeWorld,
    sku: str,
    faults: tuple[str, ...],
    first: dict[str, dict[str, Any]],
    then: dict[str, dict[str, Any]],
    **world: Any,
) -> Any:
    """A node where a first run (config ``first``, no CSE clock) got as far as the step
    that waits, then the config ``then`` for the run under CSE's clock: that run's states
    before the wait are quick (downloads cached, a built driver skipped), whatever the
    load of the machine running the test."""
    w = make_world(sku, faults, config_overrides=first, **world)
    assert w.run_cli("--no-start-kubelet").returncode != 0
    w.config_overrides = then
    w.write_config()
    return w


def journal(w: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in w.journals()[-1].read_text().splitlines()]


def started_ago(w: Any, spent: int, argv: list[str] | None = None) -> Any:
    """The caller on the node, its CSE started ``spent`` seconds ago (budget 780 s)."""
    return run_caller(w, {"CSE_STARTTIME_SECONDS": str(int(time.time()) - spent)}, argv=argv)


def assert_ended_before_check_cse_timeout(p: Any) -> None:
    """check_cse_timeout, asked as the hook returned, passed; the outer timeout never
    fired."""
    assert "Error: CSE has been running for" not in p.stderr, p.stderr
    assert "caller: check_cse_timeout passes as the GPU step returns (" in p.stdout
    assert "killed by the outer timeout" not in p.stdout


def test_a_cse_700_s_in_gives_the_hook_what_is_left_less_the_reserve(
    make_world: MakeWorld,
) -> None:
    """700 of 780 s spent, 70 s kept for the steps after the GPU step: a driver build
    that never returns (nvidia-installer's own limit 600 s) is stopped at the hook's
    deadline, about 10 s, which ends before check_cse_timeout would; bootfsm's code and
    summary line reach the caller (85)."""
    w = prepared(
        make_world,
        "h100-pcie",
        ("installer-hangs",),
        first={"driver": {"command_timeout": 1.0}},
        then={"run": {"cse_reserve": 70.0}, "driver": {"command_timeout": 600.0}},
    )
    p = started_ago(w, 700)
    assert p.returncode == 85, (p.stdout, p.stderr)
    [line] = [ln for ln in p.stdout.splitlines() if ln.startswith("bootfsm: ")]
    assert line.startswith("bootfsm: FAILED code=100 DEADLINE_EXCEEDED state=driver: global ")
    assert " s left, 70 s kept for the steps after the GPU step) ran out in state driver" in line
    assert f"| cse exit 85 {CSE[85]} | run " in line
    assert p.stdout.splitlines()[-1] == f"caller: provisioning failed: exit 85 {CSE[85]}"
    assert_ended_before_check_cse_timeout(p)
    [start] = [e for e in journal(w) if e["event"] == "run.start"]
    budget = start["cse_budget"]
    assert budget["budget_s"] == 780.0 and budget["reserve_s"] == 70.0
    assert budget["budget_source"] == "check_cse_timeout: CSE_MAX_DURATION_SECONDS unset, 780"
    assert budget["deadline_source"] == "CSE budget"
    assert 700 <= budget["elapsed_s"] <= 710 and 70 <= budget["left_s"] <= 80
    assert budget["deadline_s"] == pytest.approx(budget["left_s"] - 70.0, abs=0.11)
    assert start["deadline_s"] == pytest.approx(budget["left_s"] - 70.0, abs=0.11)
    assert installer_calls(w)[-1]["rc"] == -15  # the build in flight, stopped


def test_a_grid_licence_wait_fits_inside_the_budget(make_world: MakeWorld) -> None:
    """A GRID guest whose licence never comes, its wait configured for 10 minutes: under
    a CSE 700 s in, the wait is cut to the hook's deadline and ends 57 GRID_NOT_LICENSED
    (the cause, CSE 84) naming that limit, before check_cse_timeout."""
    wait = {"license_poll_interval": 0.5}
    w = prepared(
        make_world,
        "a10-nvads",
        ("grid-unlicensed",),
        first={"verify": {"license_timeout": 0.5, **wait}},
        then={"run": {"cse_reserve": 70.0}, "verify": {"license_timeout": 600.0, **wait}},
        driver_kind="grid",
    )
    p = started_ago(w, 700)
    assert p.returncode == 84, (p.stdout, p.stderr)
    [line] = [ln for ln in p.stdout.splitlines() if ln.startswith("bootfsm: ")]
    assert line.startswith("bootfsm: FAILED code=57 GRID_NOT_LICENSED state=verify: ")
    assert "deadline" in line
    assert_ended_before_check_cse_timeout(p)


def test_a_spent_budget_ends_the_hook_at_once_with_its_own_line(make_world: MakeWorld) -> None:
    """770 of 780 s spent, less than the 60 s reserve left: no GPU step at all (no
    download, no build), exit 85 and a summary line saying why, journaled."""
    w = make_world("h100-pcie")
    p = started_ago(w, 770)
    assert p.returncode == 85, (p.stdout, p.stderr)
    [line] = [ln for ln in p.stdout.splitlines() if ln.startswith("bootfsm: ")]
    assert line.startswith(
        "bootfsm: FAILED code=100 DEADLINE_EXCEEDED state=-: CSE's budget is spent: 77"
    )
    assert (
        "s of 780 s (check_cse_timeout: CSE_MAX_DURATION_SECONDS unset, 780) gone since "
        "CSE_STARTTIME_SECONDS=" in line
    )
    assert line.endswith(
        " s left and 60 s kept for the steps after the GPU step (run.cse_reserve); the GPU "
        f"step was not started | hint: {info(Code.DEADLINE_EXCEEDED).hint} | cse exit 85 "
        f"{CSE[85]} | run {line[-8:]}"
    )
    assert installer_calls(w) == [] and w.calls() == []
    assert [e for e in w.mirror.log if not e.path.startswith("/metadata")] == []
    assert len(w.journals()) == 1
    events = journal(w)
    assert [e["event"] for e in events if e["event"].startswith(("run.", "state."))] == [
        "run.start",
        "run.end",
    ]
    assert events[-1]["code"] == 100 and events[0]["cse_budget"]["deadline_s"] == 0.0


def test_the_lock_wait_counts_against_the_budget(make_world: MakeWorld) -> None:
    """Another run holds the node and the hook line asks for a 60 s lock wait: 745 of 780
    s spent, 30 s reserve, so the hook waits 5 s at most and ends 11 (CSE 85) before
    check_cse_timeout; a 60 s wait would have outlived it."""
    w = make_world("h100-pcie", config_overrides={"run": {"cse_reserve": 30.0}})
    argv = hook_argv()
    i = argv.index("--wait-lock")
    argv[i + 1] = "60"
    held = NodeLock(w.root / "var/lib/bootfsm/lock")
    assert held.acquire()
    try:
        p = run_caller(w, {"CSE_STARTTIME_SECONDS": str(int(time.time()) - 745)}, argv=argv)
    finally:
        held.release()
    assert p.returncode == 85, (p.stdout, p.stderr)
    assert "bootfsm: FAILED code=11 ANOTHER_RUN_IN_PROGRESS state=-: " in p.stdout
    assert_ended_before_check_cse_timeout(p)


def test_a_start_time_that_does_not_parse_is_config_invalid(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    env = {"CSE_STARTTIME_SECONDS": str(int(time.time())), "CSE_MAX_DURATION_SECONDS": "13m"}
    p = run_caller(w, env)
    assert p.returncode == 84, (p.stdout, p.stderr)
    assert (
        "bootfsm: FAILED code=10 CONFIG_INVALID state=-: the provisioning hook's environment "
        "is invalid: CSE_MAX_DURATION_SECONDS: expected whole seconds, got '13m'" in p.stdout
    )
    assert w.calls() == []
