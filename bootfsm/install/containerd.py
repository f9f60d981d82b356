"""containerd's NVIDIA runtime: the drop-in, the ``imports`` line of config.toml and what
``containerd config dump`` says (pure), and the verbs that wire it on the node
(``major``, ``wired``, ``wire``: I/O through the context).

An imported plugin table replaces config.toml's whole (containerd 1.6-2.x), so the
drop-in carries config.toml's entire CRI runtime plugin table plus the nvidia runtime, as
``nvidia-ctk runtime configure --drop-in-config`` does.
"""

from __future__ import annotations

import fnmatch
import json
import math
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.core.compat import tomllib
from bootfsm.core.errors import BootError
from bootfsm.install import records
from bootfsm.machine.context import Context
from bootfsm.parsers import ParseError
from bootfsm.parsers.driver_info import parse_containerd_version

__all__ = [
    "CONFIG",
    "DROPIN",
    "DROPIN_GLOB",
    "RUNTIME_BINARY",
    "ContainerdConfigError",
    "dropin_text",
    "ensure_import",
    "import_edit",
    "imports_cover",
    "major",
    "plugin_for_version",
    "render_toml",
    "runtime_problem",
    "undo_import",
    "wire",
    "wired",
]

CONFIG = "/etc/containerd/config.toml"
DROPIN = "/etc/containerd/config.d/10-nvidia-runtime.toml"
DROPIN_GLOB = "/etc/containerd/config.d/*.toml"
RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"
# by the file's schema version; the dump is in the binary's own (2 for 1.x, 3 for 2.x)
_PLUGINS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


class ContainerdConfigError(ValueError):
    """config.toml (or a dump) is not what containerd would accept; the message says why."""


def plugin_for_version(version: int) -> str:
    """The CRI runtime plugin's table name in a file of schema ``version``."""
    if version not in _PLUGINS:
        raise ContainerdConfigError(f"unknown containerd config version {version}")
    return _PLUGINS[version]


def _load(text: str, what: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ContainerdConfigError(f"{what} is not valid TOML: {exc}") from exc


def _version(data: Mapping[str, Any], default: int) -> int:
    v = data.get("version", default)
    if isinstance(v, bool) or not isinstance(v, int) or v not in _PLUGINS:
        raise ContainerdConfigError(f"config.toml: unsupported version {v!r}")
    return v


def _imports(data: Mapping[str, Any]) -> list[str]:
    imports = data.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise ContainerdConfigError("config.toml: imports must be a list of strings")
    return list(imports)


# -- the drop-in -------------------------------------------------------------------------


def _key(k: str) -> str:
    bare = k and all(c.isascii() and (c.isalnum() or c in "-_") for c in k)
    return k if bare else json.dumps(k)


def _scalar(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return ("-" if v < 0 else "") + ("nan" if math.isnan(v) else "inf")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(_scalar(i, where) for i in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_scalar(i, where)}" for k, i in v.items()) + "}"
    raise ContainerdConfigError(f"{where}: cannot write a {type(v).__name__} value")


def render_toml(data: Mapping[str, Any], prefix: Sequence[str] = ()) -> str:
    """TOML for plain data (tables, strings, numbers, booleans, arrays); what
    ``tomllib.loads`` gives back equals ``data``."""
    head = [f"{_key(k)} = {_scalar(v, '.'.join([*prefix, k]))}\n" for k, v in data.items()
            if not isinstance(v, dict)]  # fmt: skip
    out = "".join(head)
    for k, v in data.items():
        if isinstance(v, dict):
            path = [*prefix, k]
            body = render_toml(v, path)
            if any(not isinstance(i, dict) for i in v.values()) or not v:
                out += ("\n" if out else "") + "[" + ".".join(_key(p) for p in path) + "]\n"
                out += body
            else:
                out += ("\n" if out else "") + body
    return out


def dropin_text(config_text: str | None, major: int) -> str:
    """The drop-in for config.toml ``config_text`` (None: absent) and containerd
    ``major``.x: its whole CRI runtime plugin table plus the nvidia runtime, in its
    schema version."""
    data = _load(config_text, "config.toml") if config_text is not None else {}
    default = 1 if major < 2 else 2  # containerd's reading of a file without version
    version = _version(data, default) if config_text is not None else (3 if major >= 2 else 2)
    if major < 2 and version > 2:
        raise ContainerdConfigError(f"config.toml is version {version}; containerd 1.x reads 1-2")
    plugin = plugin_for_version(version)
    table: dict[str, Any] = json.loads(json.dumps(data.get("plugins", {}).get(plugin, {})))
    runtimes = table.setdefault("containerd", {}).setdefault("runtimes", {})
    if not isinstance(runtimes, dict):
        raise ContainerdConfigError(f"config.toml: plugins.{plugin}.containerd.runtimes")
    runtimes["nvidia"] = {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": RUNTIME_BINARY},
    }
    return (
        f"# written by bootfsm: config.toml's {plugin} plugin table with the nvidia runtime\n"
        "# added (an imported plugin table replaces config.toml's whole)\n"
        f"version = {version}\n\n" + render_toml({"plugins": {plugin: table}})
    )


# -- the imports line --------------------------------------------------------------------


def imports_cover(imports: Sequence[str], path: str, config: str = CONFIG) -> bool:
    """True when one of ``imports`` (relative to config's directory; Go ``filepath.Glob``
    patterns, where ``*`` never crosses a ``/``) names ``path``."""
    for pattern in imports:
        full = posixpath.normpath(posixpath.join(posixpath.dirname(config), pattern))
        p, q = full.split("/"), path.split("/")
        if len(p) == len(q) and all(fnmatch.fnmatchcase(b, a) for a, b in zip(p, q, strict=True)):
            return True
    return False


def _array_end(text: str, start: int) -> int:
    """Index just past the ``]`` closing the array that opens at ``text[start]``."""
    depth, i, n = 0, start, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            triple = text.startswith(c * 3, i)
            quote = c * 3 if triple else c
            i += len(quote)
            while i < n and not text.startswith(quote, i):
                i += 2 if (c == '"' and text[i] == "\\") else 1
            i += len(quote)
            continue
        if c == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ContainerdConfigError("config.toml: the imports array is not closed")


def _top_level_key_line(text: str, key: str) -> tuple[int, int] | None:
    """(start of the line, index of its '[') of ``key = [`` before the first table, or None."""
    pos = 0
    for line in text.splitlines(keepends=True):
        s = line.strip()
        if s.startswith("["):
            return None
        name, eq, rest = s.partition("=")
        if eq and name.strip() in (key, f'"{key}"', f"'{key}'") and rest.strip().startswith("["):
            return pos, pos + line.index("[", line.index("="))
        pos += len(line)
    return None


def ensure_import(
    text: str | None,
    entry: str = DROPIN_GLOB,
    major: int = 1,
    *,
    dropin: str = DROPIN,
    config: str = CONFIG,
) -> str | None:
    """config.toml with ``entry`` in its imports (a minimal file for ``text`` None),
    or None when already covered. Only the imports line changes, else
    ContainerdConfigError."""
    if text is None:
        return f"version = {3 if major >= 2 else 2}\nimports = [{json.dumps(entry)}]\n"
    before = _load(text, "config.toml")
    imports = _imports(before)
    if imports_cover(imports, dropin, config):
        return None
    rendered = "imports = [" + ", ".join(json.dumps(i) for i in [*imports, entry]) + "]"
    found = _top_level_key_line(text, "imports")
    if found is not None:
        start, bracket = found
        new = text[:start] + rendered + text[_array_end(text, bracket) :]
    elif "imports" in before:
        raise ContainerdConfigError("config.toml: cannot locate its imports line to edit it")
    else:
        new = _insert_line(text, rendered)
    after = _load(new, "the edited config.toml")
    if _imports(after) != [*imports, entry] or {**after, "imports": 0} != {**before, "imports": 0}:
        raise ContainerdConfigError("config.toml: editing the imports line changed other keys")
    return new


def _insert_line(text: str, line: str) -> str:
    """``text`` with ``line`` after its leading comments and version line."""
    nl = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    at = 0
    for i, old in enumerate(lines):
        s = old.strip()
        if s.startswith("[") or (s and not s.startswith("#") and not s.startswith("version")):
            break
        at = i + 1
    if lines and at and not lines[at - 1].endswith(("\n", "\r")):
        lines[at - 1] += nl
    return "".join(lines[:at]) + line + nl + "".join(lines[at:])


def import_edit(before: str, after: str) -> dict[str, Any]:
    """What ``ensure_import`` changed from ``before`` to ``after`` (pure): ``from``,
    ``to`` and the earlier ``imports``, for ``undo_import``."""
    head = 0
    while head < min(len(before), len(after)) and before[head] == after[head]:
        head += 1
    tail = 0
    while tail < min(len(before), len(after)) - head and before[-1 - tail] == after[-1 - tail]:
        tail += 1
    return {
        "from": before[head : len(before) - tail],
        "to": after[head : len(after) - tail],
        "imports": _imports(_load(before, "config.toml")),
    }


def undo_import(text: str, edit: Mapping[str, Any]) -> str | None:
    """``text`` with bootfsm's imports edit undone (``edit["to"]`` back to
    ``edit["from"]``); None unless it then has the earlier imports and every other key
    unchanged."""
    to, frm = edit.get("to"), edit.get("from")
    if not isinstance(to, str) or not isinstance(frm, str) or not to or text.count(to) != 1:
        return None
    new = text.replace(to, frm, 1)
    try:
        now, undone = _load(text, "config.toml"), _load(new, "config.toml")
        same = {**now, "imports": 0} == {**undone, "imports": 0}
        return new if same and _imports(undone) == edit.get("imports") else None
    except ContainerdConfigError:
        return None


# -- the merged view ---------------------------------------------------------------------


def runtime_problem(dump: str, major: int, config_text: str | None = None) -> str | None:
    """What is wrong with ``containerd config dump`` output of containerd ``major``.x;
    None when the nvidia runtime, its binary and every config.toml runtime are there."""
    data = _load(dump, "containerd config dump output")
    version = 3 if major >= 2 else 2
    plugin = plugin_for_version(version)
    runtimes = data.get("plugins", {}).get(plugin, {}).get("containerd", {}).get("runtimes", {})
    nvidia = runtimes.get("nvidia") if isinstance(runtimes, dict) else None
    if not isinstance(nvidia, dict):
        return f"the merged config has no plugins.{plugin}.containerd.runtimes.nvidia"
    binary = (nvidia.get("options") or {}).get("BinaryName")
    if binary != RUNTIME_BINARY:
        return f"the nvidia runtime's BinaryName is {binary!r}, not {RUNTIME_BINARY!r}"
    if config_text:
        cfg = _load(config_text, "config.toml")
        own = cfg.get("plugins", {}).get(plugin_for_version(_version(cfg, 1 if major < 2 else 2)))
        defined = ((own or {}).get("containerd") or {}).get("runtimes") or {}
        lost = sorted(set(defined) - set(runtimes))
        if lost:
            return f"the merged config lost config.toml's runtime(s) {', '.join(lost)}"
    return None


# -- the verbs (I/O through the context) -------------------------------------------------


def major(ctx: Context) -> int:
    """containerd's major version (``containerd --version``); CONTAINERD_RESTART_FAILED."""
    argv, code = ["containerd", "--version"], Code.CONTAINERD_RESTART_FAILED
    r = ctx.require(argv, code=code, timeout=30, die_with_bootfsm=False)  # only reads
    try:
        return parse_containerd_version(r.output)[0]
    except ParseError as exc:
        raise BootError(code, str(exc)) from exc


def wired(ctx: Context) -> bool:
    """Read-only: the drop-in is there and config.toml imports it (not edited away since)."""
    try:
        return ctx.host.exists(DROPIN) and ensure_import(ctx.host.read_text(CONFIG)) is None
    except ContainerdConfigError:
        return False


def wire(ctx: Context, version: int) -> bool:
    """Write the drop-in for containerd ``version``.x, import it from config.toml (its
    imports line only, atomic, recorded for uninstall), check containerd's merged view;
    True when a file changed. CONTAINERD_CONFIG_INVALID or CONTAINERD_RUNTIME_MISSING."""
    current = ctx.host.read_text(CONFIG)
    try:
        dropin = dropin_text(current, version)
        edited = ensure_import(current, major=version)
    except ContainerdConfigError as exc:
        raise BootError(Code.CONTAINERD_CONFIG_INVALID, f"{CONFIG}: {exc}") from exc
    changed = ctx.host.read_text(DROPIN) != dropin
    if changed:
        records.write_file(ctx, DROPIN, dropin)
    if edited is not None:
        st = ctx.host.stat(CONFIG)
        mode = st.st_mode & 0o7777 if st else 0o644
        edit = import_edit(current, edited) if current is not None else None
        records.write_file(ctx, CONFIG, edited, mode, edit=edit)  # uninstall undoes it
        ctx.event("containerd.import_added", config=CONFIG, entry=DROPIN_GLOB)
        changed = True
    _check_merged(ctx, version, edited or current)
    return changed


def _check_merged(ctx: Context, version: int, config_text: str | None) -> None:
    """``containerd config dump`` holds the nvidia runtime and config.toml's runtimes."""
    argv = ["containerd", "--config", str(ctx.host.path(CONFIG)), "config", "dump"]
    r, dump = ctx.capture(argv, timeout=30, die_with_bootfsm=False)  # only reads
    if not r.ok:
        raise BootError(
            Code.CONTAINERD_CONFIG_INVALID,
            f"containerd config dump refused {CONFIG}",
            output=r.output[-1000:],
        )
    try:
        problem = runtime_problem(dump, version, config_text)
    except ContainerdConfigError as exc:
        problem = str(exc)
    if problem:
        raise BootError(Code.CONTAINERD_RUNTIME_MISSING, f"containerd config dump: {problem}")
