"""Driver stand-ins: modprobe, modinfo, nvidia-modprobe, nvidia-persistenced; COMMANDS.

Each command is ``fn(node, argv) -> exit code`` writing to stdout/stderr like the real
tool (messages copied from real output where the samples show it). The runfile
installer is in :mod:`standin_installer`, dkms in :mod:`standin_dkms`; :data:`COMMANDS`
names all of them for :mod:`standins`.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from bootfsm.sim.nodestate import Node
from bootfsm.sim.nodestate_kmod import DEVICE_CREATE
from bootfsm.sim.standin_dkms import dkms
from bootfsm.sim.standin_installer import nvidia_installer
from bootfsm.sim.standin_kmod import NVIDIA_MODULES, getopt_error, modinfo

__all__ = ["COMMANDS", "cuda_version_for"]

_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that"
    " the latest NVIDIA driver is installed and running."
)
_CUDA = {"535": "12.2", "550": "12.4", "560": "12.6", "565": "12.7", "570": "12.8", "575": "12.9"}


def cuda_version_for(driver_version: str) -> str:
    """The CUDA version a driver branch reports (580 and later: 13.0)."""
    branch = driver_version.split(".", 1)[0]
    if branch in _CUDA:
        return _CUDA[branch]
    return "13.0" if branch.isdigit() and int(branch) >= 580 else "12.8"


def _err(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)


# ---------------------------------------------------------------------- modprobe


_IN_TREE = frozenset({"ib_umad", "ib_uverbs", "mlx5_ib", "mlx5_core", "rdma_ucm", "nouveau"})
# kmod 30 (Debian 12) modprobe: its getopt_long options; the valued ones take an argument.
_MODPROBE_FLAGS = frozenset({"-a", "--all", "-r", "--remove", "-R", "--resolve-alias",
                             "--first-time", "-i", "--ignore-install", "--ignore-remove",
                             "-b", "--use-blacklist", "-f", "--force", "--force-modversion",
                             "--force-vermagic", "-D", "--show-depends", "-n", "--dry-run",
                             "--show", "-q", "--quiet", "-v", "--verbose", "-s", "--syslog",
                             "-w", "--wait", "-c", "--showconfig", "--show-config"})  # fmt: skip
_MODPROBE_VALUED = frozenset({"-S", "--set-version", "-C", "--config", "-d", "--dirname"})


def _module_dir(name: str) -> str:
    return f"sys/module/{name.replace('-', '_')}"


def modprobe(node: Node, argv: list[str]) -> int:
    """`modprobe [-r] [-q] [--first-time] MODULE...`: nvidia modules are simulated; a few
    in-tree ones exist.

    Reference: kmod 30 as run on Debian 12 (and kmod's tools/modprobe.c, rmmod_do_module):
    the options in $MODPROBE_OPTIONS come first (prepend_options_from_env); an unknown
    option is glibc getopt's "modprobe: unrecognized option '--bogus'" (argv[0] as
    invoked), exit 1; `-r` of a module that does not exist is "modprobe: FATAL: Module X
    not found.", exit 1; of an existing module that is not loaded, silent, exit 0, unless
    --first-time: "modprobe: FATAL: Module X is not in kernel.", exit 1 (modprobe(8):
    "Normally, modprobe will succeed (and do nothing) ... to remove a module which isn't
    present"); of a module with holders or a reference, "modprobe: FATAL: Module X is in
    use.", exit 1; after removing a module, the modules it depends on that nothing else
    uses go too (modprobe(8), -r: "If the modules it depends on are also unused,
    modprobe will try to remove them too"), so `-r nvidia_uvm` on an idle node unloads
    nvidia.
    """
    argv = [*os.environ.get("MODPROBE_OPTIONS", "").split(), *argv]
    problem = getopt_error(argv, _MODPROBE_FLAGS, _MODPROBE_VALUED)
    if problem is not None:
        _err(problem)
        return 1
    remove = any(a in ("-r", "--remove") for a in argv)
    quiet = any(a in ("-q", "--quiet") for a in argv)
    first_time = "--first-time" in argv
    modules = [a for a in argv if not a.startswith("-")]
    if not modules:
        _err("modprobe: ERROR: missing parameters. See -h.")
        return 1
    for module in modules if remove or "-a" in argv or "--all" in argv else modules[:1]:
        if module in NVIDIA_MODULES:
            rc = (
                _rmmod_nvidia(node, module, first_time)
                if remove
                else _insmod_nvidia(node, module, quiet)
            )
            if rc:
                return rc
        elif module in _IN_TREE:
            if module == "ib_umad" and node.fault("ib-umad-missing") and not remove:
                if not quiet:
                    _err(
                        f"modprobe: FATAL: Module {module} not found in directory"
                        f" /lib/modules/{node.kernel}"
                    )
                return 1
            if remove:
                shutil.rmtree(node.p(f"sys/module/{module}"), ignore_errors=True)
            else:  # the kernel's record of a loaded module
                node.write(f"sys/module/{module}/initstate", "live\n")
        else:
            if not quiet:
                _err(
                    f"modprobe: FATAL: Module {module} not found."
                    if remove
                    else f"modprobe: FATAL: Module {module} not found in directory"
                    f" /lib/modules/{node.kernel}"
                )
            return 1
    return 0


def _insmod_nvidia(node: Node, module: str = "nvidia", quiet: bool = False) -> int:
    error = node.load_module()
    if error is not None:
        if not quiet:
            sys.stderr.write(error)
        return 1
    name = module.replace("-", "_")
    if name != "nvidia" and not node.p(_module_dir(name)).exists():
        node.write(f"{_module_dir(name)}/refcnt", "0\n")
        node.write(f"sys/module/nvidia/holders/{name}", "")
        # the kernel's "add" uevent of /module/<name>: Ubuntu's udev rule creates its nodes
        if node.udev_runs(f"/module/{name}", DEVICE_CREATE):
            node.device_create()
    return 0


def _rmmod_nvidia(node: Node, module: str = "nvidia", first_time: bool = False) -> int:
    name = module.replace("-", "_")
    loaded = node.p(_module_dir(name)).exists() if name != "nvidia" else node.loaded_module()
    built = node.module_file(name=name.replace("_", "-"))
    if not loaded and built is None:  # kmod finds no such module for this kernel
        _err(f"modprobe: FATAL: Module {name} not found.")
        return 1
    if not loaded:
        if first_time:
            _err(f"modprobe: FATAL: Module {name} is not in kernel.")
            return 1
        return 0
    if name != "nvidia":
        node.remove(_module_dir(name))
        node.remove(f"sys/module/nvidia/holders/{name}")
        if not node.nvidia_users():  # its dependency, now unused, goes too (step 4)
            node.unload_module()
        return 0
    if node.nvidia_users():
        _err("modprobe: FATAL: Module nvidia is in use.")
        return 1
    node.unload_module()
    return 0


# nvidia-modprobe's option table (NVIDIA/nvidia-modprobe option-table.h): -c takes an
# integer minor, -f a /proc path, -i "START:COUNT"; the rest are flags.
_NVMP_FLAGS = {"-v": "version", "--version": "version", "-h": "help", "--help": "help",
               "-u": "uvm", "--unified-memory": "uvm", "-m": "modeset", "--modeset": "modeset",
               "-s": "nvswitch", "--nvswitch": "nvswitch", "-l": "nvlink", "--nvlink": "nvlink",
               "-a": "online", "--auto-online-movable": "online"}  # fmt: skip
_NVMP_VALUED = {"-c": "minor", "--create-nvidia-device-file": "minor",
                "-f": "cap", "--nvidia-capability-device-file": "cap", "-i": "imex"}  # fmt: skip


def _nvmp_args(argv: list[str]) -> tuple[set[str], list[int]] | str:
    """(flags, device minors), or the unknown option (nvgetopt's grammar: -cN, -c N,
    --opt=V, --opt V)."""
    flags: set[str] = set()
    minors: list[int] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        short = arg[:2] if arg.startswith("-") and not arg.startswith("--") else ""
        if arg in _NVMP_FLAGS:
            flags.add(_NVMP_FLAGS[arg])
        elif key in _NVMP_VALUED or (short in _NVMP_VALUED and len(arg) > 2):
            name = _NVMP_VALUED[key if key in _NVMP_VALUED else short]
            if not eq and key in _NVMP_VALUED:
                i += 1
                value = argv[i] if i < len(argv) else ""
            elif not eq:
                value = arg[2:]
            if name == "minor":
                if not value.isdigit():
                    return arg
                minors.append(int(value))
        else:
            return arg
        i += 1
    return flags, minors


def nvidia_modprobe(node: Node, argv: list[str]) -> int:
    """`nvidia-modprobe [-u] [-c N]... [-m]`: load modules, create device files; silent.

    Reference: NVIDIA/nvidia-modprobe nvidia-modprobe.c: with -u it loads nvidia_uvm (and
    nvidia under it) and -c N creates the UVM device files (/dev/nvidia-uvm, and
    /dev/nvidia-uvm-tools beside it); without -u it loads nvidia and -c N creates
    /dev/nvidiaN; modprobe runs silenced (nvidia-modprobe-utils.c modprobe_helper,
    silence_process_actions: its stdout and stderr on /dev/null, at NVIDIA/nvidia-modprobe
    a9556df), so a failed load prints nothing and exits 1. An unknown option: nvgetopt's
    "<argv0>: unrecognized option: "X"",
    then "ERROR: Invalid commandline, please run `<argv0> --help` for usage
    information.", exit 1.
    """
    parsed = _nvmp_args(argv)
    prog = sys.argv[0]
    if isinstance(parsed, str):
        _err(
            f'{prog}: unrecognized option: "{parsed}"',
            f"ERROR: Invalid commandline, please run `{prog} --help` for usage information.\n",
        )
        return 1
    flags, minors = parsed
    if "version" in flags or "help" in flags:
        built = node.built_module()
        print(f"\n{Path(prog).name}:  version {built.version if built else '0.0'}\n")
        return 0
    uvm = "uvm" in flags
    # modprobe runs with its stdout and stderr on /dev/null (modprobe_helper): a refused
    # load says nothing here, only the kernel log and the exit status tell
    if _insmod_nvidia(node, "nvidia_uvm" if uvm else "nvidia", quiet=True):
        return 1
    for minor in minors:
        if uvm:
            node.write("dev/nvidia-uvm", "")
            node.write("dev/nvidia-uvm-tools", "")
        elif not {"nvswitch", "nvlink"} & flags:
            node.write(f"dev/nvidia{minor}", "")
    if "modeset" in flags and not _insmod_nvidia(node, "nvidia_modeset", quiet=True):
        node.write("dev/nvidia-modeset", "")
    return 0


_PD_PIDFILE = "var/run/nvidia-persistenced/nvidia-persistenced.pid"
_PD_INVALID = "\nERROR: Invalid commandline, please run `{prog} --help` for usage information.\n"


def nvidia_persistenced(node: Node, argv: list[str]) -> int:
    """The daemon as its unit starts it (Type=forking): fork, the child keeps running
    and writes its pid file, the parent exits 0.

    Reference: NVIDIA/nvidia-persistenced options.c (-v/--version, -h/--help,
    -V/--verbose, -u/--user NAME, --[no-]persistence-mode, --nvidia-cfg-path PATH; an
    invalid command line prints "Invalid commandline, please run `... --help` for usage
    information." as an error and exits EXIT_SUCCESS, as the source does) and
    nvidia-persistenced.c (without usable devices the parent prints "nvidia-persistenced
    failed to initialize. Check syslog for more details." and exits non-zero).
    """
    prog = "nvidia-persistenced"
    rest = iter(argv)
    for arg in rest:
        if arg in ("-v", "--version"):
            print(f"\n{prog}:  version (bootfsm simulator)\n\n  The NVIDIA Persistence Daemon.\n")
            return 0
        if arg in ("-h", "--help"):
            print(f"\n{prog} [options]\n")
            return 0
        if arg in ("-u", "--user", "--nvidia-cfg-path"):
            if next(rest, None) is None:
                sys.stderr.write(_PD_INVALID.format(prog=prog))
                return 0
        elif arg.startswith(("--user=", "--nvidia-cfg-path=")) or arg in (
            "-V",
            "--verbose",
            "--persistence-mode",
            "--no-persistence-mode",
        ):
            continue
        else:
            sys.stderr.write(_PD_INVALID.format(prog=prog))
            return 0
    if node.loaded_module() is None or not node.p("dev/nvidiactl").exists():
        sys.stderr.write(f"{prog} failed to initialize. Check syslog for more details.\n")
        return 1
    if os.fork() == 0:  # the daemon: detached, alive until systemd stops it
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # a daemon lets go of its parent's stdio
            os.dup2(null, fd)
        node.write(_PD_PIDFILE, f"{os.getpid()}\n")
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        while True:
            time.sleep(3600)
    return 0


COMMANDS: Mapping[str, Callable[[Node, list[str]], int]] = {
    "nvidia-installer": nvidia_installer,
    "nvidia-persistenced": nvidia_persistenced,
    "dkms": dkms,
    "modprobe": modprobe,
    "nvidia-modprobe": nvidia_modprobe,
    "modinfo": modinfo,
}
