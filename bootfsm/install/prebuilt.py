"""Whether a boot or a bake may use a module already built, or must compile: one decision.

The marker (bake's, a boot's, or the bash path's) says what was built; the node says
what it needs. The boot uses the built module when every matched field agrees and the
module is usable (`dkms status` and `modinfo`; a module bake installed without DKMS,
``dkms=no``, by `modinfo` alone), and also when only the kernel differs and DKMS built
the same driver for the running kernel: an unattended kernel update runs DKMS's kernel
hook, which builds every registered module for the new kernel (aks-gpu's fast path asks
the same of `dkms status` and `modinfo -k`). Anything else compiles.

``decide`` is the action's question (it may run `modinfo`); ``ready`` the
postcondition's, which asks only what the postconditions already share (`dkms status`)
unless the marker names a module installed without DKMS. ``bake_reason`` is the image
build's question; ``new_marker`` what a build (boot or bake) writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from bootfsm import __version__
from bootfsm.core.config import Config
from bootfsm.core.hardware import requires_open_module, requires_proprietary_module
from bootfsm.host.host import Host
from bootfsm.install import driver_steps as steps
from bootfsm.install.marker import (
    PEER_SOURCE,
    Marker,
    MarkerError,
    Mismatch,
    check_marker,
    expected_marker,
    marker_path,
    read_marker,
    required_module_type,
)
from bootfsm.machine.context import Context
from bootfsm.node.facts import NodeFacts

__all__ = [
    "Decision",
    "bake_module_type",
    "bake_reason",
    "current_marker",
    "decide",
    "mismatches",
    "new_marker",
    "ready",
]


@dataclass(frozen=True)
class Decision:
    """What the driver state does with the module on the node, and why."""

    build: bool
    field: str
    """The first marker field that rules the built module out ("" when it is used)."""
    reason: str
    marker: Marker | None = None
    via: str = ""
    """How a build is skipped: ``marker`` (it matches) or ``dkms`` (DKMS built the same
    driver for the running kernel after a kernel update)."""


def _needs(facts: NodeFacts) -> dict[str, bool]:
    """The module types the node's GPUs rule out, as ``check_marker`` takes them."""
    models = [g.model for g in facts.gpus]
    return {
        "needs_open": requires_open_module(models),
        "needs_proprietary": requires_proprietary_module(models),
    }


def mismatches(cfg: Config, facts: NodeFacts, m: Marker) -> list[Mismatch]:
    """Where marker ``m`` does not fit this node and config (pure)."""
    return check_marker(m, expected_marker(cfg, facts), **_needs(facts))


def _wanted_type(ctx: Context, m: Marker) -> str:
    """The type the built module must have: the marker's, else what config and GPUs require."""
    return m.module_type or required_module_type(ctx.config.driver.module_type, **_needs(ctx.facts))


def bake_module_type(cfg: Config) -> str:
    """The module type an image gets: the configured one, or ``open`` for ``auto``.

    ``auto`` asks the installer about the attached GPUs, which a build VM does not have;
    open is the type that drives every GPU generation bootfsm targets (Hopper, Blackwell,
    Grace) and the only one Blackwell accepts.
    """
    return cfg.driver.module_type if cfg.driver.module_type != "auto" else "open"


def new_marker(ctx: Context, module_type: str, *, dkms: str, source: str) -> Marker:
    """The marker a build writes: this node and config, the type built, stamped now."""
    return replace(
        expected_marker(ctx.config, ctx.facts),
        module_type=module_type,
        dkms=dkms,
        source=source,
        bootfsm=__version__,
        baked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ctx.host.wall())),
    )


def _maybe_without_dkms(m: Marker) -> bool:
    """The marker's module may be installed without DKMS: bake's (``dkms=no``), or the
    bash path's, which does not say (aks-gpu's build-only mode installs with --no-dkms
    since Azure/aks-gpu#191, with --dkms before): `modinfo` is asked, not `dkms status`."""
    return m.dkms == "no" or m.source == PEER_SOURCE


def decide(ctx: Context) -> Decision:
    """Compile or not, and why (read-only: `dkms status`, `modinfo`)."""
    try:
        m = read_marker(ctx.host, ctx.config)
    except MarkerError as exc:
        return Decision(True, "marker", str(exc))
    if m is None:
        built = steps.built(ctx)
        reason = f"no bake marker at {marker_path(ctx.config)}"
        return Decision(not built, "marker", reason, via="dkms" if built else "")
    diff = mismatches(ctx.config, ctx.facts, m)
    if diff and [d.field for d in diff] != ["kernel"]:
        d = diff[0]
        reason = f"marker says {d.field}={d.marker or '(none)'}; this node needs {d.node}"
        return Decision(True, d.field, reason, m)
    kernel, version = ctx.facts.kernel, ctx.config.driver.version
    # after a kernel update only DKMS can have built the module for the running kernel
    dkms = bool(diff) or not _maybe_without_dkms(m)
    problem = steps.module_problem(ctx, _wanted_type(ctx, m), dkms=dkms)
    if diff:
        if problem is not None:
            return Decision(
                True, "kernel", f"marker says kernel={m.kernel}; this node runs {kernel}"
                f" and DKMS has no usable build for it ({problem})", m,
            )  # fmt: skip
        return Decision(
            False, "", f"DKMS built nvidia/{version} for {kernel} after the marker's"
            f" {m.kernel} (kernel update); version, kind, arch and module type match", m, "dkms",
        )  # fmt: skip
    if problem is not None:
        return Decision(True, "module", problem, m)
    return Decision(
        False, "", f"{m.source} marker matches kernel, version, kind, arch and module", m, "marker"
    )


def ready(ctx: Context) -> bool:
    """The postcondition's question: the built module fits without compiling (the
    configured version is DKMS-built for the running kernel, under a marker that matches
    or differs only in the kernel; or the marker's own module installed without DKMS)."""
    try:
        m = read_marker(ctx.host, ctx.config)
    except MarkerError:
        return False
    if m is None:
        return steps.built(ctx)
    diff = [d.field for d in mismatches(ctx.config, ctx.facts, m)]
    if diff and diff != ["kernel"]:
        return False
    if steps.built(ctx):
        return True
    return (
        not diff
        and _maybe_without_dkms(m)
        and steps.module_problem(ctx, _wanted_type(ctx, m), dkms=False) is None
    )


def current_marker(host: Host, cfg: Config) -> Marker | None:
    """The node's marker, or None when it has none or it cannot be read."""
    try:
        return read_marker(host, cfg)
    except MarkerError:
        return None


def bake_reason(ctx: Context, want: Marker) -> tuple[Marker | None, str | None]:
    """The image's marker, and why the bake must build (the marker unreadable, absent or
    not ``want``, or its module unusable; None when marker and module match)."""
    try:
        old = read_marker(ctx.host, ctx.config)
    except MarkerError as exc:
        return None, str(exc)
    if old is None:
        return None, "no bake marker"
    diff = check_marker(old, want, needs_open=False)
    if diff:
        return old, f"marker {diff[0].field} differs"
    return old, steps.module_problem(ctx, want.module_type, dkms=False)
