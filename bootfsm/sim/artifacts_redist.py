"""Artifact builders: NVIDIA redist archives (fabric manager, NVLSM) and their manifest.

The fabric manager and NVLSM ``.tar.xz`` archives have the layout of NVIDIA's redist
tree (``<name>-<platform>-<version>-archive/``, here with stand-in payloads), and
``redistrib_<ver>.json`` NVIDIA's manifest schema (per platform relative_path, sha256,
md5 and size as a decimal string; per component name, license, license_path, version).
Shared helpers are in :mod:`artifacts_tools`; :mod:`artifacts` re-exports the public
builders.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from bootfsm.sim.artifacts_tools import EPOCH, check_name, digests

__all__ = ["build_fabricmanager_archive", "build_nvlsm_archive", "write_redistrib_manifest"]

_FM_PLATFORMS = frozenset({"linux-x86_64", "linux-sbsa"})


_FM_CFG = """\
# fabricmanager.cfg (bootfsm simulator stand-in)
LOG_LEVEL=4
LOG_FILE_NAME=/var/log/fabricmanager.log
LOG_APPEND_TO_LOG=1
DAEMONIZE=1
BIND_INTERFACE_IP=127.0.0.1
STARTING_TCP_PORT=16000
FABRIC_MODE=0
FABRIC_MODE_RESTART=0
STATE_FILE_NAME=/var/tmp/fabricmanager.state
FM_CMD_BIND_INTERFACE=127.0.0.1
FM_CMD_PORT_NUMBER=6666
FM_STAY_RESIDENT_ON_FAILURES=0
ACCESS_LINK_FAILURE_MODE=0
TRUNK_LINK_FAILURE_MODE=0
NVSWITCH_FAILURE_MODE=0
ABORT_CUDA_JOBS_ON_FM_EXIT=1
TOPOLOGY_FILE_PATH=/usr/share/nvidia/nvswitch
"""

# The unit of NVIDIA's 580 fabric manager, directive for directive as Ubuntu's
# nvidia-fabricmanager-580 580.196.07 ships it (lib/systemd/system/; the booted lane
# compares the two, tests/booted/real_nvidia.py): the start script's precheck and start
# modes, a 720 s start timeout (NVLSM and the fabric can take minutes) and the paths of
# both daemons' configuration and pid files.
_FM_UNIT = """\
[Unit]
Description=NVIDIA fabric manager service
After=network-online.target
Requires=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking
TimeoutStartSec=720
LimitCORE=infinity

Environment="FM_CONFIG_FILE=/usr/share/nvidia/nvswitch/fabricmanager.cfg"
Environment="FM_PID_FILE=/var/run/nvidia-fabricmanager/nv-fabricmanager.pid"
Environment="NVLSM_CONFIG_FILE=/usr/share/nvidia/nvlsm/nvlsm.conf"
Environment="NVLSM_PID_FILE=/var/run/nvidia-fabricmanager/nvlsm.pid"

PIDFile=/var/run/nvidia-fabricmanager/nv-fabricmanager.pid

ExecStartPre=/usr/bin/nvidia-fabricmanager-start.sh --mode precheck
ExecStart=/usr/bin/nvidia-fabricmanager-start.sh --mode start
ExecStop=/usr/bin/nvidia-fabricmanager-start.sh --mode stop

[Install]
WantedBy=multi-user.target
"""


def _fm_files(version: str, start_script: str, unit: str) -> dict[str, tuple[bytes, int]]:
    def tool(name: str) -> bytes:
        return f'#!/bin/sh\necho "{name}: bootfsm simulator stand-in, version {version}"\n'.encode()

    topo = b"bootfsm simulator topology placeholder\n"
    return {
        "LICENSE": (b"NVIDIA Driver License (bootfsm simulator stand-in)\n", 0o644),
        "bin/nv-fabricmanager": (tool("nv-fabricmanager"), 0o755),
        "bin/nvidia-fabricmanager-start.sh": (start_script.encode(), 0o755),
        "bin/nvswitch-audit": (tool("nvswitch-audit"), 0o755),
        "etc/fabricmanager.cfg": (_FM_CFG.encode(), 0o644),
        "etc/fabricmanager_multinode.cfg": (
            _FM_CFG.replace("FABRIC_MODE=0", "FABRIC_MODE=1").encode(),
            0o644,
        ),
        "include/nv_fm_agent.h": (b"/* nv_fm_agent.h placeholder */\n", 0o644),
        "include/nv_fm_types.h": (b"/* nv_fm_types.h placeholder */\n", 0o644),
        "lib/libnvfm.so.1": (f"libnvfm {version} placeholder\n".encode(), 0o644),
        "sbin/fm_run_package_installer.sh": (b"#!/bin/sh\nexit 0\n", 0o755),
        "share/nvidia/nvswitch/dgxa100_hgxa100_topology": (topo, 0o644),
        "share/nvidia/nvswitch/dgxh100_hgxh100_topology": (topo, 0o644),
        "share/nvidia/nvswitch/dgxb200_hgxb200_topology": (topo, 0o644),
        "systemd/nvidia-fabricmanager.service": (unit.encode(), 0o644),
        "third-party-notices.txt": (b"Third-party notices (bootfsm simulator stand-in)\n", 0o644),
    }


def _tar_member(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def build_fabricmanager_archive(
    out_dir: Path,
    *,
    version: str,
    platform: str,
    start_script_source: str,
    unit_text: str | None = None,
) -> Path:
    """Build ``out_dir/fabricmanager-<platform>-<version>-archive.tar.xz``.

    platform is "linux-x86_64" or "linux-sbsa" (never "linux-aarch64": NVIDIA publishes
    none). Layout as NVIDIA ships it, under ``fabricmanager-<platform>-<version>-archive/``,
    including the symlink ``lib/libnvfm.so -> libnvfm.so.1``; ``bin/`` and ``sbin/``
    scripts are 0755, ``bin/nvidia-fabricmanager-start.sh`` = start_script_source and
    ``systemd/nvidia-fabricmanager.service`` = unit_text or a realistic forking unit.
    Owner root:root, member times :data:`EPOCH`, written atomically.
    """
    if platform not in _FM_PLATFORMS:
        raise ValueError(f"platform must be one of {sorted(_FM_PLATFORMS)}")
    check_name("version", version)
    top = f"fabricmanager-{platform}-{version}-archive"
    files = _fm_files(
        version, start_script_source, unit_text if unit_text is not None else _FM_UNIT
    )
    dirs = sorted({str(PurePosixPath(p).parent) for p in files} - {"."})
    all_dirs = sorted(
        {str(p) for d in dirs for p in [PurePosixPath(d), *PurePosixPath(d).parents]} - {"."}
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"{top}.tar.xz"
    partial = final.with_name(f".{final.name}.partial")
    with tarfile.open(partial, "w:xz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_tar_member(top, tarfile.DIRTYPE, 0o755))
        for d in all_dirs:
            tar.addfile(_tar_member(f"{top}/{d}", tarfile.DIRTYPE, 0o755))
        for rel, (data, mode) in sorted(files.items()):
            tar.addfile(
                _tar_member(f"{top}/{rel}", tarfile.REGTYPE, mode, len(data)), io.BytesIO(data)
            )
        link = _tar_member(f"{top}/lib/libnvfm.so", tarfile.SYMTYPE, 0o777)
        link.linkname = "libnvfm.so.1"
        tar.addfile(link)
    os.replace(partial, final)
    return final


def build_nvlsm_archive(out_dir: Path, *, version: str, platform: str) -> Path:
    """Build ``out_dir/nvlsm-<platform>-<version>-archive.tar.xz``: NVLSM (the NVLink5
    subnet manager) as the redist publishes it, under ``nvlsm-<platform>-<version>-archive/``
    with ``sbin/nvlsm``, ``lib/``, ``share/nvidia/nvlsm/nvlsm.conf``, ``LICENSE`` and
    ``third-party-notices.txt`` (the layout Arch's nvlsm PKGBUILD unpacks; NVIDIA's RPM
    puts the same files under /opt/nvidia/nvlsm). Version is NVLSM's own (2025.06.6)."""
    if platform not in _FM_PLATFORMS:
        raise ValueError(f"platform must be one of {sorted(_FM_PLATFORMS)}")
    check_name("version", version)
    top = f"nvlsm-{platform}-{version}-archive"
    files = {
        "LICENSE": (b"NVIDIA Proprietary (bootfsm simulator stand-in)\n", 0o644),
        "third-party-notices.txt": (b"Third-party notices (bootfsm simulator stand-in)\n", 0o644),
        "sbin/nvlsm": (
            f'#!/bin/sh\necho "nvlsm: bootfsm simulator stand-in, version {version}"\n'.encode(),
            0o755,
        ),
        "lib/libnvlsm_plugin.so": (f"nvlsm plugin {version} placeholder\n".encode(), 0o644),
        "share/nvidia/nvlsm/nvlsm.conf": (b"# nvlsm.conf (bootfsm simulator stand-in)\n", 0o644),
    }
    dirs = sorted({str(p) for rel in files for p in PurePosixPath(rel).parents} - {"."})
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"{top}.tar.xz"
    partial = final.with_name(f".{final.name}.partial")
    with tarfile.open(partial, "w:xz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_tar_member(top, tarfile.DIRTYPE, 0o755))
        for d in dirs:
            tar.addfile(_tar_member(f"{top}/{d}", tarfile.DIRTYPE, 0o755))
        for rel, (data, mode) in sorted(files.items()):
            tar.addfile(
                _tar_member(f"{top}/{rel}", tarfile.REGTYPE, mode, len(data)), io.BytesIO(data)
            )
    os.replace(partial, final)
    return final


_COMPONENT_META = {
    "fabricmanager": ("NVIDIA Fabric Manager", "NVIDIA Driver"),
    "nvlsm": ("NVLSM SM component", "NVIDIA Proprietary"),
    "imex": ("Nvidia-Imex", "NVIDIA Proprietary"),
    "libnvidia_nscq": ("NVIDIA NSCQ API", "NVIDIA Driver"),
    "nvidia_driver": ("NVIDIA Linux Driver", "NVIDIA Driver"),
}


def write_redistrib_manifest(
    redist_dir: Path,
    *,
    version: str,
    components: Mapping[str, Mapping[str, Path]],
    release_date: str = "2025-01-01",
    release_product: str = "nvidia-driver",
    versions: Mapping[str, str] | None = None,
) -> Path:
    """Write ``redist_dir/redistrib_<version>.json`` in NVIDIA's manifest schema.

    components maps a component key ("fabricmanager") to platform ("linux-sbsa") to an
    existing file inside redist_dir (ValueError otherwise). Each platform entry holds
    relative_path (POSIX, from redist_dir), sha256, md5 and size (a decimal STRING, as
    NVIDIA writes it); each component has name, license, license_path and version (the
    driver's, or ``versions[key]``: NVLSM has its own, e.g. 2025.06.6).
    """
    check_name("version", version)
    base = redist_dir.resolve()
    doc: dict[str, object] = {
        "release_date": release_date,
        "release_label": version,
        "release_product": release_product,
    }
    for key, platforms in components.items():
        name, license_name = _COMPONENT_META.get(key, (key.replace("_", " "), "NVIDIA Driver"))
        entry: dict[str, object] = {
            "name": name,
            "license": license_name,
            "license_path": f"{key}/LICENSE.txt",
            "version": (versions or {}).get(key, version),
        }
        for platform, path in sorted(platforms.items()):
            resolved = path.resolve()
            if not resolved.is_relative_to(base) or not resolved.is_file():
                raise ValueError(f"{path} is not a file inside {redist_dir}")
            sums = digests(resolved, "sha256", "md5")
            entry[platform] = {
                "relative_path": resolved.relative_to(base).as_posix(),
                "sha256": sums["sha256"],
                "md5": sums["md5"],
                "size": str(resolved.stat().st_size),
            }
        doc[key] = entry
    manifest = redist_dir / f"redistrib_{version}.json"
    manifest.write_text(json.dumps(doc, indent=4) + "\n")
    return manifest
