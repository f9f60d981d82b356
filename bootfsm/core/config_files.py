"""Configuration files: ``config.toml`` and its drop-ins, read, merged key by key and
validated, with the file that set each key; the spec is ``bootfsm.core.config``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootfsm.core.compat import tomllib
from bootfsm.core.config import Config, ConfigError, parse_config
from bootfsm.core.redact import redact_text

__all__ = ["DROPIN_DIR", "Loaded", "load_config", "load_config_sources"]

DROPIN_DIR = "config.d"
"""Drop-ins beside the config file: ``<dir>/config.d/*.toml``, read after it in name
order, each key overriding the same key before it (`bootfsm run --hook` writes
``50-provisioning-hook.toml`` there)."""


@dataclass(frozen=True)
class Loaded:
    """A validated config and, for every key a file set, the file that set it last."""

    config: Config
    sources: Mapping[str, str]
    """``"section.key"`` -> path of the file whose value is in effect."""


def _read_toml(path: Path) -> dict[str, Any] | None:
    """One TOML file as data, validated on its own; None when it does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {redact_text(str(exc))}") from exc
    except RecursionError:  # tomllib recurses per nesting level: 100,000 '[' is a crash
        raise ConfigError(f"{path}: invalid TOML: nested too deeply") from None
    try:
        parse_config(data)  # every file is valid on its own: errors name their file
    except ConfigError as exc:
        raise ConfigError(f"{path}: {redact_text(str(exc))}") from exc
    return data


def load_config_sources(path: Path, *, required: bool) -> Loaded:
    """``path`` and its drop-ins, validated; a missing optional file gives the defaults."""
    layers = _layers(path, required=required)
    merged: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    for where, layer in layers:
        for section, table in layer.items():
            merged.setdefault(section, {}).update(table)
            sources.update({f"{section}.{key}": str(where) for key in table})
    try:
        return Loaded(parse_config(merged), sources)
    except ConfigError as exc:
        files = ", ".join(str(w) for w, _ in layers)
        raise ConfigError(f"{files}: {redact_text(str(exc))}") from exc


def _layers(path: Path, *, required: bool) -> list[tuple[Path, dict[str, Any]]]:
    """``path``'s table, then each drop-in's in name order (the later wins a key)."""
    data = _read_toml(path)
    if data is None and required:
        raise ConfigError(f"{path}: no such file")
    try:
        paths = sorted(p for p in (path.parent / DROPIN_DIR).iterdir() if p.name.endswith(".toml"))
    except OSError:  # no drop-in directory (or not one)
        paths = []
    tables = [(p, _read_toml(p)) for p in paths]
    return [(path, data or {}), *((p, t) for p, t in tables if t is not None)]


def load_config(path: Path, *, required: bool) -> Config:
    """The validated config of ``path`` and its drop-ins (``load_config_sources``)."""
    return load_config_sources(path, required=required).config
