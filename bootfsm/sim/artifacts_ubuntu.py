"""An Ubuntu-archive-shaped repository for the simulated mirror: Canonical's signed NVIDIA
server stack, as ``driver.source = "ubuntu-signed"`` reads it.

Shape copied from http://archive.ubuntu.com/ubuntu as read on 2026-12-07 (noble-updates,
InRelease Date 2026-12-06): ``dists/<suite>/InRelease`` (clear-signed; Origin, Label,
Suite, Version, Codename, Date, Architectures, Components, Description, then the
MD5Sum/SHA1/SHA256 lists of ``<component>/binary-<arch>/Packages{,.gz,.xz}``; the
uncompressed ``Packages`` is listed but not served, as there: a 404), and ``pool/``
files. Every package is made by the real ``dpkg-deb`` with the control fields of its
real counterpart (names, Version scheme, Depends, Provides, Conflicts, Replaces): the
module ``linux-modules-nvidia-<B>-server-open-<kernel>`` (Depends on
``nvidia-kernel-common-<B>-server (<= X-1), (>= X)``, files under
``/lib/modules/<kernel>/kernel/nvidia-<B>srv-open/``, the paths of the archive's
Contents-amd64), the user-space ``-0ubuntu0.<release>.1`` packages and multiverse's
fabric manager, NSCQ and IMEX. The simulator's modules and libraries are its own
formats (``version=`` lines, stand-in scripts), never NVIDIA's binaries.
"""

from __future__ import annotations

import datetime
import email.utils
import gzip
import hashlib
import lzma
from collections.abc import Mapping, Sequence
from pathlib import Path

from bootfsm.sim.artifacts_packages import _control_fields, build_deb
from bootfsm.sim.artifacts_redist import _FM_UNIT
from bootfsm.sim.artifacts_signing import RepoSigner
from bootfsm.sim.artifacts_tools import digests
from bootfsm.sim.elf import shared_object

__all__ = ["BASE_PACKAGES", "PERSISTENCED_UNIT", "base_status", "build_ubuntu_archive"]

_MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")
# nvidia-compute-utils-580-server 580.178.04's unit, as packaged (no [Install]: static;
# 71-nvidia.rules of nvidia-kernel-common pulls it in when the driver binds)
PERSISTENCED_UNIT = """\
[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
StopWhenUnneeded=true
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
"""
BASE_PACKAGES = {  # what the signed stack's Depends need from the node (noble versions)
    "libc6": "2.39-0ubuntu8.6",
    "libgcc-s1": "14.2.0-4ubuntu2~24.04",
    "libssl3t64": "3.0.13-0ubuntu3.6",
    "libpciaccess0": "0.17-3build1",
    "ocl-icd-libopencl1": "2.3.2-1build1",
    "adduser": "3.137ubuntu1",
}


def base_status(kernel: str, arch: str, missing: Sequence[str] = ()) -> str:
    """dpkg status stanzas of the node's base packages and its kernel's linux-image."""
    pkgs = {**BASE_PACKAGES, f"linux-image-{kernel}": kernel.rsplit("-", 1)[0] + ".1"}
    return "".join(
        f"Package: {name}\nStatus: install ok installed\nPriority: optional\n"
        f"Section: libs\nMaintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>"
        f"\nArchitecture: {'all' if name == 'adduser' else arch}\nVersion: {version}\n"
        f"Description: {name} (bootfsm simulator base system)\n\n"
        for name, version in pkgs.items()
        if name not in missing
    )


def _userspace(
    pool: Path, b: str, x: str, rel: str, arch: str, libdir: str, scripts: Mapping[str, str]
) -> dict[str, list[Path]]:
    """The -0ubuntu0.<rel>.1 user-space of version ``x``: component -> debs."""
    v = f"{x}-0ubuntu0.{rel}.1"
    lib = f"/usr/lib/{libdir}-linux-gnu"
    drv = pool / "restricted" / "n" / f"nvidia-graphics-drivers-{b}-server"
    common = f"nvidia-kernel-common-{b}-server"

    def deb(where: Path, name: str, **kw: object) -> Path:
        return build_deb(where, package=name, version=v, arch=arch, **kw)  # type: ignore[arg-type]

    restricted = [
        deb(drv, f"nvidia-firmware-{b}-server-{x}",
            files={f"/lib/firmware/nvidia/{x}/gsp_ga10x.bin": b"GSP firmware (simulated)\n"},
            fields={"Replaces": f"nvidia-firmware-{b}-{x}", "Breaks": f"nvidia-firmware-{b}-{x}"}),
        deb(drv, common,
            files={f"/usr/share/doc/{common}/copyright": b"NVIDIA (simulated)\n"},
            depends=f"libc6 (>= 2.38), libpciaccess0 (>= 0.10.7), nvidia-firmware-{b}-server-{x}",
            fields={"Provides": f"nvidia-kernel-common, {common}-{x}",
                    "Conflicts": "nvidia-kernel-common", "Replaces": "nvidia-kernel-common"}),
        deb(drv, f"libnvidia-compute-{b}-server",
            files={f"{lib}/libnvidia-ml.so.{x}": shared_object("libnvidia-ml.so.1", libdir),
                   f"{lib}/libcuda.so.{x}": shared_object("libcuda.so.1", libdir)},
            links={f"{lib}/libnvidia-ml.so.1": f"libnvidia-ml.so.{x}",
                   f"{lib}/libcuda.so.1": f"libcuda.so.{x}"},
            depends=f"{common}-{x}, ocl-icd-libopencl1, libc6 (>= 2.34), libgcc-s1 (>= 4.3),"
            " libssl3t64 (>= 3.0.0)",
            fields={"Provides": f"libcuda.so.1 (= {v}), libcuda1 (= {v}), libnvidia-compute,"
                    f" libnvidia-ml.so.1 (= {v}), libnvidia-ml1 (= {v}), nvidia-opencl-icd,"
                    " opencl-icd",
                    "Conflicts": "libnvidia-compute, nvidia-opencl-icd",
                    "Replaces": "libnvidia-compute, nvidia-opencl-icd"}),
        deb(drv, f"nvidia-utils-{b}-server",
            files={"/usr/bin/nvidia-smi": scripts["nvidia-smi"].encode()},
            depends=f"{common}-{x}, libc6 (>= 2.34), libnvidia-compute-{b}-server (>= {x})",
            fields={"Provides": "nvidia-smi, nvidia-utils", "Conflicts": "nvidia-smi, nvidia-utils",
                    "Replaces": "nvidia-smi, nvidia-utils"}),
        deb(drv, f"nvidia-compute-utils-{b}-server",
            files={"/usr/bin/nvidia-persistenced": scripts["nvidia-persistenced"].encode(),
                   "/usr/bin/nvidia-cuda-mps-control": b"#!/bin/sh\nexit 0\n",
                   "/usr/lib/systemd/system/nvidia-persistenced.service":
                       PERSISTENCED_UNIT.encode()},
            depends=f"libnvidia-compute-{b}-server, adduser, libc6 (>= 2.34)",
            fields={"Provides": "nvidia-compute-utils, nvidia-persistenced",
                    "Conflicts": "nvidia-compute-utils, nvidia-persistenced",
                    "Replaces": "nvidia-compute-utils, nvidia-persistenced"}),
        deb(drv, f"libnvidia-cfg1-{b}-server",
            files={f"{lib}/libnvidia-cfg.so.{x}": b"libnvidia-cfg (simulated)\n"},
            links={f"{lib}/libnvidia-cfg.so.1": f"libnvidia-cfg.so.{x}"},
            depends=f"{common}-{x}, libc6 (>= 2.34)",
            fields={"Provides": "libnvidia-cfg1-any", "Conflicts": "libnvidia-cfg1-any",
                    "Replaces": "libnvidia-cfg1-any"}),
    ]  # fmt: skip
    mv = pool / "multiverse"
    multiverse = [
        deb(mv / "f" / f"fabric-manager-{b}", f"nvidia-fabricmanager-{b}",
            files={"/usr/bin/nv-fabricmanager": b"#!/bin/sh\nexit 0\n",
                   "/usr/bin/nvidia-fabricmanager-start.sh": scripts["fm-start"].encode(),
                   "/usr/share/nvidia/nvswitch/fabricmanager.cfg": b"LOG_LEVEL=4\n",
                   "/lib/systemd/system/nvidia-fabricmanager.service": _FM_UNIT.encode()},
            depends=f"{common}-{x}",
            fields={"Provides": "nvidia-fabricmanager", "Conflicts": "nvidia-fabricmanager",
                    "Replaces": "nvidia-fabricmanager"}),
        deb(mv / "libn" / f"libnvidia-nscq-{b}", f"libnvidia-nscq-{b}",
            files={f"{lib}/libnvidia-nscq.so.{x}": b"NSCQ (simulated)\n"},
            depends=f"{common}-{x}",
            fields={"Provides": "libnvidia-nscq, nscq", "Conflicts": "libnvidia-nscq",
                    "Replaces": "libnvidia-nscq"}),
        deb(mv / "n" / f"nvidia-imex-{b}", f"nvidia-imex-{b}",
            files={"/usr/bin/nvidia-imex": b"#!/bin/sh\necho nvidia-imex\n",
                   "/usr/bin/nvidia-imex-ctl": b"#!/bin/sh\necho READY\n",
                   "/etc/nvidia-imex/config.cfg": b"SERVER_PORT=50000\n"},
            conffiles=["/etc/nvidia-imex/config.cfg"],
            depends=f"{common}-{x}",
            fields={"Provides": "nvidia-imex", "Conflicts": "nvidia-imex",
                    "Replaces": "nvidia-imex"}),
    ]  # fmt: skip
    return {"restricted": restricted, "multiverse": multiverse}


def _module(pool: Path, b: str, kernel: str, x: str, arch: str, open_: bool, rev: int) -> Path:
    """The kernel's module package, version ``<kernel's>+<rev>``: a rebuild for the same
    kernel against a newer user-space is a higher ``+N`` of the same package, as in the
    archive (6.8.0-1073.82 built for 580.178.04, 6.8.0-1074.83+1 for 580.196.07)."""
    flavour = "-open" if open_ else ""
    abi = kernel.split("-")[1]
    sub = f"nvidia-{b}srv{flavour}"
    # signed by Canonical, as the real packaged modules are (modinfo -F signer)
    body = (
        f"version={x}\nmodule_type={'open' if open_ else 'proprietary'}\n"
        "signer=Canonical Ltd. Kernel Module Signing\n"
    ).encode()
    return build_deb(
        pool / "restricted" / "l" / "linux-restricted-signatures-azure",
        package=f"linux-modules-nvidia-{b}-server{flavour}-{kernel}",
        version=f"{kernel.rsplit('-', 1)[0]}.{int(abi) % 100 + 8}+{rev}",  # 6.8.0-1074.83+1
        arch=arch,
        files={f"/lib/modules/{kernel}/kernel/{sub}/{m}.ko": body for m in _MODULES},
        depends=f"linux-image-{kernel} | linux-image-unsigned-{kernel},"
        f" nvidia-kernel-common-{b}-server (<= {x}-1), nvidia-kernel-common-{b}-server (>= {x})",
    )


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _stanza(deb: Path, top: Path) -> str:
    sums = digests(deb, "md5", "sha1", "sha256", "sha512")
    control = [(n, v) for n, v in _control_fields(deb) if n != "Description"]
    desc = [(n, v) for n, v in _control_fields(deb) if n == "Description"]
    fields = [
        *control,
        ("Filename", deb.relative_to(top).as_posix()),  # no "./": the archive's form
        ("Size", str(deb.stat().st_size)),
        ("MD5sum", sums["md5"]),
        ("SHA1", sums["sha1"]),
        ("SHA256", sums["sha256"]),
        ("SHA512", sums["sha512"]),
        *desc,
    ]
    return "".join(f"{n}: {v}\n" for n, v in fields)


def _suite(top: Path, suite: str, codename: str, rel: str, arch: str,
           comps: Mapping[str, Sequence[Path]], signer: RepoSigner) -> None:  # fmt: skip
    """dists/<suite>: per component Packages.gz and .xz, then the signed InRelease."""
    d = top / "dists" / suite
    listed: list[tuple[str, bytes]] = []
    for comp, debs in comps.items():
        text = "\n".join(_stanza(deb, top) for deb in debs).encode()
        name = f"{comp}/binary-{arch}/Packages"
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        gz = gzip.compress(text, mtime=0)
        xz = lzma.compress(text, format=lzma.FORMAT_XZ)
        (d / f"{name}.gz").write_bytes(gz)
        (d / f"{name}.xz").write_bytes(xz)
        listed += [(name, text), (f"{name}.gz", gz), (f"{name}.xz", xz)]
    when = email.utils.format_datetime(datetime.datetime.now(datetime.timezone.utc))
    lines = [
        "Origin: Ubuntu", "Label: Ubuntu", f"Suite: {suite}", f"Version: {rel}",
        f"Codename: {codename}", f"Date: {when}", f"Architectures: {arch}",
        f"Components: {' '.join(comps)}", f"Description: Ubuntu {rel} (bootfsm simulator)",
    ]  # fmt: skip
    for head, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256")):
        lines.append(f"{head}:")
        for name, data in listed:
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data):>16} {name}")
    lines.append("Acquire-By-Hash: yes")
    release = d / "Release"
    release.write_text("\n".join(lines) + "\n")
    signer.sign(release)
    (d / "Release.gpg").unlink()  # the archive also serves these; bootfsm reads InRelease
    release.unlink()


def build_ubuntu_archive(
    top: Path,
    signer: RepoSigner,
    *,
    codename: str,
    release: str,
    arch: str,
    libdir: str,
    kernels: Mapping[str, str],
    userspace: Sequence[str],
    scripts: Mapping[str, str],
    branch: str = "580",
    open_: bool = True,
) -> None:
    """The archive under ``top``: each kernel's module (depending on its user-space
    version, ``kernels`` kernel -> X) and the user-space of each version in
    ``userspace``, all in ``<codename>-updates``; the release and -security pockets
    are published empty (Ubuntu's release pocket has no 580 server stack)."""
    pool = top / "pool"
    comps: dict[str, list[Path]] = {"restricted": [], "multiverse": []}
    for x in userspace:
        for comp, debs in _userspace(pool, branch, x, release, arch, libdir, scripts).items():
            comps[comp] += debs
    for kernel, x in kernels.items():  # +1, or higher when older user-space is listed
        older = {v for v in userspace if _numbers(v) < _numbers(x)}
        comps["restricted"].append(_module(pool, branch, kernel, x, arch, open_, len(older) + 1))
    empty: dict[str, list[Path]] = {"restricted": [], "multiverse": []}
    for suite, content in ((codename, empty), (f"{codename}-updates", comps),
                           (f"{codename}-security", empty)):  # fmt: skip
        _suite(top, suite, codename, release, arch, content, signer)
