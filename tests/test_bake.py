"""Image build (bake) then boot on simulated nodes: the marker decides the compile."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bootfsm.cli import main
from bootfsm.core.codes import Code
from bootfsm.core.config_files import load_config
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host
from bootfsm.image.bake import BakeOptions, BakeResult, bake, target_kernel
from bootfsm.install.marker import Marker, check_marker, parse_marker, parse_modinfo, render_marker
from bootfsm.run.session import SessionResult
from bootfsm.sim.node import simulate_reboot
from bootfsm.sim.world import DRIVER_VERSION, World
from tests.conftest import MakeWorld, installer_calls, no_gpus, run_in_process
from tests.samples import sample

KERNEL = "5.15.0-1089-azure"  # the h100-pcie SKU's kernel
MARKER = "var/lib/bootfsm/bake.marker"
LOADS = {"modprobe", "nvidia-modprobe", "systemctl", "nvidia-smi", "nvidia-ctk"}


def _bake(w: World, **kw: Any) -> BakeResult:
    cfg = load_config(w.config_path, required=True)
    return bake(cfg, BakeOptions(root=w.root, env=w.env(), **kw))


def _events(result: SessionResult | BakeResult, name: str) -> list[dict[str, Any]]:
    assert result.journal is not None
    lines = result.journal.read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _marker(w: World) -> Marker:
    return parse_marker((w.root / MARKER).read_text())


def _installs_since(w: World, n: int) -> list[dict[str, Any]]:
    fresh = w.calls()[n:]
    return [c for c in installer_calls(w) if c in fresh]


def _add_kernel(w: World, kernel: str, headers: bool = True) -> None:
    (w.root / f"lib/modules/{kernel}").mkdir(parents=True)
    if headers:
        (w.root / f"lib/modules/{kernel}/build").mkdir()
        (w.root / f"lib/modules/{kernel}/build/Makefile").write_text(f"# headers {kernel}\n")


# ------------------------------------------------------------------ bake then boot


def test_bake_on_a_gpu_less_root_then_boot_compiles_nothing(make_world: MakeWorld) -> None:
    """Bake loads nothing and needs no GPU; twice is a no-op; the boot skips the compile."""
    w = make_world("h100-pcie")
    with no_gpus(w):
        first = _bake(w)
        assert first.ok, first.message
        assert first.changed == ("fetch", "nouveau", "toolkit", "module", "marker")
        marker_bytes = (w.root / MARKER).read_bytes()
        stat = (w.root / MARKER).stat()
        n_calls, n_gets = len(w.calls()), len(w.mirror.log)
        second = _bake(w)
    assert second.ok and second.changed == () and second.message == "already baked"
    assert (w.root / MARKER).read_bytes() == marker_bytes
    assert (w.root / MARKER).stat().st_mtime_ns == stat.st_mtime_ns
    assert len(w.mirror.log) == n_gets  # nothing downloaded again
    redo = {"nvidia-installer", "dpkg", "update-initramfs"}
    assert [c["cmd"] for c in w.calls()[n_calls:] if c["cmd"] in redo] == []

    bake_calls = w.calls()
    assert [c for c in bake_calls if c["cmd"] in LOADS] == []  # no module load, no service
    assert not (w.root / "sys/module/nvidia").exists()
    [install] = installer_calls(w)
    assert {"--skip-module-load", f"--kernel-name={KERNEL}", "--kernel-module-type=open"} <= set(
        install["argv"]
    )
    assert ["-u", "-k", KERNEL] in [c["argv"] for c in bake_calls if c["cmd"] == "update-initramfs"]
    m = _marker(w)
    assert (m.kernel, m.driver_version, m.driver_kind, m.arch, m.module_type, m.source) == (
        KERNEL,
        DRIVER_VERSION,
        "cuda",
        "x86_64",
        "open",
        "bake",
    )
    assert m.runfile_sha256 == w.runfile_sha256 and m.config_digest
    [end] = _events(first, "run.end")
    assert (end["kind"], end["code"], end["changed"]) == ("bake", 0, list(first.changed))

    n = len(w.calls())
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert _installs_since(w, n) == []
    [decision] = _events(result, "driver.prebaked")
    assert decision["match"] is True and decision["build"] is False
    skipped = {e["state"]: e["reason"] for e in _events(result, "state.skip")}
    assert skipped["fetch"] == "postcondition holds"  # the image holds the verified cache


def _drift_kernel(w: World) -> str:
    _add_kernel(w, "6.8.0-1020-azure")
    (w.root / "proc/sys/kernel/osrelease").write_text("6.8.0-1020-azure\n")
    return "6.8.0-1020-azure"


def _edit_marker(**change: str) -> Any:
    def edit(w: World) -> str:
        (w.root / MARKER).write_text(render_marker(replace(_marker(w), **change)))
        return KERNEL

    return edit


def _drop_module(w: World) -> str:
    """The baked module gone (bake installs it without DKMS: only its file is there)."""
    ko = w.root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko"
    os.rename(ko, ko.with_suffix(".gone"))
    return KERNEL


DRIFTS = [
    ("kernel", _drift_kernel),
    ("driver_version", _edit_marker(driver_version="565.57.01")),
    ("driver_kind", _edit_marker(driver_kind="grid")),
    ("arch", _edit_marker(arch="aarch64")),
    ("module", _drop_module),
]


@pytest.mark.parametrize(("field", "drift"), DRIFTS, ids=[d[0] for d in DRIFTS])
def test_drift_builds_and_the_journal_names_the_field(
    make_world: MakeWorld, field: str, drift: Any
) -> None:
    """A marker for another kernel, version, kind or arch (or an unusable module) never
    skips the build; afterwards the marker describes the boot's build."""
    w = make_world("h100-pcie")
    assert _bake(w).ok
    kernel = drift(w)
    n = len(w.calls())
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [install] = _installs_since(w, n)
    assert f"--kernel-name={kernel}" in install["argv"]
    [decision] = _events(result, "driver.prebaked")
    assert (decision["match"], decision["field"], decision["build"]) == (False, field, True)
    assert decision["reason"]
    after = _marker(w)
    assert (after.source, after.kernel, after.driver_kind, after.arch) == (
        "boot",
        kernel,
        "cuda",
        "x86_64",
    )


def test_absent_marker_builds_and_a_rerun_compiles_nothing(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    first = run_in_process(w)
    assert first.outcome.ok, first.outcome.message
    assert len(installer_calls(w)) == 1
    [decision] = _events(first, "driver.prebaked")
    assert (decision["match"], decision["field"], decision["build"]) == (False, "marker", True)
    assert _marker(w).source == "boot"
    n = len(w.calls())
    second = run_in_process(w)
    assert second.outcome.ok and _installs_since(w, n) == []
    reasons = {e["state"]: e["reason"] for e in _events(second, "state.skip")}
    assert "built by boot" in reasons["driver"]


def test_bake_targets_the_newest_kernel_with_headers_not_the_running_one(
    make_world: MakeWorld,
) -> None:
    """The image is built for the kernel it will boot; booting that kernel needs no compile."""
    w = make_world("h100-pcie")
    _add_kernel(w, "6.8.0-999-azure")
    _add_kernel(w, "6.8.0-1020-azure")
    _add_kernel(w, "6.8.0-1030-azure", headers=False)
    result = _bake(w)
    assert result.ok, result.message
    assert _marker(w).kernel == "6.8.0-1020-azure"
    [install] = installer_calls(w)
    assert "--kernel-name=6.8.0-1020-azure" in install["argv"]
    assert (w.root / "lib/modules/6.8.0-1020-azure/updates/dkms/nvidia.ko").exists()
    assert not (w.root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko").exists()
    (w.root / "proc/sys/kernel/osrelease").write_text("6.8.0-1020-azure\n")
    simulate_reboot(w.root)
    n = len(w.calls())
    booted = run_in_process(w)
    assert booted.outcome.ok, booted.outcome.message
    assert _installs_since(w, n) == []
    # the boot loaded the baked module (udev), but nvidia_uvm and its device node, the
    # linker cache and nvidia-smi are per-boot work: the driver state runs, compiles nothing
    [decision] = _events(booted, "driver.prebaked")
    assert (decision["match"], decision["build"]) == (True, False)
    calls = [c["cmd"] for c in w.calls()[n:]]
    assert {"nvidia-modprobe", "ldconfig", "nvidia-smi"} <= set(calls)
    assert (w.root / "dev/nvidia-uvm").exists()
    again = run_in_process(w)  # same boot, init done: now the state is skipped
    reasons = {e["state"]: e["reason"] for e in _events(again, "state.skip")}
    assert reasons["driver"] == (
        f"driver {DRIVER_VERSION} (cuda) built by bake for 6.8.0-1020-azure,"
        " loaded and initialized this boot"
    )


def test_target_kernel_choice(tmp_path: Path) -> None:
    root = tmp_path / "image"
    for k, headers in [("5.15.0-1089-azure", True), ("6.8.0-999-azure", True),
                       ("6.8.0-1020-azure", False), ("6.2.0-1", True)]:  # fmt: skip
        (root / f"lib/modules/{k}").mkdir(parents=True)
        if headers:
            (root / f"usr/src/linux-headers-{k}").mkdir(parents=True)
            (root / f"usr/src/linux-headers-{k}/Makefile").write_text("")
            # Ubuntu's absolute link: it must resolve inside the image, not on the build host
            os.symlink(f"/usr/src/linux-headers-{k}", root / f"lib/modules/{k}/build")
    host = Host(root)
    assert target_kernel(host, None) == "6.8.0-999-azure"
    assert target_kernel(host, "6.2.0-1") == "6.2.0-1"
    for bad in ("6.8.0-1020-azure", "9.9.9", "../etc"):
        with pytest.raises(BootError, match=r"build is missing|not a kernel release") as info:
            target_kernel(host, bad)
        assert info.value.code is Code.KERNEL_HEADERS_MISSING
    with pytest.raises(BootError, match="no kernel under /lib/modules") as info:
        target_kernel(Host(tmp_path / "empty"), None)
    assert info.value.code is Code.KERNEL_HEADERS_MISSING


def test_arm64_image_prefetches_imex_and_bakes_the_open_module(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the CLI: a GB300 image baked GPU-less gets IMEX and the open module, and
    the Blackwell node boots it without a compile."""
    w = make_world("gb300")
    monkeypatch.setenv("PATH", w.env()["PATH"])
    with no_gpus(w):
        assert main(["bake", "--root", str(w.root)]) == 0
    line = capsys.readouterr().out
    assert "baked driver 580.159.04 (cuda, open)" in line and "did: fetch," in line
    assert any(e.path.endswith(".deb") and "nvidia-imex" in e.path for e in w.mirror.log)
    simulate_reboot(w.root)
    n = len(w.calls())
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert _installs_since(w, n) == []


def test_bake_failures_have_their_codes(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    w = make_world("h100-pcie")
    monkeypatch.setenv("PATH", w.env()["PATH"])
    assert main(["bake", "--root", str(w.root), "--kernel", "9.9.9-none"]) == 25
    assert "KERNEL_HEADERS_MISSING" in capsys.readouterr().out
    osr = w.root / "usr/lib/os-release"
    osr.write_text(osr.read_text().replace('VERSION_ID="22.04"', 'VERSION_ID="20.04"'))
    result = _bake(w)
    assert result.code is Code.UNSUPPORTED_OS
    assert w.calls() == [] and installer_calls(w) == []


# ------------------------------------------------------------------ driver.install = false


def test_install_false_on_an_image_without_a_driver_fails_43(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", config_overrides={"driver": {"install": False}})
    baked = _bake(w)
    assert baked.ok and baked.marker is None and "module" not in baked.changed
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.MODULE_LOAD_FAILED, "driver")
    assert "driver.install = false" in result.outcome.message
    assert installer_calls(w) == []


def test_install_false_loads_the_image_driver_and_says_why_it_skipped(
    make_world: MakeWorld,
) -> None:
    w = make_world("h100-pcie")
    assert _bake(w).ok  # the image ships a DKMS-built driver
    w.config_overrides = {"driver": {"install": False}}
    w.write_config()
    n = len(w.calls())
    first = run_in_process(w)
    assert first.outcome.ok, first.outcome.message
    assert _installs_since(w, n) == []
    assert [e["reason"] for e in _events(first, "driver.skipped")]
    second = run_in_process(w)
    reasons = {e["state"]: e["reason"] for e in _events(second, "state.skip")}
    assert (
        reasons["driver"]
        == f"driver.install = false: the image's driver {DRIVER_VERSION} is loaded"
    )


# ------------------------------------------------------------------ the marker, pure


def _m(**kw: str) -> Marker:
    base = {"kernel": KERNEL, "driver_version": "580.159.04", "driver_kind": "cuda"}
    return Marker(**{**base, "arch": "x86_64", "module_type": "open", **kw})


def test_marker_round_trip_and_the_bash_marker() -> None:
    m = _m(runfile_sha256="ab" * 32, config_digest="0123456789abcdef", baked_at="t")
    assert parse_marker(render_marker(m)) == m
    bash = f"kernel={KERNEL}\ndriver_version=580.159.04\ndriver_kind=cuda\narch=x86_64\n"
    legacy = parse_marker("# written by install.sh\n" + bash + "future_key=1\n")
    assert (legacy.kernel, legacy.module_type, legacy.source) == (KERNEL, "", "bake")
    with pytest.raises(ValueError, match="lacks driver_kind=, arch="):
        parse_marker(f"kernel={KERNEL}\ndriver_version=1.2\n")
    with pytest.raises(ValueError, match="line 2"):
        parse_marker(f"kernel={KERNEL}\nnot a pair\n")


@pytest.mark.parametrize(
    ("have", "want", "needs_open", "fields"),
    [
        (_m(), _m(module_type="auto"), False, []),
        (_m(module_type="proprietary"), _m(module_type="auto"), False, []),
        (_m(module_type="proprietary"), _m(module_type="auto"), True, ["module_type"]),
        # a typeless (bash-path) marker: the built module's licence decides, not the marker
        (_m(module_type=""), _m(module_type="auto"), False, []),
        (_m(module_type=""), _m(module_type="proprietary"), True, []),
        (_m(), _m(module_type="proprietary"), False, ["module_type"]),
        (_m(kernel="6.8.0-1"), _m(), False, ["kernel"]),
        (_m(driver_version="565.57.01", arch="aarch64"), _m(), False, ["arch", "driver_version"]),
        (_m(driver_kind="grid"), _m(), False, ["driver_kind"]),
        (_m(runfile_sha256="aa"), _m(runfile_sha256="bb"), False, ["runfile_sha256"]),
        (_m(runfile_sha256=""), _m(runfile_sha256="bb"), False, []),
        (_m(config_digest="x", source="boot"), _m(config_digest="y"), False, []),
    ],
)
def test_check_marker(have: Marker, want: Marker, needs_open: bool, fields: list[str]) -> None:
    assert [d.field for d in check_marker(have, want, needs_open=needs_open)] == fields


def test_parse_modinfo_on_real_output() -> None:
    text = sample("driver/proc_version_modinfo_dkms_excerpts.txt")
    block = text.split("# --- [D]", 1)[1].split("# --- [E]", 1)[0]
    info = parse_modinfo("\n".join(line for line in block.splitlines()[2:]))
    assert info["version"] == "595.80" and info["license"] == "Dual MIT/GPL"
    assert info["firmware"] == "nvidia/595.80/gsp_tu10x.bin"  # first of repeated keys
