"""Traces of real simulated runs, one per fault: the root cause names the right state and
code, and the CSE events and the metrics textfile of the same run agree with it.

Every fault's node boots once, with the real CLI (`bootfsm run --root NODE`) as a child
process, a few at a time (the runs mostly wait on stand-in commands and fsync); the
tests then read what each run left: exit code, checkpoint, journal, events, metrics.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bootfsm.core.codes import Code
from bootfsm.machine.table import STATES
from bootfsm.observe.trace import load_run, render, to_json
from bootfsm.observe.trace_view import root_cause
from bootfsm.sim.world import FAULTS, World
from tests.trace_schema import check_trace_json

CSE_DIR = "/var/log/azure/Microsoft.Azure.Extensions.CustomScript/events"
PROM = "/var/lib/node_exporter/textfile_collector/bootfsm.prom"
FAST = {  # the sim's waits, shortened: the faults still fire the same way
    "run": {"cse_events_dir": CSE_DIR},
    "verify": {"fabric_timeout": 0.8},
    "join": {"kubelet_timeout": 0.8},
    "driver": {"dpkg_lock_timeout": 0.5, "command_timeout": 1.5},
}
#: What each fault must end with: (state, code) or None for a provisioned node. Every
#: fault of the simulator has its line (tested): a fault missing here fails, never
#: passes with whatever code the run gave.
EXPECTED: dict[str, tuple[str, Code] | None] = {
    "artifact-404": ("fetch", Code.ARTIFACT_NOT_FOUND),
    "checksum-mismatch": ("fetch", Code.CHECKSUM_MISMATCH),
    "http-503x3": None,
    "drop-mid-body": None,
    "dpkg-lock-held": ("driver", Code.DPKG_LOCK_TIMEOUT),
    "inforom-corrupted": ("driver", Code.INFOROM_CORRUPTED),
    "fabric-in-progress-forever": ("verify", Code.FABRIC_NOT_READY),
    "kubelet-unhealthy": ("join", Code.KUBELET_NOT_HEALTHY),
    "installer-fails": ("driver", Code.DRIVER_INSTALL_FAILED),
    "installer-hangs": ("driver", Code.DRIVER_INSTALL_TIMEOUT),
    "stale-driver-in-use": ("driver", Code.REBOOT_REQUIRED),
    "gpu-missing": ("verify", Code.GPU_COUNT_MISMATCH),
    "containerd-restart-fails": ("join", Code.CONTAINERD_RESTART_FAILED),
    "kernel-headers-missing": ("detect", Code.KERNEL_HEADERS_MISSING),
    # dpkg holds only its database lock mid-transaction: dpkg -i cannot take it either
    "dpkg-db-lock-held": ("driver", Code.DPKG_LOCK_TIMEOUT),
    # a half-configured package in dpkg's journal: `dpkg --configure -a` first, then on
    "dpkg-interrupted": None,
    # an older driver nothing holds yet at boot: unloaded and replaced
    "stale-driver": None,
    # a fabric manager unit on a node without NVSwitches: disabled, the boot goes on
    "stale-fabricmanager-unit": None,
    # NVLink5: the fabric manager's precheck needs ib_umad; a kernel without it is
    # the image's fault, not a blip
    "ib-umad-missing": ("fabric", Code.IB_UMAD_NOT_LOADED),
    # no CDI spec: containers cannot get the GPUs through CDI
    "cdi-fails": ("join", Code.CDI_REFRESH_FAILED),
    # a client holds the GPU: MIG mode stays pending until a reset or reboot
    "mig-gpu-in-use": ("mig", Code.MIG_RESET_REQUIRED),
    # a GPU VM size whose GPUs are missing from PCI: a GPU fell off the bus
    "gpus-off-bus": ("detect", Code.NO_GPU),
    # a GRID guest whose vGPU licence never comes: CUDA would say the device is busy
    "grid-unlicensed": ("verify", Code.GRID_NOT_LICENSED),
    # a Trusted Launch VM with Secure Boot on: the runfile's unsigned module never loads
    "secure-boot": ("detect", Code.SECURE_BOOT_NEEDS_SIGNED_MODULE),
    # a GRID driver on a GPU passed through whole: no licence element, no wait
    "grid-passthrough": None,
}
#: The node a fault bites on (SKU, config sections added to FAST); h100-pcie otherwise.
WHERE: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {
    "fabric-in-progress-forever": ("h100-hgx", {}),
    "ib-umad-missing": ("b200-hgx", {}),  # NVLink5: fabric manager with NVLSM
    "mig-gpu-in-use": ("h100-pcie", {"mig": {"profile": "MIG1g"}}),  # a MIG layout
    # a GRID guest (driver.kind = "grid"), its licence wait kept short
    "grid-unlicensed": (
        "a10-nvads",
        {"verify": {"license_timeout": 0.5, "license_poll_interval": 0.1}},
    ),
    "grid-passthrough": (
        "a10-nvads",
        {"verify": {"license_timeout": 0.5, "license_poll_interval": 0.1}},
    ),
}
ALL = sorted(FAULTS)


TABLE_STATES = [s.name for s in STATES]


def _world(fault: str) -> tuple[str, dict[str, dict[str, Any]]]:
    sku, extra = WHERE.get(fault, ("h100-pcie", {}))
    return sku, {**FAST, **extra}


def _cse_events(w: World) -> list[dict[str, Any]]:
    d = w.root / CSE_DIR.lstrip("/")
    names = sorted(p.name for p in d.iterdir())
    assert all(n[:-5].isdigit() and n.endswith(".json") for n in names), names
    return [json.loads((d / n).read_text()) for n in names]


def _metrics(w: World) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    text = (w.root / PROM.lstrip("/")).read_text()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[World, int]]]:
    """Every fault's node, booted once by the real CLI: {fault: (world, exit code)}."""
    base = tmp_path_factory.mktemp("faults")
    worlds: dict[str, World] = {}

    def boot(fault: str) -> int:
        sku, config = _world(fault)
        kind = "grid" if fault.startswith("grid-") else "cuda"
        w = World(base / fault, sku, (fault,), driver_kind=kind, config_overrides=config)
        worlds[fault] = w
        w.__enter__()
        argv, env = w.argv("--quiet"), w.env()
        return subprocess.run(argv, env=env, capture_output=True, timeout=300).returncode

    try:
        with ThreadPoolExecutor(max_workers=6) as pool:
            codes = dict(zip(ALL, pool.map(boot, ALL), strict=True))
        yield {f: (worlds[f], codes[f]) for f in ALL}
    finally:
        for w in worlds.values():
            w.__exit__(None, None, None)


@pytest.mark.parametrize("fault", ALL)
def test_trace_of_fault(runs: dict[str, tuple[World, int]], fault: str) -> None:
    """The trace of a run with this fault names the state and code that ended it, and the
    CSE events and metrics of the same run say the same."""
    w, exit_code = runs[fault]
    code = Code(exit_code)
    checkpoint = json.loads((w.root / "var/lib/bootfsm/checkpoint.json").read_text())
    state = "" if code is Code.OK else checkpoint["state"]
    assert (None if code is Code.OK else (state, code)) == EXPECTED[fault], checkpoint
    [journal] = w.journals()
    report = load_run(journal)
    text = render(report)
    data = to_json(report)
    check_trace_json(data)
    events = _cse_events(w)
    m = _metrics(w)
    assert m["bootfsm_run_exit_code"][()] == exit_code
    assert events[-1]["TaskName"] == "bootfsm.run"
    # one event per state that ended, then the run's; durations and attempts as journaled
    ended = [s.state for s in report.spans if s.outcome in ("done", "skipped", "failed")]
    assert [e["TaskName"] for e in events] == [f"bootfsm.{s}" for s in ended] + ["bootfsm.run"]
    # every state of the table, whether it ran or not (zeros and not_run for the rest)
    spans = {s.state: s for s in report.spans}
    durations = {k[0][1]: v for k, v in m["bootfsm_state_duration_seconds"].items()}
    assert durations == {n: spans[n].duration_s if n in spans else 0 for n in TABLE_STATES}
    attempts = {k[0][1]: v for k, v in m["bootfsm_state_attempts"].items()}
    assert attempts == {n: spans[n].attempts if n in spans else 0 for n in TABLE_STATES}
    hot = {dict(k)["state"]: dict(k)["outcome"] for k, v in m["bootfsm_state_outcome"].items()
           if v == 1}  # fmt: skip
    assert hot == {n: spans[n].outcome if n in spans else "not_run" for n in TABLE_STATES}
    assert len(m["bootfsm_state_outcome"]) == len(TABLE_STATES) * 6
    assert m["bootfsm_run_duration_seconds"][()] == report.duration_s
    outcome = "done" if code is Code.OK else "failed"
    assert {dict(k)["outcome"]: v for k, v in m["bootfsm_run_outcome"].items()} == {
        "running": 0, "done": outcome == "done", "failed": outcome == "failed", "interrupted": 0
    }  # fmt: skip
    if code is Code.OK:
        assert report.outcome == "done" and root_cause(report) is None
        assert "root cause" not in text and data["root_cause"] is None
        assert {e["EventLevel"] for e in events} == {"Informational"}
        assert m["bootfsm_run_success"][()] == 1
        return
    rc = root_cause(report)
    assert rc is not None
    assert (rc["state"], rc["code"], rc["code_name"]) == (state, exit_code, code.name)
    assert data["root_cause"]["state"] == state and data["code"] == exit_code
    assert f"code:     {exit_code} {code.name}" in text
    assert f"state:    {state}" in text and f"hint:     {rc['hint']}" in text
    assert rc["path"][-1] == state and rc["path"][0] == "detect"
    # the guest agent sees an Error for the failing state and for the run, nothing else
    errors = [e for e in events if e["EventLevel"] == "Error"]
    assert [e["TaskName"] for e in errors] == [f"bootfsm.{state}", "bootfsm.run"]
    assert all(code.name in e["Message"] for e in errors)
    assert m["bootfsm_run_success"][()] == 0
    assert m["bootfsm_state_outcome"][(("outcome", "failed"), ("state", state))] == 1
    _specific(fault, report, rc)


def _specific(fault: str, report: Any, rc: dict[str, Any]) -> None:
    cmd = rc["command"]
    if fault == "installer-fails":
        assert cmd["caused_failure"] and cmd["rc"] == 1
        assert cmd["argv"][0].endswith("nvidia-installer") and "ERROR" in cmd["output_tail"]
    if fault == "installer-hangs":
        assert cmd["caused_failure"] and cmd["timed_out"]
    if fault == "dpkg-lock-held":
        assert any("dpkg lock" in n["message"] for n in rc["notes"])
    if fault == "fabric-in-progress-forever":
        assert rc["guards"]["driver -> fabric"]["needs_fabric_manager"] is True


def test_retries_are_in_the_timeline_and_metrics(runs: dict[str, tuple[World, int]]) -> None:
    """A 503 x3 mirror: three retries with back-off sleeps in fetch, counted in the metrics."""
    w, _ = runs["http-503x3"]
    report = load_run(w.journals()[-1])
    fetch = report.span("fetch")
    assert fetch is not None and fetch.outcome == "done"
    assert len(fetch.retries) == 3 and fetch.attempts == 4 and fetch.sleep_s > 0
    assert all("503" in r["error"] for r in fetch.retries)
    assert "3 retries" in render(report)
    m = _metrics(w)
    assert m["bootfsm_state_retries"][(("state", "fetch"),)] == 3
    assert m["bootfsm_state_attempts"][(("state", "fetch"),)] == 4


def test_every_fault_has_its_expected_outcome() -> None:
    """The table of expectations names every fault the simulator knows, and only those
    (`bootfsm demo --fault list`): a new fault without its expected code fails here."""
    assert set(EXPECTED) == set(FAULTS)
    assert set(WHERE) <= set(FAULTS)
