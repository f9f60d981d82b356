"""join: hand the GPUs to the node's container runtime, then (optionally) start kubelet.

Steps, in order: containerd's NVIDIA runtime (install/containerd.py), the /dev/char
symlinks, the CDI spec (install/cdi.py), containerd restarted when its configuration
changed; last and optional, kubelet started and healthy (``join.start_kubelet``: off in
both deployments, where bootfsm.service passes ``--no-start-kubelet`` and the
provisioning hook leaves kubelet to AgentBaker's ``ensureKubelet``). The ready marker
(install/marker.py) records that they all ran for this driver and configuration.
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.install import cdi, containerd, records
from bootfsm.install.daemons import CONTAINERD, KUBELET, kubelet_healthy
from bootfsm.install.marker import MarkerError, ReadyMarker, ready_path
from bootfsm.machine.context import Context

NAME = "join"
UDEV_RULE = "/etc/udev/rules.d/71-nvidia-dev-char.rules"
UDEV_TEXT = (
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
    'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n'
)


def _ready(ctx: Context) -> bool:
    """The ready marker was written for this driver and configuration."""
    text = ctx.host.read_text(ready_path(ctx.config))
    try:
        return text is not None and ReadyMarker.parse(text).fits(ctx.config)
    except MarkerError:
        return False


def satisfied(ctx: Context) -> bool:
    """Read-only: the ready marker fits, every step's result is still in place."""
    cfg = ctx.config.join
    return (
        _ready(ctx)
        and containerd.wired(ctx)
        and ctx.host.read_text(UDEV_RULE) == UDEV_TEXT
        and (not cfg.cdi_refresh or cdi.spec_fresh(ctx))
        and (not cfg.start_kubelet or kubelet_healthy(ctx))
    )


def _device_links(ctx: Context) -> None:
    """The udev rule that keeps /dev/char symlinks, and the symlinks now."""
    if ctx.host.read_text(UDEV_RULE) != UDEV_TEXT:
        records.write_file(ctx, UDEV_RULE, UDEV_TEXT)
    ctx.require(
        ["nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all"],
        code=Code.DRIVER_NOT_STARTED,
        timeout=60,
    )


def _start_kubelet(ctx: Context) -> None:
    """Start kubelet and wait for its health endpoint; KUBELET_NOT_HEALTHY at the limit."""
    cfg = ctx.config.join
    KUBELET.start(ctx)
    ctx.wait_until(
        lambda: True if kubelet_healthy(ctx) else None,
        timeout=cfg.kubelet_timeout,
        interval=cfg.kubelet_poll_interval,
        on_timeout=lambda: BootError(
            Code.KUBELET_NOT_HEALTHY,
            f"{cfg.kubelet_healthz_url} did not answer ok within {cfg.kubelet_timeout:g} s",
        ),
    )


def run(ctx: Context) -> None:
    """Wire containerd, device symlinks, CDI spec; kubelet if asked; the ready marker."""
    cfg = ctx.config.join
    changed = containerd.wire(ctx, containerd.major(ctx))
    _device_links(ctx)
    if cfg.cdi_refresh:
        cdi.refresh_cdi(ctx)
    if changed or not CONTAINERD.running(ctx):
        CONTAINERD.restart(ctx, timeout=cfg.containerd_restart_timeout)
    if cfg.start_kubelet:  # the optional last step
        _start_kubelet(ctx)
    marker = ReadyMarker(
        ctx.config.driver.version, ctx.config.digest(), ctx.journal.run_id, ctx.host.wall()
    )
    records.write_file(ctx, ready_path(ctx.config), marker.render(), 0o600)
