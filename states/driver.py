"""driver: nouveau off, container toolkit debs, the NVIDIA driver built by DKMS and loaded.

Satisfied when nouveau is blacklisted, the toolkit is at the configured version, DKMS
has the configured driver built for the running kernel, and that version is loaded.
"""

from __future__ import annotations

from bootfsm import dpkg
from bootfsm.codes import Code
from bootfsm.context import Context
from bootfsm.errors import BootError
from bootfsm.hardware import requires_open_module
from bootfsm.parsers import ParseError
from bootfsm.parsers.driver_info import parse_dkms_status
from bootfsm.store import verified

NAME = "driver"

BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
BLACKLIST_TEXT = "blacklist nouveau\noptions nouveau modeset=0\n"
INSTALLER_LOG = "/var/log/nvidia-installer.log"


def _toolkit_ok(ctx: Context) -> bool:
    want = ctx.config.sources.toolkit_version
    return all(dpkg.installed_version(ctx, p) == want for p in ctx.config.sources.toolkit_packages)


def _loaded(ctx: Context) -> str | None:
    return (ctx.host.read_text("/sys/module/nvidia/version") or "").strip() or None


def _built(ctx: Context) -> bool:
    if ctx.host.which("dkms") is None:
        return False
    r = ctx.run(["dkms", "status", "-m", "nvidia"], timeout=30)
    try:
        entries = parse_dkms_status(r.output) if r.ok else []
    except ParseError:
        return False
    return any(
        e.version == ctx.config.driver.version
        and e.kernel == ctx.facts.kernel
        and e.status.startswith("installed")
        for e in entries
    )


def satisfied(ctx: Context) -> bool:
    """Blacklist, toolkit, DKMS build and loaded module all match the config."""
    if ctx.host.read_text(BLACKLIST) != BLACKLIST_TEXT or not _toolkit_ok(ctx):
        return False
    if not ctx.config.driver.install:
        return _loaded(ctx) is not None
    return _loaded(ctx) == ctx.config.driver.version and _built(ctx)


def _blacklist_nouveau(ctx: Context) -> None:
    if ctx.host.read_text(BLACKLIST) == BLACKLIST_TEXT:
        return
    ctx.host.write_atomic(BLACKLIST, BLACKLIST_TEXT)
    ctx.require(["update-initramfs", "-u"], code=Code.DRIVER_INSTALL_FAILED, timeout=300)


def _toolkit(ctx: Context) -> None:
    if _toolkit_ok(ctx):
        return
    order = {n: i for i, n in enumerate(ctx.config.sources.toolkit_packages)}
    debs = sorted(verified(ctx, "toolkit"), key=lambda ap: order.get(ap[0].name, 99))
    dpkg.install_debs(
        ctx, [p for _, p in debs], force=["overwrite"], code=Code.TOOLKIT_INSTALL_FAILED
    )


def _unload_other(ctx: Context) -> None:
    loaded = _loaded(ctx)
    if loaded is None or loaded == ctx.config.driver.version:
        return
    r = ctx.run(["modprobe", "-r", "nvidia"], timeout=60)
    if not r.ok or _loaded(ctx) is not None:
        raise BootError(
            Code.REBOOT_REQUIRED,
            f"driver {loaded} is loaded and in use; {ctx.config.driver.version} needs a reboot",
            output=r.output[-1000:],
        )
    ctx.event("driver.unloaded", version=loaded)


def _module_type(ctx: Context, installer: str) -> str:
    mt = ctx.config.driver.module_type
    if mt != "auto":
        return mt
    r = ctx.run([installer, "--print-recommended-kernel-module-type"], timeout=60)
    for line in r.output.splitlines():
        key, _, value = line.strip().partition("=")
        if key == "kernel_module_type" and value in ("open", "proprietary"):
            return value
    fallback = "open" if requires_open_module([g.model for g in ctx.facts.gpus]) else "proprietary"
    ctx.warn(f"installer gave no module type recommendation; using {fallback}")
    return fallback


def _install(ctx: Context) -> None:
    kernel = ctx.facts.kernel
    if not ctx.host.exists(f"/lib/modules/{kernel}/build"):
        raise BootError(
            Code.KERNEL_HEADERS_MISSING, f"/lib/modules/{kernel}/build is missing; DKMS needs it"
        )
    [(art, runfile)] = verified(ctx, "runfile")
    target = f"{ctx.config.run.state_dir}/extract/{art.filename.removesuffix('.run')}"
    ctx.host.rmtree(target)
    ctx.host.makedirs(target.rsplit("/", 1)[0], mode=0o700)
    runfile.chmod(0o700)
    ctx.require(
        [str(runfile), "-x", "--target", str(ctx.host.path(target))],
        code=Code.DRIVER_INSTALL_FAILED,
        timeout=300,
        what="runfile extraction failed",
    )
    installer = str(ctx.host.path(f"{target}/nvidia-installer"))
    mt = _module_type(ctx, installer)
    ctx.event("driver.install", version=ctx.config.driver.version, module_type=mt, kernel=kernel)
    ctx.require(
        [
            installer,
            "-s",
            "-a",
            "--no-drm",
            "--dkms",
            f"--kernel-name={kernel}",
            f"--kernel-module-type={mt}",
            f"--log-file-name={ctx.host.path(INSTALLER_LOG)}",
        ],
        code=Code.DRIVER_INSTALL_FAILED,
        timeout=ctx.config.driver.command_timeout,
        what="nvidia-installer failed",
    )


def run(ctx: Context) -> None:
    """Blacklist nouveau, install the toolkit, build the driver if needed, load it."""
    _blacklist_nouveau(ctx)
    _toolkit(ctx)
    if not ctx.config.driver.install:
        ctx.event("driver.skipped", reason="driver.install = false: the image ships a driver")
        return
    _unload_other(ctx)
    if not _built(ctx):
        _install(ctx)
    ctx.require(["nvidia-modprobe", "-u", "-c0"], code=Code.MODULE_LOAD_FAILED, timeout=120)
    ctx.require(["ldconfig"], code=Code.DRIVER_INSTALL_FAILED, timeout=120)
