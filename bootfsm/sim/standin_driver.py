"""Driver stand-ins: nvidia-installer, dkms, modprobe, modinfo, nvidia-modprobe.

Each command is ``fn(node, argv) -> exit code`` writing to stdout/stderr like the real
tool (messages copied from real output where the samples show it).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import sys
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bootfsm.sim.elf import shared_object
from bootfsm.sim.nodestate import Node, log_call, standin_script
from bootfsm.sim.skus import STALE_DRIVER_VERSION

__all__ = ["COMMANDS", "cuda_version_for", "install_driver_files", "runfile_identity"]

_RUNFILE_DIR = re.compile(r"NVIDIA-Linux-(x86_64|aarch64)-(\d+\.\d+(?:\.\d+)?)(?:[-.].*)?")
_HEADERS_MISSING = (
    "ERROR: Unable to find the kernel source tree for the currently running kernel.  Please make"
    " sure you have installed the kernel source files for your kernel and that they are properly"
    " configured; on Red Hat Linux systems, for example, be sure you have the 'kernel-source' or"
    " 'kernel-devel' RPM installed.  If you know the correct kernel source files are installed,"
    " you may specify the kernel source path with the '--kernel-source-path' command line option."
)
_ALREADY_LOADED = (
    "ERROR: An NVIDIA kernel module 'nvidia' appears to already be loaded in your kernel.  This"
    " may be because it is in use (for example, by an X server, a CUDA program, or the NVIDIA"
    " Persistence Daemon), but this may also happen if your kernel was configured without support"
    " for module unloading.  Please be sure to exit any programs that may be using the GPU(s)"
    " before attempting to upgrade your driver.  If no GPU-based programs are running, you know"
    " that your kernel supports module unloading, and you still receive this message, then an"
    " error may have occurred that has corrupted an NVIDIA kernel module's usage count, for which"
    " the simplest remedy is to reboot your computer."
)
_BUILD_FAILED = "ERROR: Unable to build the NVIDIA kernel module."
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


def runfile_identity(installer: Path) -> tuple[str, str] | None:
    """(arch, version) from the nearest enclosing ``NVIDIA-Linux-<arch>-<version>`` directory."""
    for part in reversed(installer.parent.parts):
        match = _RUNFILE_DIR.fullmatch(part)
        if match is not None:
            return match.group(1), match.group(2)
    return None


def _err(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)


# ---------------------------------------------------------------------- installer


@dataclass
class _InstallerArgs:
    extract_only: bool = False
    print_recommended: bool = False
    version: bool = False
    allow_running: bool = False
    kernel: str | None = None
    module_type: str | None = None
    log_file: str | None = None
    unknown: list[str] = field(default_factory=list)


_FLAGS = frozenset(
    {"-s", "--silent", "-a", "--accept-license", "--no-drm", "--dkms", "--no-dkms", "-q",
     "--no-questions", "--ui=none", "--no-peermem", "-N", "--no-network", "--disable-nouveau",
     "--no-x-check", "--no-nouveau-check", "--install-compat32-libs", "--no-install-compat32-libs",
     "--skip-module-load"}
)  # fmt: skip


def _installer_args(argv: list[str]) -> _InstallerArgs:
    """Parse the nvidia-installer options the provisioners use (-k X, -k=X, --opt=X, --opt X)."""
    args = _InstallerArgs()
    valued = {"-k": "kernel", "--kernel-name": "kernel", "-M": "module_type",
              "--kernel-module-type": "module_type", "--log-file-name": "log_file",
              "-m": "build_dir", "--kernel-module-build-directory": "build_dir"}  # fmt: skip
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if arg in ("-x", "--extract-only"):
            args.extract_only = True
        elif arg == "--print-recommended-kernel-module-type":
            args.print_recommended = True
        elif arg in ("-v", "--version"):
            args.version = True
        elif arg == "--allow-installation-with-running-driver":
            args.allow_running = True
        elif arg in _FLAGS:
            pass
        elif key in valued:
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            target = valued[key]
            if target == "build_dir":
                args.module_type = "open" if value == "kernel-open" else "proprietary"
            else:
                setattr(args, target, value)
        else:
            args.unknown.append(arg)
        i += 1
    return args


def _fail_install(log: Path, *lines: str) -> int:
    """Print errors (and the real closing message) to stderr and the log; exit 1."""
    closing = (
        f"ERROR: Installation has failed.  Please see the file '{log}' for details.  You may find"
        " suggestions on fixing installation problems in the README available on the Linux driver"
        " download page at www.nvidia.com."
    )
    _err(*lines, closing)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:
        fh.writelines(f"{line}\n" for line in (*lines, closing))
    return 1


_ELF_MACHINES = {"x86_64": 62, "aarch64": 183}  # EM_X86_64, EM_AARCH64 (elf.h)


def install_driver_files(node: Node, version: str, kernel: str, module_type: str) -> None:
    """Lay down what a DKMS runfile install leaves: DKMS tree, module, sources, NVML/CUDA libs.

    Other versions' DKMS trees, sources and libraries are removed, as the installer
    uninstalls a previous runfile driver first.
    """
    arch = node.arch
    for old in node.p("var/lib/dkms/nvidia").glob("*"):
        if old.name != version:
            node.remove(f"var/lib/dkms/nvidia/{old.name}")
    for old in node.p("usr/src").glob("nvidia-*"):
        if old.name != f"nvidia-{version}":
            node.remove(f"usr/src/{old.name}")
    for pattern in ("libnvidia-ml.so.*", "libcuda.so.*"):
        for old in node.p(node.libdir).glob(pattern):
            if not old.name.endswith(f".so.{version}"):
                old.unlink()
    node.write(
        f"usr/src/nvidia-{version}/dkms.conf",
        f'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="{version}"\nAUTOINSTALL="yes"\n'
        'BUILT_MODULE_NAME[0]="nvidia"\nDEST_MODULE_LOCATION[0]="/kernel/drivers/video"\n'
        'BUILT_MODULE_NAME[1]="nvidia-uvm"\nDEST_MODULE_LOCATION[1]="/kernel/drivers/video"\n'
        'BUILT_MODULE_NAME[2]="nvidia-modeset"\nDEST_MODULE_LOCATION[2]="/kernel/drivers/video"\n'
        "MAKE[0]=\"'make' -j16 NV_EXCLUDE_BUILD_MODULES=''"
        ' KERNEL_UNAME=${kernelver} modules"\n',
    )
    node.symlink(f"/usr/src/nvidia-{version}", f"var/lib/dkms/nvidia/{version}/source")
    license_ = "Dual MIT/GPL" if module_type == "open" else "NVIDIA"
    for name in ("nvidia", "nvidia-uvm", "nvidia-modeset"):
        text = (
            f"{name}.ko (bootfsm simulated kernel module)\nname={name}\nversion={version}\n"
            f"module_type={module_type}\nlicense={license_}\n"
            f"vermagic={kernel} SMP mod_unload modversions\n"
        )
        node.write(f"var/lib/dkms/nvidia/{version}/{kernel}/{arch}/module/{name}.ko", text)
        node.write(f"lib/modules/{kernel}/updates/dkms/{name}.ko", text)
    node.write(
        f"var/lib/dkms/nvidia/{version}/build/make.log", f"DKMS make.log for nvidia-{version}\n"
    )
    for lib in ("libnvidia-ml.so", "libcuda.so"):
        # real ELF objects with their SONAME, so a real ldconfig caches them (sim/elf.py)
        node.write(f"{node.libdir}/{lib}.{version}", shared_object(f"{lib}.1", arch))
        node.symlink(f"{lib}.{version}", f"{node.libdir}/{lib}.1")
    install_persistenced(node, version)


PERSISTENCED_SAMPLE = "usr/share/doc/NVIDIA_GLX-1.0/samples/nvidia-persistenced-init.tar.bz2"
_PERSISTENCED_INIT = (
    "nvidia-persistenced-init/README",
    "nvidia-persistenced-init/install.sh",
    "nvidia-persistenced-init/systemd/nvidia-persistenced.service.template",
    "nvidia-persistenced-init/upstart/nvidia-persistenced.conf.template",
)


def install_persistenced(node: Node, version: str) -> None:
    """The daemon and its init sample, as the runfile installs them: the binary in
    /usr/bin and, under the GLX doc samples, a tar.bz2 of NVIDIA/nvidia-persistenced's
    init/ directory (README, install.sh, systemd and upstart templates); no unit."""

    del version
    node.write(
        "usr/bin/nvidia-persistenced", standin_script("nvidia-persistenced", node.root), 0o755
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:bz2") as tar:
        for name in _PERSISTENCED_INIT:
            data = f"{name} (bootfsm simulator)\n".encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    node.write(PERSISTENCED_SAMPLE, buf.getvalue())


def _hang_until_killed(node: Node, argv: list[str]) -> int:
    """The installer-hangs fault: block forever; on SIGTERM log the call and die by it."""
    started = time.time()

    def on_term(signum: int, _frame: object) -> None:
        log_call(node.root, "nvidia-installer", argv, -signum, started)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_term)
    while True:
        time.sleep(3600)


def nvidia_installer(node: Node, argv: list[str]) -> int:
    """The runfile's installer; its version comes from its NVIDIA-Linux-<arch>-<ver> dir."""
    args = _installer_args(argv)
    if args.extract_only:
        return 0
    identity = runfile_identity(Path(sys.argv[0]).absolute())
    if identity is None:
        _err(
            "ERROR: bootfsm simulator: nvidia-installer must sit in a directory named"
            " NVIDIA-Linux-<arch>-<version>"
        )
        return 1
    arch, version = identity
    if args.version:
        print(f"\nnvidia-installer:  version {version}")
        print("  The NVIDIA Software Installer for Unix/Linux.\n")
        return 0
    if arch != node.arch:
        _err(f"{sys.argv[0]}: cannot execute binary file: Exec format error")
        return 126
    if args.unknown:
        _err(
            f'nvidia-installer: unrecognized option: "{args.unknown[0]}"',
            "ERROR: Invalid commandline, please run `nvidia-installer --help` for usage"
            " information.",
        )
        return 1
    if args.print_recommended:
        print(_recommended_type(node, version))
        return 0
    return _install(node, argv, args, version)


_FIRST_TURING = 0x1E00  # TU102 0x1E02; every id from here on has a GSP (open-capable)


def _recommended_type(node: Node, version: str) -> str:
    """What `--print-recommended-kernel-module-type` prints: one word, ``open`` or
    ``proprietary`` (nvidia-installer's print_module_type; the --help text in
    samples/installer/nvidia-run_help_info_advanced_excerpts.txt: "based on currently
    attached GPUs"). From 560 the installer defaults to the open modules for every GPU
    that has a GSP (Turing and newer); before 560 only Blackwell needed them."""
    branch = version.split(".", 1)[0]
    if branch.isdigit() and int(branch) >= 560:
        gpus = node.gpus()
        return "open" if all(d >= _FIRST_TURING for _, d in gpus) else "proprietary"
    return node.recommended_module_type()


def _install(node: Node, argv: list[str], args: _InstallerArgs, version: str) -> int:
    """The -s --dkms install path."""
    log = Path(args.log_file) if args.log_file else node.p("var/log/nvidia-installer.log")
    kernel = args.kernel or node.kernel
    module_type = args.module_type or _recommended_type(node, version)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(
        f"nvidia-installer log file '{log}'\ncreation time: {time.ctime()}\n"
        f"installer version: {version}\n\nnvidia-installer command line:\n    ./nvidia-installer\n"
        + "".join(f"    {a}\n" for a in argv)
        + f"\n-> Kernel module type: {module_type}\n"
        + f"-> Installing NVIDIA driver version {version}.\n"
    )
    if module_type not in ("open", "proprietary"):
        return _fail_install(log, f'ERROR: Invalid kernel module type "{module_type}".')
    build = node.p(f"lib/modules/{kernel}/build")
    if not build.is_dir() or not any(build.iterdir()):
        return _fail_install(log, _HEADERS_MISSING)
    loaded = node.loaded_module()
    if loaded is not None and loaded.version != version and not args.allow_running:
        return _fail_install(log, _ALREADY_LOADED)
    if node.fault("installer-hangs"):
        return _hang_until_killed(node, argv)
    with log.open("a") as fh:
        fh.write(f"-> Registering the kernel modules with DKMS:\n-> Building for {kernel}\n")
    time.sleep(node.compile_seconds)
    if node.fault("installer-fails"):
        return _fail_install(
            log,
            f"Error! Bad return status for module build on kernel: {kernel} ({node.arch})",
            f"Consult /var/lib/dkms/nvidia/{version}/build/make.log for more information.",
            _BUILD_FAILED,
        )
    install_driver_files(node, version, kernel, module_type)
    with log.open("a") as fh:
        fh.write(
            f"-> DKMS build and install of nvidia/{version} for kernel {kernel} succeeded.\n"
            f"-> Installation of the NVIDIA Accelerated Graphics Driver for Linux-{node.arch}"
            f" (version: {version}) is now complete.\n"
        )
    return 0


# ---------------------------------------------------------------------- dkms / modprobe


_DKMS_USAGE = """\
Usage: {prog} [action] [options]
  [action]  = {{ add | remove | build | install | uninstall | match | autoinstall |
                mktarball | ldtarball | status }}
  [options] = [-m module] [-v module-version] [-k kernel-version] [-a arch]
              [-c dkms.conf-location] [-q] [--force] [--force-version-override] [--all]
              [--templatekernel=kernel] [--directive='cli-directive=cli-value']
              [--config=kernel-.config-location] [--archive=tarball-location]
              [--kernelsourcedir=source-location]
              [--binaries-only] [--source-only] [--verbose]
              [--no-depmod] [--modprobe-on-install] [-j number] [--version]"""
_DKMS_VALUED = frozenset({"-m", "-v", "-k", "-a", "-c", "-j"})
_DKMS_FLAGS = frozenset({"-q", "--quiet", "--force", "--all", "--verbose", "--no-depmod",
                         "--binaries-only", "--source-only", "--modprobe-on-install"})  # fmt: skip


def dkms(node: Node, argv: list[str]) -> int:
    """`dkms status [-m MOD[/VER]] [-v VER] [-k KERNEL]` in the dkms 3 slash format, and
    `dkms remove` (``_dkms_remove``).

    Reference: dkms 3.0.10 (Debian 12's dkms_3.0.10-8+deb12u1, /usr/sbin/dkms): an
    unknown option prints "Error!  Unknown option: X" to stderr (``error`` echoes
    "Error! " before the message, which starts with a space), the usage to stdout, exit 2.
    A second action word is "Cannot specify more than one action." (exit 4); a word that
    is no action, when no module is named yet, is the module (``parse_moduleversion``:
    ``module/version`` splits at the first slash).
    """
    prog = sys.argv[0]
    opts: dict[str, str] = {}
    flags: set[str] = set()
    action = ""
    rest = iter(argv)
    for arg in rest:
        if arg in _DKMS_VALUED:
            opts[arg] = next(rest, "")
        elif arg in _DKMS_FLAGS:
            flags.add(arg)
        elif arg.startswith("-"):
            _err(f"Error!  Unknown option: {arg}")
            print(_DKMS_USAGE.format(prog=prog))
            return 2
        elif arg in _DKMS_ACTIONS:
            if action:
                _err("Error! Cannot specify more than one action.")
                return 4
            action = arg
        elif "-m" not in opts:
            opts["-m"] = arg
    if action == "remove":
        return _dkms_remove(node, opts, "--all" in flags)
    if action != "status":
        _err(f'Error! Unsupported action "{action}" (bootfsm simulator: status and remove).')
        return 1
    module, _, want_version = opts.get("-m", "").partition("/")
    want_version = want_version or opts.get("-v", "")
    lines: list[str] = []
    base = node.p("var/lib/dkms")
    for mod_dir in sorted(base.glob("*")) if base.is_dir() else []:
        if module and mod_dir.name != module:
            continue
        for ver_dir in sorted(mod_dir.glob("*")):
            if want_version and ver_dir.name != want_version:
                continue
            built = sorted(ver_dir.glob("*/*/module"))
            for arch_dir in (m.parent for m in built):
                kernel = arch_dir.parent.name
                if "-k" in opts and kernel != opts["-k"]:
                    continue
                installed = node.built_module(kernel)
                state = "installed" if installed and installed.version == ver_dir.name else "built"
                lines.append(f"{mod_dir.name}/{ver_dir.name}, {kernel}, {arch_dir.name}: {state}")
            if not built and "-k" not in opts:
                lines.append(f"{mod_dir.name}/{ver_dir.name}: added")
    for line in lines:
        print(line)
    return 0


_BUILT_NAME = re.compile(r'^BUILT_MODULE_NAME\[(\d+)\]="?([^"\n]+)"?', re.MULTILINE)
_DKMS_ACTIONS = frozenset({"remove", "install", "uninstall", "autoinstall", "match", "mktarball",
                           "build", "unbuild", "add", "status", "ldtarball"})  # fmt: skip


def _dkms_remove(node: Node, opts: dict[str, str], all_kernels: bool) -> int:
    """`dkms remove -m M -v V --all` (or ``M/V``, or ``-k KERNEL``) as dkms 3.0.10 does it.

    Reference: /usr/sbin/dkms of Debian 12's dkms_3.0.10-8+deb12u1 (dell/dkms 3.0.10):
    ``-k`` with ``--all`` dies 2 ("You cannot specify a kernel version and also
    specify" / "--all on the command line."); ``check_module_args`` dies 1 without a
    module and version (its three usage lines); ``module_is_added_or_die`` dies 3 ("The
    module/version combo: M-V is not located in the DKMS tree.") unless
    /var/lib/dkms/M/V/source exists; ``--all`` takes every kernel/arch the module is
    built for, else the running kernel. Per kernel, when M-V is the module installed for
    it, ``do_uninstall`` prints "Module M-V for kernel K (ARCH).", "Before uninstall,
    this module version was ACTIVE on this kernel." and a block per dkms.conf module
    (BUILT_MODULE_NAME order) as it deletes it from /lib/modules/K/updates/dkms/, then
    "depmod..." (``invoke_command``); when not, "Module M V is not installed for kernel
    K (ARCH). Skipping..." (``maybe_uninstall_module``); then the built tree goes; last
    "Deleting module M-V completely from the DKMS tree." and the tree /var/lib/dkms/M/V
    (and /var/lib/dkms/M once empty) is removed. Exit 0.
    """
    module, _, version = opts.get("-m", "").partition("/")
    version = opts.get("-v", version)
    if "-k" in opts and all_kernels:
        _err(
            "Error!  You cannot specify a kernel version and also specify\n"
            "--all on the command line."
        )
        return 2
    if not module or not version:
        _err("Error! Arguments <module> and <module-version> are not specified.\n"
             "Usage: remove <module>/<module-version> or\n"
             "       remove -m <module>/<module-version> or\n"
             "       remove -m <module> -v <module-version>")  # fmt: skip
        return 1
    tree = node.p(f"var/lib/dkms/{module}/{version}")
    if not os.path.lexists(tree / "source"):
        _err(
            f"Error! The module/version combo: {module}-{version} is not located in the DKMS tree."
        )
        return 3
    if all_kernels:
        targets = sorted((m.parent.parent.name, m.parent.name) for m in tree.glob("*/*/module"))
    else:
        targets = [(opts.get("-k") or node.kernel, node.arch)]
    conf = node.read(f"usr/src/{module}-{version}/dkms.conf") or ""  # what source links to
    names = [n for _, n in sorted((int(i), n) for i, n in _BUILT_NAME.findall(conf))]
    for kernel, arch in targets:
        installed = node.built_module(kernel)
        if installed is None or installed.version != version:  # maybe_uninstall_module
            print(f"Module {module} {version} is not installed for kernel {kernel} ({arch})."
                  " Skipping...")  # fmt: skip
        else:  # do_uninstall: each module of dkms.conf, in its BUILT_MODULE_NAME order
            print(f"Module {module}-{version} for kernel {kernel} ({arch}).")
            print("Before uninstall, this module version was ACTIVE on this kernel.")
            for name in names:
                print(f"\n{name}.ko:\n - Uninstallation\n"
                      f"   - Deleting from: /lib/modules/{kernel}/updates/dkms/\n"
                      " - Original module\n"
                      "   - No original module was found for this module on this kernel.\n"
                      "   - Use the dkms install command to reinstall any previous module"
                      " version.")  # fmt: skip
                node.remove(f"lib/modules/{kernel}/updates/dkms/{name}.ko")
            print("depmod...")
        if not (tree / kernel / arch / "module").is_dir():  # maybe_unbuild_module
            print(f"Module {module} {version} is not built for kernel {kernel} ({arch})."
                  " Skipping...")  # fmt: skip
        node.remove(f"var/lib/dkms/{module}/{version}/{kernel}/{arch}")
        kdir = tree / kernel
        if kdir.is_dir() and not any(kdir.iterdir()):
            kdir.rmdir()
    keep = ("build", "tarball", "driver_disk", "rpm", "deb", "source")
    kernels = [
        d for d in tree.iterdir() if d.is_dir() and not d.is_symlink() and d.name not in keep
    ]
    if not kernels:
        print(f"Deleting module {module}-{version} completely from the DKMS tree.")
        node.remove(f"var/lib/dkms/{module}/{version}")
    base = node.p(f"var/lib/dkms/{module}")
    if base.is_dir() and not any(base.iterdir()):
        base.rmdir()
    return 0


_NVIDIA_MODULES = frozenset({"nvidia", "nvidia-uvm", "nvidia_uvm", "nvidia-modeset",
                             "nvidia_modeset", "nvidia-drm", "nvidia_drm", "nvidia-peermem",
                             "nvidia_peermem"})  # fmt: skip
_IN_TREE = frozenset({"ib_umad", "ib_uverbs", "mlx5_ib", "mlx5_core", "rdma_ucm", "nouveau"})
# kmod 30 (Debian 12) modprobe: its getopt_long options; the valued ones take an argument.
_MODPROBE_FLAGS = frozenset({"-a", "--all", "-r", "--remove", "-R", "--resolve-alias",
                             "--first-time", "-i", "--ignore-install", "--ignore-remove",
                             "-b", "--use-blacklist", "-f", "--force", "--force-modversion",
                             "--force-vermagic", "-D", "--show-depends", "-n", "--dry-run",
                             "--show", "-q", "--quiet", "-v", "--verbose", "-s", "--syslog",
                             "-w", "--wait", "-c", "--showconfig", "--show-config"})  # fmt: skip
_MODPROBE_VALUED = frozenset({"-S", "--set-version", "-C", "--config", "-d", "--dirname"})


def _getopt_error(argv: list[str], flags: frozenset[str], valued: frozenset[str]) -> str | None:
    """glibc getopt_long's message for the first unknown option, as kmod prints it."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--":
            return None
        key = arg.split("=", 1)[0]
        if key in valued:
            skip = "=" not in arg
        elif arg.startswith("--") and key not in flags:
            return f"{sys.argv[0]}: unrecognized option '{arg}'"
        elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 1:
            for ch in arg[1:]:
                if f"-{ch}" not in flags and f"-{ch}" not in valued:
                    return f"{sys.argv[0]}: invalid option -- '{ch}'"
    return None


def _module_dir(name: str) -> str:
    return f"sys/module/{name.replace('-', '_')}"


def modprobe(node: Node, argv: list[str]) -> int:
    """`modprobe [-r] [-q] MODULE...`: nvidia modules are simulated; a few in-tree ones exist.

    Reference: kmod 30 as run on Debian 12: an unknown option is glibc getopt's
    "modprobe: unrecognized option '--bogus'" (argv[0] as invoked), exit 1; `-r` of a
    module that does not exist is "modprobe: FATAL: Module X not found.", exit 1; of an
    existing module that is not loaded, silent, exit 0; of a module with holders or a
    reference, "modprobe: FATAL: Module X is in use.", exit 1.
    """
    problem = _getopt_error(argv, _MODPROBE_FLAGS, _MODPROBE_VALUED)
    if problem is not None:
        _err(problem)
        return 1
    remove = any(a in ("-r", "--remove") for a in argv)
    quiet = any(a in ("-q", "--quiet") for a in argv)
    modules = [a for a in argv if not a.startswith("-")]
    if not modules:
        _err("modprobe: ERROR: missing parameters. See -h.")
        return 1
    for module in modules if remove or "-a" in argv or "--all" in argv else modules[:1]:
        if module in _NVIDIA_MODULES:
            rc = _rmmod_nvidia(node, module) if remove else _insmod_nvidia(node, module, quiet)
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
    return 0


def _rmmod_nvidia(node: Node, module: str = "nvidia") -> int:
    name = module.replace("-", "_")
    if name != "nvidia":
        if node.p(_module_dir(name)).exists():
            node.remove(_module_dir(name))
            node.remove(f"sys/module/nvidia/holders/{name}")
        return 0
    loaded = node.loaded_module()
    if loaded is None:
        return 0
    holders = node.p("sys/module/nvidia/holders")
    in_use = holders.is_dir() and any(holders.iterdir())
    if in_use or (node.fault("stale-driver-in-use") and loaded.version == STALE_DRIVER_VERSION):
        _err("modprobe: FATAL: Module nvidia is in use.")
        return 1
    node.unload_module()
    return 0


_MODINFO_FLAGS = frozenset({"-a", "--author", "-d", "--description", "-l", "--license",
                            "-p", "--parameters", "-n", "--filename", "-0", "--null",
                            "-V", "--version", "-h", "--help"})  # fmt: skip
_MODINFO_VALUED = frozenset({"-F", "--field", "-k", "--set-version", "-b", "--basedir"})


def modinfo(node: Node, argv: list[str]) -> int:
    """`modinfo [-k KERNEL] [-F FIELD] nvidia[-uvm|-modeset]` for DKMS-installed modules.

    Reference: kmod 30 modinfo on Debian 12: "modinfo: unrecognized option '--bogus'"
    (argv[0] as invoked), exit 1; "modinfo: ERROR: Module X not found.", exit 1.
    """
    problem = _getopt_error(argv, _MODINFO_FLAGS, _MODINFO_VALUED)
    if problem is not None:
        _err(problem)
        return 1
    kernel, field_name, names = node.kernel, "", []
    rest = iter(argv)
    for arg in rest:
        if arg in ("-k", "--set-version"):
            kernel = next(rest, kernel)
        elif arg in ("-F", "--field"):
            field_name = next(rest, "")
        elif arg.startswith("--field="):
            field_name = arg.split("=", 1)[1]
        elif arg in ("-b", "--basedir"):
            next(rest, "")
        elif not arg.startswith("-"):
            names.append(arg)
    if len(names) != 1:
        _err("modinfo: ERROR: missing module or filename.")
        return 1
    name = names[0].replace("_", "-")
    path = f"lib/modules/{kernel}/updates/dkms/{name}.ko"
    text = node.read(path) if name in _NVIDIA_MODULES else None
    if text is None:
        _err(f"modinfo: ERROR: Module {names[0]} not found.")
        return 1
    keys = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    fields = [
        ("filename", f"/{path}"),
        ("alias", "char-major-195-*"),
        ("version", keys.get("version", "")),
        ("supported", "external"),
        ("license", keys.get("license", "")),
        ("depends", ""),
        ("retpoline", "Y"),
        ("name", keys.get("name", name).replace("-", "_")),
        ("vermagic", keys.get("vermagic", "")),
    ]
    for key, value in fields:
        if not field_name:
            print(f"{key + ':':<16}{value}".rstrip())
        elif key == field_name and value:
            print(value)
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
    /dev/nvidiaN. An unknown option: nvgetopt's "<argv0>: unrecognized option: "X"",
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
    if _insmod_nvidia(node, "nvidia_uvm" if uvm else "nvidia"):
        return 1
    for minor in minors:
        if uvm:
            node.write("dev/nvidia-uvm", "")
            node.write("dev/nvidia-uvm-tools", "")
        elif not {"nvswitch", "nvlink"} & flags:
            node.write(f"dev/nvidia{minor}", "")
    if "modeset" in flags and not _insmod_nvidia(node, "nvidia_modeset"):
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
