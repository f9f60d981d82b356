"""The fetch state's indexes: from the first mirror that serves a trusted one, cached
for offline runs; and the space check. Every function takes the state's ``Context``."""

from __future__ import annotations

import hashlib
import stat
from collections.abc import Iterable

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_url
from bootfsm.fetch.artifacts import (
    Artifact,
    cache_node_path,
    index_cache_path,
    index_candidates,
    resolve,
    sha256_of,
)
from bootfsm.fetch.stamps import known_sha256, remember
from bootfsm.fetch.ubuntu_signed import asks_newer, is_archive_key, unxz
from bootfsm.host.http import check_url
from bootfsm.machine.context import Context
from bootfsm.parsers import ParseError

__all__ = [
    "INDEX_MAX_BYTES",
    "cached_indexes",
    "cached_ok",
    "fetch_indexes",
    "from_cache",
    "index_text",
    "save_indexes",
    "space_check",
]


def cached_ok(ctx: Context, a: Artifact) -> bool:
    """The cached file exists, has the listed size and hashes to the sha256 (a hash
    already made of these bytes, bootfsm.fetch.stamps, is not made again)."""
    node = cache_node_path(ctx.config, a)
    st = ctx.host.stat(node, follow=False)  # a planted link is never "cached"
    if st is None or not stat.S_ISREG(st.st_mode) or (a.size is not None and st.st_size != a.size):
        return False
    if not a.sha256:
        return True
    sha = known_sha256(ctx, node, st)
    if sha is None:
        sha = sha256_of(ctx.host.path(node))
        if sha == a.sha256:
            remember(ctx, node, st, sha)
    return sha == a.sha256


def cached_indexes(ctx: Context) -> dict[str, str] | None:
    """The cached text of every index this node reads (fetch saved them verified), or None."""
    out = {}
    for key, urls in index_candidates(ctx.config, ctx.facts).items():
        text = ctx.host.read_text(index_cache_path(ctx.config, key, urls[0]))
        if text is None:
            return None
        out[key] = text
    return out


def from_cache(ctx: Context) -> list[Artifact] | None:
    """Artifacts resolved from cached indexes when every one of them verifies, else None."""
    texts = cached_indexes(ctx)
    if texts is None:
        return None
    pin = ctx.config.sources.redist_manifest_sha256.lower()
    redist = texts.get("redistrib")  # hashed as UTF-8, as it was saved
    if pin and redist is not None and hashlib.sha256(redist.encode()).hexdigest() != pin:
        return None  # cached before the pin was set (or changed): fetch and check again
    try:
        arts = resolve(ctx.config, ctx.facts, texts)
    except BootError:
        return None
    if not all(cached_ok(ctx, a) for a in arts):
        return None
    if ctx.config.driver.source == "ubuntu-signed" and asks_newer(ctx.config, arts):
        ctx.event("fetch.index_stale", reason="driver.version is newer than the cached indexes")
        return None
    for a in arts:
        ctx.event("artifact.cached", artifact=a.name, size=a.size, verified=bool(a.sha256))
    ctx.event("fetch.offline", artifacts=len(arts), reason="cached indexes and artifacts verify")
    return arts


INDEX_MAX_BYTES = 256 << 20
"""The largest index bootfsm reads (256 MiB). A CUDA repository's Packages grows with
every release (tens of MB today); the index is held once as bytes and once as text,
and only the stanzas a node needs are parsed (bootfsm.parsers.debian_packages)."""

# a mirror that lacks the index, or serves one that fails its signature or its Release,
# hands over to the next mirror; when none serves a trusted one, the first failure stands
_NEXT_MIRROR = (Code.ARTIFACT_NOT_FOUND, Code.REPO_SIGNATURE_INVALID, Code.REPO_INDEX_MISMATCH)


def _trust_index(ctx: Context, key: str, url: str, body: bytes) -> None:
    """Packages through the repository's signed Release; the redist manifest by its pin."""
    if key.endswith("_packages") or is_archive_key(key):
        from bootfsm.fetch.repo_trust import check_packages  # fetching only

        check_packages(ctx, key, url, body)
    elif key == "redistrib":
        from bootfsm.fetch.repo_trust import check_pinned  # fetching only

        check_pinned(ctx, url, body)


def _fetch_index(ctx: Context, key: str, urls: tuple[str, ...]) -> tuple[str, int]:
    """(text, position of the URL that served it); a cached copy when no mirror answers."""
    allow = ctx.config.fetch.allow_http_hosts
    failures: list[BootError | TransientError] = []
    ctx.http.warm()  # duration_s is the transfer alone: not the library's import
    for i, url in enumerate(urls):
        try:
            t0 = ctx.host.monotonic()
            r = ctx.http.get(
                url, timeout=ctx.remaining(), allow_http_hosts=allow, max_bytes=INDEX_MAX_BYTES
            )
            ctx.event(  # before the trust checks, which journal their own fetches and gpgv
                "index.fetched",
                index=key,
                url=redact_url(url),
                mirror=i,
                size=len(r.body),
                duration_s=round(ctx.host.monotonic() - t0, 4),
            )
            _trust_index(ctx, key, url, r.body)
        except TransientError as exc:
            failures.append(exc)
        except BootError as exc:
            if exc.code not in _NEXT_MIRROR:
                raise
            failures.append(exc)
        else:
            return index_text(key, url, r.body), i
        if len(urls) > 1:
            ctx.warn(f"index {key}: {failures[-1].message}", index=key, mirror=i)
    transient = [e for e in failures if isinstance(e, TransientError)]
    cached = ctx.host.read_text(index_cache_path(ctx.config, key, urls[0])) if transient else None
    if cached is not None:
        ctx.warn(f"index {key}: no mirror answers; using the cached copy", index=key)
        return cached, 0
    trust = [e for e in failures if e.code is not Code.ARTIFACT_NOT_FOUND]
    raise transient[0] if transient else (trust or failures)[0]


def index_text(key: str, url: str, body: bytes) -> str:
    """The index as text: an Ubuntu archive index is Packages.xz, decompressed (bounded)
    only after its bytes matched the signed InRelease."""
    if not is_archive_key(key):
        return body.decode("utf-8", "replace")
    try:
        return unxz(body, INDEX_MAX_BYTES)
    except ParseError as exc:
        raise BootError(Code.INDEX_INVALID, f"{redact_url(url)}: {exc}") from exc


def _keyrings_installed(ctx: Context, keys: Iterable[str]) -> None:
    """REPO_KEYRING_MISSING, before any download, when a signed index's keyring is absent."""
    if ctx.config.sources.allow_unsigned_repos:
        return
    from bootfsm.fetch.repo_trust import keyring_for  # fetching only

    for key in keys:
        signed = key.endswith("_packages") or is_archive_key(key)
        keyring = keyring_for(ctx, key) if signed else ""
        if keyring and not ctx.host.exists(keyring):
            raise BootError(
                Code.REPO_KEYRING_MISSING,
                f"this boot must download the {_repo(key)} repository's "
                f"index, and its keyring {keyring} is not installed: bake the image "
                "(`bootfsm bake`) or prefetch (`bootfsm fetch --prefetch`) so a boot "
                "downloads nothing, or install the keyring",
            )


def _repo(key: str) -> str:
    return "Ubuntu archive" if is_archive_key(key) else key.removesuffix("_packages")


def fetch_indexes(ctx: Context) -> tuple[dict[str, str], dict[str, int]]:
    cands = index_candidates(ctx.config, ctx.facts)
    for urls in cands.values():
        for url in urls:
            check_url(url, ctx.config.fetch.allow_http_hosts)
    _keyrings_installed(ctx, cands)
    texts: dict[str, str] = {}
    served: dict[str, int] = {}
    for key, urls in cands.items():
        texts[key], served[key] = _fetch_index(ctx, key, urls)
    return texts, served


def save_indexes(ctx: Context, texts: dict[str, str]) -> None:
    for key, urls in index_candidates(ctx.config, ctx.facts).items():
        path = index_cache_path(ctx.config, key, urls[0])
        if ctx.host.read_text(path) != texts[key]:
            ctx.host.write_atomic(path, texts[key], mode=0o600)


# -- space and downloads -----------------------------------------------------------------


def _part_bytes(ctx: Context, a: Artifact) -> int:
    st = ctx.host.stat(cache_node_path(ctx.config, a) + ".part")
    return st.st_size if st and stat.S_ISREG(st.st_mode) else 0


def space_check(ctx: Context, missing: list[Artifact], texts: dict[str, str]) -> None:
    """Fail before writing anything when the listed sizes exceed the cache's free space."""
    need = sum(max((a.size or 0) - _part_bytes(ctx, a), 0) for a in missing)
    need += sum(len(t.encode()) for t in texts.values())
    free = ctx.host.free_bytes(ctx.config.fetch.cache_dir)
    if need > free:
        raise BootError(
            Code.INSUFFICIENT_SPACE,
            f"{ctx.config.fetch.cache_dir} has {free} B free; the artifacts need {need} B",
        )
