"""Tests for the stand-in commands (bootfsm.sim.standins), run as real subprocesses."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from bootfsm.sim.node import SKUS, DpkgLockHolder, build_node, calls, standin_script
from tests.smi_text import parse_smi_query

VERSION = "580.159.04"
FM_UNIT = """\
[Unit]
Description=NVIDIA fabric manager service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-fabricmanager-start.sh --mode start

[Install]
WantedBy=multi-user.target
"""


@dataclass
class SimNode:
    """A built node plus helpers to run its stand-ins as subprocesses."""

    root: Path
    bin_dir: Path
    arch: str

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        return subprocess.run(
            list(argv), env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def installer(self, version: str = VERSION, arch: str | None = None) -> str:
        """Place the runfile's nvidia-installer as bootfsm's extraction would."""
        extract = self.root / f"var/lib/bootfsm/extract/NVIDIA-Linux-{arch or self.arch}-{version}"
        extract.mkdir(parents=True, exist_ok=True)
        path = extract / "nvidia-installer"
        path.write_text(standin_script("nvidia-installer", self.root))
        path.chmod(0o755)
        return str(path)

    def install(self, module_type: str, *extra: str) -> subprocess.CompletedProcess[str]:
        kernel = (self.root / "proc/sys/kernel/osrelease").read_text().strip()
        return self.run(
            self.installer(), "-s", "-a", "--no-drm", "--dkms", f"-k={kernel}",
            f"--kernel-module-type={module_type}",
            f"--log-file-name={self.root}/var/log/nvidia-installer.log", *extra,
        )  # fmt: skip

    def fabric(self) -> tuple[str, str]:
        report = parse_smi_query(self.run("nvidia-smi", "-q").stdout)
        return report.gpus[0].fabric_state, report.gpus[0].fabric_status

    def add_fm_unit(self) -> None:
        (self.root / "lib/systemd/system/nvidia-fabricmanager.service").write_text(FM_UNIT)


MakeNode = Callable[..., SimNode]


@pytest.fixture
def make_node(tmp_path: Path) -> MakeNode:
    def make(sku: str, *faults: str) -> SimNode:
        root = tmp_path / f"{sku}-{len(list(tmp_path.iterdir()))}"
        bin_dir = build_node(root, SKUS[sku], faults, compile_seconds=0.01)
        return SimNode(root, bin_dir, SKUS[sku].arch)

    return make


def _ready(node: SimNode, module_type: str | None = None) -> None:
    """Install and load the driver (recommended module type by default)."""
    if module_type is None:
        out = node.run(node.installer(), "--print-recommended-kernel-module-type").stdout
        module_type = out.strip()
    done = node.install(module_type)
    assert done.returncode == 0, done.stderr
    loaded = node.run("nvidia-modprobe", "-u", "-c0")
    assert loaded.returncode == 0, loaded.stderr


# ------------------------------------------------------------------------- driver


def test_a_trusted_launch_node_shows_secure_boot_as_linux_does(make_node: MakeNode) -> None:
    node = make_node("h100-pcie", "secure-boot")
    efivars = node.root / "sys/firmware/efi/efivars"
    # efivarfs: attributes 0x00000006 (boot service | runtime access), then the UINT8
    assert (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").read_bytes() == (
        b"\x06\x00\x00\x00\x01"
    )
    lockdown = (node.root / "sys/kernel/security/lockdown").read_text()
    assert lockdown == "none [integrity] confidentiality\n"
    plain = make_node("h100-pcie")
    assert (plain.root / "sys/kernel/security/lockdown").read_text() == (
        "[none] integrity confidentiality\n"
    )


def test_secure_boot_refuses_the_unsigned_module_as_kmod_says(make_node: MakeNode) -> None:
    """kmod 30 tools/modprobe.c: "could not insert '%s': %s" with strerror(EKEYREJECTED);
    the kernel logs "Loading of unsigned module is rejected" (kernel/module/signing.c)."""
    node = make_node("h100-pcie", "secure-boot")
    assert node.install("open").returncode == 0  # DKMS builds; nothing signs it
    load = node.run("modprobe", "nvidia")
    assert load.returncode == 1
    assert load.stderr == (
        "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service\n"
    )
    assert not (node.root / "sys/module/nvidia").exists()
    kernel = node.run("journalctl", "-k", "-o", "cat", "--no-pager", "-n", "1").stdout
    assert kernel == "Loading of unsigned module is rejected\n"
    quiet = node.run("nvidia-modprobe", "-u", "-c0")
    assert (quiet.returncode, quiet.stderr) == (1, "")
    (node.root / "sys/module/module/parameters/sig_enforce").write_text("N\n")
    eperm = node.run("modprobe", "nvidia")  # lockdown alone: EPERM, the reason in the log
    assert eperm.stderr == "modprobe: ERROR: could not insert 'nvidia': Operation not permitted\n"
    assert node.run("journalctl", "-k", "-o", "cat", "-n", "1").stdout == (
        "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7\n"
    )
    (node.root / "sys/kernel/security/lockdown").write_text("[none] integrity confidentiality\n")
    assert node.run("modprobe", "nvidia").returncode == 0  # nothing enforces: it loads


@pytest.mark.parametrize(
    ("sku", "recommended"),
    [("h100-hgx", "open"), ("h100-pcie", "open"), ("b200-hgx", "open"),
     ("gb200", "open"), ("gb300", "open")],
)  # fmt: skip
def test_install_load_and_query_every_sku(make_node: MakeNode, sku: str, recommended: str) -> None:
    node = make_node(sku)
    kernel = SKUS[sku].kernel
    out = node.run(node.installer(), "--print-recommended-kernel-module-type")
    # one word (nvidia-installer print_module_type); 570 recommends open from Turing on
    assert (out.returncode, out.stdout) == (0, f"{recommended}\n")
    assert node.run("nvidia-smi").returncode == 9

    _ready(node, recommended)

    status = node.run("dkms", "status", "-m", "nvidia").stdout
    assert status == f"nvidia/{VERSION}, {kernel}, {node.arch}: installed\n"
    assert (node.root / f"usr/src/nvidia-{VERSION}/dkms.conf").is_file()
    lib = node.root / f"usr/lib/{node.arch}-linux-gnu/libnvidia-ml.so.1"
    assert os.readlink(lib) == f"libnvidia-ml.so.{VERSION}"
    assert (node.root / "sys/module/nvidia/version").read_text() == f"{VERSION}\n"
    proc = (node.root / "proc/driver/nvidia/version").read_text()
    assert ("Open Kernel Module" in proc) is (recommended == "open")
    assert (
        "installation of the nvidia"
        in (node.root / "var/log/nvidia-installer.log").read_text().lower()
    )

    smi = node.run("nvidia-smi", "-q")
    assert smi.returncode == 0, smi.stdout
    report = parse_smi_query(smi.stdout)
    assert report.driver_version == VERSION
    assert report.attached_gpus == len(report.gpus) == SKUS[sku].gpu_count
    assert len(node.run("nvidia-smi", "-L").stdout.splitlines()) == SKUS[sku].gpu_count
    assert len(list((node.root / "dev").glob("nvidia[0-9]*"))) == SKUS[sku].gpu_count
    switches = node.root / "proc/driver/nvidia-nvswitch/devices"
    seen = len(list(switches.iterdir())) if switches.exists() else 0
    assert seen == SKUS[sku].nvswitch_count


def test_extract_only_and_bad_options(make_node: MakeNode) -> None:
    node = make_node("h100-pcie")
    assert node.run(node.installer(), "-x").returncode == 0
    assert not (node.root / "var/lib/dkms").exists()
    bad = node.run(node.installer(), "-s", "--bogus")
    assert bad.returncode == 1 and 'unrecognized option: "--bogus"' in bad.stderr
    wrong_arch = node.run(node.installer(arch="aarch64"), "-s")
    assert wrong_arch.returncode == 126 and "Exec format error" in wrong_arch.stderr


def test_blackwell_with_proprietary_module_fails_to_load(make_node: MakeNode) -> None:
    node = make_node("b200-hgx")
    assert node.install("proprietary").returncode == 0
    load = node.run("nvidia-modprobe", "-u", "-c0")
    assert (load.returncode, load.stderr) == (1, "")  # modprobe's words go to /dev/null
    assert node.run("modprobe", "nvidia").returncode == 1
    dmesg = node.run("journalctl", "-k", "-o", "cat", "--no-pager").stdout
    assert "requires use of the NVIDIA open kernel modules" in dmesg
    assert node.run("nvidia-smi", "-q").returncode == 9


def test_missing_module_and_missing_headers(make_node: MakeNode) -> None:
    node = make_node("h100-pcie", "kernel-headers-missing")
    load = node.run("modprobe", "nvidia")
    assert load.returncode == 1
    assert load.stderr == (
        "modprobe: FATAL: Module nvidia not found in directory /lib/modules/5.15.0-1089-azure\n"
    )
    done = node.install("proprietary")
    assert done.returncode == 1
    assert "Unable to find the kernel source tree" in done.stderr
    assert "ERROR: Installation has failed." in done.stderr
    assert "kernel source tree" in (node.root / "var/log/nvidia-installer.log").read_text()


def test_stale_driver_blocks_install_until_unloaded(make_node: MakeNode) -> None:
    node = make_node("h100-hgx", "stale-driver")
    blocked = node.install("proprietary")
    assert blocked.returncode == 1
    assert "An NVIDIA kernel module 'nvidia' appears to already be loaded" in blocked.stderr
    assert node.run("modprobe", "-r", "nvidia").returncode == 0
    assert not (node.root / "sys/module/nvidia").exists()
    _ready(node, "proprietary")
    assert parse_smi_query(node.run("nvidia-smi", "-q").stdout).driver_version == VERSION
    assert not list((node.root / "usr/lib/x86_64-linux-gnu").glob("*535.183.01"))
    assert not (node.root / "var/lib/dkms/nvidia/535.183.01").exists()


def test_stale_driver_in_use_cannot_be_unloaded(make_node: MakeNode) -> None:
    node = make_node("h100-hgx", "stale-driver-in-use")
    out = node.run("modprobe", "-r", "nvidia")
    assert (out.returncode, out.stderr) == (1, "modprobe: FATAL: Module nvidia is in use.\n")
    assert (node.root / "sys/module/nvidia/version").read_text() == "535.183.01\n"


def test_partial_upgrade_gives_nvml_version_mismatch(make_node: MakeNode) -> None:
    node = make_node("h100-hgx", "stale-driver-in-use")
    done = node.install("proprietary", "--allow-installation-with-running-driver")
    assert done.returncode == 0, done.stderr
    smi = node.run("nvidia-smi")
    assert smi.returncode == 18
    assert smi.stdout == (
        "Failed to initialize NVML: Driver/library version mismatch\n"
        "NVML library version: 580.159\n"
    )


def test_installer_fails_fault(make_node: MakeNode) -> None:
    node = make_node("h100-pcie", "installer-fails")
    done = node.install("proprietary")
    assert done.returncode == 1
    assert "ERROR: Unable to build the NVIDIA kernel module." in done.stderr
    assert "Unable to build" in (node.root / "var/log/nvidia-installer.log").read_text()
    assert node.run("dkms", "status").stdout == ""


def test_installer_hangs_fault_dies_on_sigterm(make_node: MakeNode) -> None:
    node = make_node("h100-pcie", "installer-hangs")
    env = {**os.environ, "PATH": f"{node.bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([node.installer(), "-s", "--dkms"], env=env)
    try:
        deadline = time.monotonic() + 10
        log = node.root / "var/log/nvidia-installer.log"
        while "Installing NVIDIA driver" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.1)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert [(c["cmd"], c["rc"]) for c in calls(node.root)] == [("nvidia-installer", -15)]


# ------------------------------------------------------------------------- nvidia-smi


def test_inforom_and_gpu_missing_faults(make_node: MakeNode) -> None:
    node = make_node("h100-hgx", "inforom-corrupted", "gpu-missing")
    _ready(node)
    smi = node.run("nvidia-smi", "-q")
    assert smi.returncode == 0
    report = parse_smi_query(smi.stdout)
    assert len(report.gpus) == 7
    # as the real tool: `-q -x` exits 0 and says nothing of the infoROM (microsoft/pai
    # #3756 in samples nvidia-smi/nvml_error_excerpts.txt); only the table warns
    xml = node.run("nvidia-smi", "-q", "-x")
    assert xml.returncode == 0 and "infoROM" not in xml.stdout + xml.stderr
    table = node.run("nvidia-smi")
    assert table.returncode == 14
    assert table.stdout.rstrip().endswith("WARNING: infoROM is corrupted at gpu 0001:00:00.0")
    assert "| NVIDIA-SMI 580.159.04" in table.stdout


def test_fabric_hgx_waits_for_fabric_manager(make_node: MakeNode) -> None:
    node = make_node("h100-hgx")
    _ready(node)
    assert node.fabric() == ("In Progress", "N/A")
    node.add_fm_unit()
    start = node.run("systemctl", "start", "nvidia-fabricmanager")
    assert start.returncode == 0, start.stderr
    assert node.fabric() == ("Completed", "Success")


def test_fabric_nvlink5_starts_only_through_its_unit(make_node: MakeNode) -> None:
    """As on a real NVLink5 node: the unit's precheck needs ib_umad and NVLSM; the start
    script run by hand starts the daemons but leaves nvidia-fabricmanager.service
    inactive (fm_failure_and_status_excerpts.txt [D]; the 580 unit's ExecStartPre /
    ExecStart lines)."""
    node = make_node("b200-hgx")
    _ready(node)
    assert node.fabric() == ("In Progress", "N/A")
    script = node.root / "usr/bin/nvidia-fabricmanager-start.sh"
    script.write_text(standin_script("nvidia-fabricmanager-start.sh", node.root))
    script.chmod(0o755)
    node.add_fm_unit()
    # the 580.196.07 script's precheck only waits for an InfiniBand device; ib_umad is
    # checked by --mode start, after the NVLink5 detection (tests/booted/real_nvidia.py)
    out = node.run(str(script), "--mode", "precheck")
    assert (out.returncode, out.stdout) == (
        0,
        "Polling for at least one Infiniband device before starting Fabric Manager...\n",
    )
    out = node.run(str(script), "--mode", "start")
    assert out.returncode == 1
    assert out.stdout == (
        "Checking mlx5_0...\n"
        "Using device mlx5_0, port 0x0820e703007b9d9a\n"
        "Detected NVL5+ system\n"
        'Kernel module "ib_umad" has not been loaded, fabric manager cannot be started\n'
        'Please run "modprobe ib_umad" before starting fabric manager\n'
    )
    start = node.run("systemctl", "start", "nvidia-fabricmanager")
    assert start.returncode == 1 and "failed because the control process exited" in start.stderr
    assert node.run("modprobe", "ib_umad").returncode == 0
    assert (node.root / "sys/module/ib_umad").is_dir()
    out = node.run(str(script), "--mode", "start")
    assert out.returncode == 1 and out.stdout.endswith(
        '"/opt/nvidia/nvlsm/sbin/nvlsm" does not exist. Please make sure to install'
        ' "Nvidia NVLink Subnet Manager"(nvlsm) package.\n'
    )
    nvlsm = node.root / "opt/nvidia/nvlsm/sbin/nvlsm"
    nvlsm.parent.mkdir(parents=True)
    nvlsm.write_text("#!/bin/sh\n")
    out = node.run(str(script), "--mode", "start")
    assert out.returncode == 0, out.stderr
    assert "Detected NVL5+ system" in out.stdout
    # the unit stays as its last start left it, whatever the script did by hand
    assert node.run("systemctl", "is-active", "nvidia-fabricmanager").stdout == "failed\n"
    start = node.run("systemctl", "start", "nvidia-fabricmanager")
    assert start.returncode == 0, start.stderr
    assert node.run("systemctl", "is-active", "nvidia-fabricmanager", "nvlsm").stdout == (
        "active\nactive\n"
    )
    assert node.fabric() == ("Completed", "Success")


def test_ib_umad_missing_fault(make_node: MakeNode) -> None:
    node = make_node("b200-hgx", "ib-umad-missing")
    out = node.run("modprobe", "ib_umad")
    assert out.returncode == 1
    assert out.stderr == (
        "modprobe: FATAL: Module ib_umad not found in directory /lib/modules/6.8.0-1021-azure\n"
    )


def test_fabric_manager_fails_without_switches(make_node: MakeNode) -> None:
    node = make_node("h100-pcie")
    _ready(node)
    assert node.fabric() == ("N/A", "N/A")
    script = node.root / "usr/bin/nvidia-fabricmanager-start.sh"
    script.write_text(standin_script("nvidia-fabricmanager-start.sh", node.root))
    script.chmod(0o755)
    out = node.run(str(script), "--mode", "start")
    assert out.returncode == 1
    assert out.stdout == (
        "Detected Pre-NVL5 system\n"
        '"/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg"'
        " failed! Exit code: 1\n"
    )
    assert "[NV_WARN_NOTHING_TO_DO]" in out.stderr
    node.add_fm_unit()
    start = node.run("systemctl", "start", "nvidia-fabricmanager.service")
    assert start.returncode == 1
    assert start.stderr.startswith(
        "Job for nvidia-fabricmanager.service failed because the control process exited"
        " with error code."
    )
    assert node.run("systemctl", "is-active", "nvidia-fabricmanager").stdout == "failed\n"


def test_fabric_manager_needs_the_driver(make_node: MakeNode) -> None:
    node = make_node("h100-hgx")
    node.add_fm_unit()
    assert node.run("systemctl", "start", "nvidia-fabricmanager").returncode == 1


def test_fabric_in_progress_forever(make_node: MakeNode) -> None:
    node = make_node("gb300", "fabric-in-progress-forever")
    _ready(node)
    assert [node.fabric() for _ in range(3)] == [("In Progress", "N/A")] * 3


# ------------------------------------------------------------------------- systemctl


def test_systemctl_show_prints_units_properties_in_systemds_order(make_node: MakeNode) -> None:
    """`systemctl show -p` as systemd 252/257 print it: the requested properties in the
    Unit interface's order (dbus-unit.c), empty ones too, units apart by a blank line."""
    node = make_node("h100-pcie")
    run = node.run
    assert run("systemctl", "enable", "kubelet").returncode == 0
    assert run("systemctl", "start", "kubelet").returncode == 0
    shown = run("systemctl", "show", "-p", "UnitFileState", "-p", "ActiveState", "kubelet",
                "nvidia-imex")  # fmt: skip
    assert (shown.returncode, shown.stdout) == (
        0,
        "ActiveState=active\nUnitFileState=enabled\n\nActiveState=inactive\nUnitFileState=\n",
    )
    both = run("systemctl", "show", "--property=LoadState,UnitFileState", "nvidia-imex")
    assert both.stdout == "LoadState=not-found\nUnitFileState=\n"
    bad = run("systemctl", "show", "-p")
    assert (bad.returncode, bad.stderr) == (1, "systemctl: option requires an argument -- 'p'\n")
    bogus = run("systemctl", "show", "--no-such-option", "kubelet")
    assert (bogus.returncode, bogus.stderr) == (
        1, "systemctl: unrecognized option '--no-such-option'\n"
    )  # fmt: skip


def test_systemctl_enable_mask_start_semantics(make_node: MakeNode) -> None:
    node = make_node("h100-pcie")
    run = node.run
    missing = run("systemctl", "enable", "nvidia-imex")
    assert missing.returncode == 1
    assert (
        missing.stderr == "Failed to enable unit: Unit file nvidia-imex.service does not exist.\n"
    )
    assert run("systemctl", "start", "nvidia-imex").returncode == 5
    nope = run("systemctl", "is-enabled", "nvidia-imex")
    assert nope.returncode == 1
    assert "Failed to get unit file state for nvidia-imex.service" in nope.stderr

    assert (
        run("systemctl", "is-enabled", "kubelet").stdout,
        run("systemctl", "is-enabled", "kubelet").returncode,
    ) == ("disabled\n", 1)
    assert (
        run("systemctl", "--root", str(node.root), "--no-reload", "enable", "kubelet").returncode
        == 0
    )
    assert os.path.lexists(node.root / "etc/systemd/system/multi-user.target.wants/kubelet.service")
    assert run("systemctl", "is-enabled", "kubelet.service").stdout == "enabled\n"
    assert run("systemctl", "is-active", "kubelet").returncode == 3

    assert run("systemctl", "mask", "kubelet").returncode == 0
    assert os.readlink(node.root / "etc/systemd/system/kubelet.service") == "/dev/null"
    masked = run("systemctl", "is-enabled", "kubelet")
    assert (masked.returncode, masked.stdout) == (1, "masked\n")
    started = run("systemctl", "start", "kubelet")
    assert (started.returncode, started.stderr) == (
        1, "Failed to start kubelet.service: Unit kubelet.service is masked.\n"
    )  # fmt: skip
    assert run("systemctl", "enable", "kubelet").returncode == 1

    assert run("systemctl", "unmask", "kubelet").returncode == 0
    assert run("systemctl", "daemon-reload").returncode == 0
    assert run("systemctl", "restart", "kubelet").returncode == 0
    active = run("systemctl", "is-active", "--quiet", "kubelet")
    assert (active.returncode, active.stdout) == (0, "")
    assert run("systemctl", "stop", "kubelet").returncode == 0
    assert run("systemctl", "is-active", "kubelet").stdout == "inactive\n"
    assert run("systemctl", "disable", "--now", "kubelet").returncode == 0
    assert run("systemctl", "is-enabled", "kubelet").stdout == "disabled\n"


def test_containerd_restart_fault(make_node: MakeNode) -> None:
    node = make_node("h100-pcie", "containerd-restart-fails")
    assert node.run("systemctl", "is-active", "containerd").stdout == "active\n"
    out = node.run("systemctl", "restart", "containerd")
    assert out.returncode == 1 and "Job for containerd.service failed" in out.stderr
    assert node.run("systemctl", "is-active", "containerd").stdout == "failed\n"


# ------------------------------------------------------------------------- dpkg

needs_dpkg_deb = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")


def _deb(
    out: Path, package: str, version: str, arch: str, files: dict[str, str], **fields: str
) -> str:
    tree = out / f"{package}_{version}_{arch}"
    (tree / "DEBIAN").mkdir(parents=True)
    control = {"Package": package, "Version": version, "Architecture": arch,
               "Maintainer": "test <t@example.invalid>", **fields,
               "Description": f"{package} test package"}  # fmt: skip
    (tree / "DEBIAN/control").write_text("".join(f"{k}: {v}\n" for k, v in control.items()))
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    deb = out / f"{tree.name}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(deb)


@needs_dpkg_deb
def test_dpkg_install_dependencies_conflicts_and_query(make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node("h100-pcie")
    debs = tmp_path / "debs"
    lib = _deb(debs, "libfoo1", "1.2.0-1", "amd64", {"usr/lib/libfoo.so.1": "foo"})
    tool = _deb(debs, "foo-tools", "1.2.0-1", "amd64", {"usr/bin/foo": "#!/bin/sh\n"},
                Depends="libfoo1 (>= 1.2.0-1), nvidia-modprobe")  # fmt: skip
    clash = _deb(debs, "foo-clash", "0.1-1", "amd64", {"usr/bin/foo": "other"})
    arm = _deb(debs, "armonly", "1.0-1", "arm64", {"usr/share/armonly": "x"})

    assert node.run("dpkg", "--print-architecture").stdout == "amd64\n"
    missing = node.run("dpkg-query", "-W", "-f=${Version}", "foo-tools")
    assert (missing.returncode, missing.stderr) == (
        1,
        "dpkg-query: no packages found matching foo-tools\n",
    )

    out = node.run("dpkg", "-i", "--force-overwrite", lib, tool)
    assert out.returncode == 1
    assert (
        " foo-tools depends on nvidia-modprobe; however:\n"
        "  Package nvidia-modprobe is not installed." in out.stderr
    )
    assert "dependency problems - leaving unconfigured" in out.stderr
    assert (node.root / "usr/bin/foo").is_file()  # unpacked, as real dpkg leaves it
    status = node.run(
        "dpkg-query", "-W", "-f=${db:Status-Abbrev}|${Version}\\n", "libfoo1", "foo-tools"
    )
    assert status.stdout == "ii |1.2.0-1\niU |1.2.0-1\n"

    forced = node.run("dpkg", "-i", "--force-depends", tool)
    assert forced.returncode == 0, forced.stderr
    assert "dependency problems, but configuring anyway as you requested" in forced.stderr
    assert node.run("dpkg-query", "-W", "-f=${Version}", "foo-tools").stdout == "1.2.0-1"
    assert "Status: install ok installed" in (node.root / "var/lib/dpkg/status").read_text()

    conflict = node.run("dpkg", "-i", clash)
    assert conflict.returncode == 1
    assert (
        "trying to overwrite '/usr/bin/foo', which is also in package foo-tools 1.2.0-1"
        in conflict.stderr
    )
    assert node.run("dpkg", "-i", "--force-overwrite", clash).returncode == 0
    assert (node.root / "usr/bin/foo").read_text() == "other"

    wrong = node.run("dpkg", "-i", arm)
    assert wrong.returncode == 1
    assert "package architecture (arm64) does not match system (amd64)" in wrong.stderr


@needs_dpkg_deb
def test_dpkg_refuses_when_frontend_lock_is_held(make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node("gb200")
    deb = _deb(
        tmp_path / "debs", "nvidia-imex", "580.65.06-1", "arm64", {"usr/bin/nvidia-imex": "x"}
    )
    with DpkgLockHolder(node.root) as holder:
        out = node.run("dpkg", "-i", "--force-depends", deb)
        assert out.returncode == 2
        assert out.stderr.startswith(
            f"dpkg: error: dpkg frontend lock was locked by another process with pid {holder.pid}\n"
        )
    assert not (node.root / "usr/bin/nvidia-imex").exists()
    assert node.run("dpkg", "-i", "--force-depends", deb).returncode == 0
    assert node.run("dpkg-query", "-W", "nvidia-imex").stdout == "nvidia-imex\t580.65.06-1\n"


def _dpkg_db(root: Path, status: dict[str, str], journal: dict[str, str]) -> None:
    admin = root / "var/lib/dpkg"
    (admin / "info").mkdir(parents=True, exist_ok=True)
    (admin / "updates").mkdir(exist_ok=True)
    (admin / "available").touch()

    def stanza(name: str, state: str) -> str:
        return (
            f"Package: {name}\nStatus: install ok {state}\nPriority: optional\nSection: misc\n"
            f"Maintainer: T <t@example.com>\nArchitecture: all\nVersion: 1.0\n"
            f"Description: the {name} package\n"
        )

    (admin / "status").write_text("\n".join(stanza(n, st) for n, st in status.items()))
    for i, (name, state) in enumerate(journal.items()):
        (admin / "updates" / f"{i:04d}").write_text(stanza(name, state))
    for name in {**status, **journal}:
        (admin / f"info/{name}.list").write_text("/.\n")
        (admin / f"info/{name}.md5sums").write_text("")


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg") is None, reason="needs the real dpkg")
_DB = {"alpha": "installed", "bravo": "unpacked", "delta": "half-configured"}
_JOURNAL = {"charlie": "half-configured", "echo": "half-installed"}


@needs_dpkg
def test_dpkg_audit_and_configure_a_match_the_real_dpkg(
    make_node: MakeNode, tmp_path: Path
) -> None:
    """The stand-in's `--audit` prints what the real dpkg prints for the same database
    (journal included), and `--configure -a` leaves the same states behind."""
    node = make_node("h100-pcie")
    real_root = tmp_path / "real"
    for root in (node.root, real_root):
        _dpkg_db(root, _DB, _JOURNAL)
    real = subprocess.run(
        ["dpkg", f"--root={real_root}", "--audit"], capture_output=True, text=True, check=False
    )
    ours = node.run("dpkg", "--audit")
    assert (ours.returncode, ours.stdout) == (real.returncode, real.stdout) == (0, real.stdout)
    assert "charlie" in real.stdout and "bravo" in real.stdout  # not vacuous
    real_cfg = subprocess.run(
        ["dpkg", f"--root={real_root}", "--configure", "-a"], capture_output=True, text=True
    )
    ours_cfg = node.run("dpkg", "--configure", "-a")
    assert ours_cfg.returncode == real_cfg.returncode == 0
    assert sorted(ours_cfg.stdout.splitlines()) == sorted(real_cfg.stdout.splitlines())
    for root in (node.root, real_root):
        assert list((root / "var/lib/dpkg/updates").iterdir()) == []
    again = subprocess.run(
        ["dpkg", f"--root={real_root}", "--audit"], capture_output=True, text=True
    )
    assert node.run("dpkg", "--audit").stdout == again.stdout
    assert "half installed" in again.stdout  # half-installed needs a reinstall, not configure


@needs_dpkg
def test_dpkg_database_lock_refuses_like_the_real_dpkg(make_node: MakeNode, tmp_path: Path) -> None:
    node = make_node("h100-pcie")
    _dpkg_db(node.root, _DB, {})
    holder = DpkgLockHolder(node.root)
    holder.path = node.root / "var/lib/dpkg/lock"
    with holder:
        real = subprocess.run(
            ["dpkg", f"--root={node.root}", "--configure", "-a"], capture_output=True, text=True
        )
        ours = node.run("dpkg", "--configure", "-a")
        pid = holder.pid
    assert (ours.returncode, ours.stderr) == (real.returncode, real.stderr)
    assert f"dpkg database lock was locked by another process with pid {pid}" in ours.stderr


# ------------------------------------------------------------------------- the rest


def test_initramfs_ldconfig_containerd(make_node: MakeNode) -> None:
    node = make_node("b200-hgx")
    (node.root / "etc/modprobe.d/blacklist-nouveau.conf").write_text("blacklist nouveau\n")
    out = node.run("update-initramfs", "-u")
    assert out.stdout == "update-initramfs: Generating /boot/initrd.img-6.8.0-1021-azure\n"
    assert "blacklist nouveau" in (node.root / "boot/initrd.img-6.8.0-1021-azure").read_text()
    _ready(node)
    assert node.run("ldconfig").returncode == 0
    assert "libnvidia-ml.so.1" in (node.root / "etc/ld.so.cache").read_text()
    assert node.run("containerd", "--version").stdout == (
        "containerd github.com/containerd/containerd/v2 v2.0.4"
        " 1a43cb6a1035441f9aca8f5666a9b3ef9e70ab20\n"
    )
    old = make_node("h100-pcie")
    assert old.run("containerd", "--version").stdout.startswith("containerd containerd.io 1.7.27 ")


def test_nvidia_ctk_symlinks_and_cdi(make_node: MakeNode) -> None:
    node = make_node("h100-hgx")
    assert (
        node.run("nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all").returncode
        == 127
    )
    (node.root / "var/lib/dpkg/status").write_text(
        "Package: nvidia-container-toolkit-base\nStatus: install ok installed\n"
        "Architecture: amd64\nVersion: 1.17.2-1\n"
    )
    assert (
        node.run("nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all").returncode == 1
    )
    _ready(node)
    out = node.run("nvidia-ctk", "system", "create-dev-char-symlinks", "--create-all")
    assert out.returncode == 0, out.stderr
    assert os.readlink(node.root / "dev/char/195:0") == "../nvidia0"
    assert os.readlink(node.root / "dev/char/195:255") == "../nvidiactl"
    spec = node.root / "etc/cdi/nvidia.yaml"
    assert node.run("nvidia-ctk", "cdi", "generate", f"--output={spec}").returncode == 0
    text = spec.read_text()
    assert "kind: nvidia.com/gpu" in text and "- name: all" in text
    assert text.count("path: /dev/nvidia7") == 3  # by index, by UUID, in "all"


def test_cdi_fails_fault(make_node: MakeNode) -> None:
    node = make_node("h100-pcie", "cdi-fails")
    (node.root / "var/lib/dpkg/status").write_text(
        "Package: nvidia-container-toolkit-base\nStatus: install ok installed\nVersion: 1.17.2-1\n"
    )
    _ready(node)
    out = node.run("nvidia-ctk", "cdi", "generate", f"--output={node.root}/etc/cdi/nvidia.yaml")
    assert out.returncode == 1 and "failed to generate CDI spec" in out.stderr


# ------------------------------------------------- bogus invocations fail like the real tools
# Expected text written from the real tools as run on Debian 12 (kmod 30, glibc 2.36
# ldconfig, dkms 3.0.10 from dkms_3.0.10-8+deb12u1_all.deb) and from NVIDIA's sources
# (nvidia-modprobe.c + nvgetopt, nvidia-container-toolkit generate.go): "{p}" is the
# program path the tool was run as (getopt and nvgetopt print argv[0]).
BOGUS = [
    ("modprobe", ["--bogus", "nvidia"], 1, "{p}: unrecognized option '--bogus'\n"),
    ("modprobe", ["-Z", "nvidia"], 1, "{p}: invalid option -- 'Z'\n"),
    ("modprobe", ["-r", "nvidia_bogus"], 1, "modprobe: FATAL: Module nvidia_bogus not found.\n"),
    ("modinfo", ["--bogus", "nvidia"], 1, "{p}: unrecognized option '--bogus'\n"),
    ("ldconfig", ["--bogus"], 64, "{p}: unrecognized option '--bogus'\n"
     "Try `ldconfig --help' or `ldconfig --usage' for more information.\n"),
    ("ldconfig", ["-Z"], 64, "{p}: invalid option -- 'Z'\n"
     "Try `ldconfig --help' or `ldconfig --usage' for more information.\n"),
    ("dkms", ["status", "--bogus"], 2, "Error!  Unknown option: --bogus\n"),
    ("nvidia-modprobe", ["-u", "--bogus"], 1, '{p}: unrecognized option: "--bogus"\n'
     "ERROR: Invalid commandline, please run `{p} --help` for usage information.\n\n"),
]  # fmt: skip


@pytest.mark.parametrize(("tool", "argv", "rc", "stderr"), BOGUS, ids=lambda v: str(v)[:20])
def test_bogus_invocation_fails_like_the_real_tool(
    make_node: MakeNode, tool: str, argv: list[str], rc: int, stderr: str
) -> None:
    node = make_node("h100-pcie")
    path = str(node.bin_dir / tool)
    out = node.run(path, *argv)
    assert (out.returncode, out.stderr) == (rc, stderr.format(p=path))
    real = shutil.which(tool, path="/usr/sbin:/sbin")
    if real is not None and tool in ("modprobe", "modinfo", "ldconfig"):
        truth = subprocess.run([real, *argv], capture_output=True, text=True, check=False)
        assert (truth.returncode, truth.stderr) == (rc, stderr.format(p=real))


def test_dkms_usage_and_ctk_unknown_flag(make_node: MakeNode) -> None:
    node = make_node("h100-pcie")
    usage = node.run("dkms", "status", "--bogus").stdout
    assert usage.startswith(f"Usage: {node.bin_dir / 'dkms'} [action] [options]\n")
    assert "[--no-depmod] [--modprobe-on-install] [-j number] [--version]" in usage
    _ready(node)
    status = node.root / "var/lib/dpkg/status"  # nvidia-ctk exists once its deb is in
    status.write_text(status.read_text() + "\nPackage: nvidia-container-toolkit-base\n")
    ctk = node.run("nvidia-ctk", "cdi", "generate", "--bogus")
    assert ctk.returncode == 1
    assert ctk.stdout == "Incorrect Usage: flag provided but not defined: -bogus\n\n"
    assert 'level=error msg="flag provided but not defined: -bogus"' in ctk.stderr
    good = node.run("nvidia-ctk", "cdi", "generate", f"--output={node.root}/etc/cdi/x.yaml")
    assert good.returncode == 0, good.stderr


def test_nvidia_modprobe_u_makes_the_uvm_node_and_holds_nvidia(make_node: MakeNode) -> None:
    node = make_node("h100-pcie")
    _ready(node)  # install, then nvidia-modprobe -u -c0
    assert (node.root / "dev/nvidia-uvm").exists() and (node.root / "dev/nvidia-uvm-tools").exists()
    assert (node.root / "sys/module/nvidia_uvm").is_dir()
    busy = node.run("modprobe", "-r", "nvidia")
    assert (busy.returncode, busy.stderr) == (1, "modprobe: FATAL: Module nvidia is in use.\n")
    assert node.run("modprobe", "-r", "nvidia_uvm").returncode == 0
    assert node.run("modprobe", "-r", "nvidia").returncode == 0
    assert not (node.root / "sys/module/nvidia").exists()
    plain = node.run("nvidia-modprobe", "-c", "3")
    assert plain.returncode == 0 and (node.root / "dev/nvidia3").exists()
    assert not (node.root / "sys/module/nvidia_uvm").exists()


# ---------------------------- installer grammar by branch, open module before Turing
# (issue 31 items 5 and 6)


def test_a_550_installer_knows_no_module_type_option(make_node: MakeNode) -> None:
    node = make_node("h100-pcie")
    installer = node.installer(version="550.163.01")
    for arg in ("--print-recommended-kernel-module-type", "--kernel-module-type=open"):
        r = node.run(installer, arg)
        assert r.returncode == 1
        assert f'unrecognized option: "{arg}"' in r.stderr
        assert "ERROR: Invalid commandline, please run `nvidia-installer --help`" in r.stderr
    kernel = (node.root / "proc/sys/kernel/osrelease").read_text().strip()
    built = node.run(installer, "-s", "--dkms", f"-k={kernel}", "-m=kernel-open")
    assert built.returncode == 0, built.stderr
    ko = node.root / f"lib/modules/{kernel}/updates/dkms/nvidia.ko"
    assert "module_type=open" in ko.read_text()


def test_a_575_installer_knows_both_forms(make_node: MakeNode) -> None:
    node = make_node("h100-pcie")
    installer = node.installer(version="575.57.08")
    assert node.run(installer, "--print-recommended-kernel-module-type").stdout == "open\n"
    kernel = (node.root / "proc/sys/kernel/osrelease").read_text().strip()
    for arg in ("-m=kernel", "--kernel-module-type=proprietary"):
        built = node.run(installer, "-s", "--dkms", f"-k={kernel}", arg)
        assert built.returncode == 0, built.stderr


def test_the_open_module_refuses_a_v100(make_node: MakeNode) -> None:
    node = make_node("v100-ndv2")
    installer = node.installer()
    assert node.run(installer, "--print-recommended-kernel-module-type").stdout == "proprietary\n"
    assert node.install("open").returncode == 0  # the build itself needs no GPU
    load = node.run("nvidia-modprobe", "-u", "-c0")
    # nvidia-modprobe runs modprobe with its output on /dev/null: exit 1, nothing said
    assert (load.returncode, load.stdout, load.stderr) == (1, "", "")
    kmod = node.run("modprobe", "nvidia")
    assert kmod.returncode == 1
    assert "could not insert 'nvidia': No such device" in kmod.stderr
    # open-gpu-kernel-modules kernel-open/nvidia/nv.c, the probe of a GPU without a GSP,
    # in the kernel log
    dmesg = node.run("journalctl", "-k", "-o", "cat", "--no-pager").stdout
    assert "(PCI ID: 10de:1db5)\nNVRM: installed in this system is not supported by open" in dmesg
    assert node.install("proprietary").returncode == 0
    assert node.run("nvidia-modprobe", "-u", "-c0").returncode == 0
