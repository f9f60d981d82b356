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
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import IO

from bootfsm import __version__
from bootfsm.archnames import normalize_arch
from bootfsm.codes import Code
from bootfsm.config import Config
from bootfsm.context import Context
from bootfsm.deadline import Deadline
from bootfsm.errors import BootError, TransientError
from bootfsm.facts import NodeFacts, PciGpu
from bootfsm.hardware import model_for
from bootfsm.host import CommandResult, Host
from bootfsm.journal import Journal, new_run_id
from bootfsm.lock import NodeLock
from bootfsm.parsers import ParseError
from bootfsm.parsers.osrelease import parse_os_release
from bootfsm.table import row

__all__ = [
    "BAKE_DEADLINE_S",
    "MATCH_FIELDS",
    "BakeOptions",
    "BakeResult",
    "Marker",
    "Mismatch",
    "bake",
    "bake_module_type",
    "check_marker",
    "expected_marker",
    "image_facts",
    "marker_path",
    "module_type_of",
    "parse_marker",
    "parse_modinfo",
    "read_marker",
    "render_marker",
    "target_kernel",
]

BAKE_DEADLINE_S = 3600.0
"""Budget of one bake: image builds are off the node's critical path (the 720 s deadline)."""

MATCH_FIELDS = ("arch", "kernel", "driver_version", "driver_kind", "module_type", "runfile_sha256")
"""Marker fields that must match the node for a boot to skip the compile, in check order."""

_REQUIRED = ("kernel", "driver_version", "driver_kind", "arch")  # the bash marker's four lines
_PROFILE_GPU = {"x86_64": 0x2330, "aarch64": 0x2342}  # H100 SXM5 (HGX), GH200 (Grace)


@dataclass(frozen=True)
class Marker:
    """What DKMS built: written by bake (``source=bake``) or by a boot that compiled."""

    kernel: str
    driver_version: str
    driver_kind: str
    arch: str
    module_type: str = ""
    runfile_sha256: str = ""
    config_digest: str = ""
    source: str = "bake"
    baked_at: str = ""
    bootfsm: str = ""


@dataclass(frozen=True)
class Mismatch:
    """One marker field that does not match the node (``node`` is what the node needs)."""

    field: str
    marker: str
    node: str


def marker_path(cfg: Config) -> str:
    """Node path of the bake marker: ``<run.state_dir>/bake.marker``."""
    return f"{cfg.run.state_dir}/bake.marker"


def render_marker(m: Marker) -> str:
    """The marker file: a comment line, then ``key=value`` lines (bash-marker compatible)."""
    head = "# bootfsm bake marker: the NVIDIA module DKMS built (docs/image-build.md)\n"
    return head + "".join(f"{k}={v}\n" for k, v in asdict(m).items())


def parse_marker(text: str) -> Marker:
    """Parse ``key=value`` lines (``#`` comments, unknown keys ignored); ValueError names
    a missing required key (kernel, driver_version, driver_kind, arch) or a bad line."""
    values: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"bake marker line {lineno}: expected key=value, got {line[:80]!r}")
        values[key.strip()] = value.strip()
    missing = [k for k in _REQUIRED if not values.get(k)]
    if missing:
        raise ValueError(f"bake marker lacks {', '.join(f'{k}=' for k in missing)}")
    known = {f.name for f in fields(Marker)}
    return Marker(**{k: v for k, v in values.items() if k in known})


def read_marker(host: Host, cfg: Config) -> Marker | str | None:
    """The node's marker; None when absent; the reason (a string) when unreadable."""
    text = host.read_text(marker_path(cfg))
    if text is None:
        return None
    try:
        return parse_marker(text)
    except ValueError as exc:
        return str(exc)


def expected_marker(cfg: Config, facts: NodeFacts) -> Marker:
    """What a marker must say for this node and config (module_type may be ``auto``)."""
    return Marker(
        kernel=facts.kernel,
        driver_version=cfg.driver.version,
        driver_kind=cfg.driver.kind,
        arch=facts.raw_arch,
        module_type=cfg.driver.module_type,
        runfile_sha256=cfg.sources.runfile_sha256.lower(),
        config_digest=cfg.digest(),
    )


def check_marker(m: Marker, want: Marker, *, needs_open: bool) -> list[Mismatch]:
    """Every field of ``MATCH_FIELDS`` where marker ``m`` does not fit ``want`` (pure).

    ``module_type = auto`` accepts a baked open or proprietary module, except that a node
    with a GPU only the open module drives (``needs_open``) accepts only open. A sha256
    is compared only when both sides have one.
    """
    out: list[Mismatch] = []
    for name in MATCH_FIELDS:
        have, need = getattr(m, name), getattr(want, name)
        if name == "module_type" and need == "auto":
            allowed = ("open",) if needs_open else ("open", "proprietary")
            if have not in allowed:
                out.append(Mismatch(name, have, "open" if needs_open else "auto"))
        elif name == "runfile_sha256":
            if have and need and have.lower() != need.lower():
                out.append(Mismatch(name, have, need))
        elif have != need:
            out.append(Mismatch(name, have, need))
    return out


def parse_modinfo(text: str) -> dict[str, str]:
    """``modinfo`` output (``key:  value`` lines) to the first value of each key."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and key and " " not in key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def module_type_of(modinfo: dict[str, str]) -> str:
    """``open`` (licence ``Dual MIT/GPL``), ``proprietary`` (``NVIDIA``) or ""."""
    return {"Dual MIT/GPL": "open", "NVIDIA": "proprietary"}.get(modinfo.get("license", ""), "")


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
    if not lock.acquire(opts.wait_lock):
        msg = f"another bootfsm run (pid {lock.holder() or '?'}) holds {lock.path}"
        return BakeResult(Code.ANOTHER_RUN_IN_PROGRESS, msg)
    run_id = new_run_id()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(host.wall()))
    path = host.path(cfg.run.log_dir) / f"bake-{stamp}-{run_id}.jsonl"
    journal = Journal(path, run_id=run_id, console=opts.console, monotonic=host.monotonic)
    ctx = Context.create(cfg, host, journal, BAKE_DEADLINE_S)

    def record(r: CommandResult) -> None:  # the same "command" event a run journals
        level = "info" if r.ok else "warning"
        journal.event(
            "command",
            level=level,
            state=ctx.state,
            argv=list(r.argv),
            rc=r.returncode,
            duration_s=r.duration_s,
            output=r.output[-2000:],
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
    from bootfsm.engine import _attempt  # the engine's retry loop, shared on purpose
    from bootfsm.states import detect, driver, fetch  # the states import this module

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
        _attempt(ctx, row("fetch"), lambda: fetch.run(ctx))
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
    ctx.host.write_atomic(marker_path(cfg), render_marker(want), 0o600)
    changed.append("marker")
    return want
