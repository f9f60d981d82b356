"""apt stays usable after IMEX (issue 31 item 10), judged by the real dpkg and apt-get.

nvidia-imex declares ``Depends: nvidia-modprobe``, which the driver runfile installs
without telling dpkg. `dpkg -i --force-depends` left the dependency unmet in dpkg's
database, so `apt-get check` failed, `apt-get install` asked for --fix-broken and
unattended-upgrades stopped. bootfsm records the runfile's nvidia-modprobe for dpkg
(bootfsm/install/runfile_debs.py) and installs nvidia-imex without forcing anything.

A simulated GB300 tray boots with the real dpkg and dpkg-query (``--root`` on the node,
the tray's arm64 added as dpkg's architecture there); afterwards the real `apt-get
check`, pointed at the node with ``-o Dir=``, must pass, with nvidia-imex installed and
its host unit masked.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bootfsm.sim.nodestate import Node
from bootfsm.sim.world import DRIVER_VERSION, World
from tests.conftest import MakeWorld, run_in_process
from tests.samples import on_ci
from tests.test_uninstall import REAL_DPKG, env_of, query, real_dpkg_path

REAL_APT_GET = shutil.which("apt-get", path="/usr/bin:/bin")


def _tools() -> None:
    if REAL_DPKG is None or REAL_APT_GET is None:
        if on_ci():
            pytest.fail("the real dpkg and apt-get are needed", pytrace=False)
        pytest.skip("the real dpkg and apt-get are not installed")


def apt_check(w: World, arch: str) -> subprocess.CompletedProcess[str]:
    """The real `apt-get check` on the node's own dpkg database and apt directories."""
    assert REAL_APT_GET is not None
    for d in ("etc/apt/sources.list.d", "etc/apt/preferences.d", "etc/apt/apt.conf.d",
              "var/lib/apt/lists/partial", "var/cache/apt/archives/partial"):  # fmt: skip
        (w.root / d).mkdir(parents=True, exist_ok=True)
    status = f"Dir::State::status={w.root}/var/lib/dpkg/status"
    argv = [
        REAL_APT_GET, "-o", f"Dir={w.root}", "-o", status, "-o", f"APT::Architecture={arch}",
        "-o", f"APT::Architectures::={arch}", "check",
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _booted_with_real_dpkg(make_world: MakeWorld, tmp_path: Path) -> World:
    _tools()
    assert REAL_DPKG is not None
    w = make_world("gb300")
    path = real_dpkg_path(w, tmp_path)
    subprocess.run(
        [REAL_DPKG, f"--root={w.root}", "--add-architecture", "arm64"], check=True, timeout=60
    )
    result = run_in_process(w, env=env_of(w, path))
    assert result.outcome.ok, result.outcome.message
    return w


def test_apt_get_check_passes_after_imex(make_world: MakeWorld, tmp_path: Path) -> None:
    w = _booted_with_real_dpkg(make_world, tmp_path)
    assert query(w, "nvidia-imex") == f"ii {DRIVER_VERSION}-1ubuntu1"  # the real dpkg installed it
    assert query(w, "nvidia-modprobe") == f"ii {DRIVER_VERSION}-1+runfile"
    check = apt_check(w, "arm64")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "unmet dependencies" not in check.stdout + check.stderr
    assert Node(w.root).is_masked("nvidia-imex.service")
    status = (w.root / "var/lib/dpkg/status").read_text()
    record = status.split("Package: nvidia-modprobe\n", 1)[1].split("\n\n", 1)[0]
    assert f"/usr/bin/nvidia-modprobe {DRIVER_VERSION} was installed by nvidia-installer" in record
    assert not (w.root / "var/lib/dpkg/info/nvidia-modprobe.list").read_text().strip("/.\n")


def test_apt_get_check_sees_a_forced_dependency(make_world: MakeWorld, tmp_path: Path) -> None:
    """The check the test above relies on: the real apt-get check fails on exactly what
    `dpkg -i --force-depends nvidia-imex` used to leave."""
    w = _booted_with_real_dpkg(make_world, tmp_path)
    assert REAL_DPKG is not None
    subprocess.run(
        [REAL_DPKG, f"--root={w.root}", "--force-depends", "--purge", "nvidia-modprobe"],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    check = apt_check(w, "arm64")
    assert check.returncode == 100
    assert "nvidia-imex : Depends: nvidia-modprobe but it is not installable" in check.stdout


def test_a_node_without_the_runfiles_nvidia_modprobe_claims_nothing(tmp_path: Path) -> None:
    """No package and no /usr/bin/nvidia-modprobe: nothing is recorded, IMEX fails (52)
    and names the missing dependency instead of forcing it."""
    from bootfsm.core.codes import Code
    from bootfsm.core.errors import BootError
    from bootfsm.install.runfile_debs import ensure_nvidia_modprobe
    from tests.test_verify import Node as VerifyNode

    node = VerifyNode(tmp_path, "aarch64", 0x31C2, 4)
    node._script("dpkg-query", "import sys\nprint('dpkg-query: no packages found matching "
                 "nvidia-modprobe', file=sys.stderr)\nsys.exit(1)")  # fmt: skip
    node.ctx.state = "imex"
    with pytest.raises(BootError) as err:
        ensure_nvidia_modprobe(node.ctx, Code.IMEX_INSTALL_FAILED)
    assert err.value.code is Code.IMEX_INSTALL_FAILED
    assert "/usr/bin/nvidia-modprobe is absent" in err.value.message
    assert not (node.root / "var/lib/bootfsm/debs").exists()
