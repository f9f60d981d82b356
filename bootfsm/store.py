"""The verified-artifact store: what fetch resolved and cached, re-verified on every use."""

from __future__ import annotations

from pathlib import Path

from bootfsm.artifacts import Artifact, cache_node_path, load_resolution, resolution_key, sha256_of
from bootfsm.codes import Code
from bootfsm.context import Context
from bootfsm.errors import BootError

__all__ = ["resolved", "resolved_path", "verified"]


def resolved_path(ctx: Context) -> str:
    """Node path of resolved.json."""
    return f"{ctx.config.run.state_dir}/resolved.json"


def resolved(ctx: Context) -> list[Artifact] | None:
    """The artifacts fetch resolved for this config and platform, or None."""
    key = resolution_key(ctx.config, ctx.facts)
    return load_resolution(ctx.host.read_text(resolved_path(ctx)), key)


def verified(ctx: Context, role: str) -> list[tuple[Artifact, Path]]:
    """Cached artifacts of ``role``, each re-hashed now: nothing is used unverified."""
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
        p = found
        if a.sha256 and sha256_of(p) != a.sha256:
            raise BootError(
                Code.CHECKSUM_MISMATCH, f"cached {a.name} no longer matches its sha256: {p}"
            )
        out.append((a, p))
    return out
