"""Provisioning events for a cloud guest agent, as CSE writes them (docs/trace.md).

With ``run.cse_events_dir`` set, each ended state and the run leave one
``<epoch ms>.json`` (atomic; names unique and increasing within a run) holding one
object of strings; a failure to write never changes the run's outcome.
"""

from __future__ import annotations

import json
import time

from bootfsm import __version__
from bootfsm.core.codes import info
from bootfsm.core.cse import CSE_NAMES, cse_exit
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host
from bootfsm.machine.engine import Outcome
from bootfsm.observe.trace import scrub

__all__ = ["EVENT_VERSION", "MAX_MESSAGE", "CseEvents", "cse_time"]

EVENT_VERSION = "1.23"
MAX_MESSAGE = 3072  # the guest agent's limit


def _cse(outcome: Outcome) -> str:
    number = cse_exit(outcome.code, outcome.state)
    return f"cse={number} {CSE_NAMES.get(number, '')}".rstrip()


def cse_time(wall: float) -> str:
    """``%F %T.%3N`` (UTC) of a Unix time."""
    ms = round(wall * 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}"


class CseEvents:
    """Writes one event file per ended state; a no-op when ``directory`` is empty."""

    def __init__(self, host: Host, directory: str, run_id: str) -> None:
        self.host = host
        self.directory = directory.rstrip("/")
        self.run_id = run_id
        self._start = host.wall()
        self._mark = self._start
        self._last_ms = 0
        self.problems: list[str] = []

    def _write(
        self, task: str, level: str, message: str, start: float, end: float, clean: bool = False
    ) -> None:
        if not self.directory:
            return
        event = {
            "Timestamp": cse_time(start),
            "OperationId": cse_time(end),  # AgentBaker's: step time = OperationId - Timestamp
            "Version": EVENT_VERSION,
            "TaskName": task,
            "EventLevel": level,
            "Message": (message if clean else scrub(message))[:MAX_MESSAGE] or task,
            "EventPid": "0",
            "EventTid": "0",
        }
        ms = max(int(end * 1000), self._last_ms + 1)
        while self.host.exists(f"{self.directory}/{ms}.json"):
            ms += 1
        self._last_ms = ms
        try:
            self.host.write_atomic(f"{self.directory}/{ms}.json", json.dumps(event) + "\n", 0o644)
        except (BootError, ValueError) as exc:
            self.problems.append(f"CSE event {task} not written: {exc}")

    def state_ended(self, src: str, dest: str, outcome: Outcome | None) -> None:
        """Record state ``src`` ending by moving to ``dest`` (``failed`` carries the outcome)."""
        now = self.host.wall()
        start, self._mark = self._mark, now
        took = f"{now - start:.3f} s"
        if dest == "failed" and outcome is not None:
            msg = (
                f"Failed: {src} code={int(outcome.code)} {outcome.code.name} {_cse(outcome)} "
                f"after {took}: {outcome.message} (run {self.run_id})"
            )
            self._write(f"bootfsm.{src}", "Error", msg, start, now)
        else:
            msg = f"Completed: {src} -> {dest} in {took} (run {self.run_id})"
            self._write(f"bootfsm.{src}", "Informational", msg, start, now)

    def run_ended(self, outcome: Outcome) -> list[str]:
        """Record the run's verdict; return every problem met while writing events."""
        now = self.host.wall()
        took = f"{now - self._start:.3f} s"
        if outcome.ok:
            what = outcome.message or "node provisioned"
            msg = f"Completed: bootfsm {__version__} run {self.run_id}: {what} in {took}"
            self._write("bootfsm.run", "Informational", msg, self._start, now)
        else:
            head = (
                f"Failed: bootfsm {__version__} run {self.run_id} code={int(outcome.code)} "
                f"{outcome.code.name} {_cse(outcome)} in state {outcome.state or '-'} "
                f"after {took}: "
            )
            tail = f" | hint: {info(outcome.code).hint}"  # a long message is cut, never the hint
            room = max(MAX_MESSAGE - len(head) - len(tail), 0)
            msg = head + scrub(outcome.message)[:room] + tail
            self._write("bootfsm.run", "Error", msg, self._start, now, clean=True)
        return list(self.problems)
