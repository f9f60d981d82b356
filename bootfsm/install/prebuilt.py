"""Whether a boot or a bake may use a module already built, or must compile: one decision.

A built module is used when the marker matches and the module is usable, or when only the
kernel differs and DKMS's kernel hook built the same driver for the running one (a kernel
update); anything else compiles. Read-only: it runs `dkms status` and `modinfo` at most.
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
    """The module type an image gets: the configured one, or ``open`` for ``auto``."""
    # a build VM has no GPUs for auto to ask about; open drives all targets, Blackwell only it
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
    """The marker's module may lack DKMS: bake's (``dkms=no``) or aks-gpu's (it does not say,
    --no-dkms since Azure/aks-gpu#191), so `modinfo` is asked, not `dkms status`."""
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
    """The postcondition: the built module fits without compiling (``decide``'s rule,
    asking only `dkms status` unless the marker's module was installed without DKMS)."""
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
    """The image's marker, and why the bake must build (None when marker and module
    match ``want``)."""
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
