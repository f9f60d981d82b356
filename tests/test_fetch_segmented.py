"""Segmented downloads against real loopback servers: same bytes, same sha256, per-segment
resume of only the missing ranges, fallback to one connection when Range is ignored.

The sim Mirror serves real single-range 206s with ETag/If-Range and logs every request's
Range header; pytest-httpserver plays the servers that ignore Range or overrun a range.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.fetch.artifacts import Artifact
from bootfsm.fetch.fetcher import Fetched, Fetcher, Job
from bootfsm.host.http import Cancelled, Http
from bootfsm.host.partfile import read_meta
from bootfsm.host.segment_meta import bytes_on_disk, segment_plan
from bootfsm.host.segments import stream_segmented
from bootfsm.sim.mirror import DropMidBody, Mirror, NotFound, Throttle

SIZE = (4 << 20) + 12345  # not a multiple of the segment count
BODY = os.urandom(SIZE)
SHA = hashlib.sha256(BODY).hexdigest()
SEGS = 4


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    doc = tmp_path / "doc"
    doc.mkdir()
    (doc / "f.bin").write_bytes(BODY)
    with Mirror(doc) as m:
        yield m


def _part(tmp_path: Path) -> Path:
    d = tmp_path / "cache"
    d.mkdir(exist_ok=True)
    return d / "f.bin.part"


def _ranges(m: Mirror, since: int = 0) -> list[str | None]:
    return sorted((e.range_header for e in m.log[since:] if e.path == "/f.bin"), key=str)


def _expected(segs: list[list[int]]) -> list[str]:
    return sorted(f"bytes={s + d}-{e - 1}" for s, e, d in segs if s + d < e)


def _seg(url: str, part: Path, **kw: object) -> object:
    return stream_segmented(Http(read_timeout=5), url, part, size=SIZE, segments=SEGS, **kw)  # type: ignore[arg-type]


def test_segments_give_the_same_bytes_and_sha256(mirror: Mirror, tmp_path: Path) -> None:
    part = _part(tmp_path)
    res = stream_segmented(Http(), mirror.url + "/f.bin", part, size=SIZE, segments=SEGS)
    assert (res.size, res.sha256, res.resumed_bytes, res.transferred) == (SIZE, SHA, 0, SIZE)
    assert part.read_bytes() == BODY
    # one ranged request per segment, together exactly the file, each byte sent once
    assert _ranges(mirror) == _expected(segment_plan(SIZE, SEGS))
    assert all(e.status == 206 for e in mirror.log)
    assert mirror.bytes_sent_total == SIZE


def test_fetcher_uses_segments_from_the_minimum_size_and_fails_over(
    mirror: Mirror, tmp_path: Path
) -> None:
    mirror.add_fault("/gone/f.bin", NotFound())
    art = Artifact(
        "f.bin", "runfile", mirror.url + "/gone/f.bin", SHA, SIZE, "f.bin", (mirror.url + "/f.bin",)
    )
    got: list[Fetched] = []
    fetcher = Fetcher(
        Http(read_timeout=5),
        parallel=2,
        allow_http_hosts=["127.0.0.1"],
        artifact_timeout=60,
        remaining=lambda: 60.0,
        emit=lambda event, **f: None,
        segments=SEGS,
        segment_min_size=SIZE,
    )
    fetcher.run([Job(art, _part(tmp_path))], got.append)
    assert got[0].mirror == 1 and got[0].result.sha256 == SHA
    assert [e.status for e in mirror.log if e.path == "/gone/f.bin"] == [404]  # one probe
    assert _ranges(mirror) == _expected(segment_plan(SIZE, SEGS))
    small = Artifact("f.bin", "runfile", mirror.url + "/f.bin", SHA, SIZE, "f.bin")
    before = len(mirror.log)
    fetcher.segment_min_size = SIZE + 1  # below the minimum: one plain request
    _part(tmp_path).unlink()
    fetcher.run([Job(small, _part(tmp_path))], got.append)
    assert [e.range_header for e in mirror.log[before:]] == [None]


@pytest.mark.parametrize(
    ("size", "probe"),
    [
        (SIZE, f"bytes=0-{segment_plan(SIZE, SEGS)[0][1] - 1}"),
        (None, "bytes=0-"),  # no size given (the runfile): the probe asks for all of it
    ],
)
def test_server_ignoring_range_is_read_on_one_connection(
    httpserver: HTTPServer, tmp_path: Path, size: int | None, probe: str
) -> None:
    seen: list[str | None] = []

    def handler(request: Request) -> Response:
        seen.append(request.headers.get("Range"))
        return Response(BODY, status=200, headers={"ETag": '"v1"'})  # like python -m http.server

    httpserver.expect_request("/f").respond_with_handler(handler)
    part = _part(tmp_path)
    res = stream_segmented(Http(), httpserver.url_for("/f"), part, size=size, segments=SEGS)
    assert seen == [probe]  # the probe's 200 is the download, nothing more
    assert res.sha256 == SHA and res.size == SIZE and part.read_bytes() == BODY
    assert "segments" not in read_meta(part.with_name(part.name + ".meta"))


def test_a_failed_segment_resumes_only_the_missing_ranges(mirror: Mirror, tmp_path: Path) -> None:
    mirror.add_fault("/f.bin", DropMidBody(times=1, fraction=0.5))
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    with pytest.raises(TransientError) as err:
        _seg(url, part)
    assert err.value.code is Code.DOWNLOAD_RETRIES_EXHAUSTED
    segs = read_meta(part.with_name(part.name + ".meta"))["segments"]
    missing = _expected(segs)
    assert missing and bytes_on_disk(part) == sum(d for _, _, d in segs) < SIZE
    data = part.read_bytes()
    for s, _, d in segs:  # what the sidecar claims is on disk is the file's bytes
        assert data[s : s + d] == BODY[s : s + d]
    before = len(mirror.log)
    res = _seg(url, part)
    assert _ranges(mirror, before) == missing  # only those byte ranges, nothing twice
    assert res.sha256 == SHA and part.read_bytes() == BODY  # type: ignore[attr-defined]
    assert res.resumed_bytes == sum(d for _, _, d in segs)  # type: ignore[attr-defined]
    assert mirror.bytes_sent_total == SIZE  # the healthy connections finished their pieces


def test_changed_entity_between_attempts_restarts(mirror: Mirror, tmp_path: Path) -> None:
    mirror.add_fault("/f.bin", DropMidBody(times=1, fraction=0.5))
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    with pytest.raises(TransientError):
        _seg(url, part)
    new = os.urandom(SIZE)
    src = tmp_path / "doc" / "f.bin"
    src.write_bytes(new)
    os.utime(src, ns=(1, 1))  # another mtime: another ETag and Last-Modified
    before = len(mirror.log)
    res = _seg(url, part)
    assert res.sha256 == hashlib.sha256(new).hexdigest() and part.read_bytes() == new  # type: ignore[attr-defined]
    log = [e for e in mirror.log[before:] if e.path == "/f.bin"]
    assert log[0].status == 200  # If-Range failed: the old bytes were dropped ...
    assert sorted(e.range_header or "" for e in log[1:]) == _expected(segment_plan(SIZE, SEGS))
    assert res.resumed_bytes == 0  # type: ignore[attr-defined]


def test_wrong_size_and_wrong_checksum_keep_their_codes(mirror: Mirror, tmp_path: Path) -> None:
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    with pytest.raises(BootError) as err:
        stream_segmented(Http(), url, part, size=SIZE + 1, segments=SEGS)
    assert err.value.code is Code.CHECKSUM_MISMATCH and "index says" in err.value.message
    assert not part.exists()  # refused before any byte was written
    bad = Artifact("f.bin", "runfile", url, "0" * 64, SIZE, "f.bin")
    fetcher = Fetcher(
        Http(read_timeout=5),
        parallel=1,
        allow_http_hosts=["127.0.0.1"],
        artifact_timeout=60,
        remaining=lambda: 60.0,
        emit=lambda event, **f: None,
        segments=SEGS,
        segment_min_size=1 << 20,
    )
    with pytest.raises(BootError) as err:
        fetcher.run([Job(bad, part)], lambda f: None)
    assert err.value.code is Code.CHECKSUM_MISMATCH
    assert not part.exists()


def test_cancel_mid_download_leaves_a_resumable_part(mirror: Mirror, tmp_path: Path) -> None:
    mirror.add_fault("/f.bin", Throttle(bytes_per_second=2 << 20))
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    cancel = threading.Event()

    def progress(done: int, total: int | None) -> None:
        if done >= 1 << 20:
            cancel.set()

    with pytest.raises(Cancelled):
        _seg(url, part, cancel=cancel, progress=progress)
    segs = json.loads(part.with_name(part.name + ".meta").read_text())["segments"]
    assert 1 << 20 <= sum(d for _, _, d in segs) < SIZE
    mirror.clear_faults()
    before = len(mirror.log)
    res = _seg(url, part)
    assert _ranges(mirror, before) == _expected(segs)
    assert res.sha256 == SHA and part.read_bytes() == BODY  # type: ignore[attr-defined]


def test_deadline_ends_every_segment_resumably(mirror: Mirror, tmp_path: Path) -> None:
    import time

    mirror.add_fault("/f.bin", Throttle(bytes_per_second=1 << 20))
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    with pytest.raises(TransientError) as err:
        _seg(url, part, deadline=time.monotonic() + 0.5)
    assert err.value.code is Code.DOWNLOAD_TIMEOUT
    segs = read_meta(part.with_name(part.name + ".meta"))["segments"]
    assert sum(d for _, _, d in segs) > 0 and all(d < e - s for s, e, d in segs)  # none finished


def test_a_segment_never_reads_past_its_range(httpserver: HTTPServer, tmp_path: Path) -> None:
    def handler(request: Request) -> Response:
        first, last = request.headers["Range"].removeprefix("bytes=").split("-")
        a, b = int(first), int(last)
        body = BODY[a : b + 1] + b"X" * 65536  # a 206 that runs on past its range
        return Response(
            body, status=206, headers={"ETag": '"v1"', "Content-Range": f"bytes {a}-{b}/{SIZE}"}
        )

    httpserver.expect_request("/f").respond_with_handler(handler)
    part = _part(tmp_path)
    res = stream_segmented(Http(), httpserver.url_for("/f"), part, size=SIZE, segments=SEGS)
    assert res.sha256 == SHA and part.read_bytes() == BODY


def test_a_segment_answered_from_another_offset_discards_the_part(
    httpserver: HTTPServer, tmp_path: Path
) -> None:
    """A later segment's 206 whose Content-Range starts elsewhere than it asked is never
    written at its offset: the download fails (transient) and the part is discarded."""

    def handler(request: Request) -> Response:
        first, last = request.headers["Range"].removeprefix("bytes=").split("-")
        a, b = int(first), int(last)
        a += 1 if a else 0  # the probe is answered right, every other range one byte late
        return Response(
            BODY[a : b + 1],
            status=206,
            headers={"ETag": '"v1"', "Content-Range": f"bytes {a}-{b}/{SIZE}"},
        )

    httpserver.expect_request("/f").respond_with_handler(handler)
    part = _part(tmp_path)
    with pytest.raises(TransientError, match="changed during a segmented download") as e:
        stream_segmented(Http(), httpserver.url_for("/f"), part, size=SIZE, segments=SEGS)
    assert e.value.code is Code.DOWNLOAD_RETRIES_EXHAUSTED
    assert not part.exists()


def test_a_mirror_failing_later_ranges_hands_over_to_the_next(
    httpserver: HTTPServer, mirror: Mirror, tmp_path: Path
) -> None:
    first_piece = segment_plan(SIZE, SEGS)[0]

    def handler(request: Request) -> Response:
        if request.headers.get("Range") != f"bytes=0-{first_piece[1] - 1}":
            return Response("gone", status=404)  # a mirror losing the file mid-download
        return Response(
            BODY[: first_piece[1]],
            status=206,
            headers={"ETag": '"v1"', "Content-Range": f"bytes 0-{first_piece[1] - 1}/{SIZE}"},
        )

    httpserver.expect_request("/f.bin").respond_with_handler(handler)
    art = Artifact(
        "f.bin", "runfile", httpserver.url_for("/f.bin"), SHA, SIZE, "f.bin",
        (mirror.url + "/f.bin",),
    )  # fmt: skip
    got: list[Fetched] = []
    Fetcher(
        Http(read_timeout=5),
        parallel=1,
        allow_http_hosts=["127.0.0.1", "localhost"],
        artifact_timeout=60,
        remaining=lambda: 60.0,
        emit=lambda event, **f: None,
        segments=SEGS,
        segment_min_size=1 << 20,
    ).run([Job(art, _part(tmp_path))], got.append)
    assert got[0].mirror == 1 and got[0].result.sha256 == SHA
    assert sorted(resp.status_code for _, resp in httpserver.log)[-1] == 404
    assert got[0].result.resumed_bytes == 0  # another mirror's bytes are never resumed
    assert _part(tmp_path).read_bytes() == BODY
    assert _ranges(mirror) == _expected(segment_plan(SIZE, SEGS))


def test_one_connection_faster_than_below_rate_takes_every_piece_in_turn(
    mirror: Mirror, tmp_path: Path
) -> None:
    """``fetch.segment_below_rate``: a mirror that one connection drains faster than the
    rate gets no second connection; after the probe (the first piece), the rest comes in
    one request on the same connection."""
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    res = stream_segmented(Http(), url, part, size=SIZE, segments=SEGS, below_rate=1)
    assert (res.size, res.sha256) == (SIZE, SHA) and part.read_bytes() == BODY
    first_end = segment_plan(SIZE, SEGS)[0][1]
    assert [e.range_header for e in mirror.log] == [
        f"bytes=0-{first_end - 1}",
        f"bytes={first_end}-{SIZE - 1}",
    ]
    assert mirror.peak_inflight == 1
    assert mirror.bytes_sent_total == SIZE


def test_one_connection_slower_than_below_rate_opens_the_others(
    mirror: Mirror, tmp_path: Path
) -> None:
    """Paced per connection (how a CDN limits a client) below the rate: the first
    connection is watched for a quarter second, then the others open and share the rest."""
    mirror.add_fault("/f.bin", Throttle(bytes_per_second=2 << 20))
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    res = stream_segmented(
        Http(read_timeout=10), url, part, size=SIZE, segments=SEGS, below_rate=100 << 20
    )
    assert (res.size, res.sha256) == (SIZE, SHA) and part.read_bytes() == BODY
    assert mirror.peak_inflight == SEGS
    assert _ranges(mirror) == _expected(segment_plan(SIZE, SEGS))  # each piece once
    assert mirror.bytes_sent_total == SIZE


def test_a_connection_that_slows_down_hands_its_pieces_to_the_others(
    mirror: Mirror, tmp_path: Path
) -> None:
    """The first connection asked for every piece in a row, then fell below the rate
    (here: its reader is slowed): the others open at once and take the pieces it has not
    begun; it finishes the one it is in. Each piece is fetched once."""
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    plan = segment_plan(SIZE, SEGS)
    main, naps, others = threading.current_thread(), [], set()

    def slow_reader(done: int, total: int | None) -> None:
        if threading.current_thread() is not main:
            others.add(threading.current_thread().name)
        elif done > plan[0][1] and len(naps) < 12:
            naps.append(done)
            threading.Event().wait(0.05)  # about 5 MB/s, far below the rate

    res = stream_segmented(
        Http(read_timeout=10),
        url,
        part,
        size=SIZE,
        segments=SEGS,
        below_rate=100 << 20,
        progress=slow_reader,
    )
    assert (res.size, res.sha256) == (SIZE, SHA) and part.read_bytes() == BODY
    ranges = [e.range_header for e in mirror.log]
    assert ranges[:2] == [f"bytes=0-{plan[0][1] - 1}", f"bytes={plan[0][1]}-{SIZE - 1}"]
    later = sorted(ranges[2:], key=str)
    assert later and all(r in _expected(plan) for r in later)  # whole pieces, each once
    assert len(set(later)) == len(later)
    assert others == {"bootfsm-seg"}  # the other connections received bytes


# -- an artifact whose index gives no size (the driver runfile) -------------------------


def _unsized_fetcher(**kw: object) -> Fetcher:
    args: dict[str, object] = {
        "parallel": 1,
        "allow_http_hosts": ["127.0.0.1", "localhost"],
        "artifact_timeout": 60,
        "remaining": lambda: 60.0,
        "emit": lambda event, **f: None,
        "segments": SEGS,
        "segment_min_size": 1 << 20,
    }
    args.update(kw)
    return Fetcher(Http(read_timeout=10), **args)  # type: ignore[arg-type]


def _runfile(url: str) -> Artifact:
    return Artifact("f.bin", "runfile", url, SHA, None, "f.bin")  # no size, as resolve gives


def test_an_unsized_artifact_is_segmented_from_the_probes_total(
    mirror: Mirror, tmp_path: Path
) -> None:
    """The runfile has a sha256 but no size: the probe asks for all of it, and a mirror
    that limits each connection still gets the other connections, planned from the
    probe's Content-Range total."""
    mirror.add_fault("/f.bin", Throttle(bytes_per_second=2 << 20))
    got: list[Fetched] = []
    part = _part(tmp_path)
    _unsized_fetcher(segment_below_rate=100 << 20).run(
        [Job(_runfile(mirror.url + "/f.bin"), part)], got.append
    )
    assert got[0].result.sha256 == SHA and part.read_bytes() == BODY
    ranges = [e.range_header for e in mirror.log]
    assert ranges[0] == "bytes=0-"  # the probe: the size comes from its answer
    # SEGS connections; the probe's open-ended answer, dropped once its first piece is
    # in, lingers at the server until its next paced write fails: one more at most
    assert SEGS <= mirror.peak_inflight <= SEGS + 1
    plan = segment_plan(SIZE, SEGS)
    later = sorted(ranges[1:], key=str)
    assert later and all(r in _expected(plan) for r in later) and len(set(later)) == len(later)
    assert read_meta(part.with_name(part.name + ".meta"))["size"] == SIZE


def test_an_unsized_artifact_on_a_fast_mirror_is_one_request(
    mirror: Mirror, tmp_path: Path
) -> None:
    part = _part(tmp_path)
    res = stream_segmented(
        Http(),
        mirror.url + "/f.bin",
        part,
        size=None,
        segments=SEGS,
        below_rate=1,
        min_size=1 << 20,
    )
    assert (res.size, res.sha256, res.transferred) == (SIZE, SHA, SIZE)
    assert [e.range_header for e in mirror.log] == ["bytes=0-"]
    assert mirror.peak_inflight == 1 and mirror.bytes_sent_total == SIZE


def test_an_unsized_artifact_below_the_minimum_is_one_segment(
    mirror: Mirror, tmp_path: Path
) -> None:
    mirror.add_fault("/f.bin", Throttle(bytes_per_second=16 << 20))
    part = _part(tmp_path)
    got: list[Fetched] = []
    _unsized_fetcher(segment_min_size=SIZE + 1).run(
        [Job(_runfile(mirror.url + "/f.bin"), part)], got.append
    )
    assert got[0].result.sha256 == SHA and part.read_bytes() == BODY
    assert [e.range_header for e in mirror.log] == ["bytes=0-"]
    assert mirror.peak_inflight == 1 and mirror.bytes_sent_total == SIZE


def test_an_unsized_artifact_resumes_per_segment_with_the_recorded_size(
    mirror: Mirror, tmp_path: Path
) -> None:
    # the probe's answer (the whole file) is dropped at 50 %, after its first piece is
    # in; the second request breaks inside its piece
    mirror.add_fault("/f.bin", DropMidBody(times=2, fraction=0.5))
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    with pytest.raises(TransientError):
        stream_segmented(Http(read_timeout=5), url, part, size=None, segments=SEGS)
    meta = read_meta(part.with_name(part.name + ".meta"))
    assert meta["size"] == SIZE
    missing = _expected(meta["segments"])
    assert missing
    before = len(mirror.log)
    res = stream_segmented(Http(read_timeout=5), url, part, size=None, segments=SEGS)
    assert _ranges(mirror, before) == missing  # no new probe of the whole file
    assert res.sha256 == SHA and part.read_bytes() == BODY
    assert res.resumed_bytes == sum(d for _, _, d in meta["segments"])


def test_a_206_without_a_total_is_read_on_one_connection(
    httpserver: HTTPServer, tmp_path: Path
) -> None:
    seen: list[str | None] = []

    def handler(request: Request) -> Response:
        seen.append(request.headers.get("Range"))
        if request.headers.get("Range"):  # RFC 9110 allows "*" for an unknown length
            return Response(BODY, status=206, headers={"Content-Range": f"bytes 0-{SIZE - 1}/*"})
        return Response(BODY, status=200)

    httpserver.expect_request("/f").respond_with_handler(handler)
    part = _part(tmp_path)
    res = stream_segmented(Http(), httpserver.url_for("/f"), part, size=None, segments=SEGS)
    assert res.sha256 == SHA and part.read_bytes() == BODY
    assert seen == ["bytes=0-", None]


def test_an_announced_total_beyond_the_free_disk_reserves_nothing(
    httpserver: HTTPServer, tmp_path: Path
) -> None:
    """A mirror announcing a petabyte for the runfile fails the download at once
    (INSUFFICIENT_SPACE): nothing is preallocated or written."""
    huge = 1 << 50
    httpserver.expect_request("/f").respond_with_response(
        Response(BODY[:65536], status=206, headers={"Content-Range": f"bytes 0-65535/{huge}"})
    )
    part = _part(tmp_path)
    with pytest.raises(BootError) as err:
        stream_segmented(Http(), httpserver.url_for("/f"), part, size=None, segments=SEGS)
    assert err.value.code is Code.INSUFFICIENT_SPACE and str(huge) in err.value.message
    assert not part.exists() and not part.with_name(part.name + ".meta").exists()


def test_time_outside_a_response_is_not_counted_as_a_slow_mirror(
    mirror: Mirror, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first connection's pace counts from its response's first byte: a slow
    preallocation (a large file on a slow disk) before it is not the mirror being slow,
    and opens no other connection on a mirror that one connection drains."""
    import time

    import bootfsm.host.segment_transfer as transfer_mod

    real = transfer_mod.preallocate

    def slow_disk(fd: int, size: int) -> None:
        time.sleep(0.4)
        real(fd, size)

    monkeypatch.setattr(transfer_mod, "preallocate", slow_disk)
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    res = stream_segmented(Http(), url, part, size=SIZE, segments=SEGS, below_rate=1 << 20)
    assert (res.size, res.sha256) == (SIZE, SHA) and part.read_bytes() == BODY
    first_end = segment_plan(SIZE, SEGS)[0][1]
    assert [e.range_header for e in mirror.log] == [
        f"bytes=0-{first_end - 1}",
        f"bytes={first_end}-{SIZE - 1}",
    ]
    assert mirror.peak_inflight == 1


def test_the_first_connections_pace_carries_over_into_its_next_request(
    mirror: Mirror, tmp_path: Path
) -> None:
    """From a mirror slower than the rate, a first piece shorter than the pace window:
    the window goes on into the connection's next request (the gap between the two left
    out), so the others open while it is still in its second piece and take the third."""
    mirror.add_fault("/f.bin", Throttle(bytes_per_second=5 << 20))
    plan = segment_plan(SIZE, SEGS)  # 1 MiB pieces: 0.2 s each at this pace
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    res = stream_segmented(
        Http(read_timeout=10), url, part, size=SIZE, segments=SEGS, below_rate=100 << 20
    )
    assert (res.size, res.sha256) == (SIZE, SHA) and part.read_bytes() == BODY
    ranges = [e.range_header for e in mirror.log]
    assert ranges[:2] == [f"bytes=0-{plan[0][1] - 1}", f"bytes={plan[0][1]}-{SIZE - 1}"]
    assert f"bytes={plan[2][0]}-{plan[2][1] - 1}" in ranges[2:]  # another connection's
