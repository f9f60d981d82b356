"""Tests for bootfsm.parsers.pci on real lspci / sysfs samples."""

from __future__ import annotations

import contextlib
import re
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootfsm.parsers import ParseError
from bootfsm.parsers.pci import parse_sysfs_hex, vpd_has_sw_mng
from tests.lspci import PciDevice, parse_lspci_nn
from tests.samples import sample

EXCERPTS = "lspci/lspci_hgx_gb200_excerpts.txt"


def section(text: str, letter: str) -> str:
    """The tool-output lines of one '# --- [X]' block of an excerpt file."""
    lines: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("# --- ["):
            inside = line.startswith(f"# --- [{letter}]")
            continue
        if inside and line.strip() and not line.startswith(("#", "$ ", "[root@")):
            lines.append(line)
    return "\n".join(lines) + "\n"


def test_azure_nd96asr_v4_a100() -> None:
    devices = parse_lspci_nn(sample("lspci/lspci-nn_azure_nd96asr_a100_gpud.txt"))
    assert len(devices) == 31
    assert devices[0] == PciDevice(
        address="0001:00:00.0",
        class_code=0x0302,
        vendor=0x10DE,
        device=0x20B2,
        description="NVIDIA Corporation GA100 [A100 SXM4 80GB]",
    )
    kinds = Counter((d.vendor, d.device, d.class_code) for d in devices)
    assert kinds[(0x10DE, 0x20B2, 0x0302)] == 8
    assert kinds[(0x10DE, 0x1AF1, 0x0680)] == 6
    assert kinds[(0x15B3, 0x101C, 0x0207)] == 8
    assert kinds[(0x1414, 0xB111, 0x0108)] == 8
    nvswitch = next(d for d in devices if d.device == 0x1AF1)
    assert nvswitch.description == "NVIDIA Corporation Device"
    eth = next(d for d in devices if d.class_code == 0x0200)
    assert eth.address == "c941:00:02.0"
    assert eth.description == (
        "Mellanox Technologies MT27710 Family [ConnectX-4 Lx Virtual Function]"
    )


def test_hgx_h100_lspci_dnn() -> None:
    devices = parse_lspci_nn(section(sample(EXCERPTS), "A"))
    assert devices[0].vendor == 0x1A03  # the BMC's ASPEED VGA
    assert devices[0].class_code == 0x0300
    switches = [d for d in devices if d.device == 0x22A3]
    gpus = [d for d in devices if d.device == 0x2330]
    assert len(switches) == 4 and len(gpus) == 8
    assert {d.class_code for d in switches} == {0x0680}
    assert gpus[0].address == "0000:1b:00.0"
    assert gpus[-1].description == "NVIDIA Corporation GH100 [H100 SXM5 80GB]"


def test_dgx_h200_without_domain_gets_0000() -> None:
    devices = parse_lspci_nn(section(sample(EXCERPTS), "C"))
    assert [d.address for d in devices][:2] == ["0000:1b:00.0", "0000:43:00.0"]
    assert {(d.vendor, d.device, d.class_code) for d in devices} == {(0x10DE, 0x2335, 0x0302)}
    assert len(devices) == 8


def test_gb200_tray_skips_indented_detail_lines() -> None:
    text = section(sample(EXCERPTS), "E").replace("\n--\n", "\n")
    devices = parse_lspci_nn(text)
    assert [d.address for d in devices] == ["0008:01:00.0", "0009:01:00.0", "0018:01:00.0"]
    assert {d.device for d in devices} == {0x2941}


@pytest.mark.parametrize("letter", ["B", "D"])
def test_plain_lspci_without_ids_is_refused(letter: str) -> None:
    with pytest.raises(ParseError, match=r"lspci -nn line 1: expected"):
        parse_lspci_nn(section(sample(EXCERPTS), letter))


def test_grep_separator_is_refused() -> None:
    with pytest.raises(ParseError, match="line 4"):
        parse_lspci_nn(section(sample(EXCERPTS), "E"))


def test_sysfs_values_from_nccl_topology() -> None:
    text = section(sample(EXCERPTS), "G")
    attrs = dict(re.findall(r' (class|vendor|device|tclass)="(0x[0-9a-f]+)"', text))
    assert parse_sysfs_hex(attrs["class"] + "\n", what="class") == 0x030200
    assert parse_sysfs_hex(attrs["vendor"] + "\n", what="vendor") == 0x10DE
    assert parse_sysfs_hex(attrs["device"] + "\n", what="device") == 0x20B0
    assert parse_sysfs_hex(attrs["tclass"], what="class") == 0x068000


@pytest.mark.parametrize("text", ["", "\n", "0x", "10de zz", "0xg1", "0x" + "f" * 17, "-0x1"])
def test_sysfs_garbage_names_the_attribute(text: str) -> None:
    with pytest.raises(ParseError, match="/sys/bus/pci/devices/x/vendor"):
        parse_sysfs_hex(text, what="/sys/bus/pci/devices/x/vendor")


def test_vpd_marker() -> None:
    # VPD is a binary list of tagged records; NVLink5 ConnectX parts carry SW_MNG in one.
    vpd = b"\x82\x10ConnectX-8 C8180\x90\x40PNV\x0cMCX8-SW_MNG\x00\x78"
    assert vpd_has_sw_mng(vpd)
    assert not vpd_has_sw_mng(b"\x82\x10ConnectX-7 VPI\x90\x10PN\x0cMCX755106AS\x78")
    assert not vpd_has_sw_mng(b"")


@given(st.text())
def test_lspci_any_text_parses_or_raises_parse_error(text: str) -> None:
    try:
        devices = parse_lspci_nn(text)
    except ParseError:
        return
    assert all(0 <= d.vendor <= 0xFFFF for d in devices)


@given(st.text(max_size=40))
def test_sysfs_any_text_parses_or_raises_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        assert parse_sysfs_hex(text, what="x") >= 0
