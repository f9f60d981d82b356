"""Locate the shared real-world samples; tests skip when they are absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["SAMPLES", "sample", "sample_bytes"]


def _samples_dir() -> Path:
    """`<repo>/../shared/reference/samples`, else $BOOTFSM_SAMPLES."""
    beside = Path(__file__).resolve().parents[2] / "shared" / "reference" / "samples"
    override = os.environ.get("BOOTFSM_SAMPLES")
    if not beside.is_dir() and override:
        return Path(override)
    return beside


SAMPLES = _samples_dir()


def sample_bytes(relpath: str) -> bytes:
    """Read one sample byte-for-byte, skipping the test when the samples are absent."""
    path = SAMPLES / relpath
    if not path.is_file():
        pytest.skip(f"sample {relpath} not found under {SAMPLES}")
    return path.read_bytes()


def sample(relpath: str) -> str:
    """Read one sample as UTF-8 text, skipping the test when the samples are absent."""
    return sample_bytes(relpath).decode("utf-8")
