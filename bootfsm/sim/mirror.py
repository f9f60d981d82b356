"""A loopback HTTP mirror (stdlib only) with injectable faults, for the simulator.

:class:`Mirror` serves the files under a docroot on ``127.0.0.1:<ephemeral port>`` with
the headers a resuming downloader relies on (Content-Length, ETag, Last-Modified,
Accept-Ranges, single-range 206/416, If-Range), plus dynamic routes (IMDS, kubelet
``/healthz``). Faults added with :meth:`Mirror.add_fault` make chosen paths fail the
way real mirrors do: 404s, 503 bursts with Retry-After, a connection dropped mid-body,
corrupted bytes, a stall, a slow link.
"""

from __future__ import annotations

import contextlib
import email.utils
import io
import ipaddress
import mimetypes
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, NamedTuple
from urllib.parse import unquote, urlsplit

__all__ = [
    "Corrupt",
    "DropMidBody",
    "Fault",
    "LogEntry",
    "Mirror",
    "NotFound",
    "RouteHandler",
    "Stall",
    "Status",
    "Throttle",
]


@dataclass(frozen=True)
class NotFound:
    """Always answer 404."""


@dataclass(frozen=True)
class Status:
    """Answer ``code`` (with Retry-After if set) ``times`` times, then serve normally.

    retry_after is sent as ``%g`` of the float: integral values give standard
    delta-seconds; fractions ("0.1") keep tests fast but are non-standard.
    """

    code: int
    times: int = 1
    retry_after: float | None = None

    def __post_init__(self) -> None:
        if not 100 <= self.code <= 599 or self.times < 1:
            raise ValueError("Status needs 100 <= code <= 599 and times >= 1")


@dataclass(frozen=True)
class DropMidBody:
    """Send full headers, ``fraction`` of the body, then shut the connection (GET only)."""

    times: int = 1
    fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.times < 1 or not 0.0 <= self.fraction < 1.0:
            raise ValueError("DropMidBody needs times >= 1 and 0 <= fraction < 1")


@dataclass(frozen=True)
class Corrupt:
    """Serve the content with the byte at offset size//2 flipped (same length, same ETag)."""


@dataclass(frozen=True)
class Stall:
    """Send headers, then sleep ``seconds`` before the body (``times``; None = always)."""

    seconds: float
    times: int | None = None


@dataclass(frozen=True)
class Throttle:
    """Pace each response body to about ``bytes_per_second``."""

    bytes_per_second: int

    def __post_init__(self) -> None:
        if self.bytes_per_second < 1:
            raise ValueError("Throttle needs bytes_per_second >= 1")


Fault = NotFound | Status | DropMidBody | Corrupt | Stall | Throttle
RouteHandler = Callable[[], tuple[int, dict[str, str], bytes]]
_BODY_FAULTS = (DropMidBody, Corrupt, Stall, Throttle)


class LogEntry(NamedTuple):
    """One answered request; path excludes the query; bytes_sent counts body bytes."""

    method: str
    path: str
    status: int
    range_header: str | None
    bytes_sent: int


@dataclass
class _Rule:
    pattern: str
    fault: Fault
    remaining: int | None  # None: unlimited


_UNSATISFIABLE = (-1, -1)
_RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)")


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Inclusive (start, end) for one satisfiable range; _UNSATISFIABLE; None = ignore."""
    match = _RANGE_RE.fullmatch((header or "").strip())
    if match is None or match.group(1) == match.group(2) == "":
        return None  # absent, malformed or multi-range: serve the full body
    first, last = match.group(1), match.group(2)
    if first == "":  # suffix range: the last N bytes
        count = int(last)
        return (max(0, size - count), size - 1) if count > 0 and size > 0 else _UNSATISFIABLE
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if last and int(last) < start:
        return None  # invalid range-spec: ignored per RFC 9110
    return (start, end) if start < size else _UNSATISFIABLE


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    mirror: Mirror

    def handle_error(self, request: object, client_address: object) -> None:
        if self.mirror.verbose:
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30.0  # idle keep-alive connections close after this
    # TCP_NODELAY, as real mirrors send (nginx's tcp_nodelay is on by default): with
    # Nagle, a response's body waits for the ACK of its headers, and a delayed ACK holds
    # every small index and .deb back by ~40 ms
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        if self.server.mirror.verbose:
            super().log_message(format, *args)

    def setup(self) -> None:
        super().setup()
        self.server.mirror._track(self.connection, add=True)

    def finish(self) -> None:
        self.server.mirror._track(self.connection, add=False)
        super().finish()

    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _serve(self) -> None:
        mirror = self.server.mirror
        path = urlsplit(self.path).path
        slot = mirror._begin(path)
        status, sent = 500, 0
        try:
            status, sent = self._respond(mirror, path)
        finally:
            entry = LogEntry(self.command, path, status, self.headers.get("Range"), sent)
            mirror._end(entry, slot)

    def _respond(self, mirror: Mirror, path: str) -> tuple[int, int]:
        fault = mirror._take_fault(path, self.command)
        if isinstance(fault, NotFound):
            return self._plain(404, {}), 0
        if isinstance(fault, Status):
            extra = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
            return self._plain(fault.code, extra), 0
        route = mirror._routes.get(path)
        if route is not None:
            try:
                code, headers, body = route()
            except Exception:  # a broken route must not kill the server
                return self._plain(500, {}), 0
            self._head(code, {**headers, "Content-Length": str(len(body))})
            return code, self._body(io.BytesIO(body), 0, len(body), len(body), fault)
        file = mirror._resolve(path)
        if file is None:
            return self._plain(404, {}), 0
        with file.open("rb") as fh:
            return self._file(fh, file, fault)

    def _file(self, fh: BinaryIO, file: Path, fault: Fault | None) -> tuple[int, int]:
        st = os.fstat(fh.fileno())
        size = st.st_size
        etag = f'"{size:x}-{st.st_mtime_ns:x}"'
        last_modified = email.utils.formatdate(st.st_mtime, usegmt=True)
        headers = {
            "Content-Type": mimetypes.guess_type(file.name)[0] or "application/octet-stream",
            "ETag": etag,
            "Last-Modified": last_modified,
            "Accept-Ranges": "bytes",
        }
        wanted = _parse_range(self.headers.get("Range"), size)
        if_range = self.headers.get("If-Range")
        if wanted is not None and if_range and if_range.strip() not in (etag, last_modified):
            wanted = None  # validator changed: send the whole (new) entity
        if wanted == _UNSATISFIABLE:
            return self._plain(416, {**headers, "Content-Range": f"bytes */{size}"}), 0
        start, end, code = 0, size - 1, 200
        if wanted is not None:
            start, end, code = wanted[0], wanted[1], 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = end - start + 1
        self._head(code, {**headers, "Content-Length": str(length)})
        return code, self._body(fh, start, length, size, fault)

    def _plain(self, code: int, headers: dict[str, str]) -> int:
        """Answer code with a short text body (none for HEAD, 1xx, 204 and 304)."""
        bodyless = self.command == "HEAD" or code < 200 or code in (204, 304)
        body = b"" if bodyless else f"{code} {_reason(code)}\n".encode()
        length = {} if code < 200 or code == 204 else {"Content-Length": str(len(body))}
        self._head(code, {**headers, "Content-Type": "text/plain", **length})
        if body:
            self._write(body, count=False)
        return code

    def _head(self, code: int, headers: dict[str, str]) -> None:
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _write(self, data: bytes, *, count: bool = True) -> bool:
        try:
            self.wfile.write(data)
        except OSError:  # client went away
            self.close_connection = True
            return False
        if count:
            self.server.mirror._count_bytes(len(data))
        return True

    def _sendfile(self, src: io.BufferedReader, start: int, length: int) -> int:
        """A fault-free file body, zero-copy (the mirror is never a benchmark's bottleneck)."""
        try:
            sent = int(self.connection.sendfile(src, offset=start, count=length))
        except OSError:  # client went away; the file position tells how far it got
            sent = max(0, src.tell() - start)
        self.server.mirror._count_bytes(sent)
        if sent < length:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        return sent

    def _body(self, src: BinaryIO, start: int, length: int, size: int, fault: Fault | None) -> int:
        """Write length bytes of src from start, applying a body fault; return bytes sent."""
        if self.command == "HEAD":
            return 0
        if fault is None and isinstance(src, io.BufferedReader):
            return self._sendfile(src, start, length)
        mirror = self.server.mirror
        limit = int(length * fault.fraction) if isinstance(fault, DropMidBody) else length
        rate = fault.bytes_per_second if isinstance(fault, Throttle) else 0
        flip_at = size // 2 if isinstance(fault, Corrupt) else -1
        stopped = isinstance(fault, Stall) and mirror._stopping.wait(fault.seconds)
        chunk_size = max(1, min(64 * 1024, rate // 20)) if rate else 256 * 1024
        src.seek(start)
        sent, began = 0, time.monotonic()
        while sent < limit and not stopped:
            data = src.read(min(chunk_size, limit - sent))
            if not data:
                break
            offset = start + sent
            if offset <= flip_at < offset + len(data):
                buf = bytearray(data)
                buf[flip_at - offset] ^= 0xFF
                data = bytes(buf)
            if not self._write(data):
                return sent
            sent += len(data)
            if rate:
                delay = sent / rate - (time.monotonic() - began)
                stopped = delay > 0 and mirror._stopping.wait(delay)
        if sent < length:  # short body (DropMidBody, stop(), file shrank): end the connection
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        return sent


def _reason(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return "Status"


class Mirror:
    """Loopback HTTP mirror of ``docroot``; use as a context manager or start()/stop().

    Thread-safe: faults and routes may be added while it runs. Only loopback hosts are
    accepted. Files outside docroot (``..``, symlinks leading out) and directories are
    404. Fault rules are tried in insertion order; the first matching rule with uses
    left applies (path == pattern or path ends with pattern, query ignored). Faults and
    routes are checked before files, so faults also hit dynamic routes.
    """

    def __init__(self, docroot: Path, host: str = "127.0.0.1", *, verbose: bool = False) -> None:
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"Mirror binds loopback only, not {host!r}")
        self.docroot = docroot.resolve()
        self.host = host
        self.verbose = verbose
        self._lock = threading.Condition()
        self._rules: list[_Rule] = []
        self._routes: dict[str, RouteHandler] = {}
        self._counts: dict[str, int] = {}
        self._log: list[LogEntry | None] = []
        self._inflight = 0
        self._bytes_total = 0
        self._conns: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> Mirror:
        """Bind an ephemeral loopback port and serve from a daemon thread."""
        if self._server is not None:
            raise RuntimeError("mirror already started")
        cls = _Server6 if ":" in self.host else _Server
        server = cls((self.host, 0), _Handler)
        server.mirror = self
        self._stopping.clear()
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="bootfsm-mirror",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake stalled/throttled responses and close open connections."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Mirror:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL without a trailing slash, e.g. ``http://127.0.0.1:43123``."""
        if self._server is None:
            raise RuntimeError("mirror not started")
        port = self._server.server_address[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}"

    # ------------------------------------------------------------ configuration
    def add_fault(self, path_suffix: str, fault: Fault) -> None:
        """Apply fault to requests whose path equals or ends with path_suffix."""
        times = getattr(fault, "times", None)
        with self._lock:
            self._rules.append(_Rule(path_suffix, fault, times))

    def clear_faults(self) -> None:
        """Remove every fault rule."""
        with self._lock:
            self._rules.clear()

    def add_route(self, path: str, handler: RouteHandler) -> None:
        """Answer GET/HEAD on exactly path (query ignored) with handler() -> (code, headers, body).

        handler runs on a server thread per request; an exception becomes a 500.
        """
        with self._lock:
            self._routes[path] = handler

    # ------------------------------------------------------------ observation
    def requests(self, path_suffix: str) -> int:
        """Number of requests received so far whose path ends with path_suffix."""
        with self._lock:
            return sum(n for path, n in self._counts.items() if path.endswith(path_suffix))

    @property
    def log(self) -> list[LogEntry]:
        """Copy of the answered-request log (waits up to 1 s for in-flight requests)."""
        with self._lock:
            self._lock.wait_for(lambda: self._inflight == 0, timeout=1.0)
            return [e for e in self._log if e is not None]  # in order of arrival

    @property
    def bytes_sent_total(self) -> int:
        """Body bytes written to clients so far (waits up to 1 s for in-flight requests)."""
        with self._lock:
            self._lock.wait_for(lambda: self._inflight == 0, timeout=1.0)
            return self._bytes_total

    # ------------------------------------------------------------ handler hooks
    def _begin(self, path: str) -> int:
        """Count a request; its log slot (the log keeps arrival order, not finish order)."""
        with self._lock:
            self._counts[path] = self._counts.get(path, 0) + 1
            self._inflight += 1
            self._log.append(None)
            return len(self._log) - 1

    def _end(self, entry: LogEntry, slot: int) -> None:
        with self._lock:
            self._log[slot] = entry
            self._inflight -= 1
            self._lock.notify_all()

    def _count_bytes(self, n: int) -> None:
        with self._lock:
            self._bytes_total += n

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _take_fault(self, path: str, method: str) -> Fault | None:
        with self._lock:
            for rule in self._rules:
                if not path.endswith(rule.pattern) or rule.remaining == 0:
                    continue
                if method == "HEAD" and isinstance(rule.fault, _BODY_FAULTS):
                    continue  # body faults neither apply to nor are used up by HEAD
                if rule.remaining is not None:
                    rule.remaining -= 1
                return rule.fault
        return None

    def _resolve(self, url_path: str) -> Path | None:
        """Map a URL path to a regular file inside docroot, or None."""
        rel = unquote(url_path)
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if "\x00" in rel or ".." in parts or any("\\" in p for p in parts) or not parts:
            return None
        candidate = self.docroot.joinpath(*parts).resolve()
        if not candidate.is_relative_to(self.docroot) or not candidate.is_file():
            return None
        return candidate
