"""The network half of the I/O boundary: small GETs, POSTs and resumable downloads.

Failures are classified once (``http_errors``): transient, permanent or TLS. Proxies
come from the client's environment, never for link-local or loopback hosts; no URL
query string (a signature) appears in a message. ``http_wire`` holds the bounds a
hostile peer cannot stretch; segmented downloads (``segments``) use an ``Http``."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_url
from bootfsm.host import partfile as pf
from bootfsm.host.http_errors import check_status, classify
from bootfsm.host.http_wire import (
    Bounds,
    Cancelled,
    Progress,
    Watch,
    check_url,
    receive,
    session_class,
    too_slow,
)
from bootfsm.host.partfile import CHUNK, StreamResult, partial_source, url_id
from bootfsm.host.proxies import bypass, env_proxies, never_proxied

if TYPE_CHECKING:
    import requests  # noqa: TID251

__all__ = [
    "SYSTEM_CA_BUNDLES",
    "Cancelled",
    "Http",
    "HttpResult",
    "StreamResult",
    "check_url",
    "left_s",
    "partial_source",
    "url_id",
]


#: Where distributions keep the system trust store (the first one present is used).
SYSTEM_CA_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu (ca-certificates)
    "/etc/pki/tls/certs/ca-bundle.crt",  # RHEL, Fedora, Azure Linux, Mariner
    "/etc/ssl/ca-bundle.pem",  # openSUSE, SLES
)


@dataclass(frozen=True)
class HttpResult:
    """A small response read whole."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class Http:
    """HTTP with bounded timeouts; proxies from ``env`` except for link-local/loopback.
    ``budget`` (seconds, asked per request; ``Context.request_budget``) caps every
    request's total time, so no request outlives a bound of its caller."""

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
        ca_file: str = "",
        budget: Callable[[], float] | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.ca_file = ca_file
        self.budget = budget
        self._env = dict(os.environ if env is None else env)
        self._proxies = env_proxies(self._env)
        # REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE (what requests and curl honour) win, then
        # the node's trust store; certifi's bundle only when neither exists.
        self._verify: str | bool = (
            self._env.get("REQUESTS_CA_BUNDLE")
            or self._env.get("CURL_CA_BUNDLE")
            or ca_file
            or True
        )
        self._session: requests.Session | None = None

    def clone(self) -> Http:
        """Same settings, its own connection pool (one per thread: Sessions are not shared)."""
        return Http(
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            env=self._env,
            ca_file=self.ca_file,
            budget=self.budget,
        )

    def close(self) -> None:
        """Close pooled connections (the next request opens new ones)."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def warm(self) -> None:
        """Load the HTTP library and build the session now, with no I/O, so that a timed
        request that follows measures the network and not Python importing requests."""
        self._sess()

    def _sess(self) -> requests.Session:
        if self._session is None:
            s = session_class()()
            s.trust_env = False  # proxies and CA bundle come from self._env, never ~/.netrc
            s.headers["User-Agent"] = "bootfsm"
            self._session = s
        return self._session

    def proxy_for(self, url: str) -> str | None:
        """The proxy a request to ``url`` goes through, or None (direct)."""
        if never_proxied(url):
            return None
        parts = urlsplit(url)
        if bypass(parts.hostname or "", parts.port, self._proxies.get("no", "")):
            return None
        return self._proxies.get(parts.scheme) or self._proxies.get("all")

    def _within(self, url: str, seconds: float | None) -> float | None:
        """``seconds`` (None: no limit of its own) capped by the budget; a request whose
        budget is spent before it starts is DOWNLOAD_TIMEOUT."""
        if self.budget is None:
            return seconds
        left = self.budget()
        if left <= 0:
            raise TransientError(
                Code.DOWNLOAD_TIMEOUT, f"no time left to request {redact_url(url)}"
            )
        return left if seconds is None else min(seconds, left)

    @contextlib.contextmanager
    def request(
        self,
        url: str,
        headers: Mapping[str, str],
        *,
        limit: float | None,
        cap_timeouts: bool = True,
        allow_http_hosts: Sequence[str] | None = None,
        method: str = "GET",
        **kw: Any,
    ) -> Iterator[tuple[requests.Response, Watch]]:
        """One streamed, watched request: total time ``limit`` capped by the budget; failures
        classified (``http_errors``); the status is the caller's to check."""
        import requests  # noqa: TID251

        limit = self._within(url, limit)
        session = self._sess()
        session.allow_http_hosts = allow_http_hosts  # type: ignore[attr-defined]
        cap = limit if cap_timeouts and limit is not None else float("inf")
        proxy = self.proxy_for(url)
        kw |= {
            "timeout": (
                max(min(self.connect_timeout, cap), 0.05),
                max(min(self.read_timeout, cap), 0.05),
            ),
            "proxies": {urlsplit(url).scheme: proxy} if proxy else {},
            "verify": self._verify,
        }
        with Watch(limit) as watch:
            try:
                with session.request(method, url, headers=dict(headers), stream=True, **kw) as r:
                    if allow_http_hosts is not None:
                        check_url(r.url, allow_http_hosts)
                    yield r, watch
            except (requests.RequestException, OSError) as exc:
                raise classify(exc, url, self._verify, watch) from exc

    def get(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_bytes: int = 64 << 20,
        check: bool = True,
        allow_http_hosts: Sequence[str] | None = None,
    ) -> HttpResult:
        """GET a small resource whole; Transient/BootError on failure when ``check``. A plain-HTTP
        link-local or loopback URL (IMDS, kubelet) is never proxied and never redirected."""
        own = self.connect_timeout + self.read_timeout if timeout is None else timeout
        local = allow_http_hosts is None and url.startswith("http://") and never_proxied(url)
        with self.request(
            url,
            headers or {},
            limit=own,
            cap_timeouts=timeout is not None,
            allow_http_hosts=allow_http_hosts,
            allow_redirects=not local,
        ) as (r, watch):
            if local and 300 <= r.status_code < 400:
                raise BootError(
                    Code.ARTIFACT_NOT_FOUND,
                    f"HTTP {r.status_code} from {redact_url(url)}: a node-local "
                    "endpoint is read directly and its redirects are not followed",
                    status=r.status_code,
                )
            if check:
                check_status(r.status_code, r.headers, url)
            body = bytearray()
            for chunk in r.iter_content(CHUNK):
                body += chunk
                if len(body) > max_bytes:
                    raise BootError(
                        Code.INDEX_INVALID, f"{redact_url(url)} is larger than {max_bytes} B"
                    )
            if watch.fired:
                raise too_slow(url, watch)
            return HttpResult(r.status_code, dict(r.headers), bytes(body))

    def post(
        self,
        url: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> HttpResult:
        """POST ``body`` once (no retries, no redirects; response capped at 1 MiB);
        ``TransientError`` when it cannot be made, the status is the caller's."""
        own = self.connect_timeout + self.read_timeout if timeout is None else timeout
        with self.request(
            url,
            headers or {},
            limit=own,
            cap_timeouts=timeout is not None,
            method="POST",
            data=body,
            allow_redirects=False,
        ) as (r, watch):
            reply = r.raw.read(1 << 20, decode_content=True) or b""
            if watch.fired:
                raise too_slow(url, watch)
            return HttpResult(r.status_code, dict(r.headers), bytes(reply))

    def stream_to(
        self,
        url: str,
        part: Path,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        expect_size: int | None = None,
        allow_http_hosts: Sequence[str] | None = None,
        fsync: bool = False,
    ) -> StreamResult:
        """Download ``url`` into ``part``, resuming from the bytes there; sha256 of the whole.

        A resume sends ``Range`` + ``If-Range`` (validators in ``<part>.meta``) and appends only
        a ``206`` that continues the same entity; anything else refetches whole, once. ``416``
        keeps a whole file. ``deadline`` bounds it (DOWNLOAD_TIMEOUT); ``cancel`` is checked
        between chunks; a size other than ``expect_size`` (CHECKSUM_MISMATCH) or over the free
        space (INSUFFICIENT_SPACE) is refused before a byte is written."""
        args = (timeout, deadline, progress, cancel, expect_size, allow_http_hosts, fsync)
        try:
            return self._stream_once(url, part, *args)
        except pf.BadResume:
            return self._stream_once(url, part, *args)  # the part is gone: the whole file

    def _stream_once(
        self,
        url: str,
        part: Path,
        timeout: float | None,
        deadline: float | None,
        progress: Progress | None,
        cancel: threading.Event | None,
        expect_size: int | None,
        allow_http_hosts: Sequence[str] | None,
        fsync: bool,
    ) -> StreamResult:
        meta_path = pf.meta_path(part)
        on_disk = have = part.stat().st_size if part.exists() else 0
        meta = pf.read_meta(meta_path) if have else {}
        validator = None if "segments" in meta else pf.if_range(meta)  # preallocated: restart
        headers = {"Accept-Encoding": "identity"}
        if have and validator:
            headers |= {"Range": f"bytes={have}-", "If-Range": validator}
        else:
            have = 0
        left = left_s(url, deadline)
        if timeout is not None:
            left = timeout if left is None else min(left, timeout)
        with self.request(url, headers, limit=left, allow_http_hosts=allow_http_hosts) as (
            r,
            watch,
        ):
            if r.status_code == 416:
                return pf.whole_or_discard(part, have, meta, r.headers, url)
            check_status(r.status_code, r.headers, url)
            resumed, total = pf.accept(r.status_code, r.headers, part, have, meta, url)
            if resumed and expect_size is not None and total != expect_size:
                pf.discard(part)
                raise pf.BadResume(
                    Code.DOWNLOAD_RETRIES_EXHAUSTED,
                    f"cannot resume {redact_url(url)}: its 206 says {total} B, the "
                    f"index {expect_size} B; partial file discarded",
                )
            if expect_size is not None and total is not None and total != expect_size:
                raise pf.wrong_size(url, total, expect_size)
            if total is not None:
                pf.check_space(part, total - resumed, freed=0 if resumed else on_disk)
            if not resumed:
                pf.discard(part)  # old bytes never sit under the new entity's meta
            pf.write_meta(meta_path, r.headers, total, url)
            return receive(
                r,
                part,
                resumed,
                total,
                url,
                Bounds(deadline, watch, expect_size),
                progress,
                cancel,
                fsync=fsync,
            )


def left_s(url: str, deadline: float | None) -> float | None:
    """Seconds left before ``deadline`` (monotonic; None: no deadline); none left is
    DOWNLOAD_TIMEOUT."""
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise TransientError(Code.DOWNLOAD_TIMEOUT, f"no time left to download {redact_url(url)}")
    return left
