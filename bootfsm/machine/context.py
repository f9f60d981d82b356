"""The one object a state gets: config, facts, host, HTTP, journal and deadline-bound time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.core.deadline import Deadline
from bootfsm.core.errors import BootError, CommandError
from bootfsm.host.host import CommandResult, Host
from bootfsm.host.http import SYSTEM_CA_BUNDLES, Http
from bootfsm.machine.table import StateRow
from bootfsm.node.facts import NodeFacts
from bootfsm.observe.journal import Journal

__all__ = ["Context"]

T = TypeVar("T")


@dataclass
class Context:
    """Everything a state may use; states never reach past it."""

    config: Config
    host: Host
    http: Http
    journal: Journal
    deadline: Deadline
    facts_: NodeFacts | None = None
    state: str = ""
    state_row: StateRow | None = None
    state_deadline: Deadline | None = None
    status: Callable[[str], object] | None = None
    """systemd STATUS= for progress within a state (set by the runner under systemd)."""
    probing: bool = False
    """True while a ``run(..., probe=True)`` command runs (its journal event says so)."""
    wait_end: float | None = None
    """The monotonic end of the ``wait_until`` running now: its probes' requests end by it."""

    @classmethod
    def create(
        cls,
        config: Config,
        host: Host,
        journal: Journal,
        deadline_s: float | None = None,
        deadline: Deadline | None = None,
    ) -> Context:
        """A context whose HTTP client follows the config and the host's environment; its
        global deadline is ``deadline`` (already running), else ``deadline_s`` from now,
        else ``run.deadline`` from now."""
        http = Http(
            connect_timeout=config.fetch.connect_timeout,
            read_timeout=config.fetch.read_timeout,
            env=host.env,
            ca_file=trust_store(config, host),
        )
        seconds = config.run.deadline if deadline_s is None else deadline_s
        ctx = cls(config, host, http, journal, deadline or Deadline(seconds, host.monotonic))
        http.budget = ctx.request_budget
        return ctx

    # -- facts -------------------------------------------------------------------------
    @property
    def facts(self) -> NodeFacts:
        """Node facts; detect sets them before any other state runs."""
        if self.facts_ is None:
            raise RuntimeError("node facts requested before detect ran")
        return self.facts_

    # -- time --------------------------------------------------------------------------
    def remaining(self) -> float:
        """Seconds left under both the state's limit and the global deadline."""
        left = self.deadline.remaining()
        if self.state_deadline is not None:
            left = min(left, self.state_deadline.remaining())
        return left

    def request_budget(self) -> float:
        """``Http.budget``, in seconds: ``remaining()``, capped by the running ``wait_until``."""
        left = self.remaining()
        if self.wait_end is not None:
            left = min(left, self.wait_end - self.host.monotonic())
        return left

    def time_error(self) -> BootError:
        """The error for running out of time: global deadline or the state's own limit."""
        if self.state_deadline is None or self.deadline.remaining() <= (
            self.state_deadline.remaining()
        ):
            return BootError(
                Code.DEADLINE_EXCEEDED,
                f"global deadline of {self.deadline.seconds:g} s{self.deadline.note} ran out"
                f" in state {self.state}",
                state=self.state,
            )
        limit = self.state_row.time_limit if self.state_row else 0
        code = self.state_row.timeout_code if self.state_row else Code.STATE_TIMEOUT
        return BootError(
            code, f"state {self.state} ran past its time limit of {limit:g} s", state=self.state
        )

    def check_time(self) -> None:
        """Raise the time error when no time is left."""
        if self.remaining() <= 0:
            raise self.time_error()

    def sleep(self, seconds: float) -> None:
        """Sleep, but never past what remains; raise the time error if nothing remains."""
        left = self.remaining()
        if left <= 0:
            raise self.time_error()
        self.host.sleep(min(seconds, left))

    def wait_until(
        self,
        probe: Callable[[], T | None],
        *,
        timeout: float,
        interval: float,
        on_timeout: Callable[[], BootError],
    ) -> T:
        """Poll ``probe`` until it returns a value, bounded by ``timeout`` and the deadlines."""
        end = self.host.monotonic() + timeout
        outer = self.wait_end
        self.wait_end = end if outer is None else min(end, outer)
        try:
            while True:
                value = probe()
                if value is not None:
                    return value
                left = end - self.host.monotonic()
                if left <= 0:
                    raise on_timeout()
                self.sleep(min(interval, left))  # raises the time error when none is left
        finally:
            self.wait_end = outer

    # -- commands ----------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        probe: bool = False,
        die_with_bootfsm: bool | None = None,
        **kw: Any,
    ) -> CommandResult:
        """Run ``argv`` within ``timeout`` and what remains; raises the time error when the
        remaining budget, not ``timeout``, cut it short.

        ``probe``: a non-zero answer is expected, not a fault (journaled at info). A probe is not
        tied to bootfsm's life; pass ``die_with_bootfsm=False`` for any command harmless if left
        running (it only reads, or only asks a daemon to act)."""
        budget, limit = self._limit(timeout)
        self.probing = probe
        try:
            tied = not probe if die_with_bootfsm is None else die_with_bootfsm
            result = self.host.run(argv, timeout=limit, die_with_bootfsm=tied, **kw)
        finally:
            self.probing = False
        return self._timed(result, timeout, budget)

    def capture(
        self, argv: Sequence[str], *, timeout: float | None = None, die_with_bootfsm: bool = True
    ) -> tuple[CommandResult, str]:
        """``run`` for a command whose standard output is data (``Host.capture``): the
        result's output is stderr's tail, the second value the whole standard output."""
        budget, limit = self._limit(timeout)
        result, out = self.host.capture(argv, timeout=limit, die_with_bootfsm=die_with_bootfsm)
        return self._timed(result, timeout, budget), out

    def _limit(self, timeout: float | None) -> tuple[float, float]:
        """(what remains, a command's limit: ``timeout`` capped by it); the time error at 0."""
        budget = self.remaining()
        if budget <= 0:
            raise self.time_error()
        return budget, budget if timeout is None else min(timeout, budget)

    def _timed(self, result: CommandResult, timeout: float | None, budget: float) -> CommandResult:
        """``result``, or the time error when the budget, not ``timeout``, cut it short."""
        if result.timed_out and (timeout is None or budget <= timeout):
            raise self.time_error()
        return result

    def require(
        self,
        argv: Sequence[str],
        *,
        code: Code,
        what: str = "",
        timeout: float | None = None,
        **kw: Any,
    ) -> CommandResult:
        """Run a command and raise ``CommandError(code)`` unless it exits 0 in time."""
        result = self.run(argv, timeout=timeout, **kw)
        if not result.ok:
            label = what or f"{argv[0]} failed"
            if result.timed_out:
                # a hung command is this state's timeout class (e.g. 85 for the driver)
                code = self.state_row.timeout_code if self.state_row else code
                label += f" (timed out after {result.duration_s:.0f} s)"
            raise CommandError(code, argv, result.returncode, result.output[-1500:], label)
        return result

    def event(self, event: str, **fields: Any) -> None:
        """Journal an event tagged with the current state."""
        self.journal.event(event, state=self.state, **fields)

    def warn(self, message: str, **fields: Any) -> None:
        """Journal a warning (also shown on the console)."""
        self.journal.event("warning", level="warning", state=self.state, message=message, **fields)


def trust_store(config: Config, host: Host) -> str:
    """``fetch.ca_file``, else the first system CA bundle present, as a real path; '' if none."""
    if config.fetch.ca_file:  # configured: used as given (missing is a TLS error)
        return str(host.path(config.fetch.ca_file))
    for node_path in SYSTEM_CA_BUNDLES:
        if host.exists(node_path):
            return str(host.path(node_path))
    return ""
