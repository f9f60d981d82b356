"""The signed driver source installing Canonical's REAL packages, in the booted lane.

Ubuntu's real archive cannot be used for this end to end today (real_packages.py's
docstring): its indexes list the 580 branch at 580.196.07, whose pool files answer 404
here, and no index lists 580.178.04 any more, the version the listed signed module for
6.8.0-1073-azure depends on (signed_mirror.py: code 47). So the loopback mirror serves a
repository of its own: its InRelease is signed by a key made for this run (gpg), which the
node's configured ``sources.ubuntu_archive_keyring`` holds; its Packages stanzas are the
REAL control stanzas of the cached real 580.178.04 .debs (``dpkg-deb -f``, every field
as Canonical wrote it) with the files' real SHA256 and Size; its pool serves those real
.debs. Only the signature over the index is ours; every byte bootfsm installs is
Canonical's (each file is checked against the sha256 the real signed index, or the pin of
real_packages.py, gives it before it is copied in).

bootfsm then runs with ``driver.source = "ubuntu-signed"`` on the simulated GPU node, on
Ubuntu 24.04 (noble) and 22.04 (jammy, linux-azure-6.8), booted as a Trusted Launch VM
with Secure Boot on (the simulator's ``secure-boot`` fault: EFI SecureBoot = 1, lockdown
integrity, module.sig_enforce Y, IMDS secureBootEnabled): it resolves the stack from
those indexes, verifies the InRelease with gpgv and each .deb by its SHA256, installs
them with the image's real dpkg (their real maintainer scripts run), loads the signed
module with `modprobe` (no nvidia-modprobe: none of Canonical's packages ships one, so
the node has no stand-in of it either) and goes to the end: exit 0, kubelet after it,
no compile. What the container cannot have is simulated: the GPU and the module load
(booted_node.GPU_STANDINS on bootfsm.service's PATH; the simulated kernel reads the REAL
nvidia.ko, its .modinfo and its appended signature, bootfsm/sim/kmod_elf.py), udev's run
of the package's ub-device-create, the packaged nvidia-persistenced's binary (a drop-in,
``gpu_daemon``), and the booted kernel's package: a container runs the host's kernel, so
the node's dpkg database gets a stand-in ``linux-image-<kernel>`` (no files, built here
with dpkg-deb, its Description says so) for the module package's Depends. The packages'
base dependencies from Ubuntu's main (libpciaccess0, adduser; ocl-icd-libopencl1 from
universe) are installed into the image first, each checked through the real signed main
index: the image's job, as bootfsm's message says when they are missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import lzma
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from images import Image, run, sha256, ubuntu_archive
from real_node import CANONICAL_SIGNER
from real_packages import (
    RELEASES,
    Release,
    _download,
    fetch,
    signed_sha256,
    verified_index,
    verified_inrelease,
)
from signed_mirror import DOCROOT, LISTED, config_text, rejected

# what a PCIe node's stack is (the lane's SKU has no NVSwitch: no fabric manager/IMEX)
PINNED = (
    "nvidia-kernel-common-580-server",
    "nvidia-utils-580-server",
    "libnvidia-compute-580-server",
    "nvidia-compute-utils-580-server",
    "libnvidia-cfg1-580-server",
)
BASE_DEPS = (("main", "libpciaccess0"), ("universe", "ocl-icd-libopencl1"), ("main", "adduser"))
KEYRING = "/etc/bootfsm/lane-archive-keyring.gpg"
# the run goes to the end: the simulated Secure Boot kernel loads Canonical's signed module
EXPECTED_CODE = "0"
EXPECTED_STATUS = "node provisioned"
# a Trusted Launch VM with Secure Boot on (bootfsm.sim's fault: EFI SecureBoot = 1,
# lockdown integrity, module.sig_enforce Y, IMDS secureBootEnabled "true")
NODE_FAULTS = ["secure-boot"]
# stand-ins a real Ubuntu node with Canonical's server user-space does not have: none of
# the packages ships nvidia-modprobe (dpkg-deb -c of the 580.178.04 debs), so bootfsm
# loads the packaged module with modprobe
NOT_ON_NODE = ("nvidia-modprobe",)
PERSISTENCED = "nvidia-persistenced"
BootFn = Callable[..., object]


def base_debs(cache: Path, suite: str) -> list[Path]:
    """BASE_DEPS from the real signed {suite} indexes, each checked by its SHA256."""
    out = []
    for component, name in BASE_DEPS:
        st = verified_index(cache, suite, component, {name})[name]
        dest = (
            cache / "ubuntu-archive" / "debs" / f"{st['SHA256'][:16]}-{Path(st['Filename']).name}"
        )
        out.append(_download(f"{ubuntu_archive()}/{st['Filename']}", dest, st["SHA256"]))
    return out


def kernel_standin(work: Path, rel: Release, module_version: str) -> Path:
    """The booted kernel's package name in dpkg's database, no files (a stand-in)."""
    root = work / "kernel-standin"
    shutil.rmtree(root, ignore_errors=True)
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: linux-image-{rel.kernel}\nVersion: {module_version}\nArchitecture: amd64\n"
        "Maintainer: bootfsm booted lane <root@localhost>\n"
        "Description: booted lane stand-in for the booted kernel's package\n"
        " A container runs the host's kernel; this names the kernel the signed module\n"
        " package is built for in dpkg's database. It ships no files.\n"
    )
    deb = work / f"linux-image-{rel.kernel}-standin.deb"
    run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)])
    return deb


def stanza(deb: Path, pool: str) -> str:
    """The .deb's real control stanza (dpkg-deb -f) with Filename, Size, SHA256."""
    control = subprocess.run(
        ["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True, timeout=60
    ).stdout.rstrip("\n")
    return f"{control}\nFilename: {pool}\nSize: {deb.stat().st_size}\nSHA256: {sha256(deb)}\n"


def newer_listed(cache: Path, rel: Release, names: set[str]) -> list[str]:
    """The REAL stanzas (verbatim, from the real signed {suite}-updates restricted index) of
    the newer user-space it lists today (580.196.07): listed, their files never served here,
    as on the real archive. A resolver that took the newest user-space fails on them."""
    # checked through the signed InRelease and cached by its digest; its text read below
    verified_index(cache, f"{rel.suite}-updates", "restricted", set())
    signed = verified_inrelease(cache, f"{rel.suite}-updates", refresh=False)
    sha, _size = signed_sha256(signed, "restricted/binary-amd64/Packages.xz")
    xz = cache / "ubuntu-archive" / f"{rel.suite}-updates" / f"restricted-Packages-{sha[:16]}.xz"
    out = []
    for block in lzma.decompress(xz.read_bytes()).decode().split("\n\n"):
        fields = dict(ln.split(": ", 1) for ln in block.splitlines() if ": " in ln and ln[0] != " ")
        name = fields.get("Package", "")
        newer = fields.get("Version", "").split("-")[0] == LISTED
        if newer and (name in names or name == f"nvidia-firmware-580-server-{LISTED}"):
            out.append(block.strip("\n") + "\n")
    if not out:
        raise RuntimeError(f"{rel.suite}-updates restricted lists no {LISTED} user-space any more")
    return out


def repository(root: Path, rel: Release, debs: list[Path], gnupg: Path, cache: Path) -> None:
    """dists/{suite,-updates,-security}/restricted (the stack in -updates), signed."""
    entries = []
    for deb in debs:
        pool = f"pool/restricted/n/nvidia-graphics-drivers-580-server/{deb.name.split('-', 1)[1]}"
        (root / pool).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(deb, root / pool)
        entries.append(stanza(deb, pool))
    entries += newer_listed(cache, rel, {Path(d).name.split("-", 1)[1].split("_")[0] for d in debs})
    for suite in (rel.suite, f"{rel.suite}-updates", f"{rel.suite}-security"):
        text = "\n".join(entries) if suite.endswith("-updates") else ""
        body = lzma.compress(text.encode(), format=lzma.FORMAT_XZ)
        digest = hashlib.sha256(body).hexdigest()
        dists = root / "dists" / suite
        for rel_path in ("Packages.xz", f"by-hash/SHA256/{digest}"):
            dest = dists / "restricted" / "binary-amd64" / rel_path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(body)
        when = time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime())
        release = (
            f"Origin: Ubuntu\nLabel: Ubuntu\nSuite: {suite}\nCodename: {rel.suite}\n"
            f"Date: {when}\nArchitectures: amd64\nComponents: restricted\n"
            "Description: booted lane: Canonical's 580.178.04 packages, index signed by a"
            " test key\nAcquire-By-Hash: yes\nSHA256:\n"
            f" {digest} {len(body)} restricted/binary-amd64/Packages.xz\n"
        )
        (dists / "Release").write_text(release)
        run(["gpg", "--homedir", str(gnupg), "--batch", "--yes", "--clearsign",
             "-o", str(dists / "InRelease"), str(dists / "Release")])  # fmt: skip


def test_key(gnupg: Path, keyring: Path) -> None:
    """A key made for this run; its public key as a binary keyring for gpgv."""
    shutil.rmtree(gnupg, ignore_errors=True)
    gnupg.mkdir(mode=0o700, parents=True)
    uid = "booted lane archive <root@localhost>"
    run(["gpg", "--homedir", str(gnupg), "--batch", "--passphrase", "",
         "--quick-gen-key", uid, "ed25519", "sign", "1d"])  # fmt: skip
    keyring.parent.mkdir(parents=True, exist_ok=True)
    keyring.write_bytes(
        subprocess.run(
            ["gpg", "--homedir", str(gnupg), "--export"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    )


def in_node(
    node: Path, *argv: str, binds: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    cmd = ["systemd-nspawn", "-q", "-D", str(node), "--register=no", "--keep-unit",
           "--private-network", "--pipe", *[f"--bind={b}" for b in binds], *argv]  # fmt: skip
    return subprocess.run(
        cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600, check=False
    )


def scenario(
    img: Image, prepared: Path, work: Path, cache: Path, boot: BootFn
) -> list[tuple[str, bool, str, float]]:
    """One boot installing the real stack, then modinfo, uninstall, apt-get check."""
    rel = RELEASES.get(img.suite)
    if rel is None:
        return []  # Canonical builds no signed azure modules for Debian
    title = (
        f"signed source provisions a Secure Boot node from Canonical's real {rel.driver}"
        f" packages ({rel.kernel}, no compile)"
    )
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "signed-install-config.toml"
    text = config_text((prepared / "etc/bootfsm/config.toml").read_text())
    text = text.replace("[sources]\n", f'[sources]\nubuntu_archive_keyring = "{KEYRING}"\n', 1)
    cfg.write_text(text)
    why = rejected(cfg)
    if why:
        return [(title, False, f"bootfsm validate refuses the config: {why}", 0.0)]
    t0 = time.monotonic()
    node = work / "signed-install-node"
    problems: list[str] = []
    facts: list[str] = []
    try:
        shutil.rmtree(node, ignore_errors=True)
        run(["cp", "-a", "--reflink=auto", str(prepared), str(node)])
        for name in NOT_ON_NODE:
            (node / "opt/bootfsm-sim/bin" / name).unlink()
        gpu_daemon(node)
        debs = fetch(cache, rel, PINNED)
        module = next(d for d in debs if d.package == rel.module_package)
        module_version = subprocess.run(
            ["dpkg-deb", "-f", str(module.path), "Version"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()  # fmt: skip
        gnupg = Path(tempfile.mkdtemp(prefix="lane-gnupg-", dir=work))
        try:
            test_key(gnupg, node / KEYRING.lstrip("/"))
            repository(node / DOCROOT, rel, [d.path for d in debs], gnupg, cache)
        finally:  # the agent gpg started for this home, then the home
            subprocess.run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"],
                           capture_output=True, timeout=60, check=False)  # fmt: skip
            shutil.rmtree(gnupg, ignore_errors=True)
        base = work / "base-debs"
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir()
        for deb in [*base_debs(cache, rel.suite), kernel_standin(work, rel, module_version)]:
            shutil.copyfile(deb, base / deb.name)
        p = in_node(node, "/bin/sh", "-c", "dpkg -i /base/*.deb", binds=(f"{base}:/base",))
        if p.returncode != 0:
            raise RuntimeError(
                f"installing the base dependencies: {p.stdout[-800:]}{p.stderr[-800:]}"
            )
        b = boot(
            node,
            work / "signed-install-boot",
            {"name": "signed-install", "kernel_release": rel.kernel, "node_faults": NODE_FAULTS},
            volatile=False,
            ro_binds={"/etc/bootfsm/config.toml": cfg.read_text()},
        )
        problems += boot_checks(b, node, rel, facts)
        problems += after_run(node, work, cfg, rel, [d.package for d in debs], facts)
    except Exception as exc:  # a broken scenario is a FAIL, never a skip
        problems.append(f"{type(exc).__name__}: {exc}"[-2000:])
    finally:  # the node copy (500 MB); the boot's reports stay under work
        shutil.rmtree(node, ignore_errors=True)
    ok = not problems
    return [(title, ok, "; ".join(problems + facts), time.monotonic() - t0)]


def gpu_daemon(node: Path) -> None:
    """nvidia-persistenced needs a GPU: the packaged unit (nvidia-compute-utils-580-server:
    Type=forking, ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced
    --no-persistence-mode --verbose, ExecStopPost) runs as packaged but for its binary,
    which a drop-in points at the simulator's stand-in with the same arguments: the real
    daemon, run here, logs "Failed to query NVIDIA devices" and exits 1 (no GPU). The
    unit is StopWhenUnneeded=true: on a real node nvidia-kernel-common's udev rule makes
    the bound driver's device (/bus/pci/drivers/nvidia) want it; no GPU binds in the
    container, so the drop-in stands for that device (StopWhenUnneeded=false): without
    it systemd stops the unit right after bootfsm starts it (seen: "Stopping
    nvidia-persistenced.service" 4 ms after "Started", bootfsm 84)."""
    bindir = node / "opt/bootfsm-sim/bin"
    template = (bindir / "modprobe").read_text()  # booted_node.prepare's stand-in script
    if "main('modprobe'," not in template:
        raise RuntimeError("the image's modprobe stand-in is not the expected script")
    daemon = bindir / PERSISTENCED
    daemon.write_text(
        template.replace("main('modprobe',", f"main({PERSISTENCED!r},").replace(
            "stand-in for modprobe", f"stand-in for {PERSISTENCED}"
        )
    )
    daemon.chmod(0o755)
    dropin = node / f"etc/systemd/system/{PERSISTENCED}.service.d/booted-lane-gpu.conf"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text(
        "# booted lane: the daemon needs a GPU; the simulator's stand-in answers for it.\n"
        "# On a real node the bound driver's device unit wants this unit (71-nvidia.rules:\n"
        '# ENV{SYSTEMD_WANTS}="nvidia-persistenced.service"), which keeps the packaged\n'
        "# StopWhenUnneeded=true unit running; no GPU binds here, so nothing would.\n"
        "[Unit]\nStopWhenUnneeded=false\n"
        "[Service]\nExecStart=\n"
        f"ExecStart=/{daemon.relative_to(node).as_posix()}"
        f" --user {PERSISTENCED} --no-persistence-mode --verbose\n"
    )


def _mono(props: dict[str, str], key: str) -> float:
    return int(props.get(key, "0") or "0") / 1e6


def boot_checks(b: object, node: Path, rel: Release, facts: list[str]) -> list[str]:
    """bootfsm.service ended 0 (node provisioned) on the Secure Boot node, kubelet started
    after it, and its journal names the signed stack and the module it loaded."""
    problems = []
    bf, kl = b.show("bootfsm"), b.show("kubelet")  # type: ignore[attr-defined]
    status = bf.get("StatusText", "")
    facts.append(f"exit {bf.get('ExecMainStatus')}: {status[:160]!r}")
    if bf.get("ExecMainStatus") != EXPECTED_CODE or EXPECTED_STATUS not in status:
        problems.append(
            f"bootfsm.service ExecMainStatus {bf.get('ExecMainStatus')} ({status[:300]!r}),"
            f" expected {EXPECTED_CODE} ({EXPECTED_STATUS!r})"
        )
    start, done = (
        _mono(kl, "ExecMainStartTimestampMonotonic"),
        _mono(bf, "ExecMainExitTimestampMonotonic"),
    )
    if kl.get("SubState") != "running" or not start >= done > 0:
        problems.append(
            f"kubelet {kl.get('ActiveState')}/{kl.get('SubState')} started at {start:.3f},"
            f" bootfsm exited at {done:.3f}"
        )
    else:
        facts.append("kubelet running, started after bootfsm exited")
    events = run_events(node)
    signed = [e for e in events if e.get("event") == "driver.signed_installed"]
    if not signed or signed[-1].get("module") != rel.module_package:
        problems.append(f"bootfsm's journal has no driver.signed_installed of {rel.module_package}")
    elif rel.driver not in json.dumps(signed[-1].get("userspace")):
        problems.append(f"driver.signed_installed userspace {signed[-1].get('userspace')!r}")
    else:
        facts.append(f"journal: driver.signed_installed {rel.module_package}")
    sb = [e for e in events if e.get("event") == "node.facts"][-1:]
    if not sb or "true" not in json.dumps(sb[0].get("secure_boot", "")).lower():
        problems.append(
            f"node.facts says no Secure Boot: {sb[0].get('secure_boot') if sb else '-'}"
        )
    loaded = b.text("sys-module-nvidia-version.txt").strip()  # type: ignore[attr-defined]
    if loaded != rel.driver:
        problems.append(f"/sys/module/nvidia/version {loaded!r}, not {rel.driver}")
    else:
        facts.append(f"the simulated kernel loaded nvidia {loaded} under module.sig_enforce")
    return problems


def run_events(node: Path) -> list[dict[str, object]]:
    """The events of bootfsm's newest run log on the node (/var/log/bootfsm/run-*.jsonl)."""
    logs = sorted((node / "var/log/bootfsm").glob("run-*.jsonl"))
    if not logs:
        return []
    out = []
    for line in logs[-1].read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _installed(node: Path, names: list[str]) -> dict[str, str]:
    """package -> "<status abbrev> <version>" as the node's dpkg-query says."""
    p = in_node(node, "dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev} ${Version}\\n",
                *names)  # fmt: skip
    out = {}
    for line in p.stdout.splitlines():
        name, _, rest = line.partition(" ")
        out[name] = " ".join(rest.split())
    return out


def after_run(
    node: Path, work: Path, cfg: Path, rel: Release, names: list[str], facts: list[str]
) -> list[str]:
    """Installed at their versions by the real dpkg, Canonical's signer on nvidia.ko,
    then `bootfsm uninstall` removes them and `apt-get check` is clean."""
    problems = []
    have = _installed(node, names)
    wrong = {n: v for n, v in have.items() if not v.startswith("ii ")}
    wrong.update({n: "absent" for n in names if n not in have})
    common = have.get("nvidia-kernel-common-580-server", "")
    if wrong or rel.driver not in common:
        problems.append(f"after the run dpkg has {wrong or common!r}")
    else:
        facts.append(f"dpkg: {len(names)} packages ii, nvidia-kernel-common {common.split()[-1]}")
    kos = sorted((node / "lib/modules" / rel.kernel).rglob("nvidia.ko*"))
    signer = ""
    if kos:  # the host's real kmod modinfo reads the file the package installed
        signer = subprocess.run(["modinfo", "-F", "signer", str(kos[0])], capture_output=True,
                                text=True, timeout=60, check=False).stdout.strip()  # fmt: skip
    if signer != CANONICAL_SIGNER:
        problems.append(f"nvidia.ko {[str(k) for k in kos][:1]} signer {signer!r}")
    else:
        facts.append(f"{kos[0].relative_to(node)} signer {signer!r}")
    why = apt_check(node, work)
    if why:
        problems.append(f"after the run {why}")
    # the PATH bootfsm.service has on the lane's node (booted_node.GPU_STANDINS first:
    # uninstall runs update-initramfs after removing its modprobe.d file)
    path = "PATH=/opt/bootfsm-sim/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    p = in_node(node, "/usr/bin/env", path, "/opt/bootfsm/bin/bootfsm", "uninstall",
                "--config", "/cfg.toml", binds=(f"{cfg}:/cfg.toml",))  # fmt: skip
    left = {n: v for n, v in _installed(node, names).items() if v.startswith("ii ")}
    if p.returncode != 0 or left:
        problems.append(f"bootfsm uninstall exit {p.returncode} ({(p.stdout + p.stderr)[-400:]!r}),"
                        f" still installed {sorted(left)}")  # fmt: skip
    else:
        facts.append(f"bootfsm uninstall exit 0, none of the {len(names)} left installed")
    why = apt_check(node, work)
    if why:
        problems.append(f"after uninstall {why}")
    else:
        facts.append("apt-get check clean before and after")
    return problems


def apt_check(node: Path, work: Path) -> str:
    """'' when apt-get check finds the node's dpkg database consistent; else its output."""
    # the lane's minbase image has no apt: the host's real apt-get checks the node's
    # dpkg database (every installed package's Depends met), with no sources
    state = work / "apt-state"
    shutil.rmtree(state, ignore_errors=True)
    (state / "lists" / "partial").mkdir(parents=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True)
    p = subprocess.run(
        ["apt-get", "check", "-o", f"Dir::State::status={node}/var/lib/dpkg/status",
         "-o", f"Dir::State::Lists={state}/lists", "-o", f"Dir::Cache={state}/cache",
         "-o", "Dir::Etc::SourceList=/dev/null", "-o", "Dir::Etc::SourceParts=/dev/null",
         "-o", "Dir::Etc::Preferences=/dev/null", "-o", "Dir::Etc::PreferencesParts=/dev/null",
         "-o", "APT::Architecture=amd64"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return "" if p.returncode == 0 else f"apt-get check exit {p.returncode}: {p.stdout[-400:]!r}"
