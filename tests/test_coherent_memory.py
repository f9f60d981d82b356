"""Grace's coherent GPU memory mode (issue 31 item 7).

On Grace Hopper and Grace Blackwell with a 580 or later driver, ``options nvidia
NVreg_CoherentGPUMemoryMode=driver`` goes to modprobe.d before the module loads (as
NVIDIA's driver container, AgentBaker's GB image and the EKS AMI set it) and the loaded
module must show it in /proc/driver/nvidia/params; a real 580.159.04 module without it
prints ``CoherentGPUMemoryMode: ""`` (tests/captures/h200_580.159.04/kernel.txt).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.parsers.driver_info import parse_nvidia_params
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, installer_calls, no_gpus, run_in_process
from tests.test_bake import _bake

CAPTURE = Path(__file__).parent / "captures/h200_580.159.04/kernel.txt"
CONF = "etc/modprobe.d/nvidia-coherent-memory.conf"
R580 = "580.95.05"


def _params(w: World) -> dict[str, str]:
    return parse_nvidia_params((w.root / "proc/driver/nvidia/params").read_text())


def _index(calls: list[dict[str, Any]], cmd: str, *argv: str) -> int:
    return next(i for i, c in enumerate(calls) if c["cmd"] == cmd and c["argv"][: len(argv)] ==
                list(argv))  # fmt: skip


def test_the_real_params_file_reads() -> None:
    text = CAPTURE.read_text().split("== /proc/driver/nvidia/params\n")[1].split("\n== ")[0]
    params = parse_nvidia_params(text)
    assert len(params) == 42  # 42 lines in the capture, first and last below
    assert params["ResmanDebugLevel"] == "4294967295"
    assert params["CoherentGPUMemoryMode"] == ""  # an H200 loaded without the option
    assert params["ImexChannelCount"] == "2048"
    assert params["ExcludedGpus"] == ""


def test_grace_with_580_gets_the_mode_before_the_load_and_it_is_taken(
    make_world: MakeWorld,
) -> None:
    w = make_world("gb200", driver_version=R580)
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    conf = (w.root / CONF).read_text()
    assert "options nvidia NVreg_CoherentGPUMemoryMode=driver\n" in conf
    assert _params(w)["CoherentGPUMemoryMode"] == "driver"
    calls = w.calls()
    load = _index(calls, "nvidia-modprobe", "-u", "-c0")
    assert _index(calls, "update-initramfs", "-u") < calls.index(installer_calls(w)[0]) < load


@pytest.mark.parametrize(("sku", "version"), [("gb200", "570.211.01"), ("h100-pcie", R580)])
def test_not_grace_or_before_580_nothing_is_written(
    make_world: MakeWorld, sku: str, version: str
) -> None:
    w = make_world(sku, driver_version=version)
    assert run_in_process(w).outcome.ok
    assert not (w.root / CONF).exists()


def test_a_module_loaded_without_the_mode_is_reloaded(make_world: MakeWorld) -> None:
    w = make_world("gb200", driver_version=R580)
    w.config_overrides = {"driver": {"coherent_memory_mode": ""}}  # first: left alone
    w.write_config()
    assert run_in_process(w).outcome.ok
    assert _params(w)["CoherentGPUMemoryMode"] == "" and not (w.root / CONF).exists()
    w.config_overrides = {}
    w.write_config()
    n = len(w.calls())
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert _params(w)["CoherentGPUMemoryMode"] == "driver"
    assert len(installer_calls(w)) == 1  # reloaded, not rebuilt
    calls = w.calls()[n:]
    assert _index(calls, "modprobe", "-r", "nvidia_uvm") < _index(calls, "nvidia-modprobe")


def test_a_load_that_does_not_take_the_mode_ends_63(make_world: MakeWorld) -> None:
    w = make_world("gb200", driver_version=R580)
    # a later modprobe.d file that sets the option to nothing (modprobe reads files in
    # name order; the last assignment wins)
    (w.root / "etc/modprobe.d/zz-site.conf").write_text(
        "options nvidia NVreg_CoherentGPUMemoryMode=\n"
    )
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (
        Code.COHERENT_MEMORY_MODE_NOT_APPLIED,
        "driver",
    )
    assert 'CoherentGPUMemoryMode: ""' in result.outcome.message


def test_the_bake_of_an_arm64_image_writes_it_for_the_images_kernel(
    make_world: MakeWorld,
) -> None:
    w = make_world("gb200", driver_version=R580)
    with no_gpus(w):
        baked = _bake(w)
    assert baked.ok, baked.message
    assert "coherent" in baked.changed
    assert (w.root / CONF).exists()
    kernel = (w.root / "proc/sys/kernel/osrelease").read_text().strip()
    initramfs = [c["argv"] for c in w.calls() if c["cmd"] == "update-initramfs"]
    assert ["-u", "-k", kernel] in initramfs
