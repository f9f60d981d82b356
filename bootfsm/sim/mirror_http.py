"""The HTTP side of :class:`mirror.Mirror`: server, request handler, ranges, faults applied.

Serves files with the headers a resuming downloader relies on (Content-Length, ETag,
Last-Modified, Accept-Ranges, single-range 206/416 and If-Range as RFC 9110 defines
them; a malformed or multi-range header is ignored and the full body served), answers
dynamic routes, and applies a path's fault while it writes the response.
"""

from __future__ import annotations

import contextlib
import email.utils
import io
import mimetypes
import os
import re
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO, Protocol
from urllib.parse import urlsplit

from bootfsm.sim.mirror_faults import (
    BadRange,
    Corrupt,
    DropMidBody,
    Fault,
    LogEntry,
    NotFound,
    RouteHandler,
    Stall,
    Status,
    Throttle,
)

__all__ = ["MirrorHandler", "MirrorServer", "MirrorServer6", "MirrorSide"]


class MirrorSide(Protocol):
    """What the handler uses of its :class:`mirror.Mirror` (named here, not imported,
    so that the two modules do not import each other)."""

    verbose: bool
    _routes: dict[str, RouteHandler]
    _required: dict[str, tuple[str, str]]
    _stopping: threading.Event

    def _begin(self, path: str) -> int: ...
    def _end(self, entry: LogEntry, slot: int) -> None: ...
    def _count_bytes(self, n: int) -> None: ...
    def _track(self, conn: socket.socket, *, add: bool) -> None: ...
    def _take_fault(self, path: str, method: str, *, resume: bool = False) -> Fault | None: ...
    def _resolve(self, url_path: str) -> Path | None: ...


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


class MirrorServer(ThreadingHTTPServer):
    daemon_threads = True
    mirror: MirrorSide

    def handle_error(self, request: object, client_address: object) -> None:
        if self.mirror.verbose:
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class MirrorServer6(MirrorServer):
    address_family = socket.AF_INET6


class MirrorHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30.0  # idle keep-alive connections close after this
    # TCP_NODELAY, as real mirrors send (nginx's tcp_nodelay is on by default): with
    # Nagle, a response's body waits for the ACK of its headers, and a delayed ACK holds
    # every small index and .deb back by ~40 ms
    disable_nagle_algorithm = True
    server: MirrorServer

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

    def _respond(self, mirror: MirrorSide, path: str) -> tuple[int, int]:
        m = _RANGE_RE.fullmatch((self.headers.get("Range") or "").strip())
        resume = m is not None and m.group(1) not in ("", "0")
        fault = mirror._take_fault(path, self.command, resume=resume)
        if isinstance(fault, NotFound):
            return self._plain(404, {}), 0
        if isinstance(fault, Status):
            extra = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
            return self._plain(fault.code, extra), 0
        route = mirror._routes.get(path)
        need = mirror._required.get(path)
        if route is not None and need is not None and self.headers.get(need[0]) != need[1]:
            body = b'{"error": "Bad request. Required metadata header not specified"}'
            self._head(400, {"Content-Type": "application/json; charset=utf-8",
                             "Content-Length": str(len(body))})  # fmt: skip
            return 400, self._body(io.BytesIO(body), 0, len(body), len(body), None)
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
            if isinstance(fault, BadRange):  # other bytes, framed honestly
                start = max(0, start - fault.shift)
                headers["Content-Range"] = f"bytes {start}-{end}/{size + fault.extra}"
                fault = None
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
