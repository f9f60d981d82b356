"""detect fails fast on every permanent problem, before any download or install."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import pytest

from bootfsm.codes import Code
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
        Code.UNVERIFIED_ARTIFACT_REFUSED,
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
