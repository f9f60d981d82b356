"""Locate the shared real-world samples.

The samples are read where they are (``$BOOTFSM_SAMPLES`` when set, else
``<repo>/../shared/reference/samples``), never copied into the project. Outside CI a
test that needs a missing sample is skipped, and the run ends with one summary line
(``N tests skipped: samples absent``). On CI (``CI=true``) a missing sample fails the
test instead: a CI run that cannot see the real captures proves nothing about them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

__all__ = ["SAMPLES", "SKIP_REASON", "on_ci", "real_tool", "sample", "sample_bytes"]

SKIP_REASON = "samples absent"


def _samples_dir() -> Path:
    """$BOOTFSM_SAMPLES when set, else `<repo>/../shared/reference/samples`."""
    override = os.environ.get("BOOTFSM_SAMPLES")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "shared" / "reference" / "samples"


SAMPLES = _samples_dir()


def on_ci() -> bool:
    """True on a CI run (CI=true, as CI sets it)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def real_tool(name: str) -> str:
    """The path of a real tool (PATH, then /usr/sbin and /sbin); skip (fail on CI, where
    make deps installs it) when it is absent."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        if on_ci():
            pytest.fail(f"{name} is not installed (make deps)", pytrace=False)
        pytest.skip(f"{name} is not installed (make deps)")
    return found


def sample_bytes(relpath: str) -> bytes:
    """Read one sample byte-for-byte; skip (fail on CI) when it is absent."""
    path = SAMPLES / relpath
    if not path.is_file():
        message = f"{SKIP_REASON}: {relpath} not found under {SAMPLES}"
        if on_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path.read_bytes()


def sample(relpath: str) -> str:
    """Read one sample as UTF-8 text; skip (fail on CI) when it is absent."""
    return sample_bytes(relpath).decode("utf-8")
