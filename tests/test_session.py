"""One run session serves `run`, `bake` and `fetch --prefetch` (bootfsm/run/session.py).

Each leaves a journal that `bootfsm trace` reads like a run (states entered, done or
skipped, commands, the terminal line); a held node lock refuses all three with the same
code and message; SIGTERM ends each with the terminal ``run.end`` event; journals of
each kind are pruned by the same policy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bootfsm.cli import main
from bootfsm.commands.fetch import fetch_cache
from bootfsm.core.codes import Code
from bootfsm.core.config_files import load_config
from bootfsm.host.lock import NodeLock
from bootfsm.image.bake import BakeOptions, bake
from bootfsm.machine.table import TRANSITIONS, stop_after
from bootfsm.sim.mirror import Stall
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, no_gpus, run_in_process
from tests.test_lock_signals import catches_sigterm, finish, node_procs, summary, wait_for

LOCK = "var/lib/bootfsm/lock"
LOG = "var/log/bootfsm"


def _journal_of(w: World, kind: str) -> Path:
    [path] = sorted((w.root / LOG).glob(f"{kind}-*.jsonl"))
    return path


def _run(w: World) -> Path:
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome
    assert result.journal is not None
    return result.journal


def _bake(w: World) -> Path:
    with no_gpus(w):
        result = bake(
            load_config(w.config_path, required=True), BakeOptions(root=w.root, env=w.env())
        )
    assert result.ok, result.message
    assert result.journal == _journal_of(w, "bake")
    return result.journal


def _prefetch(w: World) -> Path:
    with no_gpus(w):
        assert main(["fetch", "--prefetch", "--root", str(w.root)]) == 0
    return _journal_of(w, "fetch")


KINDS: dict[str, tuple[Callable[[World], Path], list[tuple[str, str]], str]] = {
    # kind: how to make its journal, the states the trace shows, its terminal edge
    "run": (
        _run,
        # verify's postcondition already holds once the driver is up: skipped
        [
            ("detect", "done"),
            ("fetch", "done"),
            ("driver", "done"),
            ("verify", "skipped"),
            ("join", "done"),
        ],
        "join",
    ),
    "bake": (_bake, [("detect", "done"), ("fetch", "done"), ("driver", "done")], "driver"),
    "fetch": (_prefetch, [("detect", "done"), ("fetch", "done")], "fetch"),
}


def _trace(
    w: World, journal: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["trace", "--root", str(w.root), *extra, str(journal)])
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_leaves_a_journal_trace_reads_like_a_run(
    make_world: MakeWorld,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    w = make_world("h100-pcie")
    monkeypatch.setenv("PATH", w.env()["PATH"])
    make, states, last = KINDS[kind]
    journal = make(w)
    events = [json.loads(x) for x in journal.read_text().splitlines()]
    assert (events[0]["event"], events[0]["kind"]) == ("run.start", kind)
    assert (events[-1]["event"], events[-1]["kind"], events[-1]["outcome"]) == (
        "run.end",
        kind,
        "done",
    )
    assert any(e["event"] == "command" for e in events)  # the host's commands, journaled

    rc, text = _trace(w, journal, capsys)
    assert rc == 0
    head = text.splitlines()[0]
    assert head.startswith(f"{kind} {events[0]['run_id']}  ") and "  OK  " in head
    for state, outcome in states:
        assert any(ln.split()[1:2] == [state] and ln.split()[-1] == outcome
                   for ln in text.splitlines()), (state, text)  # fmt: skip

    rc, out = _trace(w, journal, capsys, "--json")
    assert rc == 0
    assert _trace(w, Path(events[0]["run_id"]), capsys, "--json") == (rc, out)  # by run id
    doc = json.loads(out)
    assert (doc["run_kind"], doc["outcome"], doc["code"]) == (kind, "done", 0)
    assert [(s["state"], s["outcome"]) for s in doc["states"]] == states
    assert doc["transitions"][-1]["source"] == last and doc["transitions"][-1]["dest"] == "done"
    assert doc["commands"] and doc["warnings"] == []


def test_a_failed_bake_traces_its_failing_state_and_code(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    w = make_world("h100-pcie")
    monkeypatch.setenv("PATH", w.env()["PATH"])
    assert main(["bake", "--root", str(w.root), "--kernel", "9.9.9-none"]) == 25
    rc, out = _trace(w, _journal_of(w, "bake"), capsys, "--json")
    assert rc == 0
    doc = json.loads(out)
    assert (doc["run_kind"], doc["outcome"], doc["code_name"], doc["failed_state"]) == (
        "bake",
        "failed",
        "KERNEL_HEADERS_MISSING",
        "detect",
    )
    assert doc["root_cause"]["message"].startswith("/lib/modules/9.9.9-none/build is missing")


def test_a_held_lock_refuses_run_bake_and_prefetch_alike(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Same code, same message, no journal, whichever command meets the held lock."""
    w = make_world("h100-pcie")
    monkeypatch.setenv("PATH", w.env()["PATH"])
    cfg = load_config(w.config_path, required=True)
    holder = NodeLock(w.root / LOCK)
    assert holder.acquire()
    message = f"another bootfsm run (pid {os.getpid()}) holds {w.root / LOCK}"
    try:
        run = run_in_process(w).outcome
        baked = bake(cfg, BakeOptions(root=w.root, env=w.env()))
        fetched = fetch_cache(cfg, w.root, prefetch=True, env=w.env())
        capsys.readouterr()
        argvs = (["run"], ["bake"], ["fetch", "--prefetch"], ["fetch"])
        exits = [main([*argv, "--root", str(w.root)]) for argv in argvs]
        lines = capsys.readouterr().out.splitlines()
    finally:
        holder.release()
    refused = [(run.code, run.message), (baked.code, baked.message)]
    refused.append((fetched.outcome.code, fetched.outcome.message))
    assert refused == [(Code.ANOTHER_RUN_IN_PROGRESS, message)] * 3
    assert exits == [11, 11, 11, 11]
    assert len(lines) == 4 and all("code=11 ANOTHER_RUN_IN_PROGRESS" in ln for ln in lines)
    assert all(f": {message} | hint: " in ln for ln in lines), lines
    assert list((w.root / LOG).glob("*.jsonl")) == []  # a refused run writes no journal


def _start(w: World, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bootfsm", *argv, "--root", str(w.root)],
        env=w.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _installer_hangs(w: World) -> Callable[[], Any]:
    """The installer building: `--dkms` at boot, `--no-dkms` in a bake (no registration)."""
    return lambda: [
        q for q in node_procs(w, "--dkms") + node_procs(w, "--no-dkms") if catches_sigterm(q)
    ]


SIGNALLED = {
    # kind: argv, the state it is in, the command it stops ('' none), faults, mirror stall
    "run": (["run"], "driver", "nvidia-installer", ("installer-hangs",), False),
    "bake": (["bake"], "driver", "nvidia-installer", ("installer-hangs",), False),
    "fetch": (["fetch", "--prefetch"], "fetch", "", (), True),
}


@pytest.mark.parametrize("kind", list(SIGNALLED))
def test_sigterm_ends_each_kind_with_its_terminal_event(make_world: MakeWorld, kind: str) -> None:
    argv, state, command, faults, stall = SIGNALLED[kind]
    overrides = {"fetch": {"read_timeout": 2.0}} if stall else {}
    w = make_world("h100-pcie", faults=faults, config_overrides=overrides)
    if stall:
        w.mirror.add_fault(".run", Stall(60.0))
    proc = _start(w, *argv)
    ready = (lambda: w.mirror.requests(".run") >= 1) if stall else _installer_hangs(w)
    wait_for(f"{kind} to reach {state}", ready, proc)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 12, out + err[-2000:]
    assert "code=12 INTERRUPTED" in summary(out)
    events = [json.loads(x) for x in _journal_of(w, kind).read_text().splitlines()]
    end = events[-1]
    assert (end["event"], end["kind"], end["outcome"], end["state"]) == (
        "run.end",
        kind,
        "interrupted",
        state,
    )
    assert end["message"].startswith(f"interrupted by SIGTERM in state {state}")
    [what] = [e for e in events if e["event"] == "run.interrupted"]
    assert [Path(a).name for a in what["command"][:1]] == ([command] if command else [])
    assert node_procs(w) == [], "a process of the stopped command survived"


def test_each_kind_keeps_its_newest_journals(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One pruning policy (run.keep_journals per kind): prefetches never prune runs."""
    w = make_world("h100-pcie", config_overrides={"run": {"keep_journals": 2}})
    monkeypatch.setenv("PATH", w.env()["PATH"])
    first = _run(w)
    with no_gpus(w):
        for _ in range(3):
            assert main(["fetch", "--prefetch", "--root", str(w.root)]) == 0
    fetches = sorted((w.root / LOG).glob("fetch-*.jsonl"))
    assert len(fetches) == 2 and w.journals() == [first]
    assert fetches[0].name < fetches[1].name  # names sort in start order


def test_the_sub_tables_end_at_their_stop_state() -> None:
    for stop, reached in (
        ("fetch", {"detect", "fetch"}),
        ("driver", {"detect", "fetch", "driver"}),
    ):
        edges = stop_after(stop)
        assert {t.source for t in edges} == reached
        assert [
            (t.source, t.dest) for t in edges if t.source == stop and t.trigger == "advance"
        ] == [(stop, "done")]
        # every other edge of a reached state is the table's own, guards and all
        assert {t for t in edges if t.source != stop} == {
            t for t in TRANSITIONS if t.source in reached - {stop}
        }
    with pytest.raises(KeyError):
        stop_after("done")
