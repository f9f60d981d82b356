"""Whether a boot may use a module already built for it, or must compile: one decision.

The marker (bake's, a boot's, or the bash path's) says what was built; the node says
what it needs. The boot uses the built module when every matched field agrees and the
module is usable (`dkms status` and `modinfo`; a module bake installed without DKMS,
``dkms=no``, by `modinfo` alone), and also when only the kernel differs and DKMS built
the same driver for the running kernel: an unattended kernel update runs DKMS's kernel
hook, which builds every registered module for the new kernel (aks-gpu's fast path asks
the same of `dkms status` and `modinfo -k`). Anything else compiles.

``decide`` is the action's question (it may run `modinfo`); ``ready`` the
postcondition's, which asks only what the postconditions already share (`dkms status`)
unless the marker names a module installed without DKMS.
"""

from __future__ import annotations

from dataclasses import dataclass

from bootfsm.core.hardware import requires_open_module, requires_proprietary_module
from bootfsm.install import driver_steps as steps
from bootfsm.install.marker import (
    PEER_SOURCE,
    Marker,
    Mismatch,
    check_marker,
    expected_marker,
    marker_path,
    read_marker,
    required_module_type,
)
from bootfsm.machine.context import Context

__all__ = ["Decision", "decide", "ready"]


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


def _mismatches(ctx: Context, m: Marker) -> list[Mismatch]:
    models = [g.model for g in ctx.facts.gpus]
    return check_marker(
        m,
        expected_marker(ctx.config, ctx.facts),
        needs_open=requires_open_module(models),
        needs_proprietary=requires_proprietary_module(models),
    )


def _wanted_type(ctx: Context, m: Marker) -> str:
    """The type the built module must have: the marker's, else (a bash-path marker names
    none) what the config and the GPUs require."""
    models = [g.model for g in ctx.facts.gpus]
    return m.module_type or required_module_type(
        ctx.config.driver.module_type,
        needs_open=requires_open_module(models),
        needs_proprietary=requires_proprietary_module(models),
    )


def _maybe_without_dkms(m: Marker) -> bool:
    """The marker's module may be installed without DKMS: bake's (``dkms=no``), or the
    bash path's, which does not say (aks-gpu's build-only mode installs with --no-dkms
    since Azure/aks-gpu#191, with --dkms before): `modinfo` is asked, not `dkms status`."""
    return m.dkms == "no" or m.source == PEER_SOURCE


def decide(ctx: Context) -> Decision:
    """Compile or not, and why (read-only: `dkms status`, `modinfo`)."""
    m = read_marker(ctx.host, ctx.config)
    if m is None:
        built = steps.built(ctx)
        reason = f"no bake marker at {marker_path(ctx.config)}"
        return Decision(not built, "marker", reason, via="dkms" if built else "")
    if not isinstance(m, Marker):
        return Decision(True, "marker", m)
    diff = _mismatches(ctx, m)
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
    m = read_marker(ctx.host, ctx.config)
    if m is None:
        return steps.built(ctx)
    if not isinstance(m, Marker):
        return False
    diff = [d.field for d in _mismatches(ctx, m)]
    if diff and diff != ["kernel"]:
        return False
    if steps.built(ctx):
        return True
    return (
        not diff
        and _maybe_without_dkms(m)
        and steps.module_problem(ctx, _wanted_type(ctx, m), dkms=False) is None
    )
