"""The CSE mapping of the exit-code table (`bootfsm run --exit-codes cse`): every code
maps to a real AgentBaker code of the same meaning, never to a network code."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from bootfsm.cli import main
from bootfsm.commands.codes import cse_markdown
from bootfsm.core.codes import CODES, Code
from bootfsm.core.cse import CSE_FALLBACK, CSE_NAMES, cse_exit, unmapped_codes
from bootfsm.machine.table import STATES
from tests.agentbaker_codes import AGENTBAKER_CODES, BY_NUMBER, GPU, SERVICE

ROOT = Path(__file__).resolve().parent.parent
HOOK_DOC = ROOT / "docs/provisioning-hook.md"
STATE_NAMES = {s.name for s in STATES}


def _all_cse(code: Code) -> set[int]:
    return {cse_exit(code)} | {c for _, c in CODES[code].cse_in_state}


def test_every_code_is_mapped() -> None:
    """A code without a row (or a row without `cse`) fails here: key its row
    `(Code.NAME, <AgentBaker code of the same meaning>)` (docs/provisioning-hook.md)."""
    assert unmapped_codes() == []


def test_an_unmapped_code_is_caught_and_falls_back_to_84() -> None:
    """The check itself can fail: a row without `cse` is listed, and at run time such a
    code exits with the generic GPU failure, never 0 nor its own number."""
    row = CODES[Code.FABRIC_MANAGER_FAILED]
    table = {**CODES, row.code: dataclasses.replace(row, cse=None)}
    assert unmapped_codes(table) == [Code.FABRIC_MANAGER_FAILED]
    missing = dict(CODES)
    del missing[Code.IMEX_INSTALL_FAILED]
    assert unmapped_codes(missing) == [Code.IMEX_INSTALL_FAILED]
    assert CSE_FALLBACK == 84


def test_every_cse_number_is_an_agentbaker_code_with_its_name() -> None:
    for code in Code:
        for number in _all_cse(code):
            if code is Code.OK:
                assert number == 0
                continue
            assert number in BY_NUMBER, (code, number)
            assert CSE_NAMES[number] == BY_NUMBER[number], number
    for number, name in CSE_NAMES.items():
        assert number == 0 or AGENTBAKER_CODES[name][0] == number


def test_ok_is_zero_and_no_failure_is_zero() -> None:
    assert cse_exit(Code.OK) == 0 and cse_exit(Code.OK, "done") == 0
    assert all(0 not in _all_cse(c) for c in Code if c is not Code.OK)


def test_gpu_failures_map_to_gpu_codes_never_to_network() -> None:
    """bootfsm in hook mode is the GPU step: every failure is a GPU code, except the two
    that are about a service the peer also reports as such (kubelet, containerd)."""
    services = {Code.KUBELET_NOT_HEALTHY, Code.CONTAINERD_RESTART_FAILED}
    for code in Code:
        if code is Code.OK:
            continue
        for number in _all_cse(code):
            topic = AGENTBAKER_CODES[BY_NUMBER[number]][1]
            assert topic == (SERVICE if code in services else GPU), (code, number, topic)


def test_timeouts_map_to_timeout_codes_and_back() -> None:
    """A code about running out of time maps to a CSE TIMEOUT code; a CSE TIMEOUT code
    is reached only from a timeout or a transient code (a wait that ran out)."""
    for code in Code:
        if code is Code.OK:
            continue
        timed = "TIMEOUT" in code.name or "DEADLINE" in code.name
        for number in _all_cse(code):
            cse_timeout = "TIMEOUT" in BY_NUMBER[number]
            if timed:
                assert cse_timeout, (code, number)
            if cse_timeout:
                assert timed or CODES[code].transient, (code, number)


# Written by hand from AgentBaker's names and from where cse_config.sh / cse_main.sh exit
# with them (see docs/provisioning-hook.md), not from the table under test.
SAME_MEANING = [
    (Code.DOWNLOAD_TIMEOUT, "", 83),
    (Code.DOWNLOAD_RETRIES_EXHAUSTED, "", 83),
    (Code.DRIVER_NOT_STARTED, "", 84),
    (Code.MODULE_LOAD_FAILED, "", 84),  # nvidia-modprobe -u -c0 || exit 84
    (Code.FABRIC_MANAGER_FAILED, "", 84),  # systemctlEnableAndStart nvidia-fabricmanager || 84
    (Code.DRIVER_INSTALL_FAILED, "", 84),  # installGPUDriverImage failed: exit 84
    (Code.DRIVER_INSTALL_TIMEOUT, "", 85),
    (Code.INFOROM_CORRUPTED, "", 87),
    (Code.KUBELET_NOT_HEALTHY, "", 34),
    (Code.CONTAINERD_RESTART_FAILED, "", 4),
    (Code.DEADLINE_EXCEEDED, "driver", 85),
    (Code.DEADLINE_EXCEEDED, "fetch", 83),
    (Code.STATE_TIMEOUT, "fetch", 83),
    (Code.STATE_TIMEOUT, "verify", 85),
    (Code.ARTIFACT_NOT_FOUND, "fetch", 84),
    (Code.CHECKSUM_MISMATCH, "fetch", 84),
    (Code.DRIVER_KIND_UNSUPPORTED_ON_ARCH, "detect", 84),
]


@pytest.mark.parametrize(("code", "state", "cse"), SAME_MEANING)
def test_same_meaning(code: Code, state: str, cse: int) -> None:
    assert cse_exit(code, state) == cse


def test_state_overrides_name_real_states() -> None:
    for row in CODES.values():
        assert {s for s, _ in row.cse_in_state} <= STATE_NAMES, row.code


def test_codes_json_shows_cse_per_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["codes", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["schema"], doc["kind"]) == (1, "codes")
    rows = doc["codes"]
    assert len(rows) == len(Code)
    for r in rows:
        code = Code(r["code"])
        assert r["cse"] == cse_exit(code) and r["cse_name"] == CSE_NAMES[r["cse"]]
        assert r["cse_in_state"] == dict(CODES[code].cse_in_state)
    by_name = {r["name"]: r for r in rows}
    assert by_name["FABRIC_MANAGER_FAILED"]["cse"] == 84
    assert by_name["DEADLINE_EXCEEDED"]["cse_in_state"] == {"fetch": 83}


def test_explain_names_the_cse_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "50"]) == 0
    assert "CSE exit (--exit-codes cse): 84 ERR_GPU_DRIVERS_START_FAIL" in capsys.readouterr().out


def test_hook_doc_mapping_table_is_generated() -> None:
    """docs/provisioning-hook.md holds exactly `cse_markdown()` between its markers."""
    text = HOOK_DOC.read_text()
    m = re.search(r"<!-- cse-table: generated.*?-->\n(.*?)<!-- /cse-table -->", text, re.S)
    assert m is not None
    assert m.group(1) == cse_markdown()


def test_the_unit_keeps_bootfsm_codes() -> None:
    """bootfsm.service runs without --exit-codes: its RestartPreventExitStatus and
    `bootfsm status` speak bootfsm's own codes; the flag defaults to bootfsm."""
    unit = (ROOT / "systemd/bootfsm.service").read_text()
    exec_start = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert exec_start and all("--exit-codes" not in line for line in exec_start)
    from bootfsm.cli import build_parser

    assert build_parser().parse_args(["run"]).exit_codes == "bootfsm"
