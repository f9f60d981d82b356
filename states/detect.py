"""detect: read the node's facts and fail fast on anything permanent, before any download."""

from __future__ import annotations

from dataclasses import replace

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.hardware import requires_open_module, requires_proprietary_module
from bootfsm.install.marker import Marker, check_marker, expected_marker, read_marker
from bootfsm.machine.context import Context
from bootfsm.node.facts import NodeFacts, gather_facts, loaded_module_version
from bootfsm.parsers import ParseError
from bootfsm.parsers.imds_tags import parse_imds_tags, skip_gpu_install, tag_value
from bootfsm.parsers.vmsize import parse_imds_vm_size

NAME = "detect"


def satisfied(ctx: Context) -> bool:
    """Detect has run in this process (facts are known); it never persists anything."""
    return ctx.facts_ is not None


def judge(ctx: Context, f: NodeFacts) -> None:
    """Raise the first permanent problem with these facts (pure; used by `plan` too)."""
    cfg = ctx.config
    if f.arch is None:
        raise BootError(
            Code.UNSUPPORTED_ARCH,
            f"architecture {f.raw_arch or '(unknown)'!r} is not supported; x86_64 or aarch64",
        )
    if cfg.driver.kind == "grid" and f.raw_arch != "x86_64":
        raise BootError(
            Code.DRIVER_KIND_UNSUPPORTED_ON_ARCH,
            f"GRID (vGPU) drivers exist for x86_64 only; this node is {f.raw_arch}",
        )
    os_key = f"{f.os_id}:{f.os_version}"
    if os_key not in cfg.detect.supported_os:
        raise BootError(
            Code.UNSUPPORTED_OS,
            f"OS {os_key} is not supported (detect.supported_os: "
            f"{', '.join(cfg.detect.supported_os)})",
        )
    if not f.gpus:
        raise BootError(Code.NO_GPU, "no NVIDIA GPU (vendor 0x10de, class 0x0302/0x0300) on PCI")
    models = [g.model for g in f.gpus]
    if cfg.driver.module_type == "proprietary" and requires_open_module(models):
        raise BootError(
            Code.MODULE_TYPE_UNSUPPORTED,
            f"{f.gpu_model} (Blackwell) needs the open kernel modules; "
            'driver.module_type is "proprietary"',
        )
    if cfg.driver.module_type == "open" and requires_proprietary_module(models):
        raise BootError(  # no GSP before Turing: the open modules refuse these GPUs
            Code.MODULE_TYPE_UNSUPPORTED,
            f"{f.gpu_model} (older than Turing) needs the proprietary kernel modules; "
            'driver.module_type is "open"',
        )
    if cfg.driver.install and cfg.driver.kind == "grid" and not cfg.sources.grid_runfile_url:
        raise BootError(Code.CONFIG_INVALID, "driver.kind = grid needs sources.grid_runfile_url")
    sha = cfg.sources.runfile_sha256_for(f.arch.runfile)
    if cfg.driver.install and not sha and not cfg.sources.allow_unverified:
        raise BootError(
            Code.UNVERIFIED_ARTIFACT_REFUSED,
            f"the driver runfile has no sha256 for {f.arch.runfile}: set "
            f"sources.runfile_sha256_{f.arch.runfile} or sources.runfile_sha256 "
            "(or sources.allow_unverified = true)",
        )


def _imds(ctx: Context) -> str | None:
    """The IMDS instance document (text), or None when off or unreachable (journaled)."""
    cfg = ctx.config.detect
    if not cfg.imds:
        return None
    try:
        r = ctx.http.get(
            cfg.imds_url, headers={"Metadata": "true"}, timeout=cfg.imds_timeout, max_bytes=1 << 20
        )
    except (TransientError, BootError) as exc:
        ctx.event("imds.skipped", reason=str(exc)[:200])
        return None
    return r.body.decode("utf-8", "replace")


def _vm_size(ctx: Context, doc: str | None) -> str | None:
    if doc is None:
        return None
    try:
        return parse_imds_vm_size(doc)
    except ParseError as exc:
        ctx.event("imds.skipped", reason=str(exc)[:200])
        return None


def _skip_reason(ctx: Context, doc: str | None) -> str | None:
    """Why the GPU install is skipped (the SkipGpuDriverInstall VM tag, detect.skip_tag)."""
    if doc is None or not ctx.config.detect.skip_tag:
        return None
    try:
        return skip_gpu_install(parse_imds_tags(doc))
    except ParseError as exc:
        ctx.event("imds.tags_unreadable", reason=str(exc)[:200])
        return None


def _mig_profile(ctx: Context, doc: str | None) -> tuple[str | None, str | None]:
    """(layout, where it came from): mig.profile wins, else the VM tag mig.tag names."""
    cfg = ctx.config.mig
    if cfg.profile:
        return cfg.profile, "config mig.profile"
    if doc is None or not cfg.tag:
        return None, None
    try:
        found = tag_value(parse_imds_tags(doc), cfg.tag)
    except ParseError:
        return None, None  # journaled by _skip_reason as imds.tags_unreadable
    return (found[1], f"VM tag {found[0]}") if found else (None, None)


def must_build(ctx: Context, f: NodeFacts) -> str | None:
    """Why this boot will compile the driver (a reason), or None when it will not: the
    image ships the driver (driver.install = false), the configured version is already
    loaded, or a bake marker matches this node (read-only)."""
    cfg = ctx.config.driver
    if not cfg.install:
        return None
    if loaded_module_version(ctx.host) == cfg.version:
        return None
    m = read_marker(ctx.host, ctx.config)
    if m is None:
        return "no bake marker"
    if not isinstance(m, Marker):
        return f"unreadable bake marker ({m})"
    models = [g.model for g in f.gpus]
    diff = check_marker(
        m,
        expected_marker(ctx.config, f),
        needs_open=requires_open_module(models),
        needs_proprietary=requires_proprietary_module(models),
    )
    return f"bake marker differs in {diff[0].field}" if diff else None


def _headers_present(ctx: Context, build: str) -> bool:
    """``build`` exists on the node; its usual form is an absolute symlink to
    /usr/src/linux-headers-<kernel>, resolved inside the node root (``--root``)."""
    target = ctx.host.readlink(build) if ctx.host.is_symlink(build) else None
    if target is not None and target.startswith("/") and ".." not in target.split("/"):
        return ctx.host.exists(target)
    return ctx.host.exists(build)


def check_headers(ctx: Context, f: NodeFacts) -> None:
    """KERNEL_HEADERS_MISSING before any download when the driver must be built and
    /lib/modules/<kernel>/build (what DKMS compiles against) is absent."""
    reason = must_build(ctx, f)
    build = f"/lib/modules/{f.kernel}/build"
    if reason is None or _headers_present(ctx, build):
        return
    raise BootError(
        Code.KERNEL_HEADERS_MISSING,
        f"{build} is missing and the driver must be built here ({reason}): install the "
        f"headers of kernel {f.kernel} (linux-headers-{f.kernel}) in the image, or bake "
        "the module (bootfsm bake)",
    )


def run(ctx: Context) -> None:
    """Gather facts, journal them, and stop on the first permanent problem; a VM tagged
    SkipGpuDriverInstall=true skips the rest (the table's detect -> done edge)."""
    facts = gather_facts(ctx.host)
    if facts.arch is not None:
        doc = _imds(ctx)
        mig, mig_source = _mig_profile(ctx, doc)
        facts = replace(
            facts,
            vm_size=_vm_size(ctx, doc),
            skip_gpu_install=_skip_reason(ctx, doc),
            mig_profile=mig,
            mig_profile_source=mig_source,
        )
    ctx.journal.event("node.facts", durable=True, **facts.summary())
    if facts.skip_gpu_install is not None:
        ctx.journal.event(
            "detect.skip_gpu_install",
            durable=True,
            reason=facts.skip_gpu_install,
            message=f"GPU driver install skipped: {facts.skip_gpu_install} (detect.skip_tag)",
        )
        ctx.facts_ = facts
        return
    judge(ctx, facts)
    check_headers(ctx, facts)
    ctx.facts_ = facts
