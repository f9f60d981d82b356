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


def containerd_config(node: Node, argv: list[str]) -> int:
    """containerd [--config|-c FILE] config dump."""
    path = "/etc/containerd/config.toml"
    real = str(node.p("etc/containerd/config.toml"))
    args = list(argv)
    if args[:1] in (["--config"], ["-c"]) and len(args) >= 2:
        real = args[1]
        path = "/" + os.path.relpath(real, node.root) if real.startswith(str(node.root)) else real
        args = args[2:]
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
