"""The simulated `dkms`: `status` in the dkms 3 slash format, and `remove`.

``dkms(node, argv) -> exit code`` writes to stdout/stderr like the real tool. Reference:
/usr/sbin/dkms of Debian 12's dkms_3.0.10-8+deb12u1 (its usage text, option grammar,
``Error! ...`` wording and exit codes; cited at each function), reading and removing the
/var/lib/dkms/<module>/<version> tree.
"""

from __future__ import annotations

import os
import re
import sys

from bootfsm.sim.nodestate import Node

__all__ = ["dkms"]


def _err(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)


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
