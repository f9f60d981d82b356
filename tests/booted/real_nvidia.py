"""NVIDIA's real user-space, from Ubuntu's archive, beside the simulator's stand-ins.

The Ubuntu node with Canonical's real 580 packages installed by dpkg (real_node.py:
nvidia-utils-580-server's nvidia-smi, nvidia-compute-utils-580-server's
nvidia-persistenced, nvidia-fabricmanager-580) runs image/real_nvidia.sh in a non-booted
container: no GPU, no NVIDIA kernel module loaded. The
same commands run here against the simulator's stand-ins on a simulated node in the
same condition (no driver loaded; for NVLink5 an HGX B200 without ib_umad, whose
InfiniBand layout the real script reads), and each row of COMPARISONS says whether the
stand-in shows what the real binary shows. The committed H200 capture
(tests/captures/h200_580.159.04) is the reference for what needs a GPU (nvidia-smi's
grammar with a driver loaded); tests/sim/test_sim_smi.py and tests/test_verify.py check
the stand-ins against it in make test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the tests package

from bootfsm.sim import standin_smi
from bootfsm.sim.artifacts_redist import _FM_UNIT
from bootfsm.sim.node import build_node, standin_script
from bootfsm.sim.skus import SKUS
from tests.test_systemd_unit import unit_settings

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CAPTURE = REPO / "tests/captures/h200_580.159.04"
START_SCRIPT = "/usr/bin/nvidia-fabricmanager-start.sh"


@dataclass
class Run:
    out: str
    err: str
    rc: int

    def show(self) -> str:
        return f"exit {self.rc}, stdout {self.out!r}" + (
            f", stderr {self.err!r}" if self.err else ""
        )


def _real(out: Path, case: str) -> Run:
    return Run(
        (out / f"{case}.out").read_text(errors="replace"),
        (out / f"{case}.err").read_text(errors="replace"),
        int((out / f"{case}.rc").read_text()),
    )


class Sim:
    """One simulated node (no driver loaded) and its stand-ins, run as subprocesses."""

    def __init__(self, root: Path, sku: str) -> None:
        shutil.rmtree(root, ignore_errors=True)
        self.root = root
        self.bin = build_node(root, SKUS[sku], (), compile_seconds=0.01)
        for name in (START_SCRIPT, "/usr/bin/nvidia-persistenced"):
            path = root / name.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(standin_script(Path(name).name, root, sys.executable))
            path.chmod(0o755)

    def run(self, *argv: str) -> Run:
        exe = argv[0]
        if exe.startswith("/"):
            exe = str(self.root / exe.lstrip("/"))
        env = {**os.environ, "PATH": f"{self.bin}:{os.environ.get('PATH', '')}"}
        p = subprocess.run(
            [exe, *argv[1:]], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        return Run(p.stdout, p.stderr, p.returncode)


def help_options(text: str) -> set[str]:
    """Every option and subcommand nvidia-smi --help lists (the first columns of a line)."""
    found: set[str] = set()
    for line in text.replace("\r", "").splitlines():
        head = line[:30]
        found.update(o.rstrip("=") for o in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*=?)", head))
        m = re.match(r"^ {4}([a-z][a-z0-9-]+) {2,}\S", line)
        if m:
            found.add(m[1])
    return found


Check = Callable[[Path, dict[str, Sim]], tuple[bool, str]]


def _same(real: Run, sim: Run, *, stderr: bool = True) -> tuple[bool, str]:
    same = (real.out, real.rc) == (sim.out, sim.rc) and (not stderr or real.err == sim.err)
    if same:
        return True, real.show()
    return False, f"real: {real.show()}; stand-in: {sim.show()}"


def smi_no_driver(out: Path, sims: dict[str, Sim]) -> tuple[bool, str]:
    problems, facts = [], []
    for case, argv in (
        ("smi-plain", ()),
        ("smi-L", ("-L",)),
        ("smi-qx", ("-q", "-x")),
        ("smi-bogus", ("--no-such-option",)),
        ("smi-x-alone", ("-x",)),
    ):
        ok, detail = _same(_real(out, case), sims["h100-pcie"].run("nvidia-smi", *argv))
        (facts if ok else problems).append(f"nvidia-smi {' '.join(argv)}: {detail}")
    return not problems, "; ".join(problems) or facts[0] + " (and -L, -q -x, a bogus option, -x)"


def smi_help(out: Path, sims: dict[str, Sim]) -> tuple[bool, str]:
    real = _real(out, "smi-help")
    captured = (CAPTURE / "smi-help.txt").read_text()
    known = help_options(real.out) | help_options(captured)
    grammar = {*standin_smi._FLAGS, *standin_smi._VALUED, *standin_smi._REAL_UNSIMULATED}
    grammar |= set(standin_smi._SUBCOMMANDS) | {"mig"}
    missing = sorted(grammar - known)
    sim = sims["h100-pcie"].run("nvidia-smi", "--help")
    problems = []
    if missing:
        problems.append(f"the stand-in knows options the real --help does not list: {missing}")
    if real.rc != 0 or sim.rc != 0:
        problems.append(f"--help exits {real.rc} (real), {sim.rc} (stand-in)")
    first = real.out.splitlines()[0] if real.out else ""
    return not problems, "; ".join(problems) or (
        f"{len(grammar)} options and subcommands of the stand-in, all in the real --help"
        f" ({first.strip()!r} and the 580.159.04 capture: {len(known)} listed); exit 0"
    )


def fm_unit(out: Path, sims: dict[str, Sim]) -> tuple[bool, str]:
    real = unit_settings((out / "fm-unit.txt").read_text())
    sim = unit_settings(_FM_UNIT)
    if real == sim:
        n = sum(len(v) for v in real.values())
        timeout = real[("Service", "TimeoutStartSec")][0]
        return True, f"the same {n} directives, e.g. TimeoutStartSec={timeout}"
    only_real = {k: v for k, v in real.items() if sim.get(k) != v}
    only_sim = {k: v for k, v in sim.items() if real.get(k) != v}
    return False, f"the real unit's: {only_real}; the stand-in's: {only_sim}"


def fm_files(out: Path, sims: dict[str, Sim]) -> tuple[bool, str]:
    from bootfsm.states.fabric import install_map

    shipped = set((out / "fm-files.txt").read_text().split())
    ours = {dst for _src, dst in install_map("x86_64")}
    missing = sorted(d for d in ours if d not in shipped)
    # the package ships the daemon, its tools, start script, unit and configuration at the
    # paths bootfsm installs them to; libnvfm and the headers are other packages on Ubuntu
    needed = {
        "/usr/bin/nv-fabricmanager",
        "/usr/bin/nvswitch-audit",
        START_SCRIPT,
        "/lib/systemd/system/nvidia-fabricmanager.service",
        "/usr/share/nvidia/nvswitch/fabricmanager.cfg",
    }
    wrong = sorted(needed - shipped)
    if wrong:
        return False, f"the real package does not ship {wrong}"
    return True, (
        f"the real package ships the daemon, nvswitch-audit, start script, unit and"
        f" fabricmanager.cfg at bootfsm's paths; not in it (other Ubuntu packages): {missing}"
    )


def fm_case(case: str, sku: str, *argv: str) -> Check:
    def check(out: Path, sims: dict[str, Sim]) -> tuple[bool, str]:
        real = _real(out, case)
        if case.endswith("nvl5"):
            # lsmod in a container without /proc/modules says so on stderr (a real
            # node's lsmod lists its modules): only stdout and the exit status count
            return _same(real, sims[sku].run(START_SCRIPT, *argv), stderr=False)
        return _same(real, sims[sku].run(START_SCRIPT, *argv))

    return check


def persistenced(out: Path, sims: dict[str, Sim]) -> tuple[bool, str]:
    return _same(
        _real(out, "persistenced"),
        sims["h100-pcie"].run("/usr/bin/nvidia-persistenced", "--verbose"),
    )


COMPARISONS: tuple[tuple[str, Check], ...] = (
    ("nvidia-smi without a driver: message and exit status", smi_no_driver),
    ("nvidia-smi --help: the stand-in's grammar", smi_help),
    ("nvidia-fabricmanager.service: the stand-in's unit", fm_unit),
    ("fabric manager package: bootfsm's install paths", fm_files),
    (
        "fabric manager --mode precheck, no NVLink5 device",
        fm_case("fm-precheck", "h100-hgx", "--mode", "precheck"),
    ),
    (
        "fabric manager --mode start, NVSwitch, no driver",
        fm_case("fm-start", "h100-hgx", "--mode", "start"),
    ),
    (
        "fabric manager --mode start, NVLink5 (InfiniBand VPD SW_MNG), no ib_umad",
        fm_case("fm-start-nvl5", "b200-hgx", "--mode", "start"),
    ),
    (
        "fabric manager start script, an unknown --mode",
        fm_case("fm-mode-bogus", "h100-hgx", "--mode", "bogus"),
    ),
    ("nvidia-persistenced without a driver", persistenced),
)


def prepare(work: Path) -> dict[str, Sim]:
    """The simulated nodes, and what the real side reads of them (work/nvl5: the
    simulated B200's InfiniBand layout; work/real_nvidia.sh)."""
    sims = {sku: Sim(work / "sim" / sku, sku) for sku in ("h100-pcie", "h100-hgx", "b200-hgx")}
    shutil.copytree(sims["b200-hgx"].root / "sys/class", work / "nvl5/sys/class")
    shutil.copy(HERE / "image/real_nvidia.sh", work / "real_nvidia.sh")
    return sims


def rows(out: Path, sims: dict[str, Sim]) -> list[tuple[str, bool, str, float]]:
    """One row per comparison, from what image/real_nvidia.sh recorded in `out`."""
    try:
        versions = " ".join((out / "versions.txt").read_text().split())
    except OSError as exc:
        return [(f"real NVIDIA: {name}", False, str(exc), 0.0) for name, _ in COMPARISONS]
    result = []
    for name, check in COMPARISONS:
        t1 = time.monotonic()
        try:
            ok, detail = check(out, sims)
        except Exception as exc:  # a broken comparison is a FAIL, never a skip
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        if not result:
            detail = f"{versions}: {detail}"
        result.append((f"real NVIDIA: {name}", ok, detail, time.monotonic() - t1))
    return result
