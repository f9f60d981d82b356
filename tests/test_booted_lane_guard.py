"""The booted lane never reads green when an image's lane dies: an exception in its
thread (the Ubuntu 22.04 suite outliving its timeout did this, and the run still ended
"0 FAIL") is that image's FAIL, and a suite killed at its timeout is a FAIL naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "booted"))

import lane  # noqa: E402


def test_an_image_whose_lane_raises_is_a_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    def dies(*_: Any) -> None:
        raise subprocess.TimeoutExpired(["systemd-nspawn"], 2400)

    monkeypatch.setattr(lane, "lane", dies)
    img = lane.IMAGES[0]
    results: list[lane.Result] = []
    lane.guarded_lane(img, Path("/nonexistent"), Path("/nonexistent"), results, set())
    [r] = results
    assert (r.image, r.ok) == (img.name, False)
    assert "TimeoutExpired" in r.detail and "2400" in r.detail


def test_a_suite_killed_at_its_timeout_is_a_fail_with_its_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def hangs(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, kw["timeout"], output=b"....F..", stderr=None)

    monkeypatch.setattr(lane.subprocess, "run", hangs)
    img = next(i for i in lane.IMAGES if i.tests == "full")
    ok, out = lane.unit_tests(img, Path("/nonexistent"), Path("/nonexistent"))
    assert not ok
    assert "....F.." in out and f"killed after {lane.UNIT_TIMEOUT} s" in out
