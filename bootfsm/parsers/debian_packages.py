"""Parse a Debian `Packages` index (deb822), pick a package from it, compare dpkg versions."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cmp_to_key
from itertools import zip_longest

from bootfsm.core.excerpt import excerpt
from bootfsm.parsers import ParseError

__all__ = [
    "PackageEntry",
    "compare_debian_versions",
    "deb822_paragraphs",
    "iter_entries",
    "parse_packages",
    "safe_filename",
    "select_package",
    "select_packages",
]

_FIELD = re.compile(r"([^\s:#-][^\s:]*):(.*)")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SIZE = re.compile(r"[0-9]{1,20}")
# dpkg's parseversion(): epoch digits, upstream starts with a digit, revision after the last "-".
_EPOCH = re.compile(r"[0-9]{1,9}")
_UPSTREAM = re.compile(r"[0-9][A-Za-z0-9.+~:-]*")
_REVISION = re.compile(r"[A-Za-z0-9.+~]+")
_RUNS = re.compile(r"([^0-9]*)([0-9]*)")  # a non-digit run, then the digit run after it
_REQUIRED = ("package", "version", "filename", "size", "sha256")


@dataclass(frozen=True)
class PackageEntry:
    """One binary package stanza; `filename` is pool-relative and already checked safe."""

    package: str
    version: str
    architecture: str
    filename: str
    size: int
    sha256: str
    depends: str
    provides: str = ""


def safe_filename(filename: str) -> str:
    """Normalise a repository-relative Filename ("./pool/x.deb" -> "pool/x.deb") or refuse it."""
    if not filename:
        raise ParseError("Filename is empty")
    if _CONTROL.search(filename):
        raise ParseError(f"Filename {excerpt(filename)} contains a control character")
    if "\\" in filename:
        raise ParseError(f"Filename {excerpt(filename)} contains a backslash")
    if filename.startswith("/"):
        raise ParseError(f"Filename {excerpt(filename)} is absolute")
    parts = [p for p in filename.split("/") if p != "."]
    if ".." in parts:
        raise ParseError(f"Filename {excerpt(filename)} climbs out of the repository with '..'")
    if not parts or "" in parts:
        raise ParseError(f"Filename {excerpt(filename)} has an empty path component")
    return "/".join(parts)


def _split_version(version: str) -> tuple[int, str, str]:
    """Split a dpkg version into (epoch, upstream, revision) or raise ParseError."""
    epoch_text, colon, rest = version.partition(":")
    if not colon:
        epoch_text, rest = "0", version
    if not _EPOCH.fullmatch(epoch_text):
        raise ParseError(f"Debian version {excerpt(version)}: epoch is not a small number")
    upstream, dash, revision = rest.rpartition("-")
    if not dash:
        upstream, revision = rest, ""
    elif not _REVISION.fullmatch(revision):
        raise ParseError(f"Debian version {excerpt(version)}: bad revision {excerpt(revision)}")
    if not _UPSTREAM.fullmatch(upstream):
        raise ParseError(f"Debian version {excerpt(version)}: upstream must start with a digit")
    return int(epoch_text), upstream, revision


def _order(c: str) -> int:
    """dpkg's per-character weight: "~" first, then end of string, letters, other symbols."""
    if c == "~":
        return -1
    if c.isalpha():
        return ord(c)
    return ord(c) + 256


def _digits_cmp(a: str, b: str) -> int:
    a, b = a.lstrip("0"), b.lstrip("0")
    if len(a) != len(b):
        return len(a) - len(b)
    return (a > b) - (a < b)


def _text_cmp(a: str, b: str) -> int:
    """Compare two non-digit runs by per-character weight (the end weighs 0)."""
    pairs = zip_longest(map(_order, a), map(_order, b), fillvalue=0)
    return next((x - y for x, y in pairs if x != y), 0)


def _verrevcmp(a: str, b: str) -> int:
    """dpkg's verrevcmp(): alternate non-digit runs (by weight) and digit runs (by value)."""
    runs = zip_longest(_RUNS.findall(a), _RUNS.findall(b), fillvalue=("", ""))
    for (a_text, a_digits), (b_text, b_digits) in runs:
        diff = _text_cmp(a_text, b_text) or _digits_cmp(a_digits, b_digits)
        if diff:
            return diff
    return 0


def compare_debian_versions(a: str, b: str) -> int:
    """Compare two Debian versions like `dpkg --compare-versions`: -1, 0 or 1."""
    ea, ua, ra = _split_version(a)
    eb, ub, rb = _split_version(b)
    result = (ea - eb) or _verrevcmp(ua, ub) or _verrevcmp(ra, rb)
    return (result > 0) - (result < 0)


_PACKAGES_ERRORS = {
    "continuation": "Packages line {n}: continuation line before any field",
    "field": "Packages line {n} (stanza {number}): not a field: {short}",
    "twice": "Packages stanza {number}: field {name} appears twice",
}


def deb822_paragraphs(
    text: str, errors: Mapping[str, str], line1: int = 1, number: int = 1, single: bool = False
) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (paragraph number, lower-cased field -> joined value) per deb822 paragraph.
    ``errors`` words each ParseError; a ``single`` reader refuses a second paragraph."""
    fields: dict[str, str] = {}
    last = ""
    for n, line in enumerate(text.split("\n"), start=line1):
        line = line.removesuffix("\r")
        if not line.strip():
            if fields and not single:
                yield number, fields
                number, fields = number + 1, {}
            last = ""
        elif line.startswith("#"):
            continue
        elif line[0] in " \t":
            if not last:
                raise ParseError(errors["continuation"].format(n=n))
            fields[last] += "\n" + line.strip()
        else:
            last = _add_field(fields, last, line, n, number, errors)
    if fields:
        yield number, fields


def _add_field(
    fields: dict[str, str], last: str, line: str, n: int, number: int, errors: Mapping[str, str]
) -> str:
    """Add the ``Field: value`` line ``n`` to ``fields``; return the field's name."""
    match = _FIELD.fullmatch(line)
    if match is None:
        raise ParseError(errors["field"].format(n=n, number=number, short=excerpt(line)))
    if fields and not last:  # only a single-paragraph reader keeps fields across a blank line
        raise ParseError(errors["second"].format(n=n))
    name = match[1].lower()
    if name in fields:
        raise ParseError(errors["twice"].format(n=n, number=number, name=excerpt(match[1])))
    fields[name] = match[2].strip()
    return name


def _entry(number: int, fields: dict[str, str]) -> PackageEntry:
    missing = [name for name in _REQUIRED if not fields.get(name)]
    if missing:
        raise ParseError(f"Packages stanza {number}: missing {', '.join(missing)}")
    where = f"Packages stanza {number} ({excerpt(fields['package'], quote=False)})"
    if not _SHA256.fullmatch(fields["sha256"]):
        raise ParseError(f"{where}: SHA256 is not 64 hex digits: {excerpt(fields['sha256'])}")
    if not _SIZE.fullmatch(fields["size"]):
        raise ParseError(f"{where}: Size is not a number: {excerpt(fields['size'])}")
    try:
        _split_version(fields["version"])
        filename = safe_filename(fields["filename"])
    except ParseError as exc:
        raise ParseError(f"{where}: {exc}") from None
    return PackageEntry(
        package=fields["package"],
        version=fields["version"],
        architecture=fields.get("architecture", ""),
        filename=filename,
        size=int(fields["size"]),
        sha256=fields["sha256"].lower(),
        depends=" ".join(fields.get("depends", "").split()),
        provides=" ".join(fields.get("provides", "").split()),
    )


# a paragraph ends at a line that is empty or only blanks (deb822)
_SEPARATOR = re.compile(r"\n(?:[ \t\r]*\n)+")
_PACKAGE_LINE = re.compile(r"^package:[ \t]*([^\s]+)", re.IGNORECASE | re.MULTILINE)


def iter_entries(text: str, names: Collection[str] | None = None) -> Iterator[PackageEntry]:
    """Yield the entries of a `Packages` index; with ``names``, only those stanzas are parsed.
    A paragraph without a ``Package`` line is always parsed: a non-index still fails."""
    line, number, pos, end = 1, 1, 0, len(text)
    while pos < end:
        sep = _SEPARATOR.search(text, pos)
        stop = sep.start() if sep else end
        found = _PACKAGE_LINE.search(text, pos, stop)
        if found is not None and names is not None and found[1] not in names:
            number += 1  # a stanza of another package: counted, not read
        else:
            for n, fields in deb822_paragraphs(text[pos:stop], _PACKAGES_ERRORS, line, number):
                number = n + 1
                yield _entry(n, fields)
        if sep is None:
            break
        line += text.count("\n", pos, sep.end())
        pos = sep.end()


def parse_packages(text: str) -> list[PackageEntry]:
    """Parse a `Packages` index; a stanza lacking Package/Version/Filename/Size/SHA256 fails."""
    return list(iter_entries(text))


def select_packages(
    text: str, wants: Mapping[str, tuple[Sequence[str], str, str | None]]
) -> dict[str, PackageEntry | None]:
    """One pass over an index: ``key -> (names, version, arch)`` gives ``key -> select_package``."""
    names = {n for ns, _, _ in wants.values() for n in ([ns] if isinstance(ns, str) else ns)}
    entries = list(iter_entries(text, names))
    return {k: select_package(entries, ns, ver, arch) for k, (ns, ver, arch) in wants.items()}


def _version_matches(entry_version: str, wanted: str) -> bool:
    """True when `entry_version` is `wanted` plus at most a Debian revision (epoch ignored)."""
    candidates = {entry_version, entry_version.partition(":")[2] or entry_version}
    return any(v == wanted or v.startswith(wanted + "-") for v in candidates)


def select_package(
    entries: Iterable[PackageEntry],
    names: Sequence[str],
    version: str,
    arch: str | None = None,
) -> PackageEntry | None:
    """The highest-versioned entry in `names` at `version[-revision]` (`arch` or "all"), or None."""
    wanted = {names} if isinstance(names, str) else set(names)  # a bare str is not a list
    matches = [
        e
        for e in entries
        if e.package in wanted
        and _version_matches(e.version, version)
        and (arch is None or e.architecture in (arch, "all"))
    ]
    if not matches:
        return None
    by_version = cmp_to_key(compare_debian_versions)
    return max(matches, key=lambda e: by_version(e.version))
