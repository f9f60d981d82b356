"""One run as one OpenTelemetry trace, in OTLP/JSON (the body of POST /v1/traces).

The run is the root span, each state visit its child, each command and download a child of
its state. Stdlib, not the SDK (docs/trace.md says why); ids are hex and times Unix
nanoseconds as decimal strings, as OTLP/JSON requires."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from bootfsm import __version__
from bootfsm.observe.trace import Mark, TraceReport, parse_events, unix_time

__all__ = [
    "OtlpTarget",
    "events_from_lines",
    "export",
    "target_for",
    "target_from_env",
    "trace_request",
]

_KIND_INTERNAL, _KIND_CLIENT = 1, 3
_STATUS_OK, _STATUS_ERROR = 1, 2
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}  # others as they are
_OPEN = ("running", "interrupted")  # a state span's outcomes while run.end closes it
#: A download span's attributes and the journal fields they come from.
_FETCH = [("url.full", "url"), ("server.address", "mirror"), ("bootfsm.artifact", "artifact")]
_FETCH += [("bootfsm.size_bytes", "size")]
_FETCH += [(f"bootfsm.{k}", k) for k in ("rate_mb_s", "mirror_index", "attempts", "resumed_bytes")]
#: Span event names for the journal events that are steps of a state.
_EVENT_NAMES = {"state.attempt": "attempt", "state.retry": "retry", "state.skip": "skip"}


def events_from_lines(lines: Iterable[str]) -> TraceReport:
    """The report of journal lines with their marks (trace's one reader and fold)."""
    return parse_events(lines, marks=True)


def _value(v: Any) -> dict[str, Any]:
    """One OTLP AnyValue."""
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list | tuple):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    if isinstance(v, dict):
        return {"stringValue": json.dumps(v, sort_keys=True)}
    return {"stringValue": str(v)}


def _attrs(items: Iterable[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in items if v is not None]


def _fields(fields: Mapping[str, Any]) -> list[dict[str, Any]]:
    return _attrs((f"bootfsm.{k}", v) for k, v in fields.items())


def _nanos(unix_s: float) -> str:
    return str(round(unix_s * 1e9))


@dataclass
class _Span:
    span_id: str
    parent: str
    name: str
    start: float
    end: float
    kind: int = _KIND_INTERNAL
    attributes: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)

    def json(self, trace_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "traceId": trace_id,
            "spanId": self.span_id,
            "name": self.name,
            "kind": self.kind,
            "startTimeUnixNano": _nanos(self.start),
            "endTimeUnixNano": _nanos(max(self.end, self.start)),
            "attributes": self.attributes,
            "events": self.events,
            "status": self.status,
        }
        if self.parent:
            out["parentSpanId"] = self.parent
        return out


class _Builder:
    """The spans of one report: the run, a span per state visit, its commands and fetches."""

    def __init__(self, r: TraceReport, trace_id: str, base: float) -> None:
        self.r, self.trace_id, self.base = r, trace_id, base
        self.spans: list[_Span] = []
        end = r.end_t if r.end_t is not None else r.last_t
        self.run = self._new("", "bootfsm.run", r.start_t, end)
        self.states: dict[int, _Span] = {}
        for m in r.marks:
            self.add(m)

    def _state(self, i: int) -> _Span:
        """The span of ``r.spans[i]``, made at its first event."""
        if i not in self.states:
            s = self.r.spans[i]
            span = self._new(self.run.span_id, f"state {s.state}", s.start_t, s.end_t)
            span.attributes = _attrs([("bootfsm.state", s.state)])
            self.states[i] = span
        return self.states[i]

    def _new(
        self, parent: str, name: str, t: float, end: float, kind: int = _KIND_INTERNAL
    ) -> _Span:
        digest = hashlib.sha256(f"{self.trace_id}/{len(self.spans)}".encode()).hexdigest()
        span = _Span(digest[:16], parent, name, self.base + t, self.base + end, kind)
        self.spans.append(span)
        return span

    def add(self, m: Mark) -> None:
        span = self.run if m.span is None else self._state(m.span)
        if m.event in ("state.enter", "state.skip"):
            span.start = self.base + m.t  # the postcondition checks before it are the run's
        handler = _ADD.get(m.event)
        if handler is not None:
            handler(self, span, m)
        elif m.event == "command" or {"artifact", "duration_s", "size"} <= m.fields.keys():
            self._child(span, m.fields, m.t, fetch=m.event != "command")
        else:
            self._event(span, m)

    def _run_start(self, span: _Span, m: Mark) -> None:
        self.run.attributes = _fields(m.fields)

    def _run_end(self, span: _Span, m: Mark) -> None:
        f = m.fields
        self.run.attributes += _fields(f)
        ok = f.get("code") == 0
        self.run.status = {"code": _STATUS_OK} if ok else {"code": _STATUS_ERROR}
        if not ok:
            self.run.status["message"] = f"{f.get('code')} {f.get('code_name')}: {f.get('message')}"
            i, message = len(self.r.spans) - 1, str(f.get("message") or "")
            if message and i in self.states and self.r.spans[i].outcome in _OPEN:
                self.states[i].status = {"code": _STATUS_ERROR, "message": message}

    def _enter(self, span: _Span, m: Mark) -> None:
        keys = ("time_limit_s", "attempts_max")
        span.attributes += _attrs([(f"bootfsm.{k}", m.fields.get(k)) for k in keys])

    def _close(self, span: _Span, m: Mark) -> None:
        """state.done or state.failed: the span ends at the journal's time of it."""
        f, failed = m.fields, m.event == "state.failed"
        span.end = self.base + m.t
        span.attributes += _attrs(
            [("bootfsm.outcome", "failed" if failed else "done")]
            + [(f"bootfsm.{k}", f.get(k)) for k in ("attempts", "code", "code_name")]
        )
        if failed:
            span.status = {"code": _STATUS_ERROR, "message": str(f.get("message") or "failed")}

    def _event(self, span: _Span, m: Mark) -> None:
        """Another event of the span (an attempt, a retry, a skip...): a span event."""
        name = _EVENT_NAMES.get(m.event, m.event)
        at = _nanos(self.base + m.t)
        span.events.append({"timeUnixNano": at, "name": name, "attributes": _fields(m.fields)})
        if m.event == "state.skip":
            span.attributes += _attrs([("bootfsm.outcome", "skipped")])

    def _child(self, parent: _Span, f: Mapping[str, Any], t: float, fetch: bool) -> None:
        """A command's span, or a download's (``_FETCH`` names its attributes)."""
        start = t - float(f.get("duration_s") or 0.0)
        if fetch:
            span = self._new(parent.span_id, f"fetch {f['artifact']}", start, t, _KIND_CLIENT)
            span.attributes = _attrs((key, f.get(name)) for key, name in _FETCH)
            return
        argv = [str(a) for a in f.get("argv") or []]
        span = self._new(parent.span_id, os.path.basename(argv[0]) if argv else "command", start, t)
        command = [("process.command_args", argv), ("process.exit_code", f.get("rc"))]
        span.attributes = _attrs([*command, ("bootfsm.timed_out", f.get("timed_out"))])
        if f.get("timed_out"):
            span.status = {"code": _STATUS_ERROR, "message": "timed out"}


#: What each event kind adds to the spans; a command or a download is a child span, any
#: other event a span event.
_ADD = {
    "run.start": _Builder._run_start,
    "run.end": _Builder._run_end,
    "state.enter": _Builder._enter,
    "state.done": _Builder._close,
    "state.failed": _Builder._close,
}


def _resource(r: TraceReport, env: Mapping[str, str]) -> list[dict[str, Any]]:
    f = r.facts
    installed = [m.fields for m in r.marks if m.event == "driver.install"]
    driver = str(installed[-1].get("version") or "") if installed else ""
    detected: dict[str, Any] = {
        "service.name": "bootfsm",
        "service.version": __version__,
        "os.type": "linux",
        "host.type": f.get("vm_size") or None,
        "host.arch": _ARCH.get(str(f.get("arch") or ""), f.get("arch") or None),
        "bootfsm.os": f.get("os"),
        "bootfsm.kernel": f.get("kernel"),
        "bootfsm.gpu.model": f.get("gpu_model"),
        "bootfsm.gpu.count": f.get("gpu_count"),
        "bootfsm.gpu.family": f.get("gpu_family"),
        "bootfsm.driver.version": driver or f.get("loaded_driver") or None,
    }
    return _attrs(sorted({**detected, **_from_env(env)}.items()))


def _pairs(text: str) -> dict[str, str]:
    """The ``key=value`` pairs of a comma-separated, percent-encoded OTel variable."""
    pairs = (item.partition("=") for item in text.split(","))
    return {unquote(k.strip()): unquote(v.strip()) for k, sep, v in pairs if sep and k.strip()}


def _from_env(env: Mapping[str, str]) -> dict[str, str]:
    """The ``OTEL_RESOURCE_ATTRIBUTES`` pairs, then ``OTEL_SERVICE_NAME``, over detected ones."""
    out = _pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
    if env.get("OTEL_SERVICE_NAME"):
        out["service.name"] = env["OTEL_SERVICE_NAME"]
    return out


def trace_request(report: TraceReport, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The OTLP/JSON request of one run's report; ValueError when no ``run.start`` has a time."""
    start_unix = unix_time(report.started)
    if start_unix is None:
        raise ValueError("the journal has no run.start event with a timestamp")
    seed = f"bootfsm/{report.run_id}/{report.started}"
    trace_id = hashlib.sha256(seed.encode()).hexdigest()[:32]
    b = _Builder(report, trace_id, start_unix - report.start_t)
    spans = [s.json(trace_id) for s in b.spans]
    scope = {"scope": {"name": "bootfsm", "version": __version__}, "spans": spans}
    resource = {"attributes": _resource(report, env or {})}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [scope]}]}


@dataclass(frozen=True)
class OtlpTarget:
    """Where and how to send (from the standard ``OTEL_EXPORTER_OTLP_*`` variables)."""

    url: str
    headers: Mapping[str, str]
    timeout_s: float
    ca_file: str = ""
    note: str = ""  # a protocol remark worth a journal line


def _env(env: Mapping[str, str], name: str) -> str:
    """The traces-specific variable, else the general one (the spec's precedence)."""
    return env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}", "")


def target_from_env(env: Mapping[str, str]) -> OtlpTarget | None:
    """The export target, or None when tracing is off (no endpoint, disabled, grpc)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = env.get("OTEL_TRACES_EXPORTER") or "otlp"
    if "otlp" not in [x.strip().lower() for x in exporters.split(",")]:
        return None
    url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
    if not url and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        url = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    if not url:
        return None
    protocol = _env(env, "PROTOCOL").strip().lower()
    if protocol == "grpc":
        return None
    note = "OTLP protocol http/protobuf requested; bootfsm sends http/json" * (
        protocol == "http/protobuf"
    )
    return target_for(url, env, note)


def target_for(url: str, env: Mapping[str, str], note: str = "") -> OtlpTarget:
    """A target at ``url`` with the headers, timeout and CA file the environment sets."""
    headers = {"Content-Type": "application/json", **_pairs(_env(env, "HEADERS"))}
    try:
        timeout = float(_env(env, "TIMEOUT") or 10000) / 1000.0
    except ValueError:
        timeout = 10.0
    if not 0 < timeout <= 60:  # NaN, negatives and absurd values: the default
        timeout = 10.0
    return OtlpTarget(url, headers, timeout, _env(env, "CERTIFICATE"), note)


def export(target: OtlpTarget, body: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """POST the request once; '' on success, else a message (never with header values)."""
    from bootfsm.core.errors import BootError, TransientError
    from bootfsm.core.redact import redact_url
    from bootfsm.host.http import Http, check_url

    http_env = dict(env)
    if target.ca_file:
        http_env["REQUESTS_CA_BUNDLE"] = target.ca_file
    where = redact_url(target.url)
    try:
        check_url(target.url, ["127.0.0.1", "localhost", "::1"])
        client = Http(connect_timeout=target.timeout_s, read_timeout=target.timeout_s, env=http_env)
        try:
            reply = client.post(
                target.url,
                json.dumps(body, separators=(",", ":")).encode(),
                headers=target.headers,
                timeout=target.timeout_s,
            )
        finally:
            client.close()
    except (BootError, TransientError) as exc:
        return f"OTLP export to {where} failed: {exc}"
    if not 200 <= reply.status < 300:
        return f"OTLP export to {where} failed: HTTP {reply.status}"
    return ""
