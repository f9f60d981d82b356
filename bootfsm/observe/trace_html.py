"""One run as one self-contained HTML page: a Gantt chart of its states, the root cause.

Nothing is fetched, so it opens offline from a ticket. The SVG (``<title>`` tooltips) is
whole without the script, which only adds the ``#states`` table from ``#trace-data`` and
sets ``data-ready="1"``. Probes are drawn neutral, never red (docs/trace.md)."""

from __future__ import annotations

import html
import json
import math
from typing import Any

from bootfsm.core.node_paths import INSTALLER_LOG
from bootfsm.observe.trace import Span, TraceReport
from bootfsm.observe.trace_view import guard_rows, report_json

__all__ = ["near_misses", "render_html"]

#: Logs on the node that say more about a failure in a state (besides the run journal).
STATE_LOGS = {
    "driver": (INSTALLER_LOG,),
    "fabric": ("journalctl -u nvidia-fabricmanager",),
    "imex": ("journalctl -u nvidia-imex",),
    "join": ("journalctl -u containerd", "journalctl -u kubelet"),
}

_LABEL_W = 96
_CHART_W = 800
_ROW_H = 34
_BAR_H = 18
_TOP = 28

_CSS = """
:root{--fg:#1d2330;--muted:#667;--bg:#fff;--done:#3b8f5a;--skipped:#b9c2cc;
--failed:#d1382f;--running:#3b6fd1;--interrupted:#e0962b;--sleep:#f2d36b}
body{font:14px/1.45 system-ui,sans-serif;color:var(--fg);background:var(--bg);margin:24px}
h1{font-size:20px;margin:0 0 4px}.muted{color:var(--muted)}
.badge{display:inline-block;padding:1px 8px;border-radius:9px;color:#fff;font-size:13px}
.badge.done{background:var(--done)}.badge.failed,.badge.killed{background:var(--failed)}
.badge.interrupted{background:var(--interrupted)}.badge.running,.badge.unknown{background:var(--running)}
section.cause{border-left:4px solid var(--failed);padding:6px 12px;margin:12px 0;background:#fdf1f0}
section.cause dt{font-weight:600;float:left;width:8em}section.cause dd{margin:0 0 2px 8.5em}
.badge.near-miss{background:var(--interrupted);margin-left:6px}
pre{background:#f4f5f7;padding:8px;overflow:auto;max-height:14em;font-size:12px;
white-space:pre-wrap;overflow-wrap:anywhere}
#legend{list-style:none;padding:0;margin:6px 0;font-size:12px;color:var(--muted)}
#legend li{display:inline-block;margin-right:14px}
#legend i{display:inline-block;width:14px;height:8px;margin-right:4px;vertical-align:middle}
svg .bar.done{fill:var(--done)}svg .bar.skipped{fill:var(--skipped)}
svg .bar.failed{fill:var(--failed);stroke:#7a0f0a;stroke-width:2}
svg .bar.running{fill:var(--running)}svg .bar.interrupted{fill:var(--interrupted)}
svg .sleep{fill:var(--sleep);opacity:.9}svg .retry{stroke:#7a0f0a;stroke-width:2}
svg .cmd{fill:#4a5568}svg .cmd.bad{fill:var(--failed)}
svg .cmd.probe{fill:#fff;stroke:#8a94a6;stroke-width:1}svg .axis line{stroke:#dde}
svg text{font:12px system-ui,sans-serif;fill:var(--fg)}
svg .fail-label{fill:var(--failed);font-weight:600}
svg .bar:hover,svg .cmd:hover,svg .sleep:hover{opacity:.75;cursor:pointer}
table{border-collapse:collapse;margin-top:12px}
td,th{padding:3px 10px;border-bottom:1px solid #e3e6ea;text-align:left}
tr.failed td{color:var(--failed);font-weight:600}tr.sel td{background:#fff7d6}
"""

_JS = """
(function(){
  var data = JSON.parse(document.getElementById('trace-data').textContent);
  var body = document.querySelector('#states tbody');
  data.states.forEach(function(s){
    var tr = document.createElement('tr');
    tr.className = s.outcome; tr.setAttribute('data-state', s.state);
    [s.state, s.start_s.toFixed(2), s.duration_s.toFixed(2),
     (s.attempts || '-') + (s.attempts_max ? '/' + s.attempts_max : ''),
     s.retries.length, s.commands, s.outcome].forEach(function(v){
      var td = document.createElement('td'); td.textContent = String(v); tr.appendChild(td);
    });
    body.appendChild(tr);
  });
  document.querySelectorAll('svg .bar').forEach(function(bar){
    bar.addEventListener('click', function(){
      document.querySelectorAll('#states tr').forEach(function(tr){
        var same = tr.getAttribute('data-state') === bar.getAttribute('data-state');
        tr.classList.toggle('sel', same);
      });
    });
  });
  document.querySelectorAll('pre').forEach(function(p){ p.scrollTop = p.scrollHeight; });
  document.documentElement.setAttribute('data-ready', '1');
})();
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _nice_step(total: float) -> float:
    raw = max(total, 1e-3) / 8
    mag = 10.0 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def _json_script(data: dict[str, Any]) -> str:
    text = json.dumps(data, default=str, separators=(",", ":"))
    for a, b in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(a, b)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _x(t: float, scale: float) -> float:
    return round(_LABEL_W + max(0.0, t) * scale, 2)


# tests/test_trace_html.py matches rect.bar.<outcome>, line.retry, rect.sleep, rect.cmd
def _svg(r: TraceReport) -> str:
    total = max(r.duration_s or 0.0, r.last_t, *(s.end_t for s in r.spans), 1e-3)
    scale = _CHART_W / total
    height = _TOP + _ROW_H * max(1, len(r.spans)) + 8
    width = _LABEL_W + _CHART_W + 250
    parts = [
        f'<svg id="gantt" class="gantt" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="timeline of run {_e(r.run_id)}">',
        '<g class="axis">',
    ]
    step = _nice_step(total)
    k = 0
    while k * step <= total + 1e-9:
        tx = _x(k * step, scale)
        parts.append(
            f'<line x1="{tx}" y1="{_TOP - 6}" x2="{tx}" y2="{height - 4}"/>'
            f'<text x="{tx}" y="{_TOP - 10}" text-anchor="middle">{k * step:g} s</text>'
        )
        k += 1
    parts.append("</g>")
    lanes: list[list[dict[str, Any]]] = [[] for _ in r.spans]
    for c in r.commands:
        row = _command_row(r.spans, c)
        if row is not None:
            lanes[row].append(c)
    for i, s in enumerate(r.spans):
        parts += _row(r, s, lanes[i], _TOP + i * _ROW_H, scale)
    parts.append("</svg>")
    return "\n".join(parts)


def _command_row(spans: list[Span], c: dict[str, Any]) -> int | None:
    """The row a command is drawn in: the last span of its state that started at or before
    it, else its state's first; None when no span has its state. Not a time window: a
    transition's callback runs after its state's span closed, later on a slower node."""
    rows = [i for i, s in enumerate(spans) if s.state == c["state"]]
    started = [i for i in rows if spans[i].start_t - 1e-6 <= c["t"]]
    return started[-1] if started else (rows[0] if rows else None)


def _row(
    r: TraceReport, s: Span, commands: list[dict[str, Any]], y: int, scale: float
) -> list[str]:
    """One state's row: its label, its bar, its retries and commands, its failure."""
    w = max(2.0, round(s.duration_s * scale, 2))
    tip = (
        f"{s.state}: {s.outcome}, starts at {s.start_t:.2f} s, {s.duration_s:.2f} s, "
        f"attempts {s.attempts or '-'}{'/' + str(s.attempts_max) if s.attempts_max else ''}, "
        f"{len(s.retries)} retries, slept {s.sleep_s:.2f} s, {s.commands} commands"
    )
    parts = [
        f'<g class="row" data-state="{_e(s.state)}">',
        f'<text class="label" x="6" y="{y + 14}">{_e(s.state)}</text>',
        f'<rect class="bar {_e(s.outcome)}" data-state="{_e(s.state)}" x="{_x(s.start_t, scale)}" '
        f'y="{y}" width="{w}" height="{_BAR_H}" rx="3"><title>{_e(tip)}</title></rect>',
    ]
    parts += [_retry(rt, s.start_t, y, scale) for rt in s.retries]
    parts += [_command(c, y, scale) for c in commands]
    if s.outcome in ("failed", "interrupted"):
        label = r.code_name if s.outcome == "failed" else "interrupted"
        parts.append(
            f'<text class="fail-label" x="{_x(s.start_t, scale) + w + 6}" y="{y + 14}">'
            f"\u2717 {_e(label)}</text>"
        )
    return [*parts, "</g>"]


def _retry(rt: dict[str, Any], start_t: float, y: int, scale: float) -> str:
    """A retry's back-off sleep and its mark."""
    t0 = _x(float(rt.get("t") or start_t), scale)
    sw = max(1.0, round(float(rt.get("sleep_s") or 0.0) * scale, 2))
    what = f"retry after attempt {rt.get('attempt')}: {rt.get('code')} {rt.get('error')}"
    sleep = f"back-off sleep {rt.get('sleep_s')} s; {what}"
    return (
        f'<rect class="sleep" x="{t0}" y="{y + 3}" width="{sw}" height="{_BAR_H - 6}">'
        f"<title>{_e(sleep)}</title></rect>"
        f'<line class="retry" x1="{t0}" y1="{y - 2}" x2="{t0}" y2="{y + _BAR_H + 2}">'
        f"<title>{_e(what)}</title></line>"
    )


def _command(c: dict[str, Any], y: int, scale: float) -> str:
    """A command under its state's bar: dark, red when it failed, hollow for a probe."""
    probe = bool(c.get("probe"))  # the fold's: a probe that timed out is none
    bad = (c["rc"] != 0 and not probe) or c["timed_out"]
    cw = max(1.5, round(float(c["duration_s"]) * scale, 2))
    tip = f"{' '.join(c['argv'])[:300]} -> exit {c['rc']} in {c['duration_s']} s"
    if probe:
        tip += " (probe: a non-zero answer is expected, not a fault)"
    cls = "cmd bad" if bad else ("cmd probe" if probe else "cmd")
    return (
        f'<rect class="{cls}" x="{_x(c["t"], scale)}" y="{y + _BAR_H + 3}" '
        f'width="{cw}" height="5"><title>{_e(tip)}</title></rect>'
    )


def _cause(r: TraceReport, rc: dict[str, Any] | None) -> str:
    if rc is None:
        return ""
    out = ['<section class="cause" id="root-cause"><h2>Root cause</h2><dl>']
    out += [f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in _cause_rows(r, rc)]
    out.append("</dl>")
    cmd = rc["command"]
    if cmd:
        label = "failed command" if cmd["caused_failure"] else "last command"
        out.append(
            f"<p><b>{label}</b>: <code>{_e(' '.join(cmd['argv']))}</code> "
            f"\u2192 exit {_e(cmd['rc'])}{' (timed out)' if cmd['timed_out'] else ''}</p>"
        )
        if cmd["output_tail"]:
            out.append(f"<pre>{_e(cmd['output_tail'])}</pre>")
    out.append("</section>")
    return "\n".join(out)


def _cause_rows(r: TraceReport, rc: dict[str, Any]) -> list[tuple[str, str]]:
    """The root cause as (term, text): what failed, the way there, then where to look."""
    code = f"{rc['code']} {rc['code_name']}" if rc["code"] is not None else "none (no verdict)"
    rows = [
        ("state", rc["state"]),
        ("code", code),
        ("message", rc["message"].splitlines()[0] if rc["message"] else ""),
        ("hint", _node_paths(r, rc["hint"])),
        ("path", " \u2192 ".join(rc["path"])),
    ]
    rows += guard_rows(rc)
    rows += [
        ("retry", f"attempt {t.get('attempt')}: {t.get('code')} {t.get('error')}")
        for t in rc["retries"]
    ]
    rows += [("note", n["message"]) for n in rc["notes"]]
    return rows + [("log", p) for p in log_paths(r, rc["state"])]


def _on_node(r: TraceReport, node_path: str) -> str:
    """Where a node path is as seen from the journal's root (``--root`` of the run)."""
    root = r.root.rstrip("/")
    return f"{root}{node_path}" if root and node_path.startswith("/") else node_path


def _node_paths(r: TraceReport, text: str) -> str:
    return text.replace(INSTALLER_LOG, _on_node(r, INSTALLER_LOG)) if r.root else text


def log_paths(r: TraceReport, state: str) -> list[str]:
    """The run's own journal, then the logs that say more about ``state`` on this node."""
    journal = r.journal_path or r.source
    out = [f"{journal} (this run's journal)"] if journal else []
    out += [_on_node(r, p) for p in STATE_LOGS.get(state, ())]
    return out


def near_misses(r: TraceReport) -> list[str]:
    """States of a successful run that succeeded only on their last allowed attempt."""
    if r.outcome != "done":
        return []
    return [
        s.state
        for s in r.spans
        if s.outcome == "done"
        and s.attempts_max
        and s.attempts_max > 1
        and s.attempts >= s.attempts_max
    ]


_LEGEND = (
    '<ul id="legend"><li><i style="background:var(--done)"></i>state done</li>'
    '<li><i style="background:var(--skipped)"></i>skipped (postcondition held)</li>'
    '<li><i style="background:var(--failed)"></i>failed</li>'
    '<li><i style="background:#7a0f0a;width:2px;height:12px"></i>retry (an attempt failed)</li>'
    '<li><i style="background:var(--sleep)"></i>back-off sleep before a retry</li>'
    '<li><i style="background:#4a5568"></i>command</li>'
    '<li><i style="background:var(--failed)"></i>command that failed</li>'
    '<li><i style="background:#fff;border:1px solid #8a94a6"></i>probe: a question whose '
    "non-zero answer is expected (e.g. package not installed yet), not a fault</li></ul>"
)


def render_html(r: TraceReport) -> str:
    """The whole page for one run (no external resources)."""
    data = report_json(r)
    f = r.facts
    node = (
        f"{f.get('gpu_count')}x {f.get('gpu_model')} \u00b7 {f.get('arch')} \u00b7 "
        f"{f.get('os')} \u00b7 kernel {f.get('kernel')} \u00b7 vm {f.get('vm_size') or '-'}"
        if f
        else "node facts unknown"
    )
    dur = f"{r.duration_s:.2f} s" if r.duration_s is not None else "?"
    code = f" \u00b7 code {r.code} {r.code_name}" if r.code not in (None, 0) else ""
    warnings = "".join(f"<li>{_e(w)}</li>" for w in r.warnings)
    close = near_misses(r)
    near = (
        f'<span class="badge near-miss" title="succeeded on the last allowed attempt of: '
        f'{_e(", ".join(close))}">NEAR MISS: {_e(", ".join(close))}</span>'
        if close
        else ""
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>bootfsm trace {_e(r.run_id or r.source)}</title>"
        f'<meta name="viewport" content="width=device-width"><style>{_CSS}</style></head>\n'
        f'<body data-outcome="{_e(r.outcome)}">\n<header><h1>run {_e(r.run_id or "?")} '
        f'<span class="badge {_e(r.outcome)}">{_e(r.outcome.upper())}</span>{near}</h1>'
        f'<p class="muted">{_e(r.started)} \u00b7 {dur}{_e(code)} \u00b7 {_e(node)}</p></header>\n'
        f"{_cause(r, data['root_cause'])}\n{_svg(r)}\n{_LEGEND}\n"
        '<table id="states"><thead><tr><th>state</th><th>start s</th><th>duration s</th>'
        "<th>attempts</th><th>retries</th><th>commands</th><th>outcome</th></tr></thead>"
        "<tbody></tbody></table>\n"
        + (f'<ul class="warnings">{warnings}</ul>\n' if warnings else "")
        + f'<script type="application/json" id="trace-data">{_json_script(data)}</script>\n'
        f"<script>{_JS}</script>\n</body></html>\n"
    )
