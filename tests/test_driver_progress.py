"""Progress during the driver build (bootfsm/host/progress.py ``LogWatch``).

nvidia-installer compiles for ~100 s on a real node while ``Host.run`` blocks; a watcher
thread tails the installer log and reports elapsed time and its last line: on a TTY, as
systemd STATUS= and as ``driver.progress`` journal events. The simulator's installer
writes its log the way the real one does (it truncates it, then appends "-> ..." lines)
and compiles for ``compile_seconds``.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path

import pytest

from bootfsm.host.progress import LogWatch, last_line
from bootfsm.install import driver_steps
from tests.conftest import MakeWorld, run_in_process


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_last_line() -> None:
    assert last_line(b"a\n-> Building for 6.8.0\n\n  \n") == "-> Building for 6.8.0"
    assert last_line(b"") == ""
    assert last_line(b"x" * 500) == "x" * 200
    assert last_line(b"tab\there \xff\n") == "tab here \ufffd"


def test_watch_reports_while_the_command_runs(tmp_path: Path) -> None:
    log = tmp_path / "installer.log"
    events: list[tuple[str, dict[str, object]]] = []
    statuses: list[str] = []
    tty = _Tty()
    watch = LogWatch(
        log,
        what="driver",
        label="driver: building",
        emit=lambda ev, **f: events.append((ev, f)),
        status=statuses.append,
        tty=tty,
        every_s=0.2,
        poll_s=0.05,
    )
    with watch:
        for n in range(8):  # the "command": a log that grows for 0.8 s
            with log.open("a") as fh:
                fh.write(f"-> step {n}\n")
            time.sleep(0.1)
    assert watch._thread is not None and not watch._thread.is_alive()  # stopped and joined
    assert len(events) >= 2 and {e for e, _ in events} == {"driver.progress"}
    lines = [f["log_line"] for _, f in events]
    assert all(line in {f"-> step {n}" for n in range(8)} for line in lines)
    elapsed = [float(f["elapsed_s"]) for _, f in events]  # type: ignore[arg-type]
    assert elapsed == sorted(elapsed) and elapsed[-1] < 1.5
    assert statuses and all(s.startswith("driver: building: ") for s in statuses)
    assert "\r\x1b[Kdriver: building: " in tty.getvalue()
    assert tty.getvalue().endswith("\r\x1b[K")  # the line is cleared when the command ends
    n = len(statuses)
    time.sleep(0.2)
    assert len(statuses) == n  # nothing after the end


def test_a_log_left_by_an_earlier_run_is_not_shown(tmp_path: Path) -> None:
    log = tmp_path / "installer.log"
    log.write_text("-> Installation ... is now complete.\n")
    old = time.time() - 3600
    os.utime(log, (old, old))
    statuses: list[str] = []
    watch = LogWatch(log, what="driver", label="driver", emit=lambda *a, **k: None,
                     status=statuses.append, every_s=1.0, poll_s=0.05)  # fmt: skip
    with watch:
        time.sleep(0.3)
    assert statuses and all("complete" not in s for s in statuses)


def test_a_failing_callback_never_breaks_the_command(tmp_path: Path) -> None:
    def boom(_: str) -> None:
        raise RuntimeError("status socket gone")

    with LogWatch(tmp_path / "x.log", what="driver", label="d", emit=lambda *a, **k: None,
                  status=boom, poll_s=0.01) as w:  # fmt: skip
        time.sleep(0.1)
    assert w.ticks >= 1 and threading.active_count() >= 1


def test_driver_build_progress_end_to_end(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2.5 s simulated build: driver.progress events with the installer log's last line
    ("-> Building for <kernel>", what the installer writes before compiling), STATUS=
    texts, and none after the installer's command event."""
    monkeypatch.setattr(driver_steps, "PROGRESS_EVERY_S", 0.5)
    w = make_world("h100-pcie", compile_seconds=2.5)
    statuses: list[str] = []
    result = run_in_process(w, on_status=statuses.append)
    assert result.outcome.code.name == "OK" and result.journal is not None
    events = [json.loads(line) for line in result.journal.read_text().splitlines()]
    kernel = next(e for e in events if e["event"] == "driver.install")["kernel"]
    progress = [e for e in events if e["event"] == "driver.progress"]
    assert len(progress) >= 3
    # "" until the installer has written its log (a slow start on a loaded machine), then
    # the line it writes before compiling, which the 2.5 s build leaves in place
    lines = [e["log_line"] for e in progress]
    first = next(i for i, line in enumerate(lines) if line)
    assert set(lines[:first]) <= {""} and set(lines[first:]) == {f"-> Building for {kernel}"}
    assert all(e["state"] == "driver" for e in progress)
    assert [e["elapsed_s"] for e in progress] == sorted(e["elapsed_s"] for e in progress)
    build = next(
        e for e in events if e["event"] == "command" and any(a == "--dkms" for a in e["argv"])
    )
    assert build["duration_s"] >= 2.5
    # the watcher stops when the installer returns (its command event is journaled just
    # before, from Host.run; one tick may be in flight then)
    assert all(e["t"] <= build["t"] + 0.5 for e in progress)
    assert any(
        s.startswith("driver: nvidia-installer building: ")
        and s.endswith(f"-> Building for {kernel}")
        for s in statuses
    )
