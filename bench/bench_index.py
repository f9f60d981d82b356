"""Big Packages indexes: pick a node's packages out of a 100,000-stanza index (issue 16).

A CUDA repository's Packages index lists every package of every release (tens of MB,
growing). The index is generated here with 100,000 stanzas shaped like the real ones
(the fields of ../shared/reference/samples/apt's capture: Depends, Description, the
four digests), the four toolkit packages among them. Each cell is timed in this process,
``BENCH_INDEX_RUNS`` (default 5) interleaved runs, median (min-max):

- bootfsm: ``select_packages`` (one pass; only the wanted stanzas are split into fields);
- the former way: a full ``parse_packages`` of the index once per wanted package;
- side by side, what a shell script would run: ``awk`` in paragraph mode printing the
  four stanzas (a fresh process each run; it prints, it does not validate).

Peak memory is Python's (tracemalloc) above the index text itself.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import tracemalloc
from pathlib import Path

from bootfsm.parsers.debian_packages import parse_packages, select_package, select_packages

RUNS = int(os.environ.get("BENCH_INDEX_RUNS", "5"))
STANZAS = 100_000
WANTED = (
    "libnvidia-container1",
    "libnvidia-container-tools",
    "nvidia-container-toolkit-base",
    "nvidia-container-toolkit",
)


def _stanza(name: str, version: str) -> str:
    sha = hashlib.sha256(f"{name}{version}".encode()).hexdigest()
    return (
        f"Package: {name}\nArchitecture: amd64\nVersion: {version}\nPriority: optional\n"
        "Section: multiverse/devel\nMaintainer: cudatools <cudatools@nvidia.com>\n"
        f"Installed-Size: 4096\nDepends: libc6 (>= 2.17), {name}-common (= {version})\n"
        f"Filename: ./{name}_{version}_amd64.deb\nSize: 1048576\nMD5sum: {sha[:32]}\n"
        f"SHA1: {sha[:40]}\nSHA256: {sha}\nSHA512: {sha}{sha}\n"
        f"Description: {name} {version}\n This is the package {name}, one of many.\n"
    )


def index_text() -> str:
    parts = []
    for i in range(STANZAS - len(WANTED) * 3):
        parts.append(_stanza(f"cuda-lib{i % 997}-{i // 997}", f"12.{i % 9}.{i % 77}-1"))
    for name in WANTED:
        for v in ("1.17.1-1", "1.17.2-1", "1.16.0-1"):
            parts.insert(len(parts) * 7 // 10, _stanza(name, v))
    return "\n".join(parts)


def _one_pass(text: str) -> None:
    wants = {n: ([n], "1.17.2", "amd64") for n in WANTED}
    got = select_packages(text, wants)
    assert all(e is not None and e.version == "1.17.2-1" for e in got.values())


def _former(text: str) -> None:
    for n in WANTED:
        e = select_package(parse_packages(text), [n], "1.17.2", "amd64")
        assert e is not None and e.version == "1.17.2-1"


def _timed(fn: object, text: str) -> float:
    t0 = time.perf_counter()
    fn(text)  # type: ignore[operator]
    return time.perf_counter() - t0


def _peak(fn: object, text: str) -> int:
    tracemalloc.start()
    fn(text)  # type: ignore[operator]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main() -> str:
    text = index_text()
    size = len(text.encode())
    awk = shutil.which("awk")
    prog = " || ".join(f"$0 ~ /^Package: {n}\\n/" for n in WANTED)
    times: dict[str, list[float]] = {"one": [], "former": [], "awk": []}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "Packages"
        path.write_text(text)
        for i in range(RUNS):
            cells = ["one", "former", "awk"]
            for cell in cells[i % 3 :] + cells[: i % 3]:
                if cell == "one":
                    times["one"].append(_timed(_one_pass, text))
                elif cell == "former":
                    times["former"].append(_timed(_former, text))
                elif awk:
                    t0 = time.perf_counter()
                    subprocess.run(
                        [awk, "-v", "RS=", prog, str(path)], check=True, stdout=subprocess.DEVNULL
                    )
                    times["awk"].append(time.perf_counter() - t0)
    peak_one, peak_former = _peak(_one_pass, text), _peak(_former, text)

    def cell(ts: list[float]) -> str:
        if not ts:
            return "-"
        return f"{statistics.median(ts):.2f} s ({min(ts):.2f}-{max(ts):.2f})"

    ok = "met" if statistics.median(times["one"]) < 1.0 else "missed"
    load = os.getloadavg()
    return (
        "\n".join(
            [
                "## Big indexes: 100,000 stanzas (bench/bench_index.py)",
                "",
                f"A generated Packages index of {STANZAS:,} stanzas ({size / 1e6:.0f} MB) "
                "shaped like the real capture's; the 4 toolkit packages (3 versions each) "
                "among them. "
                f"{RUNS} interleaved runs, median (min-max); load average at the end "
                f"{load[0]:.1f} on {os.cpu_count()} cores.",
                "",
                "| picking the 4 toolkit packages | time | peak memory above the index |",
                "|---|---|---|",
                f"| bootfsm, one pass (`select_packages`), goal < 1 s: {ok} | {cell(times['one'])} "
                f"| {peak_one / 1e3:,.0f} KB |",
                f"| the former way (a full parse per package) | {cell(times['former'])} | "
                f"{peak_former / 1e6:.0f} MB |",
                f"| `awk -v RS= '$0 ~ /^Package: NAME\\n/'` (a shell script; prints, no checks) | "
                f"{cell(times['awk'])} | - |",
                "",
                f"Indexes are read up to {256} MiB (bootfsm/fetch/indexes.py `INDEX_MAX_BYTES`; "
                "it was 64 MiB), held once as bytes and once as text.",
            ]
        )
        + "\n"
    )


if __name__ == "__main__":
    print(main())
