"""The signed driver source (``driver.source = "ubuntu-signed"``) against Ubuntu's real
archive files, in the booted lane.

A loopback mirror inside the booted node (the image's mirror unit, booted_node.py, which
serves any file under its docroot on 127.0.0.1:8765) serves, under /ubuntu, the REAL
InRelease files of {suite}, {suite}-updates and {suite}-security (Canonical's signatures,
checked by bootfsm against /usr/share/keyrings/ubuntu-archive-keyring.gpg, the file of
the archive's ubuntu-keyring package, pinned by images.py), their real restricted and
multiverse Packages indexes (plain path and by-hash), and the real .debs from the cache
(tests/booted/real_packages.py) at their pool paths. bootfsm runs with ``driver.source =
"ubuntu-signed"`` and ``sources.ubuntu_archive = http://127.0.0.1:8765/ubuntu`` on the
simulated GPU node (only what needs a GPU is simulated), the node's kernel release
(/proc/sys/kernel/osrelease, bind-mounted at boot by booted_node.py setup: scenario
kernel_release) being the azure kernel the module package is built for.

What the real archive says today (real_packages.py's docstring): for 6.8.0-1073-azure the
signed module package is listed and depends on exactly nvidia-kernel-common-580-server
580.178.04, which no index lists any more (580.196.07 superseded it). So the expected
outcome is bootfsm's code 47 (the signed module's exact user-space version no longer
listed), decided from the real signed indexes before anything is installed. (The full
install of the listed 6.8.0-1074-azure set cannot be served: its files answer 404 here.)

The message must name both versions (580.178.04, needed; 580.196.07, listed). A checkout
older than ``driver.source`` has ``bootfsm validate`` reject the key: the scenario is then
skipped with that message (logged, no row). signed_install.py is the scenario in which
bootfsm does install Canonical's real packages.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from images import Image, log, run, ubuntu_keyring
from real_packages import (
    NODE_PINNED,
    RELEASES,
    Release,
    fetch,
    signed_sha256,
    verified_index,
    verified_inrelease,
)

MIRROR = "http://127.0.0.1:8765/ubuntu"
DOCROOT = "var/lib/booted/mirror/ubuntu"  # booted_node.DOCROOT, relative to the root
COMPONENTS = ("restricted", "multiverse")
EXPECTED_CODE = "47"
LISTED = "580.196.07"  # what noble-updates lists today (real_packages.py)


def config_text(base: str) -> str:
    """The image's config with the signed source and the loopback archive set."""
    text = base
    for section, line in (
        ("driver", 'source = "ubuntu-signed"'),
        ("sources", f'ubuntu_archive = "{MIRROR}"'),
    ):
        head = re.search(rf"^\[{section}\]\n", text, re.M)
        if head:
            text = text[: head.end()] + line + "\n" + text[head.end() :]
        else:
            text = text.rstrip("\n") + f"\n\n[{section}]\n{line}\n"
    return text


def rejected(config: Path) -> str:
    """bootfsm validate's refusal of the config ('' when it accepts it)."""
    host_bootfsm = Path(sys.executable).parent / "bootfsm"
    p = subprocess.run(
        [str(host_bootfsm), "validate", "--config", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return "" if p.returncode == 0 else (p.stdout + p.stderr).strip()[:300]


def docroot(cache: Path, rel: Release, root: Path) -> None:
    """Real InReleases, indexes and .debs of `rel` under root/ubuntu (the archive's
    layout)."""
    for suite in (rel.suite, f"{rel.suite}-updates", f"{rel.suite}-security"):
        dists = root / "dists" / suite
        dists.mkdir(parents=True, exist_ok=True)
        for component in COMPONENTS:
            verified_index(cache, suite, component, set())
        signed = verified_inrelease(cache, suite, refresh=False)
        shutil.copy(cache / "ubuntu-archive" / suite / "InRelease", dists / "InRelease")
        for component in COMPONENTS:
            # the index file this InRelease names (real_packages caches it by its digest)
            digest, _size = signed_sha256(signed, f"{component}/binary-amd64/Packages.xz")
            xz = cache / "ubuntu-archive" / suite / f"{component}-Packages-{digest[:16]}.xz"
            for rel_path in ("Packages.xz", f"by-hash/SHA256/{digest}"):
                dest = dists / component / "binary-amd64" / rel_path
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(xz, dest)
    for deb in fetch(cache, rel, NODE_PINNED):
        if deb.package in dict(rel.pinned):
            pool = rel.pool_path(deb.package)
        else:
            index = verified_index(cache, f"{rel.suite}-updates", "restricted", {deb.package})
            pool = index[deb.package]["Filename"]
        (root / pool).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(deb.path, root / pool)


BootFn = Callable[..., object]


def scenario(
    img: Image, prepared: Path, work: Path, cache: Path, boot: BootFn
) -> list[tuple[str, bool, str, float]]:
    """One boot with the signed source on the real archive's files; [] when skipped."""
    rel = RELEASES[img.suite]
    title = f"signed source on Ubuntu's real archive files ({rel.kernel}): code {EXPECTED_CODE}"
    base_cfg = (prepared / "etc/bootfsm/config.toml").read_text()
    cfg = work / "signed-config.toml"
    work.mkdir(parents=True, exist_ok=True)
    cfg.write_text(config_text(base_cfg))
    why = rejected(cfg)
    if why:
        log(f"{img.name}: skipped the signed-source scenario: bootfsm validate refuses"
            f" driver.source here ({why!r}); it runs once that key exists")  # fmt: skip
        return []
    t0 = time.monotonic()
    node = work / "signed-node"
    try:
        shutil.rmtree(node, ignore_errors=True)
        run(["cp", "-a", "--reflink=auto", str(prepared), str(node)])
        docroot(cache, rel, node / DOCROOT)
        # a node has it from ubuntu-keyring (apt depends on it); the lane's minbase image
        # has no apt: the same file, from the archive's ubuntu-keyring .deb (pinned)
        ring = node / "usr/share/keyrings/ubuntu-archive-keyring.gpg"
        ring.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ubuntu_keyring(cache), ring)
        b = boot(
            node,
            work / "signed-boot",
            {"name": "signed-source", "kernel_release": rel.kernel},
            volatile=True,
            ro_binds={"/etc/bootfsm/config.toml": cfg.read_text()},
        )
        bf, kl = b.show("bootfsm"), b.show("kubelet")  # type: ignore[attr-defined]
        problems = []
        if bf.get("ExecMainStatus") != EXPECTED_CODE:
            problems.append(
                f"bootfsm.service ExecMainStatus {bf.get('ExecMainStatus')}, expected"
                f" {EXPECTED_CODE} (StatusText {bf.get('StatusText')!r})"
            )
        if kl.get("ActiveState") == "active":
            problems.append("kubelet started on a node without its driver")
        # the message names the version the module needs and the one the indexes list
        failed = [ln for ln in b.journal().splitlines() if "SIGNED_USERSPACE_MISSING" in ln]  # type: ignore[attr-defined]
        for version in (rel.driver, LISTED):
            if not any(version in ln for ln in failed):
                problems.append(f"bootfsm's code 47 message never names {version}")
        ok = not problems
        detail = "; ".join(problems) or (
            f"exit {bf.get('ExecMainStatus')}: {bf.get('StatusText', '')[:200]!r}; kubelet"
            f" {kl.get('ActiveState')}"
        )
    except Exception as exc:  # a broken scenario is a FAIL, never a skip
        ok, detail = False, f"{type(exc).__name__}: {exc}"[-2000:]
    finally:
        shutil.rmtree(node, ignore_errors=True)
    return [(title, ok, detail, time.monotonic() - t0)]
