"""nvidia-persistenced: started (``driver.persistenced``) when the installed driver ships it.

A unit already on the node is used as it is; else UNIT_TEXT is written (the runfile
ships the daemon, no unit). Persistence spares each pod's first CUDA context the init.
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.install import records
from bootfsm.install.daemons import PERSISTENCED
from bootfsm.install.units import systemctl
from bootfsm.machine.context import Context

__all__ = ["BIN", "UNIT", "UNIT_PATH", "UNIT_TEXT", "ensure", "provided", "ready"]

BIN = "/usr/bin/nvidia-persistenced"
UNIT = PERSISTENCED.unit
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/lib/systemd/system",
             "/usr/lib/systemd/system")  # fmt: skip
# root, as AgentBaker's unit (NVIDIA's sample adds --user and a dedicated account)
UNIT_TEXT = """\
# Written by bootfsm (docs/node-contract.md): the runfile ships nvidia-persistenced, no unit.
[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=forking
PIDFile=/var/run/nvidia-persistenced/nvidia-persistenced.pid
ExecStart=/usr/bin/nvidia-persistenced --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
Restart=always
TimeoutSec=300

[Install]
WantedBy=multi-user.target
"""


def provided(ctx: Context) -> bool:
    """The installed driver ships the daemon."""
    return ctx.host.exists(BIN)


def _wanted(ctx: Context) -> bool:
    return ctx.config.driver.persistenced and provided(ctx)


def _unit_on_node(ctx: Context) -> str | None:
    return next((f"{d}/{UNIT}" for d in UNIT_DIRS if ctx.host.exists(f"{d}/{UNIT}")), None)


def ready(ctx: Context) -> bool:
    """Nothing to do (off, or the driver has no daemon), or the unit enabled and active."""
    return not _wanted(ctx) or PERSISTENCED.ready(ctx)


def ensure(ctx: Context) -> None:
    """Write the unit if the node has none, enable and start it, require it active
    (DRIVER_NOT_STARTED otherwise: the daemon could not open the GPUs)."""
    if not _wanted(ctx):
        if ctx.config.driver.persistenced:
            ctx.event("persistenced.skipped", reason=f"{BIN} is not installed by this driver")
        return
    code = Code.DRIVER_NOT_STARTED
    unit = _unit_on_node(ctx)
    if unit is None:
        records.write_file(ctx, UNIT_PATH, UNIT_TEXT)
        systemctl(ctx, "daemon-reload", code=code)
        unit = UNIT_PATH
    PERSISTENCED.ensure_running(ctx)
    ctx.event("persistenced.active", unit=unit)
