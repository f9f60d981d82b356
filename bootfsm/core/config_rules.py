"""The checks a configuration value passes beyond its type: one function per rule, each
raising ``ConfigError`` that names the key (``where``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from bootfsm.core.migspec import parse_mig_layout

__all__ = [
    "ConfigError",
    "Rule",
    "absolute",
    "absolute_or_empty",
    "base_urls",
    "is_version",
    "mig_profile",
    "mig_tag",
    "node_path",
    "one_of",
    "pins",
    "sha256",
    "version",
]


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key."""


Rule = Callable[[str, Any], None]  # a check of one key's value, already of its type


def node_path(where: str, value: str) -> None:
    """A node path: no NUL or control character, no ``..`` or ``.`` component."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"{where}: a path must not contain NUL or control characters")
    if any(part in ("..", ".") for part in value.split("/")):
        raise ConfigError(f"{where}: a path must not contain '..' or '.' components: {value!r}")


def absolute(where: str, value: str) -> None:
    if not value.startswith("/"):
        raise ConfigError(f"{where}: must be an absolute node path")


def absolute_or_empty(where: str, value: str) -> None:  # empty: off, or the system store
    if value and not value.startswith("/"):
        raise ConfigError(f"{where}: must be an absolute node path or empty")


def one_of(choices: tuple[str, ...]) -> Rule:
    def rule(where: str, value: str) -> None:
        if value not in choices:
            raise ConfigError(f"{where}: must be one of {', '.join(choices)}; got {value!r}")

    return rule


def sha256(where: str, value: str) -> None:
    if value and not (len(value) == 64 and all(c in "0123456789abcdef" for c in value.lower())):
        raise ConfigError(f"{where}: expected 64 hex digits, got {len(value)} characters")


def is_version(v: str) -> bool:
    return bool(v) and all(p.isdigit() for p in v.split("."))


def version(where: str, value: str) -> None:
    if not is_version(value):
        raise ConfigError(f"{where}: expected a dotted version like 580.159.04, got {value!r}")


def mig_profile(where: str, value: str) -> None:
    try:
        parse_mig_layout(value) if value else None
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def mig_tag(where: str, value: str) -> None:
    if value and not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", value):
        raise ConfigError(f"{where}: not a VM tag name: {value!r:.80}")


def base_urls(where: str, value: tuple[str, ...]) -> None:
    for i, url in enumerate(value, start=1):
        if not url.startswith(("https://", "http://")):
            shown = url.split("?", 1)[0]  # never echo a signature
            raise ConfigError(f"{where}: entry {i} is not an http(s) base URL: {shown!r}")


def pins(where: str, value: tuple[str, ...]) -> None:
    """``sources.runfile_pins``: each "KIND VERSION ARCH SHA256"."""
    for i, pin in enumerate(value, start=1):
        parts, entry = pin.split(), f"{where}: entry {i}"
        if len(parts) != 4:
            raise ConfigError(
                f'{entry}: expected "KIND VERSION ARCH SHA256", got {len(parts)} words'
            )
        kind, ver, arch, sha = parts
        if kind not in ("cuda", "grid"):
            raise ConfigError(f"{entry}: kind must be cuda or grid, got {kind!r:.40}")
        if not is_version(ver):
            raise ConfigError(f"{entry}: expected a dotted version, got {ver!r:.40}")
        if arch not in ("x86_64", "aarch64"):
            raise ConfigError(f"{entry}: arch must be x86_64 or aarch64, got {arch!r:.40}")
        sha256(entry, sha)
