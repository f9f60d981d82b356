"""The booted lane (`make test-booted`): the shipped unit under a real systemd, on real
Debian and Ubuntu images built from their distributions' own packages, with their own
Pythons; and NVIDIA's real user-space from Ubuntu's archive compared with the simulator's
stand-ins.

For each image (tests/booted/images.py: Debian 12, systemd 252, Python 3.11; Debian 13,
257, 3.13; Ubuntu 22.04, 249, 3.10; Ubuntu 24.04, 255, 3.12):

1. a base image from mmdebstrap, the archive's signature checked, cached under the cache
   dir by a content key (suite, sources, package list, mmdebstrap options);
2. a working copy: bootfsm installed from this checkout's wheel into a venv made with the
   image's own python3 (dependencies from a wheelhouse that pip filled on the host,
   installed offline inside the image), the unit installed with
   ``bootfsm install-unit --root IMAGE``, the lane's units and helper added;
3. the test suite under the image's python3 in a non-booted container: its pure parts,
   or (Ubuntu 22.04) the whole suite from a copy of the checkout, as make test runs it;
4. one ``systemd-nspawn --boot`` per row of SCENARIOS; a report unit inside dumps what
   systemd and the node show into a bind-mounted directory and powers off; the host
   asserts on it;
5. (Ubuntu 24.04 and 22.04) Canonical's real NVIDIA packages installed with the image's
   dpkg, the signed module's signer read, the packaged daemons booted beside bootfsm's
   and kubelet's units (tests/booted/real_node.py), and NVIDIA's real binaries run
   beside the stand-ins (tests/booted/real_nvidia.py).

Prints one line per scenario, ``ok``/``FAIL`` first, naming the image's systemd and
Python; exits 1 on any FAIL or when a tool is missing (never skips). See docs/testing.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import real_node
import signed_install
import signed_mirror
import teardown_lane
from images import IMAGES, Image, base_image, log, run

from bootfsm.commands.unit import AFTER_HOOK_PATH, AFTER_HOOK_TEXT, HOOK_CHOICES
from bootfsm.core.compat import tomllib
from bootfsm.sim.world import DRIVER_VERSION

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
IMAGE_FILES = HERE / "image"
SKU = "h100-pcie"  # PCIe, no fabric manager (see docs/testing.md)
TEST_DEPS = ("pytest>=8,<10", "hypothesis>=6.100,<7", "pytest-httpserver>=1.1,<2")
# the pure parts of the suite: no host tools beyond what the image has
UNIT_TESTS = (
    "tests/parsers",
    "tests/test_codes.py",
    "tests/test_config.py",
    "tests/test_table.py",
    "tests/test_detect.py",
    "tests/test_hardware.py",
    "tests/test_notify.py",
)
# Tests of the whole suite that compare bootfsm or the simulator with this machine's own
# system tools, written against Debian 12's versions of them; Ubuntu 22.04 has others
# (docs/testing.md says what differs). They run in make test, against Debian 12's tools.
OTHER_TOOLS = (
    # dpkg 1.21.1 points its lock message at the FAQ's #db-lock anchor
    "tests/sim/test_sim_standins.py::test_dpkg_database_lock_refuses_like_the_real_dpkg",
    # Ubuntu's /sbin/ldconfig is a wrapper script that runs ldconfig.real
    "tests/sim/test_sim_standins.py::test_bogus_invocation_fails_like_the_real_tool[ldconfig",
    # containerd 2.2: configuration version 3 (io.containerd.cri.v1.*), its own wording and
    # usage text; these tests model containerd 1.x
    "tests/test_join_containerd.py::test_import_added_and_the_real_containerd_merges_the_runtime",
    "tests/test_join_containerd.py::test_a_runtime_only_dropin_loses_runc_in_the_real_merge",
    "tests/test_join_containerd.py::test_invalid_config_is_refused_by_both",
    "tests/sim/test_sim_containerd.py::test_dump_matches_the_real_containerd",
    "tests/sim/test_sim_containerd.py::test_not_toml_fails_like_the_real_containerd",
    "tests/sim/test_standin_grammar.py::test_containerd_undefined_flag_like_containerd",
    # systemd-analyze 249 has no --offline, and --root only for cat-config
    "tests/test_systemd_unit.py::test_exposure_score_of_the_shipped_unit",
    "tests/test_systemd_unit.py::test_install_into_image_root_enables_and_verifies",
    "tests/test_systemd_unit.py::test_packaged_unit_files_install_without_the_checkout",
    "tests/test_systemd_unit.py::test_after_hook_waits_for_the_hooks_first_run_and_goes_away",
)
BOOT_TIMEOUT = 240  # seconds per boot, all scenarios (the longest settles in ~40 s)
VENV = "/opt/bootfsm"
TEST_VENV = "/opt/booted-tests"
UNIT_TIMEOUT = 2400  # seconds for an image's unit tests (the whole suite on one image)
SUITE_VENV = "/opt/booted-suite"  # the whole suite: an editable install of /src
DROPINS = "/etc/systemd/system/bootfsm.service.d"
START = "ExecMainStartTimestampMonotonic"
# `systemctl show bootfsm` of the hardened unit, and the exposure it must not exceed
# (9.6 before the hardening; docs/systemd.md records what each systemd scores)
HARDENING = {
    "ProtectHome": "read-only",
    "PrivateTmp": "yes",
    "ProtectHostname": "yes",
    "LockPersonality": "yes",
    "RestrictRealtime": "yes",
    "PrivateDevices": "no",
    "ProtectKernelModules": "no",
    "ProtectSystem": "no",
    "RestrictSUIDSGID": "no",
    "ProtectClock": "no",
}
MAX_EXPOSURE = 8.0


def cache_dir() -> Path:
    """$BOOTED_CACHE, else /var/cache/bootfsm-booted as root, else $XDG_CACHE_HOME."""
    if os.environ.get("BOOTED_CACHE"):
        return Path(os.environ["BOOTED_CACHE"])
    if os.geteuid() == 0:
        return Path("/var/cache/bootfsm-booted")
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "bootfsm-booted"


def preflight() -> list[str]:
    problems = []
    for tool in ("mmdebstrap", "systemd-nspawn", "systemctl", "dpkg-deb"):
        if not shutil.which(tool):
            problems.append(
                f"{tool} is missing (make test-booted installs mmdebstrap systemd-container)"
            )
    if os.geteuid() != 0:
        problems.append(
            "systemd-nspawn --boot needs root (run make test-booted as root or via sudo)"
        )
    return problems


# -- images ---------------------------------------------------------------------------
def image_python(base: Path) -> str:
    """X.Y of the image's python3 (its /usr/bin/python3 link names it)."""
    target = os.readlink(base / "usr/bin/python3")
    m = re.fullmatch(r"python(\d+\.\d+)", target)
    if not m:
        raise RuntimeError(f"cannot tell the image's python3 version from {target!r}")
    return m[1]


# `pip download --python-version X.Y` evaluates python_full_version markers with the
# host's interpreter (3.11.2 here): what a dependency needs only before 3.11 by that marker
# (hypothesis's exceptiongroup) is named for the image's Python
FULL_VERSION_MARKED = {"3.10": ("exceptiongroup>=1.0.0",)}


def _build_requires() -> list[str]:
    return list(tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"])


def _requirements(full: bool, pyver: str) -> list[str]:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    build = meta["build-system"]["requires"] if full else []
    dev = meta["project"]["optional-dependencies"]["dev"] if full else []
    extra = FULL_VERSION_MARKED.get(pyver, ())
    return [*meta["project"]["dependencies"], *TEST_DEPS, *dev, *build, *extra]


def wheelhouse(cache: Path, pyver: str, wheel_dir: Path, *, full: bool) -> Path:
    """Dependency wheels for the image's Python, downloaded by pip on the host (cached):
    bootfsm's, the tests', and for the whole suite the dev extra and the build backend."""
    reqs = _requirements(full, pyver)
    key = hashlib.sha256(json.dumps([pyver, reqs]).encode()).hexdigest()[:16]
    path = cache / f"wheelhouse-py{pyver}-{key}"
    if not (path / ".complete").is_file():
        log(f"wheelhouse for Python {pyver}: pip download")
        shutil.rmtree(path, ignore_errors=True)
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--only-binary=:all:",
                f"--python-version={pyver}",
                "-d",
                str(path),
                *reqs,
            ]
        )
        (path / ".complete").write_text("\n".join(reqs) + "\n")
    out = wheel_dir / f"py{pyver}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(path, out)
    for whl in wheel_dir.glob("bootfsm-*.whl"):
        shutil.copy(whl, out)
    return out


def nspawn(image: Path, *argv: str, binds: tuple[str, ...] = (), timeout: float = 600) -> str:
    """Run one command in a non-booted container of `image`."""
    cmd = [
        "systemd-nspawn",
        "-q",
        "-D",
        str(image),
        "--register=no",
        "--keep-unit",
        "--private-network",
        "--pipe",
        *[f"--bind{b}" for b in binds],
        *argv,
    ]
    return run(cmd, timeout=timeout).stdout


def checkout_files() -> list[str]:
    """The checkout as git sees it: tracked files and untracked ones it does not ignore."""
    out = run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"]).stdout
    return sorted({f for f in out.split("\0") if f and (REPO / f).is_file()})


def prepare(img: Image, base: Path, work: Path, wheels: Path) -> Path:
    """A working copy of the base with bootfsm installed the way docs/systemd.md says."""
    prepared = work / "prepared"
    shutil.rmtree(prepared, ignore_errors=True)
    run(["cp", "-a", "--reflink=auto", str(base), str(prepared)])
    opt = prepared / "opt/booted"
    opt.mkdir(parents=True)
    shutil.copy(IMAGE_FILES / "booted_node.py", opt / "booted_node.py")
    shutil.copy(REPO / "tests/cse_caller.sh", opt / "cse_caller.sh")  # booted-cse.service
    (prepared / "booted").mkdir()
    # the simulator is never in the wheel (it is test tooling): this test image gets it
    # beside the installed package, from the checkout
    shutil.copytree(REPO / "bootfsm/sim", opt / "sim", ignore=shutil.ignore_patterns("__pycache__"))
    wh = "/opt/booted/wheels"
    binds = (f"-ro={wheels}:{wh}",)
    pkg = "import bootfsm, os; print(os.path.dirname(bootfsm.__file__))"
    script = (
        f"set -e; python3 -m venv {VENV}; "
        f"{VENV}/bin/pip install -q --no-index --find-links {wh} bootfsm; "
        f'cp -r /opt/booted/sim "$({VENV}/bin/python -c "{pkg}")/sim"; '
    )
    if img.tests == "full":
        # the whole suite runs from a copy of the checkout, installed editable as make
        # test installs it (the simulator and states/ come with it)
        src = prepared / "src"
        for rel in checkout_files():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
        # a repository of its own, so the tests that ask git what is tracked get the
        # same answer as in the checkout
        git = "git -C /src -c user.name=booted -c user.email=booted@localhost"
        script += (
            f"{git} init -q; {git} add -A; {git} commit -qm checkout; "
            f"python3 -m venv {SUITE_VENV}; "
            # the build backend pyproject.toml names (jammy's venv seeds setuptools 59,
            # which does not read [tool.setuptools]); a test builds with it
            f"{SUITE_VENV}/bin/pip install -q --no-index --find-links {wh}"
            f" {' '.join(repr(r) for r in _build_requires())} -e '/src[dev]'; "
        )
    else:
        script += (
            f"python3 -m venv {TEST_VENV}; "
            f"{TEST_VENV}/bin/pip install -q --no-index --find-links {wh} bootfsm "
            + " ".join(f"'{r}'" for r in TEST_DEPS)
            + f'; cp -r /opt/booted/sim "$({TEST_VENV}/bin/python -c "{pkg}")/sim"; '
        )
    script += f"{VENV}/bin/python /opt/booted/booted_node.py prepare {SKU}"
    (prepared / "opt/booted/wheels").mkdir()
    nspawn(prepared, "/bin/sh", "-c", script, binds=binds, timeout=900)
    # the unit, the way an image builder installs it: from the host, into the root
    host_bootfsm = Path(sys.executable).parent / "bootfsm"
    out = run(
        [
            str(host_bootfsm),
            "install-unit",
            "--root",
            str(prepared),
            "--exec",
            f"{VENV}/bin/bootfsm",
        ]
    )
    (work / "install-unit.txt").write_text(out.stdout + out.stderr)
    units = prepared / "etc/systemd/system"
    for unit in (IMAGE_FILES / "units").glob("*.service"):
        shutil.copy(unit, units / unit.name)
    dropins = units / "bootfsm.service.d"
    dropins.mkdir(exist_ok=True)
    shutil.copy(IMAGE_FILES / "units/50-booted.conf", dropins / "50-booted.conf")
    # a node's /etc/hosts (minbase has none: `localhost` would not resolve)
    (prepared / "etc/hosts").write_text(
        "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
    )
    kubelet = prepared / "opt/bin/kubelet"  # where configureKubeletAndKubectl puts it
    kubelet.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(IMAGE_FILES / "kubelet", kubelet)
    kubelet.chmod(0o755)
    (prepared / "etc/default/kubelet").write_text(
        'KUBELET_NODE_LABELS="bootfsm-booted=true"\nKUBELET_FLAGS=\n'
    )
    names = [u.name for u in (IMAGE_FILES / "units").glob("*.service")]
    run(["systemctl", f"--root={prepared}", "enable", *names])
    return prepared


def _samples_binds() -> tuple[list[str], list[str]]:
    samples = REPO.parent / "shared/reference/samples"
    if os.environ.get("BOOTFSM_SAMPLES"):
        samples = Path(os.environ["BOOTFSM_SAMPLES"])
    if not samples.is_dir():
        return [], []
    return [f"--bind-ro={samples}:/samples"], ["--setenv=BOOTFSM_SAMPLES=/samples"]


def unit_tests(img: Image, prepared: Path, wheels: Path) -> tuple[bool, str]:
    """The suite under the image's own python3, in a non-booted container.

    "pure": the parts of the suite with no host tools, on the bootfsm installed from the
    wheel (the simulator copied beside it): the read-only checkout at /src gives the
    tests only. Nothing may import the checkout's bootfsm/, which has no ``states`` (the
    wheel maps states/ to bootfsm.states): the tests run from /tmp, so a ``python -m
    bootfsm`` they start does not find /src first, and pytest's own process imports
    bootfsm before pytest puts /src (the tests' package root) on sys.path.

    "full": the whole suite, as make test runs it (two workers), in the copy of the
    checkout at /src installed editable, with the image's own tools (dpkg, gpgv,
    makeself, containerd, systemd-analyze, zsh, groff...); the container's writes go to
    an overlay.
    """
    binds, env = _samples_binds()
    common = [
        "systemd-nspawn",
        "-q",
        "-D",
        str(prepared),
        "--register=no",
        "--keep-unit",
        "--private-network",
        "--pipe",
        "--volatile=overlay",
        # a stub init as PID 1 reaps orphans, as on a node (a test's killpg must find its
        # group gone, not kept by zombies)
        "--as-pid2",
        *env,
        *binds,
    ]
    if img.tests == "full":
        cmd = [
            *common,
            "--chdir=/src",
            # the tests that build bootfsm's wheel get the build backend offline
            f"--bind-ro={wheels}:/opt/booted/wheels",
            "--setenv=PIP_NO_INDEX=1",
            "--setenv=PIP_FIND_LINKS=/opt/booted/wheels",
            f"{SUITE_VENV}/bin/python",
            "-c",
            "import platform, sys; print('python', platform.python_version(), flush=True);"
            "import pytest; sys.exit(pytest.main(['-p', 'no:cacheprovider', '-n', '2',"
            " '--dist', 'loadfile', *sys.argv[1:]]))",
            *[f"--deselect={t}" for t in OTHER_TOOLS],
        ]
    else:
        cmd = [
            *common,
            "--chdir=/tmp",
            f"--bind-ro={REPO}:/src",
            f"{TEST_VENV}/bin/python",
            "-c",
            "import sys, platform; print('python', platform.python_version());"
            "sys.path[:] = [p for p in sys.path if p];"  # -c's '' (the working directory)
            "import bootfsm.states, bootfsm.sim; print('bootfsm', bootfsm.__file__);"
            "import pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-p', "
            "'no:xdist', '-o', 'addopts=', *sys.argv[1:]]))",
            *[f"/src/{t}" for t in UNIT_TESTS],
        ]
    # the whole suite takes both cores: never beside a boot, whose timings it would skew
    with BOOT_LOCK if img.tests == "full" else contextlib.nullcontext():
        try:
            p = subprocess.run(
                cmd, text=True, capture_output=True, timeout=UNIT_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired as exc:  # its output arrives as bytes, or None
            got = [
                o.decode(errors="replace") if isinstance(o, bytes) else o or ""
                for o in (exc.stdout, exc.stderr)
            ]
            return False, f"{''.join(got)}\nno pytest summary: killed after {UNIT_TIMEOUT} s"
    out = p.stdout + p.stderr
    return p.returncode == 0, out


# -- boots ----------------------------------------------------------------------------
def parse_show(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@dataclass
class Boot:
    out: Path
    console: str
    elapsed: float
    rc: int

    def show(self, unit: str) -> dict[str, str]:
        return parse_show(self.text(f"show-{unit}.txt"))

    def text(self, name: str) -> str:
        p = self.out / name
        return p.read_text(errors="replace") if p.is_file() else ""

    def journal(self) -> str:
        return self.text("journal.txt")


# One booted container at a time. With --keep-unit and no machined every container stays
# in the caller's cgroup, so two booted systemds would share one cgroup tree and remove
# each other's /system.slice/<unit> cgroups: seen as systemd 257 "Failed to spawn
# executor: No such file or directory" on bootfsm's restart while the other image booted.
# Image builds, installs and unit-test runs (no systemd inside) still overlap.
BOOT_LOCK = threading.Lock()


def boot(
    image: Path,
    rundir: Path,
    scenario: dict[str, object],
    *,
    volatile: bool,
    files: dict[str, str] | None = None,
    ro_binds: dict[str, str] | None = None,
) -> Boot:
    """One boot of `image`; /booted in the container is `rundir` (scenario in, report out)."""
    shutil.rmtree(rundir, ignore_errors=True)
    (rundir / "out").mkdir(parents=True)
    (rundir / "scenario.json").write_text(json.dumps(scenario, indent=2) + "\n")
    for name, text in (files or {}).items():
        (rundir / name).write_text(text)
    binds = [f"--bind={rundir}:/booted"]
    for node_path, text in (ro_binds or {}).items():
        src = rundir / ("bind-" + node_path.strip("/").replace("/", "_"))
        src.write_text(text)
        binds.append(f"--bind-ro={src}:{node_path}")
    cmd = [
        "timeout",
        "--kill-after=15",
        str(BOOT_TIMEOUT),
        "systemd-nspawn",
        "--boot",
        "-D",
        str(image),
        "--register=no",
        "--keep-unit",
        "--private-network",
        "--console=passive",
        *(["--volatile=overlay"] if volatile else []),
        *binds,
    ]
    # the unified cgroup hierarchy inside, as real nodes have, even on a hybrid host
    env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
    with BOOT_LOCK:
        started = time.monotonic()
        p = subprocess.run(
            cmd,
            text=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            check=False,
            timeout=BOOT_TIMEOUT + 60,
            env=env,
        )
    console = p.stdout + p.stderr
    (rundir / "console.txt").write_text(console)
    return Boot(rundir / "out", console, time.monotonic() - started, p.returncode)


def mono(props: dict[str, str], key: str) -> float:
    return int(props.get(key, "0") or "0") / 1e6


@dataclass
class Result:
    image: str
    systemd: str
    python: str
    name: str
    ok: bool
    detail: str
    seconds: float

    def line(self) -> str:
        verdict = "ok  " if self.ok else "FAIL"
        return (
            f"{verdict} systemd {self.systemd} ({self.image}, python {self.python}) "
            f"{self.name}: {self.detail} [{self.seconds:.0f} s]"
        )


@dataclass
class Checks:
    problems: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)

    def eq(self, what: str, got: object, want: object) -> None:
        if got != want:
            self.problems.append(f"{what}={got!r} (want {want!r})")

    def true(self, what: str, cond: bool) -> None:
        if not cond:
            self.problems.append(what)


def base_checks(c: Checks, b: Boot, systemd: str) -> None:
    c.true(
        f"no report (boot rc {b.rc}; see {b.out.parent}/console.txt)",
        (b.out / "settled.txt").is_file(),
    )
    c.true("systemd never settled", "settled=True" in b.text("settled.txt"))
    version = b.text("systemd-version.txt").split()[1:2]
    c.eq("systemd", version[0] if version else "", systemd)


def kubelet_after_bootfsm(c: Checks, bf: dict[str, str], kl: dict[str, str]) -> None:
    c.eq("kubelet ActiveState", kl.get("ActiveState"), "active")
    c.eq("kubelet SubState", kl.get("SubState"), "running")
    start, done = (
        mono(kl, "ExecMainStartTimestampMonotonic"),
        mono(bf, "ExecMainExitTimestampMonotonic"),
    )
    c.true(f"kubelet started at {start:.3f} before bootfsm exited at {done:.3f}", start >= done > 0)


def shared_unit_answers(c: Checks, b: Boot) -> None:
    """Every `systemctl show` bootfsm ran names all five daemons and the real systemctl's
    output split into one block per unit: a block count that does not match makes
    bootfsm ask one unit (the fallback), which must never happen here."""
    shows = [
        cmd["argv"]
        for cmd in json.loads(b.text("trace.json"))["commands"]
        if cmd["argv"][:2] == ["systemctl", "show"]
    ]
    units = [sum(a.endswith(".service") for a in argv) for argv in shows]
    ok = bool(shows) and set(units) == {5}
    c.true(f"systemctl show asked of {units} units (want 5 each)", ok)
    c.facts.append(f"{len(shows)} systemctl show of 5 units")


def check_success(b: Boot, systemd: str) -> Checks:
    c = Checks()
    base_checks(c, b, systemd)
    shared_unit_answers(c, b)
    bf, kl = b.show("bootfsm"), b.show("kubelet")
    c.eq("ActiveState", bf.get("ActiveState"), "active")
    c.eq("SubState", bf.get("SubState"), "exited")
    c.eq("ExecMainStatus", bf.get("ExecMainStatus"), "0")
    c.eq("NRestarts", bf.get("NRestarts"), "0")
    c.true(
        f"StatusText {bf.get('StatusText')!r} is not the summary",
        bf.get("StatusText", "").startswith("OK code=0 OK state=done: node provisioned"),
    )
    kubelet_after_bootfsm(c, bf, kl)
    c.true(
        "real dpkg did not install nvidia-container-toolkit",
        "ii |nvidia-container-toolkit|1.19.0-1" in b.text("dpkg-l.txt").replace("ii  |", "ii |"),
    )
    c.eq("containerd ActiveState", b.show("containerd").get("ActiveState"), "active")
    # the shipped hardening is in effect on this systemd (systemd/bootfsm.service)
    for key, want in HARDENING.items():
        c.eq(key, bf.get(key), want)
    score = re.search(
        r"Overall exposure level for bootfsm\.service: ([0-9.]+) (\S+)", b.text("security.txt")
    )
    c.true("systemd-analyze security printed no score", score is not None)
    if score:
        c.true(f"exposure {score[1]} above {MAX_EXPOSURE}", float(score[1]) <= MAX_EXPOSURE)
        c.facts.append(f"systemd-analyze security {score[1]} {score[2]}")
    c.facts.append(
        f"provisioned in {mono(bf, 'ExecMainExitTimestampMonotonic') - mono(bf, START):.1f} s"
    )
    return c


def check_permanent(b: Boot, systemd: str) -> Checks:
    c = Checks()
    base_checks(c, b, systemd)
    bf, kl = b.show("bootfsm"), b.show("kubelet")
    c.eq("ActiveState", bf.get("ActiveState"), "failed")
    c.eq("Result", bf.get("Result"), "exit-code")
    c.eq("ExecMainStatus", bf.get("ExecMainStatus"), "31")
    c.eq("NRestarts (RestartPreventExitStatus)", bf.get("NRestarts"), "0")
    status = b.text("status-bootfsm.txt")
    c.true("systemctl status lacks 'status=31'", "status=31" in status)
    c.true(
        "systemctl status lacks the FAILED code=31 summary",
        "FAILED code=31 CHECKSUM_MISMATCH" in status,
    )
    c.eq("kubelet ActiveState", kl.get("ActiveState"), "inactive")
    c.true(
        "journal lacks 'Dependency failed for kubelet.service'",
        re.search(r"Dependency failed for (kubelet\.service|Kubelet)", b.journal()) is not None,
    )
    journald_checks(c, b)
    return c


def journald_checks(c: Checks, b: Boot) -> None:
    """bootfsm's failure reaches the real journald as structured entries: at warning or
    worse for `journalctl -u bootfsm -p warning`, and findable by CODE_NAME."""
    warning = b.text("journal-warning.txt")
    c.true(
        "`journalctl -u bootfsm -p warning` lacks bootfsm's state.failed",
        re.search(r"^state\.failed .*code_name=CHECKSUM_MISMATCH", warning, re.M) is not None,
    )
    c.true("`journalctl -p warning` shows info lines", "state.enter" not in warning)
    entries = [json.loads(line) for line in b.text("journal-code.txt").splitlines() if line]
    failed = [e for e in entries if e.get("BOOTFSM_EVENT") == "state.failed"]
    c.eq("CODE_NAME=CHECKSUM_MISMATCH state.failed entries", len(failed), 1)
    if failed:
        e = failed[0]
        c.eq("its PRIORITY", e.get("PRIORITY"), "3")
        c.eq("its CODE", e.get("CODE"), "31")
        c.eq("its STATE", e.get("STATE"), "fetch")
        c.eq("its _SYSTEMD_UNIT", e.get("_SYSTEMD_UNIT"), "bootfsm.service")
        c.eq("its SYSLOG_IDENTIFIER", e.get("SYSLOG_IDENTIFIER"), "bootfsm")
        c.true("its RUN_ID", len(str(e.get("RUN_ID", ""))) == 8)


def check_restarted(b: Boot, systemd: str, exit_pattern: str) -> Checks:
    c = Checks()
    base_checks(c, b, systemd)
    bf, kl = b.show("bootfsm"), b.show("kubelet")
    c.eq("ActiveState", bf.get("ActiveState"), "active")
    c.eq("SubState", bf.get("SubState"), "exited")
    c.eq("ExecMainStatus", bf.get("ExecMainStatus"), "0")
    c.true(f"NRestarts={bf.get('NRestarts')} (want >= 1)", int(bf.get("NRestarts", "0") or 0) >= 1)
    c.true(
        f"journal lacks the first run's end ({exit_pattern})",
        re.search(r"bootfsm\.service: Main process exited, " + exit_pattern, b.journal())
        is not None,
    )
    kubelet_after_bootfsm(c, bf, kl)
    dep = (
        "kubelet's first start job failed (Dependency failed)"
        if "Dependency failed for" in b.journal()
        else "kubelet's start job waited"
    )
    c.facts.append(f"NRestarts={bf.get('NRestarts')}; {dep}")
    return c


def check_reboot(b: Boot, systemd: str, first: Boot) -> Checks:
    c = Checks()
    base_checks(c, b, systemd)
    shared_unit_answers(c, b)
    bf, kl = b.show("bootfsm"), b.show("kubelet")
    c.eq("ActiveState", bf.get("ActiveState"), "active")
    c.eq("ExecMainStatus", bf.get("ExecMainStatus"), "0")
    kubelet_after_bootfsm(c, bf, kl)
    took = mono(kl, "ActiveEnterTimestampMonotonic") - mono(bf, "InactiveExitTimestampMonotonic")
    c.true(f"kubelet up {took:.1f} s after bootfsm started (want < 15)", 0 < took < 15)
    c.facts.append(f"kubelet up {took:.1f} s after bootfsm started")
    calls_before = first.text("calls.jsonl").count("\n")
    new_calls = b.text("calls.jsonl").splitlines()[calls_before:]
    installs = [x for x in new_calls if '"nvidia-installer"' in x or '"update-initramfs"' in x]
    c.true(f"the second boot ran {installs[:2]}", not installs)
    c.eq("dpkg.log on the second boot (unchanged)", b.text("dpkg.log"), first.text("dpkg.log"))
    bootfsm_lines = [ln for ln in b.journal().splitlines() if " bootfsm[" in ln]
    # detect always runs (it reads the node's facts); fetch and verify have nothing to do.
    # /dev is new at every boot, so the driver state redoes only its per-boot init
    # (nvidia-modprobe, ldconfig, nvidia-smi) and join regenerates the CDI spec for this
    # boot's device nodes: nothing is downloaded, built or installed (checked above).
    for state in ("fetch", "verify"):
        c.true(
            f"journal: state {state} not skipped",
            any("state.skip" in ln and f"state={state} " in ln for ln in bootfsm_lines),
        )
    c.true(
        "the second boot did not redo the per-boot init (no nvidia-modprobe)",
        any('"nvidia-modprobe"' in x for x in new_calls),
    )
    c.true(
        "journal: the second boot installed a driver",
        not any("driver.install" in ln for ln in bootfsm_lines),
    )
    c.true(
        "journal: a state other than detect, driver and join ran",
        not any(
            "state.enter" in ln and not re.search(r"state=(detect|driver|join) ", ln)
            for ln in bootfsm_lines
        ),
    )
    return c


def check_deadline(b: Boot, systemd: str, deadline: float, timeout_start: float) -> Checks:
    c = Checks()
    base_checks(c, b, systemd)
    bf = b.show("bootfsm")
    c.eq("ActiveState", bf.get("ActiveState"), "failed")
    c.eq("Result (not 'timeout')", bf.get("Result"), "exit-code")
    c.eq("ExecMainStatus", bf.get("ExecMainStatus"), "100")
    c.eq("NRestarts", bf.get("NRestarts"), "0")
    ran = mono(bf, "ExecMainExitTimestampMonotonic") - mono(bf, "ExecMainStartTimestampMonotonic")
    c.true(
        f"ran {ran:.1f} s: not between the deadline {deadline:g} s"
        f" and TimeoutStartSec {timeout_start:g} s",
        deadline <= ran < timeout_start,
    )
    c.true("journal shows a start timeout", "timed out" not in b.journal().replace("deadline", ""))
    c.facts.append(
        f"exited {ran - deadline:.1f} s after its {deadline:g} s deadline"
        f" (TimeoutStartSec {timeout_start:g})"
    )
    return c


def check_cse_hook(b: Boot, systemd: str) -> Checks:
    """The hook in CSE's order on a fresh VHD whose unit waits for the hook's first run:
    the unit is skipped at boot (its condition, as the real systemd judges it), the hook
    provisions without touching kubelet, ensureKubelet's start of kubelet runs the unit
    (now met) first, and kubelet comes up after it."""
    c = Checks()
    base_checks(c, b, systemd)
    cse = b.text("cse.txt")
    c.true(f"CSE did not end 0: {cse[-300:]!r}", "rc=0" in cse.splitlines()[-1:])
    c.true("CSE never started kubelet", "caller: kubelet started" in cse)
    c.true(
        "the hook's line is not OK/provisioned",
        re.search(r"^bootfsm: OK code=0 OK state=done: node provisioned in ", cse, re.M)
        is not None,
    )
    c.true(
        "the unit was not skipped at boot for the hook's drop-in",
        re.search(  # systemd 252+ names the condition; 249 only says it was skipped
            r"bootfsm\.service.*ConditionPathExists="
            + re.escape(HOOK_CHOICES)
            + r"|Condition check resulted in bootfsm: provision the GPU node.* being skipped",
            b.journal(),
        )
        is not None,
    )
    bf, kl = b.show("bootfsm"), b.show("kubelet")
    c.eq("ActiveState", bf.get("ActiveState"), "active")
    c.eq("ExecMainStatus", bf.get("ExecMainStatus"), "0")
    kubelet_after_bootfsm(c, bf, kl)
    hook = [json.loads(line) for line in b.text("azure-run-0.jsonl").splitlines()]
    c.true(
        "the first journal in /var/log/azure/bootfsm is not the hook's",
        bool(hook) and hook[0].get("hook") is True,
    )
    touched = [
        e["argv"]
        for e in hook
        if e.get("event") == "command"
        and "kubelet" in " ".join(e["argv"])
        and e["argv"][1:2] not in (["show"], ["is-active"])
    ]
    c.eq("kubelet commands of the hook", touched, [])
    c.facts.append(
        f"hook run then unit run; kubelet at {mono(kl, 'ExecMainStartTimestampMonotonic'):.1f} s"
    )
    return c


def check_cpu_node(b: Boot, systemd: str) -> Checks:
    """A CPU VM size booting the shared image: the unit ends 0, nothing installed,
    kubelet (Requires=bootfsm.service) starts."""
    c = Checks()
    base_checks(c, b, systemd)
    bf, kl = b.show("bootfsm"), b.show("kubelet")
    c.eq("ActiveState", bf.get("ActiveState"), "active")
    c.eq("ExecMainStatus", bf.get("ExecMainStatus"), "0")
    want = (
        "OK code=0 OK state=done: nothing to provision: VM size standard_d4s_v5 has no NVIDIA GPU"
    )
    c.true(f"StatusText {bf.get('StatusText')!r}", bf.get("StatusText", "").startswith(want))
    kubelet_after_bootfsm(c, bf, kl)
    c.true("the toolkit was installed", "nvidia-container-toolkit" not in b.text("dpkg-l.txt"))
    return c


def check_gpus_off_the_bus(b: Boot, systemd: str) -> Checks:
    """A GPU VM size whose GPUs are missing from PCI: 22, never restarted, kubelet down."""
    c = Checks()
    base_checks(c, b, systemd)
    bf, kl = b.show("bootfsm"), b.show("kubelet")
    c.eq("ActiveState", bf.get("ActiveState"), "failed")
    c.eq("ExecMainStatus", bf.get("ExecMainStatus"), "22")
    c.eq("NRestarts (RestartPreventExitStatus)", bf.get("NRestarts"), "0")
    c.eq("kubelet ActiveState", kl.get("ActiveState"), "inactive")
    return c


def cse_env(mig: str = "") -> str:
    """What cse_cmd.sh and cse_helpers.sh export for this SKU's VM size (AgentBaker):
    MIG_NODE is true exactly when the pool has a GPU instance profile."""
    return (
        f"GPU_NODE=true\nGPU_DRIVER_VERSION={DRIVER_VERSION}\nGPU_DRIVER_TYPE=cuda-lts\n"
        f"GPU_NEEDS_FABRIC_MANAGER=false\nMIG_NODE={'true' if mig else 'false'}\n"
        f"GPU_INSTANCE_PROFILE={mig}\nCONFIG_GPU_DRIVER_IF_NEEDED=true\n"
        "KUBELET_CACHE=/opt/kube/kubelet\n"
    )


def check_mig_pending(b: Boot, systemd: str) -> Checks:
    """The first boot of a MIG pool's VM from an AKS image (install-unit --after-hook, a
    fresh VHD) whose GPU stays MIG-pending (a client holds it): CSE succeeds and asks for
    its reboot; bootfsm.service, which kubelet's Requires= starts after the hook, waits
    for the same reboot (0) and kubelet runs until it."""
    c = Checks()
    base_checks(c, b, systemd)
    bf = b.show("bootfsm")
    c.eq("bootfsm.service ExecMainStatus", bf.get("ExecMainStatus"), "0")
    c.true(
        f"bootfsm.service StatusText {bf.get('StatusText')!r}",
        "reboot required: MIG mode pending on 1 GPU" in bf.get("StatusText", ""),
    )
    cse = b.text("cse.txt")
    c.true(f"CSE did not end 0: {cse[-300:]!r}", "rc=0" in cse.splitlines()[-1:])
    c.true(
        "the caller was not asked to reboot", "reboot required, rebooting node in 1 minute" in cse
    )
    c.true(
        "the hook's line does not say the reboot is required",
        re.search(r"^bootfsm: OK code=0 .*; reboot required: MIG mode pending on 1 GPU", cse, re.M)
        is not None,
    )
    c.eq("kubelet ActiveState", b.show("kubelet").get("ActiveState"), "active")
    return c


def check_mig_after_reboot(b: Boot, systemd: str) -> Checks:
    """The reboot CSE asked for: bootfsm.service, with the MIG layout the hook kept in
    its drop-in, finds the mode current and creates the instances; kubelet follows."""
    c = Checks()
    base_checks(c, b, systemd)
    bf, kl = b.show("bootfsm"), b.show("kubelet")
    c.eq("ExecMainStatus", bf.get("ExecMainStatus"), "0")
    kubelet_after_bootfsm(c, bf, kl)
    states = {s["state"]: s["outcome"] for s in json.loads(b.text("trace.json"))["states"]}
    c.eq("the mig state", states.get("mig"), "done")
    return c


def check_teardown(
    b: Boot, systemd: str, what: Callable[[Checks, Boot], None], *, hook: bool = False
) -> Checks:
    """A teardown scenario (tests/booted/teardown_lane.py): the boot settled; with
    ``hook`` the hook ran in CSE's order (check_cse_hook), else bootfsm.service ended 0
    before kubelet; then what ``what`` asserts."""
    c = check_cse_hook(b, systemd) if hook else Checks()
    if not hook:
        base_checks(c, b, systemd)
        bf, kl = b.show("bootfsm"), b.show("kubelet")
        c.eq("ActiveState", bf.get("ActiveState"), "active")
        c.eq("ExecMainStatus", bf.get("ExecMainStatus"), "0")
        c.eq("NRestarts", bf.get("NRestarts"), "0")
        kubelet_after_bootfsm(c, bf, kl)
    what(c, b)
    return c


# -- the scenarios ----------------------------------------------------------------------
@dataclass(frozen=True)
class Scenario:
    """One boot of an image and what systemd and the node must show after it.

    ``node``: "fresh" boots the prepared image with --volatile=overlay (nothing it does
    stays); "kept" boots the image's one kept copy, made from the prepared image before
    the first "kept" row, so a later "kept" row is a reboot of the same node (rows run in
    table order). ``scenario`` goes to /booted/scenario.json (read by booted_node.py:
    mirror_faults, node_faults, compile_seconds, settle_timeout); ``files`` are written
    to /booted (a unit of the image may be conditioned on one); ``ro_binds`` replace
    files of the node for this boot (a node path -> its text). ``images`` names the
    images it runs on (None: every image). ``check(boot, image, earlier)`` gets the boots
    of the rows before it by key.
    """

    key: str
    title: str
    check: Callable[[Boot, Image, Mapping[str, Boot]], Checks]
    scenario: Mapping[str, object] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    ro_binds: Mapping[str, str] = field(default_factory=dict)
    node: str = "fresh"
    images: frozenset[str] | None = None


UBUNTU = frozenset({"ubuntu-22.04", "ubuntu-24.04"})  # aks-gpu prebakes Ubuntu images
TEARDOWN = frozenset({"12-cpu-prebake", "13-skip-tag", "14-supersede"})  # --only teardown
DEADLINE, TIMEOUT_START = 20.0, 80.0  # the shipped 720/780 scaled down, same 60 s margin

SCENARIOS = (
    Scenario(
        "1-success",
        "1 success: active (exited), STATUS= summary, kubelet after bootfsm",
        lambda b, img, _: check_success(b, img.systemd),
        node="kept",
    ),
    Scenario(
        "5-reboot",
        "5 reboot of the provisioned node: nothing reinstalled, per-boot init only, kubelet soon",
        lambda b, img, earlier: check_reboot(b, img.systemd, earlier["1-success"]),
        node="kept",
    ),
    Scenario(
        "2-permanent",
        "2 permanent failure (31): no restart, kubelet Dependency failed, code in status",
        lambda b, img, _: check_permanent(b, img.systemd),
        scenario={"mirror_faults": ["checksum-mismatch"]},
    ),
    Scenario(
        "3-transient",
        "3 transient failure (40) then success on the automatic restart: kubelet ends active",
        lambda b, img, _: check_restarted(b, img.systemd, r"code=exited, status=40"),
        files={"dpkg-lock-seconds": "12\n"},
    ),
    Scenario(
        "4-sigkill",
        "4 SIGKILL of bootfsm mid-driver: the restart converges",
        lambda b, img, _: check_restarted(b, img.systemd, r"code=killed, status=9/KILL"),
        scenario={"compile_seconds": 8},
        files={"kill-mid-driver": ""},
    ),
    Scenario(
        "6-deadline",
        "6 global deadline vs TimeoutStartSec: bootfsm gives up first (100), never killed",
        lambda b, img, _: check_deadline(b, img.systemd, DEADLINE, TIMEOUT_START),
        scenario={"node_faults": ["installer-hangs"]},
        ro_binds={
            "/etc/default/bootfsm": f"BOOTFSM_DEADLINE={DEADLINE:g}\nBOOTFSM_ARGS=\n",
            f"{DROPINS}/60-booted-timeout.conf": f"[Service]\nTimeoutStartSec={TIMEOUT_START:g}\n",
        },
    ),
    Scenario(
        "7-cse-hook",
        "7 the hook in CSE's order (install-unit --after-hook, AgentBaker's kubelet unit)",
        lambda b, img, _: check_cse_hook(b, img.systemd),
        scenario={"fresh_cse": True},
        files={"cse.env": cse_env()},
        ro_binds={AFTER_HOOK_PATH: AFTER_HOOK_TEXT},
    ),
    Scenario(
        "10-mig-hook",
        "10 a MIG pool's hook while the GPU stays MIG-pending: CSE 0 and its reboot asked",
        lambda b, img, _: check_mig_pending(b, img.systemd),
        scenario={"node_faults": ["mig-gpu-in-use"], "fresh_cse": True},
        files={"cse.env": cse_env(mig="MIG1g")},
        ro_binds={AFTER_HOOK_PATH: AFTER_HOOK_TEXT},
        node="kept",
    ),
    Scenario(
        "11-mig-reboot",
        "11 the reboot CSE asked for: bootfsm.service creates the MIG instances, kubelet after",
        lambda b, img, _: check_mig_after_reboot(b, img.systemd),
        node="kept",
    ),
    Scenario(
        "8-cpu-node",
        "8 a CPU VM size of the shared image: nothing to provision (0), kubelet starts",
        lambda b, img, _: check_cpu_node(b, img.systemd),
        scenario={"pci": "no-gpus", "vm_size": "Standard_D4s_v5"},
    ),
    Scenario(
        "12-cpu-prebake",
        "12 a CPU VM size of an aks-gpu-prebaked image in CSE's order: prebake torn down,"
        " the real ldconfig resolves no NVIDIA library, kubelet by ensureKubelet",
        lambda b, img, _: check_teardown(
            b, img.systemd, lambda c, b: teardown_lane.cpu_prebake(c, b, DRIVER_VERSION)
        ),
        scenario={
            "pci": "no-gpus",
            "vm_size": "Standard_D4s_v5",
            "fresh_cse": True,
            "aks_gpu_prebake": DRIVER_VERSION,
        },
        files={"cse.env": teardown_lane.no_driver_env()},
        images=UBUNTU,
    ),
    Scenario(
        "13-skip-tag",
        "13 a GPU VM size tagged SkipGpuDriverInstall in IMDS, read by CSE's curl and jq:"
        " no driver, the loaded prebake unloaded and torn down, kubelet by ensureKubelet",
        lambda b, img, _: check_teardown(
            b, img.systemd, lambda c, b: teardown_lane.skip_tag(c, b, DRIVER_VERSION)
        ),
        scenario={
            "vm_tags": teardown_lane.SKIP_TAG,
            "fresh_cse": True,
            "aks_gpu_prebake": DRIVER_VERSION,
        },
        files={"cse.env": cse_env() + f"IMDS_URL={teardown_lane.IMDS_URL}\n"},
        images=frozenset({"ubuntu-22.04"}),  # the image with curl and jq (images.py)
    ),
    Scenario(
        "14-supersede",
        f"14 the hook on an image aks-gpu prebaked with {teardown_lane.OLD_CUDA}: only"
        f" {DRIVER_VERSION}'s libraries resolve under the real ldconfig",
        lambda b, img, _: check_teardown(
            b,
            img.systemd,
            lambda c, b: teardown_lane.superseded(c, b, DRIVER_VERSION),
            hook=True,
        ),
        scenario={"fresh_cse": True, "aks_gpu_prebake": teardown_lane.OLD_CUDA},
        files={"cse.env": cse_env()},
        ro_binds={AFTER_HOOK_PATH: AFTER_HOOK_TEXT},
        images=UBUNTU,
    ),
    Scenario(
        "9-gpus-off-bus",
        "9 a GPU VM size without its GPUs on PCI: 22, no restart, kubelet down",
        lambda b, img, _: check_gpus_off_the_bus(b, img.systemd),
        scenario={"pci": "no-gpus"},
    ),
)
"""The lane's scenarios, in the order they boot on every image (see docs/testing.md)."""


def scenarios(
    img: Image, prepared: Path, work: Path, pyver: str, keys: frozenset[str] | None = None
) -> list[Result]:
    """The rows of SCENARIOS for this image (only those in ``keys`` when given)."""
    results: list[Result] = []
    boots: dict[str, Boot] = {}
    kept = work / "node"
    shutil.rmtree(kept, ignore_errors=True)
    for sc in SCENARIOS:
        if sc.images is not None and img.name not in sc.images:
            continue
        if keys is not None and sc.key not in keys:
            continue
        if sc.node == "kept" and not kept.exists():
            run(["cp", "-a", "--reflink=auto", str(prepared), str(kept)])
        t0 = time.monotonic()
        try:
            b = boot(
                kept if sc.node == "kept" else prepared,
                work / sc.key,
                {"name": sc.key, **sc.scenario},
                volatile=sc.node != "kept",
                files=dict(sc.files),
                ro_binds=dict(sc.ro_binds),
            )
            boots[sc.key] = b
            c = sc.check(b, img, boots)
            ok, detail = not c.problems, "; ".join(c.problems or c.facts or ["as expected"])
            seconds = b.elapsed
        except Exception as exc:  # a broken scenario is a FAIL, never a skip
            ok, detail, seconds = False, f"{type(exc).__name__}: {exc}", time.monotonic() - t0
        results.append(Result(img.name, img.systemd, pyver, sc.title, ok, detail, seconds))
        log(results[-1].line())
    shutil.rmtree(kept, ignore_errors=True)
    return results


def lane(img: Image, cache: Path, wheels: Path, results: list[Result], only: set[str]) -> None:
    t0 = time.monotonic()
    work = cache / "work" / img.name
    work.mkdir(parents=True, exist_ok=True)
    try:
        base, built = base_image(img, cache)
        pyver = image_python(base)
        wh = wheelhouse(cache, pyver, wheels, full=img.tests == "full")
        prepared = prepare(img, base, work, wh)
        log(
            f"{img.name}: base {'built' if built else 'cached'},"
            f" prepared in {time.monotonic() - t0:.0f} s"
        )
        full = nspawn(
            prepared, "/usr/bin/python3", "-c", "import platform; print(platform.python_version())"
        ).strip()
    except Exception as exc:
        results.append(
            Result(
                img.name,
                img.systemd,
                "?",
                "image build",
                False,
                str(exc)[-2000:],
                time.monotonic() - t0,
            )
        )
        log(results[-1].line())
        return
    if img.nvidia and (not only or "real" in only):
        real = real_node.lane(img, cache, work / "real", wh, BOOT_LOCK)
        results.extend(
            Result(img.name, img.systemd, full, name, ok, detail, seconds)
            for name, ok, detail, seconds in real
        )
        for r in results[-len(real) :]:
            log(r.line())
    if not only or "unit" in only:
        t1 = time.monotonic()
        ok, out = unit_tests(img, prepared, wh)
        (work / "unit-tests.txt").write_text(out)
        summary = [ln for ln in out.splitlines() if re.search(r"\d+ (passed|failed|error)", ln)]
        tail = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip("= ") for ln in summary[-1:]] or [
            "no pytest summary"
        ]
        what = "the whole suite" if img.tests == "full" else "unit tests"
        results.append(
            Result(
                img.name,
                img.systemd,
                full,
                f"{what} under the image's python3 {full}",
                ok,
                tail[0],
                time.monotonic() - t1,
            )
        )
        log(results[-1].line())
    if not only or "boot" in only:
        results.extend(scenarios(img, prepared, work, full))
    elif "teardown" in only:
        results.extend(scenarios(img, prepared, work, full, TEARDOWN))
    if img.nvidia and (not only or "boot" in only or "signed" in only):
        for name, ok, detail, seconds in signed_mirror.scenario(
            img, prepared, work / "signed", cache, boot
        ):
            results.append(Result(img.name, img.systemd, full, name, ok, detail, seconds))
            log(results[-1].line())
        for name, ok, detail, seconds in signed_install.scenario(
            img, prepared, work / "signed-install", cache, boot
        ):
            results.append(Result(img.name, img.systemd, full, name, ok, detail, seconds))
            log(results[-1].line())


def guarded_lane(
    img: Image, cache: Path, wheels: Path, results: list[Result], only: set[str]
) -> None:
    """lane(), where anything it raises is that image's FAIL: an image whose lane died
    never reads as passed (its thread's traceback alone would leave the run green)."""
    t0 = time.monotonic()
    try:
        lane(img, cache, wheels, results, only)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"[-2000:]
        results.append(
            Result(img.name, img.systemd, "?", "the lane", False, why, time.monotonic() - t0)
        )
        log(results[-1].line())


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--image", action="append", choices=[i.name for i in IMAGES])
    ap.add_argument(
        "--only", action="append", choices=["unit", "boot", "real", "signed", "teardown"]
    )
    args = ap.parse_args(argv)
    problems = preflight()
    if problems:
        for p in problems:
            print(f"FAIL booted lane: {p}")
        return 1
    t0 = time.monotonic()
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    # One lane at a time on a machine: two lanes' containers share one cgroup (no
    # machined) and their boots then fail in ways no real node shows.
    lock = (cache / "lane.lock").open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log("another booted lane runs on this machine; waiting for it")
        fcntl.flock(lock, fcntl.LOCK_EX)
    wheels = cache / "work" / f"wheels-{os.getpid()}"
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    build = cache / "work" / f"build-{os.getpid()}"
    log("building bootfsm's wheel from this checkout")
    # pip wheel builds in a temporary copy; nothing is written into the checkout
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(REPO)],
        env={**os.environ, "TMPDIR": str(build.parent)},
    )
    images = [i for i in IMAGES if not args.image or i.name in args.image]
    results: list[Result] = []
    threads = [
        threading.Thread(
            target=guarded_lane, args=(i, cache, wheels, results, set(args.only or ()))
        )
        for i in images
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shutil.rmtree(wheels, ignore_errors=True)
    order = {i.name: n for n, i in enumerate(IMAGES)}
    results.sort(key=lambda r: (order[r.image], r.name))
    for r in results:
        print(r.line())
    failed = [r for r in results if not r.ok]
    print(
        f"booted lane: {len(results) - len(failed)} ok, {len(failed)} FAIL"
        f" in {time.monotonic() - t0:.0f} s"
        f" (cache {cache}; reports under {cache}/work)"
    )
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
