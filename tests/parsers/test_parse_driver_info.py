"""Tests for bootfsm.parsers.driver_info on real /proc, modinfo and dkms outputs."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootfsm.parsers import ParseError
from bootfsm.parsers.driver_info import (
    DkmsEntry,
    DriverVersionInfo,
    parse_containerd_version,
    parse_dkms_status,
    parse_module_version,
    parse_proc_driver_version,
)
from tests.samples import sample

EXCERPTS = "driver/proc_version_modinfo_dkms_excerpts.txt"


def block(letter: str) -> str:
    """The tool-output lines of one '# --- [X]' block (annotations and prompts dropped)."""
    lines: list[str] = []
    inside = False
    for line in sample(EXCERPTS).splitlines():
        if line.startswith("# --- ["):
            inside = line.startswith(f"# --- [{letter}]")
        elif inside and not line.startswith(("#", "$ ", "[root@")):
            lines.append(line)
    return "\n".join(lines) + "\n"


def test_proc_version_proprietary() -> None:
    assert parse_proc_driver_version(block("A")) == DriverVersionInfo("580.173.02", False)


def test_proc_version_open_module() -> None:
    assert parse_proc_driver_version(block("B")) == DriverVersionInfo("525.60.11", True)


def test_proc_version_from_the_nvml_mismatch_report() -> None:
    text = sample("nvidia-smi/nvml_error_excerpts.txt")
    assert parse_proc_driver_version(text) == DriverVersionInfo("580.173.02", False)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.127.05  Tue Sep 24 2024",
            DriverVersionInfo("550.127.05", False),
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.211.01  Release Build",
            DriverVersionInfo("570.211.01", True),
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  595.80  ",
            DriverVersionInfo("595.80", True),
        ),
    ],
)
def test_proc_version_other_arches_and_two_part_versions(
    line: str, expected: DriverVersionInfo
) -> None:
    assert parse_proc_driver_version(line + "\n") == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "GCC version:  gcc version 14.2.0\n",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  [...]\n",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08abc\n",
    ],
)
def test_proc_version_garbage(text: str) -> None:
    with pytest.raises(ParseError, match="/proc/driver/nvidia/version"):
        parse_proc_driver_version(text)


def test_module_version() -> None:
    assert parse_module_version("570.211.01\n") == "570.211.01"
    assert parse_module_version(block("E").split("\n")[0]) == "510.47.03"
    assert parse_module_version("595.80") == "595.80"


@pytest.mark.parametrize("text", ["", "\n", "570", "570.211.01.5", "v570.211.01", "570.x.01"])
def test_module_version_garbage(text: str) -> None:
    with pytest.raises(ParseError, match="/sys/module/nvidia/version"):
        parse_module_version(text)


def test_dkms_old_comma_format() -> None:
    entries = parse_dkms_status(block("F"))
    assert len(entries) == 4
    assert entries[2] == DkmsEntry(
        "nvidia", "510.85.02", "5.13.0-40-generic", "x86_64", "installed"
    )
    assert entries[0].module == "librealsense2-dkms"


def test_dkms_new_slash_format() -> None:
    assert parse_dkms_status(block("G")) == [
        DkmsEntry("nvidia", "610.57.04", "7.1.3+deb13-amd64", "x86_64", "installed"),
        DkmsEntry("zfs", "2.4.3", "7.1.3+deb13-amd64", "x86_64", "installed"),
    ]


def test_dkms_added_only_and_warnings() -> None:
    text = (
        "nvidia/570.211.01: added\n"
        "nvidia, 535.288.01: added\n"
        "Warning! Could not locate dkms.conf file.\n"
        "nvidia/570.211.01, 6.8.0-1041-azure, x86_64: installed (original_module exists)\n"
    )
    entries = parse_dkms_status(text)
    assert entries[0] == DkmsEntry("nvidia", "570.211.01", "", "", "added")
    assert entries[1] == DkmsEntry("nvidia", "535.288.01", "", "", "added")
    assert entries[2].status == "installed (original_module exists)"
    assert parse_dkms_status("") == []


def test_dkms_garbage() -> None:
    with pytest.raises(ParseError, match="dkms status line 4: unrecognised: '==> dkms install"):
        parse_dkms_status(block("G") + block("H"))


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da\n", (1, 7, 27)),
        (
            "containerd github.com/containerd/containerd/v2 v2.0.4 "
            "1a43cb6a1035441f9aca8f5666a9b3ef9e70ab20\n",
            (2, 0, 4),
        ),
        ("containerd github.com/containerd/containerd 1.7.12 \n", (1, 7, 12)),
        ("containerd github.com/containerd/containerd 1.6.12-0ubuntu1~22.04.3 \n", (1, 6, 12)),
        ("/usr/bin/containerd containerd.io v1.7.20+azure-1 8fc6bcff\n", (1, 7, 20)),
    ],
)
def test_containerd_version(text: str, version: tuple[int, int, int]) -> None:
    assert parse_containerd_version(text) == version


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "does not start with 'containerd'"),
        ("runc version 1.1.12\n", "does not start with 'containerd'"),
        ("containerd containerd.io dev abcdef\n", "no X.Y.Z version"),
        ("containerd 1.7\n", "no X.Y.Z version"),
    ],
)
def test_containerd_garbage(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_containerd_version(text)


@given(st.text())
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    for parse in (
        parse_proc_driver_version,
        parse_dkms_status,
        parse_containerd_version,
        parse_module_version,
    ):
        with contextlib.suppress(ParseError):
            parse(text)
