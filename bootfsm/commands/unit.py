"""`bootfsm install-unit` / `uninstall-unit`: the systemd unit, its drop-ins, its environment.

``install-unit`` places the files of docs/systemd.md under ROOT (``/`` or an image) and
enables the unit offline (``systemctl --root``, else the same link by hand);
``uninstall-unit`` removes those files alone (the environment file only when unedited).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from bootfsm.core.caller import HOOK_DROPIN
from bootfsm.core.codes import CODES, Code
from bootfsm.core.config import DEFAULT_PATH
from bootfsm.core.config_files import DROPIN_DIR
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host

__all__ = [
    "AFTER_HOOK_PATH",
    "ENV_FILE",
    "RESTART_MODE_PATH",
    "UNIT",
    "UNIT_PATH",
    "default_exec",
    "has_restart_mode",
    "install",
    "main",
    "render_unit",
    "restart_prevent_codes",
    "source_dir",
    "uninstall",
]

UNIT = "bootfsm.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
DROPIN_PATH = "/etc/systemd/system/kubelet.service.d/10-bootfsm.conf"
RESTART_MODE_PATH = "/etc/systemd/system/bootfsm.service.d/10-restart-mode.conf"
ENV_FILE = "/etc/default/bootfsm"
AFTER_HOOK_PATH = "/etc/systemd/system/bootfsm.service.d/20-after-hook.conf"
HOOK_CHOICES = f"{DEFAULT_PATH.rsplit('/', 1)[0]}/{DROPIN_DIR}/{HOOK_DROPIN}"
AFTER_HOOK_TEXT = f"""\
# Installed by `bootfsm install-unit --after-hook` (docs/provisioning-hook.md). This image
# is provisioned at first boot by the cloud provisioning hook (`bootfsm run --hook`, in
# place of the provisioning script's GPU step), which keeps the script's choices in the
# file below. Until that first run the unit does nothing (a failed condition is not a
# failure: kubelet's Requires= is met); from then on it runs with those choices.

[Unit]
ConditionPathExists={HOOK_CHOICES}
"""
WANTS_DIR = "/etc/systemd/system/multi-user.target.wants"
SHIPPED_EXEC = "/usr/local/bin/bootfsm"
_SYSTEMCTL_TIMEOUT = 60.0

# source file (under source_dir()) -> node path
_FILES = {
    "bootfsm.service": UNIT_PATH,
    "kubelet.service.d/10-bootfsm.conf": DROPIN_PATH,
    "bootfsm.service.d/10-restart-mode.conf": RESTART_MODE_PATH,
    "bootfsm.default": ENV_FILE,
}


def source_dir() -> Path:
    """The shipped unit files' directory (package data, else a checkout's ``systemd/``);
    FileNotFoundError when neither has them."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "systemd", package.parent / "systemd"):
        if (candidate / UNIT).is_file():
            return candidate
    raise FileNotFoundError(f"{UNIT} is in neither {package}/systemd nor {package.parent}/systemd")


def restart_prevent_codes() -> list[int]:
    """Every failure code not marked transient: systemd must never restart on these."""
    return sorted(int(c) for c, row in CODES.items() if c is not Code.OK and not row.transient)


def render_unit(text: str, exec_path: str) -> str:
    """The shipped unit, its ExecStart program and RestartPreventExitStatus replaced."""
    if not exec_path.startswith("/"):
        raise ValueError(f"ExecStart program must be an absolute path, got {exec_path!r}")
    text = text.replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={exec_path} ", 1)
    codes = " ".join(str(c) for c in restart_prevent_codes())
    return re.sub(
        r"^RestartPreventExitStatus=.*$", f"RestartPreventExitStatus={codes}", text, flags=re.M
    )


def default_exec(host: Host) -> str:
    """This bootfsm as a command line: the console script beside the interpreter, else
    ``bootfsm`` on PATH, else ``python -m bootfsm``."""
    beside = Path(sys.executable).parent / "bootfsm"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = host.which("bootfsm")
    if found:
        return os.path.abspath(found)
    return f"{sys.executable} -m bootfsm"


def has_restart_mode(host: Host) -> bool:
    """Whether the root's systemd knows RestartMode= (254+; told by
    systemd-soft-reboot.service, new in the same release)."""
    return any(
        host.exists(f"{d}/systemd-soft-reboot.service")
        for d in ("/usr/lib/systemd/system", "/lib/systemd/system")
    )


def _systemctl(host: Host, verb: str) -> str:
    """`systemctl --root=ROOT VERB bootfsm.service`; '' when systemctl is missing."""
    try:
        r = host.run(["systemctl", f"--root={host.root}", verb, UNIT], timeout=_SYSTEMCTL_TIMEOUT)
    except BootError as exc:
        if exc.code is Code.COMMAND_MISSING:
            return ""
        raise
    if not r.ok:
        raise BootError(
            Code.HOST_IO_ERROR, f"systemctl {verb} {UNIT} failed (exit {r.returncode}): {r.output}"
        )
    return f"systemctl --root={host.root} {verb} {UNIT}"


def _reload(host: Host, log: list[str]) -> None:
    if host.root == Path("/") and os.path.isdir("/run/systemd/system"):  # sd_booted
        r = host.run(["systemctl", "daemon-reload"], timeout=_SYSTEMCTL_TIMEOUT)
        log.append("systemctl daemon-reload" + ("" if r.ok else f" failed: {r.output.strip()}"))


def _place(host: Host, src: Path, dest: str, exec_path: str) -> str:
    """Write one of the unit's files (the unit itself with its ExecStart); say what was done."""
    if dest == RESTART_MODE_PATH and not has_restart_mode(host):
        return f"skipped {dest} (systemd older than 254 restarts directly)"
    if dest == ENV_FILE and host.exists(dest):
        return f"kept {dest} (already there)"
    text = src.read_text(encoding="utf-8")
    host.write_atomic(dest, render_unit(text, exec_path) if dest == UNIT_PATH else text, 0o644)
    return f"wrote {dest}"


def install(host: Host, exec_path: str, *, after_hook: bool = False) -> list[str]:
    """Place the unit files under ``host.root`` and enable the unit; what was done.
    COMMAND_MISSING: ``exec_path`` not under the root; HOST_IO_ERROR: a write or systemctl."""
    program = exec_path.split()[0]
    if not host.exists(program):
        raise BootError(
            Code.COMMAND_MISSING,
            f"ExecStart program {program} does not exist under {host.root}; "
            "install bootfsm there first or pass --exec PATH",
        )
    src = source_dir()
    log = [_place(host, src / name, dest, exec_path) for name, dest in _FILES.items()]
    if after_hook:
        host.write_atomic(AFTER_HOOK_PATH, AFTER_HOOK_TEXT, 0o644)
        log.append(f"wrote {AFTER_HOOK_PATH}")
    elif host.remove(AFTER_HOOK_PATH):
        log.append(f"removed {AFTER_HOOK_PATH} (installed without --after-hook)")
    how = _systemctl(host, "enable")
    if not how:
        host.symlink_atomic(UNIT_PATH, f"{WANTS_DIR}/{UNIT}")
        how = f"linked {WANTS_DIR}/{UNIT} (no systemctl on PATH)"
    log.append(f"enabled: {how}")
    _reload(host, log)
    return log


def uninstall(host: Host) -> list[str]:
    """Disable the unit and remove what ``install`` placed (local edits stay); what was done."""
    log: list[str] = []
    if host.exists(UNIT_PATH):
        how = _systemctl(host, "disable")
        if how:
            log.append(f"disabled: {how}")
    for link in host.glob(f"/etc/systemd/system/*.wants/{UNIT}"):  # systemctl's job, if absent
        if host.remove(link):
            log.append(f"removed {link}")
            _remove_if_empty(host, link.rsplit("/", 1)[0])
    shipped = (source_dir() / "bootfsm.default").read_text(encoding="utf-8")
    for dest in (*_FILES.values(), AFTER_HOOK_PATH):
        if dest == ENV_FILE and host.read_text(dest) not in (None, shipped):
            log.append(f"kept {dest} (edited locally; remove it by hand)")
            continue
        if host.remove(dest):
            log.append(f"removed {dest}")
    for dropin in (DROPIN_PATH, RESTART_MODE_PATH):
        _remove_if_empty(host, dropin.rsplit("/", 1)[0])
    _reload(host, log)
    return log


def _remove_if_empty(host: Host, node_dir: str) -> None:
    if host.exists(node_dir) and not host.listdir(node_dir):
        host.rmtree(node_dir)


def main(args: argparse.Namespace) -> int:
    """install-unit / uninstall-unit; prints one line per action."""
    host = Host(args.root)
    exec_path = getattr(args, "exec", None) or default_exec(Host("/"))
    if args.command == "install-unit" and (
        not exec_path.startswith("/") or any(c in exec_path for c in "\n\"'\\")
    ):
        print(
            f"bootfsm install-unit: --exec needs an absolute path, got {exec_path!r}",
            file=sys.stderr,
        )
        return 2
    try:
        if args.command == "install-unit":
            log = install(host, exec_path, after_hook=getattr(args, "after_hook", False))
        else:
            log = uninstall(host)
    except BootError as exc:
        print(f"bootfsm {args.command}: {exc.message}", file=sys.stderr)
        return int(exc.code)
    except (OSError, ValueError) as exc:
        print(f"bootfsm {args.command}: {exc}", file=sys.stderr)
        return int(Code.HOST_IO_ERROR)
    for line in log:
        print(f"bootfsm {args.command}: {line}")
    return 0
