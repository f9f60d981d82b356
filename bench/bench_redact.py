"""Redaction of long and hostile text: the pattern before issue 41 against today's.

Every message and journal field passes through ``redact_text``. Before issue 41 its URL
pattern retried a run of scheme characters from each of its characters (quadratic): the
baseline below is that pattern, kept here only to measure it. Each figure is the best of
three runs of ``redact_text`` on one string.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

from bootfsm.core.redact import _SECRET_PARAM, redact_text, redact_url

_OLD_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?:[^\s'\"<>]|<redacted>)+")


def _old_redact_text(text: str) -> str:
    """``redact_text`` as it was before issue 41 (the baseline)."""
    if "://" in text:
        text = _OLD_URL.sub(lambda m: redact_url(m.group(0)), text)
    return _SECRET_PARAM.sub(lambda m: f"{m.group(1)}=<redacted>", text)


def _best(fn: Callable[[str], str], text: str, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(text)
        best = min(best, time.perf_counter() - t0)
    return best


def _after_url(n: int) -> str:
    return "https://m.example/x?sig=1 " + "a" * n


def _adversarial() -> str:
    """About 10 MB: the shapes of tests/test_hostile_text.py."""
    return "".join(
        [
            "h" * 4_000_000,
            " https://user:pw@m.example/x.run?sv=1&sig=s ",
            ("+" * 996 + "a:// ") * 1000,
            "1" * 1_000_000 + "://x ",
            "://" * 1_000_000,
            " " + "a.b-c+d" * 143_000 + "://host/p?token=s",
        ]
    )


def main() -> str:
    rows = []
    for n in (10_000, 20_000, 40_000, 80_000):
        text = _after_url(n)
        old, new = _best(_old_redact_text, text, 1), _best(redact_text, text)
        rows.append(f"| {n:,} letters after a URL | {old:.3f} s | {new:.4f} s |")
    for n in (1_000_000, 10_000_000):
        text = _after_url(n)
        rows.append(f"| {n:,} letters after a URL | (hours) | {_best(redact_text, text):.3f} s |")
    text = _adversarial()
    rows.append(
        f"| {len(text):,} characters: runs of scheme characters, {text.count('://'):,} `://`,"
        f" a URL with credentials | (hours) | {_best(redact_text, text):.2f} s |"
    )
    return (
        "## Redaction of long and hostile text (bench/bench_redact.py, issue 41)\n\n"
        "`redact_text` on one string, best of three (the pattern before issue 41: one run,"
        " it grows with the square of the run; `(hours)`: not run). Every message and"
        " journal field passes through it; quotes of outside text are excerpts, so this"
        " is the worst a message can hold. Load average when it ran:"
        f" {os.getloadavg()[0]:.1f} (a shared machine: compare the columns, not runs).\n\n"
        "| text | before issue 41 | now |\n|---|---|---|\n" + "\n".join(rows) + "\n"
    )


if __name__ == "__main__":
    print(main())
