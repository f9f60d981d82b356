"""systemd units through `systemctl` (found on PATH); small, bounded, read or act."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from bootfsm.core.codes import Code
from bootfsm.host.host import CommandResult
from bootfsm.machine.context import Context

__all__ = [
    "UnitState",
    "enabled_state",
    "is_active",
    "parse_show",
    "parse_show_units",
    "reset_failed",
    "systemctl",
    "unit_state",
    "unit_states",
]

_QUERY_TIMEOUT = 15.0


def is_active(ctx: Context, unit: str) -> bool:
    """True when `systemctl is-active UNIT` says active."""
    r = ctx.run(["systemctl", "is-active", unit], timeout=_QUERY_TIMEOUT, probe=True)
    return r.output.strip().splitlines()[-1:] == ["active"]


def enabled_state(ctx: Context, unit: str) -> str:
    """`systemctl is-enabled UNIT`: enabled, disabled, masked, static... or '' if unknown."""
    r = ctx.run(["systemctl", "is-enabled", unit], timeout=_QUERY_TIMEOUT, probe=True)
    words = r.output.strip().split()
    return words[-1] if words and words[-1] in _ENABLED else ""


_ENABLED = {"enabled", "enabled-runtime", "disabled", "masked", "masked-runtime", "static"}


@dataclass(frozen=True)
class UnitState:
    """What `systemctl is-enabled` and `is-active` would say, from one `systemctl show`."""

    enabled: str  # enabled, disabled, masked, static... or '' (no unit file)
    active: bool


def parse_show(output: str) -> UnitState:
    """Pure: `systemctl show -p UnitFileState -p ActiveState UNIT` -> its UnitState."""
    props = dict(line.partition("=")[::2] for line in output.splitlines() if "=" in line)
    enabled = props.get("UnitFileState", "").strip()
    return UnitState(enabled if enabled in _ENABLED else "", props.get("ActiveState") == "active")


def parse_show_units(output: str, units: Sequence[str]) -> dict[str, UnitState]:
    """Pure: `systemctl show -p Id -p UnitFileState -p ActiveState U1 U2...` -> unit ->
    its UnitState; {} unless there is exactly one ``Id=`` block per unit (nothing guessed)."""
    # one block per unit in the order named, blank-line separated (systemctl-show.c)
    blocks = [b for b in re.split(r"\n[ \t]*\n", output) if re.search(r"^Id=", b, re.M)]
    if len(blocks) != len(units):
        return {}
    return {u: parse_show(b) for u, b in zip(units, blocks, strict=True)}


def unit_states(ctx: Context, units: Sequence[str]) -> dict[str, UnitState]:
    """Enablement and activity of several units from one `systemctl show` ({} when its
    output cannot be split per unit: the caller asks each then)."""
    argv = ["systemctl", "show", "-p", "Id", "-p", "UnitFileState", "-p", "ActiveState"]
    return parse_show_units(
        ctx.run([*argv, *units], timeout=_QUERY_TIMEOUT, probe=True).output, units
    )


def unit_state(ctx: Context, unit: str) -> UnitState:
    """Enablement and activity of ``unit`` in one command (a postcondition asks both)."""
    argv = ["systemctl", "show", "-p", "UnitFileState", "-p", "ActiveState", unit]
    return parse_show(ctx.run(argv, timeout=_QUERY_TIMEOUT, probe=True).output)


def systemctl(
    ctx: Context, *args: str, code: Code, timeout: float = 60.0, what: str = ""
) -> CommandResult:
    """Run `systemctl ARGS`; BootError ``code`` when it fails."""
    # untied from bootfsm's life: PID 1 runs the job whether systemctl lives (systemctl(1))
    argv = ["systemctl", *args]
    return ctx.require(argv, code=code, timeout=timeout, what=what, die_with_bootfsm=False)


def reset_failed(ctx: Context, *units: str) -> None:
    """`systemctl reset-failed UNITS` (untied), so a start is not refused for an earlier
    failure; its answer is not checked."""
    ctx.run(["systemctl", "reset-failed", *units], timeout=_QUERY_TIMEOUT, die_with_bootfsm=False)
