"""Driver stand-ins: nvidia-installer, dkms, modprobe, modinfo, nvidia-modprobe, nvidia-smi.

Each command is ``fn(node, argv) -> exit code`` writing to stdout/stderr like the real
tool (messages copied from real output where the samples show it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bootfsm.sim.nodestate import FABRIC_MANAGER, RUN_DIR, Node, log_call, smi_bus_id
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
        node.write(f"{node.libdir}/{lib}.{version}", f"{lib} {version} (bootfsm simulator)\n")
        node.symlink(f"{lib}.{version}", f"{node.libdir}/{lib}.1")


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
        print(f"kernel_module_type={node.recommended_module_type()}")
        return 0
    return _install(node, argv, args, version)


def _install(node: Node, argv: list[str], args: _InstallerArgs, version: str) -> int:
    """The -s --dkms install path."""
    log = Path(args.log_file) if args.log_file else node.p("var/log/nvidia-installer.log")
    kernel = args.kernel or node.kernel
    module_type = args.module_type or node.recommended_module_type()
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


def dkms(node: Node, argv: list[str]) -> int:
    """`dkms status [-m MOD[/VER]] [-v VER] [-k KERNEL]` in the dkms 3 slash format."""
    if not argv or argv[0] != "status":
        _err(f"Error! Unsupported action '{argv[0] if argv else ''}' (bootfsm simulator).")
        return 1
    opts: dict[str, str] = {}
    rest = iter(argv[1:])
    for arg in rest:
        if arg in ("-m", "-v", "-k"):
            opts[arg] = next(rest, "")
        elif not arg.startswith("-"):
            opts["-m"] = arg
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


_NVIDIA_MODULES = frozenset({"nvidia", "nvidia-uvm", "nvidia_uvm", "nvidia-modeset",
                             "nvidia_modeset", "nvidia-drm", "nvidia_drm", "nvidia-peermem",
                             "nvidia_peermem"})  # fmt: skip
_IN_TREE = frozenset({"ib_umad", "ib_uverbs", "mlx5_ib", "mlx5_core", "rdma_ucm", "nouveau"})


def modprobe(node: Node, argv: list[str]) -> int:
    """`modprobe [-r] [-q] MODULE...`: nvidia modules are simulated; a few in-tree ones exist."""
    remove = any(a in ("-r", "--remove") for a in argv)
    quiet = any(a in ("-q", "--quiet") for a in argv)
    modules = [a for a in argv if not a.startswith("-")]
    if not modules:
        _err("modprobe: ERROR: missing parameters. See -h.")
        return 1
    for module in modules:
        if module in _NVIDIA_MODULES:
            rc = _rmmod_nvidia(node) if remove else _insmod_nvidia(node, quiet)
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
            if remove:
                continue
            if not quiet:
                _err(
                    f"modprobe: FATAL: Module {module} not found in directory"
                    f" /lib/modules/{node.kernel}"
                )
            return 1
    return 0


def _insmod_nvidia(node: Node, quiet: bool = False) -> int:
    error = node.load_module()
    if error is None:
        return 0
    if not quiet:
        sys.stderr.write(error)
    return 1


def _rmmod_nvidia(node: Node) -> int:
    loaded = node.loaded_module()
    if loaded is None:
        return 0
    if node.fault("stale-driver-in-use") and loaded.version == STALE_DRIVER_VERSION:
        _err("modprobe: FATAL: Module nvidia is in use.")
        return 1
    node.unload_module()
    return 0


def modinfo(node: Node, argv: list[str]) -> int:
    """`modinfo [-k KERNEL] [-F FIELD] nvidia[-uvm|-modeset]` for DKMS-installed modules."""
    kernel, field_name, names = node.kernel, "", []
    rest = iter(argv)
    for arg in rest:
        if arg in ("-k", "--set-version"):
            kernel = next(rest, kernel)
        elif arg in ("-F", "--field"):
            field_name = next(rest, "")
        elif arg.startswith("--field="):
            field_name = arg.split("=", 1)[1]
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


def nvidia_modprobe(node: Node, argv: list[str]) -> int:
    """`nvidia-modprobe [-u] [-c N] ...`: load the module and create device nodes; silent."""
    del argv
    return _insmod_nvidia(node)


# ---------------------------------------------------------------------- nvidia-smi


def _fabric(node: Node, count_call: bool) -> tuple[str, str]:
    """(State, Status) of every GPU's Fabric block right now."""
    arm_grace = node.arch == "aarch64"
    switched = bool(node.nvswitches()) or node.nvlink5()
    if not arm_grace and not switched:
        return "N/A", "N/A"
    if node.fault("fabric-in-progress-forever"):
        return "In Progress", "N/A"
    if arm_grace:
        counter = node.p(f"{RUN_DIR}/smi-query-calls")
        seen = int(counter.read_text()) if counter.exists() else 0
        if count_call:
            node.write(f"{RUN_DIR}/smi-query-calls", str(seen + 1))
        return (
            ("In Progress", "N/A")
            if seen < node.fabric_in_progress_calls
            else ("Completed", "Success")
        )
    if node.unit_state(FABRIC_MANAGER) == "active":
        return "Completed", "Success"
    return "In Progress", "N/A"


_BOARD = {0x2330: (81559, 700), 0x2331: (81559, 350), 0x2901: (183359, 1000),
          0x2941: (189471, 1200), 0x31C2: (284208, 1400), 0x31C3: (284208, 1400)}  # fmt: skip
_TABLE_HEAD = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {v:<23}Driver Version: {v:<15}CUDA Version: {cuda:<9}|
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
"""
_TABLE_GPU = """\
| {i:>3}  {name:<26}     On  |   {bus} Off |                    0 |
| N/A   30C    P0             70W / {watts:>4}W |       1MiB / {mem:>6}MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+
"""
_TABLE_TAIL = """\

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""


def _table(node: Node, version: str, gpus: list[tuple[str, int]]) -> str:
    """The default nvidia-smi table (550+ layout, column for column)."""
    text = time.strftime("%a %b %d %H:%M:%S %Y") + "\n"
    text += _TABLE_HEAD.format(v=version, cuda=cuda_version_for(version))
    for index, (address, device) in enumerate(gpus):
        mem, watts = _BOARD.get(device, (81559, 700))
        name = node.product_name(device)[:26]
        text += _TABLE_GPU.format(i=index, name=name, bus=smi_bus_id(address), watts=watts, mem=mem)
    return text + _TABLE_TAIL


def nvidia_smi(node: Node, argv: list[str]) -> int:
    """`nvidia-smi`, `nvidia-smi -L` and `nvidia-smi -q`, reading the node's driver state."""
    from bootfsm.parsers.nvidia_smi import SmiGpu, render_smi_query

    library = node.nvml_version()
    module = node.loaded_module()
    if library is None or module is None:
        print(_NO_DRIVER)
        return 9
    if library != module.version:
        print("Failed to initialize NVML: Driver/library version mismatch")
        print(f"NVML library version: {'.'.join(library.split('.')[:2])}")
        return 18
    gpus = node.visible_gpus()
    warning = f"WARNING: infoROM is corrupted at gpu {gpus[0][0].upper()}" if gpus else ""
    inforom = node.fault("inforom-corrupted") and bool(gpus)
    if any(a in ("-L", "--list-gpus") for a in argv):
        for index, (address, device) in enumerate(gpus):
            print(f"GPU {index}: {node.product_name(device)} (UUID: {node.gpu_uuid(address)})")
        return 0
    if "-x" in argv or "--xml-format" in argv:
        print("bootfsm simulator: nvidia-smi XML output (-x) is not simulated")
        return 2
    if any(a in ("-q", "--query") for a in argv):
        state, status = _fabric(node, count_call=True)
        smi_gpus = [SmiGpu(smi_bus_id(a), node.product_name(d), state, status) for a, d in gpus]
        if inforom:
            print(warning)
        sys.stdout.write(
            render_smi_query(
                module.version,
                cuda_version_for(module.version),
                smi_gpus,
                timestamp=time.strftime("%a %b %d %H:%M:%S %Y"),
            )
        )
        return 0
    if argv:
        print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
        return 2
    sys.stdout.write(_table(node, module.version, gpus))
    if inforom:
        print(warning)
        return 14
    return 0


COMMANDS: Mapping[str, Callable[[Node, list[str]], int]] = {
    "nvidia-installer": nvidia_installer,
    "dkms": dkms,
    "modprobe": modprobe,
    "nvidia-modprobe": nvidia_modprobe,
    "nvidia-smi": nvidia_smi,
    "modinfo": modinfo,
}
