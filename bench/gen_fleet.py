"""Generate a realistic corpus of node journals with KNOWN answers for the fleet view.

    python bench/gen_fleet.py --nodes 10000 --seed 7 --out DIR

writes ``DIR/node-NNNNN/run-<time>-<id>.jsonl`` (one per run; a node that failed and
was rebooted or rerun has two) in the event format of bootfsm/observe/journal.py, and
``DIR/answers.json``: what ``bootfsm trace --fleet DIR --json`` must report, computed
here from the plan, not by reading the files back (counts, outcomes, failures by code
and state, nearest-rank p50/p95/max per state, slowest runs, retry hot spots, models).

The mix: five SKUs (x86 NVSwitch, PCIe, NVLink5, two Grace), ~87 % provisioned first
time, fetch back-offs on 503s and dropped connections, and the field's failure classes
(404, checksum, dpkg lock, DKMS build, installer timeout, fabric not ready, infoROM,
GPU missing, kubelet), failures fixed by a reboot or a rerun, a few runs killed
mid-driver (torn last line, no run.end), SIGTERMs, and rare NUL-filled lines left by
a power cut. Node i draws from ``Random(seed * 1_000_003 + i)``, so the corpus of N
nodes is a prefix of the corpus of M > N nodes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
MIRROR = "https://mirror.example.com/nvidia"
SKUS: dict[str, dict[str, Any]] = {
    "h100-hgx": {
        "w": 0.35,
        "arch": "x86_64",
        "model": "H100 SXM5",
        "n": 8,
        "sw": 4,
        "nvl5": False,
        "next": "fabric",
        "vm": "standard_nd96isr_h100_v5",
    },
    "h100-pcie": {
        "w": 0.15,
        "arch": "x86_64",
        "model": "H100 PCIe",
        "n": 1,
        "sw": 0,
        "nvl5": False,
        "next": "verify",
        "vm": "standard_nc40ads_h100_v5",
    },
    "b200-hgx": {
        "w": 0.15,
        "arch": "x86_64",
        "model": "B200",
        "n": 8,
        "sw": 2,
        "nvl5": True,
        "next": "fabric",
        "vm": "standard_nd128isr_ndr_gb200_v6",
    },
    "gb200": {
        "w": 0.15,
        "arch": "aarch64",
        "model": "GB200",
        "n": 4,
        "sw": 0,
        "nvl5": False,
        "next": "imex",
        "vm": "standard_nd128isr_gb200_v6",
    },
    "gb300": {
        "w": 0.20,
        "arch": "aarch64",
        "model": "GB300",
        "n": 4,
        "sw": 0,
        "nvl5": False,
        "next": "imex",
        "vm": "standard_nd128isr_gb300_v6",
    },
}
# scenario -> weight; "x:y" means a first run failing with x, then a run after y
SCENARIOS: dict[str, float] = {
    "ok": 0.800,
    "retry503": 0.040,
    "dropbody": 0.010,
    "404": 0.006,
    "checksum": 0.006,
    "exhausted": 0.004,
    "dpkg": 0.010,
    "dkms": 0.015,
    "installer-timeout": 0.005,
    "fabric": 0.010,
    "inforom": 0.005,
    "gpu-missing": 0.005,
    "kubelet": 0.012,
    "reboot:ok": 0.030,
    "dpkg:rerun": 0.020,
    "killed": 0.010,
    "killed:ok": 0.005,
    "sigterm": 0.008,
    "nul": 0.004,
}
FAILS = {  # scenario -> (state, code, name, message, hint)
    "404": (
        "fetch",
        30,
        "ARTIFACT_NOT_FOUND",
        "HTTP 404 from {u}/tesla/570.211.01/NVIDIA-Linux-{a}-570.211.01.run",
        "check the version and the base URLs in [sources]; the journal names the URL",
    ),
    "checksum": (
        "fetch",
        31,
        "CHECKSUM_MISMATCH",
        "sha256 of NVIDIA-Linux-{a}-570.211.01.run is 9c1e... expected 4f2a...",
        "the mirror serves different bytes than the release; check the mirror"
        " and sources.runfile_sha256",
    ),
    "exhausted": (
        "fetch",
        33,
        "DOWNLOAD_RETRIES_EXHAUSTED",
        "HTTP 503 from {u}/tesla/570.211.01/NVIDIA-Linux-{a}-570.211.01.run"
        " (gave up after 5 attempt(s))",
        "the mirror kept failing; check its health and retry",
    ),
    "dpkg": (
        "driver",
        40,
        "DPKG_LOCK_TIMEOUT",
        "dpkg lock /var/lib/dpkg/lock-frontend still held after 120 s (driver.dpkg_lock_timeout)",
        "another package operation (unattended-upgrades?) holds /var/lib/dpkg/lock-frontend",
    ),
    "dkms": (
        "driver",
        41,
        "DRIVER_INSTALL_FAILED",
        "nvidia-installer failed: exit 1: nvidia-installer -s -a --no-drm --dkms\n"
        "ERROR: Unable to build the NVIDIA kernel module.",
        "see the installer output in `bootfsm trace` and /var/log/nvidia-installer.log",
    ),
    "installer-timeout": (
        "driver",
        85,
        "DRIVER_INSTALL_TIMEOUT",
        "nvidia-installer failed (timed out after 600 s)",
        "the DKMS build hung; check the kernel headers and the build log",
    ),
    "reboot": (
        "driver",
        42,
        "REBOOT_REQUIRED",
        "nvidia 535.183.01 is loaded and in use; a reboot is needed to load 570.211.01",
        "reboot the node; bootfsm resumes at the first unsatisfied state",
    ),
    "fabric": (
        "verify",
        51,
        "FABRIC_NOT_READY",
        "GPU fabric still In Progress after 300 s",
        "check nvidia-fabricmanager and the NVLink switch trays",
    ),
    "inforom": (
        "verify",
        87,
        "INFOROM_CORRUPTED",
        "nvidia-smi: infoROM is corrupted at gpu 0001:00:00.0",
        "replace the GPU (RMA)",
    ),
    "gpu-missing": (
        "verify",
        61,
        "GPU_COUNT_MISMATCH",
        "nvidia-smi sees {m} GPU(s); the PCI bus has {n}",
        "a GPU fell off the bus or failed init; check dmesg (Xid) and replace the node",
    ),
    "kubelet": (
        "join",
        91,
        "KUBELET_NOT_HEALTHY",
        "http://127.0.0.1:10248/healthz did not answer ok within 120 s",
        "check `journalctl -u kubelet`; /healthz on 127.0.0.1:10248 must answer ok",
    ),
}
STATE_CODES = {"fetch": "DOWNLOAD_RETRIES_EXHAUSTED", "verify": "FABRIC_NOT_READY"}
LIMITS = {
    "detect": (30, 1),
    "fetch": (360, 5),
    "driver": (600, 2),
    "fabric": (180, 3),
    "imex": (120, 2),
    "verify": (360, 3),
    "join": (240, 2),
}


def _pick(rng: random.Random, table: dict[str, Any], key: str | None = None) -> str:
    x, acc = rng.random(), 0.0
    for name, v in table.items():
        acc += v[key] if key else v
        if x < acc:
            return name
    return next(iter(table))


def _iso(wall: float) -> str:
    us = round(wall * 1e6)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000)) + f".{us % 1_000_000:06d}Z"
    )


class Run:
    """Writes one journal and records what the fleet view must see for it."""

    def __init__(self, rng: random.Random, node: str, sku: str, wall0: float, boot: str) -> None:
        self.rng, self.node, self.sku, self.wall0, self.boot = rng, node, sku, wall0, boot
        self.run_id = f"{rng.getrandbits(32):08x}"
        self.lines: list[str] = []
        self.t = 0.0006
        self.spans: list[dict[str, Any]] = []
        self.outcome = "unfinished"
        self.code: int | None = None
        self.code_name = ""
        self.fail_state = ""
        self.duration: float | None = None
        self.bad = 0

    def ev(self, event: str, level: str = "info", **fields: Any) -> None:
        rec = {
            "run_id": self.run_id,
            "t": self.t,
            "level": level,
            **fields,
            "event": event,
            "ts": _iso(self.wall0 + self.t),
        }
        self.lines.append(json.dumps(rec))

    def tick(self, seconds: float) -> None:
        self.t = round(self.t + seconds, 4)

    def cmd(self, state: str, argv: list[str], seconds: float, rc: int = 0, out: str = "") -> None:
        self.tick(seconds)
        self.ev(
            "command",
            "info" if rc == 0 else "warning",
            state=state,
            argv=argv,
            rc=rc,
            duration_s=round(seconds, 4),
            timed_out=False,
            output=out,
        )

    def start(self) -> None:
        s = SKUS[self.sku]
        self.ev(
            "run.start",
            version="0.1.0",
            schema=1,
            root="/",
            config_path="/etc/bootfsm/config.toml",
            config_digest="fffb48dd6890484b",
            deadline_s=720.0,
            pid=1000 + self.rng.randrange(30000),
            boot_id=self.boot,
        )

        self.facts = {
            "arch": s["arch"],
            "os": "ubuntu:22.04" if s["arch"] == "x86_64" else "ubuntu:24.04",
            "kernel": "5.15.0-1089-azure",
            "gpu_count": s["n"],
            "gpu_model": s["model"],
            "gpu_family": "hopper" if "H100" in s["model"] else "blackwell",
            "grace": s["arch"] == "aarch64",
            "nvswitches": s["sw"],
            "nvlink5": s["nvl5"],
            "loaded_driver": None,
            "vm_size": s["vm"],
            "gpus": [{"bdf": f"000{i + 1}:00:00.0", "name": s["model"]} for i in range(s["n"])],
        }

    def state(
        self,
        name: str,
        d: float,
        *,
        fail: tuple[Any, ...] | None = None,
        retries: list[tuple[str, float]] = (),
        skip: bool = False,
        cut: bool = False,
        sigterm: bool = False,
    ) -> bool:
        """One state lasting ``d`` s; returns False when the run ends here."""
        limit, tries = LIMITS[name]
        t_enter = self.t
        span: dict[str, Any] = {"state": name, "retries": [], "attempts": 0}
        self.spans.append(span)
        if skip:
            self.tick(0.004)
            self.ev("state.skip", state=name, reason="postcondition holds")
            span["outcome"] = "skipped"
            return self._transition(name, _next(self.sku, name), {})
        self.ev("state.enter", state=name, time_limit_s=limit, attempts_max=tries)
        n_cmds = {
            "detect": 0,
            "fetch": 0,
            "driver": 12,
            "fabric": 7,
            "imex": 6,
            "verify": 2,
            "join": 6,
        }[name]
        body = d - 0.002 - sum(s for _, s in retries)
        step = body / (n_cmds + len(retries) + 3)
        for i, (err, sleep) in enumerate(retries, 1):
            self.ev("state.attempt", state=name, attempt=i)
            span["attempts"] = i
            self.tick(step)
            self.ev(
                "state.retry",
                "warning",
                state=name,
                attempt=i,
                sleep_s=sleep,
                error=err,
                code=STATE_CODES.get(name, "INTERNAL_ERROR"),
            )
            span["retries"].append((STATE_CODES.get(name, "INTERNAL_ERROR"), sleep))
            self.tick(sleep)
        span["attempts"] += 1
        self.ev("state.attempt", state=name, attempt=span["attempts"])
        if name == "detect":
            self.tick(step)
            self.ev("node.facts", **self.facts)
        if name == "fetch":
            for what in ("toolkit_packages", "redistrib"):
                self.tick(step / 2)
                self.ev("index.fetched", state=name, index=what, url=f"{MIRROR}/{what}", size=2369)
            for art in (
                "runfile",
                "libnvidia-container1",
                "nvidia-container-toolkit",
                "fabricmanager",
            ):
                self.tick(step / 2)
                self.ev(
                    "artifact.fetched",
                    state=name,
                    artifact=art,
                    url=f"{MIRROR}/{art}",
                    size=389_000_000 if art == "runfile" else 1_400_000,
                    duration_s=round(step / 2, 4),
                    rate_mb_s=118.2,
                    resumed_bytes=0,
                    verified=True,
                )
        for i in range(n_cmds):
            rc = 1 if (fail and i == n_cmds - 1 and name == "driver") else 0
            self.cmd(
                name,
                _ARGV[name][i % len(_ARGV[name])],
                step,
                rc,
                "ERROR: Unable to build the NVIDIA kernel module.\n" if rc else "ok\n",
            )
        if cut:  # killed: a torn last line, no end
            self.tick(step)
            line = json.dumps(
                {
                    "run_id": self.run_id,
                    "t": self.t,
                    "level": "info",
                    "state": name,
                    "argv": ["dkms", "build"],
                    "event": "command",
                }
            )
            self.lines.append(line[: len(line) // 2])
            self.bad += 1
            span["outcome"] = "running"
            self.outcome = "unfinished"
            return False
        if sigterm:
            self.tick(step)
            span["outcome"] = "interrupted"
            self._end(
                "interrupted",
                12,
                "INTERRUPTED",
                name,
                f"interrupted by SIGTERM in state {name}",
                "rerun `bootfsm run`; it resumes at the first unsatisfied state",
            )
            return False
        if fail:
            t_fail = round(t_enter + d, 4)
            self.t = t_fail
            _, code, cname, msg, hint = fail
            self.ev(
                "state.failed",
                "error",
                state=name,
                code=code,
                code_name=cname,
                message=msg,
                hint=hint,
                detail={},
                output="",
            )
            span["outcome"] = "failed"
            span["duration"] = round(t_fail - t_enter, 4)
            self._transition(name, "failed", {})
            self._end("failed", code, cname, name, msg, hint)
            return False
        self.t = round(t_enter + d, 4)
        self.ev("state.done", state=name, duration_s=d, attempts=span["attempts"])
        span["outcome"] = "done"
        span["duration"] = d
        nxt = _next(self.sku, name)
        guards = (
            {
                "needs_fabric_manager": nxt == "fabric",
                "needs_imex": nxt == "imex",
                "no_nvlink_fabric": nxt == "verify",
            }
            if name == "driver"
            else {}
        )
        return self._transition(name, nxt, guards)

    def _transition(self, src: str, dest: str, guards: dict[str, bool]) -> bool:
        self.tick(0.0002)
        self.ev(
            "transition",
            source=src,
            dest=dest,
            trigger="fail" if dest == "failed" else "advance",
            guards=guards,
        )
        return dest != "failed"

    def _end(self, outcome: str, code: int, name: str, state: str, msg: str, hint: str) -> None:
        self.tick(0.011)
        self.ev(
            "run.end",
            "info" if code == 0 else "error",
            outcome=outcome,
            code=code,
            code_name=name,
            state=state,
            message=msg,
            hint=hint,
            duration_s=self.t,
        )
        self.outcome, self.code, self.code_name, self.duration = outcome, code, name, self.t
        self.fail_state = state if code else ""


_ARGV = {
    "driver": [
        ["update-initramfs", "-u"],
        ["dpkg-query", "-W", "-f=${Version}", "libnvidia-container1"],
        ["dpkg", "-i", "--force-overwrite", "/var/cache/bootfsm/x.deb"],
        ["dkms", "status", "-m", "nvidia"],
        ["/var/cache/bootfsm/NVIDIA-Linux.run", "-x", "--target", "/var/lib/bootfsm/extract"],
        ["nvidia-installer", "-s", "-a", "--no-drm", "--dkms"],
        ["nvidia-modprobe", "-u", "-c0"],
        ["ldconfig"],
    ],
    "fabric": [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "nvidia-fabricmanager.service"],
        ["systemctl", "start", "nvidia-fabricmanager.service"],
        ["systemctl", "is-active", "nvidia-fabricmanager.service"],
    ],
    "imex": [
        ["dpkg", "-i", "--force-depends", "/var/cache/bootfsm/nvidia-imex.deb"],
        ["systemctl", "mask", "nvidia-imex.service"],
    ],
    "verify": [["nvidia-smi", "-q"]],
    "join": [
        ["containerd", "--version"],
        ["nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all"],
        ["systemctl", "restart", "containerd.service"],
        ["systemctl", "start", "kubelet.service"],
    ],
}


def _next(sku: str, state: str) -> str:
    order = {
        "detect": "fetch",
        "fetch": "driver",
        "fabric": "verify",
        "imex": "verify",
        "verify": "join",
        "join": "done",
    }
    return SKUS[sku]["next"] if state == "driver" else order[state]


def _durations(rng: random.Random, sku: str, prebaked: bool) -> dict[str, float]:
    r = lambda a, b: round(rng.uniform(a, b), 3)  # noqa: E731
    return {
        "detect": r(0.3, 1.2),
        "fetch": r(6.0, 40.0),
        "driver": r(4.0, 12.0) if prebaked else r(60.0, 150.0),
        "fabric": r(10.0, 25.0),
        "imex": r(5.0, 12.0),
        "verify": r(2.0, 60.0) if SKUS[sku]["sw"] else r(2.0, 8.0),
        "join": r(8.0, 25.0),
    }


def _one_run(
    rng: random.Random,
    node: str,
    sku: str,
    wall0: float,
    boot: str,
    scenario: str,
    *,
    skip_fetch: bool = False,
) -> Run:
    run = Run(rng, node, sku, wall0, boot)
    run.start()
    d = _durations(rng, sku, rng.random() < 0.25)
    fail = FAILS.get(scenario)
    if fail:
        n = SKUS[sku]["n"]
        fail = (
            fail[0],
            fail[1],
            fail[2],
            fail[3].format(u=MIRROR, a=SKUS[sku]["arch"], m=n - 1, n=n),
            fail[4],
        )
    retries: dict[str, list[tuple[str, float]]] = {}
    if scenario in ("retry503", "exhausted"):
        k = 4 if scenario == "exhausted" else rng.randint(1, 3)
        retries["fetch"] = [
            (
                f"HTTP 503 from {MIRROR}/tesla/570.211.01/NVIDIA-Linux.run",
                round(rng.uniform(0.5, 1.0) * 2**i, 3),
            )
            for i in range(k)
        ]
    if scenario == "dropbody":
        retries["fetch"] = [
            ("connection dropped after 194 MB of NVIDIA-Linux.run", round(rng.uniform(0.5, 1.0), 3))
        ]
    if scenario == "fabric":
        retries["verify"] = [("GPU fabric In Progress", 2.0), ("GPU fabric In Progress", 4.0)]
    path = ["detect", "fetch", "driver"]
    nxt = SKUS[sku]["next"]
    path += [nxt, "verify", "join"] if nxt != "verify" else ["verify", "join"]
    imex_preinstalled = sku == "gb300" and rng.random() < 0.3
    for name in path:
        here = fail if fail and fail[0] == name else None
        dd = d[name] + sum(s for _, s in retries.get(name, []))
        dd = round(dd, 3)
        go = run.state(
            name,
            dd,
            fail=here,
            retries=retries.get(name, []),
            skip=(name == "imex" and imex_preinstalled) or (name == "fetch" and skip_fetch),
            cut=scenario == "killed" and name == "driver",
            sigterm=scenario == "sigterm" and name == "driver",
        )
        if not go:
            return run
    run._end("done", 0, "OK", "done", "node provisioned", "nothing to do")
    return run


def generate(out: Path, nodes: int, seed: int) -> dict[str, Any]:
    """Write the corpus under ``out``; return (and write) the answers."""
    ans = _Answers()
    for i in range(nodes):
        rng = random.Random(seed * 1_000_003 + i)
        node = f"node-{i:05d}"
        sku = _pick(rng, SKUS, "w")
        scenario = _pick(rng, SCENARIOS)
        first, _, after = scenario.partition(":")
        wall = T0 + i * 7.0
        boot = f"{rng.getrandbits(64):016x}"
        runs = [_one_run(rng, node, sku, wall, boot, first)]
        if after:  # a rerun on the same boot, or a run after a reboot (new boot id)
            boot2 = boot if after == "rerun" else f"{rng.getrandbits(64):016x}"
            cached = runs[0].spans[-1]["state"] != "fetch"
            runs.append(_one_run(rng, node, sku, wall + 900.0, boot2, "ok", skip_fetch=cached))
        if scenario == "nul":  # a power cut leaves a block of NUL bytes
            runs[0].lines.insert(len(runs[0].lines) // 2, "\x00" * 64)
            runs[0].bad += 1
        d = out / node
        d.mkdir(parents=True, exist_ok=True)
        for run in runs:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(run.wall0))
            tail = "" if run.outcome == "unfinished" else "\n"
            (d / f"run-{stamp}-{run.run_id}.jsonl").write_text("\n".join(run.lines) + tail)
            ans.add(node, run)
        ans.end_node()
    data = ans.to_json()
    (out / "answers.json").write_text(json.dumps(data, indent=1) + "\n")
    return data


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[max(1, math.ceil(p * len(v) / 100)) - 1]


class _Answers:
    def __init__(self) -> None:
        self.files = self.nodes = self.runs = self.events = self.bad = self.recovered = 0
        self.run_outcomes: Counter[str] = Counter()
        self.node_outcomes: Counter[str] = Counter()
        self.by_code: Counter[tuple[int, str]] = Counter()
        self.by_state: Counter[str] = Counter()
        self.dur: dict[str, list[float]] = {}
        self.run_dur: list[float] = []
        self.skipped: Counter[str] = Counter()
        self.attempts: Counter[str] = Counter()
        self.retries: Counter[tuple[str, str]] = Counter()
        self.retry_runs: Counter[tuple[str, str]] = Counter()
        self.retry_sleep: Counter[tuple[str, str]] = Counter()
        self.models: dict[str, Counter[str]] = {}
        self.slow: list[tuple[float, str, str, str, str]] = []
        self._outs: list[str] = []

    def add(self, node: str, run: Run) -> None:
        self.files += 1
        self.runs += 1
        self.events += len(run.lines) - run.bad
        self.bad += run.bad
        self.run_outcomes[run.outcome] += 1
        self._outs.append(run.outcome)
        if run.outcome in ("failed", "interrupted"):
            self.by_code[(run.code or 0, run.code_name)] += 1
            self.by_state[run.fail_state] += 1
        for s in run.spans:
            if s["outcome"] == "skipped":
                self.skipped[s["state"]] += 1
                continue
            self.attempts[s["state"]] += s["attempts"]
            if s["outcome"] in ("done", "failed"):
                self.dur.setdefault(s["state"], []).append(s["duration"])
            seen = set()
            for code, sleep in s["retries"]:
                key = (s["state"], code)
                self.retries[key] += 1
                self.retry_sleep[key] += sleep
                seen.add(key)
            for key in seen:
                self.retry_runs[key] += 1
        self.models.setdefault(run.facts["gpu_model"], Counter())[run.outcome] += 1
        if run.duration is not None:
            self.run_dur.append(run.duration)
            self.slow.append((run.duration, node, run.run_id, run.outcome, run.code_name))

    def end_node(self) -> None:
        self.nodes += 1
        self.node_outcomes[self._outs[-1]] += 1
        if self._outs[-1] == "done" and any(o != "done" for o in self._outs[:-1]):
            self.recovered += 1
        self._outs = []

    def to_json(self) -> dict[str, Any]:
        durations = {}
        for state, v in [*self.dur.items(), ("(run)", self.run_dur)]:
            durations[state] = {
                "count": len(v),
                "p50": _pct(v, 50),
                "p95": _pct(v, 95),
                "max": max(v) if v else None,
                "skipped": self.skipped.get(state, 0),
                "attempts": self.attempts.get(state, 0),
            }
        return {
            "files": self.files,
            "nodes": self.nodes,
            "runs": self.runs,
            "events": self.events,
            "bad_lines": self.bad,
            "recovered_nodes": self.recovered,
            "node_outcomes": dict(sorted(self.node_outcomes.items())),
            "run_outcomes": dict(sorted(self.run_outcomes.items())),
            "failures_by_code": [
                {"code": c, "code_name": n, "runs": k}
                for (c, n), k in sorted(self.by_code.items(), key=lambda x: (-x[1], x[0]))
            ],
            "failures_by_state": [
                {"state": s, "runs": k}
                for s, k in sorted(self.by_state.items(), key=lambda x: (-x[1], x[0]))
            ],
            "durations": durations,
            "slowest": [
                {"node": n, "run_id": i, "duration_s": d, "outcome": o, "code_name": c}
                for d, n, i, o, c in sorted(self.slow, reverse=True)[:10]
            ],
            "retry_hotspots": [
                {
                    "state": s,
                    "code_name": c,
                    "retries": k,
                    "runs": self.retry_runs[(s, c)],
                    "sleep_s": round(self.retry_sleep[(s, c)], 3),
                }
                for (s, c), k in sorted(self.retries.items(), key=lambda x: (-x[1], x[0]))
            ],
            "models": {m: dict(sorted(c.items())) for m, c in sorted(self.models.items())},
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    data = generate(out, a.nodes, a.seed)
    print(
        f"gen_fleet: {data['nodes']} nodes, {data['runs']} runs, {data['events']} events "
        f"in {time.monotonic() - t0:.1f} s -> {out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
