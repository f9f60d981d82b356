"""Artifact factory: build small but REAL driver-stack artifacts for the simulator.

Every builder writes a genuine file format that the real tools accept: a makeself
runfile, ``.deb`` packages built by ``dpkg-deb``, an apt ``Packages`` index, the fabric
manager ``.tar.xz`` redist archive and NVIDIA's ``redistrib_<ver>.json`` manifest. Only
the payloads are stand-ins (scripts and placeholder text), so each artifact is a few KB
and builds in well under a second. External tools used: ``makeself``, ``dpkg-deb``,
``gpg`` (a real key signs each repository's Release: InRelease and Release.gpg).
Archive member times are fixed (:data:`EPOCH`) so that contents are reproducible.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import email.utils
import hashlib
import io
import json
import os
import re
import shutil
import subprocess  # noqa: TID251 - bootfsm/sim may run subprocesses
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = [
    "EPOCH",
    "ArtifactError",
    "RepoSigner",
    "build_deb",
    "build_fabricmanager_archive",
    "build_runfile",
    "sha256_file",
    "shared_signer",
    "sign_repository",
    "write_packages_index",
    "write_redistrib_manifest",
    "write_release",
]

EPOCH = 1_735_689_600
"""Fixed member mtime (2025-01-01T00:00:00Z) for reproducible archives."""

_TOOL_TIMEOUT_S = 60.0
_RUNFILE_ARCHES = frozenset({"x86_64", "aarch64"})
_FM_PLATFORMS = frozenset({"linux-x86_64", "linux-sbsa"})
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+~:_-]*$")
_MAINTAINER = "bootfsm simulator <sim@bootfsm.invalid>"
_MAKESELF_OPTS = (
    *("--nox11", "--quiet", "--tar-quietly", "--gzip", "--complevel", "1"),
    *("--tar-extra", "--owner=0 --group=0 --numeric-owner --sort=name"),
    *("--packaging-date", "Wed Jan  1 00:00:00 UTC 2025"),
)
_EXEC_DIRS = ("/bin/", "/sbin/", "/usr/bin/", "/usr/sbin/", "/usr/local/bin/")


class ArtifactError(RuntimeError):
    """An external tool (makeself, dpkg-deb) was missing, timed out or failed."""


def _run(
    argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> str:
    """Run argv (no shell) with a timeout; return stdout or raise ArtifactError."""
    try:
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            env=None if env is None else {**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=_TOOL_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ArtifactError(f"{argv[0]} is not installed (needed by bootfsm.sim)") from exc
    except subprocess.TimeoutExpired as exc:
        raise ArtifactError(f"{list(argv)!r} timed out after {_TOOL_TIMEOUT_S:g}s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise ArtifactError(f"{list(argv)!r} exited {proc.returncode}: {tail}")
    return proc.stdout


def _check_name(what: str, value: str) -> None:
    if not _SAFE_NAME.fullmatch(value):
        raise ValueError(f"invalid {what}: {value!r}")


def _touch_tree(root: Path) -> None:
    """Set every path under root (and root) to the fixed EPOCH mtime."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.utime(Path(dirpath, name), (EPOCH, EPOCH), follow_symlinks=False)
    os.utime(root, (EPOCH, EPOCH))


def _digests(path: Path, *names: str) -> dict[str, str]:
    """Hash the file once with each hashlib algorithm in names; return hex digests."""
    hashes = {name: hashlib.new(name, usedforsecurity=False) for name in names}
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            for digest in hashes.values():
                digest.update(chunk)
    return {name: digest.hexdigest() for name, digest in hashes.items()}


def sha256_file(path: Path) -> str:
    """Return the lowercase hex SHA-256 of the file at path."""
    return _digests(path, "sha256")["sha256"]


# --------------------------------------------------------------------------- runfile

# Same-line edits of the Debian makeself header (its ``skip`` line count must not
# change): accept NVIDIA's -x/--extract-only, and hand unknown flags (-s, --dkms, ...)
# to ./nvidia-installer as NVIDIA's runfile does instead of "Unrecognized flag", exit 1.
_HEADER_EDITS = (
    (
        rb"^(\s*)--noexec\)$",
        rb'\1-x | --extract-only) script=""; cleanup_script=""; keep=y; shift ;; --noexec)',
    ),
    (rb'^(\s*)echo Unrecognized flag : "\$1" >&2$', rb"\1break ;; __bootfsm_never__)"),
)


def _patch_makeself_header(run: Path) -> None:
    """Make a Debian makeself archive parse arguments like NVIDIA's runfile.

    The MD5 and CRC cover only the payload after the header, so ``--check`` passes.
    """
    blob = run.read_bytes()
    found = re.search(rb'^skip="(\d+)"$', blob, re.MULTILINE)
    if found is None:
        raise ArtifactError(f"{run}: no makeself skip= line")
    end = 0
    for _ in range(int(found.group(1))):
        end = blob.index(b"\n", end) + 1
    header, payload = blob[:end], blob[end:]
    for pattern, replacement in _HEADER_EDITS:
        header, count = re.subn(pattern, replacement, header, flags=re.MULTILINE)
        if count != 1:
            raise ArtifactError(f"{run}: unexpected makeself header ({pattern!r} x{count})")
    run.write_bytes(header + payload)


def build_runfile(
    out_dir: Path,
    *,
    version: str,
    runfile_arch: str,
    installer_source: str,
    blob_bytes: int = 0,
) -> Path:
    """Build ``out_dir/NVIDIA-Linux-<arch>-<version>.run``, a real makeself archive.

    The payload directory ``NVIDIA-Linux-<arch>-<version>/`` holds an executable
    ``nvidia-installer`` (= installer_source, which must carry its own shebang),
    ``LICENSE``, ``kernel/`` and ``kernel-open/`` (with ``blob_bytes`` of incompressible
    bytes as ``kernel/nv-kernel.o_binary``, like the real prebuilt blob, so downloads
    are big enough to drop and resume); the startup script is
    ``./nvidia-installer``. ``--info``, ``--check`` and ``--list`` work as usual.

    Extraction without installing -- use, as on the real NVIDIA runfile::

        [str(runfile), "-x", "--target", DIR]   # or ["sh", str(runfile), "-x", ...]

    Stock Debian makeself rejects ``-x`` and every other unknown flag ("Unrecognized
    flag", exit 1), so the header is patched (see _HEADER_EDITS) to parse like NVIDIA's:
    ``-x``/``--extract-only`` extract (into DIR, or ``./NVIDIA-Linux-<arch>-<version>``
    without ``--target``), keep the files and run nothing; the first unknown argument
    ends option parsing and it and everything after go to ``./nvidia-installer``, so
    ``[runfile, "--target", DIR, "-s", "--dkms"]`` extracts and then RUNS the installer
    with ``-s --dkms`` (put makeself options first). ``--noexec --target DIR`` also
    extracts only, but NVIDIA's runfile does not document ``--noexec``: prefer ``-x``.
    Progress text goes to stdout/stderr; DIR is created (with mode 0700) if missing.
    """
    if runfile_arch not in _RUNFILE_ARCHES:
        raise ValueError(f"runfile_arch must be one of {sorted(_RUNFILE_ARCHES)}")
    _check_name("version", version)
    name = f"NVIDIA-Linux-{runfile_arch}-{version}"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".runfile-") as tmp:
        stage = Path(tmp, name)
        for sub in ("kernel", "kernel-open"):
            (stage / sub).mkdir(parents=True)
            (stage / sub / "nvidia.c").write_text(f"/* {sub} placeholder for {version} */\n")
        if blob_bytes:
            seed = hashlib.sha256(version.encode()).digest()
            blocks = (blob_bytes + 31) // 32
            blob = b"".join(
                hashlib.sha256(seed + i.to_bytes(8, "big")).digest() for i in range(blocks)
            )
            (stage / "kernel" / "nv-kernel.o_binary").write_bytes(blob[:blob_bytes])
        (stage / "LICENSE").write_text("NVIDIA Software License (bootfsm simulator stand-in)\n")
        installer = stage / "nvidia-installer"
        installer.write_text(installer_source)
        installer.chmod(0o755)
        _touch_tree(stage)
        label = f"NVIDIA Accelerated Graphics Driver for Linux-{runfile_arch} {version}"
        argv = ["makeself", *_MAKESELF_OPTS, name, f"{name}.run", label, "./nvidia-installer"]
        _run(argv, cwd=Path(tmp))
        built = Path(tmp, f"{name}.run")
        _patch_makeself_header(built)
        final = out_dir / built.name
        os.replace(built, final)
    return final


# --------------------------------------------------------------------------- deb / apt


def _default_mode(path: str) -> int:
    return 0o755 if path.startswith(_EXEC_DIRS) else 0o644


def _description_field(description: str, package: str) -> str:
    lines = (description or f"{package} (bootfsm simulator build)").strip().splitlines()
    rest = [f" {line}" if line.strip() else " ." for line in lines[1:]]
    return "\n".join([f"Description: {lines[0]}", *rest])


def build_deb(
    out_dir: Path,
    *,
    package: str,
    version: str,
    arch: str,
    files: Mapping[str, bytes],
    modes: Mapping[str, int] | None = None,
    depends: str = "",
    description: str = "",
    conffiles: Sequence[str] = (),
) -> Path:
    """Build ``out_dir/<package>_<version>_<arch>.deb`` with ``dpkg-deb --build``.

    files maps absolute install paths ("/usr/bin/nvidia-imex") to content; modes
    overrides per path (default 0755 under */bin and */sbin, else 0644). Owner is
    root:root (``--root-owner-group``), compression xz, member times :data:`EPOCH`.
    An epoch ("1:") in version is kept in the control file but left out of the file
    name, as Debian does. description: first line is the synopsis.
    """
    _check_name("package", package)
    _check_name("version", version)
    _check_name("arch", arch)
    modes = modes or {}
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / f"{package}_{version.split(':', 1)[-1]}_{arch}.deb"
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".deb-") as tmp:
        root = Path(tmp, "root")
        (root / "DEBIAN").mkdir(parents=True)
        installed_kib = 0
        for path, data in sorted(files.items()):
            parts = PurePosixPath(path).parts
            if not path.startswith("/") or ".." in parts or len(parts) < 2:
                raise ValueError(f"install path must be absolute and plain: {path!r}")
            dest = root.joinpath(*parts[1:])
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            dest.chmod(modes.get(path, _default_mode(path)))
            installed_kib += (len(data) + 1023) // 1024
        control = [
            f"Package: {package}",
            f"Version: {version}",
            f"Architecture: {arch}",
            f"Maintainer: {_MAINTAINER}",
            f"Installed-Size: {installed_kib}",
            *([f"Depends: {depends}"] if depends else []),
            "Section: utils",
            "Priority: optional",
            _description_field(description, package),
        ]
        (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
        if conffiles:  # dpkg-deb refuses a conffile that is not in the package
            (root / "DEBIAN" / "conffiles").write_text("".join(f"{c}\n" for c in conffiles))
        for dirpath, _dirs, _files in os.walk(root):
            Path(dirpath).chmod(0o755)
        (root / "DEBIAN" / "control").chmod(0o644)
        if conffiles:
            (root / "DEBIAN" / "conffiles").chmod(0o644)
        _touch_tree(root)
        _run(
            ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
            env={"SOURCE_DATE_EPOCH": str(EPOCH)},
        )
    return deb


def _control_fields(deb: Path) -> list[tuple[str, str]]:
    """Read a deb's control stanza via ``dpkg-deb -f`` as (name, raw value) pairs."""
    fields: list[tuple[str, str]] = []
    for line in _run(["dpkg-deb", "-f", str(deb)]).splitlines():
        if line[:1] in (" ", "\t") and fields:
            name, value = fields[-1]
            fields[-1] = (name, f"{value}\n{line}")
        elif ":" in line:
            name, value = line.split(":", 1)
            fields.append((name, value.strip()))
    return fields


def _file_fields(deb: Path, repo_dir: Path) -> list[tuple[str, str]]:
    sums = _digests(deb, "md5", "sha1", "sha256", "sha512")
    rel = deb.resolve().relative_to(repo_dir.resolve()).as_posix()
    return [
        ("Filename", f"./{rel}"),
        ("Size", str(deb.stat().st_size)),
        ("MD5sum", sums["md5"]),
        ("SHA1", sums["sha1"]),
        ("SHA256", sums["sha256"]),
        ("SHA512", sums["sha512"]),
    ]


def write_packages_index(repo_dir: Path, debs: Sequence[Path]) -> Path:
    """Write ``repo_dir/Packages`` (deb822, as NVIDIA's flat apt repos publish it).

    One stanza per deb, in the given order: the deb's own control fields, then
    Filename ("./<path relative to repo_dir>"), Size, MD5sum, SHA1, SHA256, SHA512,
    then Homepage/Description last. Every deb must live inside repo_dir (ValueError).
    """
    stanzas: list[str] = []
    for deb in debs:
        if not deb.resolve().is_relative_to(repo_dir.resolve()):
            raise ValueError(f"{deb} is not inside {repo_dir}")
        control = _control_fields(deb)
        tail_names = ("Homepage", "Description")
        head = [f for f in control if f[0] not in tail_names]
        tail = [f for name in tail_names for f in control if f[0] == name]
        fields = [*head, *_file_fields(deb, repo_dir), *tail]
        stanzas.append("".join(f"{name}: {value}\n" for name, value in fields))
    index = repo_dir / "Packages"
    index.write_text("\n".join(stanzas))
    return index


# --------------------------------------------------------------------------- redist

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

_FM_UNIT = """\
[Unit]
Description=NVIDIA fabric manager service
After=network-online.target
Requires=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking
TimeoutStartSec=240

ExecStartPre=/usr/bin/nvidia-fabricmanager-start.sh --mode precheck
ExecStart=/usr/bin/nvidia-fabricmanager-start.sh --mode start
ExecStop=/usr/bin/nvidia-fabricmanager-start.sh --mode stop

PIDFile=/var/run/nvidia-fabricmanager/nv-fabricmanager.pid

LimitCORE=infinity

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
    _check_name("version", version)
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
    _check_name("version", version)
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
    _check_name("version", version)
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
            sums = _digests(resolved, "sha256", "md5")
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


# --------------------------------------------------------------------------- signing

_SIGNER_UID = "bootfsm simulator mirror <mirror@bootfsm.invalid>"
_GPG_BATCH = ("--batch", "--quiet", "--no-tty", "--pinentry-mode", "loopback", "--passphrase", "")


class RepoSigner:
    """A real OpenPGP signing key (ed25519, no passphrase) in a private GNUPGHOME, made
    with the real ``gpg --quick-gen-key``; signs Release files the way a repository
    publisher does (``gpg --clearsign`` for InRelease, ``--detach-sign`` for Release.gpg).

    ``faked_time`` (gpg's ``--faked-system-time``, e.g. "20200101T000000") makes the key
    and every signature as of that time; with ``expire`` ("1d") the key then expires a
    day later, and ``sig_expire`` makes signatures that expire (tests of expired keys and
    signatures). Stop with ``close()`` (the agent is killed, the home removed).
    """

    def __init__(
        self,
        home: Path | None = None,
        *,
        faked_time: str = "",
        expire: str = "0",
        uid: str = _SIGNER_UID,
    ) -> None:
        self.home = Path(home or tempfile.mkdtemp(prefix="bootfsm-sim-gpg-"))
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.home.chmod(0o700)
        self._time = ("--faked-system-time", faked_time) if faked_time else ()
        _run(
            ["gpg", "--homedir", str(self.home), *_GPG_BATCH, *self._time,
             "--quick-gen-key", uid, "ed25519", "sign", expire]
        )  # fmt: skip
        listing = _run(["gpg", "--homedir", str(self.home), "--with-colons", "--list-keys"])
        fprs = [ln.split(":")[9] for ln in listing.splitlines() if ln.startswith("fpr:")]
        if not fprs:
            raise ArtifactError(f"gpg made no key in {self.home}")
        self.fingerprint = fprs[0]

    def export_keyring(self, dest: Path) -> Path:
        """The public key as a binary keyring (the format of the keyring packages'
        /usr/share/keyrings/*.gpg, which gpgv --keyring reads)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        _run(["gpg", "--homedir", str(self.home), "--batch", "--yes", "--output", str(dest),
              "--export", self.fingerprint])  # fmt: skip
        return dest

    def sign(self, release: Path, *, sig_expire: str = "", time: str = "") -> None:
        """Write InRelease (clear-signed) and Release.gpg (detached, armored) beside
        ``release``."""
        extra = [*(("--default-sig-expire", sig_expire) if sig_expire else ())]
        when = ("--faked-system-time", time) if time else self._time
        for flag, out in (("--clearsign", "InRelease"), ("--detach-sign", "Release.gpg")):
            _run(
                ["gpg", "--homedir", str(self.home), *_GPG_BATCH, *when, "--yes",
                 "--digest-algo", "SHA512", "--local-user", self.fingerprint, *extra,
                 "--armor", "--output", str(release.parent / out), flag, str(release)]
            )  # fmt: skip

    def close(self) -> None:
        """Kill this home's gpg-agent and remove the home."""
        with contextlib.suppress(ArtifactError):
            _run(["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"])
        shutil.rmtree(self.home, ignore_errors=True)


_SHARED: RepoSigner | None = None


def shared_signer() -> RepoSigner:
    """One signing key per process, made on first use (key generation and the agent's
    start cost ~0.3 s; every world of a test session or the demo reuses it)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = RepoSigner()
        atexit.register(_SHARED.close)
    return _SHARED


def write_release(
    repo_dir: Path,
    *,
    arch: str,
    date: datetime.datetime | None = None,
    valid_until: datetime.datetime | None = None,
    files: Sequence[str] = ("Packages",),
) -> Path:
    """Write ``repo_dir/Release`` for a flat repository, in the field order
    ``apt-ftparchive release`` writes (Origin, Label, Architecture, Date, Valid-Until,
    then the MD5Sum/SHA1/SHA256/SHA512 lists of `` <hash> <size> <path>``)."""
    utc = datetime.timezone.utc
    when = date or datetime.datetime.now(utc)
    lines = [
        "Origin: bootfsm simulator",
        "Label: bootfsm simulator",
        f"Architecture: {arch}",
        f"Date: {email.utils.format_datetime(when.astimezone(utc), usegmt=False)}",
    ]
    if valid_until is not None:
        until = valid_until.astimezone(utc)
        lines.append(f"Valid-Until: {email.utils.format_datetime(until, usegmt=False)}")
    sums = {name: _digests(repo_dir / name, "md5", "sha1", "sha256", "sha512") for name in files}
    for field_name, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256"),
                             ("SHA512", "sha512")):  # fmt: skip
        lines.append(f"{field_name}:")
        for name in files:
            size = (repo_dir / name).stat().st_size
            lines.append(f" {sums[name][algo]} {size:>16} {name}")
    release = repo_dir / "Release"
    release.write_text("\n".join(lines) + "\n")
    return release


def sign_repository(repo_dir: Path, signer: RepoSigner, *, arch: str, **release: Any) -> Path:
    """Release for ``repo_dir``'s Packages, then InRelease and Release.gpg by ``signer``."""
    path = write_release(repo_dir, arch=arch, **release)
    signer.sign(path)
    return path
