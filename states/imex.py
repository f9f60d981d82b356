"""imex: the nvidia-imex host binary from the CUDA apt repo, known to dpkg; its unit
masked.

On Grace-Blackwell the NVIDIA DRA driver runs IMEX per ComputeDomain and CDI-injects this
binary, so a node-wide ``nvidia-imex.service`` must not run.
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.fetch.store import resolved, verified
from bootfsm.install import dpkg, signed_stack
from bootfsm.install.daemons import IMEX
from bootfsm.install.runfile_debs import ensure_nvidia_modprobe
from bootfsm.machine.context import Context

NAME = "imex"
UNIT = IMEX.unit


def _package(ctx: Context) -> str:
    if signed_stack.active(ctx):  # installed by the driver state with the signed stack
        return f"nvidia-imex-{ctx.config.driver.version.split('.', 1)[0]}"
    arts = resolved(ctx) or []
    return next((a.name for a in arts if a.role == "imex"), "nvidia-imex")


def _of_driver(ctx: Context, version: str | None) -> bool:
    signed = signed_stack.active(ctx)
    want = (signed_stack.userspace(ctx) or "-") if signed else ctx.config.driver.version
    return version is not None and (version == want or version.startswith(want + "-"))


def satisfied(ctx: Context) -> bool:
    """nvidia-imex of the driver version is installed and its unit is masked."""
    name = _package(ctx)
    return _of_driver(ctx, dpkg.asked_versions(ctx, [name])[name]) and IMEX.configured(ctx)


def run(ctx: Context) -> None:
    """dpkg -i the verified deb once dpkg knows its nvidia-modprobe
    (install/runfile_debs.py), so `apt-get check` passes; then disable and mask the
    host unit."""
    have = dpkg.installed_version(ctx, _package(ctx))
    if signed_stack.active(ctx) and not _of_driver(ctx, have):
        raise BootError(Code.IMEX_INSTALL_FAILED, f"{_package(ctx)} is not installed ({have})")
    if not _of_driver(ctx, have):
        ensure_nvidia_modprobe(ctx, Code.IMEX_INSTALL_FAILED)
        dpkg.install_debs(
            ctx,
            dpkg.debs_of(ctx, verified(ctx, "imex")),
            force=[],
            code=Code.IMEX_INSTALL_FAILED,
            names=[_package(ctx)],
        )
    IMEX.mask(ctx)
