"""bootfsm's fetch path as one process, for whole-process timing against curl/aria2c.

    python bench/fetch_one.py URL DEST SHA256 SIZE [SEGMENTS]

runs the real Fetcher (as the fetch state does: ``DEST.part``, sidecar, sha256 of every
byte, verify, rename to DEST); SEGMENTS (default 8) is ``fetch.segments`` with
``fetch.segment_min_size`` at its default. SIZE ``-``: the artifact has no size, as the
driver runfile (its segments are planned from the first answer). Exit 0 when DEST
verifies.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bootfsm.core.config import FetchSpec
from bootfsm.fetch.artifacts import Artifact
from bootfsm.fetch.fetcher import Fetched, Fetcher, Job
from bootfsm.host.http import Http


def main(argv: list[str]) -> int:
    url, dest, sha = argv[0], Path(argv[1]), argv[2]
    size = None if argv[3] == "-" else int(argv[3])
    spec = FetchSpec()
    segments = int(argv[4]) if len(argv) > 4 else spec.segments
    art = Artifact(dest.name, "bench", url, sha, size, dest.name)

    def done(f: Fetched) -> None:
        f.job.part.rename(dest)
        f.job.part.with_name(f.job.part.name + ".meta").unlink(missing_ok=True)

    Fetcher(
        Http(read_timeout=spec.read_timeout),
        parallel=1,
        allow_http_hosts=["127.0.0.1"],
        artifact_timeout=600,
        remaining=lambda: 600.0,
        emit=lambda event, **fields: None,
        segments=segments,
        segment_min_size=spec.segment_min_size,
        segment_below_rate=spec.segment_below_rate,
    ).run([Job(art, dest.with_name(dest.name + ".part"))], done)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
