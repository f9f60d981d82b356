"""`containerd [--config FILE] config dump` stand-in: containerd's own merge of
config.toml and what its ``imports`` list, with node paths under the node root.

Reference: containerd services/server/config/config.go (1.6 to 2.x) ``LoadConfig``,
``resolveImports`` and ``mergeConfig``, and the real containerd 1.6.20 (Debian 12) run
with ``--config`` on test files (tests/sim/test_sim_containerd.py compares the two):
imports are relative to the importing file's directory and globbed (``*`` never crosses
``/``); each imported file's imports are followed; top-level values of a later file
win; an imported ``plugins."<name>"`` table replaces the whole earlier table of that
plugin; the dump's ``imports`` lists the config file then every imported file. A file
that is not TOML fails as containerd does: ``containerd: failed to load TOML: ...``,
exit 1. Containerd 2.x reads version-2 files by moving the CRI plugin's ``containerd``
table to ``io.containerd.cri.v1.runtime``, and dumps version 3.

Less than the real dump: the real one also prints every default value of every plugin;
this one prints what the files set (bootfsm reads only the CRI runtimes from it).
"""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any

from bootfsm.core.compat import tomllib
from bootfsm.sim.nodestate import Node

__all__ = ["containerd_config"]


def _fail(message: str) -> int:
    print(f"containerd: {message}", file=sys.stderr)
    return 1


def _node_glob(node: Node, pattern: str) -> list[str]:
    """Node paths matching an absolute node-path pattern (looked up under the root)."""
    real = str(node.root) + pattern
    return sorted("/" + os.path.relpath(p, node.root) for p in glob.glob(real))


def _load(node: Node, path: str, real: str) -> dict[str, Any]:
    try:
        with open(real, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        msg = f"failed to load TOML: {path}: open {path}: no such file or directory"
        raise ValueError(msg) from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"failed to load TOML: {path}: {exc}") from exc


def _migrate(data: dict[str, Any], major: int) -> dict[str, Any]:
    if major < 2 or data.get("version", 1) >= 3:
        return data
    plugins = dict(data.get("plugins", {}))
    old = dict(plugins.pop("io.containerd.grpc.v1.cri", {}))
    if "containerd" in old:
        plugins["io.containerd.cri.v1.runtime"] = {"containerd": old.pop("containerd")}
    if old:
        plugins["io.containerd.grpc.v1.cri"] = old
    return {**data, "plugins": plugins, "version": 3}


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if key == "plugins":
            into.setdefault("plugins", {}).update(value)  # whole plugin tables replaced
        elif key != "imports":
            into[key] = value


def _key(k: str) -> str:
    ok = k and all(c.isascii() and (c.isalnum() or c in "-_") for c in k)
    return k if ok else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_value(i) for i in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(i)}" for k, i in v.items()) + "}"
    return json.dumps(v) if isinstance(v, str) else str(v)


def _emit(data: dict[str, Any], path: list[str], out: list[str], indent: int) -> None:
    pad = "  " * indent
    for k, v in sorted(data.items()):
        if not isinstance(v, dict):
            out.append(f"{pad}{_key(k)} = {_value(v)}")
    for k, v in sorted(data.items()):
        if isinstance(v, dict):
            sub = [*path, k]
            out.append("")
            out.append(pad + "[" + ".".join(_key(p) for p in sub) + "]")
            _emit(v, sub, out, indent + 1 if path else indent)


# What containerd 1.6.20 (Debian 12) prints for a flag it does not define: urfave/cli
# v1's "Incorrect Usage" line and the command's help on stdout, Go's flag error on
# stderr, exit 1 (the top level says "Incorrect Usage." and a subcommand "Incorrect
# Usage:"; the flag is named with one dash whatever was typed). Help text as
# `containerd --bogus` and `containerd config dump --bogus` print it there.
_BANNER = r"""
                    __        _                     __
  _________  ____  / /_____ _(_)___  ___  _________/ /
 / ___/ __ \/ __ \/ __/ __ `/ / __ \/ _ \/ ___/ __  /
/ /__/ /_/ / / / / /_/ /_/ / / / / /  __/ /  / /_/ /
\___/\____/_/ /_/\__/\__,_/_/_/ /_/\___/_/   \__,_/

high performance container runtime
"""
_TOP_HELP = "\n".join(
    [
        "NAME:",
        "   containerd - {banner}",
        "",
        "USAGE:",
        "   containerd [global options] command [command options] [arguments...]",
        "",
        "VERSION:",
        "   {version}",
        "",
        "DESCRIPTION:",
        "   ",  # containerd's own trailing blanks
        "containerd is a high performance container runtime whose daemon can be started",
        "by using this command. If none of the *config*, *publish*, or *help* commands",
        "are specified, the default action of the **containerd** command is to start the",
        "containerd daemon in the foreground.",
        "",
        "",
        "A default configuration is used if no TOML configuration is specified or located",
        "at the default file location. The *containerd config* command can be used to",
        "generate the default configuration for containerd. The output of that command",
        "can be used and modified as necessary as a custom configuration.",
        "",
        "COMMANDS:",
        "   config    information on the containerd config",
        "   publish   binary to publish events to containerd",
        "   oci-hook  provides a base for OCI runtime hooks to allow arguments to be injected.",
        "   help, h   Shows a list of commands or help for one command",
        "",
        "GLOBAL OPTIONS:",
        '   --config value, -c value     path to the configuration file (default: "/etc/containerd/config.toml")',  # noqa: E501
        "   --log-level value, -l value  set the logging level [trace, debug, info, warn, error, fatal, panic]",  # noqa: E501
        "   --address value, -a value    address for containerd's GRPC server",
        "   --root value                 containerd root directory",
        "   --state value                containerd state directory",
        "   --help, -h                   show help",
        "   --version, -v                print the version",
        "",
    ]
)
_DUMP_HELP = """NAME:
   containerd config dump - see the output of the final main config with imported in subconfig files

USAGE:
   containerd config dump [arguments...]
"""
_GLOBAL_VALUE = ("--config", "-c", "--log-level", "-l", "--address", "-a", "--root", "--state")


def _undefined(flag: str, node: Node, sub: bool) -> int:
    name = flag.lstrip("-").split("=", 1)[0]
    if sub:
        sys.stdout.write(f"Incorrect Usage: flag provided but not defined: -{name}\n\n")
        sys.stdout.write(_DUMP_HELP)
    else:
        sys.stdout.write(f"Incorrect Usage. flag provided but not defined: -{name}\n\n")
        sys.stdout.write(_TOP_HELP.format(banner=_BANNER, version=node.sku.containerd_version))
    return _fail(f"flag provided but not defined: -{name}")


def containerd_config(node: Node, argv: list[str]) -> int:
    """containerd [--config|-c FILE] config dump; an undefined flag fails as containerd's."""
    path = "/etc/containerd/config.toml"
    real = str(node.p("etc/containerd/config.toml"))
    args = list(argv)
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag.split("=", 1)[0] not in _GLOBAL_VALUE:
            return _undefined(flag, node, sub=False)
        value = flag.split("=", 1)[1] if "=" in flag else (args.pop(0) if args else "")
        if flag.split("=", 1)[0] in ("--config", "-c"):
            real = value
            inside = real.startswith(str(node.root))
            path = "/" + os.path.relpath(real, node.root) if inside else real
    extra = [a for a in args[2:] if a.startswith("-")]
    if args[:2] == ["config", "dump"] and extra:
        return _undefined(extra[0], node, sub=True)
    if args != ["config", "dump"]:
        return _fail(f"bootfsm simulator: unsupported arguments {' '.join(argv)!r}")
    major = int(node.sku.containerd_version.split(".")[0])
    try:
        merged = _migrate(_load(node, path, real), major)
        imported: list[str] = []
        pending = [(path, i) for i in merged.get("imports", [])]
        while pending:
            parent, pattern = pending.pop(0)
            full = (
                pattern
                if pattern.startswith("/")
                else os.path.join(os.path.dirname(parent), pattern)
            )
            for p in _node_glob(node, os.path.normpath(full)):
                if p in imported or p == path:
                    continue
                data = _migrate(_load(node, p, str(node.root) + p), major)
                imported.append(p)
                pending += [(p, i) for i in data.get("imports", [])]
                _merge(merged, data)
    except ValueError as exc:
        return _fail(str(exc))
    merged["imports"] = [path, *imported]
    merged["version"] = 3 if major >= 2 else 2
    out: list[str] = []
    _emit(merged, [], out, 0)
    print("\n".join(out).lstrip("\n"))
    return 0
