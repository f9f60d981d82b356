"""Artifact builders: the makeself driver runfile, ``.deb`` packages and the apt index.

Each is a genuine file format the real tools accept: the runfile is made by the real
``makeself`` (Debian's header, edited in place on the same lines so that NVIDIA's
``-x``/``--extract-only`` and pass-through flags work as in NVIDIA's runfiles), the
packages by the real ``dpkg-deb``, and ``Packages`` carries the fields apt reads
(deb-control(5), the Debian repository format). Shared helpers are in
:mod:`artifacts_tools`; :mod:`artifacts` re-exports the public builders.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from bootfsm.sim.artifacts_tools import (
    EPOCH,
    ArtifactError,
    check_name,
    digests,
    run_tool,
    touch_tree,
)

__all__ = ["build_deb", "build_runfile", "write_packages_index"]

_RUNFILE_ARCHES = frozenset({"x86_64", "aarch64"})
_MAINTAINER = "bootfsm simulator <sim@bootfsm.invalid>"
_MAKESELF_OPTS = (
    *("--nox11", "--quiet", "--tar-quietly", "--gzip", "--complevel", "1"),
    *("--tar-extra", "--owner=0 --group=0 --numeric-owner --sort=name"),
    *("--packaging-date", "Wed Jan  1 00:00:00 UTC 2025"),
)
_EXEC_DIRS = ("/bin/", "/sbin/", "/usr/bin/", "/usr/sbin/", "/usr/local/bin/")


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
    check_name("version", version)
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
        touch_tree(stage)
        label = f"NVIDIA Accelerated Graphics Driver for Linux-{runfile_arch} {version}"
        argv = ["makeself", *_MAKESELF_OPTS, name, f"{name}.run", label, "./nvidia-installer"]
        run_tool(argv, cwd=Path(tmp))
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
    fields: Mapping[str, str] | None = None,
    links: Mapping[str, str] | None = None,
) -> Path:
    """Build ``out_dir/<package>_<version>_<arch>.deb`` with ``dpkg-deb --build``.

    files maps absolute install paths ("/usr/bin/nvidia-imex") to content; modes
    overrides per path (default 0755 under */bin and */sbin, else 0644). Owner is
    root:root (``--root-owner-group``), compression xz, member times :data:`EPOCH`.
    An epoch ("1:") in version is kept in the control file but left out of the file
    name, as Debian does. description: first line is the synopsis. ``fields`` adds
    control fields after Depends (Provides, Conflicts, Replaces, Breaks, in the given
    order); ``links`` maps absolute paths to symlink targets.
    """
    check_name("package", package)
    check_name("version", version)
    check_name("arch", arch)
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
        for path, target in sorted((links or {}).items()):
            parts = PurePosixPath(path).parts
            if not path.startswith("/") or ".." in parts or len(parts) < 2:
                raise ValueError(f"link path must be absolute and plain: {path!r}")
            dest = root.joinpath(*parts[1:])
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.symlink_to(target)
        control = [
            f"Package: {package}",
            f"Version: {version}",
            f"Architecture: {arch}",
            f"Maintainer: {_MAINTAINER}",
            f"Installed-Size: {installed_kib}",
            *([f"Depends: {depends}"] if depends else []),
            *(f"{name}: {value}" for name, value in (fields or {}).items()),
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
        touch_tree(root)
        run_tool(
            ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
            env={"SOURCE_DATE_EPOCH": str(EPOCH)},
        )
    return deb


def _control_fields(deb: Path) -> list[tuple[str, str]]:
    """Read a deb's control stanza via ``dpkg-deb -f`` as (name, raw value) pairs."""
    fields: list[tuple[str, str]] = []
    for line in run_tool(["dpkg-deb", "-f", str(deb)]).splitlines():
        if line[:1] in (" ", "\t") and fields:
            name, value = fields[-1]
            fields[-1] = (name, f"{value}\n{line}")
        elif ":" in line:
            name, value = line.split(":", 1)
            fields.append((name, value.strip()))
    return fields


def _file_fields(deb: Path, repo_dir: Path) -> list[tuple[str, str]]:
    sums = digests(deb, "md5", "sha1", "sha256", "sha512")
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
