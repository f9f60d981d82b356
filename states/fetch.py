"""fetch: resolve this node's artifacts from manifests and indexes, download, verify.

A cache that resolves and verifies whole (`bootfsm fetch --prefetch`) costs no network.
With the image's driver kept (driver.keep_image_driver, checked by detect) nothing of
driver.version is fetched: only the container toolkit, and only when it is not installed.
Otherwise free space is checked against the indexes' sizes before any write, and what is
missing downloads in parallel; a corrupt or stale cache entry never verifies, so it is
replaced.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from bootfsm.core.errors import TransientError
from bootfsm.core.redact import redact_url
from bootfsm.fetch.artifacts import (
    Artifact,
    cache_node_path,
    dump_resolution,
    resolution_key,
    resolve,
)
from bootfsm.fetch.indexes import (
    cached_ok,
    fetch_indexes,
    from_cache,
    save_indexes,
    space_check,
)
from bootfsm.fetch.stamps import remember
from bootfsm.fetch.store import resolved, resolved_path
from bootfsm.host.http import check_url
from bootfsm.host.progress import Progress, terminal
from bootfsm.install.driver_steps import toolkit_ok
from bootfsm.machine.context import Context
from bootfsm.node.verdict import kept_image_driver

NAME = "fetch"


def _image_driver_needs_nothing(ctx: Context) -> bool:
    """The image's driver is kept (detect checked it: node/verdict.py) and the container
    toolkit is installed at its version: nothing to fetch, no index, no pin."""
    return kept_image_driver(ctx.config, ctx.facts) is not None and toolkit_ok(ctx)


def satisfied(ctx: Context) -> bool:
    """Nothing to fetch for a kept image driver, or a resolution for this config exists
    and every artifact in it is cached and verifies."""
    if _image_driver_needs_nothing(ctx):
        return True
    arts = resolved(ctx)
    return arts is not None and all(cached_ok(ctx, a) for a in arts)


def skip_reason(ctx: Context) -> str | None:
    """Why nothing was fetched when the image's driver is kept (read-only; after
    ``satisfied`` held, so the toolkit is installed or a resolution is cached)."""
    kept = kept_image_driver(ctx.config, ctx.facts)
    if kept is None:
        return None
    return (
        f"driver.keep_image_driver: the image's driver {kept} is kept (it loads, as "
        f"validateGPUDrivers checks), so nothing of driver {ctx.config.driver.version} is "
        "fetched; the container toolkit is in place"
    )


# -- indexes -----------------------------------------------------------------------------


def _mirror(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


def _download(ctx: Context, missing: list[Artifact], attempts: dict[str, int]) -> None:
    from bootfsm.fetch.fetcher import Fetched, Fetcher, Job  # a rerun downloads nothing

    cfg = ctx.config
    jobs = []
    for a in missing:
        dest = cache_node_path(cfg, a)
        ctx.host.own_dir(dest.rsplit("/", 1)[0])  # a bucket: never a planted link
        for suffix in (".part", ".part.meta"):
            ctx.host.own_file(dest + suffix)  # a planted link here is refused
        jobs.append(Job(a, ctx.host.path(dest + ".part")))

    def emit(event: str, **fields: object) -> None:
        progress.clear()  # the status line never splits a console line
        ctx.event(event, **fields)

    progress = Progress(emit, tty=terminal())
    fetcher = Fetcher(
        ctx.http,
        parallel=cfg.fetch.parallel,
        allow_http_hosts=cfg.fetch.allow_http_hosts,
        artifact_timeout=cfg.fetch.artifact_timeout,
        remaining=ctx.remaining,
        emit=emit,
        progress=progress,
        fsync=cfg.fetch.fsync,
        segments=cfg.fetch.segments,
        segment_min_size=cfg.fetch.segment_min_size,
        segment_below_rate=cfg.fetch.segment_below_rate,
    )

    def done(f: Fetched) -> None:
        a, res = f.job.artifact, f.result
        dest = cache_node_path(cfg, a)
        ctx.host.rename(dest + ".part", dest)
        ctx.host.remove(dest + ".part.meta")
        st = ctx.host.stat(dest, follow=False)
        if a.sha256 and st:  # the bytes just hashed on the way in: a rerun need not read them
            remember(ctx, dest, st, res.sha256)
        took = max(f.duration_s, 1e-6)
        emit(
            "artifact.fetched",
            artifact=a.name,
            url=redact_url(f.url),
            mirror=_mirror(f.url),
            mirror_index=f.mirror,
            size=res.size,
            duration_s=round(took, 4),
            rate_mb_s=round(res.transferred / took / 1e6, 2),
            attempts=attempts.get(a.name, 0) + fetcher.attempts.get(a.name, 0),
            resumed_bytes=res.resumed_bytes,
            transferred=res.transferred,
            verified=bool(a.sha256),
        )

    try:
        fetcher.run(jobs, done)
    except TransientError as exc:
        if ctx.remaining() <= 0:
            raise ctx.time_error() from exc
        raise
    finally:
        for name, n in fetcher.attempts.items():
            attempts[name] = attempts.get(name, 0) + n


class Fetch:
    """The fetch state, keeping HTTP attempts per artifact (failed ones too) over all
    its tries; the module's ``run`` counts one try's alone."""

    NAME = NAME

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}

    def satisfied(self, ctx: Context) -> bool:
        """The module's postcondition."""
        return satisfied(ctx)

    def skip_reason(self, ctx: Context) -> str | None:
        """The module's reason for a skip."""
        return skip_reason(ctx)

    def run(self, ctx: Context) -> None:
        """The module's action, counting into ``attempts``."""
        run(ctx, self.attempts)


def run(ctx: Context, attempts: dict[str, int] | None = None) -> None:
    """Resolve (from a complete cache first), check space, download what is missing;
    adds this try's HTTP attempts per artifact to ``attempts``."""
    arts = from_cache(ctx)
    missing: list[Artifact] = []
    if arts is None:
        texts, served = fetch_indexes(ctx)
        arts = resolve(ctx.config, ctx.facts, texts, served)
        for a in arts:
            for url in a.urls:
                check_url(url, ctx.config.fetch.allow_http_hosts)
        missing = [a for a in arts if not cached_ok(ctx, a)]
        space_check(ctx, missing, texts)
        ctx.host.own_dir(ctx.config.fetch.cache_dir)
        save_indexes(ctx, texts)
    key = resolution_key(ctx.config, ctx.facts)
    ctx.host.own_dir(ctx.config.run.state_dir)
    ctx.host.write_atomic(resolved_path(ctx), dump_resolution(key, arts), mode=0o600)
    _download(ctx, missing, {} if attempts is None else attempts)
