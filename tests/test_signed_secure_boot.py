"""The signed source on a Secure Boot node as Canonical's user-space leaves it: no
nvidia-modprobe (none of the 580-server packages ships one: dpkg-deb -c of the 580.178.04
debs), so bootfsm loads the packaged module with `modprobe nvidia`, `modprobe nvidia-uvm`
and the device files come from Ubuntu's udev rule (ub-device-create). A signed module
loads under module.sig_enforce; an unsigned one that shadows it (a DKMS build left in
updates/dkms, which depmod's search order puts first) is refused for its signature: 45,
never 43 (issue 39).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.sim.skus import SKUS
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, run_in_process

KERNEL = SKUS["h100-pcie"].kernel
X = "580.196.07"
RULES = (  # nvidia-kernel-common-580-server 580.178.04, lib/udev/rules.d/71-nvidia.rules
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", RUN+="/sbin/ub-device-create"\n'
    'ACTION=="add", DEVPATH=="/module/nvidia_uvm", SUBSYSTEM=="module",'
    ' RUN+="/sbin/ub-device-create"\n'
)


def _ubuntu_node(make_world: MakeWorld) -> World:
    """A Trusted Launch VM with the signed source: the kernel's signed module listed, no
    nvidia-modprobe on PATH, Ubuntu's udev rule and ub-device-create in place."""
    w = make_world(
        "h100-pcie",
        ("secure-boot",),
        ubuntu_kernels={KERNEL: X},
        ubuntu_userspace=(),
    )
    (w.bin_dir / "nvidia-modprobe").unlink()
    (w.root / "lib/udev/rules.d").mkdir(parents=True, exist_ok=True)
    (w.root / "lib/udev/rules.d/71-nvidia.rules").write_text(RULES)
    (w.root / "sbin").mkdir(exist_ok=True)
    (w.root / "sbin/ub-device-create").write_bytes(b"\x7fELF")
    return w


def _commands(w: World) -> list[list[str]]:
    return [[c["cmd"], *c.get("argv", [])] for c in w.calls()]


def test_a_secure_boot_node_provisions_with_modprobe_and_no_compile(
    make_world: MakeWorld,
) -> None:
    w = _ubuntu_node(make_world)
    result = run_in_process(w)
    assert result.outcome.ok, (result.outcome.code, result.outcome.message)
    assert (w.root / "sys/module/nvidia/version").read_text().strip() == X
    assert (w.root / "dev/nvidia-uvm").exists()
    cmds = _commands(w)
    assert ["modprobe", "nvidia"] in cmds and ["modprobe", "nvidia-uvm"] in cmds
    assert not [c for c in cmds if c[0] in ("nvidia-modprobe", "dkms", "nvidia-installer")]
    lines = Path(str(result.journal)).read_text().splitlines()
    facts: dict[str, Any] = next(e for e in map(json.loads, lines) if e["event"] == "node.facts")
    assert facts["secure_boot"] is True and facts["module_sig_enforce"] is True
    signer = subprocess.run(
        ["modinfo", "-F", "signer", "nvidia"], env=w.env(), capture_output=True, text=True,
        timeout=60, check=True,
    ).stdout  # fmt: skip
    assert signer == "Canonical Ltd. Kernel Module Signing\n"


def test_an_unsigned_module_shadowing_the_signed_one_ends_45(make_world: MakeWorld) -> None:
    w = _ubuntu_node(make_world)
    dkms = w.root / f"lib/modules/{KERNEL}/updates/dkms/nvidia.ko"
    dkms.parent.mkdir(parents=True)
    dkms.write_text(f"version={X}\nmodule_type=open\n")  # built here, signed by nobody
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (
        Code.MODULE_SIGNATURE_REJECTED,
        "driver",
    ), result.outcome.message
    assert "could not insert 'nvidia': Key was rejected by service" in result.outcome.message
    assert "remove the unsigned module that shadows it" in result.outcome.message
    assert 'set driver.source = "ubuntu-signed"' not in result.outcome.message  # it is set
    assert not (w.root / "sys/module/nvidia").exists()


def test_the_packaged_static_persistenced_unit_is_used_and_holds(make_world: MakeWorld) -> None:
    """Canonical's nvidia-persistenced.service has no [Install] (static): `systemctl
    enable` cannot enable it, so "enabled and active" would never hold (41 on every real
    Ubuntu node); bootfsm starts the packaged unit, writes none of its own, and a second
    run finds the driver state satisfied."""
    w = _ubuntu_node(make_world)
    result = run_in_process(w)
    assert result.outcome.ok, (result.outcome.code, result.outcome.message)
    assert not (w.root / "etc/systemd/system/nvidia-persistenced.service").exists()
    show = subprocess.run(
        ["systemctl", "show", "-p", "UnitFileState", "-p", "ActiveState",
         "nvidia-persistenced.service"],
        env=w.env(), capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert sorted(show.split()) == ["ActiveState=active", "UnitFileState=static"]
    again = run_in_process(w)
    assert again.outcome.ok, (again.outcome.code, again.outcome.message)
    lines = Path(str(again.journal)).read_text().splitlines()
    skipped = [e for e in map(json.loads, lines) if e["event"] == "state.skip"]
    assert "driver" in [e.get("state") for e in skipped]
