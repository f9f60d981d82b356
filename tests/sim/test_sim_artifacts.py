"""Tests for bootfsm.sim.artifacts: every builder emits a real, tool-readable format."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from bootfsm.sim import artifacts

pytestmark = pytest.mark.skipif(
    not (shutil.which("makeself") and shutil.which("dpkg-deb")),
    reason="makeself and dpkg-deb are required",
)

VERSION = "580.159.04"
INSTALLER = '#!/bin/sh\necho "sim-installer $*" > "$(dirname "$0")/ran"\nexit 0\n'


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30, check=False)


def _deb822(text: str) -> list[dict[str, str]]:
    """Minimal deb822 reader: stanzas split on blank lines, continuation lines joined."""
    stanzas: list[dict[str, str]] = []
    for block in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        last = ""
        for line in block.splitlines():
            if line.startswith((" ", "\t")):
                fields[last] += "\n" + line[1:]
            else:
                last, value = line.split(":", 1)
                fields[last] = value.strip()
        stanzas.append(fields)
    return stanzas


@pytest.fixture(scope="module")
def runfile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runfile")
    return artifacts.build_runfile(
        out, version=VERSION, runfile_arch="aarch64", installer_source=INSTALLER
    )


def test_runfile_is_named_like_nvidia_and_passes_makeself_check(runfile: Path) -> None:
    """The runfile has NVIDIA's name, is executable and passes makeself --check."""
    assert runfile.name == f"NVIDIA-Linux-aarch64-{VERSION}.run"
    assert runfile.stat().st_mode & stat.S_IXUSR
    assert _run([str(runfile), "--check"]).returncode == 0
    assert not [p for p in runfile.parent.iterdir() if p.name.startswith(".")]


def test_runfile_info_and_list(runfile: Path) -> None:
    """--info shows NVIDIA's label and startup script; --list shows the payload."""
    info = _run([str(runfile), "--info"]).stdout
    assert f"NVIDIA Accelerated Graphics Driver for Linux-aarch64 {VERSION}" in info
    assert "./nvidia-installer" in info
    listing = _run([str(runfile), "--list"]).stdout
    for member in ("./nvidia-installer", "./LICENSE", "./kernel/", "./kernel-open/"):
        assert member in listing


@pytest.mark.parametrize("flag", ["-x", "--extract-only", "--noexec"])
def test_runfile_extract_only_into_target(runfile: Path, tmp_path: Path, flag: str) -> None:
    """[run, -x|--extract-only|--noexec, --target DIR] extracts and runs nothing."""
    target = tmp_path / "drv"
    result = _run([str(runfile), flag, "--target", str(target)])
    assert result.returncode == 0, result.stderr
    installer = target / "nvidia-installer"
    assert installer.read_text() == INSTALLER
    assert os.access(installer, os.X_OK)
    assert (target / "LICENSE").is_file()
    assert list((target / "kernel-open").iterdir())
    assert not (target / "ran").exists()


def test_runfile_x_without_target_extracts_into_cwd_like_nvidia(
    runfile: Path, tmp_path: Path
) -> None:
    """`sh X.run -x` (the aks-gpu invocation) leaves ./NVIDIA-Linux-<arch>-<ver>/."""
    result = _run(["sh", str(runfile), "-x"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    extracted = tmp_path / f"NVIDIA-Linux-aarch64-{VERSION}"
    assert (extracted / "nvidia-installer").read_text() == INSTALLER
    assert not (extracted / "ran").exists()


def test_runfile_target_without_x_runs_installer(runfile: Path, tmp_path: Path) -> None:
    """Without -x the startup script runs with the remaining arguments."""
    target = tmp_path / "run"
    result = _run([str(runfile), "--target", str(target), "-s", "--dkms"])
    assert result.returncode == 0, result.stderr
    assert (target / "ran").read_text() == "sim-installer -s --dkms\n"


def test_runfile_rejects_unknown_arch(tmp_path: Path) -> None:
    """Only the kernel's names (x86_64, aarch64) are accepted."""
    with pytest.raises(ValueError):
        artifacts.build_runfile(
            tmp_path, version=VERSION, runfile_arch="arm64", installer_source=INSTALLER
        )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    repo_dir = tmp_path_factory.mktemp("repo")
    imex = artifacts.build_deb(
        repo_dir,
        package="nvidia-imex",
        version=f"{VERSION}-1ubuntu1",
        arch="arm64",
        files={
            "/usr/bin/nvidia-imex": b"#!/bin/sh\nexit 0\n",
            "/etc/nvidia-imex/config.cfg": b"SERVER_PORT=50000\n",
            "/usr/share/doc/nvidia-imex/README": b"readme\n",
        },
        modes={"/usr/share/doc/nvidia-imex/README": 0o600},
        depends="nvidia-modprobe",
        description="NVIDIA IMEX\nExtended text.\n\nSecond paragraph.",
    )
    tools = artifacts.build_deb(
        repo_dir,
        package="nvidia-container-toolkit-base",
        version="1.19.0-1",
        arch="arm64",
        files={"/usr/bin/nvidia-ctk": b"#!/bin/sh\n"},
    )
    return repo_dir, [imex, tools]


def test_deb_is_real(repo: tuple[Path, list[Path]]) -> None:
    """dpkg-deb reads the control fields and lists files with their modes."""
    imex = repo[1][0]
    assert imex.name == f"nvidia-imex_{VERSION}-1ubuntu1_arm64.deb"
    info = _run(["dpkg-deb", "--info", str(imex)])
    assert info.returncode == 0
    assert "Package: nvidia-imex" in info.stdout
    assert "Depends: nvidia-modprobe" in info.stdout
    listing = _run(["dpkg-deb", "-c", str(imex)]).stdout
    lines = {line.split()[-1]: line.split()[0] for line in listing.splitlines()}
    assert lines["./usr/bin/nvidia-imex"] == "-rwxr-xr-x"
    assert lines["./etc/nvidia-imex/config.cfg"] == "-rw-r--r--"
    assert lines["./usr/share/doc/nvidia-imex/README"] == "-rw-------"
    assert "root/root" in listing


def test_deb_extracts_content(repo: tuple[Path, list[Path]], tmp_path: Path) -> None:
    """dpkg-deb -x gives back the exact bytes."""
    assert _run(["dpkg-deb", "-x", str(repo[1][0]), str(tmp_path)]).returncode == 0
    assert (tmp_path / "usr/bin/nvidia-imex").read_bytes() == b"#!/bin/sh\nexit 0\n"


def test_deb_rejects_relative_install_path(tmp_path: Path) -> None:
    """Install paths must be absolute and free of '..'."""
    for bad in ("usr/bin/x", "/usr/../etc/x"):
        with pytest.raises(ValueError):
            artifacts.build_deb(tmp_path, package="p", version="1", arch="all", files={bad: b""})


def test_packages_index_has_real_hashes(repo: tuple[Path, list[Path]]) -> None:
    """Each stanza carries the deb's control fields plus its real size and digests."""
    repo_dir, debs = repo
    index = artifacts.write_packages_index(repo_dir, debs)
    assert index == repo_dir / "Packages"
    stanzas = _deb822(index.read_text())
    assert [s["Package"] for s in stanzas] == ["nvidia-imex", "nvidia-container-toolkit-base"]
    for stanza, deb in zip(stanzas, debs, strict=True):
        data = deb.read_bytes()
        assert stanza["Filename"] == f"./{deb.name}"
        assert stanza["Size"] == str(len(data))
        assert stanza["SHA256"] == hashlib.sha256(data).hexdigest()
        assert stanza["SHA512"] == hashlib.sha512(data).hexdigest()
        assert stanza["MD5sum"] == hashlib.md5(data).hexdigest()
        assert stanza["SHA1"] == hashlib.sha1(data).hexdigest()
        assert stanza["Architecture"] == "arm64"
    imex = stanzas[0]
    assert imex["Version"] == f"{VERSION}-1ubuntu1"
    assert imex["Depends"] == "nvidia-modprobe"
    assert imex["Description"] == "NVIDIA IMEX\nExtended text.\n.\nSecond paragraph."
    assert "Depends" not in stanzas[1]
    assert list(imex)[-1] == "Description"


def test_packages_index_matches_dpkg_scanpackages(repo: tuple[Path, list[Path]]) -> None:
    """dpkg-scanpackages agrees on the hashes (when it is installed)."""
    if not shutil.which("dpkg-scanpackages"):
        pytest.skip("dpkg-scanpackages not installed")
    repo_dir, debs = repo
    ours = _deb822(artifacts.write_packages_index(repo_dir, debs).read_text())
    result = _run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo_dir)
    theirs = {s["Package"]: s for s in _deb822(result.stdout)}
    for stanza in ours:
        assert theirs[stanza["Package"]]["SHA256"] == stanza["SHA256"]
        assert theirs[stanza["Package"]]["Filename"] == stanza["Filename"]


def test_packages_index_refuses_outside_deb(repo: tuple[Path, list[Path]], tmp_path: Path) -> None:
    """A deb outside repo_dir cannot be indexed."""
    with pytest.raises(ValueError):
        artifacts.write_packages_index(tmp_path, repo[1])


@pytest.fixture(scope="module")
def fm_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    redist = tmp_path_factory.mktemp("redist")
    return artifacts.build_fabricmanager_archive(
        redist / "fabricmanager" / "linux-sbsa",
        version=VERSION,
        platform="linux-sbsa",
        start_script_source="#!/bin/sh\necho started\n",
    )


def test_fabricmanager_archive_layout(fm_archive: Path) -> None:
    """The tar.xz has NVIDIA's top directory, files, modes and the libnvfm symlink."""
    top = f"fabricmanager-linux-sbsa-{VERSION}-archive"
    assert fm_archive.name == f"{top}.tar.xz"
    with tarfile.open(fm_archive, "r:xz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        expected = [
            "LICENSE",
            "bin/nv-fabricmanager",
            "bin/nvidia-fabricmanager-start.sh",
            "bin/nvswitch-audit",
            "etc/fabricmanager.cfg",
            "etc/fabricmanager_multinode.cfg",
            "include/nv_fm_agent.h",
            "include/nv_fm_types.h",
            "lib/libnvfm.so.1",
            "sbin/fm_run_package_installer.sh",
            "share/nvidia/nvswitch/dgxa100_hgxa100_topology",
            "share/nvidia/nvswitch/dgxh100_hgxh100_topology",
            "share/nvidia/nvswitch/dgxb200_hgxb200_topology",
            "systemd/nvidia-fabricmanager.service",
            "third-party-notices.txt",
        ]
        for rel in expected:
            assert members[f"{top}/{rel}"].isfile(), rel
        link = members[f"{top}/lib/libnvfm.so"]
        assert link.issym() and link.linkname == "libnvfm.so.1"
        start = members[f"{top}/bin/nvidia-fabricmanager-start.sh"]
        assert start.mode == 0o755
        assert all(m.name.startswith(top) for m in members.values())
        assert {m.mtime for m in members.values()} == {artifacts.EPOCH}
        script = tar.extractfile(start)
        assert script is not None and script.read() == b"#!/bin/sh\necho started\n"
        unit = tar.extractfile(members[f"{top}/systemd/nvidia-fabricmanager.service"])
        assert unit is not None
        text = unit.read().decode()
    assert "ExecStart=/usr/bin/nvidia-fabricmanager-start.sh --mode start" in text
    assert "Type=forking" in text


def test_fabricmanager_archive_gnu_tar_reads_it(fm_archive: Path, tmp_path: Path) -> None:
    """GNU tar extracts it (the path the bash installer used)."""
    assert _run(["tar", "-xJf", str(fm_archive), "-C", str(tmp_path)]).returncode == 0
    lib = tmp_path / f"fabricmanager-linux-sbsa-{VERSION}-archive" / "lib"
    assert (lib / "libnvfm.so").resolve() == (lib / "libnvfm.so.1").resolve()


def test_fabricmanager_custom_unit_and_platform_check(tmp_path: Path) -> None:
    """unit_text replaces the unit; linux-aarch64 is refused (NVIDIA ships none)."""
    path = artifacts.build_fabricmanager_archive(
        tmp_path, version=VERSION, platform="linux-x86_64", start_script_source="", unit_text="X"
    )
    with tarfile.open(path) as tar:
        unit = tar.extractfile(
            f"fabricmanager-linux-x86_64-{VERSION}-archive/systemd/nvidia-fabricmanager.service"
        )
        assert unit is not None and unit.read() == b"X"
    with pytest.raises(ValueError):
        artifacts.build_fabricmanager_archive(
            tmp_path, version=VERSION, platform="linux-aarch64", start_script_source=""
        )


def test_redistrib_manifest_schema(fm_archive: Path) -> None:
    """The manifest follows NVIDIA's schema with the archive's true digests and size."""
    redist = fm_archive.parents[2]
    path = artifacts.write_redistrib_manifest(
        redist, version=VERSION, components={"fabricmanager": {"linux-sbsa": fm_archive}}
    )
    assert path == redist / f"redistrib_{VERSION}.json"
    doc = json.loads(path.read_text())
    assert doc["release_label"] == VERSION
    assert {"release_date", "release_product"} <= doc.keys()
    fm = doc["fabricmanager"]
    assert fm["name"] == "NVIDIA Fabric Manager"
    assert fm["version"] == VERSION
    assert fm["license_path"] == "fabricmanager/LICENSE.txt"
    data = fm_archive.read_bytes()
    assert fm["linux-sbsa"] == {
        "relative_path": f"fabricmanager/linux-sbsa/{fm_archive.name}",
        "sha256": hashlib.sha256(data).hexdigest(),
        "md5": hashlib.md5(data).hexdigest(),
        "size": str(len(data)),
    }
    assert artifacts.sha256_file(fm_archive) == hashlib.sha256(data).hexdigest()


def test_redistrib_manifest_refuses_outside_file(fm_archive: Path, tmp_path: Path) -> None:
    """Component files must live inside redist_dir."""
    with pytest.raises(ValueError):
        artifacts.write_redistrib_manifest(
            tmp_path, version=VERSION, components={"fabricmanager": {"linux-sbsa": fm_archive}}
        )


def test_nvlsm_archive_layout_and_manifest_entry(tmp_path: Path) -> None:
    """The NVLSM archive as the redist publishes it (one top directory; sbin/nvlsm,
    lib/, share/nvidia/nvlsm/nvlsm.conf, LICENSE), listed in the manifest with its own
    version, as redistrib_cuda_13.0.2 lists nvlsm 2025.06.6 beside driver 580.95.05."""
    redist = tmp_path / "redist"
    arc = artifacts.build_nvlsm_archive(
        redist / "nvlsm/linux-sbsa", version="2025.06.6", platform="linux-sbsa"
    )
    assert arc.name == "nvlsm-linux-sbsa-2025.06.6-archive.tar.xz"
    with tarfile.open(arc) as tf:
        names = tf.getnames()
        mode = tf.getmember("nvlsm-linux-sbsa-2025.06.6-archive/sbin/nvlsm").mode
    assert {n.split("/", 1)[0] for n in names} == {"nvlsm-linux-sbsa-2025.06.6-archive"}
    top = "nvlsm-linux-sbsa-2025.06.6-archive/"
    for rel in (
        "sbin/nvlsm",
        "share/nvidia/nvlsm/nvlsm.conf",
        "LICENSE",
        "third-party-notices.txt",
    ):
        assert top + rel in names
    assert any(n.startswith(top + "lib/") and n.endswith(".so") for n in names)
    assert mode == 0o755
    manifest = artifacts.write_redistrib_manifest(
        redist,
        version="580.95.05",
        components={"nvlsm": {"linux-sbsa": arc}},
        versions={"nvlsm": "2025.06.6"},
    )
    entry = json.loads(manifest.read_text())["nvlsm"]
    assert (entry["name"], entry["version"]) == ("NVLSM SM component", "2025.06.6")
    assert entry["linux-sbsa"]["relative_path"] == (
        "nvlsm/linux-sbsa/nvlsm-linux-sbsa-2025.06.6-archive.tar.xz"
    )
    assert entry["linux-sbsa"]["sha256"] == hashlib.sha256(arc.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="platform"):
        artifacts.build_nvlsm_archive(tmp_path, version="1", platform="linux-aarch64")
