"""Segmented downloads: one large artifact over several ranged connections. The probe
(the first unfinished segment's ranged request) decides: a ``206`` for the whole entity
hands over to ``SegmentTransfer``, a ``200`` is read whole, another entity starts over."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.core.errors import TransientError
from bootfsm.core.redact import redact_url
from bootfsm.host import partfile as pf
from bootfsm.host import segment_meta as sm
from bootfsm.host.http import Http
from bootfsm.host.http_wire import Bounds, Progress, Watch, receive
from bootfsm.host.partfile import StreamResult, url_id
from bootfsm.host.segment_transfer import Plan, SegmentTransfer, ranged_get

__all__ = ["NoTotal", "stream_segmented"]


class NoTotal(Exception):
    """An unsized probe's 206 gave no total to plan segments from."""


def stream_segmented(
    client: Http,
    url: str,
    part: Path,
    *,
    size: int | None,
    segments: int,
    deadline: float | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    allow_http_hosts: Sequence[str] | None = None,
    fsync: bool = False,
    below_rate: int = 0,
    min_size: int = 0,
) -> StreamResult:
    """Download ``url`` (``size`` B) on up to ``segments`` connections through ``client``
    (others on its clones); the sha256 of the whole file. Errors as ``stream_to``.

    The probe's ``206`` starts the others; a ``200`` is read whole on one connection, and
    a ``200`` to a resume starts over. With ``below_rate`` (B/s) the others open only when
    the first is slower. ``size`` None: planned from the ``Content-Range`` total (one
    segment under ``min_size``); a resume takes the sidecar's size."""
    plan = Plan(deadline, progress, cancel, allow_http_hosts, fsync, segments, below_rate)
    for _ in range(2):  # a resume answered with other bytes or entity starts over once
        try:
            res = _attempt(client, url, part, plan, size, min_size)
        except NoTotal:  # a 206 without a total: read it as an unsized file
            return client.stream_to(
                url,
                part,
                deadline=deadline,
                progress=progress,
                cancel=cancel,
                allow_http_hosts=allow_http_hosts,
                fsync=fsync,
            )
        if res is not None:
            return res
    raise TransientError(  # pragma: no cover - the second try never resumes
        Code.DOWNLOAD_RETRIES_EXHAUSTED, f"{redact_url(url)} changed twice"
    )


def _attempt(
    client: Http, url: str, part: Path, plan: Plan, indexed: int | None, min_size: int
) -> StreamResult | None:
    """One attempt: the probe, then the file whole on its connection or in segments
    (``indexed`` B per its index, None: unknown); None when the entity changed under a
    resume (the part is gone: the caller starts over once). Raises ``NoTotal`` for an
    unsized file whose 206 gives no total."""
    meta, size, segs, validator = _resume_plan(part, url, indexed, plan.connections)
    first, want = _probe_range(size, segs)
    if first < 0:  # every segment on disk: hash it as it is
        return SegmentTransfer(client, url, part, plan, {}, size or 0).run(None, segs, [])
    with ranged_get(client, url, plan, want, validator) as (r, watch):
        if r.status_code == 200 and validator:
            pf.discard(part)  # the entity changed: start over
            return None
        if r.status_code != 206:  # Range ignored: this response is the download
            return _whole(r, part, url, plan, size, Bounds(plan.deadline, watch, size))
        if size is None:
            size, segs = _plan_from_total(r.headers, plan.connections, min_size)
        elif not _continues(r.headers, part, url, meta, size, segs[first], indexed, validator):
            return None  # a resume that does not continue: the part is gone, start over
        probe = (r, watch)
        return _segmented(client, url, part, plan, probe, size, segs, first, indexed, validator)


def _resume_plan(
    part: Path, url: str, indexed: int | None, count: int
) -> tuple[dict[str, Any], int | None, list[list[int]], str | None]:
    """The sidecar, the size (the index's, else the one the sidecar recorded), the
    segments and the ``If-Range`` validator: the sidecar's when it records this URL's
    entity at this size, else a fresh plan (no size: none yet)."""
    meta = pf.read_meta(pf.meta_path(part)) if part.exists() else {}
    size = indexed if indexed is not None else _recorded_size(meta)
    if size is None:
        return meta, None, [], None
    segs = sm.resume_segments(meta, size) if meta else None
    validator = pf.if_range(meta) if segs is not None else None
    if segs is None or validator is None or meta.get("source") != url_id(url):
        return meta, size, sm.segment_plan(size, count), None
    return meta, size, segs, validator


def _probe_range(size: int | None, segs: list[list[int]]) -> tuple[int, str]:
    """The first unfinished segment and the range the probe asks for (-1: none left)."""
    if size is None:  # no size known: the probe asks for all of it
        return 0, "bytes=0-"
    first = next((i for i, (s, e, d) in enumerate(segs) if s + d < e), -1)
    if first < 0:
        return -1, ""
    start, end, done = segs[first]
    return first, f"bytes={start + done}-{end - 1}"


def _segmented(
    client: Http,
    url: str,
    part: Path,
    plan: Plan,
    probe: tuple[Any, Watch],
    size: int,
    segs: list[list[int]],
    first: int,
    indexed: int | None,
    validator: str | None,
) -> StreamResult:
    """The probe's 206 fits the plan: reserve the space (a fresh download), record the
    plan in the sidecar and receive the segments (the probe's on its connection)."""
    headers = probe[0].headers
    if not validator:
        pf.check_space(part, size, freed=file_size(part))
        pf.discard(part)
    sm.write_segments(part, headers, size, url, segs)
    ids = [first]
    if indexed is None and not validator and plan.below_rate > 0:
        ids = list(range(len(segs)))  # it was asked for all of them
    return SegmentTransfer(client, url, part, plan, dict(headers), size).run(probe, segs, ids)


def _plan_from_total(
    headers: Mapping[str, str], count: int, min_size: int
) -> tuple[int, list[list[int]]]:
    """An unsized probe's 206: the size from its total and the segments planned from it
    (one under ``min_size``); ``NoTotal`` when it gives none."""
    got, total = pf.content_range(headers.get("Content-Range", ""))
    if got != 0 or not total:  # no total to plan from: one connection
        raise NoTotal
    return total, sm.segment_plan(total, count) if total >= min_size else [[0, total, 0]]


def _continues(
    headers: Mapping[str, str],
    part: Path,
    url: str,
    meta: Mapping[str, Any],
    size: int,
    seg: list[int],
    indexed: int | None,
    validator: str | None,
) -> bool:
    """Whether a sized probe's 206 continues segment ``seg``; False (the part discarded)
    for a resume it does not continue; a fresh download it does not fit is refused."""
    got, total = pf.content_range(headers.get("Content-Range", ""))
    if total != size:
        if indexed is None or validator:  # a resume that does not continue
            pf.discard(part)  # the bytes on disk: start over, from byte 0
            return False
        raise pf.wrong_size(url, total, size)
    start, _, done = seg
    if got != start + done or (validator and not pf.same_entity(meta, headers)):
        pf.discard(part)
        if validator:  # a resume answered with other bytes: start over
            return False
        raise TransientError(
            Code.DOWNLOAD_RETRIES_EXHAUSTED,
            f"cannot resume {redact_url(url)} in segments: the server "
            "answered another range or entity; partial file discarded",
        )
    return True


def _whole(
    r: Any, part: Path, url: str, plan: Plan, size: int | None, bounds: Bounds
) -> StreamResult:
    """A 200 to the probe: the whole body on this connection, as ``stream_to`` reads it."""
    total = pf.int_or_none(r.headers.get("Content-Length"))
    if total is not None and size is not None and total != size:
        raise pf.wrong_size(url, total, size)
    pf.check_space(part, size if size is not None else total or 0, freed=file_size(part))
    pf.discard(part)
    pf.write_meta(pf.meta_path(part), r.headers, total, url)
    return receive(r, part, 0, total, url, bounds, plan.progress, plan.cancel, fsync=plan.fsync)


def file_size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _recorded_size(meta: Mapping[str, Any]) -> int | None:
    """The size a segmented sidecar recorded (from an earlier probe's total), else None."""
    size = meta.get("size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0 and meta.get("segments"):
        return size
    return None
