"""driver: nouveau off, container toolkit debs, the NVIDIA driver built by DKMS and loaded.

Satisfied when nouveau is blacklisted, the toolkit is at the configured version, DKMS
has the configured driver built for the running kernel, that version is loaded, and a
bake marker, when there is one, matches the node. The action compiles only when no
matching marker and usable module say the image (or an earlier boot) already built it
(``driver.prebaked`` journals the decision), then initializes in the order the stack
needs: load the module, libraries in place, ldconfig, nvidia-smi.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, replace

from bootfsm import __version__, dpkg
from bootfsm.codes import Code
from bootfsm.context import Context
from bootfsm.errors import BootError, TransientError
from bootfsm.hardware import requires_open_module
from bootfsm.marker import (
    Marker,
    check_marker,
    expected_marker,
    marker_path,
    module_type_of,
    parse_modinfo,
    read_marker,
    render_marker,
)
from bootfsm.parsers import ParseError
from bootfsm.parsers.driver_info import parse_dkms_status
from bootfsm.parsers.nvidia_smi import SmiFailure, classify_smi_failure
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


def _marker_mismatch(ctx: Context, m: Marker | str | None) -> tuple[str, str] | None:
    """(field, reason) when marker ``m`` rules out the node's module; None when it fits."""
    if m is None:
        return None
    if not isinstance(m, Marker):
        return "marker", m
    want = expected_marker(ctx.config, ctx.facts)
    needs_open = requires_open_module(g.model for g in ctx.facts.gpus)
    diff = check_marker(m, want, needs_open=needs_open)
    if not diff:
        return None
    d = diff[0]
    return d.field, f"marker says {d.field}={d.marker or '(none)'}; this node needs {d.node}"


def _nouveau_off(ctx: Context) -> bool:
    """The blacklist is in place and an initramfs was rebuilt after it was written.

    A run killed between writing the blacklist and `update-initramfs` rebuilds it on the
    rerun; otherwise nouveau would still load from the initramfs at the next boot.
    """
    if ctx.host.read_text(BLACKLIST) != BLACKLIST_TEXT:
        return False
    written = ctx.host.mtime(BLACKLIST) or 0.0
    built = [ctx.host.mtime(p) or 0.0 for p in ctx.host.glob("/boot/initrd.img-*")]
    return not built or max(built) >= written


def satisfied(ctx: Context) -> bool:
    """Blacklist, toolkit, DKMS build, loaded module and any bake marker match the config."""
    if not _nouveau_off(ctx) or not _toolkit_ok(ctx):
        return False
    if not ctx.config.driver.install:
        return _loaded(ctx) is not None
    loaded_ok = _loaded(ctx) == ctx.config.driver.version and _built(ctx)
    return loaded_ok and _marker_mismatch(ctx, read_marker(ctx.host, ctx.config)) is None


def skip_reason(ctx: Context) -> str | None:
    """Why the state was skipped (read-only; called only after ``satisfied`` held)."""
    cfg = ctx.config.driver
    if not cfg.install:
        return f"driver.install = false: the image's driver {_loaded(ctx)} is loaded"
    m = read_marker(ctx.host, ctx.config)
    where = f"built by {m.source} for {m.kernel}" if isinstance(m, Marker) else "DKMS-built"
    return f"driver {cfg.version} ({cfg.kind}) {where} and loaded; nothing to compile"


def blacklist_nouveau(ctx: Context, kernel: str | None = None) -> bool:
    """Blacklist nouveau and rebuild the initramfs (of ``kernel`` when given); True if changed."""
    if _nouveau_off(ctx):
        return False
    ctx.host.write_atomic(BLACKLIST, BLACKLIST_TEXT)
    argv = ["update-initramfs", "-u", *(["-k", kernel] if kernel else [])]
    ctx.require(argv, code=Code.DRIVER_INSTALL_FAILED, timeout=300)
    return True


def install_toolkit(ctx: Context) -> bool:
    """Install the verified container toolkit debs unless present; True if installed."""
    if _toolkit_ok(ctx):
        return False
    order = {n: i for i, n in enumerate(ctx.config.sources.toolkit_packages)}
    debs = sorted(verified(ctx, "toolkit"), key=lambda ap: order.get(ap[0].name, 99))
    dpkg.install_debs(
        ctx, [p for _, p in debs], force=["overwrite"], code=Code.TOOLKIT_INSTALL_FAILED
    )
    return True


def _unload_other(ctx: Context, rebuild: bool = False) -> None:
    loaded = _loaded(ctx)
    if loaded is None or (loaded == ctx.config.driver.version and not rebuild):
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


def build_module(ctx: Context, module_type: str | None = None, extra: Sequence[str] = ()) -> str:
    """Extract the verified runfile and DKMS-build the driver for ``ctx.facts.kernel``.

    ``module_type`` None follows the config (``auto`` asks the installer); ``extra`` is
    appended to the installer's argv (bake passes ``--skip-module-load``). Returns the
    module type built.
    """
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
    mt = module_type or _module_type(ctx, installer)
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
            *extra,
        ],
        code=Code.DRIVER_INSTALL_FAILED,
        timeout=ctx.config.driver.command_timeout,
        what="nvidia-installer failed",
    )
    return mt


def module_problem(ctx: Context, module_type: str = "") -> str | None:
    """Why the module for ``ctx.facts.kernel`` is unusable, or None when `dkms status`
    lists the configured version installed and `modinfo` agrees (version and, unless
    ``module_type`` is empty, the type its licence names)."""
    version, kernel = ctx.config.driver.version, ctx.facts.kernel
    if not _built(ctx):
        return f"dkms status lists no installed nvidia/{version} for {kernel}"
    if ctx.host.which("modinfo") is None:
        return "modinfo is not on PATH: cannot confirm the module"
    r = ctx.run(["modinfo", "-k", kernel, "nvidia"], timeout=30)
    info = parse_modinfo(r.output) if r.ok else {}
    if info.get("version") != version:
        return f"modinfo: nvidia for {kernel} is {info.get('version') or 'absent'}, not {version}"
    if module_type and module_type_of(info) != module_type:
        return f"modinfo: nvidia is {module_type_of(info) or 'of unknown type'}, not {module_type}"
    return None


def _needs_build(ctx: Context) -> bool:
    """Compile or not; the decision and its reason are journaled as ``driver.prebaked``."""
    m = read_marker(ctx.host, ctx.config)
    if m is None:
        built = _built(ctx)
        reason = f"no bake marker at {marker_path(ctx.config)}"
        ctx.event("driver.prebaked", match=False, field="marker", reason=reason, build=not built)
        return not built
    mismatch = _marker_mismatch(ctx, m)
    baked = asdict(m) if isinstance(m, Marker) else None
    if mismatch is not None:
        field, reason = mismatch
        ctx.event(
            "driver.prebaked", match=False, field=field, reason=reason, build=True, marker=baked
        )
        return True
    assert isinstance(m, Marker)
    problem = module_problem(ctx, m.module_type)
    ctx.event(
        "driver.prebaked",
        match=problem is None,
        field="module" if problem else "",
        reason=problem or f"{m.source} marker matches kernel, version, kind, arch and module",
        build=problem is not None,
        marker=baked,
    )
    return problem is not None


def _record_build(ctx: Context, module_type: str) -> None:
    """After a boot-time compile the marker describes that build (``source=boot``)."""
    m = replace(
        expected_marker(ctx.config, ctx.facts),
        module_type=module_type,
        source="boot",
        bootfsm=__version__,
        baked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ctx.host.wall())),
    )
    ctx.host.write_atomic(marker_path(ctx.config), render_marker(m), 0o600)


def _initialize(ctx: Context) -> None:
    """The order the stack needs: module loaded (nvidia-modprobe), libraries in place,
    ldconfig, then nvidia-smi answers."""
    install = ctx.config.driver.install
    if install:
        ctx.require(["nvidia-modprobe", "-u", "-c0"], code=Code.MODULE_LOAD_FAILED, timeout=120)
    else:
        r = (
            ctx.run(["nvidia-modprobe", "-u", "-c0"], timeout=120)
            if ctx.host.which("nvidia-modprobe")
            else None
        )
        if _loaded(ctx) is None:
            raise BootError(
                Code.MODULE_LOAD_FAILED,
                "driver.install = false, but no nvidia module is loaded and nvidia-modprobe "
                f"could not load one: the image must ship a driver for {ctx.facts.kernel} "
                "(or set driver.install = true)",
                output=r.output[-1000:] if r else "nvidia-modprobe is not on PATH",
            )
    lib = f"/usr/lib/{ctx.facts.raw_arch}-linux-gnu/libnvidia-ml.so.1"
    if not ctx.host.exists(lib):
        raise BootError(
            Code.DRIVER_INSTALL_FAILED if install else Code.DRIVER_NOT_STARTED,
            f"{lib} is missing: the driver's user-space libraries are not in place",
        )
    ctx.require(["ldconfig"], code=Code.DRIVER_INSTALL_FAILED, timeout=120)
    r = ctx.run(["nvidia-smi"], timeout=120)
    failure = classify_smi_failure(r.output)
    if failure is SmiFailure.DRIVER_LIBRARY_MISMATCH:
        raise BootError(
            Code.DRIVER_LIBRARY_MISMATCH, "NVML: Driver/library version mismatch", output=r.output
        )
    if not r.ok and failure is not SmiFailure.INFOROM_CORRUPTED:  # verify reports infoROM
        raise TransientError(
            Code.DRIVER_NOT_STARTED, f"nvidia-smi exit {r.returncode}: {r.output.strip()[-300:]}"
        )


def run(ctx: Context) -> None:
    """Blacklist nouveau, install the toolkit, compile unless prebaked, initialize."""
    blacklist_nouveau(ctx)
    install_toolkit(ctx)
    if ctx.config.driver.install:
        rebuild = _needs_build(ctx)
        _unload_other(ctx, rebuild)
        if rebuild:
            _record_build(ctx, build_module(ctx))
    else:
        ctx.event("driver.skipped", reason="driver.install = false: the image ships a driver")
    _initialize(ctx)
