"""Architecture names, normalized once: every naming scheme bootfsm meets, in one table."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ARCHES", "ArchNames", "normalize_arch"]


@dataclass(frozen=True)
class ArchNames:
    """One architecture under each of its names."""

    kernel: str  # /proc/sys/kernel/arch, uname -m, /usr/lib/<kernel>-linux-gnu
    debian: str  # dpkg, OCI, Go
    runfile: str  # NVIDIA-Linux-<runfile>-<ver>.run
    redist: str  # CUDA apt repo path and fabric manager redist (linux-<redist>)


ARCHES: dict[str, ArchNames] = {
    "x86_64": ArchNames(kernel="x86_64", debian="amd64", runfile="x86_64", redist="x86_64"),
    "aarch64": ArchNames(kernel="aarch64", debian="arm64", runfile="aarch64", redist="sbsa"),
}

_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "sbsa": "aarch64"}


def normalize_arch(name: str) -> ArchNames | None:
    """Map any known spelling (``aarch64``, ``arm64``, ``sbsa``, ``amd64``...) to its names."""
    key = name.strip().lower()
    return ARCHES.get(_ALIASES.get(key, key))
