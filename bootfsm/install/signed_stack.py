"""``driver.source = "ubuntu-signed"``: install Canonical's signed module for the running
kernel and the user-space of exactly the version it depends on, as fetch resolved and
verified them (bootfsm/fetch/ubuntu_signed.py). No compile: dpkg installs the packages in
dependency order; each is recorded, so `bootfsm uninstall` purges it and `apt-get check`
stays clean. A later boot into another kernel installs only that kernel's module package.
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.fetch.artifacts import Artifact
from bootfsm.fetch.indexes import cached_indexes
from bootfsm.fetch.store import resolved, verified
from bootfsm.fetch.ubuntu_signed import (
    SignedStack,
    deb_version,
    is_archive_key,
    resolve_stack,
    resolved_userspace,
    wanted,
)
from bootfsm.install import dpkg
from bootfsm.machine.context import Context
from bootfsm.node.verdict import installs_driver
from bootfsm.parsers import ParseError
from bootfsm.parsers.debian_relations import parse_relations, version_satisfies

__all__ = ["ROLE", "active", "install", "installed", "missing", "userspace"]

ROLE = "signed"


def active(ctx: Context) -> bool:
    """This run installs the driver from Ubuntu's archive (not when the image's is kept)."""
    return installs_driver(ctx.config, ctx.facts) and ctx.config.driver.source == "ubuntu-signed"


def _artifacts(ctx: Context) -> list[Artifact]:
    return [a for a in resolved(ctx) or () if a.role == ROLE]


def userspace(ctx: Context) -> str | None:
    """X: the user-space version resolved for the running kernel's module (None before fetch)."""
    return resolved_userspace(_artifacts(ctx), ctx.config.driver.version.split(".", 1)[0])


def missing(ctx: Context) -> list[Artifact]:
    """The resolved packages dpkg does not have installed at their version (one query)."""
    arts = _artifacts(ctx)
    have = dpkg.asked_versions(ctx, [a.name for a in arts])
    return [a for a in arts if have[a.name] != deb_version(a.filename)]


def installed(ctx: Context) -> bool:
    """Every resolved package is installed at its version (and fetch has resolved some)."""
    return bool(_artifacts(ctx)) and not missing(ctx)


def _stack(ctx: Context) -> SignedStack:
    texts = {k: t for k, t in (cached_indexes(ctx) or {}).items() if is_archive_key(k)}
    return resolve_stack(texts, wanted(ctx.config, ctx.facts))


def _unmet(ctx: Context, stack: SignedStack) -> list[str]:
    """The relation groups no installed package meets (what the node itself must have)."""
    groups = [parse_relations(g)[0] for g in stack.external]
    have = dpkg.installed_versions(ctx, sorted({r.name for g in groups for r in g}))
    return [
        " | ".join(str(r) for r in g)
        for g in groups
        if not any((v := have[r.name]) is not None and version_satisfies(v, r.op, r.version)
                   for r in g)
    ]  # fmt: skip


def install(ctx: Context) -> None:
    """dpkg -i the packages not yet installed, dependencies first; BootError
    DRIVER_INSTALL_FAILED (before dpkg runs) when the node lacks a base dependency."""
    stack = _stack(ctx)
    cfg = ctx.config.driver
    if cfg.version != stack.userspace:  # same branch: the branch named the packages
        ctx.warn(
            f"driver.version (GPU_DV) is {cfg.version}; Canonical built kernel {stack.kernel}'s"
            f" signed module against {stack.userspace}: installing {stack.userspace}",
            configured=cfg.version,
            installing=stack.userspace,
        )
    try:
        unmet = _unmet(ctx, stack)
    except ParseError as exc:
        raise BootError(Code.INDEX_INVALID, f"Depends in the archive's index: {exc}") from exc
    if unmet:
        raise BootError(
            Code.DRIVER_INSTALL_FAILED,
            f"the signed NVIDIA packages need {', '.join(unmet)}, which this node does not"
            " have installed (they are in Ubuntu's main/universe, which bootfsm does not"
            " install from): add them to the image",
        )
    todo = {a.name for a in missing(ctx)}
    debs = [(a, p) for a, p in verified(ctx, ROLE) if a.name in todo]
    if debs:
        dpkg.install_debs(
            ctx,
            dpkg.debs_of(ctx, debs),
            force=[],
            code=Code.DRIVER_INSTALL_FAILED,
            names=[a.name for a, _ in debs],
        )
    ctx.event(
        "driver.signed_installed",
        kernel=stack.kernel,
        module=stack.module,
        module_version=stack.module_version,
        userspace=stack.userspace,
        configured=cfg.version,
        installed=[a.name for a, _ in debs],
        versions={a.name: deb_version(a.filename) for a in _artifacts(ctx)},
    )
