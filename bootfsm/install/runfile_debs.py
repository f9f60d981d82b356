"""What the driver runfile installed, told to dpkg: an nvidia-modprobe record.

nvidia-imex ``Depends: nvidia-modprobe``, which the runfile installs behind dpkg's back;
a file-less package at the binary's version (the equivs way) meets it, so nvidia-imex
installs without --force-depends and `apt-get check` passes. Nothing absent is claimed.
"""

from __future__ import annotations

import re

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.install import dpkg
from bootfsm.machine.context import Context

__all__ = ["BIN", "PACKAGE", "control_text", "ensure_nvidia_modprobe"]

PACKAGE = "nvidia-modprobe"
BIN = "/usr/bin/nvidia-modprobe"
_VERSION = re.compile(r"version\s+([0-9]+(?:\.[0-9]+)+)")


def control_text(version: str, arch: str) -> str:
    """DEBIAN/control of the record, version ``<version>-1+runfile``."""
    # +runfile sorts above NVIDIA's own -1 build of that version, below their next revision
    return (
        f"Package: {PACKAGE}\nVersion: {version}-1+runfile\nArchitecture: {arch}\n"
        "Maintainer: bootfsm <root@localhost>\nSection: utils\nPriority: optional\n"
        f"Description: nvidia-modprobe as the NVIDIA driver runfile installed it\n"
        f" {BIN} {version} was installed by nvidia-installer, which dpkg does not\n"
        " know about. This package has no files: it records that the program is there,\n"
        " so that packages depending on it (nvidia-imex) have their dependencies met.\n"
        " Written by bootfsm (docs/node-contract.md); `bootfsm uninstall` purges it.\n"
    )


def ensure_nvidia_modprobe(ctx: Context, code: Code) -> None:
    """Make dpkg know an nvidia-modprobe (a real one, else the record for the runfile's
    binary); BootError ``code`` when the node has neither."""
    if dpkg.installed_version(ctx, PACKAGE) is not None:
        return
    if not ctx.host.exists(BIN):
        raise BootError(
            code, f"nvidia-imex depends on {PACKAGE}: dpkg has no such package and {BIN} is absent"
        )
    r = ctx.run([str(ctx.host.path(BIN)), "--version"], timeout=30, die_with_bootfsm=False)
    found = _VERSION.search(r.output)
    if found is None:
        raise BootError(code, f"{BIN} --version names no version", output=r.output[-300:])
    arch = ctx.facts.arch.debian if ctx.facts.arch else ""
    work = f"{ctx.config.run.state_dir}/debs"
    ctx.host.own_dir(work)
    build = f"{work}/{PACKAGE}"
    ctx.host.rmtree(build)
    ctx.host.makedirs(f"{build}/DEBIAN")
    ctx.host.write_atomic(f"{build}/DEBIAN/control", control_text(found[1], arch), 0o644)
    deb = f"{work}/{PACKAGE}_{found[1]}-1+runfile_{arch}.deb"
    argv = ["dpkg-deb", "--root-owner-group", "--build", str(ctx.host.path(build))]
    ctx.require([*argv, str(ctx.host.path(deb))], code=code, timeout=60, what="dpkg-deb failed")
    sha = ctx.host.sha256(deb) or ""  # dpkg installs a private copy of exactly these bytes
    dpkg.install_debs(ctx, [(deb, sha)], force=[], code=code, names=[PACKAGE])
    ctx.host.rmtree(build)
    ctx.host.remove(deb)
    ctx.event("dpkg.recorded", package=PACKAGE, version=f"{found[1]}-1+runfile", reason=BIN)
