"""detect: read the node's facts and fail fast on anything permanent, before any download.

With driver.keep_image_driver it first checks the image's driver as AgentBaker's
validateGPUDrivers does (`nvidia-modprobe -u -c0`, install/driver_init.py): a driver kept
needs nothing of driver.version (node/verdict.py ``kept_image_driver``).
"""

from __future__ import annotations

from dataclasses import replace

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.install.driver_init import check_image_driver
from bootfsm.install.marker import MarkerError, read_marker
from bootfsm.install.prebuilt import mismatches
from bootfsm.machine.context import Context
from bootfsm.node.facts import NodeFacts, gather_facts, loaded_module_version
from bootfsm.node.verdict import (
    fabric_manager_disagreement,
    installs_driver,
    judge,
    no_gpu_reason,
)
from bootfsm.parsers import ParseError
from bootfsm.parsers.imds_tags import parse_imds_tags, skip_gpu_install, tag_value
from bootfsm.parsers.secureboot import imds_secure_boot
from bootfsm.parsers.vmsize import parse_imds_vm_size

NAME = "detect"


def satisfied(ctx: Context) -> bool:
    """Detect has run in this process (facts are known); it never persists anything."""
    return ctx.facts_ is not None


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


def _secure_boot(ctx: Context, f: NodeFacts, doc: str | None) -> NodeFacts:
    """IMDS's securityProfile.secureBootEnabled, used where the EFI variable is unreadable."""
    try:
        imds = imds_secure_boot(doc) if doc is not None else None
    except ParseError as exc:
        ctx.event("imds.skipped", reason=str(exc)[:200])
        imds = None
    return replace(f, secure_boot=f.secure_boot.with_imds(imds))


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
    """Why this boot will compile the driver, or None (driver.install false, the image's
    driver kept, the version already loaded, or a matching bake marker); read-only."""
    cfg = ctx.config.driver
    if not installs_driver(ctx.config, f) or cfg.source == "ubuntu-signed":  # or Canonical's
        return None
    if loaded_module_version(ctx.host) == cfg.version:
        return None
    try:
        m = read_marker(ctx.host, ctx.config)
    except MarkerError as exc:
        return f"unreadable bake marker ({exc})"
    if m is None:
        return "no bake marker"
    diff = mismatches(ctx.config, f, m)
    return f"bake marker differs in {diff[0].field}" if diff else None


def _headers_present(ctx: Context, build: str) -> bool:
    """``build`` exists (an absolute link, its usual form, resolved inside ``--root``)."""
    target = ctx.host.readlink(build) if ctx.host.is_symlink(build) else None
    if target is not None and target.startswith("/") and ".." not in target.split("/"):
        return ctx.host.exists(target)
    return ctx.host.exists(build)


def check_headers(ctx: Context, f: NodeFacts) -> None:
    """KERNEL_HEADERS_MISSING when the driver must be built here and
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
    """Gather and journal the facts, raise on the first permanent problem; a
    SkipGpuDriverInstall tag or no GPU skips the rest (detect -> done)."""
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
        facts = _secure_boot(ctx, facts, doc)
        facts = replace(facts, no_gpu=no_gpu_reason(ctx.config, facts))
    ctx.journal.event("node.facts", durable=True, **facts.summary())
    if facts.skip_gpu_install is not None:
        reason = facts.skip_gpu_install
        message = f"GPU driver install skipped: {reason} (detect.skip_tag)"
        ctx.journal.event("detect.skip_gpu_install", durable=True, reason=reason, message=message)
    elif facts.no_gpu is not None:
        if facts.gpus:
            ctx.warn(f"{facts.no_gpu}, though PCI shows {len(facts.gpus)} NVIDIA GPU(s)")
        message = f"nothing to provision: {facts.no_gpu}"
        ctx.journal.event(
            "detect.nothing_to_provision", durable=True, reason=facts.no_gpu, message=message
        )
    else:  # a GPU to provision: fail fast on anything permanent
        # driver.keep_image_driver: validateGPUDrivers' check of the image's driver, first
        facts = replace(facts, loaded_driver=check_image_driver(ctx, facts))
        judge(ctx.config, facts)
        disagreement = fabric_manager_disagreement(ctx.config, facts)
        if disagreement is not None:
            ctx.warn(disagreement)
        check_headers(ctx, facts)
    ctx.facts_ = facts
