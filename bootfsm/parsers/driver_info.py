"""Parse driver-side facts: /proc/driver/nvidia/version and params, dkms status, containerd."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bootfsm.core.excerpt import excerpt
from bootfsm.parsers import ParseError

__all__ = [
    "DkmsEntry",
    "DriverVersionInfo",
    "parse_containerd_version",
    "parse_dkms_status",
    "parse_module_version",
    "parse_nvidia_params",
    "parse_proc_driver_version",
]

_DRIVER_VERSION = r"[0-9]{1,4}\.[0-9]{1,4}(?:\.[0-9]{1,4})?"
_MODULE_VERSION = re.compile(_DRIVER_VERSION)
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  <date>"
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  ..."
_NVRM = re.compile(
    r"NVRM version: NVIDIA UNIX (?P<flavor>.*?)Kernel Module(?: for \S+)?\s+"
    rf"(?P<version>{_DRIVER_VERSION})(?:\s|$)"
)
# dkms 3.x "nvidia/<ver>, <kernel>, <arch>: installed"; dkms 2.x "nvidia, <ver>, ...".
# Kernel and arch are absent for modules that are only "added".
_DKMS = re.compile(
    r"(?P<module>[^/,:\s]+)(?:/|, )(?P<version>[^,:\s]+)"
    r"(?:, (?P<kernel>[^,:\s]+), (?P<arch>[^,:\s]+))?: (?P<status>\S.*)"
)
_DKMS_DIAGNOSTIC = ("Error!", "Warning!", "WARNING:", "Deprecated feature:")
_CONTAINERD_VERSION = re.compile(r"v?([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,9})(?:[-+~.].*)?")


@dataclass(frozen=True)
class DriverVersionInfo:
    """The loaded NVIDIA kernel module's version and flavour (open or proprietary)."""

    version: str
    open_module: bool


@dataclass(frozen=True)
class DkmsEntry:
    """One `dkms status` line; kernel and arch are "" for modules only added, not built."""

    module: str
    version: str
    kernel: str
    arch: str
    status: str


def parse_proc_driver_version(text: str) -> DriverVersionInfo:
    """Parse /proc/driver/nvidia/version; both proprietary and open-module wordings."""
    for line in text.splitlines():
        match = _NVRM.match(line.strip())
        if match is not None:
            return DriverVersionInfo(match["version"], open_module="Open" in match["flavor"])
    raise ParseError(
        f"/proc/driver/nvidia/version: no 'NVRM version: ... Kernel Module <ver>' line"
        f" in {excerpt(text, 120)}"
    )


def parse_dkms_status(text: str) -> list[DkmsEntry]:
    """Parse `dkms status` in the dkms 2.x comma or 3.x slash format; diagnostics are skipped."""
    entries: list[DkmsEntry] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(_DKMS_DIAGNOSTIC):
            continue
        match = _DKMS.fullmatch(line)
        if match is None:
            raise ParseError(f"dkms status line {lineno}: unrecognised: {excerpt(line, 120)}")
        module, version, kernel, arch, status = match.groups("")
        entries.append(DkmsEntry(module, version, kernel, arch, status))
    return entries


def parse_containerd_version(text: str) -> tuple[int, int, int]:
    """Parse `containerd --version` ("containerd <package> [v]X.Y.Z <commit>") to (X, Y, Z)."""
    words = text.split()
    if not words or words[0].rsplit("/", 1)[-1] != "containerd":
        raise ParseError(
            f"containerd --version: does not start with 'containerd': {excerpt(text, 120)}"
        )
    for word in words[1:]:
        match = _CONTAINERD_VERSION.fullmatch(word)
        if match is not None:
            return int(match[1]), int(match[2]), int(match[3])
    raise ParseError(f"containerd --version: no X.Y.Z version in {excerpt(text, 120)}")


def parse_module_version(text: str) -> str:
    """Parse /sys/module/nvidia/version ("570.211.01\\n") to the bare version string."""
    version = text.strip()
    if not _MODULE_VERSION.fullmatch(version):
        raise ParseError(f"/sys/module/nvidia/version: not a driver version: {excerpt(text)}")
    return version


_PARAM = re.compile(r'(?P<key>[A-Za-z][A-Za-z0-9]*): (?P<value>"[^"\n]*"|[0-9]+)')


def parse_nvidia_params(text: str) -> dict[str, str]:
    """/proc/driver/nvidia/params (``Key: 123`` / ``Key: "text"``) -> key -> unquoted value."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _PARAM.fullmatch(line.rstrip())
        if m is None:
            raise ParseError(f"/proc/driver/nvidia/params: unexpected line {excerpt(line, 80)}")
        out[m["key"]] = m["value"].strip('"')
    return out
