"""The host daemons bootfsm owns (after EKS nodeadm's daemons): each a systemd unit with
a failure code, asked ``configured``, ``running`` and ``ensure_running``; kubelet's
health beyond "active" is ``kubelet_healthy``.

A unit name or its failure code is written down once, here.
"""

from __future__ import annotations

from dataclasses import dataclass

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.install import records, units
from bootfsm.install.units import UnitState, systemctl, unit_state, unit_states
from bootfsm.machine.context import Context

__all__ = [
    "ALL",
    "CONTAINERD",
    "DRIVER_USERS",
    "FABRIC_MANAGER",
    "IMEX",
    "KUBELET",
    "PERSISTENCED",
    "Daemon",
    "kubelet_healthy",
]

# what "enabled" can be: a static unit (no [Install]: Canonical's packaged
# nvidia-persistenced.service, which its udev rule pulls in when the driver binds) cannot
# be enabled; `systemctl enable` of it changes nothing (systemctl(1): "static")
_CONFIGURED = frozenset({"enabled", "static"})


@dataclass(frozen=True)
class Daemon:
    """One host daemon: its unit, the code its failures get, how long it may take to start."""

    name: str
    unit: str
    code: Code
    start_timeout: float = 120.0
    masked: bool = False  # it must not run on the host: configured means masked

    def state(self, ctx: Context) -> UnitState:
        """Enablement and activity, from one `systemctl show` of every daemon here (``ALL``)."""
        names = [d.unit for d in ALL] if self in ALL else [self.unit]
        found = unit_states(ctx, names).get(self.unit)
        return found if found is not None else unit_state(ctx, self.unit)

    def configured(self, ctx: Context) -> bool:
        """Enabled, or static (masked, for a host-masked daemon)."""
        state = self.state(ctx).enabled
        return state == "masked" if self.masked else state in _CONFIGURED

    def running(self, ctx: Context) -> bool:
        """Active."""
        return self.state(ctx).active

    def ready(self, ctx: Context) -> bool:
        """Enabled and active (a postcondition's question)."""
        state = self.state(ctx)
        return state.enabled in _CONFIGURED and state.active

    def start(self, ctx: Context, *, reset_failed: bool = False) -> None:
        """Enable unless enabled, start unless active (``reset_failed`` first);
        ``code`` on failure."""
        state = self.state(ctx)
        if state.enabled not in _CONFIGURED:
            systemctl(ctx, "enable", self.unit, code=self.code)
            records.unit_done(ctx, "enable", self.unit)  # uninstall disables it again
        if state.active:
            return
        if reset_failed:
            units.reset_failed(ctx, self.unit)
        what = f"systemctl start {self.unit} failed"
        systemctl(ctx, "start", self.unit, code=self.code, timeout=self.start_timeout, what=what)
        records.unit_done(ctx, "start", self.unit)

    def ensure_running(self, ctx: Context, *, reset_failed: bool = False) -> None:
        """``start``, then ``code`` unless it is active."""
        self.start(ctx, reset_failed=reset_failed)
        if not self.running(ctx):
            raise BootError(self.code, f"{self.unit} is not active after start")

    def restart(self, ctx: Context, *, timeout: float | None = None) -> None:
        """Restart it (its configuration changed); ``code`` when systemctl fails."""
        systemctl(ctx, "restart", self.unit, code=self.code, timeout=timeout or self.start_timeout)

    def require_running(self, ctx: Context) -> None:
        """``code`` unless active (a later state checking a daemon an earlier one started)."""
        if not self.running(ctx):
            raise BootError(self.code, f"{self.unit} is not active")

    def stop(self, ctx: Context) -> None:
        """Stop it (it stays enabled); ``code`` when systemctl fails."""
        systemctl(ctx, "stop", self.unit, code=self.code, timeout=self.start_timeout)

    def disable(self, ctx: Context) -> None:
        """Stop and disable it."""
        systemctl(ctx, "disable", "--now", self.unit, code=self.code)

    def mask(self, ctx: Context) -> None:
        """Stop, disable and mask it, recorded (it must not run on this host); no-op when masked."""
        state = self.state(ctx).enabled
        if state == "masked":
            return
        if state == "enabled":
            self.disable(ctx)
        systemctl(ctx, "mask", self.unit, code=self.code)
        records.unit_done(ctx, "mask", self.unit)


FABRIC_MANAGER = Daemon(
    "fabric manager", "nvidia-fabricmanager.service", Code.FABRIC_MANAGER_FAILED, 180.0
)
"""x86_64 NVSwitch and NVLink5 systems; its unit runs the start script (states/fabric.py)."""

IMEX = Daemon("IMEX", "nvidia-imex.service", Code.IMEX_INSTALL_FAILED, masked=True)
"""Grace-Blackwell: the DRA driver runs IMEX per ComputeDomain; the host unit stays masked."""

PERSISTENCED = Daemon("persistence daemon", "nvidia-persistenced.service", Code.DRIVER_NOT_STARTED)
"""Keeps the GPUs initialized between clients (bootfsm/install/persistenced.py)."""

CONTAINERD = Daemon("containerd", "containerd.service", Code.CONTAINERD_RESTART_FAILED)
"""Restarted when its NVIDIA runtime configuration changes (states/join.py)."""

KUBELET = Daemon("kubelet", "kubelet.service", Code.KUBELET_NOT_HEALTHY)
"""Started last; healthy when ``kubelet_healthy`` (states/join.py sets the wait)."""


def kubelet_healthy(ctx: Context) -> bool:
    """kubelet's healthz (``join.kubelet_healthz_url``) answers 200 ``ok``; an error is not."""
    try:
        r = ctx.http.get(ctx.config.join.kubelet_healthz_url, timeout=3, check=False)
    except (TransientError, BootError):
        return False
    return r.status == 200 and r.body.strip() == b"ok"


DRIVER_USERS = (PERSISTENCED, FABRIC_MANAGER)
"""The daemons bootfsm runs that keep /dev/nvidia* open, in the order NVIDIA's driver
container stops them before it unloads the modules and starts them after it loads them
(NVIDIA/gpu-driver-container nvidia-driver ``_unload_driver`` / ``_load_driver``:
persistence daemon, grid daemon, fabric manager, NVLSM; NVLSM runs inside the fabric
manager unit here, through nvidia-fabricmanager-start.sh, so stopping the unit stops
both). IMEX stays masked on the host and is never started by bootfsm."""

ALL = (PERSISTENCED, FABRIC_MANAGER, IMEX, CONTAINERD, KUBELET)
"""Every daemon bootfsm owns, in the order `systemctl show` is asked about them."""
