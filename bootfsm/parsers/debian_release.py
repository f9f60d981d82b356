"""Parse an apt ``InRelease`` / ``Release`` file and ``gpgv --status-fd`` output.

Text outside the one clear-signed message (RFC 4880 section 7) is refused, never ignored:
a mirror could otherwise append unsigned fields. Status lines follow gnupg's doc/DETAILS.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields

from bootfsm.core.excerpt import excerpt
from bootfsm.parsers import ParseError
from bootfsm.parsers.debian_packages import deb822_paragraphs

__all__ = [
    "GpgvStatus",
    "Release",
    "ReleaseFile",
    "clearsigned_body",
    "parse_gpgv_status",
    "parse_release",
]

_BEGIN = "-----BEGIN PGP SIGNED MESSAGE-----"
_SIG_BEGIN = "-----BEGIN PGP SIGNATURE-----"
_SIG_END = "-----END PGP SIGNATURE-----"
_HASH_LINE = re.compile(r"([0-9a-fA-F]{64})\s+([0-9]{1,20})\s+(\S+)")
_ARMOR_HEADER = re.compile(r"[A-Za-z]+: .*")
_RELEASE_ERRORS = {
    "continuation": "line {n}: continuation line without a field",
    "field": "line {n}: not a 'Field: value' line: {short}",
    "twice": "line {n}: field {name} appears twice",
    "second": "line {n}: a second paragraph (Release has one)",
}


@dataclass(frozen=True)
class ReleaseFile:
    """One entry of Release's SHA256 list."""

    sha256: str
    size: int


@dataclass(frozen=True)
class Release:
    """What bootfsm uses from a Release file."""

    date: dt.datetime | None
    valid_until: dt.datetime | None
    sha256: Mapping[str, ReleaseFile]
    fields: Mapping[str, str] = field(default_factory=dict)  # lower-cased name -> raw value


def clearsigned_body(text: str) -> str:
    """The signed text, dash-escaping undone; ParseError unless exactly one signed message."""
    lines = text.replace("\r\n", "\n").split("\n")
    marks = [ln.rstrip() for ln in lines]  # what the armor lines are compared as
    start = _armor_headers_end(marks) + 1
    sig = _index(marks, _SIG_BEGIN, start)
    body = [_undash(lines[i], i + 1) for i in range(start, sig)]
    if sig == len(marks):
        raise ParseError(f"clear-signed message has no {_SIG_BEGIN!r} line")
    end = _index(marks, _SIG_END, sig)
    if end == len(marks):
        raise ParseError(f"clear-signed message has no {_SIG_END!r} line")
    rest = [ln for ln in marks[end + 1 :] if ln]
    if rest:
        raise ParseError(f"text after the signature: {excerpt(rest[0])}")
    # the line break before the signature belongs to the signature (RFC 4880 7.1)
    return "\n".join(body) + "\n"


def _armor_headers_end(marks: list[str]) -> int:
    """The empty line after the BEGIN line (only blank lines before it) and its armor headers."""
    begin = next((i for i, m in enumerate(marks) if m), len(marks))
    if marks[begin : begin + 1] != [_BEGIN]:
        raise ParseError(f"not a clear-signed message (no {_BEGIN!r} line)")
    blank = _index(marks, "", begin + 1)
    for i in range(begin + 1, blank):
        if not _ARMOR_HEADER.fullmatch(marks[i]):
            raise ParseError(f"line {i + 1}: bad armor header {excerpt(marks[i])}")
    if blank == len(marks):
        raise ParseError("clear-signed message ends in its armor headers")
    return blank


def _index(lines: list[str], wanted: str, start: int) -> int:
    """First index of ``wanted`` at or after ``start``; len(lines) when nowhere."""
    return next((i for i in range(start, len(lines)) if lines[i] == wanted), len(lines))


def _undash(line: str, n: int) -> str:
    """Line ``n`` of the signed text with its dash-escaping ("- ") undone."""
    if line.startswith("- "):
        return line[2:]
    if line.startswith("-"):
        raise ParseError(f"line {n}: unescaped dash line {excerpt(line)} in signed text")
    return line


def _date(name: str, value: str) -> dt.datetime:
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError) as exc:
        raise ParseError(f"{name}: not an RFC 2822 date: {excerpt(value)}") from exc
    if parsed.tzinfo is None:
        raise ParseError(f"{name}: date without a time zone: {excerpt(value)}")
    return parsed.astimezone(dt.timezone.utc)


def parse_release(text: str) -> Release:
    """Parse a Release file (one deb822 paragraph); dates are RFC 2822, returned in UTC."""
    if "\x00" in text:
        raise ParseError("Release contains a NUL byte")
    _, fields = next(deb822_paragraphs(text, _RELEASE_ERRORS, single=True), (1, {}))
    if not fields:
        raise ParseError("Release is empty")
    sums: dict[str, ReleaseFile] = {}
    for n, entry in enumerate(fields.get("sha256", "").split("\n"), start=1):
        if not entry.strip():
            continue
        m = _HASH_LINE.fullmatch(entry.strip())
        if m is None:
            raise ParseError(
                f"SHA256 entry {n}: expected '<sha256> <size> <path>': {excerpt(entry)}"
            )
        if m[3] in sums:
            raise ParseError(f"SHA256 lists {excerpt(m[3], quote=False)} twice")
        sums[m[3]] = ReleaseFile(m[1].lower(), int(m[2]))
    date = _date("Date", fields["date"]) if "date" in fields else None
    until = _date("Valid-Until", fields["valid-until"]) if "valid-until" in fields else None
    return Release(date, until, sums, fields)


@dataclass(frozen=True)
class GpgvStatus:
    """The status lines of one gpgv run, reduced to what a trust decision needs."""

    valid: tuple[str, ...]  # VALIDSIG fingerprints (a good signature by a key in the keyring)
    good: tuple[str, ...]  # GOODSIG key ids
    problems: tuple[str, ...]  # a reason per BADSIG/EXPSIG/EXPKEYSIG/REVKEYSIG/ERRSIG/...
    missing_keys: tuple[str, ...]  # NO_PUBKEY key ids
    weak: tuple[str, ...]  # fingerprints of valid signatures over MD5/SHA1 (apt refuses them)

    @property
    def trusted(self) -> bool:
        """A good, valid, strong signature and no problem: what apt accepts."""
        # a NO_PUBKEY beside a good signature is fine: a repository signed by an old and a new key
        return bool(self.valid and self.good) and not self.problems and not self.weak


# gnupg's doc/DETAILS: hash algorithm ids of VALIDSIG's 8th field (RFC 4880 9.4)
_WEAK_HASHES = {"1": "MD5", "2": "SHA1"}
_BAD = {  # formatted with the key id and ERRSIG's rc
    "BADSIG": "bad signature (the signed text was changed) by key {0}",
    "EXPSIG": "the signature by key {0} has expired",
    "EXPKEYSIG": "key {0} that made the signature has expired",
    "REVKEYSIG": "key {0} that made the signature is revoked",
    "ERRSIG": "signature by key {0} cannot be checked (rc {1})",
}
_KEY_IDS = {"GOODSIG": "good", "NO_PUBKEY": "missing_keys"}  # GpgvStatus field of the key id
_FIELDS_NEEDED = {  # the fewest fields a status line must have, and the error without them
    "VALIDSIG": (9, "VALIDSIG with {} fields (DETAILS lists 9-10)"),
    "GOODSIG": (1, "GOODSIG without a key id"),
}


def parse_gpgv_status(output: str) -> GpgvStatus:
    """The ``[GNUPG:]`` lines of ``output`` (other lines, gpgv's own messages, ignored)."""
    found: dict[str, list[str]] = {f.name: [] for f in fields(GpgvStatus)}
    for line in output.splitlines():
        if line.startswith("[GNUPG:] "):
            kw, *args = line[9:].split() or [""]
            for name, entry in _findings(kw, args):
                found[name].append(entry)
    return GpgvStatus(**{name: tuple(entries) for name, entries in found.items()})


def _findings(kw: str, args: list[str]) -> Iterator[tuple[str, str]]:
    """What one status line adds to a GpgvStatus: (field name, entry) pairs."""
    need, why = _FIELDS_NEEDED.get(kw, (0, ""))
    if len(args) < need:
        raise ParseError(why.format(len(args)))
    who = args[0] if args else "?"
    rc = args[5] if len(args) >= 6 else "?"
    if kw == "VALIDSIG":
        yield "valid", who
        if args[7] in _WEAK_HASHES:
            yield "weak", f"{who} ({_WEAK_HASHES[args[7]]})"
    elif kw in _KEY_IDS:
        yield _KEY_IDS[kw], who
    elif kw in _BAD and not (kw == "ERRSIG" and rc == "9"):
        # ERRSIG rc 9: no public key (also reported as NO_PUBKEY); anything else is an error
        yield "problems", _BAD[kw].format(who, rc)
