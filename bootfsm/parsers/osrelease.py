"""Parse /etc/os-release (os-release(5)): shell-style KEY=value lines."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bootfsm.core.excerpt import excerpt
from bootfsm.parsers import ParseError

__all__ = ["OsRelease", "parse_os_release"]

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# One segment of a value: 'single-quoted', "double-quoted", a backslash-escaped
# character, or plain characters; a value is these, concatenated.
_SEGMENT = re.compile(r"""'([^']*)'|"((?:[^"\\]|\\.)*)"|\\(.)|([^'"\\]+)""", re.DOTALL)
# Inside double quotes the shell only treats these characters as escapable.
_DQ_ESCAPE = re.compile(r'\\(["\\$`])')
_UNTERMINATED = {
    "'": "unterminated single quote",
    '"': "unterminated double quote",
    "\\": "trailing backslash",
}


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
    pos = 0
    while pos < len(raw):
        m = _SEGMENT.match(raw, pos)
        if m is None:
            raise ParseError(f"os-release line {lineno}: {_UNTERMINATED[raw[pos]]}")
        text = m[m.lastindex or 0]
        out.append(_DQ_ESCAPE.sub(r"\1", text) if m.lastindex == 2 else text)
        pos = m.end()
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
            raise ParseError(
                f"os-release line {lineno}: not a KEY=value assignment: {excerpt(line)}"
            )
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
