"""Kernel module types by GPU generation and by driver branch (issue 31 items 5 and 6).

Item 5: the open modules need the GSP that Turing introduced (NVIDIA driver README,
"Open Linux Kernel Modules"; open-gpu-kernel-modules refuses the probe of an older GPU:
"... is not supported by open nvidia.ko because it does not include the required GPU
System Processor (GSP)"). V100 and P100 get the proprietary modules on every path.

Item 6: the installer's option that picks the type depends on its branch: -M /
--kernel-module-type (and --print-recommended-kernel-module-type) from 560 on (the 575
--advanced-options in samples/installer lists them beside the deprecated -m;
NVIDIA/gpu-driver-container PR #182: "only available from R560 onwards"), -m with the
module source directory (kernel-open or kernel) from 515, as NVIDIA's driver container
passes it, so AKS's GRID 535 and 550 tracks build.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.hardware import (
    TURING_FIRST_DEVICE_ID,
    Family,
    model_for,
    requires_proprietary_module,
)
from bootfsm.install.driver_steps import fallback_module_type, installer_module_args
from bootfsm.install.marker import Marker, check_marker, required_module_type
from tests.conftest import MakeWorld, installer_calls, no_gpus, run_in_process
from tests.samples import on_ci, sample
from tests.test_bake import _bake, _events

PCI_IDS = (Path("/usr/share/misc/pci.ids"), Path("/usr/share/hwdata/pci.ids"))
INSTALLER_SAMPLE = "installer/nvidia-run_help_info_advanced_excerpts.txt"
_CHIP = re.compile(r"(GK|GM|GP|GV|TU|GA|AD|GH|GB)\d{3}\w*")


def _nvidia_gpus() -> list[tuple[int, str]]:
    """(device id, name) of every NVIDIA GPU chip in the system's pci.ids."""
    path = next((p for p in PCI_IDS if p.exists()), None)
    if path is None:
        if on_ci():
            pytest.fail("pci.ids is not installed (Makefile deps: pciutils)", pytrace=False)
        pytest.skip("pci.ids is not installed")
    out, inside = [], False
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("10de "):
            inside = True
        elif inside and line and not line.startswith(("\t", "#")):
            break
        elif inside and line.startswith("\t") and not line.startswith("\t\t"):
            dev, name = line.strip().split(None, 1)
            if _CHIP.match(name) and not re.search(r"Audio|USB|UCSI|NVSwitch|Bridge", name):
                out.append((int(dev, 16), name))
    return out


# ---------------------------------------------------------------- 5. generations


def test_every_pre_turing_gpu_in_pci_ids_is_below_the_turing_line() -> None:
    gpus = _nvidia_gpus()
    older = [(d, n) for d, n in gpus if n.startswith(("GK", "GM", "GP", "GV"))]
    newer = [(d, n) for d, n in gpus if n.startswith(("TU", "GA", "AD", "GH", "GB"))]
    assert len(older) > 100 and len(newer) > 100
    assert [n for d, n in older if d >= TURING_FIRST_DEVICE_ID] == []
    assert [n for d, n in newer if d < TURING_FIRST_DEVICE_ID] == []


def test_the_pre_turing_parts_of_the_table_are_named_as_pci_ids_names_them() -> None:
    names = dict(_nvidia_gpus())
    family = {"GM": Family.MAXWELL, "GP": Family.PASCAL, "GV": Family.VOLTA, "TU": Family.TURING}
    for device in (0x13F2, 0x15F7, 0x15F8, 0x15F9, 0x1B38, 0x1BB3, 0x1D81, 0x1DB1, 0x1DB4,
                   0x1DB5, 0x1DB6, 0x1DB8, 0x1DF6, 0x1EB8):  # fmt: skip
        model = model_for(device)
        assert model.name.upper() in names[device].upper(), (hex(device), names[device])
        assert model.family is family[names[device][:2]]
        assert requires_proprietary_module([model]) is (model.family is not Family.TURING)


def test_auto_never_gives_a_pre_turing_gpu_the_open_modules() -> None:
    v100, h100, b200 = model_for(0x1DB5), model_for(0x2330), model_for(0x2901)
    assert fallback_module_type("570.211.01", [v100]) == "proprietary"
    assert fallback_module_type("580.95.05", [v100]) == "proprietary"
    assert fallback_module_type("570.211.01", [h100]) == "open"
    assert fallback_module_type("570.211.01", [b200]) == "open"
    assert required_module_type("auto", needs_open=False, needs_proprietary=True) == "proprietary"
    baked_open = Marker("k", "570.211.01", "cuda", "x86_64", module_type="open")
    want = Marker("k", "570.211.01", "cuda", "x86_64", module_type="auto")
    [wrong] = check_marker(baked_open, want, needs_open=False, needs_proprietary=True)
    assert (wrong.field, wrong.node) == ("module_type", "proprietary")
    assert check_marker(baked_open, want, needs_open=False) == []


def test_an_image_baked_open_is_rebuilt_proprietary_on_a_v100(make_world: MakeWorld) -> None:
    """bake has no GPU and builds open (auto); the V100 node's boot rebuilds."""
    w = make_world("v100-ndv2")
    with no_gpus(w):
        assert _bake(w).ok
    assert "--kernel-module-type=open" in installer_calls(w)[0]["argv"]
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [decision] = _events(result, "driver.prebaked")
    assert (decision["field"], decision["build"]) == ("module_type", True)
    assert "--kernel-module-type=proprietary" in installer_calls(w)[-1]["argv"]
    proc = (w.root / "proc/driver/nvidia/version").read_text()
    assert "Open Kernel Module" not in proc


def test_open_asked_for_a_v100_ends_24_before_any_download(make_world: MakeWorld) -> None:
    w = make_world("v100-ndv2", config_overrides={"driver": {"module_type": "open"}})
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.MODULE_TYPE_UNSUPPORTED, "detect")
    assert "Tesla V100 SXM2 32GB" in result.outcome.message
    assert installer_calls(w) == []


# ------------------------------------------------------------- 6. installer option


def test_the_installers_own_help_names_both_forms() -> None:
    text = sample(INSTALLER_SAMPLE)  # 575.57.08 --advanced-options
    assert "-M KERNEL-MODULE-TYPE, --kernel-module-type=KERNEL-MODULE-TYPE" in text
    assert "Valid values are open and proprietary" in text
    assert "This option is deprecated; use --kernel-module-type instead." in text
    assert installer_module_args("575.57.08", "open") == ["--kernel-module-type=open"]


@pytest.mark.parametrize(
    ("version", "module_type", "args"),
    [
        ("580.95.05", "proprietary", ["--kernel-module-type=proprietary"]),
        ("560.35.03", "open", ["--kernel-module-type=open"]),
        ("550.163.01", "open", ["-m=kernel-open"]),
        ("550.163.01", "proprietary", ["-m=kernel"]),
        ("535.161.08", "proprietary", ["-m=kernel"]),
        ("515.43.04", "open", ["-m=kernel-open"]),
        ("470.256.02", "proprietary", []),
    ],
)
def test_the_option_each_branch_takes(version: str, module_type: str, args: list[str]) -> None:
    assert installer_module_args(version, module_type) == args


def test_open_modules_before_515_do_not_exist() -> None:
    with pytest.raises(ValueError, match="515"):
        installer_module_args("470.256.02", "open")


@pytest.mark.parametrize("sku", ["h100-pcie", "a10-nvads"])
def test_a_550_driver_builds_with_the_option_550_knows(make_world: MakeWorld, sku: str) -> None:
    """AKS's GRID track ran 535 and 550; a 550 installer has no --kernel-module-type and
    no --print-recommended-kernel-module-type (the stand-in refuses both, as it does)."""
    kind = "grid" if sku == "a10-nvads" else "cuda"
    w = make_world(sku, driver_kind=kind, driver_version="550.163.01")
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [install] = installer_calls(w)
    assert "-m=kernel" in install["argv"]
    assert not any(a.startswith("--kernel-module-type") for a in install["argv"])
    asked = [c for c in w.calls() if "--print-recommended-kernel-module-type" in c["argv"]]
    assert asked == []
    [chosen] = _events(result, "driver.module_type")
    assert (chosen["module_type"], chosen["source"]) == ("proprietary", "branch")
