"""A loopback HTTP mirror (stdlib only) with injectable faults, for the simulator.

:class:`Mirror` serves the files under a docroot on ``127.0.0.1:<ephemeral port>`` with
the headers a resuming downloader relies on (Content-Length, ETag, Last-Modified,
Accept-Ranges, single-range 206/416, If-Range), plus dynamic routes (IMDS, kubelet
``/healthz``). Faults added with :meth:`Mirror.add_fault` make chosen paths fail the
way real mirrors do: 404s, 503 bursts with Retry-After, a connection dropped mid-body,
corrupted bytes, a stall, a slow link. The faults live in :mod:`mirror_faults` (re-exported
here), the HTTP server and handler in :mod:`mirror_http`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from pathlib import Path
from types import TracebackType
from urllib.parse import unquote

from bootfsm.sim.mirror_faults import (
    BODY_FAULTS,
    BadRange,
    Corrupt,
    DropMidBody,
    Fault,
    LogEntry,
    NotFound,
    RouteHandler,
    Rule,
    Stall,
    Status,
    Throttle,
)
from bootfsm.sim.mirror_http import MirrorHandler, MirrorServer, MirrorServer6

__all__ = [
    "BadRange",
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
        self._rules: list[Rule] = []
        self._routes: dict[str, RouteHandler] = {}
        self._required: dict[str, tuple[str, str]] = {}
        self._counts: dict[str, int] = {}
        self._log: list[LogEntry | None] = []
        self._inflight = 0
        self._peak = 0
        self._bytes_total = 0
        self._conns: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._server: MirrorServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> Mirror:
        """Bind an ephemeral loopback port and serve from a daemon thread."""
        if self._server is not None:
            raise RuntimeError("mirror already started")
        cls = MirrorServer6 if ":" in self.host else MirrorServer
        server = cls((self.host, 0), MirrorHandler)
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
            self._rules.append(Rule(path_suffix, fault, times))

    def clear_faults(self) -> None:
        """Remove every fault rule."""
        with self._lock:
            self._rules.clear()

    def add_route(
        self, path: str, handler: RouteHandler, require: tuple[str, str] | None = None
    ) -> None:
        """Answer GET/HEAD on exactly path (query ignored) with handler() -> (code, headers, body).

        handler runs on a server thread per request; an exception becomes a 500.
        ``require`` (header, value): a request without it is answered 400 as Azure IMDS
        answers one without ``Metadata: true`` (JSON ``{"error": "Bad request. Required
        metadata header not specified"}``, Microsoft's IMDS reference).
        """
        with self._lock:
            self._routes[path] = handler
            if require is not None:
                self._required[path] = require

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
    def peak_inflight(self) -> int:
        """The most requests that were being answered at the same time so far."""
        with self._lock:
            return self._peak

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
            self._peak = max(self._peak, self._inflight)
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

    def _take_fault(self, path: str, method: str, *, resume: bool = False) -> Fault | None:
        """The fault for this request (``resume``: a GET for a range from byte 1 on)."""
        with self._lock:
            for rule in self._rules:
                if not path.endswith(rule.pattern) or rule.remaining == 0:
                    continue
                if method == "HEAD" and isinstance(rule.fault, BODY_FAULTS):
                    continue  # body faults neither apply to nor are used up by HEAD
                if isinstance(rule.fault, BadRange) and not resume:
                    continue  # only a resume can be answered with the wrong range
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
