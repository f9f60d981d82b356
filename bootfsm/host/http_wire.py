"""The wire under ``bootfsm.host.http``: watched sessions, the redirect policy, ``receive``.

A request's ``Watch`` shuts its sockets down when its total time is up, so a trickling
peer cannot outlive the bound; every redirect hop passes ``check_redirect``."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_url
from bootfsm.host import partfile as pf
from bootfsm.host.partfile import StreamResult

__all__ = [
    "Bounds",
    "Cancelled",
    "Progress",
    "Watch",
    "check_redirect",
    "check_url",
    "read_body",
    "read_errors",
    "read_failed",
    "receive",
    "session_class",
    "short",
    "too_slow",
]

Progress = Callable[[int, "int | None"], None]


class Cancelled(Exception):
    """The download was stopped by its cancel event; the ``.part`` file stays resumable."""


def check_url(url: str, allow_http_hosts: Sequence[str]) -> None:
    """Refuse any URL that is not HTTPS unless its host is explicitly allowed."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return
    if parts.scheme == "http" and (parts.hostname or "") in set(allow_http_hosts):
        return
    raise BootError(
        Code.INSECURE_URL_REFUSED,
        f"refusing {parts.scheme or 'schemeless'} URL {redact_url(url)}: HTTPS required "
        f"(host {parts.hostname!r} is not in fetch.allow_http_hosts)",
    )


_local = threading.local()


class Watch:
    """Shuts down the sockets of one request when its total time is up. It holds sockets, not
    connections: ``http.client`` drops ``conn.sock`` after ``Connection: close``."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.fired = False
        self._conns: list[Any] = []
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._end: float | None = None

    def add(self, conn: Any) -> None:
        """Watch ``conn`` (a connection whose ``sock`` may come and go, or a socket)."""
        sock = conn if isinstance(conn, socket.socket) else getattr(conn, "sock", None)
        with self._lock:
            if not isinstance(conn, socket.socket):
                self._conns.append(conn)
            if isinstance(sock, socket.socket) and all(sock is not s for s in self._socks):
                self._socks.append(sock)
            if self.fired:
                self._shut_all()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            self._shut_all()

    def spent(self) -> bool:
        """The request's time is up: the watch fired, or is due (a read timeout capped
        at the same limit can end the read a hair before the timer does)."""
        return self.fired or (self._end is not None and time.monotonic() >= self._end - 0.01)

    def _shut_all(self) -> None:
        socks = list(self._socks)
        for conn in self._conns:
            sock = getattr(conn, "sock", None)
            if isinstance(sock, socket.socket) and all(sock is not s for s in socks):
                socks.append(sock)
        for sock in socks:
            _shut(sock)

    def __enter__(self) -> Watch:
        _local.watch = self
        if self.seconds is not None:
            self._end = time.monotonic() + max(self.seconds, 0.0)
            self._timer = threading.Timer(max(self.seconds, 0.0), self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        _local.watch = None


def _shut(sock: socket.socket) -> None:
    """Wake a read blocked on ``sock``: it returns what it has, then end of file.

    Read side only: a FIN would make Linux answer the peer with a reset, which drops the
    bytes the read had (nothing kept to resume). On the kernel socket, not the TLS one
    (``SSLSocket.shutdown`` let queued ciphertext through as body). Closed: skipped."""
    if sock.fileno() < 0:
        return
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RD)


def _register(conn: Any) -> None:
    watch: Watch | None = getattr(_local, "watch", None)
    if watch is not None:
        watch.add(conn)


_SESSION_CLASS: Any = None


def session_class() -> Any:
    """A requests Session whose connections report to the watch and whose redirects
    keep the transport policy (built on first use: requests is imported lazily)."""
    global _SESSION_CLASS
    if _SESSION_CLASS is not None:
        return _SESSION_CLASS
    import requests  # noqa: TID251
    import requests.adapters  # noqa: TID251
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class Watched:
        def connect(self) -> None:
            _register(self)
            super().connect()  # type: ignore[misc]
            _register(self)  # the socket the response is read from (TLS: once wrapped)

        def request(self, *args: Any, **kwargs: Any) -> None:
            _register(self)
            super().request(*args, **kwargs)  # type: ignore[misc]

    class WatchedHTTP(Watched, HTTPConnection): ...

    class WatchedHTTPS(Watched, HTTPSConnection): ...

    class Pool(HTTPConnectionPool):
        ConnectionCls = WatchedHTTP

    class PoolS(HTTPSConnectionPool):
        ConnectionCls = WatchedHTTPS

    pools = {"http": Pool, "https": PoolS}

    class Adapter(requests.adapters.HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
            manager = super().proxy_manager_for(proxy, **kwargs)
            manager.pool_classes_by_scheme = pools
            return manager

    class Session(requests.Session):
        allow_http_hosts: Sequence[str] | None = None

        def __init__(self) -> None:
            super().__init__()
            self.mount("http://", Adapter())
            self.mount("https://", Adapter())

        def get_redirect_target(self, resp: Any) -> str | None:
            target: str | None = super().get_redirect_target(resp)
            if target:
                check_redirect(resp.url, urljoin(resp.url, target), self.allow_http_hosts)
            return target

    _SESSION_CLASS = Session
    return Session


def check_redirect(src: str, dest: str, allow_http_hosts: Sequence[str] | None) -> None:
    """Refuse a redirect hop from HTTPS to anything else, or one ``check_url`` refuses."""
    if urlsplit(src).scheme == "https" and urlsplit(dest).scheme != "https":
        raise BootError(
            Code.INSECURE_URL_REFUSED,
            f"refusing a redirect from {redact_url(src)} to {redact_url(dest)}: "
            "a redirect may not leave HTTPS",
        )
    if allow_http_hosts is not None:
        check_url(dest, allow_http_hosts)


@dataclass(frozen=True)
class Bounds:
    """What limits one body: its deadline, its watchdog, the size its index states."""

    deadline: float | None
    watch: Watch
    expect_size: int | None

    def check(self, url: str, so_far: int) -> None:
        """DOWNLOAD_TIMEOUT once the watch fired or the deadline passed."""
        if self.watch.fired or (self.deadline is not None and time.monotonic() > self.deadline):
            raise TransientError(
                Code.DOWNLOAD_TIMEOUT,
                f"{redact_url(url)} did not finish within its time limit ({so_far} B so far)",
            )

    def room(self, url: str, done: int, cap: int) -> int:
        """How much of a ``cap`` B buffer the next read may fill (one byte past the index's
        size at most); a body already past it is refused."""
        if self.expect_size is None:
            return cap
        if done > self.expect_size:
            raise BootError(
                Code.CHECKSUM_MISMATCH,
                f"{redact_url(url)} sent more than the {self.expect_size} B its "
                "index says (stopped one byte past it)",
                wrong_size=True,
            )
        return min(cap, self.expect_size + 1 - done)


def too_slow(url: str, watch: Watch) -> TransientError:
    return TransientError(
        Code.DOWNLOAD_TIMEOUT,
        f"{redact_url(url)} did not finish within its total time limit "
        f"({round(watch.seconds or 0, 1):g} s)",
    )


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading a body raises when the peer or the watch ends it."""
    import urllib3

    return (http.client.HTTPException, OSError, urllib3.exceptions.HTTPError)


def read_failed(url: str, watch: Watch, exc: BaseException, where: str) -> TransientError:
    """The error for a failed body read (``where``: how far it got)."""
    if watch.fired:  # the watch shut the socket: the time is up
        return too_slow(url, watch)
    return TransientError(
        Code.DOWNLOAD_RETRIES_EXHAUSTED,
        f"{type(exc).__name__} reading {redact_url(url)} {where}: {short(exc)}",
    )


def receive(
    r: Any,
    part: Path,
    resumed: int,
    total: int | None,
    url: str,
    bounds: Bounds,
    progress: Progress | None,
    cancel: threading.Event | None,
    *,
    fsync: bool,
) -> StreamResult:
    """Stream the body after ``resumed`` bytes into ``part``; hash all of it. Plain bodies
    are read straight into the writer's buffers; encoded ones through urllib3's decoder."""
    digest = hashlib.sha256()
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | (0 if resumed else os.O_TRUNC)
    encoded = r.headers.get("Content-Encoding", "identity") not in ("", "identity")
    with open(os.open(part, flags, 0o600), "r+b") as fh:
        if resumed:
            while block := fh.read(min(1 << 20, resumed - fh.tell())):
                digest.update(block)
            fh.seek(resumed)
            fh.truncate()
        writer = pf.PartWriter(fh, digest)
        try:
            done = _pump(r, encoded, writer, resumed, total, url, bounds, progress, cancel)
        finally:
            pf.guarded_io(part, writer.close)
        pf.guarded_io(part, fh.flush)
        if fsync:
            pf.guarded_io(part, lambda: os.fsync(fh.fileno()))
    if bounds.watch.fired:
        raise too_slow(url, bounds.watch)
    if not encoded and total is not None and done != total:
        raise TransientError(
            Code.DOWNLOAD_RETRIES_EXHAUSTED,
            f"short body from {redact_url(url)}: {done} of {total} B",
        )
    return StreamResult(done, digest.hexdigest(), resumed, done - resumed)


def _pump(
    r: Any,
    encoded: bool,
    writer: pf.PartWriter,
    done: int,
    total: int | None,
    url: str,
    bounds: Bounds,
    progress: Progress | None,
    cancel: threading.Event | None,
) -> int:
    """Read the body into ``writer`` to its end; the bytes in the file after it."""
    read_into = None if encoded else getattr(getattr(r.raw, "_fp", None), "readinto", None)
    while True:
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"download of {redact_url(url)} cancelled")
        bounds.check(url, done)
        cap = bounds.room(url, done, pf.CHUNK)
        buf = writer.buffer()
        try:
            n = read_body(r, read_into, buf, cap, decode=True)
        except read_errors() as exc:
            writer.give_back(buf)
            raise read_failed(url, bounds.watch, exc, f"after {done} B") from exc
        if not n:
            writer.give_back(buf)
            return done
        writer.put(buf, n)
        done += n
        if progress is not None:
            progress(done, total)


def read_body(
    r: Any, read_into: Callable[[Any], int] | None, buf: bytearray, cap: int, *, decode: bool
) -> int:
    """Fill at most ``cap`` bytes of ``buf`` from the body; 0 at the end."""
    if read_into is not None:
        return int(read_into(memoryview(buf)[:cap] if cap < len(buf) else buf))
    data = r.raw.read(cap, decode_content=decode)
    buf[: len(data)] = data  # decoded bodies are rare: one copy keeps memory bounded
    return len(data)


_QUERY = re.compile(r"\?[^\s'\"()<>]*")
_USERINFO = re.compile(r"//[^/\s@'\"]+@")


def short(exc: BaseException) -> str:
    """An exception's text, bounded, with URL query strings and credentials removed."""
    text = _USERINFO.sub("//", _QUERY.sub("?<redacted>", str(exc)))
    return text if len(text) < 300 else text[:300] + "..."
