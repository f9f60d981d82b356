"""driver.source = "ubuntu-signed": the kernel/driver coupling resolved from Ubuntu's
archive indexes (bootfsm/fetch/ubuntu_signed.py).

The stanzas are transcribed from noble-updates' restricted and multiverse binary-amd64
Packages (tests/captures/ubuntu_archive_580, dated there). Expected values are read from
those files: linux-modules-nvidia-580-server-open-6.8.0-1074-azure 6.8.0-1074.83+1
depends on nvidia-kernel-common-580-server (>= 580.196.07), (<= 580.196.07-1); the
6.8.0-1073-azure one (6.8.0-1073.82) on 580.178.04, which the index no longer lists.
Set BOOTFSM_LIVE_UBUNTU_ARCHIVE=1 to check the same against the live archive.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.fetch.ubuntu_signed import SignedStack, Wanted, resolve_stack, unxz
from bootfsm.parsers import ParseError

CAPTURES = Path(__file__).parent / "captures" / "ubuntu_archive_580"
RESTRICTED = (CAPTURES / "noble-updates-restricted.Packages").read_text()
PROPRIETARY = (CAPTURES / "noble-updates-restricted-proprietary.Packages").read_text()
MULTIVERSE = (CAPTURES / "noble-updates-multiverse.Packages").read_text()
TEXTS = {
    "ubuntu_noble-updates_restricted": RESTRICTED,
    "ubuntu_noble-updates_multiverse": MULTIVERSE,
}
V = "580.196.07-0ubuntu0.24.04.1"


def _want(kernel: str, module_type: str = "open", **kw: bool) -> Wanted:
    return Wanted(kernel, "580", module_type, "amd64", **kw)


def _names(stack: SignedStack) -> list[str]:
    return [p.entry.package for p in stack.packages]


def test_the_kernels_module_and_exactly_its_userspace() -> None:
    """6.8.0-1074-azure: its module, then the headless user-space at 580.196.07."""
    stack = resolve_stack(TEXTS, _want("6.8.0-1074-azure"))
    assert stack.userspace == "580.196.07"
    assert stack.module == "linux-modules-nvidia-580-server-open-6.8.0-1074-azure"
    assert stack.module_version == "6.8.0-1074.83+1"
    versions = {p.entry.package: p.entry.version for p in stack.packages}
    assert versions == {
        "linux-modules-nvidia-580-server-open-6.8.0-1074-azure": "6.8.0-1074.83+1",
        "nvidia-kernel-common-580-server": V,
        "nvidia-firmware-580-server-580.196.07": V,  # through nvidia-kernel-common's Depends
        "libnvidia-compute-580-server": V,
        "nvidia-utils-580-server": V,
        "nvidia-compute-utils-580-server": V,
        "libnvidia-cfg1-580-server": V,
    }
    module = next(p for p in stack.packages if p.entry.package == stack.module)
    assert module.entry.sha256 == "723bdf6d8ac50bd98ec28c218444d5cf37284f530e5c0cf594d3d8eb65783c53"
    assert module.entry.size == 8067864
    # what the node must have itself: the kernel image and the base libraries
    assert (
        stack.external[0] == "linux-image-6.8.0-1074-azure | linux-image-unsigned-6.8.0-1074-azure"
    )
    assert "ocl-icd-libopencl1" in stack.external and "adduser" in stack.external


def test_install_order_puts_dependencies_first() -> None:
    order = _names(resolve_stack(TEXTS, _want("6.8.0-1074-azure")))
    before = [
        ("nvidia-firmware-580-server-580.196.07", "nvidia-kernel-common-580-server"),
        (
            "nvidia-kernel-common-580-server",
            "linux-modules-nvidia-580-server-open-6.8.0-1074-azure",
        ),
        ("nvidia-kernel-common-580-server", "libnvidia-compute-580-server"),
        ("libnvidia-compute-580-server", "nvidia-utils-580-server"),
        ("libnvidia-compute-580-server", "nvidia-compute-utils-580-server"),
    ]
    for first, then in before:
        assert order.index(first) < order.index(then), (first, then)


def test_fabric_manager_nscq_and_imex_from_multiverse() -> None:
    stack = resolve_stack(TEXTS, _want("6.8.0-1074-azure", fabric=True, imex=True))
    found = {p.entry.package: (p.key, p.entry.version) for p in stack.packages}
    for name in ("nvidia-fabricmanager-580", "libnvidia-nscq-580", "nvidia-imex-580"):
        assert found[name] == ("ubuntu_noble-updates_multiverse", V)


def test_userspace_no_longer_listed_is_47_naming_both_versions() -> None:
    """6.8.0-1073-azure's module needs 580.178.04; the index lists only 580.196.07."""
    with pytest.raises(BootError) as err:
        resolve_stack(TEXTS, _want("6.8.0-1073-azure"))
    assert err.value.code is Code.SIGNED_USERSPACE_MISSING
    msg = err.value.message
    assert "6.8.0-1073-azure" in msg and "580.178.04" in msg and V in msg
    assert "nvidia-kernel-common-580-server" in msg


def test_no_module_for_the_kernel_is_46_naming_the_kernels_that_have_one() -> None:
    with pytest.raises(BootError) as err:
        resolve_stack(TEXTS, _want("6.8.0-1072-azure"))
    assert err.value.code is Code.SIGNED_MODULE_MISSING
    msg = err.value.message
    assert "kernel 6.8.0-1072-azure" in msg
    assert "6.8.0-1073-azure, 6.8.0-1074-azure" in msg
    assert 'driver.source = "runfile"' in msg and "Secure Boot" in msg


def test_proprietary_module_takes_its_objects_and_signatures() -> None:
    """The non-open package is a stub that depends on linux-objects (the blobs, linked
    at install) and linux-signatures of the same kernel build."""
    stack = resolve_stack(
        {"r": RESTRICTED, "p": PROPRIETARY}, _want("6.8.0-1074-azure", "proprietary")
    )
    names = _names(stack)
    assert stack.module == "linux-modules-nvidia-580-server-6.8.0-1074-azure"
    assert names.index("linux-objects-nvidia-580-server-6.8.0-1074-azure") < names.index(
        stack.module
    )
    assert names.index("linux-signatures-nvidia-6.8.0-1074-azure") < names.index(stack.module)
    assert "binutils" in stack.external


def test_a_newer_userspace_in_the_index_is_not_taken() -> None:
    """The version is the module's Depends, never the newest the index lists."""
    newer = RESTRICTED.replace(V, "580.205.02-0ubuntu0.24.04.1").replace("580.196.07", "580.205.02")
    only_newer_names = "\n\n".join(
        s for s in newer.split("\n\n") if "Package: linux-modules" not in s
    )
    stack = resolve_stack({"a": RESTRICTED, "b": only_newer_names}, _want("6.8.0-1074-azure"))
    assert {p.entry.version for p in stack.packages if p.entry.package != stack.module} == {V}


def test_unxz_is_bounded() -> None:
    import lzma

    body = lzma.compress(b"Package: x\n" * 1000, format=lzma.FORMAT_XZ)
    assert unxz(body, 1 << 20).count("Package: x") == 1000
    with pytest.raises(ParseError):
        unxz(body, 100)
    with pytest.raises(ParseError):
        unxz(b"not xz", 100)


@pytest.mark.skipif(
    not os.environ.get("BOOTFSM_LIVE_UBUNTU_ARCHIVE"), reason="BOOTFSM_LIVE_UBUNTU_ARCHIVE unset"
)
def test_live_archive_couples_kernel_and_userspace() -> None:
    """Today's noble indexes: 6.8.0-1074-azure -> 580.196.07 (facts of 2026-12-07)."""
    base = "http://archive.ubuntu.com/ubuntu/dists"
    texts = {}
    for suite in ("noble", "noble-updates", "noble-security"):
        url = f"{base}/{suite}/restricted/binary-amd64/Packages.xz"
        with urllib.request.urlopen(url, timeout=120) as r:
            texts[suite] = unxz(r.read(), 256 << 20)
    stack = resolve_stack(texts, _want("6.8.0-1074-azure"))
    assert stack.userspace == "580.196.07"
