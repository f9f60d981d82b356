"""CSE's clock: what is left of the provisioning script's time budget, and the hook's
deadline inside it.

Read from Azure/AgentBaker 06836ee2301e362039418c3a7ed0fe6004a641fd,
parts/linux/cloud-init/artifacts: cse_start.sh exports ``CSE_STARTTIME_SECONDS`` (epoch
seconds at its start) and runs the script under ``timeout -k5s "${CSE_TIMEOUT:-15m}"``
(cse_cmd.sh sets ``CSE_TIMEOUT`` in seconds, 900 by default); cse_helpers.sh's
``check_cse_timeout`` fails once more than ``${CSE_MAX_DURATION_SECONDS:-780}`` seconds
have passed since then, and every ``retrycmd_*`` after the GPU step gives up on it. An
empty variable counts as unset there, and here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from bootfsm.core.config import ConfigError

__all__ = [
    "MAX_DURATION_DEFAULT",
    "OUTER_TIMEOUT_DEFAULT",
    "CseBudget",
    "HookDeadline",
    "hook_deadline",
    "read_budget",
    "timeout_seconds",
]

MAX_DURATION_DEFAULT = 780  # check_cse_timeout's ${CSE_MAX_DURATION_SECONDS:-780}
OUTER_TIMEOUT_DEFAULT = "15m"  # cse_start.sh's ${CSE_TIMEOUT:-15m}
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smhd]?)")


def timeout_seconds(text: str) -> float:
    """timeout(1)'s DURATION in seconds: a number with an optional s, m, h or d suffix
    (0: no timeout, returned as inf); ``ValueError`` for anything else."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a timeout(1) duration: {text[:40]!r}")
    seconds = float(m[1]) * _UNITS[m[2]]
    return math.inf if seconds == 0 else seconds


@dataclass(frozen=True)
class CseBudget:
    """CSE's budget as the hook finds it: ``limit`` seconds from ``started``."""

    started: int  # CSE_STARTTIME_SECONDS
    elapsed: float  # seconds since then, never below 0 (a wall clock set back)
    limit: float  # the first of check_cse_timeout's limit and the outer timeout
    source: str  # which one, and where its value came from

    @property
    def left(self) -> float:
        """Seconds left of the budget, at least 0."""
        return max(0.0, self.limit - self.elapsed)


def _integer(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not raw.isascii():
        raise ConfigError(f"{name}: expected whole seconds, got {raw[:40]!r}")
    return int(raw)


def read_budget(env: Mapping[str, str], now: float) -> CseBudget | None:
    """The budget CSE's environment gives at wall time ``now``; None without
    ``CSE_STARTTIME_SECONDS`` (an image build, a run by hand: no CSE clock, as
    check_cse_timeout says); ``ConfigError`` naming the variable that does not parse."""
    started = _integer(env, "CSE_STARTTIME_SECONDS")
    if started is None:
        return None
    max_duration = _integer(env, "CSE_MAX_DURATION_SECONDS")
    check = float(MAX_DURATION_DEFAULT if max_duration is None else max_duration)
    check_src = (
        f"check_cse_timeout: CSE_MAX_DURATION_SECONDS={max_duration}"
        if max_duration is not None
        else f"check_cse_timeout: CSE_MAX_DURATION_SECONDS unset, {MAX_DURATION_DEFAULT}"
    )
    raw = env.get("CSE_TIMEOUT", "").strip()
    try:
        outer = timeout_seconds(raw or OUTER_TIMEOUT_DEFAULT)
    except ValueError as exc:
        raise ConfigError(f"CSE_TIMEOUT: {exc}") from None
    outer_src = f"timeout: CSE_TIMEOUT={raw}" if raw else "timeout: CSE_TIMEOUT unset, 15m"
    limit, source = (check, check_src) if check <= outer else (outer, outer_src)
    return CseBudget(started, max(0.0, now - started), limit, source)


@dataclass(frozen=True)
class HookDeadline:
    """The hook's global deadline: ``seconds`` (<= 0: the budget is already spent)."""

    seconds: float
    source: str  # "CSE budget", or the cap's: "--deadline", "BOOTFSM_DEADLINE", "run.deadline"
    note: str  # said after "global deadline of N s" when the budget set it
    fields: dict[str, object]  # the run.start journal's cse_budget

    @property
    def spent(self) -> str:
        """Why the GPU step must not start ('' while time is left)."""
        if self.seconds > 0:
            return ""
        f = self.fields
        return (
            f"CSE's budget is spent: {f['elapsed_s']:g} s of {f['budget_s']:g} s "
            f"({f['budget_source']}) gone since CSE_STARTTIME_SECONDS={f['started']}, "
            f"{f['left_s']:g} s left and {f['reserve_s']:g} s kept for the steps after the "
            "GPU step (run.cse_reserve); the GPU step was not started"
        )


def hook_deadline(budget: CseBudget, reserve: float, cap: float, cap_source: str) -> HookDeadline:
    """What is left of ``budget`` less ``reserve`` (the steps after the GPU step: the
    managed GPU experience, the API server check, ensureKubelet), capped by ``cap``."""
    left = budget.left
    available = left - reserve
    seconds, source = (available, "CSE budget") if available < cap else (cap, cap_source)
    seconds = round(seconds, 1)  # "global deadline of 13.1 s", not of 13.0359 s
    fields: dict[str, object] = {
        "started": budget.started,
        "elapsed_s": round(budget.elapsed, 1),
        "budget_s": budget.limit,
        "budget_source": budget.source,
        "left_s": round(left, 1),
        "reserve_s": reserve,
        "deadline_s": max(0.0, seconds),
        "deadline_source": source,
    }
    note = ""
    if source == "CSE budget":
        note = (
            f" (CSE's budget: {left:.0f} s left, {reserve:g} s kept for the steps after the"
            " GPU step)"
        )
    return HookDeadline(seconds, source, note, fields)
