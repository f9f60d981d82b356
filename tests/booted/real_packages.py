"""Canonical's real NVIDIA packages from Ubuntu's archive, fetched, checked and cached for
the booted lane (tests/booted/real_node.py installs them) and `make bench` (bench/
real_dkms.py).

Each suite's InRelease is checked with gpgv against Ubuntu's archive keyring (images.
ubuntu_keyring: the archive's own ubuntu-keyring .deb, pinned), the Packages index by the
SHA256 the signed InRelease gives it, and each .deb by the SHA256 its index stanza gives.
The .debs are cached under the lane's cache by that sha256, the indexes by theirs: a
fresh machine downloads them once.

What the archive serves here (checked 2026-12-07 through this machine's route to
archive.ubuntu.com; docs/testing.md): noble-updates and jammy-updates list the 580 branch's
user-space at 580.196.07, and every file of that version (nvidia-graphics-drivers-580-
server: nvidia-utils, libnvidia-compute, nvidia-kernel-common, nvidia-kernel-source-open,
nvidia-firmware-...-580.196.07; linux-modules-nvidia-580-server-open-6.8.0-1074-azure,
which depends on it) answers 404, as it did before. The previous release, 580.178.04, is
still in the pool (200) but no index lists it any more (superseded by 580.196.07), while
the signed modules built against it are listed: linux-modules-nvidia-580-server-open-
6.8.0-1073-azure (noble-updates and jammy-updates, linux-azure-6.8 on jammy) depends on
nvidia-kernel-common-580-server (>= 580.178.04, <= 580.178.04-1). So the lane installs the
1073 kernel's signed module and nvidia-firmware-580-server-580.178.04 (both listed, their
sha256 from the signed index) with the 580.178.04 user-space and daemons taken from the
pool, pinned below by the sha256 of the files downloaded on 2026-12-07 (no signed index
vouches for them today: that is the gap between pinned and indexed, said in
docs/testing.md; jammy's libnvidia-cfg1-580-server_580.178.04-0ubuntu0.22.04.1, which the
signed-install scenario needs, downloaded and pinned on 2026-12-07 too). The multiverse
daemons listed at 580.196.07 (nvidia-fabricmanager-580,
nvidia-imex-580, libnvidia-nscq-580) depend on nvidia-kernel-common-580-server-580.196.07,
so their 580.178.04 files are used, as a node on the 1073 kernel needs them.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from images import log, sha256, ubuntu_archive, ubuntu_keyring

BRANCH = "580"


@dataclass(frozen=True)
class Release:
    """One Ubuntu release's set: the azure kernel, its signed module's user-space."""

    suite: str  # noble
    kernel: str  # 6.8.0-1073-azure
    driver: str  # 580.178.04
    deb_suffix: str  # 0ubuntu0.24.04.1
    # the superseded user-space in the pool: package -> sha256 (2026-12-07)
    pinned: tuple[tuple[str, str], ...]

    @property
    def module_package(self) -> str:
        return f"linux-modules-nvidia-{BRANCH}-server-open-{self.kernel}"

    @property
    def indexed(self) -> tuple[tuple[str, str], ...]:
        """(component, package) listed by {suite}-updates, checked by the signed index."""
        return (
            ("restricted", self.module_package),
            ("restricted", f"nvidia-firmware-{BRANCH}-server-{self.driver}"),
        )

    def pool_path(self, package: str) -> str:
        multiverse = {
            f"nvidia-fabricmanager-{BRANCH}": f"f/fabric-manager-{BRANCH}",
            f"nvidia-imex-{BRANCH}": f"n/nvidia-imex-{BRANCH}",
            f"libnvidia-nscq-{BRANCH}": f"libn/libnvidia-nscq-{BRANCH}",
        }
        if package in multiverse:
            where = f"pool/multiverse/{multiverse[package]}"
        else:
            where = f"pool/restricted/n/nvidia-graphics-drivers-{BRANCH}-server"
        return f"{where}/{package}_{self.driver}-{self.deb_suffix}_amd64.deb"


# what a node needs at run time: the driver's user-space and the packaged daemons
NODE_PINNED = (
    f"nvidia-kernel-common-{BRANCH}-server",
    f"nvidia-utils-{BRANCH}-server",
    f"libnvidia-compute-{BRANCH}-server",
    f"nvidia-compute-utils-{BRANCH}-server",
    f"nvidia-fabricmanager-{BRANCH}",
    f"nvidia-imex-{BRANCH}",
    f"libnvidia-nscq-{BRANCH}",
)
# what a DKMS build needs besides (bench/bench_dkms.py)
DKMS_PINNED = (
    f"nvidia-kernel-common-{BRANCH}-server",
    f"nvidia-kernel-source-{BRANCH}-server-open",
    f"nvidia-dkms-{BRANCH}-server-open",
)

RELEASES = {
    "noble": Release(
        "noble",
        "6.8.0-1073-azure",
        "580.178.04",
        "0ubuntu0.24.04.1",
        (
            (
                "nvidia-kernel-common-580-server",
                "2de9bb6b749b4464b204290bc7cc8af691068d19dae5a61aa2b1638a316a437c",
            ),
            (
                "nvidia-utils-580-server",
                "b27e671e62a881ec77ce9b6058fde00fdeac00733d44e9b6fe56e8f6cc090d9d",
            ),
            (
                "libnvidia-compute-580-server",
                "b2c0fd25a7824be8563ab6ef044930094e27cc825855d34efe7d17dec963064d",
            ),
            (  # downloaded 2026-12-07 (tests/booted/signed_install.py)
                "libnvidia-cfg1-580-server",
                "a2b5383a7428975a6a8aa6fbb55f4f3f59ca1cf7fa4c5cbdd03f4313b696e199",
            ),
            (
                "nvidia-compute-utils-580-server",
                "eebd9b4f1d835cd33743cf44734e28c6100e885a11584da7432bb14639d273a5",
            ),
            (
                "nvidia-fabricmanager-580",
                "9563e2ae21447de9418321180c5229c683091004c0ec3a5a3af1db44f6cf675e",
            ),
            ("nvidia-imex-580", "de489391f70999a1bd55c4adbb71f73a960e9ba44a79f9c0654258fe7d0d170c"),
            (
                "libnvidia-nscq-580",
                "1b0f258678fe8805fd08077026093f959bdef93c0928b1ee11db8f4fc42ff7e8",
            ),
            (
                "nvidia-kernel-source-580-server-open",
                "91908ba43f86abd84b037ec4a6fe15d08597b401e8882c28ebc27a5ae414386c",
            ),
            (
                "nvidia-dkms-580-server-open",
                "f1abedc62e31a6e4ba45d8512cdf8f3c3bae3048eeda446cfa894dc3fcedf534",
            ),
        ),
    ),
    "jammy": Release(
        "jammy",
        "6.8.0-1073-azure",  # linux-azure-6.8, the HWE kernel Canonical builds for 22.04
        "580.178.04",
        "0ubuntu0.22.04.1",
        (
            (
                "nvidia-kernel-common-580-server",
                "5a70065b5bf31dfea6bd244ca8b5827e782042fa806cf7d9166f1a79045d4671",
            ),
            (
                "nvidia-utils-580-server",
                "f97661defd0fa858f34a3fa2ab62af853592e6037f2301ffa82a6d51bbb661fe",
            ),
            (
                "libnvidia-compute-580-server",
                "e187d63c36b9162954c7f75678c4444045fdb8e0d9df3073b9ab1245e27eb591",
            ),
            (  # downloaded 2026-12-07 (tests/booted/signed_install.py)
                "libnvidia-cfg1-580-server",
                "30f53b90037efba89f79fc7873e22bd719e1c7ad00dbcd52d248450274f35390",
            ),
            (
                "nvidia-compute-utils-580-server",
                "56085651b801b74c9669a4929be6898a95fe9fd66c30c903ffec8ce012280af6",
            ),
            (
                "nvidia-fabricmanager-580",
                "7c52dcdac680a70b21c92245103132f2d1e0691e97f92ab4581026860bc12e53",
            ),
            ("nvidia-imex-580", "b1282abee15d035611ecc9dedd980e5159ceafaa87ab96fed26a71c2982bb475"),
            (
                "libnvidia-nscq-580",
                "fcda7b1d2565b54cc293b3fe78f21d9bd6aa4b6f3c4f1530bd503a475be9e620",
            ),
            (
                "nvidia-kernel-source-580-server-open",
                "8d2d98ed35e5c49dcab5ce1c6b16577371abdbee757bf2f734dd59d40208c09c",
            ),
            (
                "nvidia-dkms-580-server-open",
                "e985d4d95bdefa58f65c7b59d10092eaafe8057edb2a4d4f85e91afda02c37b1",
            ),
        ),
    ),
}


def _download(url: str, dest: Path, want: str) -> Path:
    """`url` into `dest` (atomically) if its sha256 is `want`; raises otherwise."""
    if dest.is_file() and sha256(dest) == want:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as out:
        tmp = Path(out.name)
        try:
            with urllib.request.urlopen(url, timeout=300) as resp:
                shutil.copyfileobj(resp, out)
        except Exception:
            tmp.unlink(missing_ok=True)
            raise
    got = sha256(tmp)
    if got != want:
        tmp.unlink()
        raise RuntimeError(f"{url}: sha256 {got}, expected {want}: refusing it")
    os.replace(tmp, dest)
    return dest


def parse_stanzas(text: str) -> dict[str, dict[str, str]]:
    """A Packages index: package -> its stanza's fields (the last stanza of a name wins)."""
    out: dict[str, dict[str, str]] = {}
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields:
            out[fields["Package"]] = fields
    return out


def signed_sha256(inrelease_text: str, path: str) -> tuple[str, int]:
    """(sha256, size) the signed InRelease gives `path` (e.g. restricted/binary-amd64/
    Packages.xz)."""
    section = inrelease_text.split("\nSHA256:\n", 1)[1]
    for line in section.splitlines():
        if not line.startswith(" "):
            break
        digest, size, name = line.split()
        if name == path:
            return digest, int(size)
    raise RuntimeError(f"the signed InRelease lists no {path}")


def verified_inrelease(cache: Path, suite: str, *, refresh: bool) -> str:
    """The suite's InRelease, its signature checked by gpgv; the signed text."""
    ring = ubuntu_keyring(cache)
    path = cache / "ubuntu-archive" / suite / "InRelease"
    if refresh or not path.is_file():
        url = f"{ubuntu_archive()}/dists/{suite}/InRelease"
        log(f"ubuntu: downloading {url}")
        path.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=120) as resp:
            body = resp.read()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(body)
        os.replace(tmp, path)
    p = subprocess.run(
        ["gpgv", "--keyring", str(ring), "--output", "-", str(path)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if p.returncode != 0:
        raise RuntimeError(
            f"gpgv refuses {path} with Ubuntu's archive keyring: {p.stderr.decode()[-500:]}"
        )
    return p.stdout.decode()


def verified_index(
    cache: Path, suite: str, component: str, want: set[str]
) -> dict[str, dict[str, str]]:
    """The suite's component index (amd64), checked through the signed InRelease; fetched
    again when the cached one does not list every package in `want`."""
    for refresh in (False, True):
        signed = verified_inrelease(cache, suite, refresh=refresh)
        rel = f"{component}/binary-amd64/Packages.xz"
        digest, _size = signed_sha256(signed, rel)
        xz = cache / "ubuntu-archive" / suite / f"{component}-Packages-{digest[:16]}.xz"
        # by-hash: the file the InRelease names, even while the archive publishes a new one
        url = f"{ubuntu_archive()}/dists/{suite}/{component}/binary-amd64/by-hash/SHA256/{digest}"
        if not xz.is_file():
            log(f"ubuntu: downloading {suite} {rel}")
        _download(url, xz, digest)
        index = parse_stanzas(lzma.decompress(xz.read_bytes()).decode())
        if want <= index.keys():
            return index
    raise RuntimeError(f"{suite} {component} lists none of {sorted(want - index.keys())}")


@dataclass(frozen=True)
class Deb:
    package: str
    path: Path
    sha256: str
    vouched: str  # "InRelease" (the signed index) | "pinned"


def fetch(
    cache: Path, rel: Release, pinned: tuple[str, ...], extra: tuple[tuple[str, str], ...] = ()
) -> list[Deb]:
    """The release's indexed packages (and `extra` (component, package) ones), the named
    pinned ones; downloaded once into the cache, each checked."""
    debs: list[Deb] = []
    suite = f"{rel.suite}-updates"
    by_component: dict[str, set[str]] = {}
    for component, package in rel.indexed + extra:
        by_component.setdefault(component, set()).add(package)
    store = cache / "ubuntu-archive" / "debs"
    for component, names in sorted(by_component.items()):
        index = verified_index(cache, suite, component, names)
        for name in sorted(names):
            st = index[name]
            digest = st["SHA256"]
            dest = store / f"{digest[:16]}-{Path(st['Filename']).name}"
            if not dest.is_file():
                log(f"ubuntu: downloading {st['Filename']} ({int(st['Size']) >> 20} MB)")
            _download(f"{ubuntu_archive()}/{st['Filename']}", dest, digest)
            debs.append(Deb(name, dest, digest, "InRelease"))
    pins = dict(rel.pinned)
    for name in pinned:
        rel_path = rel.pool_path(name)
        dest = store / f"{pins[name][:16]}-{Path(rel_path).name}"
        if not dest.is_file():
            log(f"ubuntu: downloading {rel_path}")
        _download(f"{ubuntu_archive()}/{rel_path}", dest, pins[name])
        debs.append(Deb(name, dest, pins[name], "pinned"))
    return debs


def headers_packages(cache: Path, rel: Release) -> tuple[tuple[str, str], ...]:
    """linux-headers-<kernel> and the azure headers package it depends on (main)."""
    name = f"linux-headers-{rel.kernel}"
    index = verified_index(cache, f"{rel.suite}-updates", "main", {name})
    first = index[name]["Depends"].split(",")[0].split()[0]
    if not re.match(r"linux-azure(-[\d.]+)?-headers-", first):
        raise RuntimeError(f"{name} depends first on {first!r}, not an azure headers package")
    return (("main", name), ("main", first))


def digest_of(debs: list[Deb]) -> str:
    return hashlib.sha256("".join(sorted(d.sha256 for d in debs)).encode()).hexdigest()[:16]
