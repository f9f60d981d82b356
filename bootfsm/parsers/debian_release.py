"""Parse an apt repository's ``InRelease`` / ``Release`` file and gpgv's status output.

Pure functions (text in, typed value out, ``ParseError`` on garbage):

* ``clearsigned_body``: the signed text of an OpenPGP clear-signed message (RFC 4880
  section 7) the way apt splits ``InRelease``: exactly one signed message, nothing but
  blank lines before or after it, dash-escaping undone. Text outside the signed part
  is refused, never ignored (a mirror could otherwise append unsigned fields).
* ``parse_release``: a Release file (one deb822 paragraph): ``Date``, ``Valid-Until``
  (RFC 2822 dates, as apt's ``RFC1123StrToTime`` reads them) and the ``SHA256`` list
  (`` <sha256> <size> <path>`` lines).
* ``parse_gpgv_status``: the ``[GNUPG:]`` lines ``gpgv --status-fd`` writes (gnupg's
  doc/DETAILS, "Format of the status codes"): which keys made a good signature, and
  every reason not to trust one.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from bootfsm.parsers import ParseError

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
_FIELD = re.compile(r"([^\s:#-][^\s:]*):(.*)")
_HASH_LINE = re.compile(r"([0-9a-fA-F]{64})\s+([0-9]{1,20})\s+(\S+)")
_ARMOR_HEADER = re.compile(r"[A-Za-z]+: .*")


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
    """The signed text of a clear-signed message; ParseError when it is not exactly one."""
    lines = text.replace("\r\n", "\n").split("\n")
    i = 0
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i == len(lines) or lines[i].rstrip() != _BEGIN:
        raise ParseError(f"not a clear-signed message (no {_BEGIN!r} line)")
    i += 1
    # armor headers ("Hash: SHA512"), then one empty line
    while i < len(lines) and lines[i].strip():
        if not _ARMOR_HEADER.fullmatch(lines[i].rstrip()):
            raise ParseError(f"line {i + 1}: bad armor header {lines[i][:60]!r}")
        i += 1
    if i == len(lines):
        raise ParseError("clear-signed message ends in its armor headers")
    i += 1
    body: list[str] = []
    while i < len(lines) and lines[i].rstrip() != _SIG_BEGIN:
        line = lines[i]
        if line.startswith("- "):
            line = line[2:]
        elif line.startswith("-"):
            raise ParseError(f"line {i + 1}: unescaped dash line {line[:60]!r} in signed text")
        body.append(line)
        i += 1
    if i == len(lines):
        raise ParseError(f"clear-signed message has no {_SIG_BEGIN!r} line")
    while i < len(lines) and lines[i].rstrip() != _SIG_END:
        i += 1
    if i == len(lines):
        raise ParseError(f"clear-signed message has no {_SIG_END!r} line")
    rest = [ln for ln in lines[i + 1 :] if ln.strip()]
    if rest:
        raise ParseError(f"text after the signature: {rest[0][:60]!r}")
    # the line break before the signature belongs to the signature (RFC 4880 7.1)
    return "\n".join(body) + "\n"


def _date(name: str, value: str) -> dt.datetime:
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError) as exc:
        raise ParseError(f"{name}: not an RFC 2822 date: {value!r}") from exc
    if parsed.tzinfo is None:
        raise ParseError(f"{name}: date without a time zone: {value!r}")
    return parsed.astimezone(dt.timezone.utc)


def parse_release(text: str) -> Release:
    """Parse a Release file (the signed text of InRelease, or Release itself)."""
    if "\x00" in text:
        raise ParseError("Release contains a NUL byte")
    fields: dict[str, str] = {}
    current: str | None = None
    for n, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        line = raw.rstrip()
        if not line:
            if fields:
                current = None
            continue
        if raw[:1] in (" ", "\t"):
            if current is None:
                raise ParseError(f"line {n}: continuation line without a field")
            fields[current] += "\n" + line.strip()
            continue
        if line.startswith("#"):
            continue
        m = _FIELD.fullmatch(line)
        if m is None:
            raise ParseError(f"line {n}: not a 'Field: value' line: {line[:60]!r}")
        if current is None and fields:
            raise ParseError(f"line {n}: a second paragraph (Release has one)")
        name = m[1].lower()
        if name in fields:
            raise ParseError(f"line {n}: field {m[1]} appears twice")
        fields[name] = m[2].strip()
        current = name
    if not fields:
        raise ParseError("Release is empty")
    sums: dict[str, ReleaseFile] = {}
    for n, entry in enumerate(fields.get("sha256", "").split("\n"), start=1):
        if not entry.strip():
            continue
        m = _HASH_LINE.fullmatch(entry.strip())
        if m is None:
            raise ParseError(f"SHA256 entry {n}: expected '<sha256> <size> <path>': {entry[:80]!r}")
        path = m[3]
        if path in sums:
            raise ParseError(f"SHA256 lists {path} twice")
        sums[path] = ReleaseFile(m[1].lower(), int(m[2]))
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
        """A good, valid, strong signature and nothing bad: what apt accepts. A missing key
        beside a good signature is fine (a repository signed by an old and a new key)."""
        return bool(self.valid and self.good) and not self.problems and not self.weak


# gnupg's doc/DETAILS: hash algorithm ids of VALIDSIG's 8th field (RFC 4880 9.4)
_WEAK_HASHES = {"1": "MD5", "2": "SHA1"}
_BAD = {
    "BADSIG": "bad signature (the signed text was changed) by key {0}",
    "EXPSIG": "the signature by key {0} has expired",
    "EXPKEYSIG": "key {0} that made the signature has expired",
    "REVKEYSIG": "key {0} that made the signature is revoked",
}


def parse_gpgv_status(output: str) -> GpgvStatus:
    """The ``[GNUPG:]`` lines of ``output`` (other lines, gpgv's own messages, ignored)."""
    valid: list[str] = []
    good: list[str] = []
    problems: list[str] = []
    missing: list[str] = []
    weak: list[str] = []
    for line in output.splitlines():
        if not line.startswith("[GNUPG:] "):
            continue
        words = line[9:].split()
        if not words:
            continue
        kw, args = words[0], words[1:]
        if kw == "VALIDSIG":
            if len(args) < 9:
                raise ParseError(f"VALIDSIG with {len(args)} fields (DETAILS lists 9-10)")
            valid.append(args[0])
            if args[7] in _WEAK_HASHES:
                weak.append(f"{args[0]} ({_WEAK_HASHES[args[7]]})")
        elif kw == "GOODSIG":
            if not args:
                raise ParseError("GOODSIG without a key id")
            good.append(args[0])
        elif kw in _BAD:
            problems.append(_BAD[kw].format(args[0] if args else "?"))
        elif kw == "NO_PUBKEY":
            missing.append(args[0] if args else "?")
        elif kw == "ERRSIG":
            # rc 9: no public key (also reported as NO_PUBKEY); anything else is an error
            if len(args) >= 6 and args[5] == "9":
                continue
            rc = args[5] if len(args) >= 6 else "?"
            who = args[0] if args else "?"
            problems.append(f"signature by key {who} cannot be checked (rc {rc})")
    return GpgvStatus(tuple(valid), tuple(good), tuple(problems), tuple(missing), tuple(weak))
