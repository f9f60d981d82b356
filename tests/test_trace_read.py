"""Reading journals that are not clean: torn, garbage, empty, older, newer, unfinished;
and the CLI around them (`bootfsm trace` by id or file, --json, --history)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootfsm.cli import main
from bootfsm.observe.liveness import annotate, lock_holders, run_alive
from bootfsm.observe.trace import load_run, parse_events, render, to_json
from bootfsm.observe.trace_view import root_cause
from bootfsm.sim.node import SKUS, simulate_reboot
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, run_in_process
from tests.trace_schema import check_trace_json


@pytest.fixture(scope="module")
def failed_lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The journal lines of one real run that failed in driver (DKMS build, code 41)."""
    with World(tmp_path_factory.mktemp("w"), "h100-pcie", ("installer-fails",)) as w:
        r = run_in_process(w)
        assert r.journal is not None
        return r.journal.read_text().splitlines()


def _parse(lines: list[str]) -> dict[str, object]:
    report = parse_events(lines, source="j.jsonl")
    render(report)  # never raises
    data = to_json(report)
    check_trace_json(data)
    return data


def test_clean_failed_journal_has_the_full_root_cause(failed_lines: list[str]) -> None:
    """The baseline: state, code, failed command with its exit code and output, path."""
    data = _parse(failed_lines)
    rc = data["root_cause"]
    assert isinstance(rc, dict)
    assert (rc["state"], rc["code"], rc["code_name"]) == ("driver", 41, "DRIVER_INSTALL_FAILED")
    assert rc["command"]["rc"] == 1 and rc["command"]["caused_failure"]
    assert rc["path"] == ["detect", "fetch", "driver"]
    assert data["warnings"] == []


def test_torn_last_line_keeps_the_verdict_and_warns(failed_lines: list[str]) -> None:
    """A crash mid-write of run.end: the state.failed verdict still stands, one warning."""
    last = failed_lines[-1]
    torn = [*failed_lines[:-1], last[: len(last) // 2]]
    report = parse_events(torn, source="j.jsonl")
    assert report.outcome == "running"  # no run.end survived
    assert any("torn last line" in w for w in report.warnings)
    rc = root_cause(annotate(report, Path("/nonexistent/lock")))
    assert report.outcome == "killed"
    assert rc is not None and (rc["state"], rc["code"]) == ("driver", 41)
    assert "died before recording its end" in rc["message"]


def test_garbage_lines_are_skipped_with_their_line_numbers(failed_lines: list[str]) -> None:
    """NUL blocks, non-objects and objects without an event are warnings, not errors."""
    junk = ["\x00" * 40, "[1, 2]", '"text"', '{"no": "event"}', "not json at all {"]
    lines = failed_lines[:3] + junk + failed_lines[3:]
    data = _parse(lines)
    warnings = [w for w in data["warnings"] if "not a JSON event" in w]
    assert [w.split(":")[1] for w in warnings] == ["4", "5", "6", "7", "8"]
    assert data["root_cause"]["code"] == 41  # type: ignore[index]


def test_empty_and_blank_journals() -> None:
    """No events at all: outcome unknown, a warning, no root cause."""
    for lines in ([], ["", "   ", "\n"]):
        data = _parse(lines)
        assert data["outcome"] == "unknown" and data["root_cause"] is None
        assert any("no events" in w for w in data["warnings"])  # type: ignore[union-attr]


def test_older_journal_without_t_uses_ts(failed_lines: list[str]) -> None:
    """An older writer: no ``t``, no ``attempt``, no ``duration_s``, no schema. Durations
    come from ``ts`` (never the zero time a format mismatch gives cloud-init analyze)."""
    old = []
    for line in failed_lines:
        ev = json.loads(line)
        for k in ("t", "attempt", "duration_s", "schema", "attempts_max", "pid"):
            ev.pop(k, None)
        old.append(json.dumps(ev))
    data = _parse(old)
    states = {s["state"]: s for s in data["states"]}  # type: ignore[union-attr]
    assert states["driver"]["duration_s"] > 0 and states["fetch"]["duration_s"] > 0
    assert states["driver"]["attempts"] == 1
    assert data["root_cause"]["code"] == 41  # type: ignore[index]
    assert data["duration_s"] and data["duration_s"] > 0  # type: ignore[operator]


def test_events_without_any_time_are_named(failed_lines: list[str]) -> None:
    """Neither ``t`` nor ``ts``: a warning says the durations are unknown."""
    bare = [
        json.dumps({k: v for k, v in json.loads(x).items() if k not in ("t", "ts")})
        for x in failed_lines
    ]
    data = _parse(bare)
    assert any("carry no time" in w for w in data["warnings"])  # type: ignore[union-attr]


def test_newer_schema_and_unknown_events_are_tolerated(failed_lines: list[str]) -> None:
    """A journal from a newer bootfsm: unknown events are ignored, one warning names it."""
    first = json.loads(failed_lines[0])
    first["schema"] = 99
    extra = json.dumps({"event": "gpu.telemetry", "t": 0.5, "watts": [700, 699]})
    data = _parse([json.dumps(first), extra, *failed_lines[1:]])
    assert any("newer than this reader" in w for w in data["warnings"])  # type: ignore[union-attr]
    assert data["root_cause"]["code"] == 41  # type: ignore[index]


def test_wrong_types_inside_events_do_not_raise(failed_lines: list[str]) -> None:
    """A field of the wrong type makes that one event unreadable, not the journal."""
    bad = json.dumps({"event": "state.attempt", "state": "fetch", "attempt": "many", "t": 1})
    data = _parse([*failed_lines[:5], bad, *failed_lines[5:]])
    assert any("unreadable" in w for w in data["warnings"])  # type: ignore[union-attr]


_KINDS = ["run.start", "node.facts", "state.enter", "state.attempt", "state.skip", "state.retry",
          "state.done", "state.failed", "command", "transition", "warning", "run.end"]  # fmt: skip
_KEYS = ["event", "t", "ts", "state", "attempt", "attempts", "code", "guards", "argv", "rc",
         "duration_s", "sleep_s", "detail", "outcome", "schema", "pid"]  # fmt: skip
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and infinities too: json writes them, json.loads reads them back
    st.text(max_size=12),
    st.sampled_from(_KINDS),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
_LINES = st.lists(
    st.one_of(
        st.text(max_size=80),
        st.builds(json.dumps, st.dictionaries(st.sampled_from(_KEYS), _VALUES)),
    ),
    max_size=30,
)


@given(_LINES)
def test_fuzz_any_lines_give_a_trace_never_a_traceback(lines: list[str]) -> None:
    """Whatever the lines, parse, render, JSON, HTML and the fleet fold complete."""
    from bootfsm.observe.fleet import scan
    from bootfsm.observe.trace_html import render_html

    report = parse_events(lines)
    render(report)
    json.dumps(to_json(report), default=str)
    render_html(report)
    with tempfile.TemporaryDirectory() as d:
        Path(d, "n.jsonl").write_text("\n".join(lines), errors="surrogatepass")
        stats = scan(Path(d))
        json.dumps(stats.to_json(d, 0.0), default=str)
        assert stats.files == 1


# -- in progress vs killed ------------------------------------------------------------
@pytest.fixture
def lock_holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A child process that holds an flock on ROOT/var/lib/bootfsm/lock, as a run does."""
    lock = tmp_path / "node/var/lib/bootfsm/lock"
    lock.parent.mkdir(parents=True)
    code = (
        "import fcntl,os,sys,time; fd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT);"
        "fcntl.flock(fd,fcntl.LOCK_EX); print('locked',flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"locked\n"
    try:
        yield proc, lock
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_in_progress_then_killed(
    lock_holder: tuple[subprocess.Popen[bytes], Path],
    failed_lines: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No run.end: IN PROGRESS while the run's pid holds the node lock, KILLED after."""
    proc, lock = lock_holder
    root = lock.parents[3]
    start = json.loads(failed_lines[0])
    start["pid"] = proc.pid
    before_end = [x for x in failed_lines[1:] if '"state.failed"' not in x][:12]
    upto_driver = [json.dumps(start), *before_end]
    log = root / "var/log/bootfsm"
    log.mkdir(parents=True)
    (log / "run-20260101T000000Z-abcd1234.jsonl").write_text("\n".join(upto_driver) + "\n")
    assert lock_holders(lock) == {proc.pid}
    assert run_alive(lock, proc.pid) is True
    assert main(["trace", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "IN PROGRESS" in out and "in progress: state" in out and "root cause" not in out
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert lock_holders(lock) == set()
    assert main(["trace", "--root", str(root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    check_trace_json(data)
    assert data["outcome"] == "killed" and data["alive"] is False
    assert (
        data["root_cause"]["code"] is None and "without a verdict" in data["root_cause"]["message"]
    )


# -- the CLI ---------------------------------------------------------------------------
def test_cli_finds_runs_by_id_and_file_and_says_when_none(
    tmp_path: Path, failed_lines: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Latest by default, a run id, a file path; exit 1 with a message when nothing matches."""
    root = tmp_path / "node"
    assert main(["trace", "--root", str(root)]) == 1
    assert "no journal" in capsys.readouterr().err
    log = root / "var/log/bootfsm"
    log.mkdir(parents=True)
    run_id = json.loads(failed_lines[0])["run_id"]
    path = log / f"run-20260101T000000Z-{run_id}.jsonl"
    path.write_text("\n".join(failed_lines) + "\n")
    assert main(["trace", "--root", str(root), run_id[:6]]) == 0
    assert f"run {run_id}" in capsys.readouterr().out
    assert main(["trace", "--root", str(root), "feedface"]) == 1
    assert "no journal matching 'feedface'" in capsys.readouterr().err
    assert main(["trace", str(path), "--json"]) == 0
    check_trace_json(json.loads(capsys.readouterr().out))


def test_history_tells_fail_reboot_success_as_one_story(
    make_world: MakeWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    """No kernel headers: the run fails; headers installed, the node reboots, the run succeeds."""
    w = make_world("h100-pcie", ("kernel-headers-missing",))
    boot = w.root / "proc/sys/kernel/random/boot_id"
    boot.parent.mkdir(parents=True, exist_ok=True)
    boot.write_text("8e4c1a5e-0d6f-4f8e-9a31-000000000001\n")
    first = run_in_process(w)
    assert first.outcome.code.name == "KERNEL_HEADERS_MISSING"
    build = w.root / f"lib/modules/{SKUS['h100-pcie'].kernel}/build"
    build.mkdir(parents=True)
    (build / "Makefile").write_text("VERSION = 5\n")
    simulate_reboot(w.root)
    boot.write_text("8e4c1a5e-0d6f-4f8e-9a31-000000000002\n")
    second = run_in_process(w)
    assert second.outcome.ok, second.outcome
    assert main(["trace", "--root", str(w.root), "--history"]) == 0
    out = capsys.readouterr().out
    assert "-- reboot --" in out
    assert "story: failed (KERNEL_HEADERS_MISSING in detect) -> reboot -> done" in out
    assert main(["trace", "--root", str(w.root), "--history", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "history" and data["schema"] == 1
    assert [r["outcome"] for r in data["runs"]] == ["failed", "done"]
    assert [r["after"] for r in data["runs"]] == ["", "reboot"]
    assert data["runs"][0]["boot_id"].endswith("0001") and data["runs"][0]["code"] == 25
    assert load_run(w.journals()[-1]).boot_id.endswith("0002")
