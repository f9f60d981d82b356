"""Guest-agent event files: the format the Linux agent reads, Error on failure, one file
per event with names the agent's collector accepts (``^\\d+\\.json$``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bootfsm.core.codes import Code, info
from bootfsm.host.host import Host
from bootfsm.machine.engine import Outcome
from bootfsm.run.cse_events import MAX_MESSAGE, CseEvents, cse_time

DIR = "/var/log/azure/Microsoft.Azure.Extensions.CustomScript/events"
KEYS = {"Timestamp", "OperationId", "Version", "TaskName", "EventLevel", "Message",
        "EventPid", "EventTid"}  # fmt: skip
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$")


class _Clock:
    """A wall clock that stands still unless told (several events in one millisecond)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _events(root: Path) -> list[tuple[str, dict[str, str]]]:
    d = root / DIR.lstrip("/")
    return [(p.name, json.loads(p.read_text())) for p in sorted(d.iterdir())]


def test_cse_time_format() -> None:
    """``%F %T.%3N`` in UTC, milliseconds rounded."""
    assert cse_time(0.0) == "1970-01-01 00:00:00.000"
    assert cse_time(1_767_225_600.1237) == "2026-01-01 00:00:00.124"


def test_events_of_a_failed_run(tmp_path: Path) -> None:
    """Two states then a failure: Informational, Informational, Error, and the run's Error;
    names unique and increasing even when the clock does not move."""
    clock = _Clock(1_767_225_600.0)
    host = Host(tmp_path, wall=clock)
    cse = CseEvents(host, DIR, "ab12cd34")
    clock.t += 0.5
    cse.state_ended("detect", "fetch", None)
    cse.state_ended("fetch", "driver", None)  # same millisecond
    clock.t += 100.0
    failed = Outcome(Code.DRIVER_INSTALL_FAILED, "driver", "nvidia-installer failed: exit 1")
    cse.state_ended("driver", "failed", failed)
    assert cse.run_ended(failed) == []
    events = _events(tmp_path)
    names = [n for n, _ in events]
    assert all(re.fullmatch(r"\d{13}\.json", n) for n in names) and len(set(names)) == 4
    assert names == sorted(names)
    for _, e in events:
        assert set(e) == KEYS and all(isinstance(v, str) for v in e.values())
        assert STAMP.match(e["Timestamp"]) and STAMP.match(e["OperationId"])
        assert e["EventPid"] == "0" and e["EventTid"] == "0" and e["Message"]
    levels = [(e["TaskName"], e["EventLevel"]) for _, e in events]
    assert levels == [("bootfsm.detect", "Informational"), ("bootfsm.fetch", "Informational"),
                      ("bootfsm.driver", "Error"), ("bootfsm.run", "Error")]  # fmt: skip
    driver = events[2][1]
    assert (driver["Timestamp"], driver["OperationId"]) == (
        "2026-01-01 00:00:00.500", "2026-01-01 00:01:40.500"
    )  # fmt: skip
    assert "code=41 DRIVER_INSTALL_FAILED cse=84 ERR_GPU_DRIVERS_START_FAIL" in driver["Message"]
    run = events[3][1]["Message"]
    assert "code=41 DRIVER_INSTALL_FAILED cse=84 ERR_GPU_DRIVERS_START_FAIL in state driver" in run
    assert run.endswith(" | hint: " + info(Code.DRIVER_INSTALL_FAILED).hint)
    assert not [p for p in (tmp_path / DIR.lstrip("/")).iterdir() if p.name.startswith(".")]


def test_long_messages_and_secrets(tmp_path: Path) -> None:
    """Messages stop at the agent's 3072 characters; URL query strings never leave."""
    host = Host(tmp_path)
    cse = CseEvents(host, DIR, "r")
    msg = "HTTP 403 from https://blob.example/x.run?sig=SECRET " + "y" * 5000
    cse.run_ended(Outcome(Code.ARTIFACT_NOT_FOUND, "fetch", msg))
    [(_, e)] = _events(tmp_path)
    assert len(e["Message"]) == MAX_MESSAGE and "SECRET" not in e["Message"]
    assert "?<redacted>" in e["Message"]
    # the message is cut, not bootfsm's code, the CSE code or the hint
    assert "code=30 ARTIFACT_NOT_FOUND cse=84 ERR_GPU_DRIVERS_START_FAIL" in e["Message"]
    assert e["Message"].endswith(" | hint: " + info(Code.ARTIFACT_NOT_FOUND).hint)


def test_a_timeout_in_fetch_is_a_download_timeout_to_cse(tmp_path: Path) -> None:
    """The CSE code follows the state where it says more: a deadline in fetch is 83."""
    host = Host(tmp_path)
    cse = CseEvents(host, DIR, "r")
    cse.run_ended(Outcome(Code.DEADLINE_EXCEEDED, "fetch", "global deadline ran out"))
    [(_, e)] = _events(tmp_path)
    assert (
        "code=100 DEADLINE_EXCEEDED cse=83 ERR_GPU_DOWNLOAD_TIMEOUT in state fetch"
        in (e["Message"])
    )


def test_disabled_by_default_and_write_failures_are_reported(tmp_path: Path) -> None:
    """An empty directory writes nothing; an unwritable one returns the problem."""
    host = Host(tmp_path)
    CseEvents(host, "", "r").run_ended(Outcome(Code.OK, "done", "ok"))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "blocked").write_text("file\n")
    problems = CseEvents(host, "/blocked/events", "r").run_ended(Outcome(Code.OK, "done", "ok"))
    assert len(problems) == 1 and "bootfsm.run not written" in problems[0]
