"""The simulator's nvidia-persistenced, as the runfile installs it: the real daemon's
grammar (NVIDIA/nvidia-persistenced options.c), its failure line without devices, and
Type=forking behaviour (parent exits 0, the daemon keeps running with its pid file)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tests.conftest import MakeWorld, run_in_process


def _run(path: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([path, *argv], capture_output=True, text=True, timeout=30, check=False)


def test_persistenced_standin(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok
    daemon = str(w.root / "usr/bin/nvidia-persistenced")
    bad = _run(daemon, "--bogus")
    assert bad.returncode == 0  # as options.c: exit(EXIT_SUCCESS) after the error
    assert "ERROR: Invalid commandline, please run `nvidia-persistenced --help`" in bad.stderr
    pidfile = w.root / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
    ok = _run(daemon, "--verbose")
    assert ok.returncode == 0, ok.stderr
    for _ in range(100):
        if pidfile.exists():
            break
        time.sleep(0.05)
    pid = int(pidfile.read_text())
    os.kill(pid, 0)  # alive after the parent returned
    os.kill(pid, signal.SIGTERM)
    (w.root / "dev/nvidiactl").unlink()
    fail = _run(daemon, "--verbose")
    assert fail.returncode == 1
    failed = "nvidia-persistenced failed to initialize. Check syslog for more details.\n"
    assert fail.stderr == failed
