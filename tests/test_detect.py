"""detect fails fast on every permanent problem, before any download or install."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable

import pytest

from bootfsm.core.codes import Code
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, run_in_process


def _arch(w: World) -> None:
    (w.root / "proc/sys/kernel/arch").write_text("ppc64le\n")


def _no_gpu(w: World) -> None:
    for dev in (w.root / "sys/bus/pci/devices").iterdir():
        if (dev / "vendor").read_text().strip() == "0x10de":
            shutil.rmtree(dev)


def _old_os(w: World) -> None:
    p = w.root / "etc/os-release"
    p.write_text(p.read_text().replace('VERSION_ID="22.04"', 'VERSION_ID="20.04"'))


CASES: list[tuple[str, str, Callable[[World], None] | None, dict[str, dict[str, object]], Code]] = [
    ("arch", "h100-pcie", _arch, {}, Code.UNSUPPORTED_ARCH),
    ("no-gpu", "h100-pcie", _no_gpu, {}, Code.NO_GPU),
    ("os", "h100-pcie", _old_os, {}, Code.UNSUPPORTED_OS),
    (
        "proprietary-on-blackwell",
        "b200-hgx",
        None,
        {"driver": {"module_type": "proprietary"}},
        Code.MODULE_TYPE_UNSUPPORTED,
    ),
    (
        "no-runfile-sha256",
        "h100-pcie",
        None,
        {"sources": {"runfile_sha256": ""}},
        Code.DRIVER_VERSION_UNPINNED,
    ),
    (  # GB300 is driven from R580 on (NVIDIA's release notes; AKS runs it on 580)
        "branch-too-old-for-gb300",
        "gb300",
        None,
        {"driver": {"version": "570.211.01"}},
        Code.DRIVER_BRANCH_UNSUPPORTED,
    ),
]


@pytest.mark.parametrize(
    ("label", "sku", "mutate", "overrides", "code"), CASES, ids=[c[0] for c in CASES]
)
def test_permanent_problem_fails_in_detect_with_nothing_downloaded(
    make_world: MakeWorld,
    label: str,
    sku: str,
    mutate: Callable[[World], None] | None,
    overrides: dict[str, dict[str, object]],
    code: Code,
) -> None:
    w = make_world(sku, config_overrides=overrides)
    if mutate is not None:
        mutate(w)
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (code, "detect"), result.outcome.message
    fetched = [e for e in w.mirror.log if not e.path.startswith(("/metadata", "/healthz"))]
    assert fetched == []
    assert w.calls() == []


def test_per_arch_runfile_sha256_serves_a_mixed_fleet(make_world: MakeWorld) -> None:
    """The gb300 (aarch64) node takes runfile_sha256_aarch64; the x86_64 key set beside it
    to another value is ignored there, and no single key is needed."""
    w = make_world("gb300")
    sha = w.runfile_sha256
    w.config_overrides = {
        "sources": {
            "runfile_sha256": "",
            "runfile_sha256_aarch64": sha,
            "runfile_sha256_x86_64": "0" * 64,
        }
    }
    w.write_config()
    result = run_in_process(w)
    assert result.outcome.code is Code.OK, result.outcome.message


def test_per_arch_runfile_sha256_missing_for_this_arch(make_world: MakeWorld) -> None:
    """Only the x86_64 checksum is configured: an aarch64 node stops in detect with 19,
    naming the keys that would pin it, before any download."""
    w = make_world("gb300")
    w.config_overrides = {
        "sources": {"runfile_sha256": "", "runfile_sha256_x86_64": w.runfile_sha256}
    }
    w.write_config()
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.DRIVER_VERSION_UNPINNED, "detect")
    assert "runfile_sha256_aarch64" in result.outcome.message
    assert '"cuda 580.159.04 aarch64 <sha256>"' in result.outcome.message
    assert [e for e in w.mirror.log if not e.path.startswith(("/metadata", "/healthz"))] == []


def _drop_headers(w: World) -> str:
    kernel = (w.root / "proc/sys/kernel/osrelease").read_text().strip()
    shutil.rmtree(w.root / f"lib/modules/{kernel}/build")
    return kernel


def test_missing_kernel_headers_fail_in_detect_before_any_download(
    make_world: MakeWorld,
) -> None:
    w = make_world("h100-pcie")
    kernel = _drop_headers(w)
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.KERNEL_HEADERS_MISSING, "detect")
    assert f"/lib/modules/{kernel}/build is missing" in result.outcome.message
    assert [e for e in w.mirror.log if not e.path.startswith(("/metadata", "/healthz"))] == []
    assert w.calls() == []


def test_headers_as_ubuntu_links_them_resolve_inside_the_root(make_world: MakeWorld) -> None:
    """linux-headers-<k> ships build as an absolute link to /usr/src/linux-headers-<k>:
    it is followed inside the node root. Dangling (headers removed), it counts as missing."""
    w = make_world("h100-pcie")
    kernel = _drop_headers(w)
    (w.root / f"lib/modules/{kernel}/build").symlink_to(f"/usr/src/linux-headers-{kernel}")
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.KERNEL_HEADERS_MISSING, "detect")
    (w.root / f"usr/src/linux-headers-{kernel}").mkdir(parents=True)
    (w.root / f"usr/src/linux-headers-{kernel}/Makefile").write_text("# headers\n")
    result = run_in_process(w)
    assert result.outcome.state != "detect", result.outcome.message


def test_no_headers_needed_when_a_bake_marker_matches(make_world: MakeWorld) -> None:
    """A matching marker means nothing is compiled at boot: detect lets it through (the
    driver state then checks the baked module itself)."""
    from bootfsm.core.config_files import load_config
    from bootfsm.host.host import Host
    from bootfsm.install.marker import expected_marker, marker_path, render_marker
    from bootfsm.node.facts import gather_facts

    w = make_world("h100-pcie")
    _drop_headers(w)
    cfg = load_config(w.config_path, required=True)
    facts = gather_facts(Host(w.root))
    marker = w.root / marker_path(cfg).lstrip("/")
    marker.parent.mkdir(parents=True, exist_ok=True)
    baked = dataclasses.replace(expected_marker(cfg, facts), module_type="open")
    marker.write_text(render_marker(baked))
    result = run_in_process(w)
    assert result.outcome.state != "detect", result.outcome.message
    marker.write_text(render_marker(dataclasses.replace(baked, kernel="9.9.9")))
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.KERNEL_HEADERS_MISSING, "detect")
    assert "bake marker differs in kernel" in result.outcome.message


def test_no_headers_needed_when_the_image_ships_the_driver(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", config_overrides={"driver": {"install": False}})
    _drop_headers(w)
    result = run_in_process(w)
    assert result.outcome.state != "detect", result.outcome.message
