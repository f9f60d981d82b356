"""bootfsm.service: verified by systemd-analyze (no output allowed), installed and
enabled offline with the real systemctl into an image root, uninstalled without a
trace, packaged as data, and its restart policy generated from the code table."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootfsm.cli import main as cli_main
from bootfsm.commands.unit import (
    DROPIN_PATH,
    ENV_FILE,
    RESTART_MODE_PATH,
    UNIT_PATH,
    default_exec,
    render_unit,
    restart_prevent_codes,
    source_dir,
)
from bootfsm.core.codes import CODES, Code
from bootfsm.core.config import DEFAULTS
from bootfsm.host.host import Host
from bootfsm.sim.node import SKUS, build_node

ANALYZE = shutil.which("systemd-analyze")
SYSTEMCTL = shutil.which("systemctl")
HOST_UNITS = next(
    (Path(d) for d in ("/usr/lib/systemd/system", "/lib/systemd/system") if Path(d).is_dir()),
    None,
)
needs_systemd = pytest.mark.skipif(
    not (ANALYZE and SYSTEMCTL and HOST_UNITS), reason="systemd tools missing (make deps)"
)
EXEC = "/usr/local/bin/bootfsm"
WANTS_LINK = "etc/systemd/system/multi-user.target.wants/bootfsm.service"
BUILD_PY = ("-q", "build_py", "--build-lib")
EXEC_ARG = ("--exec", EXEC)


def unit_settings(text: str) -> dict[tuple[str, str], list[str]]:
    """(section, key) -> values, in order (unit files may repeat a key)."""
    out: dict[tuple[str, str], list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault((section, key.strip()), []).append(value.strip())
    return out


def verify(*args: str) -> str:
    """systemd-analyze [--root=...] verify --man=no ...: its whole output (stdout+stderr).

    It exits 0 even on warnings, so any output at all is the failure signal."""
    assert ANALYZE
    root = [a for a in args if a.startswith("--root=")]
    rest = [a for a in args if not a.startswith("--root=")]
    p = subprocess.run(
        [ANALYZE, *root, "verify", "--man=no", *rest],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return (p.stdout + p.stderr).strip() + ("" if p.returncode == 0 else f"\n(exit {p.returncode})")


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root: file content, link target, or 'dir'."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = p.read_text(errors="replace")
    return out


@pytest.fixture
def image_root(tmp_path: Path) -> Path:
    """An image being built: a simulated GPU node (containerd and kubelet units), the
    host's systemd units, and bootfsm and kubelet installed at their image paths."""
    root = tmp_path / "image"
    build_node(root, SKUS["h100-hgx"])
    assert HOST_UNITS is not None
    shutil.copytree(HOST_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/default").mkdir(exist_ok=True)  # base-files ships it; kubelet reads it
    (root / "etc/default/kubelet").write_text("KUBELET_FLAGS=\n")
    for prog in ("usr/local/bin/bootfsm", "opt/bin/kubelet"):
        (root / prog).parent.mkdir(parents=True, exist_ok=True)
        (root / prog).write_text("#!/bin/sh\nexit 0\n")
        (root / prog).chmod(0o755)
    return root


def install(root: Path, *extra: str) -> int:
    return cli_main(["install-unit", "--root", str(root), "--exec", EXEC, *extra])


# -- the unit as shipped --------------------------------------------------------------
@needs_systemd
def test_shipped_unit_verifies_without_any_output(tmp_path: Path) -> None:
    """Rendered for the bootfsm that runs these tests, the unit verifies silently; the
    same file with one unknown key does not (the check is real)."""
    text = render_unit(
        (source_dir() / "bootfsm.service").read_text(), default_exec(Host("/")).split()[0]
    )
    unit = tmp_path / "bootfsm.service"
    unit.write_text(text)
    assert verify(str(unit)) == ""
    unit.write_text(text.replace("[Service]\n", "[Service]\nTimeoutStartSecs=1\n"))
    assert "Unknown key" in verify(str(unit))


def test_restart_policy_is_generated_from_the_code_table() -> None:
    """Permanent codes never restart, transient ones do, and success is only 0."""
    s = unit_settings((source_dir() / "bootfsm.service").read_text())
    prevent = {int(c) for c in s[("Service", "RestartPreventExitStatus")][0].split()}
    permanent = {int(c) for c, row in CODES.items() if c is not Code.OK and not row.transient}
    transient = {int(c) for c, row in CODES.items() if row.transient}
    assert prevent == permanent == set(restart_prevent_codes()), (
        "regenerate: RestartPreventExitStatus=" + " ".join(map(str, restart_prevent_codes()))
    )
    assert transient and not transient & prevent
    assert {11, 12, 33} <= transient  # lock busy, interrupted, download retries
    assert s[("Service", "Restart")] == ["on-failure"]
    assert ("Service", "SuccessExitStatus") not in s
    assert s[("Unit", "StartLimitBurst")] == ["3"]
    rendered = unit_settings(render_unit((source_dir() / "bootfsm.service").read_text(), EXEC))
    assert (
        rendered[("Service", "RestartPreventExitStatus")]
        == (s[("Service", "RestartPreventExitStatus")])
    )


def test_timeouts_agree_with_the_deadline() -> None:
    """systemd's start timeout leaves bootfsm's deadline room to fire first (and stop a
    command, journal, exit); the stop timeout covers a stalled read and the kill grace."""
    s = unit_settings((source_dir() / "bootfsm.service").read_text())
    env = unit_settings((source_dir() / "bootfsm.default").read_text())
    start = float(s[("Service", "TimeoutStartSec")][0])
    deadline = float(env[("", "BOOTFSM_DEADLINE")][0])
    assert deadline == DEFAULTS.run.deadline
    assert start >= deadline + 30
    assert float(s[("Service", "TimeoutStopSec")][0]) > DEFAULTS.fetch.read_timeout + 7
    assert s[("Service", "EnvironmentFile")] == [f"-{ENV_FILE}"]


def test_unit_orders_kubelet_and_speaks_sd_notify() -> None:
    """Oneshot before kubelet, after the network and containerd; status via NOTIFY_SOCKET
    from the main process; bootfsm leaves starting kubelet to systemd."""
    s = unit_settings((source_dir() / "bootfsm.service").read_text())
    assert s[("Service", "Type")] == ["oneshot"]
    assert s[("Service", "RemainAfterExit")] == ["yes"]
    assert set(s[("Unit", "After")][0].split()) == {"network-online.target", "containerd.service"}
    assert s[("Unit", "Wants")] == ["network-online.target"]
    assert s[("Unit", "Before")] == ["kubelet.service"]
    assert s[("Service", "NotifyAccess")] == ["main"]
    assert s[("Service", "SyslogIdentifier")] == ["bootfsm"]
    assert s[("Service", "KillMode")] == ["mixed"]
    argv = s[("Service", "ExecStart")][0].split()
    assert argv[:3] == [EXEC, "run", "--no-start-kubelet"]
    assert s[("Install", "WantedBy")] == ["multi-user.target"]
    # each successful run queues kubelet's start: after a transient failure systemd has
    # already failed kubelet's job (observed on 252: make test-booted, scenarios 3 and 4);
    # without --no-block, systemctl would wait for a job that waits for this very start
    assert s[("Service", "ExecStartPost")] == ["-systemctl start --no-block kubelet.service"]
    dropin = unit_settings((source_dir() / "kubelet.service.d/10-bootfsm.conf").read_text())
    assert dropin == {
        ("Unit", "Requires"): ["bootfsm.service"],
        ("Unit", "After"): ["bootfsm.service"],
    }


# -- hardening ------------------------------------------------------------------------
HARDENING = {
    "ProtectHome": "read-only",
    "PrivateTmp": "yes",
    "ProtectHostname": "yes",
    "LockPersonality": "yes",
    "RestrictRealtime": "yes",
    "SystemCallArchitectures": "native",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
    "SystemCallFilter": "~@clock @debug @obsolete @reboot @swap @cpu-emulation",
    "SystemCallErrorNumber": "EPERM",
}
# what would break a driver install (docs/systemd.md, "Hardening")
NEVER = (
    "PrivateDevices",
    "ProtectKernelModules",
    "ProtectSystem",
    "RestrictSUIDSGID",
    "ProtectClock",
    "NoNewPrivileges",
    "DevicePolicy",
    "DeviceAllow",
    "ProtectKernelTunables",
    "ProtectKernelLogs",
    "MemoryDenyWriteExecute",
)
# system calls a driver install makes: modprobe/nvidia-installer (module loads), dpkg and
# its maintainer scripts (ownership, setuid), nvidia-modprobe (mknod), DKMS/gcc (fork,
# exec, mmap), nvidia-smi (ioctl), update-initramfs (chroot-free cpio), chrony-free clocks
NEEDED_SYSCALLS = {
    "init_module", "finit_module", "delete_module", "mknod", "mknodat", "chown", "fchownat",
    "setuid", "setgid", "setresuid", "clone", "clone3", "execve", "execveat", "mmap",
    "mprotect", "ioctl", "mount", "umount2", "chroot", "iopl", "ioperm", "setrlimit",
    "prlimit64", "personality", "uname", "sethostname", "clock_gettime", "clock_nanosleep",
    "gettimeofday", "sched_setaffinity", "kill", "pidfd_open", "pidfd_send_signal",
}  # fmt: skip
NEEDED_CAPS = {
    "CAP_SYS_MODULE", "CAP_SYS_ADMIN", "CAP_MKNOD", "CAP_CHOWN", "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_SETUID", "CAP_SETGID",
    "CAP_SETPCAP", "CAP_SETFCAP", "CAP_KILL", "CAP_SYS_RAWIO", "CAP_NET_ADMIN",
    "CAP_SYS_PTRACE", "CAP_SYS_RESOURCE", "CAP_SYS_NICE", "CAP_IPC_LOCK", "CAP_SYSLOG",
    "CAP_SYS_CHROOT", "CAP_NET_BIND_SERVICE", "CAP_AUDIT_WRITE", "CAP_LINUX_IMMUTABLE",
}  # fmt: skip


def test_unit_hardening_is_the_set_that_cannot_break_a_driver_install() -> None:
    s = unit_settings((source_dir() / "bootfsm.service").read_text())
    for key, want in HARDENING.items():
        assert s.get(("Service", key)) == [want], key
    for key in NEVER:
        assert ("Service", key) not in s, f"{key}= would break a driver install"
    [caps] = s[("Service", "CapabilityBoundingSet")]
    assert caps.startswith("~")
    dropped = set(caps[1:].split())
    assert {"CAP_SYS_BOOT", "CAP_SYS_TIME", "CAP_MAC_ADMIN", "CAP_BPF"} <= dropped
    assert not dropped & NEEDED_CAPS, dropped & NEEDED_CAPS


@needs_systemd
def test_filtered_syscall_groups_hold_nothing_a_driver_install_calls() -> None:
    """The groups as this systemd defines them (`systemd-analyze syscall-filter`)."""
    s = unit_settings((source_dir() / "bootfsm.service").read_text())
    [deny] = s[("Service", "SystemCallFilter")]
    assert deny.startswith("~")  # a deny list: everything else stays allowed
    groups = deny[1:].split()
    denied: set[str] = set()
    for group in groups:
        out = subprocess.run(
            ["systemd-analyze", "syscall-filter", group],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        names = {
            w for ln in out.splitlines()[1:] for w in ln.split() if not ln.lstrip().startswith("#")
        }
        assert names, f"{group} is empty on this systemd"
        denied |= names
    assert {"reboot", "kexec_load", "kexec_file_load", "ptrace", "swapon", "settimeofday"} <= denied
    assert not denied & NEEDED_SYSCALLS, denied & NEEDED_SYSCALLS


@needs_systemd
def test_exposure_score_of_the_shipped_unit(tmp_path: Path) -> None:
    """`systemd-analyze security` of the unit as installed: 9.6 UNSAFE before the
    hardening, 7.6 EXPOSED on systemd 252 with it (docs/systemd.md)."""
    unit = tmp_path / "bootfsm.service"
    unit.write_text(render_unit((source_dir() / "bootfsm.service").read_text(), EXEC))
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    m = re.search(r"Overall exposure level for bootfsm\.service: ([0-9.]+)", out.stdout)
    assert m, out.stdout + out.stderr
    assert float(m[1]) <= 7.6
    plain = (
        unit.read_text().split("\n# Hardening", 1)[0] + "\n[Install]\nWantedBy=multi-user.target\n"
    )
    unit.write_text(plain)
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    before = re.search(r"Overall exposure level for bootfsm\.service: ([0-9.]+)", out.stdout)
    assert before and float(before[1]) >= 9.5  # the check is real: without it, UNSAFE


# -- installing into an image root ----------------------------------------------------
@needs_systemd
def test_install_into_image_root_enables_and_verifies(image_root: Path) -> None:
    """install-unit places the unit, the kubelet drop-in and the environment file,
    enables the unit offline with the real systemctl, and the image verifies silently
    (kubelet.service with its drop-in included); a broken drop-in would show."""
    assert install(image_root) == 0
    unit = (image_root / UNIT_PATH.lstrip("/")).read_text()
    assert f"ExecStart={EXEC} run --no-start-kubelet" in unit
    assert os.readlink(image_root / WANTS_LINK) == UNIT_PATH
    assert SYSTEMCTL
    enabled = subprocess.run(
        [SYSTEMCTL, f"--root={image_root}", "is-enabled", "bootfsm.service"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert enabled.stdout.strip() == "enabled"
    assert verify(f"--root={image_root}", "bootfsm.service", "kubelet.service") == ""
    dropin = image_root / DROPIN_PATH.lstrip("/")
    dropin.write_text(dropin.read_text() + "Bogus=1\n")
    assert "10-bootfsm.conf" in verify(f"--root={image_root}", "kubelet.service")


@needs_systemd
def test_uninstall_leaves_nothing_behind(image_root: Path) -> None:
    """install then uninstall: the image is byte for byte what it was."""
    before = snapshot(image_root)
    assert install(image_root) == 0
    assert snapshot(image_root) != before
    assert cli_main(["uninstall-unit", "--root", str(image_root)]) == 0
    assert snapshot(image_root) == before
    assert cli_main(["uninstall-unit", "--root", str(image_root)]) == 0  # idempotent


@needs_systemd
def test_restart_mode_dropin_only_where_systemd_knows_it(image_root: Path) -> None:
    """systemd 252 here: no RestartMode= drop-in (it would warn). An image with systemd
    254+ (systemd-soft-reboot.service) gets RestartMode=direct, and loses it again on
    uninstall."""
    assert install(image_root) == 0
    assert not (image_root / RESTART_MODE_PATH.lstrip("/")).exists()
    assert cli_main(["uninstall-unit", "--root", str(image_root)]) == 0
    marker = image_root / "usr/lib/systemd/system/systemd-soft-reboot.service"
    marker.write_text("[Unit]\nDescription=Reboot System Userspace\n")
    before = snapshot(image_root)
    assert install(image_root) == 0
    dropin = (image_root / RESTART_MODE_PATH.lstrip("/")).read_text()
    assert unit_settings(dropin) == {("Service", "RestartMode"): ["direct"]}
    assert cli_main(["uninstall-unit", "--root", str(image_root)]) == 0
    assert snapshot(image_root) == before


@needs_systemd
def test_edited_environment_file_survives(
    image_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local edit of /etc/default/bootfsm is kept by reinstall and by uninstall."""
    assert install(image_root) == 0
    env = image_root / ENV_FILE.lstrip("/")
    env.write_text(env.read_text().replace("BOOTFSM_DEADLINE=720", "BOOTFSM_DEADLINE=600"))
    assert install(image_root) == 0
    assert "BOOTFSM_DEADLINE=600" in env.read_text()
    capsys.readouterr()
    assert cli_main(["uninstall-unit", "--root", str(image_root)]) == 0
    assert "kept /etc/default/bootfsm" in capsys.readouterr().out
    assert env.exists() and not (image_root / UNIT_PATH.lstrip("/")).exists()


@needs_systemd
def test_without_systemctl_the_link_is_what_systemctl_makes(
    image_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no systemctl on PATH, install creates exactly the link systemctl creates, and
    uninstall removes it as systemctl does."""
    other = tmp_path / "other"
    shutil.copytree(image_root, other, symlinks=True)
    assert install(image_root) == 0
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert install(other) == 0
    assert snapshot(other) == snapshot(image_root)
    assert cli_main(["uninstall-unit", "--root", str(other)]) == 0
    assert not (other / WANTS_LINK).is_symlink()


def test_install_refuses_a_program_missing_from_the_root(tmp_path: Path) -> None:
    """ExecStart must exist in the image (101), and --exec must be absolute (2)."""
    assert install(tmp_path) == int(Code.COMMAND_MISSING)
    assert not (tmp_path / UNIT_PATH.lstrip("/")).exists()
    assert cli_main(["install-unit", "--root", str(tmp_path), "--exec", "bootfsm"]) == 2


# -- packaging ------------------------------------------------------------------------
@needs_systemd
def test_packaged_unit_files_install_without_the_checkout(image_root: Path, tmp_path: Path) -> None:
    """Build the package as a wheel would lay it out (setuptools build_py with the
    project's package data), then run install-unit from that tree alone (python -S: no
    checkout, no site-packages): the unit files come from bootfsm/systemd/."""
    setuptools = pytest.importorskip("setuptools")
    del setuptools
    repo = Path(__file__).resolve().parent.parent
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):  # what pyproject.toml names
        shutil.copy(repo / name, src / name)
    for name in ("bootfsm", "states", "systemd"):
        shutil.copytree(
            repo / name,
            src / name,
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    lib = tmp_path / "lib"
    build = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", *BUILD_PY, str(lib)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    shipped = sorted(str(p.relative_to(lib)) for p in (lib / "bootfsm/systemd").rglob("*"))
    assert shipped == [
        "bootfsm/systemd/bootfsm.default",
        "bootfsm/systemd/bootfsm.service",
        "bootfsm/systemd/bootfsm.service.d",
        "bootfsm/systemd/bootfsm.service.d/10-restart-mode.conf",
        "bootfsm/systemd/kubelet.service.d",
        "bootfsm/systemd/kubelet.service.d/10-bootfsm.conf",
    ]
    run = subprocess.run(
        [
            sys.executable,
            "-S",
            "-m",
            "bootfsm",
            "install-unit",
            "--root",
            str(image_root),
            *EXEC_ARG,
        ],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(lib)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert (image_root / UNIT_PATH.lstrip("/")).read_text() == render_unit(
        (lib / "bootfsm/systemd/bootfsm.service").read_text(), EXEC
    )
    assert verify(f"--root={image_root}", "bootfsm.service") == ""


@needs_systemd
def test_after_hook_waits_for_the_hooks_first_run_and_goes_away(image_root: Path) -> None:
    """--after-hook: a drop-in whose ConditionPathExists= names the file the hook's run
    writes (tests/test_hook_callers.py checks a hook run writes exactly that path); it
    verifies silently, a reinstall without the flag and uninstall-unit take it out."""
    from bootfsm.commands.unit import AFTER_HOOK_PATH, HOOK_CHOICES

    before = snapshot(image_root)
    assert install(image_root, "--after-hook") == 0
    conf = (image_root / AFTER_HOOK_PATH.lstrip("/")).read_text()
    assert unit_settings(conf)[("Unit", "ConditionPathExists")] == [HOOK_CHOICES]
    assert HOOK_CHOICES == "/etc/bootfsm/config.d/50-provisioning-hook.toml"
    assert verify(f"--root={image_root}", "bootfsm.service") == ""
    assert install(image_root) == 0
    assert not (image_root / AFTER_HOOK_PATH.lstrip("/")).exists()
    assert install(image_root, "--after-hook") == 0
    assert cli_main(["uninstall-unit", "--root", str(image_root)]) == 0
    assert snapshot(image_root) == before
