"""The simulated NVIDIA runfile installer (`nvidia-installer`) and the files it installs.

``nvidia_installer(node, argv) -> exit code`` writes to stdout/stderr and
/var/log/nvidia-installer.log like the real tool (messages copied from real output where
the samples show it: the kernel-source-tree, already-loaded and build-failed errors);
:func:`install_driver_files` lays out the driver's files (libraries as real ELF shared
objects, the kernel modules, the persistenced init sample) for the installer and for a
node built with a driver already present.
"""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bootfsm.sim.elf import shared_object
from bootfsm.sim.nodestate import Node, log_call, standin_script

__all__ = ["PERSISTENCED_SAMPLE", "dkms_build", "install_driver_files", "install_persistenced",
           "nvidia_installer", "runfile_identity"]  # fmt: skip

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


@dataclass
class _InstallerArgs:
    extract_only: bool = False
    print_recommended: bool = False
    version: bool = False
    allow_running: bool = False
    kernel: str | None = None
    module_type: str | None = None
    log_file: str | None = None
    install_path: str | None = None
    no_dkms: bool = False
    unknown: list[str] = field(default_factory=list)


_FLAGS = frozenset(
    {"-s", "--silent", "-a", "--accept-license", "--no-drm", "--dkms", "--no-dkms", "-q",
     "--no-questions", "--ui=none", "--no-peermem", "-N", "--no-network", "--disable-nouveau",
     "--no-x-check", "--no-nouveau-check", "--install-compat32-libs", "--no-install-compat32-libs",
     "--skip-module-load"}
)  # fmt: skip


_MODULE_TYPE_BRANCH = 560
"""From this branch the installer has -M/--kernel-module-type and
--print-recommended-kernel-module-type (the 575.57.08 --advanced-options of
samples/installer/nvidia-run_help_info_advanced_excerpts.txt lists both beside the
deprecated -m; NVIDIA/gpu-driver-container PR #182: "--kernel-module-type is a new flag
and is only available from R560 onwards"), and builds the open modules by default."""
_OPEN_BRANCH = 515
"""From this branch the package carries kernel-open/ beside kernel/ and the installer
takes -m/--kernel-module-build-directory to pick one (NVIDIA driver README, "Open Linux
Kernel Modules": two flavors "starting in the 515 driver release series")."""


def _branch(version: str | None) -> int:
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else _MODULE_TYPE_BRANCH


def _installer_args(argv: list[str], version: str | None = None) -> _InstallerArgs:
    """Parse the nvidia-installer options the provisioners use (-k X, -k=X, --opt=X, --opt X)
    as the installer of ``version``'s branch knows them (options a branch lacks are
    unknown to it)."""
    args = _InstallerArgs()
    branch = _branch(version)
    valued = {"-k": "kernel", "--kernel-name": "kernel", "--log-file-name": "log_file",
              "--kernel-install-path": "install_path"}  # fmt: skip
    if branch >= _OPEN_BRANCH:
        valued |= {"-m": "build_dir", "--kernel-module-build-directory": "build_dir"}
    if branch >= _MODULE_TYPE_BRANCH:
        valued |= {"-M": "module_type", "--kernel-module-type": "module_type"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if arg in ("-x", "--extract-only"):
            args.extract_only = True
        elif arg == "--print-recommended-kernel-module-type" and branch >= _MODULE_TYPE_BRANCH:
            args.print_recommended = True
        elif arg in ("-v", "--version"):
            args.version = True
        elif arg == "--allow-installation-with-running-driver":
            args.allow_running = True
        elif arg in _FLAGS:
            args.no_dkms = args.no_dkms or arg == "--no-dkms"
        elif key in valued:
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            target = valued[key]
            if target == "build_dir":
                args.module_type = {"kernel-open": "open", "kernel": "proprietary"}.get(
                    value.rstrip("/"), f"build directory {value}"
                )
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


def install_driver_files(
    node: Node, version: str, kernel: str, module_type: str, *, dkms: bool = True
) -> None:
    """Lay down what a DKMS runfile install leaves: DKMS tree, module, sources, NVML/CUDA libs.

    Other versions' DKMS trees, sources and libraries are removed, as the installer
    uninstalls a previous runfile driver first. ``dkms`` False (``--no-dkms``): the
    modules go to lib/modules/<kernel>/updates/dkms (the ``--kernel-install-path`` the
    caller gives, as aks-gpu's build-only mode does, Azure/aks-gpu#191), nothing is
    registered with DKMS.
    """
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
    if not dkms:
        for name in ("nvidia", "nvidia-uvm", "nvidia-modeset"):
            node.write(f"lib/modules/{kernel}/updates/dkms/{name}.ko", _ko(name, version, kernel,
                                                                          module_type))  # fmt: skip
        _install_libraries(node, version)
        return
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
    dkms_build(node, version, kernel, module_type)
    node.write(
        f"var/lib/dkms/nvidia/{version}/build/make.log", f"DKMS make.log for nvidia-{version}\n"
    )
    _install_libraries(node, version)


def _ko(name: str, version: str, kernel: str, module_type: str) -> str:
    license_ = "Dual MIT/GPL" if module_type == "open" else "NVIDIA"
    return (
        f"{name}.ko (bootfsm simulated kernel module)\nname={name}\nversion={version}\n"
        f"module_type={module_type}\nlicense={license_}\n"
        f"vermagic={kernel} SMP mod_unload modversions\n"
    )


def dkms_build(node: Node, version: str, kernel: str, module_type: str) -> None:
    """What DKMS leaves for one kernel: its tree's copy of each module and the installed
    one in lib/modules/<kernel>/updates/dkms (Ubuntu's DKMS destination)."""
    for name in ("nvidia", "nvidia-uvm", "nvidia-modeset"):
        text = _ko(name, version, kernel, module_type)
        node.write(f"var/lib/dkms/nvidia/{version}/{kernel}/{node.arch}/module/{name}.ko", text)
        node.write(f"lib/modules/{kernel}/updates/dkms/{name}.ko", text)


def _install_libraries(node: Node, version: str) -> None:
    # nvidia-installer installs the setuid loader unless --no-nvidia-modprobe
    node.write("usr/bin/nvidia-modprobe", standin_script("nvidia-modprobe", node.root), 0o755)
    for lib in ("libnvidia-ml.so", "libcuda.so"):
        # real ELF objects with their SONAME, so a real ldconfig caches them (sim/elf.py)
        node.write(f"{node.libdir}/{lib}.{version}", shared_object(f"{lib}.1", node.arch))
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
    # /usr/bin/nvidia-smi too, as the runfile installs it: units condition on it (the
    # toolkit's nvidia-cdi-refresh.service: ConditionPathExists=/usr/bin/nvidia-smi)
    node.write("usr/bin/nvidia-smi", standin_script("nvidia-smi", node.root), 0o755)
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
    if "-x" in argv or "--extract-only" in argv:
        return 0
    identity = runfile_identity(Path(sys.argv[0]).absolute())
    args = _installer_args(argv, identity[1] if identity else None)
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
    if _branch(version) >= _MODULE_TYPE_BRANCH:
        gpus = node.gpus()
        return "open" if all(d >= _FIRST_TURING for _, d in gpus) else "proprietary"
    return node.recommended_module_type()


def _default_type(node: Node, version: str) -> str:
    """The modules an install builds when no type is given: from 560 the recommended
    ones, before it the proprietary ones in kernel/ (the package's default build
    directory)."""
    if _branch(version) >= _MODULE_TYPE_BRANCH:
        return _recommended_type(node, version)
    return "proprietary"


def _install(node: Node, argv: list[str], args: _InstallerArgs, version: str) -> int:
    """The -s --dkms install path."""
    log = Path(args.log_file) if args.log_file else node.p("var/log/nvidia-installer.log")
    kernel = args.kernel or node.kernel
    module_type = args.module_type or _default_type(node, version)
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
    if args.no_dkms:  # the modules go where --kernel-install-path says, DKMS not involved
        where = Path(args.install_path or node.p(f"lib/modules/{kernel}/kernel/drivers/video"))
        if where.resolve() != node.p(f"lib/modules/{kernel}/updates/dkms").resolve():
            return _fail_install(log, f"ERROR: bootfsm simulator: install path {where} is not"
                                      f" lib/modules/{kernel}/updates/dkms")  # fmt: skip
    install_driver_files(node, version, kernel, module_type, dkms=not args.no_dkms)
    if "-grid" in Path(sys.argv[0]).parent.name:  # the GRID runfile's licensing daemon
        node.write("usr/bin/nvidia-gridd", "#!/bin/sh\n# nvidia-gridd (bootfsm simulator)\n",
                   0o755)  # fmt: skip
        node.write("etc/nvidia/gridd.conf.template", "# /etc/nvidia/gridd.conf.template\n")
    with log.open("a") as fh:
        fh.write(
            f"-> DKMS build and install of nvidia/{version} for kernel {kernel} succeeded.\n"
            f"-> Installation of the NVIDIA Accelerated Graphics Driver for Linux-{node.arch}"
            f" (version: {version}) is now complete.\n"
        )
    return 0
