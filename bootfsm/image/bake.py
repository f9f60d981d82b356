"""Image build ("bake"): fetch verified artifacts and prebuild the driver; the bake marker.

One code path for image build and boot: ``bake`` runs the fetch state's own code and
the driver state's own steps (nouveau blacklist, toolkit debs, DKMS build) against the
facts of an image root, never loading a module or starting a service, then records what
DKMS built in a marker. At boot the driver state compares that marker with the node
(``check_marker``) to decide whether the compile can be skipped. docs/image-build.md
describes the marker and every decision made here.
"""

from __future__ import annotations

import posixpath
import re
import time
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO

from bootfsm import __version__
from bootfsm.core.archnames import normalize_arch
from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.core.deadline import Deadline
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.hardware import model_for
from bootfsm.host.host import CommandResult, Host
from bootfsm.host.lock import NodeLock, own_dirs
from bootfsm.install import records
from bootfsm.install.marker import (
    Marker,
    check_marker,
    expected_marker,
    read_marker,
)
from bootfsm.machine.context import Context
from bootfsm.machine.table import row
from bootfsm.node.facts import NodeFacts, PciGpu
from bootfsm.observe.journal import Journal, new_run_id
from bootfsm.parsers import ParseError
from bootfsm.parsers.osrelease import parse_os_release

__all__ = [
    "BAKE_DEADLINE_S",
    "BakeOptions",
    "BakeResult",
    "bake",
    "bake_module_type",
    "image_facts",
    "target_kernel",
]

BAKE_DEADLINE_S = 3600.0
"""Budget of one bake: image builds are off the node's critical path (the 720 s deadline)."""

_PROFILE_GPU = {"x86_64": 0x2330, "aarch64": 0x2941}  # H100 SXM5 (HGX), GB200 (IMEX tray)


def bake_module_type(cfg: Config) -> str:
    """The module type an image gets: the configured one, or ``open`` for ``auto``.

    ``auto`` asks the installer about the attached GPUs, which a build VM does not have;
    open is the type that drives every GPU generation bootfsm targets (Hopper, Blackwell,
    Grace) and the only one Blackwell accepts.
    """
    return cfg.driver.module_type if cfg.driver.module_type != "auto" else "open"


def _version_key(name: str) -> list[tuple[int, int, str]]:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.findall(r"\d+|\D+", name)]


def _has_build(host: Host, kernel: str) -> bool:
    """/lib/modules/K/build exists, following links inside the root (not the build host)."""
    path = f"/lib/modules/{kernel}/build"
    for _ in range(8):
        target = host.readlink(path) if host.is_symlink(path) else None
        if target is None:
            break
        base = target if target.startswith("/") else posixpath.join(posixpath.dirname(path), target)
        path = posixpath.normpath(base)
    return host.exists(path) and bool(host.listdir(path))


def target_kernel(host: Host, requested: str | None) -> str:
    """The kernel to build for: ``requested``, else the newest under /lib/modules with a
    ``build`` tree (version order); KERNEL_HEADERS_MISSING when there is none."""
    if requested:
        if "/" in requested or requested in (".", ".."):
            raise BootError(Code.KERNEL_HEADERS_MISSING, f"not a kernel release: {requested!r}")
        if not _has_build(host, requested):
            raise BootError(
                Code.KERNEL_HEADERS_MISSING,
                f"/lib/modules/{requested}/build is missing or empty; DKMS needs the headers",
            )
        return requested
    kernels = host.listdir("/lib/modules")
    with_build = sorted((k for k in kernels if _has_build(host, k)), key=_version_key)
    if not with_build:
        seen = ", ".join(kernels) or "none"
        raise BootError(
            Code.KERNEL_HEADERS_MISSING,
            f"no kernel under /lib/modules has a build tree (kernels: {seen}); "
            "install linux-headers for the image's kernel",
        )
    return with_build[-1]


def _image_arch(host: Host) -> str:
    """The image's architecture: its one multiarch library directory, else the kernel's."""
    dirs = [a for a in ("x86_64", "aarch64") if host.exists(f"/usr/lib/{a}-linux-gnu")]
    if len(dirs) == 1:
        return dirs[0]
    return (host.read_text("/proc/sys/kernel/arch") or "").strip()


def image_facts(host: Host, kernel: str) -> NodeFacts:
    """Facts of an image root: arch, OS and the target kernel from the root; the hardware
    is the architecture's superset profile, never the build VM's PCI bus (it may have no
    GPU): x86_64 is an NVSwitch HGX (fabric manager fetched), aarch64 a Grace tray (IMEX)."""
    raw_arch = _image_arch(host)
    try:
        text = host.read_text("/etc/os-release") or host.read_text("/usr/lib/os-release")
        osr = parse_os_release(text or "")
        os_id, os_version = osr.id, osr.version_id
    except ParseError:
        os_id, os_version = "", ""
    device = _PROFILE_GPU.get(raw_arch)
    gpus = (PciGpu("image-profile", device, model_for(device)),) if device else ()
    return NodeFacts(
        raw_arch=raw_arch,
        arch=normalize_arch(raw_arch) if raw_arch else None,
        os_id=os_id,
        os_version=os_version,
        kernel=kernel,
        gpus=gpus,
        nvswitches=("image-profile",) if raw_arch == "x86_64" else (),
        nvlink5=False,
        loaded_driver=None,
    )


# ----------------------------------------------------------------------------- bake


@dataclass(frozen=True)
class BakeOptions:
    """Where the image root is, which kernel to build for, where to print."""

    root: Path = Path("/")
    kernel: str | None = None
    config_path: str = ""
    console: IO[str] | None = None
    env: Mapping[str, str] | None = None
    wait_lock: float = 0.0


@dataclass(frozen=True)
class BakeResult:
    """How a bake ended; ``changed`` lists the steps that did work (empty: a no-op)."""

    code: Code
    message: str
    marker: Marker | None = None
    changed: tuple[str, ...] = ()
    journal: Path | None = None

    @property
    def ok(self) -> bool:
        """True when the image is baked."""
        return self.code is Code.OK


def bake(cfg: Config, opts: BakeOptions) -> BakeResult:
    """Bake the image at ``opts.root``; never raises for node problems (see BakeResult)."""
    host = Host(opts.root, env=opts.env)
    lock = NodeLock(host.path(f"{cfg.run.state_dir}/lock"))
    try:
        own_dirs(host, cfg.run.state_dir, cfg.run.log_dir, cfg.fetch.cache_dir)
        acquired = lock.acquire(opts.wait_lock)
    except BootError as exc:
        return BakeResult(exc.code, exc.message)
    except OSError as exc:  # a read-only or full state dir
        msg = f"cannot take the node lock {lock.path}: {exc.strerror or exc}"
        return BakeResult(Code.HOST_IO_ERROR, f"{msg}; run.state_dir must be writable")
    if not acquired:
        msg = f"another bootfsm run (pid {lock.holder() or '?'}) holds {lock.path}"
        return BakeResult(Code.ANOTHER_RUN_IN_PROGRESS, msg)
    run_id = new_run_id()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(host.wall()))
    path = host.path(cfg.run.log_dir) / f"bake-{stamp}-{run_id}.jsonl"
    journal = Journal(path, run_id=run_id, console=opts.console, monotonic=host.monotonic)
    ctx = Context.create(cfg, host, journal, BAKE_DEADLINE_S)

    def record(r: CommandResult) -> None:  # the same "command" event a run journals
        probe = ctx.probing and not r.timed_out
        level = "info" if r.ok or probe else "warning"
        journal.event(
            "command",
            level=level,
            state=ctx.state,
            argv=list(r.argv),
            rc=r.returncode,
            duration_s=r.duration_s,
            output=r.output[-2000:],
            **({"probe": True} if probe else {}),
        )

    host.on_command = record
    journal.event(
        "bake.start",
        durable=True,
        version=__version__,
        root=str(host.root),
        config_path=opts.config_path,
        config_digest=cfg.digest(),
        kernel_requested=opts.kernel or "",
    )
    changed: list[str] = []
    try:
        marker = _bake_steps(ctx, opts, changed)
        result = BakeResult(Code.OK, "image baked" if changed else "already baked", marker)
    except (BootError, TransientError) as exc:
        result = BakeResult(exc.code, exc.message)
    except Exception as exc:  # a bug: still end with a documented code and a journal
        journal.event("bake.error", level="error", traceback=traceback.format_exc(limit=8))
        result = BakeResult(Code.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
    finally:
        lock.release()
    journal.event(
        "bake.end",
        durable=True,
        level="info" if result.ok else "error",
        code=result.code.value,
        code_name=result.code.name,
        message=result.message,
        changed=changed,
        marker=asdict(result.marker) if result.marker else None,
        duration_s=round(journal.elapsed(), 4),
    )
    journal.close()
    return replace(result, changed=tuple(changed), journal=path)


def _phase(ctx: Context, name: str) -> None:
    """Run the next steps under the table row of state ``name`` (limit, codes, retries)."""
    srow = row(name)
    ctx.state, ctx.state_row = name, srow
    ctx.state_deadline = Deadline(srow.time_limit, ctx.host.monotonic)


def _bake_steps(ctx: Context, opts: BakeOptions, changed: list[str]) -> Marker | None:
    from bootfsm.install import driver_steps as driver
    from bootfsm.machine.engine import attempt
    from bootfsm.states import detect, fetch  # the states import this module

    cfg = ctx.config
    kernel = target_kernel(ctx.host, opts.kernel)
    facts = image_facts(ctx.host, kernel)
    ctx.journal.event(
        "bake.facts",
        durable=True,
        arch=facts.raw_arch,
        os=f"{facts.os_id}:{facts.os_version}",
        kernel=kernel,
        kernels=ctx.host.listdir("/lib/modules"),
        profile="nvswitch-hgx" if facts.nvswitches else "grace",
    )
    detect.judge(ctx, facts)
    ctx.facts_ = facts
    _phase(ctx, "fetch")
    if not fetch.satisfied(ctx):
        attempt(ctx, row("fetch"), lambda: fetch.run(ctx))
        if not fetch.satisfied(ctx):
            raise BootError(Code.CHECKSUM_MISMATCH, "fetched artifacts do not verify")
        changed.append("fetch")
    _phase(ctx, "driver")
    if driver.blacklist_nouveau(ctx, kernel=kernel):
        changed.append("nouveau")
    if driver.install_toolkit(ctx):
        changed.append("toolkit")
    if not cfg.driver.install:
        ctx.event("bake.driver", built=False, reason="driver.install = false")
        return None
    module_type = bake_module_type(cfg)
    want = replace(
        expected_marker(cfg, facts),
        module_type=module_type,
        source="bake",
        bootfsm=__version__,
        baked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ctx.host.wall())),
    )
    old = read_marker(ctx.host, cfg)
    if isinstance(old, Marker):
        diff = check_marker(old, want, needs_open=False)
        why = f"marker {diff[0].field} differs" if diff else driver.module_problem(ctx, module_type)
    else:
        why = old or "no bake marker"
    if why is not None:
        driver.build_module(ctx, module_type=module_type, extra=("--skip-module-load",))
        after = driver.module_problem(ctx, module_type)
        if after is not None:
            raise BootError(Code.DRIVER_INSTALL_FAILED, f"after the DKMS build: {after}")
        changed.append("module")
    ctx.event("bake.driver", built=why is not None, reason=why or "marker and module match")
    if isinstance(old, Marker) and replace(old, baked_at="") == replace(want, baked_at=""):
        return old
    records.write_markers(ctx, want)
    changed.append("marker")
    return want
