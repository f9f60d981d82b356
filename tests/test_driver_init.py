"""The driver state on real tool behaviour (issue 11 items 1, 4, 5, 11; issue 10 item 5).

Module type from the installer's one-word answer; per-boot init even when the module is
already loaded; the toolkit after the driver's libraries; an upgrade in place that
unloads what bootfsm itself loaded; a bounded, journaled wait for nvidia-smi.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.hardware import model_for
from bootfsm.install.driver_steps import fallback_module_type, parse_module_type
from bootfsm.run.session import SessionResult
from bootfsm.sim.node import simulate_reboot
from bootfsm.sim.skus import STALE_DRIVER_VERSION
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, installer_calls, run_in_process
from tests.samples import sample

INSTALLER_SAMPLE = "installer/nvidia-run_help_info_advanced_excerpts.txt"


def _events(result: SessionResult, name: str) -> list[dict[str, Any]]:
    assert result.journal is not None
    lines = Path(result.journal).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _index(calls: list[dict[str, Any]], cmd: str, argv: list[str] | None = None) -> int:
    for i, c in enumerate(calls):
        if c["cmd"] == cmd and (argv is None or c["argv"][: len(argv)] == argv):
            return i
    raise AssertionError(f"{cmd} {argv or ''} was never called")


# ------------------------------------------------------------------ 1. module type


def test_module_type_is_the_installers_one_word() -> None:
    # nvidia-installer's print_module_type prints the word alone (the sample says so
    # beside the driver-container trace line it quotes, "kernel_module_type=open")
    text = sample(INSTALLER_SAMPLE)
    assert "prints one word, `open` or `proprietary`" in text
    assert parse_module_type("open\n") == "open"
    assert parse_module_type("proprietary\n") == "proprietary"
    trace = next(ln for ln in text.splitlines() if ln.startswith("kernel_module_type="))
    assert parse_module_type(trace) == "open"  # the shell trace form still reads
    assert parse_module_type("") is None
    assert parse_module_type("ERROR: Invalid commandline\n") is None
    assert parse_module_type("opensource\n") is None


def test_fallback_when_the_query_fails() -> None:
    h100, b200 = model_for(0x2330), model_for(0x2901)
    assert fallback_module_type("570.211.01", [h100]) == "open"  # >= 560: open by default
    assert fallback_module_type("560.35.03", [h100]) == "open"
    assert fallback_module_type("550.90.07", [h100]) == "proprietary"
    assert fallback_module_type("550.90.07", [b200]) == "open"  # Blackwell needs it


def test_hopper_node_gets_the_recommended_open_module(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [install] = installer_calls(w)
    assert "--kernel-module-type=open" in install["argv"]
    [chosen] = _events(result, "driver.module_type")
    assert (chosen["module_type"], chosen["source"]) == ("open", "installer")
    assert "Open Kernel Module" in (w.root / "proc/driver/nvidia/version").read_text()


# ------------------------------------------------ 4. per-boot init, 5. toolkit order


def test_udev_loaded_module_still_gets_the_per_boot_init(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok
    simulate_reboot(w.root)  # boot loads the DKMS module (udev); nothing else
    assert (w.root / "sys/module/nvidia/version").exists()
    assert not (w.root / "dev/nvidia-uvm").exists()
    n = len(w.calls())
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    calls = w.calls()[n:]
    assert installer_calls(w)[1:] == []  # nothing compiled
    load = _index(calls, "nvidia-modprobe", ["-u", "-c0"])
    assert load < _index(calls, "ldconfig") < _index(calls, "nvidia-smi", [])
    assert _index(calls, "nvidia-ctk", ["cdi", "generate"]) > load  # the spec sees uvm
    assert (w.root / "dev/nvidia-uvm").exists() and (w.root / "sys/module/nvidia_uvm").exists()
    skipped = {e["state"] for e in _events(result, "state.skip")}
    assert "driver" not in skipped and "join" not in skipped


def test_toolkit_goes_after_the_driver_libraries(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok
    calls = w.calls()
    toolkit = _index(calls, "dpkg", ["-i", "--force-overwrite"])
    assert calls.index(installer_calls(w)[0]) < _index(calls, "ldconfig") < toolkit
    assert _index(calls, "nvidia-smi", []) < toolkit


# ------------------------------------------------------------ 11. upgrade in place


def test_upgrade_in_place_unloads_what_bootfsm_loaded(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("stale-driver",))
    w.config_overrides = {"driver": {"install": False}}  # first: run the image's old driver
    w.write_config()
    first = run_in_process(w)
    assert (w.root / "sys/module/nvidia_uvm").exists()  # bootfsm's nvidia-modprobe -u
    assert (w.root / "run/bootfsm/driver-loaded").read_text().splitlines() == ["nvidia_uvm"], (
        first.outcome.message
    )
    w.config_overrides = {}
    w.write_config()
    n = len(w.calls())
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    removed = [c["argv"] for c in w.calls()[n:] if c["cmd"] == "modprobe"]
    # modprobe(8) -r: nvidia, unused once nvidia_uvm and bootfsm's persistence daemon are
    # gone, leaves with it, so no `modprobe -r nvidia` is left to run
    assert removed[:1] == [["-r", "nvidia_uvm"]] and ["-r", "nvidia"] not in removed
    assert (w.root / "sys/module/nvidia/version").read_text().strip() != STALE_DRIVER_VERSION


def test_a_module_someone_else_loaded_still_means_reboot(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("stale-driver",))
    uvm = w.root / "sys/module/nvidia_uvm"  # loaded by someone else: not in bootfsm's record
    uvm.mkdir(parents=True)
    (w.root / "sys/module/nvidia/holders").mkdir(parents=True, exist_ok=True)
    (w.root / "sys/module/nvidia/holders/nvidia_uvm").write_text("")
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.REBOOT_REQUIRED, "driver")
    assert "held by nvidia_uvm" in result.outcome.message
    assert ["-r", "nvidia_uvm"] not in [c["argv"] for c in w.calls() if c["cmd"] == "modprobe"]


# --------------------------------------------------- issue 10 item 5: bounded wait


def _flaky_smi(w: World, failures: int) -> Path:
    """nvidia-smi that fails like a driver still coming up, ``failures`` times."""
    real = w.bin_dir / "nvidia-smi"
    shim_dir = w.base / "shim-smi"
    shim_dir.mkdir(exist_ok=True)
    count = shim_dir / "count"
    count.write_text("0")
    script = shim_dir / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        f"p = {str(count)!r}\n"
        "n = int(open(p).read()); open(p, 'w').write(str(n + 1))\n"
        f"if sys.argv[1:] == [] and n < {failures}:\n"
        "    print('NVIDIA-SMI has failed because it couldn\\'t communicate with the NVIDIA"
        " driver. Make sure that the latest NVIDIA driver is installed and running.')\n"
        "    sys.exit(9)\n"
        f"os.execv({str(real)!r}, [{str(real)!r}, *sys.argv[1:]])\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return shim_dir


@pytest.mark.parametrize(("failures", "limit", "ok"), [(2, 10.0, True), (50, 3.0, False)])
def test_post_load_nvidia_smi_wait_is_bounded_and_journaled(
    make_world: MakeWorld, failures: int, limit: float, ok: bool
) -> None:
    w = make_world("h100-pcie", config_overrides={"driver": {"smi_wait": limit}})
    env = w.env()
    env["PATH"] = f"{_flaky_smi(w, failures)}{os.pathsep}{env['PATH']}"
    w.env = lambda: env  # type: ignore[method-assign]  # run_in_process reads w.env()
    result = run_in_process(w)
    [wait] = _events(result, "driver.smi_wait")
    assert wait["limit_s"] == limit
    if ok:
        assert result.outcome.ok, result.outcome.message
        assert (wait["answered"], wait["failures"]) == (True, failures)
    else:
        assert (result.outcome.code, result.outcome.state) == (Code.DRIVER_NOT_STARTED, "driver")
        assert "driver.smi_wait = 3 s" in result.outcome.message
        assert wait["answered"] is False and 2.5 <= wait["waited_s"] <= 10


@pytest.mark.parametrize(("proc_kind", "final"), [("proprietary", True), ("open", False)])
def test_no_devices_after_a_proprietary_build_on_blackwell_is_final(
    tmp_path: Path, proc_kind: str, final: bool
) -> None:
    """The post-load check does not retry `No devices were found` when the proprietary
    module is loaded on a Blackwell GPU: WRONG_MODULE_TYPE (62) at once."""
    from bootfsm.core.errors import BootError
    from bootfsm.install.driver_init import _smi_answers
    from tests.test_verify import OPEN, PROPRIETARY, Node

    node = Node(tmp_path, "x86_64", 0x2901, 8)
    node._script("nvidia-smi", "import sys\nprint('No devices were found')\nsys.exit(6)")
    (node.root / "proc/driver/nvidia").mkdir(parents=True)
    proc = PROPRIETARY if proc_kind == "proprietary" else OPEN
    (node.root / "proc/driver/nvidia/version").write_text(proc)
    node.ctx.state = "driver"
    seen: list[str] = []
    if final:
        with pytest.raises(BootError) as err:
            _smi_answers(node.ctx, seen)
        assert err.value.code.name == "WRONG_MODULE_TYPE"
        assert "needs the open kernel modules" in err.value.message
    else:
        assert _smi_answers(node.ctx, seen) is None and "exit 6" in seen[0]
