"""Secure Boot: a fact of the node, 15 in detect for a source that would load an unsigned
module, 45 for a module the kernel refuses for its signature.

The nodes are set up as real ones show it: the efivarfs variable SecureBoot (4 attribute
bytes, then 1 or 0), /sys/kernel/security/lockdown, module.sig_enforce, shim's MokListRT,
and IMDS's compute.securityProfile (the simulator's ``secure-boot`` fault is a Trusted
Launch VM: all of them on).
"""

from __future__ import annotations

import json
import struct
import uuid
from pathlib import Path
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, run_in_process

SECURE_BOOT = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
MOK_LIST = "sys/firmware/efi/efivars/MokListRT-605dab50-e046-4300-abb6-3dd810dd8b23"
LOCKDOWN = "sys/kernel/security/lockdown"
SIG_ENFORCE = "sys/module/module/parameters/sig_enforce"


def _facts(result: Any) -> dict[str, Any]:
    lines = Path(result.journal).read_text().splitlines()
    [facts] = [e for e in map(json.loads, lines) if e["event"] == "node.facts"]
    return dict(facts)


def _downloads(w: World) -> list[str]:
    return [e.path for e in w.mirror.log if not e.path.startswith(("/metadata", "/healthz"))]


def _kernel_enforces_nothing(w: World) -> None:
    (w.root / LOCKDOWN).write_text("[none] integrity confidentiality\n")
    (w.root / SIG_ENFORCE).write_text("N\n")


def test_a_secure_boot_node_fails_in_detect_before_any_download(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("secure-boot",))
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (
        Code.SECURE_BOOT_NEEDS_SIGNED_MODULE,
        "detect",
    ), result.outcome.message
    assert 'driver.source = "ubuntu-signed"' in result.outcome.message
    assert "EFI variable SecureBoot = 1" in result.outcome.message
    assert _downloads(w) == [] and w.calls() == []
    facts = _facts(result)
    assert (facts["secure_boot"], facts["secure_boot_source"]) == (True, "efi")
    assert (facts["lockdown"], facts["module_sig_enforce"]) == ("integrity", True)
    assert facts["module_signatures_enforced"] is True and facts["dkms_key_enrolled"] is False


def test_the_signed_source_passes_detect_on_a_secure_boot_node(make_world: MakeWorld) -> None:
    w = make_world(
        "h100-pcie", ("secure-boot",), config_overrides={"driver": {"source": "ubuntu-signed"}}
    )
    result = run_in_process(w)
    assert result.outcome.code is not Code.SECURE_BOOT_NEEDS_SIGNED_MODULE
    assert result.outcome.state != "detect", result.outcome.message


def test_secure_boot_off_as_a_gen2_vm_shows_it(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert (w.root / SECURE_BOOT).read_bytes() == b"\x06\x00\x00\x00\x00"
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    facts = _facts(result)
    assert (facts["secure_boot"], facts["secure_boot_source"]) == (False, "efi")
    assert facts["module_signatures_enforced"] is False


def test_without_the_efi_variable_imds_decides(make_world: MakeWorld) -> None:
    """efivarfs not mounted (or a chroot): IMDS's "true" is the only word; with no
    lockdown or sig_enforce file to say otherwise, the kernel is taken to enforce."""
    w = make_world("h100-pcie", ("secure-boot",))
    for path in (SECURE_BOOT, LOCKDOWN, SIG_ENFORCE):
        (w.root / path).unlink()
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (
        Code.SECURE_BOOT_NEEDS_SIGNED_MODULE,
        "detect",
    ), result.outcome.message
    assert "IMDS secureBootEnabled" in result.outcome.message
    assert (_facts(result)["secure_boot"], _facts(result)["secure_boot_source"]) == (True, "imds")


def test_the_efi_variable_wins_over_imds(make_world: MakeWorld) -> None:
    """IMDS says Secure Boot is on, the firmware's variable says 0 and the kernel enforces
    nothing: the firmware is the truth, the runfile goes ahead."""
    w = make_world("h100-pcie", ("secure-boot",))
    (w.root / SECURE_BOOT).write_bytes(b"\x06\x00\x00\x00\x00")
    _kernel_enforces_nothing(w)
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert (_facts(result)["secure_boot"], _facts(result)["secure_boot_source"]) == (False, "efi")


def test_secure_boot_without_enforcement_is_not_refused(make_world: MakeWorld) -> None:
    """Secure Boot on, but this kernel neither locks down nor enforces signatures: an
    unsigned module loads (tainted), so nothing fails."""
    w = make_world("h100-pcie", ("secure-boot",))
    _kernel_enforces_nothing(w)
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert _facts(result)["module_signatures_enforced"] is False


def test_lockdown_alone_enforces_signatures(make_world: MakeWorld) -> None:
    """Debian's kernels lock down under Secure Boot without module.sig_enforce."""
    w = make_world("h100-pcie")
    (w.root / LOCKDOWN).write_text("none [integrity] confidentiality\n")
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (
        Code.SECURE_BOOT_NEEDS_SIGNED_MODULE,
        "detect",
    ), result.outcome.message
    assert "lockdown integrity" in result.outcome.message


def _esl(cert: bytes) -> bytes:
    x509 = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072").bytes_le
    size = 16 + len(cert)
    return x509 + struct.pack("<III", 28 + size, 0, size) + bytes(16) + cert


def test_an_enrolled_dkms_key_lets_the_runfile_through_detect(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("secure-boot",))
    cert = b"0\x82\x03\x10 DKMS module signing key (test)"
    (w.root / "var/lib/dkms").mkdir(parents=True)
    (w.root / "var/lib/dkms/mok.pub").write_bytes(cert)
    plain = w.root / MOK_LIST
    plain.write_bytes(plain.read_bytes()[:4] + _esl(b"0\x82 another key") + _esl(cert))
    result = run_in_process(w)
    assert result.outcome.state != "detect", result.outcome.message
    assert _facts(result)["dkms_key_enrolled"] is True


def test_a_key_in_the_dkms_path_but_not_enrolled_is_refused(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("secure-boot",))
    (w.root / "var/lib/shim-signed/mok").mkdir(parents=True)
    (w.root / "var/lib/shim-signed/mok/MOK.der").write_bytes(b"0\x82 never enrolled")
    result = run_in_process(w)
    assert result.outcome.code is Code.SECURE_BOOT_NEEDS_SIGNED_MODULE


def test_grid_under_secure_boot_fails_in_detect(make_world: MakeWorld) -> None:
    w = make_world(
        "a10-nvads",
        ("secure-boot",),
        driver_kind="grid",
        config_overrides={"driver": {"source": "ubuntu-signed"}},
    )
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (
        Code.SECURE_BOOT_NEEDS_SIGNED_MODULE,
        "detect",
    ), result.outcome.message
    assert "no signed GRID" in result.outcome.message
    assert _downloads(w) == [] and w.calls() == []


def _image_driver_on_a_trusted_launch_vm(make_world: MakeWorld) -> World:
    """An image that ships the runfile's (unsigned) driver, booted with Secure Boot on;
    driver.install = false: bootfsm installs nothing, detect has nothing to refuse."""
    w = make_world("h100-pcie", ("stale-driver", "secure-boot"))
    w.config_overrides = {"driver": {"install": False}}
    w.write_config()
    return w


def test_a_module_refused_for_its_key_ends_45_not_43(make_world: MakeWorld) -> None:
    w = _image_driver_on_a_trusted_launch_vm(make_world)
    assert not (w.root / "sys/module/nvidia").exists()  # refused at boot already
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (
        Code.MODULE_SIGNATURE_REJECTED,
        "driver",
    ), result.outcome.message
    assert "could not insert 'nvidia': Key was rejected by service" in result.outcome.message
    assert 'driver.source = "ubuntu-signed"' in result.outcome.message


def test_lockdown_refusal_is_read_from_the_kernel_log(make_world: MakeWorld) -> None:
    """Without module.sig_enforce, lockdown refuses with EPERM: kmod says only "Operation
    not permitted", the kernel log says why."""
    w = _image_driver_on_a_trusted_launch_vm(make_world)
    (w.root / SIG_ENFORCE).write_text("N\n")
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (
        Code.MODULE_SIGNATURE_REJECTED,
        "driver",
    ), result.outcome.message
    assert "unsigned module loading is restricted" in result.outcome.message


def test_plan_shows_secure_boot(make_world: MakeWorld, capsys: Any) -> None:
    from bootfsm.cli import main

    w = make_world("h100-pcie", ("secure-boot",))
    argv = ["plan", "--root", str(w.root), "--config", str(w.config_path), "--offline"]
    assert main(argv) == Code.SECURE_BOOT_NEEDS_SIGNED_MODULE
    text = capsys.readouterr().out
    assert "secure boot: on (efi), lockdown integrity, module signatures enforced" in text
    assert main([*argv, "--json"]) == Code.SECURE_BOOT_NEEDS_SIGNED_MODULE
    plan = json.loads(capsys.readouterr().out)
    assert plan["facts"]["secure_boot"] is True
    assert plan["fail_fast"]["name"] == "SECURE_BOOT_NEEDS_SIGNED_MODULE"
    assert Path(w.root / SECURE_BOOT).read_bytes() == b"\x06\x00\x00\x00\x01"
