"""The I/O boundary as it really is, enforced: which product modules may run commands,
open sockets, use the HTTP library, write files or read them (open, read_text, stat,
exists, listdir, resolve, os.path.getmtime and the like, under any import name, on any
path that is not the Host's) or ask whether stderr is a terminal at all.

docs/architecture.md states exactly these rules. A new exception must be added here,
with its reason, so the boundary never drifts silently. (ruff's banned-API rule catches
``import subprocess`` / ``import requests`` at lint time; this test covers the rest.)
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SUBPROCESS = {
    "bootfsm/host/process.py": "the one place that runs commands",
}
SOCKET = {
    "bootfsm/host/http_wire.py": "shuts a request's sockets down when its time is up",
    "bootfsm/host/journald.py": "AF_UNIX datagrams: the native journal protocol, sd_notify",
}
HTTP_LIBRARY = {
    "bootfsm/host/http.py": "GET, POST, resumable downloads",
    "bootfsm/host/http_wire.py": "the watched session, the body reader",
}
#: Besides every module in bootfsm/host/: who else writes files, and why.
WRITES = {
    "bootfsm/observe/journal.py": "appends to its own journal file (fsync on transitions)",
    "bootfsm/fetch/fetcher.py": "discards a failed download's .part and .part.meta",
    "bootfsm/commands/trace.py": "writes the --html page the user asked for",
}
#: Besides bootfsm/host/ and bootfsm/observe/ (journals are read back there): who reads
#: files directly rather than through Host. Every other read of the node is a Host call
#: (host.read_text, host.stat, host.exists, host.listdir, host.glob, ...).
READS = {
    "bootfsm/fetch/artifacts.py": "hashes a cached artifact in 1 MiB blocks",
    "bootfsm/run/runner.py": "reads its own journal back for the OTLP export; resolves --root",
    "bootfsm/commands/trace.py": "reads the journal file or directory named on the command line",
    "bootfsm/core/config_files.py": "reads the --config file and its drop-ins (before any Host)",
    "bootfsm/commands/validate.py": "says whether the --config file it checked exists",
    "bootfsm/commands/unit.py": "finds the unit files shipped in the package, sd_booted",
}
_WRITE_CALLS = {"os.open", "os.write", "os.replace", "os.rename", "os.fsync", "os.unlink"}
_WRITE_CALLS |= {"os.remove", "os.mkdir", "os.makedirs", "shutil.rmtree", "shutil.move"}
_WRITE_METHODS = {"write_text", "write_bytes", "mkdir", "unlink", "touch", "chmod"}
_WRITE_METHODS |= {"rmdir", "symlink_to", "rename", "replace"}
_READ_CALLS = {"os.listdir", "os.scandir", "os.stat", "os.lstat", "os.kill", "os.access"}
_READ_CALLS |= {"os.walk", "os.readlink", "os.path.exists", "os.path.isdir"}
_READ_CALLS |= {"os.path.isfile", "os.path.getsize", "os.path.islink", "os.path.lexists"}
_READ_CALLS |= {"os.path.getmtime", "os.path.getctime", "os.path.getatime", "os.path.realpath"}
_READ_CALLS |= {"os.path.samefile", "os.statvfs", "os.fstat", "shutil.disk_usage"}
_READ_METHODS = {"read_text", "read_bytes", "stat", "lstat", "exists", "is_file", "is_dir"}
_READ_METHODS |= {"iterdir", "glob", "rglob", "is_symlink", "readlink", "resolve"}
_READ_METHODS |= {"samefile", "is_mount", "is_socket", "is_fifo"}
#: Who may ask whether a stream is a terminal (a console's colours, a progress bar).
TTY = {
    "bootfsm/observe/journal.py": "colours the console echo of its own journal when a TTY",
}
# ctx.host.rename(...), self.host..., host.chmod(...) go through the Host; so do calls
# on ctx or self themselves (ctx.require(...)); ctx.journal.path.read_text() does not
_VIA_HOST = {"host", "ctx", "self"}
#: ``from os import stat``, ``from os.path import exists``, ``from shutil import rmtree``:
#: the same functions as above, under their bare names.
_IO_MODULES = ("os", "os.path", "shutil")
_NOT_PATHS = {"dataclasses"}  # dataclasses.replace(obj, ...) is not Path.replace


def _product() -> list[Path]:
    mods = [p for p in (REPO / "bootfsm").rglob("*.py") if "sim" not in p.parts]
    return sorted(
        [p for p in mods if "states" not in p.parts] + list((REPO / "states").glob("*.py"))
    )


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def _receiver(node: ast.expr) -> str:
    """Who a method is called on: "host" when the chain goes through one
    (``s.host.read_text``), the bare name when it is one (``ctx``, ``host``, ``Path``), ""
    for anything else: a call's result (``host.path(p).stat()``) or an attribute reached
    through a name (``ctx.journal.path``), which is a path like any other."""
    if isinstance(node, ast.Name):
        return node.id
    while isinstance(node, ast.Attribute):
        if node.attr == "host":
            return "host"
        node = node.value
    return ""


def _dotted(f: ast.expr) -> str:
    return ast.unparse(f) if isinstance(f, ast.Attribute) else ""


def _reads(f: ast.Attribute) -> bool:
    """``x.open()``, ``x.stat()``, ``x.read_text()``... on a receiver not through a Host."""
    if f.attr == "open":
        return _receiver(f.value) not in _VIA_HOST | {"os"}
    return f.attr in _READ_METHODS and _receiver(f.value) not in _VIA_HOST


def _imported(node: ast.ImportFrom) -> str:
    """The kind of I/O a ``from os|os.path|shutil import NAME`` brings in, or ""."""
    if node.module not in _IO_MODULES:
        return ""
    for alias in node.names:
        dotted = f"{node.module}.{alias.name}"
        if dotted in _WRITE_CALLS:
            return "write"
        if dotted in _READ_CALLS or (node.module == "os" and alias.name == "open"):
            return "read"
    return ""


def _uses(path: Path) -> dict[str, set[int]]:
    return _uses_in(path.read_text())


def _uses_in(source: str) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}

    def hit(kind: str, line: int) -> None:
        found.setdefault(kind, set()).add(line)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                top = name.split(".")[0]
                if top == "subprocess":
                    hit("subprocess", node.lineno)
                elif top == "socket":
                    hit("socket", node.lineno)
                elif top in ("requests", "urllib3"):
                    hit("http", node.lineno)
            if isinstance(node, ast.ImportFrom) and (kind := _imported(node)):
                hit(kind, node.lineno)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "open":
                hit("read", node.lineno)
            elif isinstance(f, ast.Attribute) and f.attr == "isatty":
                hit("tty", node.lineno)
            elif isinstance(f, ast.Attribute):
                dotted = f"{f.value.id}.{f.attr}" if isinstance(f.value, ast.Name) else ""
                if dotted in _WRITE_CALLS:
                    hit("write", node.lineno)
                elif _dotted(f) in _READ_CALLS or _reads(f):
                    hit("read", node.lineno)
                elif f.attr in _WRITE_METHODS and _receiver(f.value) not in _VIA_HOST:
                    if f.attr == "replace" and (
                        len(node.args) != 1 or _receiver(f.value) in _NOT_PATHS
                    ):
                        continue  # str.replace(a, b) takes two arguments; Path.replace one
                    hit("write", node.lineno)
    return found


def _check(kind: str, allowed: dict[str, str], floors: tuple[str, ...] = ()) -> list[str]:
    wrong = []
    for path in _product():
        rel = _rel(path)
        lines = _uses(path).get(kind)
        if lines and rel not in allowed and not rel.startswith(floors):
            wrong.append(f"{rel}:{min(lines)} {kind}")
    return wrong


def test_only_the_process_module_runs_commands() -> None:
    assert not _check("subprocess", SUBPROCESS)


def test_sockets_only_where_listed() -> None:
    assert not _check("socket", SOCKET)


def test_the_http_library_only_in_the_network_half() -> None:
    assert not _check("http", HTTP_LIBRARY)


def test_file_writes_only_in_the_host_layer_and_the_listed_exceptions() -> None:
    assert not _check("write", WRITES, ("bootfsm/host/",))


def test_file_reads_only_in_host_observe_and_the_listed_exceptions() -> None:
    assert not _check("read", READS, ("bootfsm/host/", "bootfsm/observe/"))


def test_terminal_checks_only_in_the_host_layer_and_the_listed_exceptions() -> None:
    """Whether stderr is a terminal is a fact of the node: Host answers it."""
    assert not _check("tty", TTY, ("bootfsm/host/",))


def test_states_do_no_io_of_their_own() -> None:
    """A state reaches the node only through its Context (ctx.host, ctx.run, ctx.http)."""
    for path in sorted((REPO / "states").glob("*.py")):
        assert not _uses(path), (_rel(path), _uses(path))


def test_every_listed_exception_still_needs_its_entry() -> None:
    """An allow-list entry whose module no longer does that I/O must be removed."""
    kinds = {"subprocess": SUBPROCESS, "socket": SOCKET, "http": HTTP_LIBRARY}
    kinds |= {"write": WRITES, "read": READS, "tty": TTY}
    stale = [
        f"{rel} ({kind})"
        for kind, allowed in kinds.items()
        for rel in allowed
        if (REPO / rel).exists() and kind not in _uses(REPO / rel)
    ]
    assert not stale, stale


def test_a_read_of_the_node_planted_in_a_state_is_caught() -> None:
    """The test above fails for each way a state could read the node behind ctx.host."""
    planted = [
        'ctx.host.path("/etc/os-release").read_text()',
        "ctx.host.path(CONFIG).stat()",
        "ctx.host.path(dest).lstat()",
        'ctx.host.path("/sys/module").iterdir()',
        'Path("/proc/driver/nvidia/params").exists()',
        'ctx.host.path("/dev").glob("nvidia*")',
        'os.listdir("/dev")',
        'os.stat("/dev/nvidia0")',
        'os.scandir("/sys/bus/pci/devices")',
        "os.kill(pid, 0)",
    ]
    for line in planted:
        assert _uses_in(f"def check(ctx):\n    return {line}\n") == {"read": {2}}, line
    for line in ('ctx.host.read_text("/etc/os-release")', "ctx.host.stat(CONFIG)"):
        assert not _uses_in(f"def check(ctx):\n    return {line}\n"), line


def test_every_other_read_form_planted_in_a_state_is_caught() -> None:
    """Imports under bare names, the os.path and os calls, Path.resolve, a path reached
    through the context (not its Host), and a terminal check: each is flagged."""
    planted = {
        "from os.path import exists": "read",
        "from os.path import getmtime as mtime": "read",
        "from os import stat, listdir": "read",
        "from os import replace": "write",
        "from shutil import rmtree": "write",
        "from shutil import disk_usage": "read",
        'os.path.getmtime("/var/run/cdi/nvidia.yaml")': "read",
        'os.path.realpath("/usr/bin/nvidia-smi")': "read",
        'os.statvfs("/var/cache/bootfsm")': "read",
        'os.path.lexists("/etc/cdi")': "read",
        'Path("/opt/bootfsm").resolve()': "read",
        "Path.resolve(dest)": "read",
        "ctx.journal.path.read_text()": "read",
        "ctx.journal.path.read_bytes()": "read",
        "ctx.journal.path.open()": "read",
        "ctx.config.path.stat()": "read",
        "self.marker.exists()": "read",
        "sys.stderr.isatty()": "tty",
        "ctx.console.isatty()": "tty",
    }
    for line, kind in planted.items():
        code = line if line.startswith("from ") else f"return {line}"
        assert _uses_in(f"def check(ctx):\n    {code}\n") == {kind: {2}}, line
    for line in (
        "from os import environ",
        "from os.path import join, basename",
        "from shutil import get_terminal_size",
        'm.group(1).replace("a", "b")',
    ):
        code = line if line.startswith("from ") else f"return {line}"
        assert not _uses_in(f"def check(ctx):\n    {code}\n"), line
