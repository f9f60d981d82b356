"""The booted lane's images: what each is, and how its root is built from its
distribution's own archive with mmdebstrap (the archive's signature checked), cached by a
content key.

Debian images come from the Debian mirror this machine's apt uses, checked with
debian-archive-keyring. Ubuntu images come from Ubuntu's archive (release, -updates and
-security pockets, as a node is kept), checked with Ubuntu's archive keyring; Debian's
archive here has no package of it, so it is taken from the archive's own ubuntu-keyring
.deb, pinned below by sha256 (the .deb, and the keyring file inside it).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PACKAGES = (
    "systemd",
    "systemd-sysv",
    "python3",
    "python3-venv",
    "containerd",
    # the simulator's artifact builders run inside the image: a real makeself runfile,
    # real dpkg-deb packages, tar.xz
    "makeself",
    "xz-utils",
    # the simulator signs its mirror's repositories with a real key (gpg, gpg-agent);
    # bootfsm checks them with gpgv (Debian 13's apt uses sqv: minbase has no gpgv)
    "gpg",
    "gpg-agent",
    "gpgv",
)
# What the whole test suite needs besides (make deps, less the browser, which Ubuntu 22.04
# ships only as a snap): zsh and groff for the completion and man page checks, readelf,
# setpriv, make, git (tests ask git what the checkout tracks), and curl and jq, with which
# tests/cse_caller.sh reads the SkipGpuDriverInstall tag from IMDS as cse_main.sh does
SUITE_PACKAGES = ("zsh", "groff-base", "binutils", "util-linux", "make", "git", "curl", "jq")
# The image Canonical's real NVIDIA packages are installed into (tests/booted/
# real_packages.py fetches them, checked against the archive's signed indexes, and installs
# them with the image's dpkg): their dependencies from the archive (libpciaccess0,
# ocl-icd-libopencl1, adduser), what nvidia-fabricmanager-start.sh runs (lspci, pci.ids,
# lsmod, ibstat), kmod's modinfo, systemd to verify and boot their units, and python3 with
# venv for bootfsm beside them
NVIDIA_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "python3",
    "python3-venv",
    "libpciaccess0",
    "ocl-icd-libopencl1",
    "adduser",
    "pciutils",
    "pci.ids",
    "kmod",
    "infiniband-diags",
)
# bench/bench_dkms.py: a real DKMS build of NVIDIA's open module source against the azure
# kernel's headers needs dkms (it pulls gcc, make, dpkg-dev), the compiler the kernel was
# built with, what the headers' prebuilt tools link (libelf, libssl), and what
# nvidia-kernel-common-580-server depends on (libpciaccess0)
DKMS_PACKAGES = {
    "noble": (
        "dkms",
        "gcc-13",
        "make",
        "libc6-dev",
        "kmod",
        "libelf1t64",
        "libssl3t64",
        "libpciaccess0",
    ),
    "jammy": ("dkms", "gcc-12", "make", "libc6-dev", "kmod", "libelf1", "libssl3", "libpciaccess0"),
}
MMDEBSTRAP_OPTS = ("--variant=minbase", "--mode=root", "--format=directory")
# the GPU firmware (nvidia-firmware-580-server-*, 76 MB) is never read without a GPU: dpkg
# installs the package but leaves its files out
NVIDIA_OPTS = ("--dpkgopt=path-exclude=/lib/firmware/nvidia/*",)

UBUNTU_ARCHIVE = "http://archive.ubuntu.com/ubuntu"
# noble/main/binary-amd64/Packages: Filename and SHA256 of ubuntu-keyring 2023.11.28.1,
# and the sha256 of usr/share/keyrings/ubuntu-archive-keyring.gpg inside it (the 2012 and
# 2018 "Ubuntu Archive Automatic Signing Key"s, F6ECB3762474EDA9D21B7022871920D1991BC93C
# signs every suite's InRelease today)
UBUNTU_KEYRING_DEB = (
    "pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb",
    "36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8",
)
UBUNTU_KEYRING_FILE = (
    "usr/share/keyrings/ubuntu-archive-keyring.gpg",
    "80a36b0a6de2f69f49d2df75ef473ccde121e9e190b9ea01d20a4f63778d5c31",
)


@dataclass(frozen=True)
class Image:
    """One node OS the lane boots."""

    name: str  # debian-12, ubuntu-24.04
    distro: str  # debian | ubuntu
    suite: str  # bookworm, noble
    systemd: str  # the systemd major version it must show
    # the tests run under its python3: "pure" (the parts of the suite with no host tools
    # beyond the image's own) or "full" (the whole suite, as make test runs it)
    tests: str = "pure"
    # Canonical's real NVIDIA packages are installed beside it (tests/booted/real_packages.py)
    nvidia: bool = False


IMAGES = (
    Image("debian-12", "debian", "bookworm", "252"),
    Image("debian-13", "debian", "trixie", "257"),
    Image("ubuntu-22.04", "ubuntu", "jammy", "249", tests="full", nvidia=True),
    Image("ubuntu-24.04", "ubuntu", "noble", "255", nvidia=True),
)


def log(msg: str) -> None:
    import sys

    print(f"[booted {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], *, timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(argv, text=True, capture_output=True, timeout=timeout, check=False, **kw)  # type: ignore[call-overload]
    if p.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}"
        )
    return p  # type: ignore[no-any-return]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses ($BOOTED_DEBIAN_MIRROR overrides)."""
    if os.environ.get("BOOTED_DEBIAN_MIRROR"):
        return os.environ["BOOTED_DEBIAN_MIRROR"]
    files = ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*"))]
    for name in files:
        with contextlib.suppress(OSError):
            text = Path(name).read_text()
            uris = re.findall(r"^URIs:\s*(\S+)", text, re.M)
            uris += re.findall(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+\S+", text, re.M)
            for uri in uris:
                if uri.rstrip("/").endswith("/debian"):
                    return uri.rstrip("/")
    raise RuntimeError("no Debian mirror in /etc/apt/sources.list*; set BOOTED_DEBIAN_MIRROR")


def ubuntu_archive() -> str:
    return os.environ.get("BOOTED_UBUNTU_ARCHIVE", UBUNTU_ARCHIVE).rstrip("/")


def ubuntu_keyring(cache: Path) -> Path:
    """Ubuntu's archive keyring, from the archive's ubuntu-keyring .deb (both pinned)."""
    rel, want = UBUNTU_KEYRING_DEB
    member, want_ring = UBUNTU_KEYRING_FILE
    ring = cache / f"ubuntu-keyring-{want_ring[:16]}.gpg"
    if ring.is_file() and sha256(ring) == want_ring:
        return ring
    cache.mkdir(parents=True, exist_ok=True)
    url = f"{ubuntu_archive()}/{rel}"
    log(f"ubuntu: downloading {url}")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        deb = Path(tmp) / "keyring.deb"
        with deb.open("wb") as out, urllib.request.urlopen(url, timeout=120) as resp:
            shutil.copyfileobj(resp, out)
        if (got := sha256(deb)) != want:
            raise RuntimeError(f"{url}: sha256 {got}, pinned {want}: refusing it")
        run(["dpkg-deb", "-x", str(deb), str(Path(tmp) / "x")])
        src = Path(tmp) / "x" / member
        if (got := sha256(src)) != want_ring:
            raise RuntimeError(f"{url}: {member} sha256 {got}, pinned {want_ring}")
        shutil.copyfile(src, Path(tmp) / "ring")
        os.replace(Path(tmp) / "ring", ring)
    return ring


def sources(img: Image, *, nvidia: bool = False) -> tuple[list[str], list[str]]:
    """(mmdebstrap options for the keyring, its source lines) for the image."""
    if img.distro == "debian":
        return [], [debian_mirror()]
    archive = ubuntu_archive()
    if nvidia:  # see NVIDIA_PACKAGES and DKMS_PACKAGES
        return [], [f"deb {archive} {img.suite}{p} main universe" for p in ("", "-updates")]
    pockets = ("", "-updates", "-security")
    return [], [f"deb {archive} {img.suite}{p} main universe" for p in pockets]


def base_image(img: Image, cache: Path, *, variant: str = "base") -> tuple[Path, bool]:
    """The cached mmdebstrap image of `img` (variant "base"; "nvidia": what Canonical's
    NVIDIA packages need, installed into it by real_packages.py; "dkms": a toolchain for
    a real DKMS build); (path, built now)."""
    nvidia = variant in ("nvidia", "dkms")
    if variant == "dkms":
        packages: tuple[str, ...] = DKMS_PACKAGES[img.suite]
    elif nvidia:
        packages = NVIDIA_PACKAGES
    else:
        packages = PACKAGES + (SUITE_PACKAGES if img.tests == "full" else ())
    opts = MMDEBSTRAP_OPTS + (NVIDIA_OPTS if variant == "nvidia" else ())
    keyopts, lines = sources(img, nvidia=nvidia)
    if img.distro == "ubuntu":
        keyopts = [f"--keyring={ubuntu_keyring(cache)}"]
    key_src = json.dumps([img.suite, lines, packages, opts, keyopts])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    stem = f"{variant}-{img.suite}"
    path = cache / f"{stem}-{key}"
    if (path / ".complete").is_file():
        return path, False
    tmp = cache / f".tmp-{stem}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"{img.name}: building the {variant} image with mmdebstrap ({img.suite}, {lines[0]})")
    run(
        [
            "mmdebstrap",
            *opts,
            *keyopts,
            f"--include={','.join(packages)}",
            img.suite,
            str(tmp),
            *lines,
        ],
        timeout=1800,
    )
    (tmp / ".complete").write_text(key_src + "\n")
    for old in cache.glob(f"{stem}-*"):
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(path)
    return path, True
