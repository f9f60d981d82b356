"""Unit stand-ins: systemctl and the fabric manager's nvidia-fabricmanager-start.sh.

Enablement is the real on-disk form (symlinks under etc/systemd/system); the active
state is a file per unit under run/bootfsm-sim/{active,failed}/, cleared by a reboot.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bootfsm.sim.nodestate import FABRIC_MANAGER, NVLSM, UNIT_JOURNAL, Node, unit_name

__all__ = ["COMMANDS"]


@dataclass
class _Opts:
    now: bool = False
    quiet: bool = False
    words: list[str] = field(default_factory=list)
    properties: list[str] = field(default_factory=list)  # show -p/--property


def _parse(argv: list[str]) -> _Opts | str:
    """Split options from verb and units; a string is an error message."""
    opts = _Opts()
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == "--root":
            skip = True  # the node root is baked into the stand-in
            if i + 1 >= len(argv):
                return "systemctl: option '--root' requires an argument"
        elif arg.startswith("--root="):
            pass
        elif arg in ("-p", "--property"):
            skip = True
            if i + 1 >= len(argv):
                return f"systemctl: option requires an argument -- '{arg.lstrip('-')[0]}'"
            opts.properties += argv[i + 1].split(",")
        elif arg.startswith("--property="):
            opts.properties += arg.split("=", 1)[1].split(",")
        elif arg.startswith("-p") and len(arg) > 2:
            opts.properties += arg[2:].split(",")
        elif arg == "--now":
            opts.now = True
        elif arg in ("--quiet", "-q"):
            opts.quiet = True
        elif arg in ("--no-reload", "--no-block", "--no-pager", "--system", "--no-ask-password",
                     "--full", "-l", "--force"):  # fmt: skip
            pass
        elif arg.startswith("-"):
            return f"systemctl: unrecognized option '{arg}'"
        else:
            opts.words.append(arg)
    return opts


def _say(opts: _Opts, message: str) -> None:
    if message and not opts.quiet:
        sys.stderr.write(message)


def _enable(node: Node, units: list[str], opts: _Opts) -> int:
    for unit in units:
        if node.is_masked(unit):
            sys.stderr.write(
                f"Failed to enable unit: Unit file /etc/systemd/system/{unit} is masked.\n"
            )
            return 1
        source = node.unit_file(unit)
        if source is None:
            sys.stderr.write(f"Failed to enable unit: Unit file {unit} does not exist.\n")
            return 1
        for target in node.wanted_by(unit):
            link = f"etc/systemd/system/{target}.wants/{unit}"
            if not os.path.lexists(node.p(link)):
                node.symlink(source, link)
                _say(opts, f"Created symlink /{link} \u2192 {source}.\n")
    return _start(node, units, opts, "start") if opts.now else 0


def _disable(node: Node, units: list[str], opts: _Opts) -> int:
    for unit in units:
        if node.unit_file(unit) is None and not node.enable_links(unit):
            sys.stderr.write(f"Failed to disable unit: Unit file {unit} does not exist.\n")
            return 1
        for link in node.enable_links(unit):
            link.unlink()
            _say(opts, f'Removed "/{link.relative_to(node.root)}".\n')
    return _stop(node, units, opts, "stop") if opts.now else 0


def _mask(node: Node, units: list[str], opts: _Opts) -> int:
    for unit in units:
        path = node.p(f"etc/systemd/system/{unit}")
        if node.is_masked(unit):
            continue
        if os.path.lexists(path):
            sys.stderr.write(
                f"Failed to mask unit: File /etc/systemd/system/{unit} already exists.\n"
            )
            return 1
        node.symlink("/dev/null", f"etc/systemd/system/{unit}")
        _say(opts, f"Created symlink /etc/systemd/system/{unit} \u2192 /dev/null.\n")
    return _stop(node, units, opts, "stop") if opts.now else 0


def _unmask(node: Node, units: list[str], opts: _Opts) -> int:
    for unit in units:
        for base in ("etc/systemd/system", "run/systemd/system"):
            path = node.p(f"{base}/{unit}")
            if path.is_symlink() and os.readlink(path) == "/dev/null":
                path.unlink()
                _say(opts, f'Removed "/{base}/{unit}".\n')
    return 0


def _start(node: Node, units: list[str], opts: _Opts, verb: str) -> int:
    del opts
    for unit in units:
        rc, message = node.start_unit(unit, verb)
        if rc:
            sys.stderr.write(message)
            return rc
    return 0


def _stop(node: Node, units: list[str], opts: _Opts, verb: str) -> int:
    del opts
    for unit in units:
        rc, message = node.stop_unit(unit, verb)
        if rc:
            sys.stderr.write(message)
            return rc
    return 0


def _is_active(node: Node, units: list[str], opts: _Opts) -> int:
    states = [node.unit_state(unit) for unit in units]
    if not opts.quiet:
        for state in states:
            print(state)
    return 0 if states and all(s == "active" for s in states) else 3


def _is_failed(node: Node, units: list[str], opts: _Opts) -> int:
    states = [node.unit_state(unit) for unit in units]
    if not opts.quiet:
        for state in states:
            print(state)
    return 0 if any(s == "failed" for s in states) else 1


def _is_enabled(node: Node, units: list[str], opts: _Opts) -> int:
    rc = 1
    for unit in units:
        if node.is_masked(unit):
            state = "masked"
        elif node.unit_file(unit) is None:
            sys.stderr.write(
                f"Failed to get unit file state for {unit}: No such file or directory\n"
            )
            continue
        elif node.is_enabled(unit):
            state, rc = "enabled", 0
        elif not node.wanted_by(unit):
            state, rc = "static", 0
        else:
            state = "disabled"
        if not opts.quiet:
            print(state)
    return rc


def _status(node: Node, units: list[str], opts: _Opts) -> int:
    del opts
    rc = 0
    for unit in units:
        source = node.unit_file(unit)
        if source is None and not node.is_masked(unit):
            sys.stderr.write(f"Unit {unit} could not be found.\n")
            rc = max(rc, 4)
            continue
        state = node.unit_state(unit)
        enabled = (
            "masked"
            if node.is_masked(unit)
            else ("enabled" if node.is_enabled(unit) else "disabled")
        )
        loaded = (
            f"masked (Reason: Unit {unit} is masked.)"
            if enabled == "masked"
            else f"loaded ({source}; {enabled})"
        )
        sub = {"active": "active (running)", "failed": "failed (Result: exit-code)"}.get(
            state, "inactive (dead)"
        )
        print(f"\u25cf {unit}\n     Loaded: {loaded}\n     Active: {sub}")
        rc = rc if state == "active" else max(rc, 3)
    return rc


# The Unit interface's properties in the order systemd's bus vtable lists them, which
# is the order `systemctl show` prints them (systemd src/core/dbus-unit.c:
# LoadState, ActiveState, FreezerState, SubState, ..., UnitFileState); a property
# named with -p prints even when empty, one unknown to systemd prints nothing, and
# several units are separated by an empty line.
_SHOW_ORDER = ("Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "InvocationID")


def _show(node: Node, units: list[str], opts: _Opts) -> int:
    for n, unit in enumerate(units):
        masked, present = node.is_masked(unit), node.unit_file(unit) is not None
        state = node.unit_state(unit)
        if masked:
            enabled = "masked"
        elif not present:
            enabled = ""
        elif node.is_enabled(unit):
            enabled = "enabled"
        else:
            enabled = "static" if not node.wanted_by(unit) else "disabled"
        props = {
            "Id": unit,
            "LoadState": "masked" if masked else ("loaded" if present else "not-found"),
            "ActiveState": state if state in ("active", "failed") else "inactive",
            "SubState": {"active": "running", "failed": "failed"}.get(state, "dead"),
            "UnitFileState": enabled,
            "InvocationID": node.invocation(unit),
        }
        if n:
            print()
        for key in _SHOW_ORDER:
            if not opts.properties or key in opts.properties:
                print(f"{key}={props[key]}")
    return 0


_Verb = Callable[[Node, list[str], _Opts], int]
_VERBS: Mapping[str, _Verb] = {
    "enable": _enable,
    "disable": _disable,
    "mask": _mask,
    "unmask": _unmask,
    "start": lambda n, u, o: _start(n, u, o, "start"),
    "restart": lambda n, u, o: _start(n, u, o, "restart"),
    "reload-or-restart": lambda n, u, o: _start(n, u, o, "reload-or-restart"),
    "try-restart": lambda n, u, o: _start(
        n, [x for x in u if n.unit_state(x) == "active"], o, "try-restart"
    ),
    "stop": lambda n, u, o: _stop(n, u, o, "stop"),
    "is-active": _is_active,
    "is-failed": _is_failed,
    "is-enabled": _is_enabled,
    "status": _status,
    "show": _show,
}


def systemctl(node: Node, argv: list[str]) -> int:
    """systemctl over the node's unit files; accepts --root, --now, --quiet, --no-reload."""
    opts = _parse(argv)
    if isinstance(opts, str):
        print(opts, file=sys.stderr)
        return 1
    if not opts.words:
        print("systemctl: bootfsm simulator needs a verb", file=sys.stderr)
        return 1
    verb, units = opts.words[0], [unit_name(u) for u in opts.words[1:]]
    if verb in ("daemon-reload", "daemon-reexec"):
        return 0
    if verb == "reset-failed":
        for unit in units:
            if node.unit_state(unit) == "failed":
                node.set_unit_state(unit, "inactive")
        return 0
    handler = _VERBS.get(verb)
    if handler is None:
        print(f"Unknown command verb '{verb}'.", file=sys.stderr)
        return 1
    if not units:
        print("Too few arguments.", file=sys.stderr)
        return 1
    return handler(node, units, opts)


def fabricmanager_start(node: Node, argv: list[str]) -> int:
    """nvidia-fabricmanager-start.sh --mode start|stop|precheck (the 570+ wrapper in the FM
    archive; the unit runs precheck as ExecStartPre and start as ExecStart). By hand it
    starts the daemons but not the unit: `systemctl is-active` stays as it was. Like the
    580.196.07 script, an unknown option prints it and the help (exit 1) and an unknown
    mode does nothing (exit 0)."""
    mode = "interactive"
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "--mode"):
            mode = argv[i + 1] if i + 1 < len(argv) else ""
            i += 2
            continue
        if arg in ("-d", "--debug"):
            i += 1
            continue
        print(f"Unknown option: {arg}")
        print("NVIDIA Fabric Manager Start Script")
        return 1
    if mode == "stop":
        node.set_unit_state(FABRIC_MANAGER, "inactive")
        node.set_unit_state(NVLSM, "inactive")
        return 0
    if mode == "interactive":
        print("bootfsm simulator: nvidia-fabricmanager-start.sh interactive mode is not simulated")
        return 1
    rc, out, err = node.fabric_start_script(mode)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


_JOURNALCTL_FLAGS = frozenset({"--no-pager", "-q", "--quiet", "-b", "--boot", "-a", "--all"})


def journalctl(node: Node, argv: list[str]) -> int:
    """`journalctl [FIELD=VALUE...] [-u UNIT] [-k] [-n N] -o cat [--no-pager] [-q] [-b]`:
    the messages unit processes wrote (their stdout and stderr lines) and, with -k
    (--dmesg), the kernel's (_TRANSPORT=kernel); -n N (--lines=N) the newest N.

    Reference: systemd's journalctl(1) and journalctl 252 as run on Debian 12: matches
    FIELD=VALUE select entries (one field named twice: either value); ``-o cat`` prints
    each entry's MESSAGE alone; without --quiet an empty result prints "-- No entries
    --"; an unknown option is getopt's "<argv0>: unrecognized option '--x'", a word
    that is no match "Failed to add match 'x': Invalid argument", exit 1 both. Only
    ``-o cat`` is simulated.
    """
    matches: dict[str, set[str]] = {}
    output, quiet, rest, lines = "short", False, iter(argv), 0
    for arg in rest:
        if arg in ("-k", "--dmesg"):  # kernel messages only; implies -b
            matches.setdefault("_TRANSPORT", set()).add("kernel")
        elif arg.startswith("--lines="):
            value = arg.split("=", 1)[1]
            if not value.isdigit():
                sys.stderr.write(f"Failed to parse lines '{value}'\n")
                return 1
            lines = int(value)
        elif arg in ("-n", "--lines"):  # an optional argument: taken when a number follows
            lines = 10
            if argv[argv.index(arg) + 1 :][:1] and argv[argv.index(arg) + 1].isdigit():
                lines = int(next(rest))
        elif arg in ("-o", "--output"):
            output = next(rest, "")
        elif arg.startswith("--output="):
            output = arg.split("=", 1)[1]
        elif arg in ("-u", "--unit"):
            matches.setdefault("_SYSTEMD_UNIT", set()).add(unit_name(next(rest, "")))
        elif arg in _JOURNALCTL_FLAGS:
            quiet = quiet or arg in ("-q", "--quiet")
        elif arg.startswith("-"):
            sys.stderr.write(f"{sys.argv[0]}: unrecognized option '{arg}'\n")
            return 1
        elif "=" in arg:
            key, value = arg.split("=", 1)
            matches.setdefault(key, set()).add(value)
        else:
            sys.stderr.write(f"Failed to add match '{arg}': Invalid argument\n")
            return 1
    if output != "cat":
        sys.stderr.write(f"bootfsm simulator: journalctl -o {output} is not simulated\n")
        return 1
    text = node.read(UNIT_JOURNAL) or ""
    entries = [json.loads(line) for line in text.splitlines() if line.strip()]
    found = [e for e in entries if all(e.get(k) in v for k, v in matches.items())]
    found = found[-lines:] if lines else found
    for entry in found:
        print(entry["MESSAGE"])
    if not found and not quiet:
        print("-- No entries --")
    return 0


COMMANDS: Mapping[str, Callable[[Node, list[str]], int]] = {
    "systemctl": systemctl,
    "nvidia-fabricmanager-start.sh": fabricmanager_start,
    "journalctl": journalctl,
}
