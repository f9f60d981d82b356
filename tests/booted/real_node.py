"""Canonical's real NVIDIA packages on the Ubuntu images of the booted lane.

For Ubuntu 24.04 and 22.04: the image of their dependencies (images.NVIDIA_PACKAGES),
bootfsm installed into it from this checkout's wheel with its unit (``bootfsm
install-unit --root``) and kubelet's unit beside, then Canonical's packages
(real_packages.py: the signed module for the azure kernel, the driver's user-space,
nvidia-persistenced, nvidia-fabricmanager, nvidia-imex) installed with the image's own
dpkg in a non-booted container (image/real/real_node.sh): their maintainer scripts run,
their units land where they ship them. Then the node boots under its real systemd
(image/real/real-report.service reports and powers off). Only what needs a GPU is absent:
the container runs the host's kernel, so the module is never loaded, and the daemons meet
a node without a driver as a real one would before its module loads.

One row per check; the real side of tests/booted/real_nvidia.py's comparisons is
recorded in the same container.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import real_nvidia
from images import Image, base_image, run
from real_packages import NODE_PINNED, RELEASES, Release, fetch

HERE = Path(__file__).resolve().parent
FILES = HERE / "image" / "real"
VENV = "/opt/bootfsm"
# modinfo -F signer of every module in Canonical's linux-restricted-signatures packages
# (read from linux-modules-nvidia-580-server-open-6.8.0-1073-azure's nvidia.ko,
# 2026-12-07: sig_key E9:DF:13:0F:92:92:A9:B7, sig_hashalgo sha512)
CANONICAL_SIGNER = "Canonical Ltd. Kernel Module Signing"
# nvidia-smi 580.178.04 (and 550.67) without a driver, on stdout, then a blank line
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
DAEMONS = ("nvidia-persistenced", "nvidia-fabricmanager", "nvidia-imex")
BOOT_TIMEOUT = 180


def _text(out: Path, name: str) -> str:
    p = out / name
    return p.read_text(errors="replace").strip() if p.is_file() else ""


def _show(out: Path, unit: str) -> dict[str, str]:
    lines = _text(out, f"show-{unit}.txt").splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def build(img: Image, cache: Path, work: Path, wheels: Path, rel: Release) -> Path:
    """The node root: the dependencies' image, bootfsm and its unit, kubelet's unit, the
    report unit; the packages' .debs under work/debs (installed by real_node.sh)."""
    debs = fetch(cache, rel, NODE_PINNED)
    base, _built = base_image(img, cache, variant="nvidia")
    node = work / "node"
    shutil.rmtree(node, ignore_errors=True)
    run(["cp", "-a", "--reflink=auto", str(base), str(node)])
    for sub in ("user", "module"):
        (work / "debs" / sub).mkdir(parents=True, exist_ok=True)
    for deb in debs:
        sub = "module" if deb.package == rel.module_package else "user"
        shutil.copy(deb.path, work / "debs" / sub / f"{deb.package}.deb")
    (work / "debs" / "list.txt").write_text(
        "".join(f"{d.package} {d.sha256} {d.vouched}\n" for d in debs)
    )
    wh = "/opt/wheels"
    (node / wh.lstrip("/")).mkdir()
    script = (
        f"set -e; python3 -m venv {VENV}; "
        f"{VENV}/bin/pip install -q --no-index --find-links {wh} bootfsm"
    )
    p = subprocess.run(
        ["systemd-nspawn", "-q", "-D", str(node), "--register=no", "--keep-unit",
         "--private-network", "--pipe", f"--bind-ro={wheels}:{wh}", "/bin/sh", "-c", script],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"installing bootfsm into the node: {p.stderr[-1500:]}")
    host_bootfsm = Path(sys.executable).parent / "bootfsm"
    run([str(host_bootfsm), "install-unit", "--root", str(node), "--exec", f"{VENV}/bin/bootfsm"])
    units = node / "etc/systemd/system"
    shutil.copy(HERE / "image/units/kubelet.service", units / "kubelet.service")
    kubelet = node / "opt/bin/kubelet"  # the lane's stand-in (serves /healthz), where
    kubelet.parent.mkdir(parents=True, exist_ok=True)  # configureKubeletAndKubectl puts it
    shutil.copy(HERE / "image/kubelet", kubelet)
    kubelet.chmod(0o755)
    shutil.copy(FILES / "real-report.service", units / "real-report.service")
    # bootfsm's run is the rest of the lane's business (a simulated GPU): here its unit is
    # loaded, verified and shown beside the packaged daemons, and not started
    run(["systemctl", f"--root={node}", "disable", "bootfsm.service"])
    run(["systemctl", f"--root={node}", "enable", "real-report.service"])
    for name in ("real_node.sh", "real_report.sh"):
        shutil.copy(FILES / name, work / name)
    return node


def _container(node: Path, work: Path, *argv: str, boot: bool) -> subprocess.CompletedProcess[str]:
    cmd = [
        "timeout", "--kill-after=15", str(BOOT_TIMEOUT), "systemd-nspawn", "-q", "-D",
        str(node), "--register=no", "--keep-unit", "--private-network",
        f"--bind={work}:/booted",
        *(["--boot", "--console=passive"] if boot else ["--pipe", *argv]),
    ]  # fmt: skip
    env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
    return subprocess.run(
        cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
        timeout=BOOT_TIMEOUT + 60, check=False, env=env,
    )  # fmt: skip


# -- checks: each returns (ok, what it found) --------------------------------------------


def check_dpkg(out: Path, rel: Release) -> tuple[bool, str]:
    problems = []
    if _text(out, "dpkg-user.rc") != "0":
        problems.append(f"dpkg -i (user-space, daemons) exited {_text(out, 'dpkg-user.rc')}:"
                        f" {_text(out, 'dpkg-user.err')[-400:]!r}")  # fmt: skip
    # the one dependency a container cannot meet: the kernel image the module is for
    err = _text(out, "dpkg-module.err")
    unmet = sorted({ln.split(" depends on ", 1)[1].split(";")[0] for ln in err.splitlines()
                    if " depends on " in ln})  # fmt: skip
    want = [f"linux-image-{rel.kernel} | linux-image-unsigned-{rel.kernel}"]
    if _text(out, "dpkg-module.rc") != "1" or unmet != want:
        problems.append(f"dpkg -i of {rel.module_package}: exit {_text(out, 'dpkg-module.rc')},"
                        f" unmet {unmet}, expected exit 1 and only {want}")  # fmt: skip
    if _text(out, "dpkg-module-forced.rc") != "0" or _text(out, "dpkg-audit.out"):
        problems.append(f"dpkg --configure: {_text(out, 'dpkg-module-forced.err')[-300:]!r},"
                        f" audit {_text(out, 'dpkg-audit.out')[-300:]!r}")  # fmt: skip
    status = {ln.split()[0]: ln.split()[1:] for ln in _text(out, "dpkg-l.txt").splitlines()}
    wanted = (*NODE_PINNED, rel.module_package, f"nvidia-firmware-580-server-{rel.driver}")
    for pkg in wanted:
        if status.get(pkg, ["", ""])[1:] != ["ii"]:
            problems.append(f"{pkg}: dpkg status {status.get(pkg)}")
    user_version = f"{rel.driver}-{rel.deb_suffix}"
    for pkg in NODE_PINNED:  # this release's builds, not another's
        if status.get(pkg, [""])[0] != user_version:
            problems.append(f"{pkg} {status.get(pkg, [''])[0]}, expected {user_version}")
    user = _text(out, "user-persistenced.txt")
    if not user.startswith("nvidia-persistenced:"):
        problems.append(f"nvidia-compute-utils' preinst made no nvidia-persistenced user: {user!r}")
    if problems:
        return False, "; ".join(problems)
    return True, (
        f"{len(wanted)} packages ii (user-space {status[NODE_PINNED[1]][0]}, module"
        f" {status[rel.module_package][0]}); the module's only unmet dependency {want[0]}"
        f" (dpkg exit 1, configured with it forced); maintainer scripts made the"
        f" nvidia-persistenced user"
    )


def check_signer(out: Path, rel: Release, signer: str = CANONICAL_SIGNER) -> tuple[bool, str]:
    ko = _text(out, "ko-path.txt")
    got = {f: _text(out, f"modinfo-{f}.out") for f in ("signer", "sig_key", "sig_hashalgo",
                                                       "version", "vermagic")}  # fmt: skip
    problems = []
    if ko != f"/lib/modules/{rel.kernel}/kernel/nvidia-580srv-open/nvidia.ko":
        problems.append(f"the package installed {ko!r}")
    if got["signer"] != signer:
        problems.append(f"modinfo -F signer {got['signer']!r}, expected {signer!r}"
                        f" ({_text(out, 'modinfo-signer.err')!r})")  # fmt: skip
    if got["version"] != rel.driver:
        problems.append(f"version {got['version']!r}, expected {rel.driver}")
    if not got["vermagic"].startswith(f"{rel.kernel} SMP "):
        problems.append(f"vermagic {got['vermagic']!r}, not the {rel.kernel} kernel's")
    if problems:
        return False, "; ".join(problems)
    return True, (
        f"{ko} (plain .ko, not .zst): signer {got['signer']!r}, key {got['sig_key']},"
        f" {got['sig_hashalgo']}; version {got['version']}; vermagic {got['vermagic']!r}"
    )


def check_smi(out: Path, rel: Release) -> tuple[bool, str]:
    """The real binary names its version in --help's first line; without a driver every
    other command line, --version included, fails with the no-driver message."""
    first = _text(out, "smi-help-first.out").splitlines()[:1]
    runs = {
        case: real_nvidia.Run(
            _text(out, f"{case}.out"), _text(out, f"{case}.err"), int(_text(out, f"{case}.rc"))
        )
        for case in ("smi-version", "smi-plain")
    }
    problems = []
    if first != [f"NVIDIA System Management Interface -- v{rel.driver}"]:
        problems.append(f"nvidia-smi --help begins {first!r}, not version {rel.driver}'s line")
    for case, r in runs.items():
        if r.rc != 9 or not r.out.startswith(NO_DRIVER):
            problems.append(f"{case}: {r.show()}, expected exit 9 and {NO_DRIVER!r}")
    if problems:
        return False, "; ".join(problems)
    return True, (
        f"--help: {first[0]!r}; without a driver nvidia-smi and nvidia-smi --version:"
        f" {runs['smi-plain'].show()}"
    )


def check_verify(out: Path, rel: Release) -> tuple[bool, str]:
    rc, text = _text(out, "verify.rc"), (_text(out, "verify.out") + _text(out, "verify.err"))
    # systemd 249 also warns about the image's merged-/usr alias links: only a line about
    # one of these units counts
    ours = [ln for ln in text.splitlines() if re.search(r"nvidia-|bootfsm|kubelet", ln)]
    if rc != "0" or ours:
        return False, f"systemd-analyze verify exited {rc}: {(ours or [text[-800:]])!r}"
    others = len(text.splitlines())
    return True, (
        "systemd-analyze verify of the 3 packaged units, bootfsm's and kubelet's: exit 0, "
        + (f"nothing about them ({others} lines about other units)" if others else "silent")
    )


def _ordering(after: str) -> str:
    """The units a daemon orders after, less systemd's implicit ones."""
    implicit = ("sysinit.target", "basic.target", "system.slice", "systemd-journald.socket")
    return " ".join(sorted(u for u in after.split() if u not in implicit and ".mount" not in u))


def check_boot(out: Path, rel: Release) -> tuple[bool, str]:
    shows = {u: _show(out, u) for u in (*DAEMONS, "bootfsm", "kubelet")}
    problems, facts = [], []
    if not shows["kubelet"]:
        return False, "the boot left no report (see console.txt)"
    kl, bf = shows["kubelet"], shows["bootfsm"]
    for what, have, want in (
        ("kubelet After=", kl.get("After", "").split(), "bootfsm.service"),
        ("kubelet Requires=", kl.get("Requires", "").split(), "bootfsm.service"),
        ("bootfsm Before=", bf.get("Before", "").split(), "kubelet.service"),
    ):
        if want not in have:
            problems.append(f"{what} lacks {want}: {have}")
    for u in DAEMONS:
        s = shows[u]
        if s.get("LoadState") != "loaded":
            problems.append(f"{u}: LoadState {s.get('LoadState')}")
            continue
        facts.append(
            f"{u} {s.get('UnitFileState')} ({s.get('FragmentPath')}, Type={s.get('Type')},"
            f" After= {_ordering(s.get('After', ''))}), at boot {s.get('ActiveState')}/"
            f"{s.get('Result')}, condition {s.get('ConditionResult')}"
        )
    if "ordering cycle" in _text(out, "journal.txt"):
        problems.append("systemd found an ordering cycle (journal.txt)")
    if problems:
        return False, "; ".join(problems)
    sysver = _text(out, "systemd-version.txt").split("\n")[0]
    return (
        True,
        f"{sysver}: kubelet After=/Requires= bootfsm, bootfsm Before= kubelet; " + "; ".join(facts),
    )


CHECKS: tuple[tuple[str, Callable[[Path, Release], tuple[bool, str]]], ...] = (
    ("real packages: Canonical's .debs install with the image's dpkg", check_dpkg),
    ("real packages: nvidia.ko signed by Canonical (modinfo -F signer)", check_signer),
    ("real packages: nvidia-smi is the real 580 binary, no-driver exit", check_smi),
    ("real packages: the units verify (systemd-analyze verify)", check_verify),
    ("real packages: daemons, bootfsm and kubelet under the booted systemd", check_boot),
)


def lane(
    img: Image, cache: Path, work: Path, wheels: Path, boot_lock: threading.Lock
) -> list[tuple[str, bool, str, float]]:
    """Install, inspect, boot; one row per check and per real_nvidia comparison."""
    t0 = time.monotonic()
    rel = RELEASES[img.suite]
    out = work / "out"
    try:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        node = build(img, cache, work, wheels, rel)
        sims = real_nvidia.prepare(work)
        out.mkdir()
        p = _container(node, work, "/bin/sh", "/booted/real_node.sh", rel.kernel, boot=False)
        (work / "install-console.txt").write_text(p.stdout + p.stderr)
        with boot_lock:
            p = _container(node, work, boot=True)
        (work / "console.txt").write_text(p.stdout + p.stderr)
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}"[-2000:]
        took = time.monotonic() - t0
        names = [n for n, _ in CHECKS] + [f"real NVIDIA: {n}" for n, _ in real_nvidia.COMPARISONS]
        return [(n, False, detail, took) for n in names]
    rows = []
    for name, check in CHECKS:
        t1 = time.monotonic()
        try:
            ok, detail = check(out, rel)
        except Exception as exc:  # a broken check is a FAIL, never a skip
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        rows.append((name, ok, detail, time.monotonic() - t1))
    rows.extend(real_nvidia.rows(out, sims))
    return rows
