"""Which writes of a boot are fsynced: what must survive a power loss is, and what is
checked when read and rebuilt when lost (a transition's checkpoint, a cache sidecar,
the copy of the runfile made to be executed now, gpgv's inputs, the metrics file) is
not. Every fsync of a simulated boot is recorded by the path of its descriptor."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeWorld, run_in_process


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The path of every descriptor os.fsync is called on in this process."""
    seen: list[str] = []
    real = os.fsync

    def record(fd: Any) -> None:
        n = fd if isinstance(fd, int) else fd.fileno()
        seen.append(os.readlink(f"/proc/self/fd/{n}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    yield seen


def _kinds(paths: list[str], root: Path) -> Counter[str]:
    out: Counter[str] = Counter()
    for p in paths:
        name = p.rsplit("/", 1)[-1]
        if name.startswith(".checkpoint.json."):
            out["checkpoint"] += 1
        elif name.endswith(".sha256.tmp") or ".sha256." in name:
            out["sidecar"] += 1
        elif ".run." in name and "/extract/" in p:
            out["runfile copy"] += 1
        elif "/gpgv/" in p and name.startswith("."):
            out["gpgv input"] += 1
        elif ".bootfsm.prom." in name:
            out["metrics"] += 1
        elif name == "installed.jsonl":
            out["install record"] += 1
        elif name.startswith("run-") and name.endswith(".jsonl"):
            out["journal"] += 1
    return out


def test_a_boot_fsyncs_what_must_survive_and_nothing_rebuilt(
    make_world: MakeWorld, fsynced: list[str]
) -> None:
    w = make_world("h100-hgx")
    assert run_in_process(w).outcome.ok
    kinds = _kinds(fsynced, w.root)
    assert kinds["checkpoint"] == 1  # the run's last one only, of 8
    assert kinds["sidecar"] == kinds["runfile copy"] == kinds["gpgv input"] == 0
    assert kinds["metrics"] == 0
    assert kinds["install record"] >= 10  # every record appended is durable
    assert kinds["journal"] >= 5  # run.start, state boundaries, run.end
    # the fabric manager archive's files: recorded in one append, each directory fsynced
    # once after all of its files (four topologies in one directory)
    nvswitch = w.root / "usr/share/nvidia/nvswitch"
    assert len(list(nvswitch.iterdir())) >= 4
    assert fsynced.count(str(nvswitch)) == 1
    lines = (w.root / "var/lib/bootfsm/installed.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines[1:]]  # after the header
    archive = [r for r in records if r["kind"] in ("file", "link") and r.get("by") != "driver"]
    archive = [r for r in archive if r["path"].startswith(("/usr/", "/lib/"))]
    assert len(archive) >= 10
    # one fsync per append: the archive's records took one, the packages of the one
    # `dpkg -i` one (the four toolkit debs), every other record its own
    packages = [r for r in records if r["kind"] == "package"]
    assert len(packages) == 4
    assert kinds["install record"] <= len(records) - len(archive) + 1 - len(packages) + 1
    cp = json.loads((w.root / "var/lib/bootfsm/checkpoint.json").read_text())
    assert cp["outcome"] == "done"  # the non-durable writes were still made, atomically
    cache = w.root / "var/cache/bootfsm"
    assert list(cache.rglob("*.sha256")), "the sidecars are written, just not fsynced"


def test_fetch_fsync_makes_the_sidecars_durable_too(
    make_world: MakeWorld, fsynced: list[str]
) -> None:
    w = make_world("h100-hgx", config_overrides={"fetch": {"fsync": True}})
    assert run_in_process(w).outcome.ok
    sidecars = _kinds(fsynced, w.root)["sidecar"]
    assert sidecars == len(list((w.root / "var/cache/bootfsm").rglob("*.sha256")))
