"""The simulated `dpkg -i`: unpack archives, then configure them in the package database.

Archives are read and unpacked with the real ``dpkg-deb`` (found on PATH); only the
bookkeeping is simulated: architecture and file-conflict checks on unpack, Depends on
configure (unmet dependencies leave a package unpacked), and dpkg's error wording
(checked against the real dpkg 1.21.23 run with ``--root`` on a test directory). The
database is :mod:`standin_dpkg_db`; the command line is parsed in :mod:`standin_dpkg`.
"""

from __future__ import annotations

import os
import shutil
import subprocess  # noqa: TID251 - bootfsm/sim runs the real dpkg-deb
import sys
import tempfile
from dataclasses import dataclass, field

from bootfsm.sim.nodestate import Node
from bootfsm.sim.standin_dpkg_db import (
    RELATION_FIELDS,
    Db,
    locks,
    parse_deb822,
    relations,
    version_satisfies,
)

__all__ = ["install_debs"]

_TOOL_TIMEOUT_S = 120.0


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
    db: Db
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
            alt[0] for group in relations(archive.control.get("Replaces", "")) for alt in group
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
        keys = ("Maintainer", "Architecture", "Version", *RELATION_FIELDS, "Conffiles")
        for key in (*keys, "Description"):
            if key in archive.control:
                stanza[key] = archive.control[key]
        return stanza

    def unmet(self, archive: _Archive, failed: set[str]) -> list[str]:
        """dpkg's explanation lines for each unsatisfied Depends group."""
        lines: list[str] = []
        for field_name in ("Pre-Depends", "Depends"):
            for group in relations(archive.control.get(field_name, "")):
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


def install_debs(node: Node, options: set[str], debs: list[str]) -> int:
    with locks(node) as locked:
        if not locked:
            return 2
        db = Db(node)
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
