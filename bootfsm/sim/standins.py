"""Stand-in commands of a simulated node: ``main(name, root, argv)`` dispatches by name.

Each stand-in executable written by :func:`bootfsm.sim.node.build_node` is a tiny
Python script that calls :func:`main` with its command name and the node root baked in.
Every invocation appends one line to ``var/lib/bootfsm-sim/calls.jsonl``. Paths given
as arguments are real paths (bootfsm joins them under the root); node facts come from
the node directory. Driver commands live in :mod:`standin_driver`, units in
:mod:`standin_systemctl`, packages in :mod:`standin_dpkg`; the small rest is here.
"""

from __future__ import annotations

import contextlib
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from bootfsm.sim.nodestate import UVM_MAJOR, Node, log_call

__all__ = ["ARTIFACT_STANDINS", "PATH_STANDINS", "main"]

_CONTAINERD_COMMITS = {
    "1.7.27": "05044ec0a9a75232cad458027ca83437aae3f4da",
    "2.0.4": "1a43cb6a1035441f9aca8f5666a9b3ef9e70ab20",
    "2.1.1": "cb1076646aa3740577fafbf3d914198b7fe8e3f7",
}
_TOOLKIT_BASE = "nvidia-container-toolkit-base"


def _err(text: str) -> None:
    print(text, file=sys.stderr)


# initramfs-tools 0.142 (Debian 12) update-initramfs: getopt -o "k:cudvtb:h?" --long help
# -n "$0"; getopt's own message for a bad option, then usage_error: the usage text to
# stderr, exit 2 (`-h` prints it to stdout, exit 0).
_UPDATE_INITRAMFS_USAGE = """
Usage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]

Options:
 -k version\tSpecify kernel version or 'all'
 -c\t\tCreate a new initramfs
 -u\t\tUpdate an existing initramfs
 -d\t\tRemove an existing initramfs
 -b directory\tSet alternate boot directory
 -v\t\tBe verbose

See update-initramfs(8) for further details.

"""


def _usage_error(message: str = "") -> int:
    if message:
        sys.stderr.write(f"{message}\n\n")
    sys.stderr.write(_UPDATE_INITRAMFS_USAGE)
    return 2


def _initramfs_args(argv: list[str]) -> tuple[str, str] | int:
    """(mode, kernel) as the script's getopt loop reads them, or its exit code."""
    prog, mode, kernel, rest = sys.argv[0], "", "", list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            break
        if arg in ("--help", "-h", "-?"):
            sys.stdout.write(_UPDATE_INITRAMFS_USAGE)
            return 0
        if arg.startswith("--"):
            sys.stderr.write(f"{prog}: unrecognized option '{arg}'\n")
            return _usage_error()
        if not arg.startswith("-") or arg == "-":
            return _usage_error(f"Extra argument '{arg}'")
        for i, ch in enumerate(arg[1:], start=1):
            if ch in "cdu":
                mode = ch
            elif ch in "vt":
                continue
            elif ch in "kb":
                value = arg[i + 1 :] or (rest.pop(0) if rest else None)
                if value is None:
                    sys.stderr.write(f"{prog}: option requires an argument -- '{ch}'\n")
                    return _usage_error()
                kernel = value if ch == "k" else kernel
                break
            else:
                sys.stderr.write(f"{prog}: invalid option -- '{ch}'\n")
                return _usage_error()
    if rest:
        return _usage_error(f"Extra argument '{rest[0]}'")
    if not mode:
        return _usage_error("You must specify at least one of -c, -u, or -d.")
    return mode, kernel


def update_initramfs(node: Node, argv: list[str]) -> int:
    """`update-initramfs -u|-c [-k KERNEL|all]`: writes boot/initrd.img-<kernel> (with
    modprobe.d); `-d` removes it. The argv grammar and errors are the real script's."""
    parsed = _initramfs_args(argv)
    if isinstance(parsed, int):
        return parsed
    mode, kernel = parsed
    kernel = kernel or node.kernel
    kernels = (
        sorted(p.name for p in node.p("lib/modules").glob("*")) if kernel == "all" else [kernel]
    )
    if mode == "d":
        for name in kernels:
            print(f"update-initramfs: Deleting /boot/initrd.img-{name}")
            node.p(f"boot/initrd.img-{name}").unlink(missing_ok=True)
        return 0
    modprobe_d = sorted(node.p("etc/modprobe.d").glob("*.conf"))
    body = "".join(f"# /etc/modprobe.d/{p.name}\n{p.read_text()}" for p in modprobe_d)
    for name in kernels:
        print(f"update-initramfs: Generating /boot/initrd.img-{name}")
        node.write(f"boot/initrd.img-{name}", f"initramfs for {name} (bootfsm simulator)\n{body}")
    return 0


def ldconfig(node: Node, argv: list[str]) -> int:
    """`ldconfig`: bootfsm/sim/standin_ldconfig.py (glibc 2.36's cache and links)."""
    from bootfsm.sim.standin_ldconfig import ldconfig as run

    return run(node, argv)


def containerd(node: Node, argv: list[str]) -> int:
    """`containerd --version` in the real format of the SKU's containerd; `config dump`
    in bootfsm/sim/standin_containerd.py."""
    if argv not in (["--version"], ["-v"]):
        from bootfsm.sim.standin_containerd import containerd_config  # TOML: only here

        return containerd_config(node, argv)
    version = node.sku.containerd_version
    commit = _CONTAINERD_COMMITS.get(version, "0" * 40)
    if version.startswith("1."):
        print(f"containerd containerd.io {version} {commit}")
    else:
        print(f"containerd github.com/containerd/containerd/v2 v{version} {commit}")
    return 0


def _ctk_log(level: str, message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f'time="{stamp}" level={level} msg="{message}"', file=sys.stderr)


def _cdi_yaml(node: Node) -> str:
    gpus = node.visible_gpus()
    lines = ["---", "cdiVersion: 0.5.0", "kind: nvidia.com/gpu", "devices:"]
    for index, (address, _device) in enumerate(gpus):
        for name in (str(index), node.gpu_uuid(address)):
            lines += [f'- name: "{name}"', "  containerEdits:", "    deviceNodes:",
                      f"    - path: /dev/nvidia{index}"]  # fmt: skip
    lines += ["- name: all", "  containerEdits:", "    deviceNodes:"]
    lines += [f"    - path: /dev/nvidia{i}" for i in range(len(gpus))]
    lines += ["containerEdits:", "  deviceNodes:"]
    lines += [f"  - path: /dev/{n}" for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")]
    lines += ["  hooks:", "  - hookName: createContainer", "    path: /usr/bin/nvidia-cdi-hook",
              "    args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/"
              f"{node.arch}-linux-gnu]"]  # fmt: skip
    return "\n".join(lines) + "\n"


def nvidia_ctk(node: Node, argv: list[str]) -> int:
    """`nvidia-ctk system create-dev-char-symlinks [--create-all]` and `nvidia-ctk cdi generate`.

    Like the real binary it exists only once the toolkit deb that ships it is installed.
    """
    if _TOOLKIT_BASE not in (node.read("var/lib/dpkg/status") or ""):
        _err(f"nvidia-ctk: command not found (bootfsm simulator: {_TOOLKIT_BASE} is not installed)")
        return 127
    words = [a for a in argv if not a.startswith("-")]
    if words[:2] == ["system", "create-dev-char-symlinks"]:
        if node.loaded_module() is None:
            _ctk_log(
                "error",
                "error creating symlinks: failed to create device nodes:"
                " nvidia kernel module is not loaded",
            )
            return 1
        for link in node.create_dev_char_links():
            target = (node.p(link).parent / node.p(link).readlink()).name
            _ctk_log("info", f"Creating link {link} => /dev/{target}")
        return 0
    if words[:2] == ["cdi", "generate"]:
        return _cdi_generate(node, argv)
    _ctk_log("error", f"unsupported command {' '.join(words)} (bootfsm simulator)")
    return 1


# `nvidia-ctk cdi generate` flags (NVIDIA/nvidia-container-toolkit
# cmd/nvidia-ctk/cdi/generate/generate.go, urfave/cli v2: --name, --name=V or --name V).
_CDI_FLAGS = frozenset({"output", "format", "mode", "discovery-mode", "dev-root",
                        "device-name-strategy", "driver-root", "library-search-path",
                        "nvidia-ctk-path", "vendor", "cdi-vendor", "class", "cdi-class",
                        "csv.file", "csv.ignore-pattern"})  # fmt: skip


def _cdi_generate(node: Node, argv: list[str]) -> int:
    for arg in argv[2:]:
        name = arg.lstrip("-").split("=", 1)[0]
        if arg.startswith("-") and name not in _CDI_FLAGS:
            # urfave/cli: "Incorrect Usage" on stdout, then nvidia-ctk logs the error, exit 1
            print(f"Incorrect Usage: flag provided but not defined: -{name}\n")
            _ctk_log("error", f"flag provided but not defined: -{name}")
            return 1
    output = ""
    for i, arg in enumerate(argv):
        if arg.startswith("--output="):
            output = arg.split("=", 1)[1]
        elif arg == "--output" and i + 1 < len(argv):
            output = argv[i + 1]
    problem = node.cdi_problem()
    if problem is not None:
        _ctk_log("error", problem)
        return 1
    spec = _cdi_yaml(node)
    if not output:
        sys.stdout.write(spec)
        return 0
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(spec)
    _ctk_log("info", f"Generated CDI spec with version 0.5.0 at {output} (uvm major {UVM_MAJOR})")
    return 0


_Command = Callable[[Node, list[str]], int]
_HERE: Mapping[str, _Command] = {
    "update-initramfs": update_initramfs,
    "ldconfig": ldconfig,
    "containerd": containerd,
    "nvidia-ctk": nvidia_ctk,
}
_DRIVER = ("nvidia-installer", "dkms", "modprobe", "nvidia-modprobe", "nvidia-smi", "modinfo",
           "nvidia-persistenced")  # fmt: skip
_UNITS = ("systemctl", "nvidia-fabricmanager-start.sh", "journalctl")
_PACKAGES = ("dpkg", "dpkg-query")


def _handler(name: str) -> _Command | None:
    """The command function for a stand-in name; imports only the module it lives in."""
    if name == "nvidia-smi":
        from bootfsm.sim import standin_smi

        return standin_smi.nvidia_smi
    if name in _DRIVER:
        from bootfsm.sim import standin_driver

        return standin_driver.COMMANDS[name]
    if name in _UNITS:
        from bootfsm.sim import standin_systemctl

        return standin_systemctl.COMMANDS[name]
    if name in _PACKAGES:
        from bootfsm.sim import standin_dpkg

        return standin_dpkg.COMMANDS[name]
    return _HERE.get(name)


ARTIFACT_STANDINS = ("nvidia-installer", "nvidia-fabricmanager-start.sh", "nvidia-persistenced")
"""Stand-ins that live inside artifacts (runfile, fabric manager archive) or that an
artifact installs (the runfile's /usr/bin/nvidia-persistenced), not on PATH."""

PATH_STANDINS = tuple(sorted({*_HERE, *_DRIVER, *_UNITS, *_PACKAGES} - set(ARTIFACT_STANDINS)))
"""Stand-ins written to the node's bin dir (put first on PATH)."""


def main(name: str, root: str, argv: list[str]) -> int:
    """Run stand-in `name` on the node at `root`; log the call; return its exit code."""
    started = time.time()
    handler = _handler(name)
    try:
        if handler is None:
            _err(f"{name}: not a bootfsm simulator stand-in")
            rc = 127
        else:
            rc = handler(Node(Path(root)), list(argv))
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        rc = 130
    except Exception:
        traceback.print_exc()
        _err(f"{name}: bootfsm simulator stand-in crashed")
        rc = 1
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    with contextlib.suppress(OSError):
        log_call(Path(root), name, list(argv), rc, started)
    return rc
