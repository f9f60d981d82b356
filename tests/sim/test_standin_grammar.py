"""More stand-ins that refuse a bogus invocation as their real tool does.

update-initramfs: expected text written from initramfs-tools 0.142+deb12u3 (Debian 12;
its /usr/sbin/update-initramfs run with these arguments: getopt's message, then the
script's usage_error). containerd: compared with this machine's real containerd 1.6.20
when it is installed (its help names its own version, so that line is set aside).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bootfsm.sim.node import SKUS, build_node

USAGE = (
    "\nUsage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]\n\n"
    "Options:\n -k version\tSpecify kernel version or 'all'\n -c\t\tCreate a new initramfs\n"
    " -u\t\tUpdate an existing initramfs\n -d\t\tRemove an existing initramfs\n"
    " -b directory\tSet alternate boot directory\n -v\t\tBe verbose\n\n"
    "See update-initramfs(8) for further details.\n\n"
)


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("node") / "n"
    return build_node(root, SKUS["h100-pcie"], (), compile_seconds=0.01)


def _run(tool: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), *argv], capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    ("argv", "first"),
    [
        (["-u", "-Z"], "{p}: invalid option -- 'Z'\n"),
        (["--bogus"], "{p}: unrecognized option '--bogus'\n"),
        (["-u", "-k"], "{p}: option requires an argument -- 'k'\n"),
        (["-u", "extra"], "Extra argument 'extra'\n\n"),
        ([], "You must specify at least one of -c, -u, or -d.\n\n"),
    ],
)
def test_update_initramfs_refuses_like_initramfs_tools(
    bin_dir: Path, argv: list[str], first: str
) -> None:
    tool = bin_dir / "update-initramfs"
    out = _run(tool, *argv)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", first.format(p=tool) + USAGE)


def test_update_initramfs_help_and_the_real_work(bin_dir: Path) -> None:
    tool = bin_dir / "update-initramfs"
    assert (_run(tool, "-h").returncode, _run(tool, "-h").stdout) == (0, USAGE)
    ok = _run(tool, "-u", "-k", "5.15.0-1089-azure")
    assert ok.returncode == 0 and ok.stdout.startswith("update-initramfs: Generating /boot/")


REAL = shutil.which("containerd", path="/usr/bin:/usr/sbin:/bin")


@pytest.mark.parametrize(
    ("argv", "head"),
    [
        (["--bogus"], "Incorrect Usage. flag provided but not defined: -bogus\n\nNAME:\n"),
        (["config", "dump", "--bogus"], "Incorrect Usage: flag provided but not defined: -bogus\n"),
    ],
)
def test_containerd_undefined_flag_like_containerd(
    bin_dir: Path, argv: list[str], head: str
) -> None:
    ours = _run(bin_dir / "containerd", *argv)
    assert ours.returncode == 1
    assert ours.stderr == "containerd: flag provided but not defined: -bogus\n"
    assert ours.stdout.startswith(head)
    if REAL is None:
        return
    real = subprocess.run(
        [REAL, *argv], capture_output=True, text=True, check=False, env={**os.environ}
    )

    def same(text: str) -> list[str]:  # the VERSION section names each binary's own
        lines = text.splitlines()
        return [x for i, x in enumerate(lines) if not (i and lines[i - 1] == "VERSION:")]

    assert (real.returncode, real.stderr) == (1, ours.stderr)
    assert same(real.stdout) == same(ours.stdout)


DPKG_QUERY = shutil.which("dpkg-query", path="/usr/bin:/bin")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "unknown option --bogus"),
        ([], "need an action option"),
        (["-W", "-f"], "-f option takes a value"),
        (["-W", "--showformat"], "--showformat option takes a value"),
    ],
)
def test_dpkg_query_badusage_like_dpkg_query(bin_dir: Path, argv: list[str], message: str) -> None:
    """dpkg 1.21's badusage(): the error, a blank line, where help is; exit 2. The same as
    this machine's real dpkg-query prints, when it is installed."""
    ours = _run(bin_dir / "dpkg-query", *argv)
    want = f"dpkg-query: error: {message}\n\nUse --help for help about querying packages.\n"
    assert (ours.returncode, ours.stdout, ours.stderr) == (2, "", want)
    if DPKG_QUERY is not None:
        real = subprocess.run([DPKG_QUERY, *argv], capture_output=True, text=True, check=False)
        assert (real.returncode, real.stderr) == (2, want)
