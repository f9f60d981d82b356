"""One run as one OpenTelemetry trace, in OTLP/JSON (the body of POST /v1/traces).

``trace_request`` is pure: journal events in, an ``ExportTraceServiceRequest`` as
JSON-able data out. The run is the root span; each state visit is a child span (its
attempts, retries, skip reason and other journal events are span events); each
command and each downloaded artifact is a child span of the state it ran in. The
resource carries the node (``host.type`` = VM size, ``host.arch``, GPU model and count,
driver version) and ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME``.

``target_from_env`` reads the standard ``OTEL_*`` exporter variables; ``export`` posts
once with a bounded timeout. A run exports at its end only when an endpoint is set
(the runner imports this module only then), and ``bootfsm trace --otlp FILE|URL``
converts any journal, so a fleet can backfill.

Why not the official SDK and OTLP exporter: on every node they add opentelemetry-api,
-sdk, -semantic-conventions, -proto, -exporter-otlp-proto-http, protobuf and
googleapis-common-protos (about 10 MB installed, tens of ms of imports), to send one
batch from a process that is about to exit. OTLP/JSON over HTTP is part of the OTLP
specification and the collector's OTLP/HTTP receiver accepts it on the same
``/v1/traces`` path; the tests decode what this module sends with the official
opentelemetry-proto definitions. Trace and span ids are hex strings, as OTLP/JSON
requires; times are Unix nanoseconds as decimal strings.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from bootfsm import __version__

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
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "amd64": "amd64"}
#: Span event names for the journal events that are steps of a state.
_EVENT_NAMES = {"state.attempt": "attempt", "state.retry": "retry"}
_SKIP_FIELDS = {"t", "ts", "event", "level", "state", "run_id"}


def events_from_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Decode journal lines; lines that are not a JSON object are skipped."""
    out: list[dict[str, Any]] = []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out


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


def _fields(ev: Mapping[str, Any]) -> list[dict[str, Any]]:
    return _attrs((f"bootfsm.{k}", v) for k, v in ev.items() if k not in _SKIP_FIELDS)


def _nanos(unix_s: float) -> str:
    return str(round(unix_s * 1e9))


def _unix(ts: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


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
    """Folds journal events, in order, into spans."""

    def __init__(self, trace_id: str, base: float) -> None:
        self.trace_id, self.base = trace_id, base
        self.spans: list[_Span] = []
        self.run = self._new("", "bootfsm.run", 0.0)
        self.state: _Span | None = None
        self.facts: dict[str, Any] = {}
        self.driver_version = ""
        self.ended = False

    def _new(self, parent: str, name: str, t: float, kind: int = _KIND_INTERNAL) -> _Span:
        digest = hashlib.sha256(f"{self.trace_id}/{len(self.spans)}".encode()).hexdigest()
        span = _Span(digest[:16], parent, name, self.base + t, self.base + t, kind)
        self.spans.append(span)
        return span

    def _event(self, span: _Span, name: str, t: float, ev: Mapping[str, Any]) -> None:
        span.events.append(
            {"timeUnixNano": _nanos(self.base + t), "name": name, "attributes": _fields(ev)}
        )

    def _close_state(self, t: float, error: str = "") -> None:
        if self.state is None:
            return
        self.state.end = self.base + t
        self.state.status = {"code": _STATUS_ERROR, "message": error} if error else {}
        self.state = None

    def _open_state(self, name: str, t: float, ev: Mapping[str, Any]) -> _Span:
        self._close_state(t)
        span = self._new(self.run.span_id, f"state {name}", t)
        span.attributes = _attrs(
            [
                ("bootfsm.state", name),
                ("bootfsm.time_limit_s", ev.get("time_limit_s")),
                ("bootfsm.attempts_max", ev.get("attempts_max")),
            ]
        )
        self.state = span
        return span

    def add(self, ev: Mapping[str, Any]) -> None:
        t = float(ev.get("t") or 0.0)
        name = str(ev.get("event", ""))
        state = str(ev.get("state") or "")
        if not self.ended:  # the run span ends at run.end; later warnings are notes on it
            self.run.end = max(self.run.end, self.base + t)
        if name == "run.start":  # the run's span starts here, not at the journal's t=0
            self.run.start = self.base + t
            self.run.attributes = _fields(ev)
        elif name == "state.enter":
            self._open_state(state, t, ev)
        elif name == "state.skip":
            span = self._open_state(state, t, ev)
            self._event(span, "skip", t, ev)
            span.attributes += _attrs([("bootfsm.outcome", "skipped")])
            self._close_state(t)
        elif name in ("state.done", "state.failed"):
            if self.state is not None:
                failed = name == "state.failed"
                self.state.attributes += _attrs(
                    [("bootfsm.outcome", "failed" if failed else "done")]
                    + [(f"bootfsm.{k}", ev.get(k)) for k in ("attempts", "code", "code_name")]
                )
                self._close_state(t, str(ev.get("message") or "failed") if failed else "")
        elif name == "command":
            self._command(ev, t)
        elif name == "run.end":
            self.ended = True
            self._close_state(t, "" if ev.get("code") == 0 else str(ev.get("message") or ""))
            self.run.attributes += _fields(ev)
            ok = ev.get("code") == 0
            message = "" if ok else f"{ev.get('code')} {ev.get('code_name')}: {ev.get('message')}"
            self.run.status = {"code": _STATUS_OK} if ok else {"code": _STATUS_ERROR}
            if message:
                self.run.status["message"] = message
        elif "artifact" in ev and "duration_s" in ev and "size" in ev:
            self._artifact(ev, t)
        else:
            if name == "node.facts":
                self.facts = dict(ev)
            if name == "driver.install":
                self.driver_version = str(ev.get("version") or "")
            target = self.state if self.state is not None else self.run
            self._event(target, _EVENT_NAMES.get(name, name), t, ev)

    def _child(self, name: str, t: float, duration: float, kind: int) -> _Span:
        parent = self.state.span_id if self.state is not None else self.run.span_id
        span = self._new(parent, name, t - duration, kind)
        span.end = self.base + t
        return span

    def _command(self, ev: Mapping[str, Any], t: float) -> None:
        argv = [str(a) for a in ev.get("argv") or []]
        duration = float(ev.get("duration_s") or 0.0)
        span = self._child(os.path.basename(argv[0]) if argv else "command", t, duration, 1)
        span.attributes = _attrs(
            [
                ("process.command_args", argv),
                ("process.exit_code", ev.get("rc")),
                ("bootfsm.timed_out", ev.get("timed_out")),
            ]
        )
        if ev.get("timed_out"):
            span.status = {"code": _STATUS_ERROR, "message": "timed out"}

    def _artifact(self, ev: Mapping[str, Any], t: float) -> None:
        duration = float(ev.get("duration_s") or 0.0)
        span = self._child(f"fetch {ev.get('artifact')}", t, duration, _KIND_CLIENT)
        span.attributes = _attrs(
            [
                ("url.full", ev.get("url")),
                ("server.address", ev.get("mirror")),
                ("bootfsm.artifact", ev.get("artifact")),
                ("bootfsm.size_bytes", ev.get("size")),
                ("bootfsm.rate_mb_s", ev.get("rate_mb_s")),
                ("bootfsm.mirror_index", ev.get("mirror_index")),
                ("bootfsm.attempts", ev.get("attempts")),
                ("bootfsm.resumed_bytes", ev.get("resumed_bytes")),
            ]
        )


def _resource(b: _Builder, env: Mapping[str, str]) -> list[dict[str, Any]]:
    f = b.facts
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
        "bootfsm.driver.version": b.driver_version or f.get("loaded_driver") or None,
    }
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            detected[unquote(key.strip())] = unquote(value.strip())
    if env.get("OTEL_SERVICE_NAME"):
        detected["service.name"] = env["OTEL_SERVICE_NAME"]
    return _attrs(sorted(detected.items()))


def trace_request(
    events: Sequence[Mapping[str, Any]], env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``ExportTraceServiceRequest`` (OTLP/JSON) of one run's journal events.

    Raises ``ValueError`` when the events hold no ``run.start`` with a timestamp.
    """
    start = next((e for e in events if e.get("event") == "run.start"), None)
    start_unix = _unix(start.get("ts")) if start is not None else None
    if start is None or start_unix is None:
        raise ValueError("the journal has no run.start event with a timestamp")
    run_id = str(start.get("run_id") or "")
    trace_id = hashlib.sha256(f"bootfsm/{run_id}/{start.get('ts')}".encode()).hexdigest()[:32]
    b = _Builder(trace_id, start_unix - float(start.get("t") or 0.0))
    for ev in events:
        b.add(ev)
    b._close_state((b.run.end - b.base), "")
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _resource(b, env or {})},
                "scopeSpans": [
                    {
                        "scope": {"name": "bootfsm", "version": __version__},
                        "spans": [s.json(trace_id) for s in b.spans],
                    }
                ],
            }
        ]
    }


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
    headers = {"Content-Type": "application/json"}
    for item in _env(env, "HEADERS").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            headers[unquote(key.strip())] = unquote(value.strip())
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
