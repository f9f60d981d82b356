"""Parse /etc/os-release (os-release(5)): shell-style KEY=value lines."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bootfsm.parsers import ParseError

__all__ = ["OsRelease", "parse_os_release"]

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Inside double quotes the shell only treats these characters as escapable.
_DQ_ESCAPABLE = frozenset('"\\$`')


@dataclass(frozen=True)
class OsRelease:
    """The os-release fields the provisioner cares about."""

    id: str
    version_id: str
    id_like: tuple[str, ...]
    pretty_name: str
    version_codename: str


def _unquote(raw: str, lineno: int) -> str:
    """Decode one shell-style value: quoted and unquoted segments are concatenated."""
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        ch = raw[i]
        if ch == "'":
            end = raw.find("'", i + 1)
            if end < 0:
                raise ParseError(f"os-release line {lineno}: unterminated single quote")
            out.append(raw[i + 1 : end])
            i = end + 1
        elif ch == '"':
            i += 1
            while True:
                if i >= n:
                    raise ParseError(f"os-release line {lineno}: unterminated double quote")
                ch = raw[i]
                if ch == '"':
                    i += 1
                    break
                if ch == "\\" and i + 1 < n and raw[i + 1] in _DQ_ESCAPABLE:
                    out.append(raw[i + 1])
                    i += 2
                else:
                    out.append(ch)
                    i += 1
        elif ch == "\\":
            if i + 1 >= n:
                raise ParseError(f"os-release line {lineno}: trailing backslash")
            out.append(raw[i + 1])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _fields(text: str) -> dict[str, str]:
    """Map every assignment in the file to its decoded value (later lines win)."""
    fields: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, raw = stripped.partition("=")
        if not sep or not _KEY.fullmatch(key):
            raise ParseError(f"os-release line {lineno}: not a KEY=value assignment: {line!r}")
        fields[key] = _unquote(raw, lineno)
    return fields


def parse_os_release(text: str) -> OsRelease:
    """Parse os-release text; ID is required, every other field defaults to ""."""
    fields = _fields(text)
    os_id = fields.get("ID", "")
    if not os_id:
        raise ParseError("os-release: ID is missing or empty")
    return OsRelease(
        id=os_id,
        version_id=fields.get("VERSION_ID", ""),
        id_like=tuple(fields.get("ID_LIKE", "").split()),
        pretty_name=fields.get("PRETTY_NAME", ""),
        version_codename=fields.get("VERSION_CODENAME", ""),
    )
