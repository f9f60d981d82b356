"""systemd units through `systemctl` (found on PATH); small, bounded, read or act."""

from __future__ import annotations

from dataclasses import dataclass

from bootfsm.core.codes import Code
from bootfsm.host.host import CommandResult
from bootfsm.machine.context import Context

__all__ = ["UnitState", "enabled_state", "is_active", "parse_show", "systemctl", "unit_state"]

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
    """Pure: `systemctl show -p UnitFileState -p ActiveState UNIT` (``Key=value`` lines, in
    systemd's order; other lines ignored) -> its UnitState."""
    props = dict(line.partition("=")[::2] for line in output.splitlines() if "=" in line)
    enabled = props.get("UnitFileState", "").strip()
    return UnitState(enabled if enabled in _ENABLED else "", props.get("ActiveState") == "active")


def unit_state(ctx: Context, unit: str) -> UnitState:
    """Enablement and activity of ``unit`` in one command (a postcondition asks both)."""
    argv = ["systemctl", "show", "-p", "UnitFileState", "-p", "ActiveState", unit]
    return parse_show(ctx.run(argv, timeout=_QUERY_TIMEOUT, probe=True).output)


def systemctl(
    ctx: Context, *args: str, code: Code, timeout: float = 60.0, what: str = ""
) -> CommandResult:
    """Run `systemctl ARGS`; raise with ``code`` when it fails."""
    return ctx.require(["systemctl", *args], code=code, timeout=timeout, what=what)
