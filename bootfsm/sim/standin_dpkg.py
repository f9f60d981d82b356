"""Package stand-ins: ``dpkg -i`` / ``--print-architecture`` / ``--audit`` /
``--configure -a`` and ``dpkg-query -W``/``-s``.

The package database (deb822, versions, status file, locks) is in
:mod:`standin_dpkg_db`, ``dpkg -i`` in :mod:`standin_dpkg_install`; the argv grammar,
``--purge``, ``--audit``, ``--configure -a`` and dpkg-query are here. Wording checked
against the real dpkg 1.21.23 run with ``--root`` on a test directory.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping

from bootfsm.sim.nodestate import Node
from bootfsm.sim.standin_dpkg_db import LOCK_DB, Db, locks, one_lock, relations
from bootfsm.sim.standin_dpkg_install import install_debs

__all__ = ["COMMANDS"]

_FORCE = frozenset({"--force-overwrite", "--force-depends", "--force-all", "--force-confold",
                    "--force-confdef", "--force-confnew"})  # fmt: skip

# `dpkg --audit` sections (src/main/enquiry.c audit_problems), in dpkg's order, for the
# states this stand-in's database can hold; the list/md5sums checks are not simulated.
_AUDIT = (
    ("unpacked", "The following packages have been unpacked but not yet configured.\n"
     "They must be configured using dpkg --configure or the configure\n"
     "menu option in dselect for them to work:\n"),
    ("half-configured",
     "The following packages are only half configured, probably due to problems\n"
     "configuring them the first time.  The configuration should be retried using\n"
     "dpkg --configure <package> or the configure menu option in dselect:\n"),
    ("half-installed", "The following packages are only half installed, due to problems during\n"
     "installation.  The installation can probably be completed by retrying it;\n"
     "the packages can be removed using dselect or dpkg --remove:\n"),
    ("triggers-awaited", "The following packages are awaiting processing of triggers that they\n"
     "have activated in other packages.  This processing can be requested using\n"
     "dselect or dpkg --configure --pending (or dpkg --triggers-only):\n"),
    ("triggers-pending", "The following packages have been triggered, but the trigger processing\n"
     "has not yet been done.  Trigger processing can be requested using\n"
     "dselect or dpkg --configure --pending (or dpkg --triggers-only):\n"),
)  # fmt: skip


def _audit(node: Node) -> int:
    """`dpkg --audit` (`-C`): exit 0 whatever it finds, as dpkg 1.21 does."""
    with one_lock(node, LOCK_DB) as holder:
        if holder is not None:
            print(
                "Another process has locked the database for writing, and might currently be\n"
                "modifying it, some of the following problems might just be due to that.\n"
            )
    db = Db(node)
    for state, text in _AUDIT:
        names = [n for n, st in sorted(db.packages.items()) if st.get("Status", "").split()[-1:]
                 == [state]]  # fmt: skip
        if names:
            print(text, end="")
            for name in names:
                desc = db.packages[name].get("Description", "").split("\n", 1)[0]
                print(f" {name:<20} {desc}"[:79])
            print()
    return 0


def _configure_all(node: Node) -> int:
    """`dpkg --configure -a` (`--pending`): configure every unpacked or half-configured
    package (their maintainer scripts are not simulated) and fold the journal in."""
    with locks(node) as locked:
        if not locked:
            return 2
        db = Db(node)
        for name, stanza in sorted(db.packages.items()):
            want, flag, state = ([*stanza.get("Status", "").split(), "", "", ""])[:3]
            if state in ("unpacked", "half-configured", "triggers-awaited", "triggers-pending"):
                print(f"Setting up {name} ({stanza.get('Version', '')}) ...")
                stanza["Status"] = f"{want} {flag} installed"
        db.save()
    return 0


# dpkg 1.21.23's usage tail after an argument error (src/main/main.c printforhelp),
# as the real dpkg prints it on Debian 12 (checked with --root on a test directory).
_FOR_HELP = (
    "\nType dpkg --help for help about installing and deinstalling packages [*];\n"
    "Use 'apt' or 'aptitude' for user-friendly package management;\n"
    "Type dpkg -Dhelp for a list of dpkg debug flag values;\n"
    "Type dpkg --force-help for a list of forcing options;\n"
    "Type dpkg-deb --help for help about manipulating *.deb files;\n\n"
    "Options marked [*] produce a lot of output - pipe it through 'less' or 'more' !"
)
_ACTIONS = {"-i": "--install", "--install": "--install", "-P": "--purge", "--purge": "--purge"}
_SHORT = {"--install": "-i", "--purge": "-P"}


def _usage_error(message: str) -> int:
    print(f"dpkg: error: {message}\n{_FOR_HELP}", file=sys.stderr)
    return 2


def _depends_on(stanza: dict[str, str], name: str) -> bool:
    groups = [*relations(stanza.get("Pre-Depends", "")), *relations(stanza.get("Depends", ""))]
    return any(all(alt[0] == name for alt in group) for group in groups)


def _purge(node: Node, names: list[str]) -> int:
    """`dpkg --purge PKG...` (`-P`) as dpkg 1.21.23 words it (checked against the real
    dpkg with --root): a package not installed is "dpkg: warning: ignoring request to
    remove X which isn't installed" (no error); one another installed package depends
    on is refused ("dependency problems prevent removal of X:" / " Y depends on X.",
    "dpkg: error processing package X (--purge):" / " dependency problems - not
    removing", then "Errors were encountered while processing:", exit 1); the others go
    dependents first: "(Reading database ... N files and directories currently
    installed.)" once, "Removing X (V) ...", "Purging configuration files for X (V) ..."
    when it has conffiles; its files (those no other package lists), its info/ files and
    its status stanza are removed. Directories stay (the stand-in's file lists, unlike
    dpkg's, name no directories)."""
    with locks(node) as locked:
        if not locked:
            return 2
        db = Db(node)
        todo: list[str] = []
        for name in names:
            state = db.packages.get(name, {}).get("Status", "").split()[-1:]
            if state in ([], ["not-installed"]):
                print(f"dpkg: warning: ignoring request to remove {name} which isn't installed",
                      file=sys.stderr)  # fmt: skip
            elif name not in todo:
                todo.append(name)
        errors: list[str] = []
        for name in list(todo):
            users = [p for p, st in sorted(db.packages.items())
                     if p not in todo and _depends_on(st, name)]  # fmt: skip
            if users:
                print(f"dpkg: dependency problems prevent removal of {name}:\n"
                      + "".join(f" {u} depends on {name}.\n" for u in users)
                      + f"\ndpkg: error processing package {name} (--purge):\n"
                      " dependency problems - not removing", file=sys.stderr)  # fmt: skip
                errors.append(name)
                todo.remove(name)
        read = False
        while todo:  # dependents first, as dpkg defers a package others still need
            name = next(n for n in todo if not any(_depends_on(db.packages[o], n)
                                                    for o in todo if o != n))  # fmt: skip
            todo.remove(name)
            if not read:
                known = sum(len(db.files(p)) for p in db.packages)
                print(f"(Reading database ... {known} files and directories currently installed.)")
                read = True
            stanza = db.packages.pop(name)
            version = stanza.get("Version", "")
            print(f"Removing {name} ({version}) ...")
            for path in db.files(name):
                if db.owner(path, exclude=name) is None:
                    node.remove(path.lstrip("/"))
            if stanza.get("Conffiles"):
                print(f"Purging configuration files for {name} ({version}) ...")
            for info in node.p("var/lib/dpkg/info").glob(f"{name}.*"):
                info.unlink()
        db.save()
    if errors:
        print("Errors were encountered while processing:\n" + "".join(f" {e}\n" for e in errors),
              end="", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def dpkg(node: Node, argv: list[str]) -> int:
    """`dpkg --print-architecture`, `--audit`, `--configure -a`,
    `dpkg -i [--force-overwrite] [--force-depends] DEB...` and `dpkg --purge PKG...`."""
    actions = [a for a in argv if a in _ACTIONS]
    if len({_ACTIONS[a] for a in actions}) > 1 or len(actions) > 1:
        first, second = (_ACTIONS[a] for a in actions[:2])
        return _usage_error(f"conflicting actions {_SHORT[second]} ({second}) and "
                            f"{_SHORT[first]} ({first})")  # fmt: skip
    if actions and _ACTIONS[actions[0]] == "--purge":
        bad = sorted(a for a in argv if a.startswith("-") and a not in _ACTIONS)
        if bad:
            return _usage_error(f"unknown option {bad[0]}")
        names = [a for a in argv if not a.startswith("-")]
        if not names:
            return _usage_error("--purge needs at least one package name argument")
        return _purge(node, names)
    if argv == ["--print-architecture"]:
        print(node.deb_arch)
        return 0
    if argv in (["--audit"], ["-C"]):
        return _audit(node)
    if argv in (["--configure", "-a"], ["--configure", "--pending"]):
        return _configure_all(node)
    if argv == ["--configure"]:
        print(
            "dpkg: error: --configure needs at least one package name argument\n\n"
            "Type dpkg --help for help about installing and deinstalling packages [*];",
            file=sys.stderr,
        )
        return 2
    options = {a for a in argv if a.startswith("-")}
    if "--force-all" in options:
        options |= {"--force-overwrite", "--force-depends"}
    unknown = options - _FORCE - {"-i", "--install"}
    if unknown:
        return _usage_error(f"unknown option {sorted(unknown)[0]}")
    if not options & {"-i", "--install"}:
        print("dpkg: error: need an action option\n\nType dpkg --help for help.", file=sys.stderr)
        return 2
    debs = [a for a in argv if not a.startswith("-")]
    if not debs:
        print(
            "dpkg: error: --install needs at least one package archive file argument",
            file=sys.stderr,
        )
        return 2
    return install_debs(node, options, debs)


# ---------------------------------------------------------------------- dpkg-query

_ABBREV_WANT = {"unknown": "u", "install": "i", "hold": "h", "deinstall": "r", "purge": "p"}
_ABBREV_STATUS = {"not-installed": "n", "config-files": "c", "half-installed": "H", "unpacked": "U",
                  "half-configured": "F", "triggers-awaited": "W", "triggers-pending": "t",
                  "installed": "i"}  # fmt: skip


def _field(stanza: dict[str, str], name: str) -> str:
    if name == "binary:Package":
        return stanza.get("Package", "")
    if name == "db:Status-Abbrev":
        want, err, status = [*stanza.get("Status", "unknown ok not-installed").split(), "", ""][:3]
        return (
            _ABBREV_WANT.get(want, "u")
            + _ABBREV_STATUS.get(status, "n")
            + (" " if err == "ok" else "R")
        )
    lowered = {k.lower(): v for k, v in stanza.items()}
    return lowered.get(name.lower(), "")


def _format(fmt: str, stanza: dict[str, str]) -> str:
    """Expand a --showformat string: ${Field}, ${Field;width}, \\n, \\t."""

    def expand(match: re.Match[str]) -> str:
        value = _field(stanza, match.group(1))
        width = int(match.group(2)) if match.group(2) else 0
        return value.rjust(width) if width > 0 else value.ljust(-width)

    text = re.sub(r"\$\{([^};]+)(?:;(-?\d+))?\}", expand, fmt)
    return text.replace("\\n", "\n").replace("\\t", "\t").replace("\\\\", "\\")


def _query_error(message: str) -> int:
    """dpkg-query's badusage(): the message, then where help is, exit 2 (dpkg 1.21
    src/query/main.c, as Debian 12's dpkg-query prints it)."""
    print(f"dpkg-query: error: {message}\n\nUse --help for help about querying packages.",
          file=sys.stderr)  # fmt: skip
    return 2


def dpkg_query(node: Node, argv: list[str]) -> int:
    """`dpkg-query -W [-f=FMT] [PKG...]` and `dpkg-query -s PKG...`."""
    fmt = "${binary:Package}\\t${Version}\\n"
    mode = ""
    names: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("-W", "--show"):
            mode = "show"
        elif arg in ("-s", "--status"):
            mode = "status"
        elif arg in ("-f", "--showformat"):
            value = next(args, None)
            if value is None:
                return _query_error(f"{arg} option takes a value")
            fmt = value
        elif arg.startswith(("-f=", "--showformat=")):
            fmt = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            return _query_error(f"unknown option {arg}")
        else:
            names.append(arg.split(":", 1)[0])
    if not mode:
        return _query_error("need an action option")
    packages = Db(node).packages
    rc = 0
    for name in names or sorted(packages):
        stanza = packages.get(name)
        if stanza is None:
            if mode == "show":
                print(f"dpkg-query: no packages found matching {name}", file=sys.stderr)
            else:
                print(
                    f"dpkg-query: package '{name}' is not installed and no information"
                    " is available\n"
                    "Use dpkg --info (= dpkg-deb --info) to examine archive files.",
                    file=sys.stderr,
                )
            rc = 1
        elif mode == "show":
            sys.stdout.write(_format(fmt, stanza))
        else:
            sys.stdout.write("".join(f"{k}: {v}\n" for k, v in stanza.items()) + "\n")
    return rc


COMMANDS: Mapping[str, Callable[[Node, list[str]], int]] = {
    "dpkg": dpkg,
    "dpkg-query": dpkg_query,
}
