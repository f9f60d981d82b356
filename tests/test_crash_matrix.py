"""Crash matrix: SIGKILL a real `bootfsm run` at every state boundary and inside every state.

For each SKU family (NVSwitch x86, single-GPU x86, arm64 IMEX) a chain of runs is
started on one simulated node; run k is SIGKILLed at kill point k, the next run
resumes from what run k left, and the last run must end done (exit 0). After every
kill: the child really died by SIGKILL before finishing, its journal still reads in
`bootfsm trace` (a report with a warning, not an exception), the checkpoint names the
killed run and the state it was in, every JSON/TOML file bootfsm wrote parses, and
every file in the download cache verifies against its sha256 (a kill during a
download leaves only ``.part`` files). At the end: no temporary file of an atomic
write is left anywhere (a kill mid-write may leave one; the rerun must remove it),
nothing was executed or installed that does not verify, the resumed download kept its
bytes, the tampered cache was fetched again, and the initramfs was rebuilt after the
nouveau blacklist. The whole chain is one test per SKU and mode. Each chain runs twice:
kill only (OOM killer, systemd stop: modules stay loaded) and kill then reboot (power
loss: the sim clears /run, unloads the module and boots as systemd would).

Kill points are hit deterministically: a *trigger* (an event in the child's journal,
a gate reached, a partial download on disk) says when to kill, and a *gate* (a
wrapper on PATH that blocks one command) or a slow mirror path guarantees the child
cannot get past the point before the kill lands. What systemd does when the main
process of a unit dies is emulated too: the rest of its processes (the stand-ins it
started, each in its own session) are killed by pid.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bootfsm.cli import main as cli_main
from bootfsm.core.compat import tomllib
from bootfsm.fetch.artifacts import sha256_of
from bootfsm.observe.trace import load_run
from bootfsm.sim.mirror import Fault, Stall, Throttle
from bootfsm.sim.node import SKUS, simulate_reboot
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, processes_naming

STATE_DIR = "var/lib/bootfsm"
CACHE_DIR = "var/cache/bootfsm"
LOG_DIR = "var/log/bootfsm"
WAIT_S = 60.0  # a kill point not reached in this long is a test failure, not a hang


# -- kill points ----------------------------------------------------------------------
@dataclass(frozen=True)
class Gate:
    """Block the first matching call of ``cmd`` (after ``skip`` matches) until killed."""

    cmd: str
    argv: tuple[str, ...] = ()  # prefix of the arguments
    state: str = ""  # only while the checkpoint names this state
    skip: int = 0


Trigger = Callable[["Probe"], bool]


@dataclass(frozen=True)
class Point:
    """One place to kill a run: when (trigger), what holds it there (gate, faults)."""

    name: str
    state: str  # the state the checkpoint must name when the kill lands
    trigger: Trigger
    gate: Gate | None = None
    faults: tuple[tuple[str, Fault], ...] = ()
    after_kill: Callable[[World], None] | None = None


@dataclass
class Probe:
    """What the test sees of the running child: its journal events, the gate marker."""

    world: World
    gate_dir: Path
    before: set[Path]
    journal: Path | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    _offset: int = 0

    def poll(self) -> None:
        """Read new complete journal lines of the child's run."""
        if self.journal is None:
            fresh = sorted(set(self.world.journals()) - self.before)
            if not fresh:
                return
            self.journal = fresh[-1]
        with self.journal.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        self.events += [json.loads(line) for line in complete.splitlines() if line.strip()]


def on_event(event: str, **fields: Any) -> Trigger:
    """Kill once the child's journal holds ``event`` with these field values."""

    def hit(p: Probe) -> bool:
        return any(
            e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
            for e in p.events
        )

    return hit


def on_boundary(source: str, dest: str) -> Trigger:
    """Kill once the transition source -> dest is journaled and checkpointed."""
    journaled = on_event("transition", source=source, dest=dest)

    def hit(p: Probe) -> bool:
        if not journaled(p):
            return False
        with contextlib.suppress(OSError, ValueError):
            cp = json.loads((p.world.root / STATE_DIR / "checkpoint.json").read_text())
            return bool(cp.get("state") == dest)
        return False

    return hit


def on_command(state: str, *argv: str) -> Trigger:
    """Kill once a command starting with ``argv`` finished in ``state`` (journaled)."""

    def hit(p: Probe) -> bool:
        return any(
            e.get("event") == "command"
            and e.get("state") == state
            and list(e.get("argv", []))[: len(argv)] == list(argv)
            for e in p.events
        )

    return hit


def on_gate(p: Probe) -> bool:
    """Kill once the gated command is blocked (it has not run)."""
    return (p.gate_dir / "reached").exists()


def on_partial_download(p: Probe) -> bool:
    """Kill once the runfile's .part in the cache holds some (not all) of its bytes: a
    segmented download's file is preallocated, so its sidecar says how many are in."""
    for part in p.world.root.joinpath(CACHE_DIR).glob("*/*.run.part"):
        with contextlib.suppress(FileNotFoundError, ValueError):
            meta = part.with_name(part.name + ".meta")
            segs = json.loads(meta.read_text()).get("segments") if meta.exists() else None
            if segs:
                return sum(done for _, _, done in segs) > 0
            if part.stat().st_size > 0:
                return True
    return False


def _tamper_cached_runfile(w: World) -> None:
    """Bit rot or an attacker with root: a verified file in the cache changes."""
    [runfile] = w.root.joinpath(CACHE_DIR).glob("*/*.run")
    data = bytearray(runfile.read_bytes())
    data[len(data) // 2] ^= 0xFF
    runfile.write_bytes(bytes(data))


def points_for(sku: str) -> list[Point]:
    """The kill points of one SKU family, in run order."""
    family = (
        "fabric" if SKUS[sku].nvswitch_count else ("imex" if SKUS[sku].arch == "aarch64" else "")
    )
    pts = [
        Point("detect: IMDS lookup", "detect", on_event("state.enter", state="detect"),
              faults=(("/metadata/instance", Stall(30, times=1)),)),
        Point("detect -> fetch", "fetch", on_boundary("detect", "fetch"),
              faults=(("Packages", Stall(30, times=1)),)),
        Point("fetch: mid-download", "fetch", on_partial_download,
              faults=((".run", Throttle(256 << 10)), (".deb", Stall(30)))),
        Point("fetch: between artifacts", "fetch",
              on_event("artifact.fetched", artifact="runfile"),
              faults=((".deb", Stall(30)),), after_kill=_tamper_cached_runfile),
        Point("fetch -> driver", "driver", on_boundary("fetch", "driver"),
              Gate("update-initramfs")),
        Point("driver: DKMS compile", "driver", on_event("driver.install")),
        Point("driver: before load", "driver", on_gate, Gate("nvidia-modprobe")),
        Point("driver: before toolkit", "driver", on_gate, Gate("dpkg", ("-i",), "driver")),
    ]  # fmt: skip
    nxt = {"fabric": "fabric", "imex": "imex", "": "verify"}[family]
    first = {
        "fabric": Gate("ldconfig", state="fabric"),
        "imex": Gate("dpkg-query", state="imex"),
        "": Gate("nvidia-smi", state="verify"),
    }[family]
    pts.append(Point("driver -> " + nxt, nxt, on_boundary("driver", nxt), first))
    if family == "fabric":
        pts += [
            Point("fabric: before start", "fabric", on_gate,
                  Gate("systemctl", ("start",), "fabric")),
            Point("fabric -> verify", "verify", on_boundary("fabric", "verify"),
                  Gate("nvidia-smi", state="verify")),
        ]  # fmt: skip
    if family == "imex":
        pts += [
            Point("imex: before mask", "imex", on_gate, Gate("systemctl", ("mask",), "imex")),
            Point("imex -> verify", "verify", on_boundary("imex", "verify"),
                  Gate("nvidia-smi", state="verify")),
            Point("verify: fabric wait", "verify", on_event("fabric.waiting"),
                  Gate("nvidia-smi", ("-q", "-x"), "verify", skip=2)),
        ]  # fmt: skip
    pts += [
        Point("verify -> join", "join", on_boundary("verify", "join"),
              Gate("containerd", state="join")),
        Point("join: drop-in written", "join", on_gate,
              Gate("systemctl", ("restart",), "join")),
        Point("join: kubelet health", "join",
              on_command("join", "systemctl", "start", "kubelet.service"),
              faults=(("/healthz", Stall(30, times=1)),)),
    ]  # fmt: skip
    return pts


# -- running and killing --------------------------------------------------------------
_GATE = """\
#!{python}
import json, os, sys, time
spec, real, gate_dir, checkpoint = {spec!r}, {real!r}, {gate_dir!r}, {checkpoint!r}
args = sys.argv[1:]
try:
    with open(checkpoint) as fh:
        state = json.load(fh).get("state", "")
except (OSError, ValueError):
    state = ""
if args[: len(spec["argv"])] == spec["argv"] and spec["state"] in ("", state):
    counter = os.path.join(gate_dir, "count")
    n = int(open(counter).read()) if os.path.exists(counter) else 0
    open(counter, "w").write(str(n + 1))
    if n >= spec["skip"]:
        open(os.path.join(gate_dir, "reached"), "w").write(str(os.getpid()))
        time.sleep(600)
        sys.exit(99)
os.execv(real, [real, *args])
"""


def _install_gate(w: World, gate: Gate | None, gate_dir: Path) -> None:
    gate_dir.mkdir(parents=True)
    if gate is None:
        return
    spec = {"argv": list(gate.argv), "state": gate.state, "skip": gate.skip}
    script = gate_dir / gate.cmd
    script.write_text(
        _GATE.format(
            python=sys.executable,
            spec=spec,
            real=str(w.bin_dir / gate.cmd),
            gate_dir=str(gate_dir),
            checkpoint=str(w.root / STATE_DIR / "checkpoint.json"),
        )
    )
    script.chmod(0o755)


def _kill_leftovers(base: Path) -> None:
    """What systemd does when a unit's main process dies: kill the rest of the unit."""
    deadline = time.monotonic() + 10
    while pids := processes_naming(base):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert time.monotonic() < deadline, f"stand-ins {pids} did not die"
        time.sleep(0.01)


def _run_and_kill(w: World, point: Point, gate_dir: Path) -> Probe:
    """Start `bootfsm run` and SIGKILL it at ``point``; return what the test saw."""
    for suffix, fault in point.faults:
        w.mirror.add_fault(suffix, fault)
    _install_gate(w, point.gate, gate_dir)
    env = w.env()
    env["PATH"] = f"{gate_dir}{os.pathsep}{env['PATH']}"
    probe = Probe(w, gate_dir, set(w.journals()))
    log = gate_dir / "console.log"
    with log.open("wb") as out:
        child = subprocess.Popen(w.argv(), env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + WAIT_S
        while not point.trigger(probe):
            assert child.poll() is None, (
                f"{point.name}: the run ended (rc {child.returncode}) before the kill point\n"
                + log.read_text()
            )
            assert time.monotonic() < end, (
                f"{point.name}: kill point not reached\n{log.read_text()}"
            )
            time.sleep(0.005)
            probe.poll()
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        w.mirror.clear_faults()
        _kill_leftovers(w.base)
    probe.poll()
    assert child.returncode == -signal.SIGKILL, f"{point.name}: rc {child.returncode}"
    return probe


# -- what must hold after every kill --------------------------------------------------
def _trace_cli(w: World, journal: Path) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli_main(["trace", "--root", str(w.root), str(journal)])
    return rc, out.getvalue()


def leftover_temps(root: Path) -> list[Path]:
    """Temporary files of atomic writes (``.NAME.*.tmp``) and links (``.NAME.*.lnk``)."""
    return [*root.rglob(".*.tmp"), *root.rglob(".*.lnk")]


def check_files_whole(root: Path) -> None:
    """Every JSON/TOML file bootfsm writes parses: none is half-written."""
    state = root / STATE_DIR
    for name in ("checkpoint.json", "resolved.json", "ready"):
        if (state / name).exists():
            json.loads((state / name).read_text())
    for toml in (root / "etc/containerd").rglob("*.toml"):
        tomllib.loads(toml.read_text())
    for journal in (root / LOG_DIR).glob("run-*.jsonl"):
        for line in journal.read_text().splitlines():
            json.loads(line)


def check_cache_verified(root: Path) -> dict[str, str]:
    """Every complete file in the cache hashes to its resolved sha256; return name -> sha."""
    resolved = root / STATE_DIR / "resolved.json"
    shas = (
        {a["filename"]: a["sha256"] for a in json.loads(resolved.read_text())["artifacts"]}
        if resolved.exists()
        else {}
    )
    for f in (root / CACHE_DIR).glob("*/*"):
        if f.name.endswith((".part", ".part.meta")):
            continue
        if f.name.endswith(".sha256"):  # a sidecar never vouches for other bytes
            side = json.loads(f.read_text())
            art = f.with_name(f.name.removesuffix(".sha256"))
            if art.exists():
                st = art.lstat()
                now = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
                if now == (side["size"], side["mtime_ns"], side["ino"], side["ctime_ns"]):
                    assert side["sha256"] == hashlib.sha256(art.read_bytes()).hexdigest(), f
            continue
        assert f.name in shas, f"{f} is in the cache but was never resolved"
        assert f.parent.name == shas[f.name][:16], f"{f} is not in its sha256 bucket"
    return shas


def check_after_kill(w: World, point: Point, probe: Probe) -> None:
    """The invariants every kill point must leave."""
    assert probe.journal is not None, f"{point.name}: the killed run wrote no journal"
    run_id = probe.events[0]["run_id"]
    assert all(e["event"] != "run.end" for e in probe.events)
    report = load_run(probe.journal)
    assert report.outcome == "running" and report.run_id == run_id
    assert any("no run.end" in x for x in report.warnings), report.warnings
    rc, text = _trace_cli(w, probe.journal)
    assert rc == 0 and "warning" in text and run_id in text
    checkpoint = json.loads((w.root / STATE_DIR / "checkpoint.json").read_text())
    assert checkpoint["run_id"] == run_id and checkpoint["outcome"] == "running"
    assert checkpoint["state"] == point.state, f"{point.name}: checkpoint {checkpoint}"
    check_files_whole(w.root)
    shas = check_cache_verified(w.root)
    if point.trigger is on_partial_download:
        runfile = next(n for n in shas if n.endswith(".run"))
        assert not list((w.root / CACHE_DIR).glob(f"*/{runfile}")), "unverified runfile in cache"
        assert list((w.root / CACHE_DIR).glob(f"*/{runfile}.part"))


def check_nothing_used_unverified(w: World) -> None:
    """Every artifact any run executed or installed came from the cache and verifies now
    (the runfile runs from its private copy in <state_dir>/extract: that copy too; dpkg
    installs private copies of the debs there, hashed as copied, removed after dpkg; the
    one deb bootfsm builds itself is the nvidia-modprobe record its run journals)."""
    shas = check_cache_verified(w.root)
    cache = str(w.root / CACHE_DIR) + "/"
    copies = str(w.root / "var/lib/bootfsm/extract") + "/"
    used = 0
    for j in w.journals():
        events = [json.loads(line) for line in j.read_text().splitlines()]
        recorded = {
            f"{e['package']}_{e['version']}_" for e in events if e["event"] == "dpkg.recorded"
        }
        for ev in events:
            if ev["event"] != "command":
                continue
            for arg in ev["argv"]:
                path = Path(arg)
                if arg.startswith(cache) or (arg.startswith(copies) and arg.endswith(".run")):
                    assert sha256_of(path) == shas[path.name], f"{arg} does not verify"
                    used += 1
                elif arg.startswith(copies) and arg.endswith(".deb"):
                    # bootfsm's own nvidia-modprobe record (built on the node, journaled
                    # as dpkg.recorded by the same run) is the one deb not downloaded
                    ours = any(path.name.startswith(r) for r in recorded)
                    assert ours or path.name in shas, f"{arg}: not a cached deb"
                    used += 1
    assert used >= 5  # the runfile and the toolkit debs at least


def check_tampered_runfile_refetched(w: World) -> None:
    """After the cache was tampered with, the runfile ran only after a fresh download."""
    runs = [[json.loads(x) for x in j.read_text().splitlines()] for j in w.journals()]
    tampered_at = next(
        i for i, evs in enumerate(runs) if any(e.get("artifact") == "runfile" for e in evs)
    )
    for evs in runs[tampered_at + 1 :]:
        for e in evs:
            if e.get("event") == "artifact.fetched" and e.get("artifact") == "runfile":
                return
            argv = e.get("argv") or []
            assert not (argv and argv[0].endswith(".run")), "tampered runfile executed"
    raise AssertionError("the tampered runfile was never downloaded again")


def check_download_resumed(w: World) -> None:
    """The bytes the killed download had on disk were kept: the next one resumed."""
    for j in w.journals():
        for e in map(json.loads, j.read_text().splitlines()):
            if e.get("event") == "artifact.fetched" and e.get("artifact") == "runfile":
                assert e["resumed_bytes"] > 0, e
                return
    raise AssertionError("the runfile was never fetched")


# -- the matrix -----------------------------------------------------------------------
SKU_FAMILIES = ("h100-hgx", "h100-pcie", "gb300")
REBOOT_FROM = "driver: DKMS compile"  # before it nothing a reboot clears is bootfsm's


def chain_for(sku: str, *, reboot: bool) -> list[Point]:
    """Kill-only chains cover every point; power-loss chains start where reboots matter."""
    pts = points_for(sku)
    if reboot:
        pts = pts[[p.name for p in pts].index(REBOOT_FROM) :]
    return pts


def run_chain(w: World, points: Sequence[Point], *, reboot: bool, work: Path) -> None:
    """Kill one run at each point in turn, then let the last run finish."""
    for i, point in enumerate(points):
        probe = _run_and_kill(w, point, work / f"run{i}")
        check_after_kill(w, point, probe)
        if reboot:
            simulate_reboot(w.root)
        if point.after_kill is not None:
            point.after_kill(w)
    final = w.run_cli()
    assert final.returncode == 0, final.stdout + final.stderr
    journals = w.journals()
    assert len(journals) == len(points) + 1, "a journal was lost"
    assert load_run(journals[-1]).outcome == "done"
    check_files_whole(w.root)
    assert not leftover_temps(w.root), "a rerun left temporary files of a killed run"
    check_nothing_used_unverified(w)
    if any(p.after_kill is _tamper_cached_runfile for p in points):
        check_tampered_runfile_refetched(w)
    if any(p.trigger is on_partial_download for p in points):
        check_download_resumed(w)
    initrd = (w.root / f"boot/initrd.img-{SKUS[w.sku_name].kernel}").read_text()
    assert "blacklist nouveau" in initrd, "nouveau blacklisted but the initramfs never rebuilt"


MATRIX = [(sku, reboot) for sku in SKU_FAMILIES for reboot in (False, True)]


def test_matrix_size() -> None:
    """The number of kill points reported: every boundary and inside every state."""
    kill = {sku: len(chain_for(sku, reboot=False)) for sku in SKU_FAMILIES}
    power = {sku: len(chain_for(sku, reboot=True)) for sku in SKU_FAMILIES}
    assert kill == {"h100-hgx": 14, "h100-pcie": 12, "gb300": 15}
    assert power == {"h100-hgx": 9, "h100-pcie": 7, "gb300": 10}  # toolkit after the compile
    assert sum(kill.values()) + sum(power.values()) == 67


@pytest.mark.parametrize(
    ("sku", "reboot"), MATRIX, ids=[f"{s}-{'reboot' if r else 'kill'}" for s, r in MATRIX]
)
def test_crash_at_every_step(make_world: MakeWorld, tmp_path: Path, sku: str, reboot: bool) -> None:
    """Every kill point leaves a consistent node; the chain of reruns ends done."""
    w = make_world(sku, compile_seconds=1.0)
    run_chain(w, chain_for(sku, reboot=reboot), reboot=reboot, work=tmp_path / "runs")


def test_rerun_after_done_changes_nothing(make_world: MakeWorld) -> None:
    """A run on a provisioned node skips every state: no install command runs again."""
    w = make_world("h100-pcie")
    assert w.run_cli().returncode == 0
    before = len(w.calls())
    again = w.run_cli()
    assert again.returncode == 0, again.stdout + again.stderr
    rerun_cmds = {c["cmd"] for c in w.calls()[before:]}
    assert not rerun_cmds & {"dpkg", "update-initramfs", "nvidia-installer", "nvidia-modprobe"}
    spans = load_run(w.journals()[-1]).spans
    assert {s.outcome for s in spans if s.state != "detect"} == {"skipped"}  # detect always runs
