"""fetch: resolve this node's artifacts from manifests and indexes, download, verify.

The cache is used first: when the cached copies of the indexes resolve to artifacts
that are all in the cache and verify (an image prepared with `bootfsm fetch
--prefetch`), no byte goes over the network. Otherwise the indexes are fetched (each
from its first mirror that answers; a cached copy stands in when none does), free
space is checked against the sizes they list before anything is written, and what is
missing downloads in parallel (bootfsm.fetch.fetcher). A corrupt or stale cache entry never
verifies, so it is downloaded again and replaced.
"""

from __future__ import annotations

import hashlib
import stat
import sys
from urllib.parse import urlsplit

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_url
from bootfsm.fetch.artifacts import (
    Artifact,
    cache_node_path,
    dump_resolution,
    index_cache_path,
    index_candidates,
    resolution_key,
    resolve,
    sha256_of,
)
from bootfsm.fetch.fetcher import Fetched, Fetcher, Job
from bootfsm.fetch.repo_trust import check_packages, check_pinned
from bootfsm.fetch.store import resolved, resolved_path
from bootfsm.host.http import check_url
from bootfsm.host.progress import Progress
from bootfsm.machine.context import Context

NAME = "fetch"
_MEMO = "fetch.verified"  # ctx.scratch: real path -> (size, mtime_ns, inode, sha256)


def _cached_ok(ctx: Context, a: Artifact) -> bool:
    """The cached file exists, has the listed size and hashes to the sha256.

    A hash is remembered for the same (size, mtime, inode) within one run, so the
    postcondition after a download does not hash every file a second time.
    """
    p = ctx.host.path(cache_node_path(ctx.config, a))
    try:
        st = p.lstat()  # a planted symlink is never "cached": it is downloaded over
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or (a.size is not None and st.st_size != a.size):
        return False
    if not a.sha256:
        return True
    memo: dict[str, tuple[int, int, int, str]] = ctx.scratch.setdefault(_MEMO, {})
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    seen = memo.get(str(p))
    if seen is None or seen[:3] != stamp:
        seen = (*stamp, sha256_of(p))
        memo[str(p)] = seen
    return seen[3] == a.sha256


def satisfied(ctx: Context) -> bool:
    """A resolution for this config exists and every artifact in it is cached and verifies."""
    arts = resolved(ctx)
    return arts is not None and all(_cached_ok(ctx, a) for a in arts)


# -- indexes -----------------------------------------------------------------------------


def _cached_indexes(ctx: Context) -> dict[str, str] | None:
    out = {}
    for key, urls in index_candidates(ctx.config, ctx.facts).items():
        text = ctx.host.read_text(index_cache_path(ctx.config, key, urls[0]))
        if text is None:
            return None
        out[key] = text
    return out


def sha256_text(text: str) -> str:
    """sha256 hex digest of a cached index's text (UTF-8, as it was saved)."""
    return hashlib.sha256(text.encode()).hexdigest()


def _from_cache(ctx: Context) -> list[Artifact] | None:
    """Artifacts resolved from cached indexes when every one of them verifies, else None."""
    texts = _cached_indexes(ctx)
    if texts is None:
        return None
    pin = ctx.config.sources.redist_manifest_sha256.lower()
    if pin and "redistrib" in texts and sha256_text(texts["redistrib"]) != pin:
        return None  # cached before the pin was set (or changed): fetch and check again
    try:
        arts = resolve(ctx.config, ctx.facts, texts)
    except BootError:
        return None
    if not all(_cached_ok(ctx, a) for a in arts):
        return None
    for a in arts:
        ctx.event("artifact.cached", artifact=a.name, size=a.size, verified=bool(a.sha256))
    ctx.event("fetch.offline", artifacts=len(arts), reason="cached indexes and artifacts verify")
    return arts


# a mirror that lacks the index, or serves one that fails its signature or its Release,
# hands over to the next mirror; when none serves a trusted one, the first failure stands
_NEXT_MIRROR = (Code.ARTIFACT_NOT_FOUND, Code.REPO_SIGNATURE_INVALID, Code.REPO_INDEX_MISMATCH)


def _trust(ctx: Context, key: str, url: str, body: bytes) -> None:
    """Packages through the repository's signed Release; the redist manifest by its pin."""
    if key.endswith("_packages"):
        check_packages(ctx, key, url, body)
    elif key == "redistrib":
        check_pinned(ctx, url, body)


def _fetch_index(ctx: Context, key: str, urls: tuple[str, ...]) -> tuple[str, int]:
    """(text, position of the URL that served it); a cached copy when no mirror answers."""
    allow = ctx.config.fetch.allow_http_hosts
    failures: list[BootError | TransientError] = []
    for i, url in enumerate(urls):
        try:
            r = ctx.http.get(url, timeout=ctx.remaining(), allow_http_hosts=allow)
            _trust(ctx, key, url, r.body)
        except TransientError as exc:
            failures.append(exc)
        except BootError as exc:
            if exc.code not in _NEXT_MIRROR:
                raise
            failures.append(exc)
        else:
            ctx.event("index.fetched", index=key, url=redact_url(url), mirror=i, size=len(r.body))
            return r.body.decode("utf-8", "replace"), i
        if len(urls) > 1:
            ctx.warn(f"index {key}: {failures[-1].message}", index=key, mirror=i)
    transient = [e for e in failures if isinstance(e, TransientError)]
    cached = ctx.host.read_text(index_cache_path(ctx.config, key, urls[0])) if transient else None
    if cached is not None:
        ctx.warn(f"index {key}: no mirror answers; using the cached copy", index=key)
        return cached, 0
    trust = [e for e in failures if e.code is not Code.ARTIFACT_NOT_FOUND]
    raise transient[0] if transient else (trust or failures)[0]


def _indexes(ctx: Context) -> tuple[dict[str, str], dict[str, int]]:
    cands = index_candidates(ctx.config, ctx.facts)
    for urls in cands.values():
        for url in urls:
            check_url(url, ctx.config.fetch.allow_http_hosts)
    texts: dict[str, str] = {}
    served: dict[str, int] = {}
    for key, urls in cands.items():
        texts[key], served[key] = _fetch_index(ctx, key, urls)
    return texts, served


def _save_indexes(ctx: Context, texts: dict[str, str]) -> None:
    for key, urls in index_candidates(ctx.config, ctx.facts).items():
        path = index_cache_path(ctx.config, key, urls[0])
        if ctx.host.read_text(path) != texts[key]:
            ctx.host.write_atomic(path, texts[key], mode=0o600)


# -- space and downloads -----------------------------------------------------------------


def _part_bytes(ctx: Context, a: Artifact) -> int:
    p = ctx.host.path(cache_node_path(ctx.config, a) + ".part")
    return p.stat().st_size if p.is_file() else 0


def _space_check(ctx: Context, missing: list[Artifact], texts: dict[str, str]) -> None:
    """Fail before writing anything when the listed sizes exceed the cache's free space."""
    need = sum(max((a.size or 0) - _part_bytes(ctx, a), 0) for a in missing)
    need += sum(len(t.encode()) for t in texts.values())
    free = ctx.host.free_bytes(ctx.config.fetch.cache_dir)
    if need > free:
        raise BootError(
            Code.INSUFFICIENT_SPACE,
            f"{ctx.config.fetch.cache_dir} has {free} B free; the artifacts need {need} B",
        )


def _mirror(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


def _download(ctx: Context, missing: list[Artifact]) -> None:
    cfg = ctx.config
    jobs = []
    for a in missing:
        dest = cache_node_path(cfg, a)
        ctx.host.own_dir(dest.rsplit("/", 1)[0])  # a bucket: never a planted link
        for suffix in (".part", ".part.meta"):
            ctx.host.own_file(dest + suffix)  # a planted link here is refused
        jobs.append(Job(a, ctx.host.path(dest + ".part")))
    attempts: dict[str, int] = ctx.scratch.setdefault("fetch.attempts", {})

    def emit(event: str, **fields: object) -> None:
        progress.clear()  # the status line never splits a console line
        ctx.event(event, **fields)

    progress = Progress(emit, tty=sys.stderr if sys.stderr.isatty() else None)
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
    )

    def done(f: Fetched) -> None:
        a, res = f.job.artifact, f.result
        dest = cache_node_path(cfg, a)
        ctx.host.rename(dest + ".part", dest)
        ctx.host.remove(dest + ".part.meta")
        st = ctx.host.path(dest).stat()
        ctx.scratch.setdefault(_MEMO, {})[str(ctx.host.path(dest))] = (
            st.st_size,
            st.st_mtime_ns,
            st.st_ino,
            res.sha256,
        )
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


def run(ctx: Context) -> None:
    """Resolve (from the cache when it is complete), check space, download what is missing."""
    arts = _from_cache(ctx)
    missing: list[Artifact] = []
    if arts is None:
        texts, served = _indexes(ctx)
        arts = resolve(ctx.config, ctx.facts, texts, served)
        for a in arts:
            for url in a.urls:
                check_url(url, ctx.config.fetch.allow_http_hosts)
        missing = [a for a in arts if not _cached_ok(ctx, a)]
        _space_check(ctx, missing, texts)
        ctx.host.own_dir(ctx.config.fetch.cache_dir)
        _save_indexes(ctx, texts)
    key = resolution_key(ctx.config, ctx.facts)
    ctx.host.own_dir(ctx.config.run.state_dir)
    ctx.host.write_atomic(resolved_path(ctx), dump_resolution(key, arts), mode=0o600)
    _download(ctx, missing)
