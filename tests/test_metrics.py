"""The node_exporter textfile written at the end of every run, read back with
prometheus_client's own text-format parser (test_trace_faults.py checks it for every
fault's run: exit code, success, outcome, per-state durations and attempts)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bootfsm.core.config import ConfigError, parse_config
from bootfsm.machine.table import STATES
from bootfsm.observe.trace import Span, TraceReport, load_run
from bootfsm.run.metrics import textfile
from tests.conftest import MakeWorld, run_in_process

PROM = "var/lib/node_exporter/textfile_collector/bootfsm.prom"
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def _parse(text: str) -> tuple[Samples, dict[str, str]]:
    samples: Samples = {}
    types: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples, types


def test_failed_run_textfile_and_disabled_and_unwritable(make_world: MakeWorld) -> None:
    """A 404: exit code 30, fetch failed. With the key empty no file is written; with an
    unwritable path the run keeps its outcome and the journal carries a warning."""
    w = make_world("h100-pcie", ("artifact-404",))
    result = run_in_process(w)
    path = w.root / PROM
    samples, types = _parse(path.read_text())
    assert set(types.values()) == {"gauge"}
    assert [p.name for p in path.parent.iterdir()] == ["bootfsm.prom"]  # no temporary left
    [info] = samples["bootfsm_run_info"]
    assert dict(info)["outcome"] == "failed" and "run_id" not in dict(info)
    assert samples["bootfsm_run_exit_code"][()] == 30
    assert samples["bootfsm_state_outcome"][(("outcome", "failed"), ("state", "fetch"))] == 1
    assert samples["bootfsm_run_success"][()] == 0
    (w.root / PROM).unlink()
    w.config_overrides = {"run": {"metrics_file": ""}}
    w.write_config()
    assert run_in_process(w).outcome.code == result.outcome.code
    assert not (w.root / PROM).exists()
    (w.root / "var/lib/blocked").write_text("a file where a directory should be\n")
    w.config_overrides = {"run": {"metrics_file": "/var/lib/blocked/bootfsm.prom"}}
    w.write_config()
    third = run_in_process(w)
    assert third.outcome.code == result.outcome.code
    report = load_run(third.journal)  # type: ignore[arg-type]
    assert any("metrics file /var/lib/blocked/bootfsm.prom not written" in n["message"]
               for n in report.notes)  # fmt: skip


def test_labels_are_escaped_for_the_parser() -> None:
    """Quotes, backslashes and newlines in label values survive a round trip."""
    r = TraceReport(version='a"b\\c\nd', outcome="failed", code=41, code_name="X", duration_s=2.5)
    r.spans = [Span('dri"ver', 0.0, 2.5, attempts=2, outcome="failed")]
    samples, _ = _parse(textfile(r, now=1_700_000_000.0))
    [info] = samples["bootfsm_run_info"]
    assert dict(info)["version"] == 'a"b\\c\nd'
    assert samples["bootfsm_state_attempts"][(("state", 'dri"ver'),)] == 2
    assert samples["bootfsm_run_end_timestamp_seconds"][()] == 1_700_000_000.0


@pytest.mark.parametrize("key", ["metrics_file", "cse_events_dir"])
def test_config_paths_must_be_absolute_or_empty(key: str) -> None:
    """A relative path is a config error naming the key; empty turns the output off."""
    with pytest.raises(ConfigError, match=f"run.{key}"):
        parse_config({"run": {key: "relative/path"}})
    assert getattr(parse_config({"run": {key: ""}}).run, key) == ""


def test_defaults() -> None:
    """Metrics on at the node_exporter default path; CSE events off."""
    cfg = parse_config({})
    assert cfg.run.metrics_file == "/" + PROM
    assert cfg.run.cse_events_dir == ""


def test_file_says_running_while_a_run_is_in_progress(make_world: MakeWorld) -> None:
    """After a provisioned boot, the next run rewrites the file as soon as it starts:
    a run killed mid-way can never leave the previous run's success behind."""
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.code == 0
    seen: list[Samples] = []

    def on_state(state: str) -> None:
        if state == "fetch":
            seen.append(_parse((w.root / PROM).read_text())[0])

    boot = "8e4c6a3f-5d1b-4c1e-9a0d-2b7f3e6c9d10"
    (w.root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (w.root / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")
    assert run_in_process(w, on_state=on_state).outcome.code == 0
    [during] = seen
    assert during["bootfsm_run_success"][()] == 0
    assert during["bootfsm_run_exit_code"][()] == -1
    assert {dict(k)["outcome"]: v for k, v in during["bootfsm_run_outcome"].items()} == {
        "running": 1, "done": 0, "failed": 0, "interrupted": 0
    }  # fmt: skip
    [info] = during["bootfsm_run_info"]
    assert dict(info)["boot_id"] == boot and dict(info)["outcome"] == "running"
    assert during["bootfsm_run_start_timestamp_seconds"][()] > 1_600_000_000
    assert during["bootfsm_run_end_timestamp_seconds"][()] == 0
    hot = {dict(k)["state"]: dict(k)["outcome"]
           for k, v in during["bootfsm_state_outcome"].items() if v == 1}  # fmt: skip
    assert hot == {s.name: "not_run" for s in STATES}
    after = _parse((w.root / PROM).read_text())[0]
    assert after["bootfsm_run_success"][()] == 1
    assert after["bootfsm_run_start_timestamp_seconds"][()] == pytest.approx(
        during["bootfsm_run_start_timestamp_seconds"][()], abs=1.0
    )


def test_every_state_is_present_one_hot_with_zeros() -> None:
    """A run that failed in fetch still lists every state; each has exactly one 1."""
    r = TraceReport(outcome="failed", code=30, code_name="ARTIFACT_NOT_FOUND", duration_s=1.0)
    r.spans = [Span("detect", 0.0, 0.2, outcome="done"), Span("fetch", 0.2, 0.8, outcome="failed")]
    samples, _ = _parse(textfile(r, now=1_700_000_000.0))
    rows = samples["bootfsm_state_outcome"]
    names = [s.name for s in STATES]
    assert {dict(k)["state"] for k in rows} == set(names)
    for name in names:
        ones = [dict(k)["outcome"] for k, v in rows.items() if dict(k)["state"] == name and v]
        expected = {"detect": "done", "fetch": "failed"}.get(name, "not_run")
        assert ones == [expected], name
    assert samples["bootfsm_state_attempts"][(("state", "join"),)] == 0
