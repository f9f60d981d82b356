"""kmod's tools for the stand-ins: the modinfo stand-in (kmod 30's `modinfo`), the getopt
errors kmod prints and the nvidia module names; :mod:`standin_driver` uses them."""

from __future__ import annotations

import sys
from pathlib import Path

from bootfsm.sim.kmod_elf import ModuleFormatError, is_elf, read_module
from bootfsm.sim.nodestate import Node

__all__ = ["NVIDIA_MODULES", "getopt_error", "modinfo"]


NVIDIA_MODULES = frozenset({"nvidia", "nvidia-uvm", "nvidia_uvm", "nvidia-modeset",
                             "nvidia_modeset", "nvidia-drm", "nvidia_drm", "nvidia-peermem",
                             "nvidia_peermem"})  # fmt: skip


def getopt_error(argv: list[str], flags: frozenset[str], valued: frozenset[str]) -> str | None:
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


def _err(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)


_MODINFO_FLAGS = frozenset({"-a", "--author", "-d", "--description", "-l", "--license",
                            "-p", "--parameters", "-n", "--filename", "-0", "--null",
                            "-V", "--version", "-h", "--help"})  # fmt: skip
_MODINFO_VALUED = frozenset({"-F", "--field", "-k", "--set-version", "-b", "--basedir"})


def modinfo(node: Node, argv: list[str]) -> int:
    """`modinfo [-k KERNEL] [-F FIELD] nvidia[-uvm|-modeset]|FILE.ko`: the module kmod
    finds for the kernel (DKMS's updates/dkms, else Ubuntu's packaged kernel/nvidia-*srv*/),
    or the file named.

    Reference: kmod 30 modinfo on Debian 12: "modinfo: unrecognized option '--bogus'"
    (argv[0] as invoked), exit 1; "modinfo: ERROR: Module X not found.", exit 1. A real
    ELF module prints as kmod prints it (tools/modinfo.c, libkmod-signature.c): filename,
    then its .modinfo strings in file order (parmtype folded into parm, printed last, last first),
    then sig_id, signer, sig_key, sig_hashalgo and signature read from its appended
    PKCS#7 message (bootfsm.sim.kmod_elf); -F FIELD prints each value of that field.
    """
    problem = getopt_error(argv, _MODINFO_FLAGS, _MODINFO_VALUED)
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
    if "/" in names[0]:
        given = Path(names[0])
        path: Path | None = node.p(names[0].lstrip("/")) if given.is_absolute() else given
        if path is not None and not path.is_file():
            _err(f"modinfo: ERROR: Module {names[0]} not found.")
            return 1
    else:
        path = node.module_file(kernel, name) if name in NVIDIA_MODULES else None
    if path is None:
        _err(f"modinfo: ERROR: Module {names[0]} not found.")
        return 1
    data = path.read_bytes()
    shown = f"/{path.relative_to(node.root)}" if path.is_relative_to(node.root) else str(path)
    elf = is_elf(data)
    fields = _elf_fields(data) if elf else _text_fields(data.decode(), name)
    if fields is None:
        _err(f"modinfo: ERROR: could not get modinfo from '{name.replace('-', '_')}': "
             "Invalid argument")  # fmt: skip
        return 1
    fields.insert(0, ("filename", shown))
    for key, value in fields:
        if not field_name:
            lines = value.split("\n")
            head = f"{key + ':':<16}{lines[0]}"
            print(head if elf else head.rstrip())
            for more in lines[1:]:
                print(f"\t\t{more}")
        elif key == field_name and value:
            print(value)
    return 0


def _text_fields(text: str, name: str) -> list[tuple[str, str]]:
    """The simulator's own text module as modinfo shows a DKMS-built nvidia.ko."""
    keys = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return [
        ("alias", "char-major-195-*"),
        ("version", keys.get("version", "")),
        ("supported", "external"),
        ("license", keys.get("license", "")),
        ("depends", ""),
        ("retpoline", "Y"),
        ("name", keys.get("name", name).replace("-", "_")),
        ("vermagic", keys.get("vermagic", "")),
        # a simulated signed module: who signed it (it has no key id or signature bytes)
        *([("sig_id", "PKCS#7"), ("signer", keys["signer"])] if keys.get("signer") else []),
    ]


def _elf_fields(data: bytes) -> list[tuple[str, str]] | None:
    """A real module's fields in kmod's order, or None when it is unreadable."""
    try:
        module = read_module(data)
    except ModuleFormatError:
        return None
    params: dict[str, list[str]] = {}
    out: list[tuple[str, str]] = []
    for key, value in module.info:
        if key in ("parm", "parmtype"):
            pname, _, text = value.partition(":")
            entry = params.setdefault(pname, ["", ""])
            entry[0 if key == "parm" else 1] = text
        else:
            out.append((key, value))
    sig = module.signature
    if sig is not None:
        wrapped = [sig.signature[i : i + 20] for i in range(0, len(sig.signature), 20)]
        text = ":\n".join(":".join(f"{b:02X}" for b in chunk) for chunk in wrapped)
        out += [("sig_id", "PKCS#7"), ("signer", sig.signer), ("sig_key", sig.key_id),
                ("sig_hashalgo", sig.hash_algo), ("signature", text)]  # fmt: skip
    for pname, (desc, ptype) in reversed(params.items()):  # kmod lists them last first
        text = f"{desc} ({ptype})" if desc and ptype else desc or ptype
        out.append(("parm", f"{pname}:{text}"))
    return out
