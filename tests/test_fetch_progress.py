"""Progress reporting: coarse journal events, a TTY status line with rate and ETA."""

from __future__ import annotations

import io
from typing import Any

from bootfsm.host.progress import Progress, Track, human_bytes


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _setup(tty: io.StringIO | None = None) -> tuple[Clock, list[dict[str, Any]], Progress]:
    clock = Clock()
    events: list[dict[str, Any]] = []

    def emit(event: str, **fields: Any) -> None:
        events.append({"event": event, **fields})

    progress = Progress(emit, tty=tty, clock=clock, width=200)
    return clock, events, progress


def test_events_every_ten_percent_or_two_seconds() -> None:
    """A 1 GB runfile: an event at each tenth of it or every 2 s, whichever comes first;
    900 MB in 3 s is 300 MB/s, the 100 MB left a third of a second."""
    clock, events, progress = _setup()
    t = Track("runfile", total=1_000_000_000)
    t.begin(0, clock)
    for done_mb, dt in [(50, 0.2), (90, 0.2), (120, 0.2), (130, 0.2), (140, 2.0), (900, 0.2)]:
        clock.t += dt
        t.update(done_mb * 1_000_000, 1_000_000_000)
        progress.tick([t])
    assert [e["bytes"] for e in events] == [120_000_000, 140_000_000, 900_000_000]
    last = events[-1]
    assert last["event"] == "artifact.progress" and last["percent"] == 90.0
    assert last["rate_mb_s"] == 300.0
    assert last["eta_s"] == 0.3


def test_unknown_size_reports_time_based_events_without_eta() -> None:
    clock, events, progress = _setup()
    t = Track("runfile")
    t.begin(0, clock)
    clock.t += 2.5
    t.update(4000, None)
    progress.tick([t])
    [e] = events
    assert e["total"] is None and e["percent"] is None and e["eta_s"] is None


def test_tty_line_shows_bytes_rate_and_eta_and_clears() -> None:
    tty = io.StringIO()
    clock, _, progress = _setup(tty)
    a, b = Track("runfile", total=400_000_000), Track("fabricmanager", total=None)
    a.begin(100_000_000, clock)  # resumed: the rate counts only new bytes
    b.begin(0, clock)
    clock.t += 2.0
    a.update(300_000_000, None)
    b.update(5_000_000, None)
    progress.tick([a, b])
    line = tty.getvalue().split("\r\x1b[K")[-1]
    assert len(line) <= 200
    assert line.startswith("runfile  75% 300.0 MB/400.0 MB 100.0 MB/s ETA 1s")
    assert "fabricmanager 5.0 MB 2.5 MB/s" in line
    progress.clear()
    assert tty.getvalue().endswith("\r\x1b[K")
    assert human_bytes(999) == "999 B" and human_bytes(1_500_000_000) == "1.5 GB"
