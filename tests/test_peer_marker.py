"""The bash path's prebake marker (/opt/azure/aks-gpu/dkms-marker): bootfsm reads it
(an image baked by AgentBaker/aks-gpu boots on bootfsm without a rebuild when it
matches) and, with bake.write_peer_marker, writes it.

The peer's format, read from Azure/aks-gpu install.sh (``write_dkms_marker``): four
lines ``kernel=$(uname -r)``, ``driver_version=``, ``driver_kind=`` (cuda or grid),
``arch=$(uname -m)``, no comment; readers take the first line of a key (``sed -n
's/^key=//p' | head -n1``). AgentBaker's parked images append
``dkms_registration=parked-v1``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.config_files import load_config
from bootfsm.image.bake import BakeOptions, BakeResult, bake
from bootfsm.install.marker import (
    PEER_MARKER,
    check_marker,
    parse_peer_marker,
    render_peer_marker,
    required_module_type,
)
from bootfsm.run.session import SessionResult
from bootfsm.sim.node import simulate_reboot
from bootfsm.sim.world import DRIVER_VERSION, World
from tests.conftest import MakeWorld, installer_calls, no_gpus, run_in_process

KERNEL = "5.15.0-1089-azure"  # the h100-pcie SKU's kernel
OWN = "var/lib/bootfsm/bake.marker"
PEER = PEER_MARKER.lstrip("/")
# what aks-gpu's write_dkms_marker leaves for this node (by hand, in its order)
AKS_GPU_TEXT = f"kernel={KERNEL}\ndriver_version={DRIVER_VERSION}\ndriver_kind=cuda\narch=x86_64\n"


def test_parse_the_peer_format() -> None:
    m = parse_peer_marker(AKS_GPU_TEXT + "dkms_registration=parked-v1\n")
    assert (m.kernel, m.driver_version, m.driver_kind, m.arch) == (
        KERNEL, DRIVER_VERSION, "cuda", "x86_64",
    )  # fmt: skip
    assert (m.source, m.module_type, m.runfile_sha256) == ("aks-gpu", "", "")


def test_first_line_of_a_key_wins_as_sed_head_does() -> None:
    m = parse_peer_marker(AKS_GPU_TEXT + "driver_kind=grid\n")
    assert m.driver_kind == "cuda"


@pytest.mark.parametrize(
    "text", ["", "kernel=x\n", "garbage line\n", f"kernel={KERNEL}\ndriver_kind=cuda\narch=x\n"]
)
def test_garbage_or_incomplete_peer_marker_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_peer_marker(text)


def test_render_is_exactly_the_four_lines() -> None:
    assert render_peer_marker(parse_peer_marker(AKS_GPU_TEXT)) == AKS_GPU_TEXT


def test_a_typeless_marker_leaves_the_type_to_the_module() -> None:
    m = parse_peer_marker(AKS_GPU_TEXT)
    want = m.__class__(**{**m.__dict__, "module_type": "auto", "source": "bake"})
    assert check_marker(m, want, needs_open=True) == []
    assert required_module_type("auto", needs_open=True) == "open"
    assert required_module_type("auto", needs_open=False) == ""
    assert required_module_type("proprietary", needs_open=False) == "proprietary"


def _bake(w: World) -> BakeResult:
    cfg = load_config(w.config_path, required=True)
    return bake(cfg, BakeOptions(root=w.root, env=w.env()))


def _events(result: SessionResult, name: str) -> list[dict[str, Any]]:
    assert result.journal is not None
    return [
        e for e in map(json.loads, result.journal.read_text().splitlines()) if e["event"] == name
    ]


def _peer_baked_image(make_world: MakeWorld, **kw: Any) -> World:
    """An image as aks-gpu's build-only mode leaves it: the DKMS-built module (the same
    nvidia-installer --dkms build) and only the peer's marker."""
    w = make_world("h100-pcie", config_overrides={"bake": {"write_peer_marker": True}}, **kw)
    with no_gpus(w):
        assert _bake(w).ok
    assert (w.root / PEER).read_text() == AKS_GPU_TEXT
    (w.root / OWN).unlink()
    simulate_reboot(w.root)
    return w


def test_an_image_baked_by_the_peer_boots_without_a_rebuild(make_world: MakeWorld) -> None:
    w = _peer_baked_image(make_world)
    n = len(installer_calls(w))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert len(installer_calls(w)) == n  # no compile
    [decision] = _events(result, "driver.prebaked")
    assert decision["match"] is True and decision["build"] is False
    assert decision["marker"]["source"] == "aks-gpu"


def test_a_peer_marker_for_another_kind_rebuilds(make_world: MakeWorld) -> None:
    w = _peer_baked_image(make_world)
    (w.root / PEER).write_text(AKS_GPU_TEXT.replace("driver_kind=cuda", "driver_kind=grid"))
    n = len(installer_calls(w))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert len(installer_calls(w)) == n + 1
    [decision] = _events(result, "driver.prebaked")
    assert (decision["match"], decision["field"]) == (False, "driver_kind")


def test_reading_the_peer_marker_can_be_switched_off(make_world: MakeWorld) -> None:
    w = _peer_baked_image(make_world)
    w.config_overrides = {"bake": {"read_peer_marker": False}}
    w.write_config()
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [decision] = _events(result, "driver.prebaked")
    assert decision["field"] == "marker"  # no marker of its own: the peer's is not read


def test_peer_marker_not_written_by_default(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    with no_gpus(w):
        assert _bake(w).ok
    assert (w.root / OWN).exists() and not (w.root / PEER).exists()


def test_a_boot_compile_writes_the_peer_marker_when_configured(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", config_overrides={"bake": {"write_peer_marker": True}})
    assert run_in_process(w).outcome.ok
    assert Path(w.root / PEER).read_text() == AKS_GPU_TEXT
