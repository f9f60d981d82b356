"""Debian relationship fields (``Depends``, ``Provides``): parse and check (pure).

Grammar of deb-control(5) / Debian Policy 7.1: comma-separated groups, ``|`` between
alternatives, each ``name[:arch] [(op version)] [<profiles>]``; ``[arch]`` lists, which
binary indexes do not carry, are refused rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bootfsm.parsers import ParseError
from bootfsm.parsers.debian_packages import compare_debian_versions

__all__ = ["Relation", "parse_relations", "version_satisfies"]

_OPS = ("<<", "<=", "=", ">=", ">>")
_REL = re.compile(
    r"(?P<name>[a-z0-9][a-z0-9+.-]*)(?::[a-z0-9-]+)?"
    r"(?:\s*\(\s*(?P<op><<|<=|=|>=|>>)\s*(?P<version>[^\s)]+)\s*\))?"
    r"(?:\s*<[^>]*>)*"
)


@dataclass(frozen=True)
class Relation:
    """One alternative of a relationship: a package name and an optional constraint."""

    name: str
    op: str = ""  # "" (any version) or one of << <= = >= >>
    version: str = ""

    def __str__(self) -> str:
        return f"{self.name} ({self.op} {self.version})" if self.op else self.name


def parse_relations(text: str) -> tuple[tuple[Relation, ...], ...]:
    """``a (>= 1) | b, c`` -> ((a>=1, b), (c,)): every group must be met, one of each."""
    groups: list[tuple[Relation, ...]] = []
    for group in text.split(","):
        if not group.strip():
            continue
        alts = []
        for alt in group.split("|"):
            m = _REL.fullmatch(alt.strip())
            if m is None:
                raise ParseError(f"not a package relation: {alt.strip()[:80]!r}")
            alts.append(Relation(m["name"], m["op"] or "", m["version"] or ""))
        groups.append(tuple(alts))
    return tuple(groups)


def version_satisfies(version: str, op: str, wanted: str) -> bool:
    """``version op wanted`` as dpkg compares (``op`` "" is always true)."""
    if not op:
        return True
    c = compare_debian_versions(version, wanted)
    return {"<<": c < 0, "<=": c <= 0, "=": c == 0, ">=": c >= 0, ">>": c > 0}[op]
