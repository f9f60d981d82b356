"""Package stand-ins: ``dpkg -i`` / ``--print-architecture`` / ``--audit`` /
``--configure -a`` and ``dpkg-query -W``/``-s``.

The package database is the real on-disk format: deb822 stanzas in var/lib/dpkg/status,
the journal in var/lib/dpkg/updates/<4 digits> (one stanza per file, replayed over the
status on every open and folded into it when dpkg writes: dpkg 1.21's
lib/dpkg/dbmodify.c) and file lists in var/lib/dpkg/info/<pkg>.list. Like dpkg, a
writing action takes the POSIX locks lock-frontend, then lock. Archives are read and
unpacked with the real ``dpkg-deb`` (found on PATH); only the bookkeeping is simulated.
Wording checked against the real dpkg 1.21.23 run with ``--root`` on a test directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import struct
import subprocess  # noqa: TID251 - bootfsm/sim runs the real dpkg-deb
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from bootfsm.sim.nodestate import Node

__all__ = ["COMMANDS", "compare_versions", "parse_deb822", "version_satisfies"]

_STATUS = "var/lib/dpkg/status"
_LOCK_FRONTEND = "var/lib/dpkg/lock-frontend"
_LOCK_DB = "var/lib/dpkg/lock"
_UPDATES = "var/lib/dpkg/updates"
_TOOL_TIMEOUT_S = 120.0
_RELATION_FIELDS = ("Replaces", "Provides", "Depends", "Pre-Depends", "Conflicts", "Breaks")


# ---------------------------------------------------------------------- deb822 and versions


def parse_deb822(text: str) -> list[dict[str, str]]:
    """Stanzas of a deb822 text; continuation lines are kept with their newline."""
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if not line.strip():
            if current:
                stanzas.append(current)
            current, last = {}, ""
        elif line[0] in " \t" and last:
            current[last] += "\n" + line
        elif ":" in line:
            key, value = line.split(":", 1)
            last = key.strip()
            current[last] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas


def _order(char: str) -> int:
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256 if char else 0


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp over an upstream version or a revision."""
    i = j = 0
    while i < len(a) or j < len(b):
        diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not diff:
                diff = ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if diff:
            return diff
    return 0


def _split_version(version: str) -> tuple[int, str, str]:
    epoch, _, rest = version.partition(":") if ":" in version else ("0", "", version)
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    return int(epoch or 0), upstream, revision


def compare_versions(a: str, b: str) -> int:
    """Debian version comparison: negative, zero or positive like dpkg --compare-versions."""
    ea, ua, ra = _split_version(a)
    eb, ub, rb = _split_version(b)
    if ea != eb:
        return ea - eb
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def version_satisfies(have: str, op: str, want: str) -> bool:
    """Whether version `have` meets a relation like ">= 1.17.2-1"."""
    cmp = compare_versions(have, want)
    return {
        "<<": cmp < 0, "<=": cmp <= 0, "<": cmp <= 0, "=": cmp == 0,
        ">=": cmp >= 0, ">": cmp >= 0, ">>": cmp > 0,
    }.get(op, False)  # fmt: skip


_RELATION = re.compile(
    r"([a-z0-9][a-z0-9+.-]*)(?::[a-z0-9-]+)?\s*(?:\(\s*(<<|<=|>=|>>|=|<|>)\s*([^)\s]+)\s*\))?"
)


def _relations(value: str) -> list[list[tuple[str, str, str]]]:
    """Parse "a (>= 1) | b, c" into [[("a", ">=", "1"), ("b", "", "")], [("c", "", "")]]."""
    groups: list[list[tuple[str, str, str]]] = []
    for group in value.split(","):
        alternatives = []
        for alt in group.split("|"):
            match = _RELATION.match(alt.strip())
            if match:
                alternatives.append((match.group(1), match.group(2) or "", match.group(3) or ""))
        if alternatives:
            groups.append(alternatives)
    return groups


# ---------------------------------------------------------------------- database


class _Db:
    """var/lib/dpkg/status plus the info/*.list file lists."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.packages = {
            s["Package"]: s for s in parse_deb822(node.read(_STATUS) or "") if "Package" in s
        }
        updates = node.p(_UPDATES)
        self.journal = (
            sorted(p for p in updates.iterdir() if p.name.isdigit()) if (updates.is_dir()) else []
        )
        for entry in self.journal:  # replayed in order, as modstatdb_open does
            for stanza in parse_deb822(entry.read_text()):
                if "Package" in stanza:
                    self.packages[stanza["Package"]] = stanza

    def save(self) -> None:
        """Write the status file back, stanzas sorted by package name; the journal, now
        folded in, is removed (dpkg's checkpoint)."""
        blocks = [
            "".join(f"{k}: {v}\n" for k, v in stanza.items())
            for _, stanza in sorted(self.packages.items())
        ]
        self.node.write(_STATUS, "\n".join(blocks))
        for entry in self.journal:
            entry.unlink(missing_ok=True)

    def files(self, package: str) -> list[str]:
        """Paths owned by a package."""
        text = self.node.read(f"var/lib/dpkg/info/{package}.list") or ""
        return [line for line in text.splitlines() if line]

    def set_files(self, package: str, paths: list[str]) -> None:
        """Replace a package's file list."""
        self.node.write(f"var/lib/dpkg/info/{package}.list", "".join(f"{p}\n" for p in paths))

    def owner(self, path: str, exclude: str) -> str | None:
        """The other package owning a non-directory path, if any."""
        for package in self.packages:
            if package != exclude and path in self.files(package):
                return package
        return None

    def provides(self, name: str) -> list[dict[str, str]]:
        """Installed (or unpacked) stanzas that are or provide `name`."""
        found = [self.packages[name]] if name in self.packages else []
        for stanza in self.packages.values():
            provided = {alt[0] for group in _relations(stanza.get("Provides", "")) for alt in group}
            if name in provided and stanza is not self.packages.get(name):
                found.append(stanza)
        return found


# ---------------------------------------------------------------------- lock


def _lock_holder(fd: int) -> int | None:
    """PID holding a conflicting POSIX lock on fd (F_GETLK), or None."""
    probe = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    try:
        result = fcntl.fcntl(fd, fcntl.F_GETLK, probe)
    except OSError:
        return None
    l_type, _whence, _start, _len, pid = struct.unpack("@hhqqi4x", result)
    return pid if l_type != fcntl.F_UNLCK else None


@contextlib.contextmanager
def _one_lock(node: Node, rel: str) -> Iterator[int | None]:
    """Take one lock non-blocking; yields None when taken, else the holder's pid (or 0)."""
    path = node.p(rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            yield _lock_holder(fd) or 0
            return
        yield None
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locks(node: Node) -> Iterator[bool]:
    """Both of dpkg's locks, frontend first; yields False (after dpkg's error) when held."""
    with _one_lock(node, _LOCK_FRONTEND) as front:
        if front is not None:
            _lock_error("dpkg frontend lock", front)
            yield False
            return
        with _one_lock(node, _LOCK_DB) as db:
            if db is not None:
                _lock_error("dpkg database lock", db)
                yield False
                return
            yield True


def _lock_error(what: str, holder: int) -> None:
    who = f"pid {holder}" if holder else "another process"
    print(
        f"dpkg: error: {what} was locked by another process with {who}\n"
        "Note: removing the lock file is always wrong, can damage the locked area\n"
        "and the entire system. See <https://wiki.debian.org/Teams/Dpkg/FAQ#db-lock>.",
        file=sys.stderr,
    )


# ---------------------------------------------------------------------- dpkg -i


def _dpkg_deb(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("dpkg-deb")
    if tool is None:
        raise FileNotFoundError("dpkg-deb is not installed (the dpkg stand-in needs it)")
    return subprocess.run(
        [tool, *args], capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, check=False
    )


@dataclass
class _Archive:
    path: str
    control: dict[str, str]
    files: list[str] = field(default_factory=list)

    @property
    def package(self) -> str:
        return self.control.get("Package", "")

    @property
    def version(self) -> str:
        return self.control.get("Version", "")


def _members(deb: str) -> list[str]:
    """Non-directory paths in a deb, found by unpacking it to a scratch directory."""
    with tempfile.TemporaryDirectory(prefix="bootfsm-sim-deb-") as tmp:
        proc = _dpkg_deb("-x", deb, tmp)
        if proc.returncode:
            raise RuntimeError(proc.stderr.strip())
        found = []
        for dirpath, dirnames, filenames in os.walk(tmp):
            names = filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            found += ["/" + os.path.relpath(os.path.join(dirpath, n), tmp) for n in names]
        return sorted(found)


@dataclass
class _Run:
    node: Node
    db: _Db
    force_overwrite: bool
    force_depends: bool
    errors: list[str] = field(default_factory=list)

    def fail_archive(self, deb: str, reason: str) -> None:
        print(f"dpkg: error processing archive {deb} (--install):\n {reason}", file=sys.stderr)
        self.errors.append(deb)

    def unpack(self, deb: str) -> _Archive | None:
        """Read, check (architecture, file conflicts) and extract one archive."""
        if not os.path.isfile(deb):
            self.fail_archive(deb, "cannot access archive: No such file or directory")
            return None
        info = _dpkg_deb("-f", deb)
        stanzas = parse_deb822(info.stdout) if info.returncode == 0 else []
        if not stanzas or "Package" not in stanzas[0]:
            self.fail_archive(
                deb,
                "dpkg-deb --control subprocess returned error exit status 2\n "
                + info.stderr.strip(),
            )
            return None
        archive = _Archive(deb, stanzas[0])
        conf = _dpkg_deb("-I", deb, "conffiles")  # the control member, when the deb has one
        if conf.returncode == 0 and conf.stdout.strip():
            archive.control["Conffiles"] = "".join(f"\n {c}" for c in conf.stdout.split())
        arch = archive.control.get("Architecture", "all")
        if arch not in ("all", self.node.deb_arch):
            self.fail_archive(
                deb, f"package architecture ({arch}) does not match system ({self.node.deb_arch})"
            )
            return None
        old = self.db.packages.get(archive.package)
        if old is None:
            print(f"Selecting previously unselected package {archive.package}.")
        print(f"Preparing to unpack {deb} ...")
        archive.files = _members(deb)
        replaces = {
            alt[0] for group in _relations(archive.control.get("Replaces", "")) for alt in group
        }
        for path in archive.files:
            owner = self.db.owner(path, exclude=archive.package)
            if owner is None:
                continue
            owner_version = self.db.packages[owner].get("Version", "")
            overwrite = (
                f"trying to overwrite '{path}', which is also in package {owner} {owner_version}"
            )
            if owner in replaces:
                print(f"Replacing files in old package {owner} ({owner_version}) ...")
            elif self.force_overwrite:
                print("dpkg: warning: overriding problem because --force enabled:", file=sys.stderr)
                print(f"dpkg: warning: {overwrite}", file=sys.stderr)
            else:
                self.fail_archive(deb, overwrite)
                return None
            self.db.set_files(owner, [p for p in self.db.files(owner) if p != path])
        over = f" over ({old.get('Version', '')})" if old is not None else ""
        print(f"Unpacking {archive.package} ({archive.version}){over} ...")
        proc = _dpkg_deb("-x", deb, str(self.node.root))
        if proc.returncode:
            self.fail_archive(deb, proc.stderr.strip())
            return None
        self.db.set_files(archive.package, archive.files)
        self.db.packages[archive.package] = self._stanza(archive, "install ok unpacked")
        return archive

    @staticmethod
    def _stanza(archive: _Archive, status: str) -> dict[str, str]:
        stanza = {"Package": archive.package, "Status": status}
        keys = ("Maintainer", "Architecture", "Version", *_RELATION_FIELDS, "Conffiles")
        for key in (*keys, "Description"):
            if key in archive.control:
                stanza[key] = archive.control[key]
        return stanza

    def unmet(self, archive: _Archive, failed: set[str]) -> list[str]:
        """dpkg's explanation lines for each unsatisfied Depends group."""
        lines: list[str] = []
        for field_name in ("Pre-Depends", "Depends"):
            for group in _relations(archive.control.get(field_name, "")):
                reasons = [self._why_not(name, op, want, failed) for name, op, want in group]
                if all(reasons):
                    text = " | ".join(f"{n} ({o} {w})" if o else n for n, o, w in group)
                    lines.append(f" {archive.package} depends on {text}; however:")
                    lines += [f"  {r}" for r in reasons]
        return lines

    def _why_not(self, name: str, op: str, want: str, failed: set[str]) -> str:
        """Why one alternative is unsatisfied ("" when it is satisfied)."""
        candidates = self.db.provides(name)
        if not candidates:
            return f"Package {name} is not installed."
        for stanza in candidates:
            if stanza["Package"] in failed:
                continue
            if (
                not op
                or stanza["Package"] != name
                or version_satisfies(stanza.get("Version", ""), op, want)
            ):
                return ""
        stanza = candidates[0]
        if stanza["Package"] in failed:
            return f"Package {name} is not configured yet."
        return f"Version of {name} on system is {stanza.get('Version', '')}."

    def configure(self, archives: list[_Archive]) -> None:
        """Configure unpacked archives; unmet dependencies leave them unpacked."""
        failed: set[str] = set()
        changed = True
        while changed:
            changed = False
            for archive in archives:
                if (
                    archive.package not in failed
                    and self.unmet(archive, failed)
                    and not self.force_depends
                ):
                    failed.add(archive.package)
                    changed = True
        for archive in archives:
            problems = self.unmet(archive, failed)
            if archive.package in failed:
                print(
                    f"dpkg: dependency problems prevent configuration of {archive.package}:",
                    file=sys.stderr,
                )
                print("\n".join(problems) + "\n", file=sys.stderr)
                print(
                    f"dpkg: error processing package {archive.package} (--install):",
                    file=sys.stderr,
                )
                print(" dependency problems - leaving unconfigured", file=sys.stderr)
                self.errors.append(archive.package)
                continue
            if problems:
                print(
                    f"dpkg: {archive.package}: dependency problems,"
                    " but configuring anyway as you requested:",
                    file=sys.stderr,
                )
                print("\n".join(problems) + "\n", file=sys.stderr)
            print(f"Setting up {archive.package} ({archive.version}) ...")
            self.db.packages[archive.package]["Status"] = "install ok installed"


def _install(node: Node, options: set[str], debs: list[str]) -> int:
    with _locks(node) as locked:
        if not locked:
            return 2
        db = _Db(node)
        run = _Run(node, db, "--force-overwrite" in options, "--force-depends" in options)
        known = sum(len(db.files(p)) for p in db.packages)
        print(f"(Reading database ... {known} files and directories currently installed.)")
        archives = [a for a in (run.unpack(deb) for deb in debs) if a is not None]
        run.configure(archives)
        db.save()
    if run.errors:
        print("Errors were encountered while processing:", file=sys.stderr)
        for name in run.errors:
            print(f" {name}", file=sys.stderr)
        return 1
    return 0


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
    with _one_lock(node, _LOCK_DB) as holder:
        if holder is not None:
            print(
                "Another process has locked the database for writing, and might currently be\n"
                "modifying it, some of the following problems might just be due to that.\n"
            )
    db = _Db(node)
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
    with _locks(node) as locked:
        if not locked:
            return 2
        db = _Db(node)
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
    groups = [*_relations(stanza.get("Pre-Depends", "")), *_relations(stanza.get("Depends", ""))]
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
    with _locks(node) as locked:
        if not locked:
            return 2
        db = _Db(node)
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
    return _install(node, options, debs)


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
            fmt = next(args, "")
        elif arg.startswith(("-f=", "--showformat=")):
            fmt = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            print(f"dpkg-query: error: unknown option {arg}", file=sys.stderr)
            return 2
        else:
            names.append(arg.split(":", 1)[0])
    if not mode:
        print("dpkg-query: error: need an action option", file=sys.stderr)
        return 2
    packages = _Db(node).packages
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
