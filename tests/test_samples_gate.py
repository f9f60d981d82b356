"""The real samples gate: skipped with one summary line outside CI, a failure on CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# A test file that reads real captures and needs nothing else.
TARGET = "tests/parsers/test_parse_vmsize.py"


def _pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "PYTEST_XDIST_WORKER"}}
    env["BOOTFSM_SAMPLES"] = str(tmp_path / "no-samples-here")
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", TARGET],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_outside_ci_missing_samples_skip_with_one_summary_line(tmp_path: Path) -> None:
    """A developer without shared/ gets skips and one line saying how many and why."""
    r = _pytest(tmp_path, ci=None)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.endswith("tests skipped: samples absent")]
    assert len(lines) == 1, r.stdout
    assert int(lines[0].split()[0]) > 0


@pytest.mark.parametrize("ci", ["true", "1"])
def test_on_ci_missing_samples_fail_the_run(tmp_path: Path, ci: str) -> None:
    """CI=true turns every missing sample into a failure naming the sample."""
    r = _pytest(tmp_path, ci=ci)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "samples absent" in r.stdout
    assert "failed" in r.stdout.splitlines()[-1]
