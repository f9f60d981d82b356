"""Parallel downloads with mirror failover, under the fetch state.

Up to ``parallel`` worker threads, each with its own ``Http``; workers verify, and only
the calling thread renames a ``.part``, writes the journal and the console. The first
failure cancels the others, which keep their ``.part`` for a resume.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_url
from bootfsm.host.http import Cancelled, Http
from bootfsm.host.partfile import StreamResult, partial_source, url_id
from bootfsm.host.progress import Progress, Track
from bootfsm.host.segment_meta import bytes_on_disk
from bootfsm.host.segments import stream_segmented

if TYPE_CHECKING:
    from bootfsm.fetch.artifacts import Artifact  # annotations only: it imports the host layer

__all__ = ["Fetched", "Fetcher", "Job"]

_TICK_S = 0.2
_NEXT_MIRROR = (Code.ARTIFACT_NOT_FOUND, Code.CHECKSUM_MISMATCH)
_SAME_BYTES = "the same wrong bytes twice: the file or its sha256 is wrong, not the transfer"


@dataclass(frozen=True)
class Job:
    """One artifact to download into ``part`` (a real path ending in ``.part``)."""

    artifact: Artifact
    part: Path


@dataclass(frozen=True)
class Fetched:
    """A verified download, still at ``job.part``; ``mirror`` indexes ``artifact.urls``."""

    job: Job
    url: str
    mirror: int
    result: StreamResult
    duration_s: float
    attempts: int


@dataclass(eq=False)
class Fetcher:
    """Downloads jobs concurrently, each trying its URLs in order (its ``.part``'s first)."""

    http: Http
    _: KW_ONLY
    parallel: int
    allow_http_hosts: Sequence[str]
    artifact_timeout: float
    remaining: Callable[[], float]
    emit: Callable[..., None]
    progress: Progress | None = None
    fsync: bool = False
    segments: int = 8
    segment_min_size: int = 64 << 20
    segment_below_rate: int = 0
    clock: Callable[[], float] = time.monotonic
    # HTTP attempts per artifact, failed ones too
    attempts: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.parallel = max(1, self.parallel)
        self.allow_http_hosts = tuple(self.allow_http_hosts)
        self.segments = max(1, self.segments)
        self._cancel = threading.Event()
        self._events: queue.SimpleQueue[tuple[str, dict[str, Any]]] = queue.SimpleQueue()
        self._local = threading.local()
        self._clients: list[Http] = []
        self._clients_lock = threading.Lock()

    # -- calling thread ----------------------------------------------------------------
    def run(self, jobs: Sequence[Job], on_done: Callable[[Fetched], None]) -> None:
        """Download every job; ``on_done`` runs on this thread for each verified one.
        Raises the first permanent error, else the first transient, once all workers stop."""
        if not jobs:
            return
        self._cancel.clear()
        tracks = {j.artifact.name: Track(j.artifact.name, j.artifact.size) for j in jobs}
        errors: list[BaseException] = []
        pool = ThreadPoolExecutor(min(self.parallel, len(jobs)), thread_name_prefix="bootfsm-dl")
        pending: set[Future[Fetched]] = set()
        # SimpleQueue.get blocks in C: a signal's exception there leaves no lock half-taken,
        # as it can inside concurrent.futures.wait (bootfsm/run/interrupts.py)
        finished: queue.SimpleQueue[Future[Fetched]] = queue.SimpleQueue()
        try:
            for j in jobs:
                fut = pool.submit(self._one, j, tracks[j.artifact.name])
                pending.add(fut)
                fut.add_done_callback(finished.put)
            while pending:
                done = _finished(finished, _TICK_S)
                pending.difference_update(done)
                self._drain()
                for fut in done:
                    exc = fut.exception()
                    if exc is None:
                        on_done(fut.result())  # verified: keep it even when another one failed
                    elif not isinstance(exc, Cancelled):
                        errors.append(exc)
                        self._cancel.set()
                if self.progress is not None:
                    self.progress.tick(tracks.values())
        finally:
            if pending:
                self._cancel.set()
            pool.shutdown(wait=True, cancel_futures=True)
            self._drain()
            if self.progress is not None:
                self.progress.clear()
            self._close_clients()
        if errors:
            raise _worst(errors)

    def _drain(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                event, fields = self._events.get_nowait()
                self.emit(event, **fields)

    # -- worker threads ----------------------------------------------------------------
    def _client(self) -> Http:
        client: Http | None = getattr(self._local, "http", None)
        if client is None:
            client = self.http.clone()
            self._local.http = client
            with self._clients_lock:
                self._clients.append(client)
        return client

    def _close_clients(self) -> None:
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for c in clients:
            c.close()

    def _one(self, job: Job, track: Track) -> Fetched:
        a = job.artifact
        started = self.clock()
        deadline = started + min(self.artifact_timeout, self.remaining())
        failures: list[tuple[str, BootError | TransientError]] = []
        tries = _ordered(a.urls, partial_source(job.part))
        wrong = _Wrong()
        while tries:
            i, url = tries.pop(0)
            if self._cancel.is_set():
                raise Cancelled(a.name)
            self.attempts[a.name] = self.attempts.get(a.name, 0) + 1
            before = bytes_on_disk(job.part)
            track.begin(before, self.clock)
            try:
                res = self._attempt(job, url, deadline, track)
            except _Mismatch as exc:
                self._failed(failures, a, i, url, exc.error)
                if wrong.again(i, exc, left=len(tries)):
                    tries.insert(0, (i, url))
                    self._events.put(("warning", {"level": "warning", "message": exc.retry}))
            except TransientError as exc:
                self._failed(failures, a, i, url, exc)
                if _stays(exc, job.part, before, url):
                    raise
            except BootError as exc:
                if exc.code not in _NEXT_MIRROR:
                    raise
                self._failed(failures, a, i, url, exc)
            else:
                took = self.clock() - started
                return Fetched(job, url, i, res, took, self.attempts[a.name])
            finally:
                track.active = False
        raise _give_up(a, failures)

    def _attempt(self, job: Job, url: str, deadline: float, track: Track) -> StreamResult:
        """One verified download from ``url``; a failed write is HOST_IO_ERROR."""
        try:
            res = self._stream(job.artifact, job.part, url, deadline, track)
            _verify(job, res, url)
        except OSError as exc:
            raise BootError(
                Code.HOST_IO_ERROR, f"cannot write {job.part}: {exc.strerror or exc}"
            ) from exc
        return res

    def _stream(
        self, a: Artifact, part: Path, url: str, deadline: float, track: Track
    ) -> StreamResult:
        """One attempt from one mirror: in segments when the artifact is large enough."""
        if self.segments > 1 and (a.size is None or a.size >= self.segment_min_size):
            return stream_segmented(  # an unsized one: planned from the probe
                self._client(),
                url,
                part,
                size=a.size,
                min_size=self.segment_min_size,
                segments=self.segments,
                deadline=deadline,
                progress=track.update,
                cancel=self._cancel,
                allow_http_hosts=self.allow_http_hosts,
                fsync=self.fsync,
                below_rate=self.segment_below_rate,
            )
        return self._client().stream_to(
            url,
            part,
            deadline=deadline,
            progress=track.update,
            cancel=self._cancel,
            expect_size=a.size,
            allow_http_hosts=self.allow_http_hosts,
            fsync=self.fsync,
        )

    def _failed(
        self,
        failures: list[tuple[str, BootError | TransientError]],
        a: Artifact,
        i: int,
        url: str,
        exc: BootError | TransientError,
    ) -> None:
        failures.append((url, exc))
        if len(a.urls) < 2:
            return  # the state's retry and failure events already say it
        self._events.put(
            (
                "artifact.mirror_failed",
                {
                    "level": "warning",
                    "artifact": a.name,
                    "mirror": i,
                    "url": redact_url(url),
                    "code": exc.code.name,
                    "error": exc.message,
                },
            )
        )


def _ordered(urls: Sequence[str], first_id: str | None) -> list[tuple[int, str]]:
    """URLs with positions, the one a partial file came from first."""
    pairs = list(enumerate(urls))
    pairs.sort(key=lambda p: 0 if first_id and url_id(p[1]) == first_id else 1)
    return pairs


class _Mismatch(Exception):
    """Downloaded bytes that do not hash to the artifact's sha256 (the part is gone)."""

    def __init__(self, error: BootError, sha256: str, resumed: bool, retry: str) -> None:
        super().__init__(error.message)
        self.error, self.sha256, self.resumed, self.retry = error, sha256, resumed, retry


class _Wrong:
    """Whether bytes that did not verify earn one more fetch from scratch (a transfer can
    be torn on its way); the same wrong bytes twice are the file or its pin: permanent."""

    def __init__(self) -> None:
        self.seen: set[str] = set()  # the sha256 of every fetch from byte 0 that did not verify
        self.restarted: set[int] = set()

    def again(self, i: int, exc: _Mismatch, *, left: int) -> bool:
        """Whether to fetch mirror ``i`` once more (``left``: mirrors not tried yet); the
        same wrong bytes twice raise CHECKSUM_MISMATCH."""
        # a resumed download's older bytes may be the bad ones: once from zero, same mirror
        if exc.resumed and i not in self.restarted:
            self.restarted.add(i)
            return True
        if exc.sha256 in self.seen:
            raise BootError(Code.CHECKSUM_MISMATCH, f"{exc.error.message} ({_SAME_BYTES})") from exc
        self.seen.add(exc.sha256)
        return left == 0 and len(self.seen) == 1


def _verify(job: Job, res: StreamResult, url: str) -> None:
    a = job.artifact
    if not a.sha256 or res.sha256 == a.sha256:
        return
    job.part.unlink(missing_ok=True)
    job.part.with_name(job.part.name + ".meta").unlink(missing_ok=True)
    if res.resumed_bytes:
        what = f"{a.name}: resumed download from {redact_url(url)} does not verify"
        retry = f"{what}; fetching it again from zero"
    else:
        what = f"{a.name} from {redact_url(url)}: sha256 {res.sha256} != expected {a.sha256}"
        retry = f"{what}; fetching it once more from scratch"
    raise _Mismatch(
        BootError(Code.CHECKSUM_MISMATCH, what), res.sha256, bool(res.resumed_bytes), retry
    )


def _stays(exc: TransientError, part: Path, before: int, url: str) -> bool:
    """Out of time, or bytes to resume from this mirror on the next attempt."""
    if exc.code is Code.DOWNLOAD_TIMEOUT:
        return True
    return bytes_on_disk(part) > before and partial_source(part) == url_id(url)


def _give_up(a: Artifact, failures: list[tuple[str, BootError | TransientError]]) -> Exception:
    """One error for an artifact every mirror failed: transient if any was transient."""
    if len(failures) == 1:
        return failures[0][1]
    what = "; ".join(f"{redact_url(u)}: {e.message}" for u, e in failures)
    waits = [e.retry_after for _, e in failures if isinstance(e, TransientError)]
    if waits:
        return TransientError(
            Code.DOWNLOAD_RETRIES_EXHAUSTED,
            f"{a.name}: every mirror failed ({what})",
            retry_after=_soonest(waits),
        )
    mismatch = any(e.code is Code.CHECKSUM_MISMATCH for _, e in failures)
    code = Code.CHECKSUM_MISMATCH if mismatch else Code.ARTIFACT_NOT_FOUND
    return BootError(code, f"{a.name}: no mirror serves it ({what})")


def _soonest(waits: list[float | None]) -> float | None:
    """The shortest wait asked for; None when one failure asked for none."""
    return None if None in waits else min(w for w in waits if w is not None)


def _worst(errors: list[BaseException]) -> BaseException:
    """The first permanent error, else the first transient one."""
    return next((e for e in errors if isinstance(e, BootError)), errors[0])


def _finished(
    finished: queue.SimpleQueue[Future[Fetched]], timeout: float
) -> list[Future[Fetched]]:
    """The futures that finished within ``timeout`` (waiting in C), in the order they did."""
    out: list[Future[Fetched]] = []
    with contextlib.suppress(queue.Empty):
        out.append(finished.get(timeout=timeout))
        while True:
            out.append(finished.get_nowait())
    return out
