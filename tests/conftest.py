"""Shared fixtures: simulated worlds (node + loopback mirror) and in-process runs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from bootfsm.core.config_files import load_config
from bootfsm.run.runner import RunOptions, execute
from bootfsm.run.session import SessionResult
from bootfsm.sim.world import World

settings.register_profile("default", max_examples=100, deadline=None)
# `make fuzz`: one batch per property per round; tests/test_fuzz.py loops for FUZZ_SECONDS
settings.register_profile("fuzz", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

MakeWorld = Callable[..., World]


@pytest.fixture
def make_world(tmp_path: Path) -> Iterator[MakeWorld]:
    """Factory: make_world(sku, faults=(), **World kwargs) -> an entered World."""
    worlds: list[World] = []

    def make(sku: str = "gb300", faults: tuple[str, ...] = (), **kw: Any) -> World:
        w = World(tmp_path / f"world{len(worlds)}", sku, faults, **kw).__enter__()
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.__exit__(None, None, None)


def processes_naming(base: Path) -> list[int]:
    """Pids (not ours, not zombies) whose command line names a path under ``base``: the
    stand-ins, gpg-agents and other processes a test started there."""
    mine, needle, out = os.getpid(), str(base).encode(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == mine:
            continue
        with contextlib.suppress(OSError):
            stat = (d / "stat").read_text()
            if needle in (d / "cmdline").read_bytes() and stat.rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(d.name))
    return out


def run_in_process(w: World, **opts: Any) -> SessionResult:
    """Run the machine on the world's node in this process (faster than the CLI)."""
    cfg = load_config(w.config_path, required=True)
    opts.setdefault("env", w.env())
    return execute(cfg, RunOptions(root=w.root, config_path=str(w.config_path), **opts))


def installer_calls(w: World) -> list[dict[str, Any]]:
    """Install invocations of nvidia-installer (not -x or --print-recommended...)."""
    return [
        c
        for c in w.calls()
        if c["cmd"] == "nvidia-installer"
        and not {"-x", "--extract-only", "--print-recommended-kernel-module-type"} & set(c["argv"])
    ]


@contextmanager
def no_gpus(w: World) -> Iterator[None]:
    """An image build VM: nothing on the node's PCI bus while inside."""
    pci = w.root / "sys/bus/pci/devices"
    hidden = pci.with_name("devices.hidden")
    pci.rename(hidden)
    pci.mkdir()
    try:
        yield
    finally:
        pci.rmdir()
        hidden.rename(pci)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the tree once before any test (the controller, not each xdist worker).

    Every simulated command is a Python stand-in that imports bootfsm.sim; without
    ``__pycache__`` (a fresh clone, or ``PYTHONDONTWRITEBYTECODE`` set, under which no
    process writes one) each of the thousands a suite starts compiles those modules
    from source again, 10-20 ms apiece. A node's wheel install is compiled the same way.
    """
    if hasattr(session.config, "workerinput"):
        return
    import compileall

    repo = Path(__file__).resolve().parents[1]
    for tree in ("bootfsm", "states"):
        compileall.compile_dir(repo / tree, quiet=2)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """End this process's shared signing key's gpg-agent (a daemon) and remove its home:
    xdist workers end without running atexit handlers."""
    from bootfsm.sim.artifacts_signing import close_shared

    close_shared()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line when tests were skipped because the real samples are absent."""
    from tests.samples import SKIP_REASON

    skipped = terminalreporter.stats.get("skipped", [])
    n = sum(1 for report in skipped if SKIP_REASON in str(report.longrepr))
    if n:
        terminalreporter.write_line(f"{n} tests skipped: {SKIP_REASON}")
