"""`bootfsm trace --html`: one self-contained page, checked in real headless Chromium.

Chromium loads the file, runs its script and dumps the resulting DOM; the test reads the
bars, retry marks and the script-built state table from that DOM. Without a `chromium`
binary (`make deps` installs the Debian package) the browser tests skip, saying so.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bootfsm import states
from bootfsm.cli import main
from bootfsm.machine.context import Context
from bootfsm.observe.trace import load_run, parse_events
from bootfsm.observe.trace_html import render_html
from tests.conftest import MakeWorld, run_in_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (Debian package `chromium`; `make deps`)"
)


class _Dom(HTMLParser):
    """Every start tag as (tag, attributes), in document order; ``row`` is the
    ``data-state`` of the chart row (``g.row``) each tag is in ("" outside a row)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.rows: list[str] = []
        self._groups: list[str] = []  # the open <g> elements' row states

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        self.rows.append(next((g for g in reversed(self._groups) if g), ""))
        if tag == "g":
            self._groups.append(a.get("data-state", "") if "row" in a.get("class", "") else "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "g" and self._groups:
            self._groups.pop()

    def having(self, tag: str, cls: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and cls in a.get("class", "").split()]

    def rows_of(self, tag: str, cls: str) -> list[str]:
        """The row state of each ``tag.cls``, in document order."""
        return [
            row
            for (t, a), row in zip(self.tags, self.rows)
            if t == tag and cls in a.get("class", "").split()
        ]


def _dump_dom(page: Path, tmp_path: Path) -> _Dom:
    assert CHROMIUM is not None
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = _Dom()
    dom.feed(proc.stdout)
    return dom


def test_page_is_self_contained() -> None:
    """Nothing to fetch: no src/href/url()/@import; the SVG namespace is the only URL."""
    report = parse_events(['{"event": "run.start", "t": 0, "run_id": "ab12cd34"}'])
    page = render_html(report)
    assert not re.search(r"\b(src|href)\s*=|url\(|@import", page)
    assert set(re.findall(r"https?://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}


def test_untrusted_text_is_escaped() -> None:
    """Command output with markup or a closing script tag stays text."""
    lines = [
        '{"event": "run.start", "t": 0, "run_id": "x"}',
        '{"event": "state.enter", "t": 0.1, "state": "driver"}',
        '{"event": "command", "t": 0.5, "state": "driver", "argv": ["<b>x</b>"], "rc": 1,'
        ' "duration_s": 0.2, "output": "</script><script>alert(1)</script>"}',
        '{"event": "state.failed", "t": 0.6, "state": "driver", "code": 41,'
        ' "code_name": "DRIVER_INSTALL_FAILED", "message": "<img onerror=x>",'
        ' "detail": {"argv": ["<b>x</b>"], "returncode": 1}, "output": "</script>"}',
    ]
    page = render_html(parse_events(lines))
    assert "<b>x</b>" not in page and "<img" not in page
    assert page.count("<script") == 2 and page.count("</script>") == 2


@needs_chromium
def test_failed_run_with_retries_in_chromium(make_world: MakeWorld, tmp_path: Path) -> None:
    """503 x3 then a DKMS failure: one bar per state, the driver bar marked failed, three
    retry marks and back-off sleeps on fetch, and the script ran (data-ready, table)."""
    w = make_world("h100-pcie", ("http-503x3", "installer-fails"))
    result = run_in_process(w)
    assert result.journal is not None and result.outcome.code.name == "DRIVER_INSTALL_FAILED"
    page = tmp_path / "trace.html"
    assert main(["trace", "--root", str(w.root), "--html", str(page)]) == 0
    report = load_run(result.journal)
    dom = _dump_dom(page, tmp_path)
    html_tag = next(a for t, a in dom.tags if t == "html")
    assert html_tag.get("data-ready") == "1"  # set by the page's script
    bars = dom.having("rect", "bar")
    assert [b["data-state"] for b in bars] == [s.state for s in report.spans]
    assert [b["data-state"] for b in dom.having("rect", "failed")] == ["driver"]
    rows = [a for t, a in dom.tags if t == "tr" and "data-state" in a]  # built by the script
    assert [r["data-state"] for r in rows] == [s.state for s in report.spans]
    assert [r["data-state"] for r in rows if "failed" in r.get("class", "")] == ["driver"]
    assert len(dom.having("line", "retry")) == 3 and len(dom.having("rect", "sleep")) == 3
    assert dom.having("rect", "cmd") and dom.having("rect", "bad")
    assert any(a.get("id") == "root-cause" for _, a in dom.tags)


@needs_chromium
def test_healthy_run_has_no_red_probes_in_chromium(
    make_world: MakeWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provisioned node's expected probes (dpkg-query of a toolkit package not yet
    installed exits 1, twice: the postcondition's question and the install's look
    before it changes anything) are journaled `probe: true` at level info and drawn neutral; the
    legend says what they are. The transition after driver starts 20 ms late, as on a
    slow node: its probe is still drawn in driver's row."""
    stale_fm = states.CALLBACKS["disable_stale_fabric_manager"]

    def slow_node(ctx: Context) -> None:
        time.sleep(0.02)
        stale_fm(ctx)

    slowed = {**states.CALLBACKS, "disable_stale_fabric_manager": slow_node}
    monkeypatch.setattr(states, "CALLBACKS", slowed)  # bootfsm.run.runner reads it per run
    w = make_world("h100-pcie")
    result = run_in_process(w)
    assert result.journal is not None and result.outcome.code.name == "OK"
    events = [json.loads(line) for line in result.journal.read_text().splitlines()]
    commands = [e for e in events if e["event"] == "command"]
    answered_no = [e["argv"][0] for e in commands if e["rc"] != 0]
    assert answered_no == ["dpkg-query", "dpkg-query"]
    assert all(e.get("probe") is True and e["level"] == "info" for e in commands if e["rc"] != 0)
    page = tmp_path / "trace.html"
    assert main(["trace", "--root", str(w.root), "--html", str(page)]) == 0
    dom = _dump_dom(page, tmp_path)
    assert dom.having("rect", "bad") == []
    # one hollow rect per probe, in its state's row; the probe that the transition after
    # driver runs (is fabric manager left enabled?) comes after driver's span closed
    assert sorted(dom.rows_of("rect", "probe")) == sorted(
        e["state"] for e in commands if e.get("probe")
    )
    assert len(dom.having("rect", "cmd")) == len(commands)
    assert any(a.get("id") == "legend" for _, a in dom.tags)
    assert dom.having("span", "near-miss") == []  # every state needed one attempt


def test_a_transition_callbacks_command_is_drawn_in_its_states_row() -> None:
    """A command the transition after driver runs (``systemctl is-enabled`` of fabric
    manager, journaled with state driver) starts after driver's span closed: 40 ms later
    on a slow node. It is drawn in driver's row all the same, once; none is dropped."""
    ev = [
        {"event": "run.start", "t": 0, "run_id": "cb1", "schema": 1},
        {"event": "state.enter", "t": 0.1, "state": "driver"},
        {"event": "command", "t": 1.0, "state": "driver", "argv": ["nvidia-smi"], "rc": 0,
         "duration_s": 0.3},
        {"event": "state.done", "t": 1.2, "state": "driver", "duration_s": 1.1, "attempts": 1},
        {"event": "command", "t": 1.44, "state": "driver", "argv": ["systemctl", "is-enabled",
         "nvidia-fabricmanager.service"], "rc": 1, "duration_s": 0.2, "probe": True},
        {"event": "transition", "t": 1.45, "source": "driver", "dest": "verify"},
        {"event": "state.enter", "t": 1.5, "state": "verify"},
        {"event": "command", "t": 1.9, "state": "verify", "argv": ["nvidia-smi"], "rc": 0,
         "duration_s": 0.3},
        {"event": "state.done", "t": 2.0, "state": "verify", "duration_s": 0.5, "attempts": 1},
        {"event": "run.end", "t": 2.1, "outcome": "done", "code": 0, "code_name": "OK",
         "state": "done", "duration_s": 2.1},
    ]  # fmt: skip
    report = parse_events([json.dumps(e) for e in ev])
    assert [(s.state, s.end_t) for s in report.spans] == [("driver", 1.2), ("verify", 2.0)]
    dom = _Dom()
    dom.feed(render_html(report))
    assert dom.rows_of("rect", "cmd") == ["driver", "driver", "verify"]
    assert dom.rows_of("rect", "probe") == ["driver"]


def _run_lines(attempts: int) -> list[str]:
    ev = [
        {"event": "run.start", "t": 0, "run_id": "nm1", "schema": 1},
        {"event": "state.enter", "t": 0.1, "state": "fetch", "attempts_max": 5},
    ]
    for n in range(1, attempts + 1):
        ev.append({"event": "state.attempt", "t": 0.1 + n, "state": "fetch", "attempt": n})
        if n < attempts:
            ev.append(
                {"event": "state.retry", "t": 0.5 + n, "state": "fetch", "attempt": n,
                 "sleep_s": 0.4, "error": "HTTP 503", "code": "DOWNLOAD_FAILED"}
            )  # fmt: skip
    ev += [
        {"event": "state.done", "t": 7.0, "state": "fetch", "attempts": attempts},
        {"event": "run.end", "t": 7.1, "outcome": "done", "code": 0, "code_name": "OK",
         "state": "done", "duration_s": 7.1},
    ]  # fmt: skip
    return [json.dumps(e) for e in ev]


@needs_chromium
def test_near_miss_badge_in_chromium(tmp_path: Path) -> None:
    """Success on the 5th of 5 allowed attempts is a near miss; on the 4th it is not."""
    for attempts, badge in ((5, True), (4, False)):
        page = tmp_path / f"nm{attempts}.html"
        page.write_text(render_html(parse_events(_run_lines(attempts))))
        dom = _dump_dom(page, tmp_path)
        assert bool(dom.having("span", "near-miss")) is badge, attempts


def test_pre_wraps_and_hints_name_the_node_logs(make_world: MakeWorld) -> None:
    """A driver failure's root cause lists this run's journal and the installer log as
    they are on this node (under --root), and the hint's log path is that one too."""
    w = make_world("h100-pcie", ("installer-fails",))
    result = run_in_process(w)
    assert result.journal is not None
    page = render_html(load_run(result.journal))
    installer_log = f"{w.root.resolve()}/var/log/nvidia-installer.log"
    assert f"<dt>log</dt><dd>{installer_log}</dd>" in page
    assert f"<dt>log</dt><dd>{result.journal} (this run&#x27;s journal)</dd>" in page
    hint = re.search(r"<dt>hint</dt><dd>([^<]*)</dd>", page)
    assert hint is not None and installer_log in hint.group(1)
    assert re.search(r"pre\{[^}]*white-space:pre-wrap", page)
