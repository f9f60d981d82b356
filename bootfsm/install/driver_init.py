"""The driver's per-boot initialization and the modules bootfsm loaded this boot.

A loaded module is not a usable driver: nvidia_uvm with /dev/nvidia-uvm (udev never
autoloads it), libnvidia-ml.so.1 in the linker cache and an answering nvidia-smi come
every boot. /run/bootfsm/driver-loaded lists the modules bootfsm's own commands loaded.
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, CommandError
from bootfsm.install import records
from bootfsm.install.daemons import DRIVER_USERS, IMEX, Daemon
from bootfsm.machine.context import Context
from bootfsm.node.facts import NodeFacts, loaded_module_version
from bootfsm.node.verdict import keeps_image_driver, not_kept_reason
from bootfsm.parsers.nvidia_smi import (
    SmiFailure,
    classify_smi_failure,
    inforom_warnings,
    wrong_module_type,
)
from bootfsm.parsers.secureboot import signature_refusal

__all__ = [
    "LDCACHE",
    "LOADED_RECORD",
    "NV_MODULES",
    "SMI_POLL_S",
    "check_image_driver",
    "device_nodes",
    "device_processes",
    "inforom_error",
    "init_missing",
    "initialize",
    "modules_present",
    "record_loaded",
    "signature_rejection",
    "unload_driver",
    "unload_own",
]

NV_MODULES = ("nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia")
"""The NVIDIA kernel modules, in the order they must be unloaded (dependents first)."""
LOADED_RECORD = "/run/bootfsm/driver-loaded"
LDCACHE = "/etc/ld.so.cache"
SMI_POLL_S = 2.0
"""Seconds between nvidia-smi tries while the driver comes up (within driver.smi_wait)."""
SMI_INFOROM_EXIT = 14
"""nvidia-smi's exit status for a corrupted infoROM (nvidia-smi(1) RETURN VALUE; the
plain table prints the warning and exits 14 while `nvidia-smi -q -x` exits 0 without it:
samples nvidia-smi/nvml_error_excerpts.txt [E], the microsoft/pai #3756 note)."""
_NVML = b"libnvidia-ml.so.1"


def modules_present(ctx: Context) -> set[str]:
    """The NVIDIA modules loaded now (a /sys/module/<name> directory each)."""
    return {m for m in NV_MODULES if ctx.host.exists(f"/sys/module/{m}")}


def _recorded(ctx: Context) -> set[str]:
    text = ctx.host.read_text(LOADED_RECORD) or ""
    return {line.strip() for line in text.splitlines()} & set(NV_MODULES)


def record_loaded(ctx: Context, new: set[str], *, replace_all: bool = False) -> None:
    """Add ``new`` to the modules bootfsm loaded this boot (``replace_all``: set to it)."""
    old = _recorded(ctx)
    mods = set(new) if replace_all else old | new
    if mods == old and ctx.host.exists(LOADED_RECORD):
        return
    ctx.host.makedirs(LOADED_RECORD.rsplit("/", 1)[0], mode=0o700)
    ordered = [m for m in NV_MODULES if m in mods]
    ctx.host.write_atomic(LOADED_RECORD, "".join(f"{m}\n" for m in ordered), 0o600)
    if new - old:
        ctx.event("driver.loaded_by_bootfsm", modules=[m for m in NV_MODULES if m in new - old])
    for module in [m for m in NV_MODULES if m in new][::-1]:  # nvidia first: load order
        records.record_module(ctx, module)


def unload_own(ctx: Context) -> None:
    """Unload the dependents of nvidia that bootfsm loaded this boot and are loaded now
    (nvidia_uvm, nvidia_drm, nvidia_modeset, in that order)."""
    mine, done = _recorded(ctx), []
    for module in NV_MODULES[:-1]:
        if module not in mine or not ctx.host.exists(f"/sys/module/{module}"):
            continue
        r = ctx.run(["modprobe", "-r", module], timeout=60)
        ctx.event("driver.unload", module=module, ok=r.ok, rc=r.returncode)
        if r.ok:
            done.append(module)
    if done:
        record_loaded(ctx, _recorded(ctx) - set(done), replace_all=True)


def _started_by_bootfsm(ctx: Context) -> set[str]:
    entries = records.load(ctx.host, ctx.config)
    return {e["unit"] for e in entries if e["kind"] == "unit" and e["action"] == "start"}


def device_processes(ctx: Context) -> list[str]:
    """``comm (pid N)`` of the processes with a /dev/nvidia* file open (as fuser(1) reads)."""
    found: list[str] = []
    for proc in ctx.host.glob("/proc/[0-9]*"):
        fds = ctx.host.glob(f"{proc}/fd/*")
        if any((ctx.host.readlink(fd) or "").startswith("/dev/nvidia") for fd in fds):
            comm = (ctx.host.read_text(f"{proc}/comm") or "?").strip()
            found.append(f"{comm} (pid {proc.rsplit('/', 1)[1]})")
    return found


def nvidia_users(ctx: Context) -> list[str]:
    """Who keeps nvidia loaded, by name: the modules holding it (/sys/module/nvidia/
    holders), the NVIDIA daemons still active and the processes with /dev/nvidia* open."""
    users = ctx.host.listdir("/sys/module/nvidia/holders")
    users += [d.unit for d in (*DRIVER_USERS, IMEX) if d.running(ctx)]
    return users + device_processes(ctx)


def _start_again(ctx: Context, stopped: list[Daemon]) -> None:
    for daemon in stopped:  # the order they were stopped in: the driver container's
        try:
            daemon.start(ctx)
        except BootError as exc:
            ctx.warn(f"{daemon.unit} did not start again: {exc.message}")


def unload_driver(ctx: Context, loaded: str) -> None:
    """Unload driver ``loaded`` so another can load: bootfsm's daemons holding
    /dev/nvidia* stopped, its modules then nvidia unloaded. REBOOT_REQUIRED, naming
    the holders, when nvidia stays loaded (the daemons started again first)."""
    mine = _started_by_bootfsm(ctx)
    stopped = [d for d in DRIVER_USERS if d.unit in mine and d.running(ctx)]
    for daemon in stopped:  # back with the new driver (persistenced here, FM in fabric)
        daemon.stop(ctx)
    if stopped:
        ctx.event("driver.daemons_stopped", units=[d.unit for d in stopped])
    unload_own(ctx)
    output = ""
    if ctx.host.exists("/sys/module/nvidia"):
        r = ctx.run(["modprobe", "-r", "nvidia"], timeout=60)
        ctx.event("driver.unload", module="nvidia", ok=r.ok, rc=r.returncode)
        output = r.output[-1000:]
    # judged by what is loaded: kmod exits 0 for a module already gone
    if loaded_module_version(ctx.host) is not None:
        users = nvidia_users(ctx)
        _start_again(ctx, stopped)
        held = f" (held by {', '.join(users[:10])})" if users else ""
        raise BootError(
            Code.REBOOT_REQUIRED,
            f"driver {loaded} is loaded and in use{held}; "
            f"{ctx.config.driver.version} needs a reboot",
            output=output,
        )
    record_loaded(ctx, set(), replace_all=True)
    ctx.event("driver.unloaded", version=loaded)


def device_nodes(ctx: Context) -> list[str]:
    """The device nodes of a usable driver: nvidiactl, nvidia-uvm and one nvidiaN per
    GPU the driver attached (one it does not see is verify's GPU_COUNT_MISMATCH)."""
    attached = len(ctx.host.listdir("/proc/driver/nvidia/gpus"))
    return ["/dev/nvidiactl", "/dev/nvidia-uvm", *(f"/dev/nvidia{i}" for i in range(attached))]


def init_missing(ctx: Context) -> list[str]:
    """What this boot's init has not produced yet: missing device nodes, and the linker
    cache when it does not list libnvidia-ml.so.1. Empty when the init is done."""
    missing = [p for p in device_nodes(ctx) if not ctx.host.exists(p)]
    cache = ctx.host.read_bytes(LDCACHE, limit=64 << 20) or b""
    if _NVML not in cache:
        missing.append(f"{LDCACHE} (no {_NVML.decode()})")
    return missing


KERNEL_LOG = ["journalctl", "-k", "-o", "cat", "--no-pager", "-q", "-n", "200"]
"""The kernel's messages of this boot, the newest 200 (journalctl(1): -k implies -b)."""


def signature_rejection(ctx: Context, output: str) -> BootError | None:
    """MODULE_SIGNATURE_REJECTED when the failed load was refused for its signature, else
    None. nvidia-modprobe sends modprobe's words to /dev/null (NVIDIA/nvidia-modprobe
    nvidia-modprobe-utils.c, modprobe_helper), so kmod runs once more for them, and the
    kernel log says why (kernel/module/signing.c, security/lockdown/lockdown.c)."""
    said = [output]
    if ctx.host.which("modprobe"):
        said.append(ctx.run(["modprobe", "nvidia"], timeout=60, probe=True).output)
    if ctx.host.which("journalctl"):
        said.append(ctx.run(KERNEL_LOG, timeout=30, probe=True, die_with_bootfsm=False).output)
    found = [r for r in map(signature_refusal, said) if r is not None]
    if not found:
        return None
    refusal = "; ".join(dict.fromkeys(found))
    sb = ctx.facts.secure_boot
    where = f" (Secure Boot {'on' if sb.enabled else 'off'}, lockdown {sb.lockdown or '?'})"
    fix = (
        "the module kmod found for this kernel is not the one Canonical signed: remove the "
        "unsigned module that shadows it (depmod puts updates/ and extra/ first)"
        if ctx.config.driver.source == "ubuntu-signed"
        else 'set driver.source = "ubuntu-signed" for Canonical\'s signed modules, or enroll '
        "the key that signed it"
    )
    return BootError(
        Code.MODULE_SIGNATURE_REJECTED,
        f"the kernel refused the nvidia module for its signature{where}: {refusal}; {fix}",
        output=refusal,
    )


def check_image_driver(ctx: Context, f: NodeFacts) -> str | None:
    """validateGPUDrivers' check, an action (detect runs it once, before anything of
    driver.version is judged): with ``keeps_image_driver``, `nvidia-modprobe -u -c0`
    tries to load the image's driver when none is loaded; journaled ``driver.image_kept``
    or ``driver.image_not_loaded`` (``driver.image_not_kept`` where the node does not
    allow it). Returns the nvidia module loaded now (``f.loaded_driver`` unchanged
    without the keys): what ``kept_image_driver`` reads from the facts."""
    if not keeps_image_driver(ctx.config, f):
        if (why := not_kept_reason(ctx.config, f)) is not None:
            ctx.event("driver.image_not_kept", reason=why)
        return f.loaded_driver
    loaded = loaded_module_version(ctx.host)
    output, how = "", "loaded at boot"
    if loaded is None and ctx.host.which("nvidia-modprobe"):
        before = modules_present(ctx)
        # a failure is an answer (no driver to keep), not a fault; it loads: tied to bootfsm
        argv = ["nvidia-modprobe", "-u", "-c0"]
        r = ctx.run(argv, timeout=120, probe=True, die_with_bootfsm=True)
        record_loaded(ctx, modules_present(ctx) - before)
        loaded, output = loaded_module_version(ctx.host), r.tail.strip()[-300:]
        how = "loaded by nvidia-modprobe -u -c0"
    if loaded is None:
        why = output or "nvidia-modprobe is not on PATH"
        ctx.event("driver.image_not_loaded", install=ctx.config.driver.version, output=why)
        return None
    ctx.event(
        "driver.image_kept",
        durable=True,
        version=loaded,
        configured=ctx.config.driver.version,
        how=how,
        message=(
            f"driver.keep_image_driver: the image's driver {loaded} is kept ({how}); "
            f"driver {ctx.config.driver.version} is not judged, fetched or built"
        ),
    )
    return loaded


def _load(ctx: Context) -> None:
    """nvidia-modprobe -u -c0: nvidia_uvm (and nvidia under it), /dev/nvidia-uvm."""
    argv = ["nvidia-modprobe", "-u", "-c0"]
    if ctx.config.driver.source == "ubuntu-signed" and not ctx.host.which("nvidia-modprobe"):
        # Ubuntu's server user-space ships no nvidia-modprobe: modprobe (the packaged
        # module, by depmod's modules.dep); nvidia-smi as root makes the device files
        for module in ("nvidia", "nvidia-uvm"):
            try:
                ctx.require(["modprobe", module], code=Code.MODULE_LOAD_FAILED, timeout=120)
            except CommandError as exc:
                if exc.code is Code.MODULE_LOAD_FAILED:  # refused for its signature: 45
                    raise signature_rejection(ctx, exc.output_tail) or exc from None
                raise
        return
    if ctx.config.driver.install:
        try:
            ctx.require(argv, code=Code.MODULE_LOAD_FAILED, timeout=120)
        except CommandError as exc:
            if exc.code is Code.MODULE_LOAD_FAILED:  # refused, not hung
                raise signature_rejection(ctx, exc.output_tail) or exc from None
            raise
        return
    r = ctx.run(argv, timeout=120) if ctx.host.which("nvidia-modprobe") else None
    if r is None or not ctx.host.exists("/sys/module/nvidia"):
        refused = signature_rejection(ctx, r.output if r else "")
        if refused is not None:
            raise refused
        raise BootError(
            Code.MODULE_LOAD_FAILED,
            "driver.install = false, but no nvidia module is loaded and nvidia-modprobe "
            f"could not load one: the image must ship a driver for {ctx.facts.kernel} "
            "(or set driver.install = true)",
            output=r.output[-1000:] if r else "nvidia-modprobe is not on PATH",
        )


def inforom_error(output: str, returncode: int) -> BootError | None:
    """INFOROM_CORRUPTED, naming the GPUs, when plain `nvidia-smi` warned of a
    corrupted infoROM or exited 14, else None (`-q -x` exits 0 without the warning)."""
    gpus = inforom_warnings(output)
    if not gpus and returncode != SMI_INFOROM_EXIT:
        return None
    where = f" at {', '.join(gpus)}" if gpus else ""
    return BootError(
        Code.INFOROM_CORRUPTED,
        f"nvidia-smi: infoROM is corrupted{where} (exit {returncode}); the GPU needs service",
        output=output[-1000:],
    )


def _smi_answers(ctx: Context, seen: list[str]) -> bool | None:
    """One nvidia-smi try: True, or None to retry; library mismatch and infoROM are final."""
    r = ctx.run(["nvidia-smi"], timeout=120, die_with_bootfsm=False)  # only reads
    inforom = inforom_error(r.output, r.returncode)
    if inforom is not None:
        raise inforom
    failure = classify_smi_failure(r.output)
    if failure is SmiFailure.DRIVER_LIBRARY_MISMATCH:
        raise BootError(
            Code.DRIVER_LIBRARY_MISMATCH, "NVML: Driver/library version mismatch", output=r.output
        )
    if failure is SmiFailure.NO_DEVICES:  # proprietary module on Blackwell: never retried
        proc = ctx.host.read_text("/proc/driver/nvidia/version") or ""
        why = wrong_module_type(r.output, [g.device_id for g in ctx.facts.gpus], proc)
        if why is not None:
            raise BootError(Code.WRONG_MODULE_TYPE, why, output=r.tail)
    if r.ok:
        return True
    seen.append(f"exit {r.returncode}: {r.output.strip()[-300:]}")
    return None


def initialize(ctx: Context) -> None:
    """The order the stack needs: module loaded with its device nodes (nvidia-modprobe),
    libraries in place, ldconfig, then nvidia-smi answering within ``driver.smi_wait``."""
    install = ctx.config.driver.install
    _load(ctx)
    lib = f"/usr/lib/{ctx.facts.raw_arch}-linux-gnu/libnvidia-ml.so.1"
    if not ctx.host.exists(lib):
        raise BootError(
            Code.DRIVER_INSTALL_FAILED if install else Code.DRIVER_NOT_STARTED,
            f"{lib} is missing: the driver's user-space libraries are not in place",
        )
    ctx.require(["ldconfig"], code=Code.DRIVER_INSTALL_FAILED, timeout=120)
    wait = ctx.config.driver.smi_wait
    seen: list[str] = []
    start, answered = ctx.host.monotonic(), False

    def gave_up() -> BootError:
        return BootError(
            Code.DRIVER_NOT_STARTED,
            f"nvidia-smi did not answer within driver.smi_wait = {wait:g} s "
            f"({len(seen)} tries); last: {seen[-1] if seen else '-'}",
        )

    try:
        answered = ctx.wait_until(
            lambda: _smi_answers(ctx, seen),
            timeout=wait,
            interval=min(SMI_POLL_S, wait),
            on_timeout=gave_up,
        )
    finally:
        ctx.event(
            "driver.smi_wait",
            answered=answered,
            failures=len(seen),
            waited_s=round(ctx.host.monotonic() - start, 3),
            limit_s=wait,
        )
    missing = init_missing(ctx)
    if missing:
        ctx.warn(f"after the driver init, still missing: {', '.join(missing)}")
