"""The simulated dpkg's package database: deb822, version order, the status file, locks.

The database is the real on-disk format: deb822 stanzas in var/lib/dpkg/status, the
journal in var/lib/dpkg/updates/<4 digits> (one stanza per file, replayed over the
status on every open and folded into it when dpkg writes: dpkg 1.21's
lib/dpkg/dbmodify.c) and file lists in var/lib/dpkg/info/<pkg>.list. Like dpkg, a
writing action takes the POSIX locks lock-frontend, then lock (wording checked against
the real dpkg 1.21.23 run with ``--root`` on a test directory). Version comparison is
deb-version(7)'s algorithm. Used by :mod:`standin_dpkg` and :mod:`standin_dpkg_install`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import struct
import sys
from collections.abc import Iterator

from bootfsm.sim.nodestate import Node

__all__ = ["LOCK_DB", "RELATION_FIELDS", "Db", "compare_versions", "locks", "one_lock",
           "parse_deb822", "relations", "version_satisfies"]  # fmt: skip

_STATUS = "var/lib/dpkg/status"
_LOCK_FRONTEND = "var/lib/dpkg/lock-frontend"
LOCK_DB = "var/lib/dpkg/lock"
_UPDATES = "var/lib/dpkg/updates"
RELATION_FIELDS = ("Replaces", "Provides", "Depends", "Pre-Depends", "Conflicts", "Breaks")


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


def relations(value: str) -> list[list[tuple[str, str, str]]]:
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


class Db:
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
            provided = {alt[0] for group in relations(stanza.get("Provides", "")) for alt in group}
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
def one_lock(node: Node, rel: str) -> Iterator[int | None]:
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
def locks(node: Node) -> Iterator[bool]:
    """Both of dpkg's locks, frontend first; yields False (after dpkg's error) when held."""
    with one_lock(node, _LOCK_FRONTEND) as front:
        if front is not None:
            _lock_error("dpkg frontend lock", front)
            yield False
            return
        with one_lock(node, LOCK_DB) as db:
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
