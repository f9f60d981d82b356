"""Each run as one OpenTelemetry trace, received by a real HTTP server and decoded with
the official opentelemetry-proto definitions (the message the collector decodes).

The receiver does what the collector's OTLP/HTTP JSON unmarshaller does: trace and span
ids are hex in OTLP/JSON, so it turns them into bytes, then parses the rest with
protobuf's own JSON mapping, rejecting any field the schema does not have.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from bootfsm.observe.otlp import events_from_lines, target_from_env, trace_request
from tests.conftest import MakeWorld, run_in_process

_IDS = ("traceId", "spanId", "parentSpanId")


def decode(body: bytes) -> ExportTraceServiceRequest:
    """What a collector receiving OTLP/JSON gets: the official protobuf message."""
    data = json.loads(body)
    for rs in data.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in _IDS:
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return json_format.ParseDict(data, ExportTraceServiceRequest())


class Receiver:
    """A loopback collector: records each request's headers and decoded body."""

    def __init__(self, server: HTTPServer) -> None:
        self.requests: list[tuple[dict[str, str], ExportTraceServiceRequest]] = []
        server.expect_request("/v1/traces", method="POST").respond_with_handler(self._handle)
        self.endpoint = server.url_for("/").rstrip("/")

    def _handle(self, request: Request) -> Response:
        self.requests.append((dict(request.headers), decode(request.get_data())))
        return Response("{}", status=200, content_type="application/json")


def _journal_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _request(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The export of these events, read as the journal lines they are."""
    return trace_request(events_from_lines(json.dumps(e) for e in events))


def _attrs(items: Any) -> dict[str, Any]:
    out = {}
    for kv in items:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which)
    return out


def test_a_boot_is_one_trace_with_a_span_per_state_command_and_artifact(
    make_world: MakeWorld, httpserver: HTTPServer
) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT set: the run sends one request at its end; states,
    commands and downloads are spans with the journal's times, parents and outcomes."""
    rx = Receiver(httpserver)
    w = make_world("h100-pcie")
    env = {
        **w.env(),
        "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s%3Dcret,x-tenant=gpu",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci,cloud.region=westus3",
    }
    result = run_in_process(w, env=env)
    assert result.outcome.code == 0
    [(headers, req)] = rx.requests
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Api-Key"] == "s=cret" and headers["X-Tenant"] == "gpu"
    [rs] = req.resource_spans
    res = _attrs(rs.resource.attributes)
    assert res["service.name"] == "bootfsm" and res["host.type"] == "standard_nc40ads_h100_v5"
    assert res["host.arch"] == "amd64" and res["bootfsm.gpu.model"] == "H100 PCIe"
    assert res["bootfsm.gpu.count"] == 1 and res["deployment.environment"] == "ci"
    installed = next(e for e in _journal_events(result.journal) if e["event"] == "driver.install")  # type: ignore[arg-type]
    assert res["bootfsm.driver.version"] == installed["version"]
    [ss] = rs.scope_spans
    spans = list(ss.spans)
    assert {len(s.trace_id) for s in spans} == {16} and len({s.trace_id for s in spans}) == 1
    assert all(len(s.span_id) == 8 for s in spans)
    assert len({s.span_id for s in spans}) == len(spans)
    by_id = {s.span_id: s for s in spans}
    [root] = [s for s in spans if not s.parent_span_id]
    assert root.name == "bootfsm.run" and root.status.code == Status.STATUS_CODE_OK
    events = _journal_events(result.journal)  # type: ignore[arg-type]
    end = next(e for e in events if e["event"] == "run.end")
    dur = (root.end_time_unix_nano - root.start_time_unix_nano) / 1e9
    assert dur == pytest.approx(end["t"] - events[0]["t"], abs=0.002)
    states = [s for s in spans if s.parent_span_id == root.span_id and s.name.startswith("state")]
    visited = [e["state"] for e in events if e["event"] in ("state.enter", "state.skip")]
    assert [s.name for s in states] == [f"state {n}" for n in visited]
    for s in states:
        assert root.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano
        assert s.end_time_unix_nano <= root.end_time_unix_nano
    commands = [e for e in events if e["event"] == "command"]
    cmd_spans = [s for s in spans if any(a.key == "process.exit_code" for a in s.attributes)]
    assert len(cmd_spans) == len(commands)
    for e, s in zip(commands, cmd_spans, strict=True):
        # a transition's callback runs between states: its command hangs off the run
        assert by_id[s.parent_span_id].name in (f"state {e['state']}", "bootfsm.run")
        assert _attrs(s.attributes)["process.exit_code"] == e["rc"]
        assert _attrs(s.attributes)["process.command_args"].values[0].string_value == (e["argv"][0])
    downloads = [s for s in spans if s.kind == Span.SPAN_KIND_CLIENT]
    fetched = [e for e in events if "artifact" in e and "size" in e and "duration_s" in e]
    assert [s.name for s in downloads] == [f"fetch {e['artifact']}" for e in fetched]
    assert {by_id[s.parent_span_id].name for s in downloads} == {"state fetch"}
    first = _attrs(downloads[0].attributes)
    assert first["bootfsm.size_bytes"] == fetched[0]["size"]
    assert first["server.address"] == fetched[0]["mirror"]
    driver = next(s for s in states if s.name == "state driver")
    assert "attempt" in [ev.name for ev in driver.events]


def test_a_failed_run_marks_its_state_and_the_run_as_errors(
    make_world: MakeWorld, httpserver: HTTPServer
) -> None:
    """A 404: the fetch span and the run span carry STATUS_CODE_ERROR and the code."""
    rx = Receiver(httpserver)
    w = make_world("h100-pcie", ("artifact-404",))
    env = {**w.env(), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rx.endpoint + "/v1/traces"}
    assert run_in_process(w, env=env).outcome.code == 30
    [(_, req)] = rx.requests
    spans = list(req.resource_spans[0].scope_spans[0].spans)
    [root] = [s for s in spans if not s.parent_span_id]
    assert root.status.code == Status.STATUS_CODE_ERROR
    assert root.status.message.startswith("30 ARTIFACT_NOT_FOUND")
    [fetch] = [s for s in spans if s.name == "state fetch"]
    assert fetch.status.code == Status.STATUS_CODE_ERROR and "404" in fetch.status.message
    assert not [s for s in spans if s.name == "state driver"]


def test_backfill_from_a_journal_equals_the_live_export(
    make_world: MakeWorld, httpserver: HTTPServer, tmp_path: Path
) -> None:
    """`bootfsm trace --otlp URL` and `--otlp FILE` send what the run itself sent."""
    rx = Receiver(httpserver)
    w = make_world("h100-pcie")
    env = {**w.env(), "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint}
    result = run_in_process(w, env=env)
    assert result.journal is not None
    out = tmp_path / "trace.json"
    cli = [sys.executable, "-m", "bootfsm", "trace", str(result.journal), "--root", str(w.root)]
    p = subprocess.run([*cli, "--otlp", str(out)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    from_file = decode(out.read_bytes())
    p = subprocess.run(
        [*cli, "--otlp", rx.endpoint + "/v1/traces"], capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, p.stderr
    assert "sent" in p.stderr
    live, posted = rx.requests[0][1], rx.requests[1][1]
    assert from_file.resource_spans[0].scope_spans == live.resource_spans[0].scope_spans
    assert posted.resource_spans[0].scope_spans == live.resource_spans[0].scope_spans


def test_endpoint_down_is_a_warning_not_a_failure(make_world: MakeWorld) -> None:
    """A collector that is not there never changes the boot's outcome."""
    w = make_world("h100-pcie")
    env = {**w.env(), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    result = run_in_process(w, env=env)
    assert result.outcome.code == 0
    notes = [e for e in _journal_events(result.journal) if e["event"] == "warning"]  # type: ignore[arg-type]
    assert any("OTLP export to http://127.0.0.1:9/v1/traces failed" in n["message"] for n in notes)


def test_without_an_endpoint_nothing_is_imported_or_sent() -> None:
    """The run path imports bootfsm.observe.otlp only when an OTLP endpoint is configured."""
    code = (
        "import sys\nimport bootfsm.run.runner, bootfsm.cli\n"
        "print('bootfsm.observe.otlp' in sys.modules)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
        (
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/x",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://o",
            },
            "https://c/x",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_SDK_DISABLED": "true"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_EXPORTER": "none"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, None),
    ],
)
def test_standard_environment_variables(env: dict[str, str], url: str | None) -> None:
    """Endpoint precedence and the switches of the OpenTelemetry environment spec."""
    target = target_from_env(env)
    assert (target.url if target else None) == url


@pytest.mark.parametrize("raw", ["nan", "-5", "abc", "1e309"])
def test_bad_timeout_falls_back_to_the_default(raw: str) -> None:
    target = target_from_env(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_TIMEOUT": raw}
    )
    assert target is not None and target.timeout_s == 10.0


def test_a_journal_without_run_start_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"no run\.start"):
        _request([{"event": "state.enter", "t": 0.1}])


def test_the_run_span_ends_at_run_end_not_at_later_warnings() -> None:
    """A warning journaled after run.end (metrics, guest-agent events) is an event on
    the run span, not time added to it."""
    events = [
        {"event": "run.start", "t": 0.0, "ts": "2026-12-01T10:00:00Z", "run_id": "abcd1234"},
        {"event": "run.end", "t": 2.0, "code": 0, "code_name": "OK"},
        {"event": "warning", "t": 9.0, "message": "metrics file not written"},
    ]
    [root] = _request(events)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert int(root["endTimeUnixNano"]) - int(root["startTimeUnixNano"]) == 2_000_000_000
    assert [e["name"] for e in root["events"]] == ["warning"]


def test_the_run_span_starts_at_run_start_not_at_the_journals_origin() -> None:
    """The journal's clock starts when it is opened; run.start comes a few ms later (more
    on a loaded node): the run span spans run.start to run.end, its timestamp's
    instant, as the journal's events do."""
    events = [
        {"event": "run.start", "t": 0.25, "ts": "2026-12-01T10:00:00Z", "run_id": "abcd1234"},
        {"event": "run.end", "t": 2.0, "code": 0, "code_name": "OK"},
    ]
    [root] = _request(events)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    start, end = int(root["startTimeUnixNano"]), int(root["endTimeUnixNano"])
    assert start == pytest.approx(1796119200 * 10**9, abs=1000)  # 2026-12-01T10:00:00Z
    assert end - start == pytest.approx(1_750_000_000, abs=1000)  # ns, through a float
