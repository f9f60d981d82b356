"""systemd units through `systemctl` (found on PATH); small, bounded, read or act."""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.host.host import CommandResult
from bootfsm.machine.context import Context

__all__ = ["enabled_state", "is_active", "systemctl"]

_QUERY_TIMEOUT = 15.0


def is_active(ctx: Context, unit: str) -> bool:
    """True when `systemctl is-active UNIT` says active."""
    r = ctx.run(["systemctl", "is-active", unit], timeout=_QUERY_TIMEOUT, probe=True)
    return r.output.strip().splitlines()[-1:] == ["active"]


def enabled_state(ctx: Context, unit: str) -> str:
    """`systemctl is-enabled UNIT`: enabled, disabled, masked, static... or '' if unknown."""
    r = ctx.run(["systemctl", "is-enabled", unit], timeout=_QUERY_TIMEOUT, probe=True)
    words = r.output.strip().split()
    known = {"enabled", "enabled-runtime", "disabled", "masked", "masked-runtime", "static"}
    return words[-1] if words and words[-1] in known else ""


def systemctl(
    ctx: Context, *args: str, code: Code, timeout: float = 60.0, what: str = ""
) -> CommandResult:
    """Run `systemctl ARGS`; raise with ``code`` when it fails."""
    return ctx.require(["systemctl", *args], code=code, timeout=timeout, what=what)
