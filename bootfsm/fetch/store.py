"""The verified-artifact store: what fetch resolved and cached, re-verified on every use."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.fetch.artifacts import (
    Artifact,
    cache_node_path,
    load_resolution,
    resolution_key,
    sha256_of,
)
from bootfsm.machine.context import Context

__all__ = ["resolution_problem", "resolved", "resolved_path", "verified"]

_HEX = frozenset("0123456789abcdef")
_STRINGS = ("name", "role", "url", "sha256", "filename")


def resolved_path(ctx: Context) -> str:
    """Node path of resolved.json."""
    return f"{ctx.config.run.state_dir}/resolved.json"


def _is_size(v: object) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def _is_strings(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(m, str) for m in v)


def _is_sha256(v: str) -> bool:
    return not v or (len(v) == 64 and set(v) <= _HEX)


def _is_plain_name(v: str) -> bool:
    return bool(v) and "/" not in v and "\x00" not in v and v not in (".", "..")


# field, its value when absent, the check, what a value that fails it is not
_CHECKS: tuple[tuple[str, object, Callable[[Any], bool], str], ...] = (
    ("size", None, _is_size, "a byte count"),
    ("mirrors", [], _is_strings, "a list of strings"),
    ("sha256", "", _is_sha256, "64 hex digits"),
    ("filename", "", _is_plain_name, "a plain file name"),
)


def _artifact_problem(i: int, a: object) -> str:
    """What is wrong with artifact ``i`` of resolved.json ('' when nothing)."""
    if not isinstance(a, dict) or set(a) - {*_STRINGS, "size", "mirrors"}:
        return f"artifact {i} is not an object with the artifact fields"
    for k in _STRINGS:
        if not isinstance(a.get(k), str):
            return f"artifact {i}: {k!r} is not a string"
    for k, absent, ok, what in _CHECKS:
        if not ok(a.get(k, absent)):
            return f"artifact {i}: {k!r} is not {what}"
    return ""


def resolution_problem(text: str) -> str:
    """What is wrong with the shape of resolved.json's ``text`` ('' when nothing)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(data, dict) or not isinstance(data.get("key"), str):
        return "not an object with a string 'key'"
    arts = data.get("artifacts")
    if not isinstance(arts, list):
        return "'artifacts' is not a list"
    return next((p for i, a in enumerate(arts) if (p := _artifact_problem(i, a))), "")


def resolved(ctx: Context) -> list[Artifact] | None:
    """The artifacts fetch resolved for this config and platform, or None; a resolved.json
    of the wrong shape is discarded with a warning, never stopping every later run."""
    key = resolution_key(ctx.config, ctx.facts)
    text = ctx.host.read_text(resolved_path(ctx))
    if text:
        problem = resolution_problem(text)
        if problem:
            ctx.warn(f"{resolved_path(ctx)} is invalid ({problem}); discarded, fetch rebuilds it")
            ctx.host.remove(resolved_path(ctx))
            return None
    return load_resolution(text, key)


def verified(ctx: Context, role: str) -> list[tuple[Artifact, Path]]:
    """Cached artifacts of ``role``, each hashed now: nothing is used unverified."""
    arts = resolved(ctx)
    if arts is None:
        raise BootError(Code.INTERNAL_ERROR, "no resolved artifacts: fetch has not run")
    out = []
    for a in arts:
        if a.role != role:
            continue
        node = cache_node_path(ctx.config, a)
        ctx.host.own_dir(node.rsplit("/", 1)[0])  # the bucket is bootfsm's, not a link
        found = ctx.host.own_file(node)  # a regular file, never a planted link
        if found is None:
            raise BootError(
                Code.ARTIFACT_NOT_FOUND, f"{a.name} is missing from the cache at {node}"
            )
        if a.sha256 and sha256_of(found) != a.sha256:  # what is used is hashed
            raise BootError(
                Code.CHECKSUM_MISMATCH, f"cached {a.name} no longer matches its sha256: {found}"
            )
        out.append((a, found))
    return out
