"""join: containerd NVIDIA runtime, /dev/char symlinks, kubelet healthy, readiness marker."""

from __future__ import annotations

import json

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.install import containerd, records
from bootfsm.install.cdi import CDI_SPEC, CDI_TOLERATED, refresh_cdi, unit_installed
from bootfsm.install.containerd import CONFIG, DROPIN, ContainerdConfigError
from bootfsm.install.daemons import CONTAINERD, KUBELET, kubelet_healthy
from bootfsm.machine.context import Context
from bootfsm.parsers import ParseError
from bootfsm.parsers.driver_info import parse_containerd_version

NAME = "join"
UDEV_RULE = "/etc/udev/rules.d/71-nvidia-dev-char.rules"
UDEV_TEXT = (
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", '
    'RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks --create-all"\n'
)


def _marker(ctx: Context) -> str:
    return f"{ctx.config.run.state_dir}/ready"


def _containerd_major(ctx: Context) -> int:
    argv, code = ["containerd", "--version"], Code.CONTAINERD_RESTART_FAILED
    r = ctx.require(argv, code=code, timeout=30, die_with_bootfsm=False)  # only reads
    try:
        return parse_containerd_version(r.output)[0]
    except ParseError as exc:
        raise BootError(Code.CONTAINERD_RESTART_FAILED, str(exc)) from exc


def satisfied(ctx: Context) -> bool:
    """Marker matches this driver and config, files in place, kubelet healthy."""
    try:
        marker = json.loads(ctx.host.read_text(_marker(ctx)) or "{}")
    except ValueError:
        return False
    have = (marker.get("driver_version"), marker.get("config_digest"))
    if have != (ctx.config.driver.version, ctx.config.digest()):
        return False
    if not ctx.host.exists(DROPIN) or ctx.host.read_text(UDEV_RULE) != UDEV_TEXT:
        return False
    if ctx.config.join.cdi_refresh and not _cdi_fresh(ctx):
        return False
    try:
        if containerd.ensure_import(ctx.host.read_text(CONFIG)) is not None:
            return False  # config.toml does not import the drop-in (edited since?)
    except ContainerdConfigError:
        return False
    return not ctx.config.join.start_kubelet or kubelet_healthy(ctx)


def _cdi_fresh(ctx: Context) -> bool:
    """Refresh unit installed (its spec is its own, per boot), or a CDI spec newer
    than this boot's /dev/nvidia-uvm (devtmpfs), so every boot regenerates it."""
    if unit_installed(ctx):
        return True
    uvm = ctx.host.mtime("/dev/nvidia-uvm")
    spec = max((ctx.host.mtime(p) or -1.0 for p in (CDI_SPEC, CDI_TOLERATED)), default=-1.0)
    return uvm is not None and spec >= uvm


def wire_containerd(ctx: Context, major: int) -> bool:
    """Write the runtime drop-in, import it from config.toml (imports line only,
    atomic), check containerd's merged view; True when a file changed.
    CONTAINERD_CONFIG_INVALID or CONTAINERD_RUNTIME_MISSING."""
    current = ctx.host.read_text(CONFIG)
    try:
        dropin = containerd.dropin_text(current, major)
        edited = containerd.ensure_import(current, major=major)
    except ContainerdConfigError as exc:
        raise BootError(Code.CONTAINERD_CONFIG_INVALID, f"{CONFIG}: {exc}") from exc
    changed = ctx.host.read_text(DROPIN) != dropin
    if changed:
        records.write_file(ctx, DROPIN, dropin)
    if edited is not None:
        st = ctx.host.stat(CONFIG)
        mode = st.st_mode & 0o7777 if st else 0o644
        edit = containerd.import_edit(current, edited) if current is not None else None
        records.write_file(ctx, CONFIG, edited, mode, edit=edit)  # uninstall undoes it
        ctx.event("containerd.import_added", config=CONFIG, entry=containerd.DROPIN_GLOB)
        changed = True
    argv = ["containerd", "--config", str(ctx.host.path(CONFIG)), "config", "dump"]
    limit = max(0.0, min(30.0, ctx.remaining()))
    r, dump = ctx.host.capture(argv, timeout=limit, die_with_bootfsm=False)  # only reads
    if not r.ok:
        raise BootError(
            Code.CONTAINERD_CONFIG_INVALID,
            f"containerd config dump refused {CONFIG}",
            output=r.output[-1000:],
        )
    try:
        problem = containerd.runtime_problem(dump, major, edited or current)
    except ContainerdConfigError as exc:
        problem = str(exc)
    if problem:
        raise BootError(Code.CONTAINERD_RUNTIME_MISSING, f"containerd config dump: {problem}")
    return changed


def run(ctx: Context) -> None:
    """Wire containerd, device symlinks, CDI spec, start kubelet, write the ready marker."""
    cfg = ctx.config.join
    changed = wire_containerd(ctx, _containerd_major(ctx))
    if ctx.host.read_text(UDEV_RULE) != UDEV_TEXT:
        records.write_file(ctx, UDEV_RULE, UDEV_TEXT)
    ctx.require(
        ["nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all"],
        code=Code.DRIVER_NOT_STARTED,
        timeout=60,
    )
    if cfg.cdi_refresh:
        refresh_cdi(ctx)
    if changed or not CONTAINERD.running(ctx):
        CONTAINERD.restart(ctx, timeout=cfg.containerd_restart_timeout)
    if cfg.start_kubelet:
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
    marker = {
        "driver_version": ctx.config.driver.version,
        "config_digest": ctx.config.digest(),
        "run_id": ctx.journal.run_id,
        "wall_time": ctx.host.wall(),
    }
    records.write_file(ctx, _marker(ctx), json.dumps(marker) + "\n", 0o600)
