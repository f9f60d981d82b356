"""Initialization order as the real stack needs it, read from the stand-ins' call log.

Driver: module loaded (nvidia-modprobe), libraries in place, ldconfig, then nvidia-smi.
Runtime: toolkit installed, containerd drop-in, udev rule, /dev/char symlinks, then the
CDI refresh (and only then kubelet). A failed CDI refresh ends the run with 92.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.config_files import load_config
from bootfsm.image.bake import BakeOptions, bake
from bootfsm.run.session import SessionResult
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, installer_calls, run_in_process

CDI_UNIT = """\
[Unit]
Description=Refresh NVIDIA CDI specification file
ConditionPathExists=/usr/bin/nvidia-smi

[Service]
Type=oneshot
ExecStart=/usr/bin/nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml

[Install]
WantedBy=multi-user.target
"""


def _index(calls: list[dict[str, Any]], cmd: str, argv: list[str] | None = None) -> int:
    """Index of the first call of ``cmd`` (whose argv starts with ``argv``)."""
    for i, c in enumerate(calls):
        if c["cmd"] == cmd and (argv is None or c["argv"][: len(argv)] == argv):
            return i
    raise AssertionError(f"{cmd} {argv or ''} was never called")


def _assert_driver_order(w: World, calls: list[dict[str, Any]]) -> None:
    load = _index(calls, "nvidia-modprobe", ["-u", "-c0"])
    ldconfig = _index(calls, "ldconfig")
    smi = _index(calls, "nvidia-smi", [])
    plain_smi = next(i for i, c in enumerate(calls) if c["cmd"] == "nvidia-smi" and not c["argv"])
    assert load < ldconfig < plain_smi, [c["cmd"] for c in calls]
    assert smi == plain_smi < _index(calls, "nvidia-smi", ["-q", "-x"])  # before verify asks
    cache = (w.root / "etc/ld.so.cache").read_text()
    assert "libnvidia-ml.so.1" in cache  # the libraries were in place when ldconfig ran


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, SessionResult]]:
    """One fresh h100-pcie node booted end to end (shared by the order tests)."""
    with World(tmp_path_factory.mktemp("order"), "h100-pcie") as w:
        yield w, run_in_process(w)


def test_driver_initialization_order_on_a_fresh_node(booted: tuple[World, SessionResult]) -> None:
    w, result = booted
    assert result.outcome.ok, result.outcome.message
    calls = w.calls()
    [install] = installer_calls(w)
    assert calls.index(install) < _index(calls, "nvidia-modprobe")
    _assert_driver_order(w, calls)


def test_container_runtime_order(booted: tuple[World, SessionResult]) -> None:
    w, result = booted
    assert result.outcome.ok, result.outcome.message
    calls = w.calls()
    toolkit = _index(calls, "dpkg", ["-i", "--force-overwrite"])
    symlinks = _index(calls, "nvidia-ctk", ["system", "create-dev-char-symlinks"])
    cdi = _index(calls, "nvidia-ctk", ["cdi", "generate"])
    kubelet = _index(calls, "systemctl", ["start", "kubelet.service"])
    assert toolkit < symlinks < cdi < kubelet
    assert calls[cdi]["argv"][2] == f"--output={w.root / 'etc/cdi/nvidia.yaml'}"
    dpkg_done = calls[toolkit]["t"] + calls[toolkit]["dt"]
    dropin = (w.root / "etc/containerd/config.d/10-nvidia-runtime.toml").stat().st_mtime
    udev = (w.root / "etc/udev/rules.d/71-nvidia-dev-char.rules").stat().st_mtime
    assert dpkg_done < dropin <= udev <= calls[symlinks]["t"]
    assert "kind: nvidia.com/gpu" in (w.root / "etc/cdi/nvidia.yaml").read_text()


def test_prebaked_boot_keeps_the_order_and_cdi_can_be_switched_off(
    make_world: MakeWorld,
) -> None:
    w = make_world("h100-pcie", config_overrides={"join": {"cdi_refresh": False}})
    cfg = load_config(w.config_path, required=True)
    assert bake(cfg, BakeOptions(root=w.root, env=w.env())).ok
    n = len(w.calls())
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    calls = w.calls()[n:]
    assert [c for c in calls if c["cmd"] == "nvidia-installer"] == []
    assert _index(calls, "modinfo") < _index(calls, "nvidia-modprobe")  # decided, then loaded
    _assert_driver_order(w, calls)
    assert [c for c in calls if c["cmd"] == "nvidia-ctk" and "cdi" in c["argv"]] == []


def test_cdi_refresh_uses_the_toolkit_unit_when_installed(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    (w.root / "lib/systemd/system/nvidia-cdi-refresh.service").write_text(CDI_UNIT)
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    calls = w.calls()
    symlinks = _index(calls, "nvidia-ctk", ["system", "create-dev-char-symlinks"])
    reset = _index(
        calls,
        "systemctl",
        ["reset-failed", "nvidia-cdi-refresh.service", "nvidia-cdi-refresh.path"],
    )
    restart = _index(calls, "systemctl", ["restart", "nvidia-cdi-refresh.service"])
    assert symlinks < reset < restart < _index(calls, "systemctl", ["start", "kubelet.service"])
    assert [c for c in calls if c["cmd"] == "nvidia-ctk" and "cdi" in c["argv"]] == []


@pytest.mark.parametrize("path", ["nvidia-ctk", "unit"])
def test_failed_cdi_refresh_fails_the_run_with_92(make_world: MakeWorld, path: str) -> None:
    w = make_world("h100-pcie", ("cdi-fails",))
    if path == "unit":
        (w.root / "lib/systemd/system/nvidia-cdi-refresh.service").write_text(CDI_UNIT)
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.CDI_REFRESH_FAILED, "join")
    assert "CDI refresh" in result.outcome.message
    assert not (w.root / "var/lib/bootfsm/ready").exists()
    assert [c for c in w.calls() if c["argv"][:2] == ["start", "kubelet.service"]] == []
    assert result.journal is not None
    failed = [
        e
        for e in map(json.loads, Path(result.journal).read_text().splitlines())
        if e["event"] == "state.failed"
    ]
    assert [(e["state"], e["code"]) for e in failed] == [("join", 92)]
