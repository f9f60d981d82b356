"""Parse NVIDIA's `redistrib_<ver>.json` manifests of redist archives."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from bootfsm.core.excerpt import excerpt
from bootfsm.parsers import ParseError

__all__ = ["RedistArtifact", "RedistComponent", "RedistManifest", "parse_redistrib"]

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_MD5 = re.compile(r"[0-9a-fA-F]{32}")
_SIZE = re.compile(r"[0-9]{1,20}")
# Component keys that describe the component rather than name a platform.
_COMPONENT_META = frozenset({"name", "license", "license_path", "version", "cuda_variant"})


@dataclass(frozen=True)
class RedistArtifact:
    """One downloadable archive; `relative_path` is relative to the manifest's directory."""

    relative_path: str
    sha256: str
    md5: str
    size: int


@dataclass(frozen=True)
class RedistComponent:
    """One component (e.g. "fabricmanager") with its archive per platform ("linux-sbsa")."""

    key: str
    name: str
    version: str
    platforms: Mapping[str, RedistArtifact]


@dataclass(frozen=True)
class RedistManifest:
    """A whole manifest: release metadata plus components by key."""

    release_date: str
    release_label: str
    release_product: str
    components: Mapping[str, RedistComponent]


def _str(obj: Mapping[str, object], key: str, where: str, *, required: bool = True) -> str:
    """Fetch a string member, or "" when optional and absent."""
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        got = excerpt(value)
        raise ParseError(f"redistrib {where}: {key!r} must be a non-empty string, got {got}")
    return value


def _relative_path(path: str, where: str) -> str:
    """Refuse a path that names no file (its last component, the archive's name in the
    cache, empty, "." or ".."), absolute paths, '..', empty components, backslashes and
    control characters."""
    parts = path.split("/")
    if parts[-1] in ("", ".", ".."):
        raise ParseError(f"redistrib {where}: relative_path {excerpt(path)} names no file")
    if (
        path.startswith("/")
        or ".." in parts
        or "" in parts
        or "\\" in path
        or any(ord(c) < 0x20 or c == "\x7f" for c in path)
    ):
        raise ParseError(f"redistrib {where}: unsafe relative_path {excerpt(path)}")
    return path


def _artifact(raw: object, where: str) -> RedistArtifact:
    if not isinstance(raw, dict):
        raise ParseError(f"redistrib {where}: expected an object, got {type(raw).__name__}")
    sha256 = _str(raw, "sha256", where)
    if not _SHA256.fullmatch(sha256):
        raise ParseError(f"redistrib {where}: sha256 is not 64 hex digits: {excerpt(sha256)}")
    md5 = _str(raw, "md5", where, required=False)
    if md5 and not _MD5.fullmatch(md5):
        raise ParseError(f"redistrib {where}: md5 is not 32 hex digits: {excerpt(md5)}")
    size = raw.get("size")
    # NVIDIA writes sizes as strings ("8178396"); accept a JSON integer too.
    if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
        size_value = size
    elif isinstance(size, str) and _SIZE.fullmatch(size):
        size_value = int(size)
    else:
        raise ParseError(f"redistrib {where}: size is not a byte count: {excerpt(size)}")
    return RedistArtifact(
        relative_path=_relative_path(_str(raw, "relative_path", where), where),
        sha256=sha256.lower(),
        md5=md5.lower(),
        size=size_value,
    )


def _component(key: str, raw: object) -> RedistComponent:
    """Validate one component; every member but the metadata keys is a platform."""
    if not isinstance(raw, dict):
        raise ParseError(f"redistrib component {excerpt(key)}: expected an object")
    platforms = {
        platform: _artifact(entry, excerpt(f"{key}/{platform}", quote=False))
        for platform, entry in raw.items()
        if platform not in _COMPONENT_META
    }
    return RedistComponent(
        key=key,
        name=_str(raw, "name", excerpt(key, quote=False)),
        version=_str(raw, "version", excerpt(key, quote=False)),
        platforms=MappingProxyType(platforms),
    )


def parse_redistrib(text: str) -> RedistManifest:
    """Parse a redistrib manifest; every archive needs a safe path, a sha256 and a size."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ParseError(f"redistrib: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ParseError(f"redistrib: top level must be an object, got {type(doc).__name__}")
    components = {
        key: _component(key, raw) for key, raw in doc.items() if not key.startswith("release_")
    }
    return RedistManifest(
        release_date=_str(doc, "release_date", "header"),
        release_label=_str(doc, "release_label", "header"),
        release_product=_str(doc, "release_product", "header"),
        components=MappingProxyType(components),
    )
