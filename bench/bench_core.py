"""Core machine: time to fail fast, rerun on a provisioned node, CLI cold start.

Side by side with the bash path: for a permanent error it retries the whole driver
install until the CSE budget (780 s) runs out and exits 84 (facts.md).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bootfsm.sim.world import World

RUNS = 5
BASH_BUDGET_S = 780.0


def _wall(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, check=False)
    return time.perf_counter() - t0, p.returncode


def _fail_fast(label: str, sku: str, faults: tuple[str, ...], kind: str) -> tuple[str, float, int]:
    times, code = [], 0
    with tempfile.TemporaryDirectory() as d:
        for i in range(RUNS):
            with World(Path(d) / f"w{i}", sku, faults, driver_kind=kind) as w:
                t, code = _wall(w.argv(), w.env())
                times.append(t)
    return label, statistics.median(times), code


def _installer_calls(w: World) -> int:
    return sum(1 for c in w.calls() if c["cmd"] == "nvidia-installer" and "-s" in c["argv"])


def main() -> str:
    rows = [
        _fail_fast("GRID driver on arm64 (gb300)", "gb300", (), "grid"),
        _fail_fast("runfile 404 (gb300)", "gb300", ("artifact-404",), "cuda"),
    ]
    out = [
        "## Core machine (issue 2)",
        "",
        f"Wall time of a real `bootfsm run` child process on a simulated node, median of {RUNS}.",
        "",
        "| failure | bootfsm exit | bootfsm time to fail | bash path (CSE) | speed-up |",
        "|---|---|---|---|---|",
    ]
    for label, t, code in rows:
        out.append(f"| {label} | {code} | {t:.2f} s | 780 s, exit 84 | {BASH_BUDGET_S / t:,.0f}x |")
    with tempfile.TemporaryDirectory() as d, World(Path(d), "h100-hgx") as w:
        first, rc1 = _wall(w.argv(), w.env())
        calls1 = _installer_calls(w)
        reruns = []
        for _ in range(RUNS):
            t, _ = _wall(w.argv(), w.env())
            reruns.append(t)
        calls2 = _installer_calls(w) - calls1
    out += [
        "",
        "| h100-hgx (simulated, 0.05 s DKMS build) | wall | installer calls |",
        "|---|---|---|",
        f"| first boot | {first:.2f} s (exit {rc1}) | {calls1} |",
        f"| rerun on the provisioned node, median of {RUNS} | {statistics.median(reruns):.2f} s | "
        f"{calls2} |",
        "",
        "The bash path reruns the whole install (about 100 s of DKMS compile on a real node).",
    ]
    exe = [sys.executable, "-m", "bootfsm"]
    cold = [_wall([*exe, "codes"])[0] for _ in range(10)]
    help_ = [_wall([*exe, "--help"])[0] for _ in range(10)]
    bare = [_wall([sys.executable, "-c", "pass"])[0] for _ in range(10)]
    out += [
        "",
        "| CLI cold start, median of 10 | wall |",
        "|---|---|",
        f"| `python3 -c pass` (interpreter alone) | {statistics.median(bare) * 1000:.0f} ms |",
        f"| `bootfsm --help` | {statistics.median(help_) * 1000:.0f} ms |",
        f"| `bootfsm codes` | {statistics.median(cold) * 1000:.0f} ms |",
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(main())
