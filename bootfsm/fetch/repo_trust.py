"""Trust in repository indexes, as apt does (docs/security.md): Packages only through
the SHA256 and size its gpgv-checked ``InRelease``/``Release`` lists, until Valid-Until.

Raises REPO_SIGNATURE_INVALID or REPO_INDEX_MISMATCH; ``allow_unsigned_repos`` makes a
signature failure a warning. The unsigned redist manifest is checked against its pin.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from urllib.parse import urlsplit, urlunsplit

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.core.redact import redact_url
from bootfsm.fetch.ubuntu_signed import is_archive_key
from bootfsm.machine.context import Context
from bootfsm.parsers import ParseError
from bootfsm.parsers.debian_release import (
    Release,
    clearsigned_body,
    parse_gpgv_status,
    parse_release,
)

__all__ = [
    "GPGV_TIMEOUT_S",
    "check_packages",
    "check_pinned",
    "keyring_for",
    "release_site",
    "sibling_url",
]

GPGV_TIMEOUT_S = 30.0
_MAX_RELEASE = 4 << 20  # Debian's main archive InRelease is ~150 KB


def sibling_url(url: str, name: str) -> str:
    """The URL of ``name`` in the same directory as ``url`` (its query string kept)."""
    parts = urlsplit(url)
    path = parts.path.rsplit("/", 1)[0] + "/" + name
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def keyring_for(ctx: Context, key: str) -> str:
    """The node path of the keyring that signs index ``key``'s repository."""
    src = ctx.config.sources
    if is_archive_key(key):
        return src.ubuntu_archive_keyring
    return src.cuda_repo_keyring if key == "cuda_packages" else src.toolkit_repo_keyring


def release_site(key: str, packages_url: str) -> tuple[str, str]:
    """(a URL beside the repository's InRelease, the path its Release lists the index
    under): a flat repository's is its Packages' directory and "Packages"; an Ubuntu
    archive's is ``dists/<suite>/`` and ``<component>/binary-<arch>/Packages.xz``."""
    if not is_archive_key(key):
        return packages_url, "Packages"
    parts = urlsplit(packages_url)
    head, _, tail = parts.path.rpartition("/dists/")
    suite, _, entry = tail.partition("/")
    path = f"{head}/dists/{suite}/InRelease"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")), entry


def _get(ctx: Context, url: str) -> bytes | None:
    """The body, or None on 404 (transient failures propagate to the mirror loop)."""
    t0 = ctx.host.monotonic()
    try:
        r = ctx.http.get(
            url,
            timeout=ctx.remaining(),
            max_bytes=_MAX_RELEASE,
            allow_http_hosts=ctx.config.fetch.allow_http_hosts,
        )
    except BootError as exc:
        if exc.code is Code.ARTIFACT_NOT_FOUND:
            return None
        raise
    ctx.event(
        "index.release_fetched",
        url=redact_url(url),
        size=len(r.body),
        duration_s=round(ctx.host.monotonic() - t0, 4),
    )
    return r.body


def _gpgv(ctx: Context, keyring: str, files: list[str]) -> list[str]:
    """Run gpgv on node paths ``files``; the reasons it is not trusted ([] = trusted)."""
    host = ctx.host
    if not host.is_file(keyring):
        return [f"keyring {keyring} is missing (install the repository's keyring package)"]
    home = f"{ctx.config.run.state_dir}/gpgv/home"
    host.makedirs(home, mode=0o700)  # empty: no default trustedkeys keyring is consulted
    argv = [
        "gpgv",
        "--homedir",
        str(host.path(home)),
        "--status-fd",
        "1",
        "--keyring",
        str(host.path(keyring)),
        *(str(host.path(f)) for f in files),
    ]
    result = ctx.run(argv, timeout=GPGV_TIMEOUT_S, die_with_bootfsm=False)  # only reads
    try:
        status = parse_gpgv_status(result.output)
    except ParseError as exc:
        return [f"gpgv status: {exc}"]
    reasons = list(status.problems)
    reasons += [f"signature uses a weak digest: {w}" for w in status.weak]
    if not status.good and status.missing_keys:
        reasons.append(f"signed by key {', '.join(status.missing_keys)}, not in {keyring}")
    if status.trusted and result.ok:
        return []
    if not reasons:
        reasons.append(f"gpgv exited {result.returncode}: {result.tail.strip()[-300:]}")
    return reasons


def _signed_release(
    ctx: Context, key: str, packages_url: str, keyring: str
) -> tuple[str | None, str, list[str]]:
    """(Release text or None, the URL it came from, reasons it is not trusted)."""
    d = f"{ctx.config.run.state_dir}/gpgv"
    ctx.host.makedirs(d, mode=0o700)
    url = sibling_url(packages_url, "InRelease")
    body = _get(ctx, url)
    if body is not None:
        path = f"{d}/{key}.InRelease"
        ctx.host.write_atomic(path, body, mode=0o600, durable=False)  # for gpgv, now
        try:
            text = clearsigned_body(body.decode("utf-8"))
        except (ParseError, UnicodeDecodeError) as exc:
            return None, url, [f"InRelease is not a clear-signed message: {exc}"]
        return text, url, _gpgv(ctx, keyring, [path])
    url = sibling_url(packages_url, "Release")
    body = _get(ctx, url)
    if body is None:
        return None, url, ["the repository has no InRelease and no Release (unsigned)"]
    text = body.decode("utf-8", "replace")
    sig = _get(ctx, sibling_url(packages_url, "Release.gpg"))
    if sig is None:
        return text, url, ["Release has no Release.gpg signature"]
    ctx.host.write_atomic(f"{d}/{key}.Release", body, mode=0o600, durable=False)
    ctx.host.write_atomic(f"{d}/{key}.Release.gpg", sig, mode=0o600, durable=False)
    return text, url, _gpgv(ctx, keyring, [f"{d}/{key}.Release.gpg", f"{d}/{key}.Release"])


def _check_against(
    ctx: Context, release: Release, where: str, packages_url: str, body: bytes, name: str
) -> None:
    now = dt.datetime.fromtimestamp(ctx.host.wall(), dt.timezone.utc)
    if release.valid_until is not None and release.valid_until < now:
        raise BootError(
            Code.REPO_INDEX_MISMATCH,
            f"{where} expired at {release.valid_until:%Y-%m-%d %H:%M:%S} UTC (Valid-Until);"
            " the mirror serves stale metadata, or this node's clock is wrong",
        )
    entry = release.sha256.get(name)
    if entry is None:
        raise BootError(Code.REPO_INDEX_MISMATCH, f"{where} lists no SHA256 for {name}")
    got = hashlib.sha256(body).hexdigest()
    if len(body) != entry.size or got != entry.sha256:
        raise BootError(
            Code.REPO_INDEX_MISMATCH,
            f"{redact_url(packages_url)} is {len(body)} B with sha256 {got[:16]}...; {where}"
            f" lists {entry.size} B with sha256 {entry.sha256[:16]}...",
        )


def check_packages(ctx: Context, key: str, packages_url: str, body: bytes) -> None:
    """Trust ``body`` (Packages from ``packages_url``) through the signed Release, or raise."""
    keyring = keyring_for(ctx, key)
    site, name = release_site(key, packages_url)
    text, url, reasons = _signed_release(ctx, key, site, keyring)
    where = redact_url(url)
    if reasons:
        message = f"{where}: {'; '.join(reasons)}"
        if not ctx.config.sources.allow_unsigned_repos:
            raise BootError(Code.REPO_SIGNATURE_INVALID, message)
        ctx.warn(f"{message}; used because sources.allow_unsigned_repos is true", index=key)
    if text is None:
        return
    try:
        release = parse_release(text)
    except ParseError as exc:
        raise BootError(Code.INDEX_INVALID, f"{where}: {exc}") from exc
    _check_against(ctx, release, where, packages_url, body, name)
    ctx.event(
        "index.verified",
        index=key,
        release=where,
        signed=not reasons,
        keyring=keyring,
        valid_until=release.valid_until.isoformat() if release.valid_until else None,
    )


def check_pinned(ctx: Context, url: str, body: bytes) -> None:
    """The redist manifest matches ``sources.redist_manifest_sha256`` when one is pinned."""
    pin = ctx.config.sources.redist_manifest_sha256.lower()
    if not pin:
        return
    got = hashlib.sha256(body).hexdigest()
    if got != pin:
        raise BootError(
            Code.REPO_INDEX_MISMATCH,
            f"{redact_url(url)} has sha256 {got}; sources.redist_manifest_sha256 pins {pin}",
        )
