"""The engine: builds the transitions Machine from the table and drives it to a terminal state.

Per state: postcondition (skip if it holds), the action under its retry policy and time
limit, the postcondition again, then ``advance`` (guards pick the edge) or ``fail``."""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_any,
)
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from bootfsm.core.codes import Code, info
from bootfsm.core.deadline import Deadline
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_text
from bootfsm.machine.context import Context
from bootfsm.machine.table import (
    INITIAL,
    STATES,
    TERMINAL,
    TRANSITIONS,
    RetryPolicy,
    StateRow,
    TransitionRow,
    row,
)
from bootfsm.node.guards import GUARDS

__all__ = ["Interrupted", "Outcome", "attempt", "build_machine", "drive", "interruption"]


class Interrupted(BaseException):
    """Raised in the main thread by the SIGTERM/SIGINT handler."""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


def interruption(exc: BaseException) -> Interrupted | None:
    """The ``Interrupted`` that ``exc`` was raised while handling, if any: an error the
    interruption caused on its way out (a half-released lock) is no failure of its own."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, Interrupted):
            return cur
        seen.add(id(cur))
        cur = cur.__context__
    return None


@dataclass(frozen=True)
class Outcome:
    """How a run ended."""

    code: Code
    state: str
    message: str

    def __post_init__(self) -> None:
        # the summary line, checkpoint, events and exports all say this message
        object.__setattr__(self, "message", redact_text(self.message))

    @property
    def ok(self) -> bool:
        """True for a provisioned node."""
        return self.code is Code.OK


class _Model:
    """The transitions model; it only carries ``state`` (set by transitions)."""

    state: str


def build_machine(
    model: object,
    ctx: Context | None = None,
    callbacks: Mapping[str, Callable[[Context], None]] | None = None,
    initial: str = INITIAL,
    transitions: tuple[TransitionRow, ...] = TRANSITIONS,
) -> Any:
    """A transitions Machine over ``model`` built from the table (names resolved here)."""
    from transitions import Machine

    cbs = callbacks or {}

    def bound(name: str, fn: Callable[[Context], Any]) -> Callable[[Any], Any]:
        """``fn(ctx)`` as the transitions callback ``name`` (it is handed the event)."""

        def call(event: Any) -> Any:
            assert ctx is not None
            return fn(ctx)

        call.__name__ = name
        return call

    def guard(name: str) -> Callable[[Any], Any]:
        fn = GUARDS[name]
        return bound(name, lambda c: fn(c.facts))

    edges = [
        {
            "trigger": t.trigger,
            "source": t.source,
            "dest": t.dest,
            "conditions": [guard(g) for g in t.guards],
            "after": [bound(a, cbs[a]) for a in t.after] if callbacks is not None else [],
        }
        for t in transitions
    ]
    return Machine(
        model=model,
        states=[s.name for s in STATES] + list(TERMINAL),
        transitions=edges,
        initial=initial,
        auto_transitions=False,
        send_event=True,
        queued=True,
    )


class _StopOnBudget(stop_base):
    """tenacity stop strategy: stop when the next sleep would not fit in what remains."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def __call__(self, retry_state: RetryCallState) -> bool:
        return bool(retry_state.upcoming_sleep >= self.ctx.remaining())


class _Backoff(wait_base):
    """tenacity wait strategy: Retry-After when the server gave one, else jittered backoff."""

    def __init__(self, policy: RetryPolicy, scale: float, rng: random.Random) -> None:
        self.policy = policy
        self.scale = scale
        self.rng = rng

    def __call__(self, retry_state: RetryCallState) -> float:
        exc: BaseException | None = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, TransientError) and exc.retry_after is not None:
            # the server's word wins; _StopOnBudget stops when it does not fit the deadline
            return float(exc.retry_after)
        n = int(retry_state.attempt_number)
        base: float = min(self.policy.initial_wait * 2 ** (n - 1), self.policy.max_wait)
        return base * self.scale * (0.5 + self.rng.random() / 2)


def attempt(ctx: Context, srow: StateRow, action: Callable[[], None]) -> int:
    """Run ``action`` under the row's retry policy (transient errors only, waits that fit
    the deadline); return the attempts made. Giving up raises BootError with the last code."""
    attempts = 0

    def before(rs: RetryCallState) -> None:
        nonlocal attempts
        attempts = rs.attempt_number
        ctx.event("state.attempt", attempt=rs.attempt_number)

    def before_sleep(rs: RetryCallState) -> None:
        exc = rs.outcome.exception() if rs.outcome else None
        ctx.journal.event(
            "state.retry",
            level="warning",
            state=ctx.state,
            attempt=rs.attempt_number,
            sleep_s=round(rs.upcoming_sleep, 3),
            error=getattr(exc, "message", str(exc)),
            code=getattr(exc, "code", Code.INTERNAL_ERROR).name,
        )

    retrying = Retrying(
        stop=stop_any(stop_after_attempt(srow.retry.attempts), _StopOnBudget(ctx)),
        wait=_Backoff(srow.retry, ctx.config.run.backoff_scale, random.Random()),  # noqa: S311 - jitter, not crypto
        retry=retry_if_exception_type(TransientError),
        sleep=ctx.sleep,
        before=before,
        before_sleep=before_sleep,
        reraise=True,
    )
    try:
        retrying(action)
    except TransientError as exc:
        raise BootError(
            exc.code, f"{exc.message} (gave up after {attempts} attempt(s))", attempts=attempts
        ) from exc
    return attempts


def _run_state(ctx: Context, name: str, module: Any) -> None:
    srow = row(name)
    ctx.state, ctx.state_row = name, srow
    ctx.state_deadline = Deadline(srow.time_limit, ctx.host.monotonic)
    start = ctx.journal.elapsed()
    ctx.check_time()
    if module.satisfied(ctx):
        explain = getattr(module, "skip_reason", None)  # optional: states/__init__.ExplainsSkip
        ctx.event("state.skip", reason=(explain(ctx) if explain else None) or "postcondition holds")
        return
    ctx.event("state.enter", time_limit_s=srow.time_limit, attempts_max=srow.retry.attempts)
    attempts = attempt(ctx, srow, lambda: module.run(ctx))
    if not module.satisfied(ctx):
        raise BootError(
            srow.failure_code, f"state {name}: action finished but its postcondition does not hold"
        )
    ctx.event("state.done", duration_s=round(ctx.journal.elapsed() - start, 4), attempts=attempts)


def _guard_values(
    ctx: Context, source: str, transitions: tuple[TransitionRow, ...]
) -> dict[str, bool]:
    names = [g for t in transitions if t.source == source for g in t.guards]
    return {g: GUARDS[g](ctx.facts) for g in names} if ctx.facts_ is not None else {}


def _failed(ctx: Context, state: str, code: Code, message: str, **fields: Any) -> Outcome:
    """Journal (durably) why ``state`` failed and return the outcome."""
    ctx.journal.event(
        "state.failed",
        level="error",
        durable=True,
        state=state,
        code=code.value,
        code_name=code.name,
        message=message,
        hint=info(code).hint,
        **fields,
    )
    return Outcome(code, state, message)


def _state_failed(ctx: Context, name: str, exc: Exception) -> Outcome:
    """The outcome of a state that raised: its BootError's code, else a bug (110)."""
    if isinstance(exc, BootError):
        detail = {k: v for k, v in exc.detail.items() if k != "output"}
        output = exc.detail.get("output", "")
        return _failed(ctx, name, exc.code, exc.message, detail=detail, output=output)
    return _failed(  # a bug: still end with a documented code
        ctx,
        name,
        Code.INTERNAL_ERROR,
        f"{type(exc).__name__}: {exc}",
        traceback=traceback.format_exc(limit=8),
    )


def drive(
    ctx: Context,
    registry: Mapping[str, Any],
    callbacks: Mapping[str, Callable[[Context], None]],
    on_transition: Callable[[str, str, Outcome | None], None] | None = None,
    transitions: tuple[TransitionRow, ...] = TRANSITIONS,
) -> Outcome:
    """Run to a terminal state and return the outcome; raises nothing but ``Interrupted``."""
    model = _Model()
    build_machine(model, ctx, callbacks, transitions=transitions)
    outcome: Outcome | None = None
    while model.state not in TERMINAL:
        name = model.state
        guards: dict[str, bool] = {}
        try:
            _run_state(ctx, name, registry[name])
        except Exception as exc:
            if (stop := interruption(exc)) is not None:
                raise Interrupted(stop.signame) from exc
            outcome = _state_failed(ctx, name, exc)
            getattr(model, "fail")()  # noqa: B009 - trigger bound by transitions
        else:
            guards = _guard_values(ctx, name, transitions)
            if not getattr(model, "advance")():  # noqa: B009
                outcome = Outcome(Code.INTERNAL_ERROR, name, f"no transition from {name}")
                getattr(model, "fail")()  # noqa: B009
        ctx.journal.event(
            "transition",
            durable=True,
            source=name,
            dest=model.state,
            trigger="fail" if model.state == "failed" else "advance",
            guards=guards if model.state != "failed" else {},
        )
        if on_transition is not None:
            on_transition(name, model.state, outcome)
    if outcome is None:
        outcome = Outcome(Code.OK, "done", _done_message(ctx))
    return outcome


def _done_message(ctx: Context) -> str:
    """What a run that ended in done did: provisioned, or why there was nothing to do."""
    f = ctx.facts_
    if f is not None and f.skip_gpu_install:
        return f"GPU driver install skipped ({f.skip_gpu_install})"
    if f is not None and f.no_gpu:
        return f"nothing to provision: {f.no_gpu}"
    return "node provisioned"
