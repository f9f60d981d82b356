"""fetch: resolve this node's artifacts from manifests and indexes, download, verify."""

from __future__ import annotations

from bootfsm.artifacts import (
    Artifact,
    cache_node_path,
    dump_resolution,
    index_urls,
    resolution_key,
    resolve,
    sha256_of,
)
from bootfsm.codes import Code
from bootfsm.context import Context
from bootfsm.errors import BootError
from bootfsm.http import check_url
from bootfsm.redact import redact_url
from bootfsm.store import resolved, resolved_path

NAME = "fetch"


def _cached_ok(ctx: Context, a: Artifact) -> bool:
    p = ctx.host.path(cache_node_path(ctx.config, a))
    if not p.is_file():
        return False
    if a.size is not None and p.stat().st_size != a.size:
        return False
    return not a.sha256 or sha256_of(p) == a.sha256


def satisfied(ctx: Context) -> bool:
    """A resolution for this config exists and every artifact in it is cached and verifies."""
    arts = resolved(ctx)
    return arts is not None and all(_cached_ok(ctx, a) for a in arts)


def _indexes(ctx: Context) -> dict[str, str]:
    allow = ctx.config.fetch.allow_http_hosts
    out = {}
    for key, url in index_urls(ctx.config, ctx.facts).items():
        check_url(url, allow)
        r = ctx.http.get(url, timeout=ctx.remaining())
        out[key] = r.body.decode("utf-8", "replace")
        ctx.event("index.fetched", index=key, url=redact_url(url), size=len(r.body))
    return out


def _space_check(ctx: Context, missing: list[Artifact]) -> None:
    need = sum(a.size or 0 for a in missing)
    if not need:
        return
    free = ctx.host.free_bytes(ctx.config.fetch.cache_dir)
    if need > free:
        raise BootError(
            Code.INSUFFICIENT_SPACE,
            f"{ctx.config.fetch.cache_dir} has {free} B free; the artifacts need {need} B",
        )


def _download(ctx: Context, a: Artifact) -> None:
    dest = cache_node_path(ctx.config, a)
    part = dest + ".part"
    ctx.host.makedirs(dest.rsplit("/", 1)[0], mode=0o700)
    t0 = ctx.host.monotonic()
    res = ctx.http.stream_to(a.url, ctx.host.path(part), timeout=ctx.remaining())
    if a.sha256 and res.sha256 != a.sha256:
        ctx.host.remove(part)
        ctx.host.remove(part + ".meta")
        raise BootError(
            Code.CHECKSUM_MISMATCH,
            f"{a.name} from {redact_url(a.url)}: sha256 {res.sha256} != expected {a.sha256}",
        )
    ctx.host.chmod(part, 0o600)
    ctx.host.rename(part, dest)
    ctx.host.remove(part + ".meta")
    took = max(ctx.host.monotonic() - t0, 1e-6)
    ctx.event(
        "artifact.fetched",
        artifact=a.name,
        url=redact_url(a.url),
        size=res.size,
        duration_s=round(took, 4),
        rate_mb_s=round(res.transferred / took / 1e6, 2),
        resumed_bytes=res.resumed_bytes,
        verified=bool(a.sha256),
    )


def run(ctx: Context) -> None:
    """Fetch indexes, resolve, refuse unverified or insecure, then download what is missing."""
    arts = resolve(ctx.config, ctx.facts, _indexes(ctx))
    for a in arts:
        check_url(a.url, ctx.config.fetch.allow_http_hosts)
    key = resolution_key(ctx.config, ctx.facts)
    ctx.host.makedirs(ctx.config.run.state_dir, mode=0o700)
    ctx.host.write_atomic(resolved_path(ctx), dump_resolution(key, arts), mode=0o600)
    missing = [a for a in arts if not _cached_ok(ctx, a)]
    _space_check(ctx, missing)
    for a in missing:
        _download(ctx, a)
