"""The network half of the I/O boundary: small GETs and resumable streaming downloads.

``requests`` is imported lazily so commands that never touch the network start fast.
The ``.part`` file bookkeeping and the hashing writer live in ``bootfsm.partfile``.
Failures are classified here once: connection errors, timeouts, short bodies and
408/429/5xx are ``TransientError``; 404 and other client errors are permanent.
Proxies come from the environment the ``Http`` was given (``https_proxy``,
``http_proxy``, ``all_proxy``, ``no_proxy``, either case), never for link-local
(metadata) or loopback hosts.
No URL query string (a signature) ever appears in an error message.

Bounds a hostile peer cannot stretch: every request has a total-time bound on the
monotonic clock (its own limit, or the transfer deadline) enforced by a watchdog that
shuts the request's sockets down, so trickled headers or a body of one byte every few
seconds end on time, not only a per-read timeout; a body longer than the size its index
states stops one byte past it; a redirect hop that leaves HTTPS, or that breaks
``allow_http_hosts``, is refused. Certificates verify against the node's system trust
store (the ``ca_file`` given), and a verification failure is its own permanent code.
"""

from __future__ import annotations

import email.utils
import errno
import http.client
import ipaddress
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bootfsm import partfile as pf
from bootfsm.codes import Code
from bootfsm.errors import BootError, TransientError
from bootfsm.http_wire import (
    SYSTEM_CA_BUNDLES,
    Bounds,
    Cancelled,
    Progress,
    Watch,
    check_redirect,
    check_url,
    receive,
    session_class,
    short,
    too_slow,
)
from bootfsm.partfile import CHUNK, StreamResult, partial_source, url_id
from bootfsm.redact import redact_url

if TYPE_CHECKING:
    import requests  # noqa: TID251

__all__ = [
    "SYSTEM_CA_BUNDLES",
    "Cancelled",
    "Http",
    "HttpResult",
    "StreamResult",
    "check_redirect",
    "check_url",
    "partial_source",
    "url_id",
]

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class HttpResult:
    """A small response read whole."""

    status: int
    headers: Mapping[str, str]
    body: bytes


def _never_proxied(url: str) -> bool:
    """Link-local (IMDS) and loopback (kubelet) hosts are always reached directly."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_link_local or ip.is_loopback


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP-date; None when absent or bad."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _env_proxies(env: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name in ("all", "http", "https", "no"):
        value = env.get(f"{name}_proxy") or env.get(f"{name.upper()}_PROXY")
        if value:
            out[name] = value
    return out


def _bypass(host: str, port: int | None, no_proxy: str) -> bool:
    """``no_proxy`` semantics: ``*``, host or domain suffix (``.example.com``), optional
    ``:port``, and IP networks in CIDR form (``10.0.0.0/8``)."""
    host = host.lower()
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if entry == "*":
            return True
        if not entry:
            continue
        if "/" in entry:
            try:
                if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name, _, want_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if want_port and (not want_port.isdigit() or int(want_port) != port):
            continue
        name = name.lstrip("*").lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False


class Http:
    """HTTP with bounded timeouts; proxies from ``env`` except for link-local/loopback."""

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
        ca_file: str = "",
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.ca_file = ca_file
        self._env = dict(os.environ if env is None else env)
        self._proxies = _env_proxies(self._env)
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
        )

    def close(self) -> None:
        """Close pooled connections (the next request opens new ones)."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def _sess(self) -> requests.Session:
        if self._session is None:
            s = session_class()()
            s.trust_env = False  # proxies and CA bundle come from self._env, never ~/.netrc
            s.headers["User-Agent"] = "bootfsm"
            self._session = s
        return self._session

    def proxy_for(self, url: str) -> str | None:
        """The proxy a request to ``url`` goes through, or None (direct)."""
        if _never_proxied(url):
            return None
        parts = urlsplit(url)
        if _bypass(parts.hostname or "", parts.port, self._proxies.get("no", "")):
            return None
        return self._proxies.get(parts.scheme) or self._proxies.get("all")

    def _kwargs(self, url: str, timeout: float | None) -> dict[str, Any]:
        read = self.read_timeout if timeout is None else min(self.read_timeout, timeout)
        conn = self.connect_timeout if timeout is None else min(self.connect_timeout, timeout)
        proxy = self.proxy_for(url)
        scheme = urlsplit(url).scheme
        return {
            "timeout": (max(conn, 0.05), max(read, 0.05)),
            "proxies": {scheme: proxy} if proxy else {},
            "verify": self._verify,
        }

    def _classify(
        self, exc: BaseException, url: str, watch: Watch | None = None
    ) -> TransientError | BootError:
        if watch is not None and watch.fired:
            return too_slow(url, watch)
        text = str(exc)
        if "TLS CA certificate bundle" in text:  # requests: the CA file does not exist
            return BootError(
                Code.TLS_VERIFY_FAILED,
                f"cannot verify {redact_url(url)}: CA file {self._verify} does not exist",
            )
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            why = short(exc)
            clock = " (the clock may not be synced yet)" if "not yet valid" in text else ""
            return BootError(
                Code.TLS_VERIFY_FAILED,
                f"TLS certificate of {redact_url(url)} did not verify{clock}: {why}; "
                f"trust store: {self._verify if isinstance(self._verify, str) else 'certifi'}",
            )
        return TransientError(
            Code.DOWNLOAD_RETRIES_EXHAUSTED,
            f"{type(exc).__name__} fetching {redact_url(url)}: {short(exc)}",
        )

    def _check_status(self, status: int, headers: Mapping[str, str], url: str) -> None:
        if status < 400:
            return
        if status in _TRANSIENT_STATUS:
            raise TransientError(
                Code.DOWNLOAD_RETRIES_EXHAUSTED,
                f"HTTP {status} from {redact_url(url)}",
                retry_after=_retry_after(headers),
            )
        raise BootError(
            Code.ARTIFACT_NOT_FOUND, f"HTTP {status} from {redact_url(url)}", status=status
        )

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
        """GET a small resource whole; raise Transient/BootError on failure when ``check``.

        With ``allow_http_hosts`` the final URL (after redirects) must pass ``check_url``.
        """
        import requests  # noqa: TID251

        total = timeout if timeout is not None else self.connect_timeout + self.read_timeout
        session = self._sess()
        session.allow_http_hosts = allow_http_hosts  # type: ignore[attr-defined]
        with Watch(total) as watch:
            try:
                with session.get(
                    url, headers=dict(headers or {}), stream=True, **self._kwargs(url, timeout)
                ) as r:
                    if allow_http_hosts is not None:
                        check_url(r.url, allow_http_hosts)
                    if check:
                        self._check_status(r.status_code, r.headers, url)
                    body = bytearray()
                    for chunk in r.iter_content(CHUNK):
                        body += chunk
                        if len(body) > max_bytes:
                            raise BootError(
                                Code.INDEX_INVALID,
                                f"{redact_url(url)} is larger than {max_bytes} B",
                            )
                    if watch.fired:
                        raise too_slow(url, watch)
                    return HttpResult(r.status_code, dict(r.headers), bytes(body))
            except (requests.RequestException, OSError) as exc:
                raise self._classify(exc, url, watch) from exc

    def post(
        self,
        url: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> HttpResult:
        """POST ``body`` once (no retries, no redirects); the response body is capped at 1 MiB.

        Raises ``TransientError`` when the request cannot be made; the caller reads the
        status (no status is turned into an exception here).
        """
        import requests  # noqa: TID251

        total = timeout if timeout is not None else self.connect_timeout + self.read_timeout
        with Watch(total) as watch:
            try:
                with self._sess().post(
                    url,
                    data=body,
                    headers=dict(headers or {}),
                    stream=True,
                    allow_redirects=False,
                    **self._kwargs(url, timeout),
                ) as r:
                    reply = r.raw.read(1 << 20, decode_content=True) or b""
                    if watch.fired:
                        raise too_slow(url, watch)
                    return HttpResult(r.status_code, dict(r.headers), bytes(reply))
            except (requests.RequestException, OSError) as exc:
                raise self._classify(exc, url, watch) from exc

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
        """Download ``url`` into ``part``, resuming from bytes already there.

        A sidecar ``<part>.meta`` holds the validators (ETag, Last-Modified), total size
        and source of the bytes on disk; a resume sends ``Range`` with ``If-Range`` and
        accepts only a ``206`` for the same entity whose Content-Range starts where the
        file ends. ``200`` (Range ignored or the artifact changed) restarts from zero; a
        ``416`` keeps a file that is already whole, else discards it (transient). The
        sha256 returned covers the whole file, the resumed prefix included.

        ``deadline`` (monotonic) bounds the whole transfer (DOWNLOAD_TIMEOUT, transient);
        ``cancel`` is checked between chunks (``Cancelled``). A body whose size differs
        from ``expect_size`` is refused before any byte is written (CHECKSUM_MISMATCH),
        as is one larger than the free space (INSUFFICIENT_SPACE). ``fsync`` makes the
        bytes durable before returning (the caller re-verifies on every use either way).
        """
        import requests  # noqa: TID251

        meta_path = pf.meta_path(part)
        on_disk = have = part.stat().st_size if part.exists() else 0
        meta = pf.read_meta(meta_path) if have else {}
        validator = None if "segments" in meta else pf.if_range(meta)  # preallocated: restart
        headers = {"Accept-Encoding": "identity"}
        if have and validator:
            headers |= {"Range": f"bytes={have}-", "If-Range": validator}
        else:
            have = 0
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TransientError(
                Code.DOWNLOAD_TIMEOUT, f"no time left to download {redact_url(url)}"
            )
        if timeout is not None:
            left = timeout if left is None else min(left, timeout)
        session = self._sess()
        session.allow_http_hosts = allow_http_hosts  # type: ignore[attr-defined]
        with Watch(left) as watch:
            try:
                with session.get(url, headers=headers, stream=True, **self._kwargs(url, left)) as r:
                    if allow_http_hosts is not None:
                        check_url(r.url, allow_http_hosts)
                    if r.status_code == 416:
                        return pf.whole_or_discard(part, have, meta, r.headers, url)
                    self._check_status(r.status_code, r.headers, url)
                    resumed, total = pf.accept(r.status_code, r.headers, part, have, meta, url)
                    if expect_size is not None and total is not None and total != expect_size:
                        raise BootError(
                            Code.CHECKSUM_MISMATCH,
                            f"{redact_url(url)} is {total} B but its index says {expect_size} B",
                            wrong_size=True,
                        )
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
            except (requests.RequestException, OSError) as exc:
                raise self._classify(exc, url, watch) from exc

    # -- segmented downloads -------------------------------------------------------------
    def stream_segmented(
        self,
        url: str,
        part: Path,
        *,
        size: int,
        segments: int,
        deadline: float | None = None,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        allow_http_hosts: Sequence[str] | None = None,
        fsync: bool = False,
    ) -> StreamResult:
        """Download ``url`` (``size`` B per its index) on up to ``segments`` connections.

        The first unfinished segment's ranged request is the probe: a ``206`` for the
        whole entity of ``size`` B starts the other segments, each its own request (its
        own watchdog, ``If-Range`` with the probe's validator, reads capped at its
        range) writing at its offset in one preallocated ``part``; the sidecar records
        each segment's progress, so a later attempt asks only for the missing ranges. A
        ``200`` to the probe (Range ignored) is read whole on that one connection, as
        ``stream_to`` would; a ``200`` to a resume (the entity changed) starts over.
        The sha256 covers the whole file as it is on disk. Errors are those of
        ``stream_to``; a failed or cancelled segment stops the others and keeps the rest.
        """
        for _ in range(2):  # a resume whose entity changed starts over once
            res = self._segmented_once(
                url, part, size, segments, deadline, progress, cancel, allow_http_hosts, fsync
            )
            if res is not None:
                return res
        raise TransientError(  # pragma: no cover - the second try never resumes
            Code.DOWNLOAD_RETRIES_EXHAUSTED, f"{redact_url(url)} changed twice"
        )

    def _segmented_once(
        self,
        url: str,
        part: Path,
        size: int,
        count: int,
        deadline: float | None,
        progress: Progress | None,
        cancel: threading.Event | None,
        allow_http_hosts: Sequence[str] | None,
        fsync: bool,
    ) -> StreamResult | None:
        import requests  # noqa: TID251

        meta_file = pf.meta_path(part)
        meta = pf.read_meta(meta_file) if part.exists() else {}
        segs = pf.resume_segments(meta, size) if meta else None
        validator = pf.if_range(meta) if segs is not None else None
        if segs is None or validator is None or meta.get("source") != url_id(url):
            segs, validator = pf.segment_plan(size, count), None
        first = next((i for i, (s, e, d) in enumerate(segs) if s + d < e), None)
        if first is None:  # every segment on disk: hash it as it is
            return self._segments(
                None,
                part,
                segs,
                -1,
                size,
                url,
                _Plan(deadline, progress, cancel, allow_http_hosts, fsync, {}, count),
            )
        left = _left(url, deadline)
        start, end, done = segs[first]
        headers = {"Accept-Encoding": "identity", "Range": f"bytes={start + done}-{end - 1}"}
        if validator:
            headers["If-Range"] = validator
        session = self._sess()
        session.allow_http_hosts = allow_http_hosts  # type: ignore[attr-defined]
        with Watch(left) as watch:
            try:
                with session.get(url, headers=headers, stream=True, **self._kwargs(url, left)) as r:
                    if allow_http_hosts is not None:
                        check_url(r.url, allow_http_hosts)
                    self._check_status(r.status_code, r.headers, url)
                    if r.status_code == 200 and validator:
                        pf.discard(part)  # the entity changed: start over
                        return None
                    bounds = Bounds(deadline, watch, size)
                    if r.status_code != 206:  # Range ignored: this response is the download
                        return self._whole(r, part, size, url, bounds, progress, cancel, fsync)
                    got, total = pf.content_range(r.headers.get("Content-Range", ""))
                    if total != size:
                        raise BootError(
                            Code.CHECKSUM_MISMATCH,
                            f"{redact_url(url)} is {total} B but its index says {size} B",
                            wrong_size=True,
                        )
                    if got != start + done or (validator and not pf.same_entity(meta, r.headers)):
                        pf.discard(part)
                        raise TransientError(
                            Code.DOWNLOAD_RETRIES_EXHAUSTED,
                            f"cannot resume {redact_url(url)} in segments: the server "
                            "answered another range or entity; partial file discarded",
                        )
                    if not validator:
                        pf.check_space(part, size, freed=_file_size(part))
                        pf.discard(part)
                    plan = _Plan(
                        deadline, progress, cancel, allow_http_hosts, fsync, dict(r.headers), count
                    )
                    _io(part, lambda: pf.write_segments(meta_file, r.headers, size, url, segs))
                    return self._segments((r, watch), part, segs, first, size, url, plan)
            except (requests.RequestException, OSError) as exc:
                raise self._classify(exc, url, watch) from exc

    def _whole(
        self,
        r: Any,
        part: Path,
        size: int,
        url: str,
        bounds: Bounds,
        progress: Progress | None,
        cancel: threading.Event | None,
        fsync: bool,
    ) -> StreamResult:
        """A 200 to the probe: the whole body on this connection, as ``stream_to`` reads it."""
        total = _int(r.headers.get("Content-Length"))
        if total is not None and total != size:
            raise BootError(
                Code.CHECKSUM_MISMATCH,
                f"{redact_url(url)} is {total} B but its index says {size} B",
                wrong_size=True,
            )
        pf.check_space(part, size, freed=_file_size(part))
        pf.discard(part)
        pf.write_meta(pf.meta_path(part), r.headers, total, url)
        return receive(r, part, 0, total, url, bounds, progress, cancel, fsync=fsync)

    def _segments(
        self,
        probe: tuple[Any, Watch] | None,
        part: Path,
        segs: list[list[int]],
        first: int,
        size: int,
        url: str,
        plan: _Plan,
    ) -> StreamResult:
        """Receive every unfinished segment (``first`` on ``probe``, the others on their
        own connections) into ``part``; hash the file in order as its prefix completes."""
        try:
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise pf.write_error(part, exc) from exc
        state = _Segs(self, part, url, size, plan)
        threads: list[threading.Thread] = []
        try:
            _io(part, lambda: _preallocate(fd, size))
            fr = pf.Frontier(fd, segs, size)
            state.frontier, state.fd = fr, fd
            resumed = fr.done()
            state.resumed = resumed
            state.queue = [i for i, (s, e, d) in enumerate(segs) if i != first and s + d < e]
            state.queue.reverse()  # popped from the end: in file order
            for _ in range(min(plan.connections - 1, len(state.queue))):
                t = threading.Thread(target=state.worker, name="bootfsm-seg", daemon=True)
                t.start()
                threads.append(t)
            if probe is not None:
                state.guard(lambda: state.pump(probe[0], first, probe[1]))
                probe[0].close()
            state.guard(lambda: state.pieces(self))
            for t in threads:
                t.join()
            if state.errors:
                fr.stop()
                if state.changed:
                    pf.discard(part)
                else:
                    state.save(force=True)
                raise _first(state.errors)
            try:
                sha = fr.finish()
                if plan.fsync:
                    os.fsync(fd)
            except OSError as exc:
                raise pf.write_error(part, exc) from exc
            state.save(force=True)
            return StreamResult(size, sha, resumed, size - resumed)
        finally:
            state.halt()  # on any way out, no receiver writes to fd once it is closed
            for t in threads:
                t.join()
            if state.frontier is not None:
                state.frontier.stop()
            os.close(fd)


@dataclass(frozen=True)
class _Plan:
    """What bounds every segment of one segmented download."""

    deadline: float | None
    progress: Progress | None
    cancel: threading.Event | None
    allow_http_hosts: Sequence[str] | None
    fsync: bool
    headers: dict[str, str]  # the probe's: validators every other segment must match
    connections: int


class _Aborted(Exception):
    """Another segment failed: this one stops (its bytes so far are kept)."""


_SAVE_EVERY_S = 0.5


class _Segs:
    """The segments of one download in flight: their receivers, errors and sidecar."""

    def __init__(self, http: Http, part: Path, url: str, size: int, plan: _Plan) -> None:
        self.http = http
        self.part = part
        self.url = url
        self.size = size
        self.plan = plan
        self.frontier: pf.Frontier | None = None
        self.fd = -1
        self.resumed = 0
        self.errors: list[BaseException] = []
        self.queue: list[int] = []  # pieces no connection has taken yet, last = next
        self.changed = False  # a segment saw another entity: the part is discarded
        self._abort = threading.Event()  # take no new piece
        self._halt = threading.Event()  # stop mid-piece too (permanent error, cancel)
        self._lock = threading.Lock()
        self._saved = time.monotonic()

    def save(self, *, force: bool = False) -> None:
        """Write the sidecar with every segment's progress (at most every 0.5 s)."""
        if self.frontier is None:
            return
        with self._lock:
            now = time.monotonic()
            if not force and now - self._saved < _SAVE_EVERY_S:
                return
            self._saved = now
            segs = self.frontier.snapshot()
            _io(
                self.part,
                lambda: pf.write_segments(
                    pf.meta_path(self.part), self.plan.headers, self.size, self.url, segs
                ),
            )

    def halt(self) -> None:
        """Stop every receiver at its next chunk (no-op once they are done)."""
        self._abort.set()
        self._halt.set()

    def guard(self, fn: Callable[[], None]) -> None:
        """Run segments; after an error no piece is taken (a transient error lets the
        others finish the piece they hold: its bytes are already on the way)."""
        try:
            fn()
        except _Aborted:
            pass
        except BaseException as exc:  # re-raised on the calling thread
            with self._lock:
                self.errors.append(exc)
            self._abort.set()
            if not isinstance(exc, TransientError) or self.changed:
                self._halt.set()  # a transient one lets the others finish their piece

    def worker(self) -> None:
        client = self.http.clone()
        try:
            self.guard(lambda: self.pieces(client))
        finally:
            client.close()

    def pieces(self, client: Http) -> None:
        """Take the next piece in file order and fetch it, until none is left."""
        while not self._abort.is_set():
            with self._lock:
                if not self.queue:
                    return
                i = self.queue.pop()
            self._request(client, i)

    def _request(self, client: Http, i: int) -> None:
        import requests  # noqa: TID251

        assert self.frontier is not None
        start, end, done = self.frontier.segments[i]
        url, plan = self.url, self.plan
        headers = {"Accept-Encoding": "identity", "Range": f"bytes={start + done}-{end - 1}"}
        validator = pf.if_range(
            {"etag": plan.headers.get("ETag"), "last_modified": plan.headers.get("Last-Modified")}
        )
        if validator:
            headers["If-Range"] = validator
        left = _left(url, plan.deadline)
        session = client._sess()
        session.allow_http_hosts = plan.allow_http_hosts  # type: ignore[attr-defined]
        with Watch(left) as watch:
            try:
                with session.get(
                    url, headers=headers, stream=True, **client._kwargs(url, left)
                ) as r:
                    if plan.allow_http_hosts is not None:
                        check_url(r.url, plan.allow_http_hosts)
                    client._check_status(r.status_code, r.headers, url)
                    got, total = pf.content_range(r.headers.get("Content-Range", ""))
                    same = not validator or pf.same_entity(
                        {
                            "etag": plan.headers.get("ETag"),
                            "last_modified": plan.headers.get("Last-Modified"),
                        },
                        r.headers,
                    )
                    if (
                        r.status_code != 206
                        or got != start + done
                        or total != self.size
                        or not same
                    ):
                        self.changed = True
                        raise TransientError(
                            Code.DOWNLOAD_RETRIES_EXHAUSTED,
                            f"{redact_url(url)} changed during a segmented download "
                            f"(HTTP {r.status_code} for bytes {start + done}-{end - 1}); "
                            "partial file discarded",
                        )
                    self.pump(r, i, watch)
            except (requests.RequestException, OSError) as exc:
                raise client._classify(exc, url, watch) from exc

    def pump(self, r: Any, i: int, watch: Watch) -> None:
        """Read segment ``i``'s body into its range of the file, never past its end."""
        import urllib3

        read_errors = (http.client.HTTPException, OSError, urllib3.exceptions.HTTPError)
        fr, plan, url = self.frontier, self.plan, self.url
        assert fr is not None
        start, end, _ = fr.segments[i]
        fp = getattr(r.raw, "_fp", None)
        read_into = getattr(fp, "readinto", None)
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while (pos := start + fr.segments[i][2]) < end:
            if plan.cancel is not None and plan.cancel.is_set():
                raise Cancelled(f"download of {redact_url(url)} cancelled")
            if self._halt.is_set():
                raise _Aborted
            if watch.fired or (plan.deadline is not None and time.monotonic() > plan.deadline):
                raise TransientError(
                    Code.DOWNLOAD_TIMEOUT,
                    f"{redact_url(url)} did not finish within its time limit "
                    f"({fr.done()} B so far)",
                )
            cap = min(len(buf), end - pos)
            try:
                if read_into is not None:
                    n = int(read_into(view[:cap]))
                else:
                    data = r.raw.read(cap, decode_content=False)
                    n = len(data)
                    buf[:n] = data
            except read_errors as exc:
                if watch.fired:
                    raise too_slow(url, watch) from exc
                raise TransientError(
                    Code.DOWNLOAD_RETRIES_EXHAUSTED,
                    f"{type(exc).__name__} reading {redact_url(url)} at byte {pos}: {short(exc)}",
                ) from exc
            if not n:
                if watch.fired:
                    raise too_slow(url, watch)
                raise TransientError(
                    Code.DOWNLOAD_RETRIES_EXHAUSTED,
                    f"short body from {redact_url(url)}: bytes {start}-{end - 1} stopped at {pos}",
                )
            written = 0
            while written < n:
                try:
                    written += os.pwrite(self.fd, view[written:n], pos + written)
                except OSError as exc:
                    raise pf.write_error(self.part, exc) from exc
            fr.advance(i, n)
            if plan.progress is not None:
                plan.progress(fr.done(), self.size)
            self.save()
        if fp is not None and fp.isclosed():  # body read to its end: keep the connection
            r.raw.release_conn()


def _left(url: str, deadline: float | None) -> float | None:
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        raise TransientError(Code.DOWNLOAD_TIMEOUT, f"no time left to download {redact_url(url)}")
    return left


def _file_size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _io(part: Path, fn: Callable[[], None]) -> None:
    try:
        fn()
    except OSError as exc:
        raise pf.write_error(part, exc) from exc


def _preallocate(fd: int, size: int) -> None:
    """Reserve the file's blocks (a full disk fails now, not mid-segment)."""
    if os.fstat(fd).st_size == size:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)


def _first(errors: list[BaseException]) -> BaseException:
    """The error to raise for a failed segmented download: a permanent one first."""
    for e in errors:
        if isinstance(e, BootError):
            return e
    for e in errors:
        if not isinstance(e, Cancelled):
            return e
    return errors[0]
