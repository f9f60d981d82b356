"""The exit-code table: distinct, outside reserved ranges, CSE numbers where they mean the same."""

from __future__ import annotations

import json

import pytest

from bootfsm.cli import main
from bootfsm.commands import run, status
from bootfsm.core.codes import CODES, Code, info, verdict_line
from bootfsm.machine.engine import Outcome
from bootfsm.run.session import SessionResult


def test_codes_avoid_reserved_ranges() -> None:
    for code in Code:
        v = int(code)
        assert not 64 <= v <= 78, code
        assert not 200 <= v <= 244 and v != 255, code
        assert not 124 <= v <= 165, code
        assert v not in (1, 2), code


def test_every_code_has_a_row_and_distinct_values() -> None:
    assert set(CODES) == set(Code)
    assert len({int(c) for c in Code}) == len(Code)
    for row in CODES.values():
        assert row.summary and row.hint


def test_cse_numbers_are_reused_where_meaning_matches() -> None:
    assert Code.DOWNLOAD_TIMEOUT == 83
    assert Code.DRIVER_NOT_STARTED == 84
    assert Code.DRIVER_INSTALL_TIMEOUT == 85
    assert Code.INFOROM_CORRUPTED == 87


def test_codes_json_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["codes", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["schema"], doc["kind"]) == (1, "codes")
    rows = doc["codes"]
    assert {r["name"] for r in rows} == {c.name for c in Code}
    assert all({"code", "name", "summary", "hint", "cse"} <= set(r) for r in rows)
    by_name = {r["name"]: r for r in rows}
    assert by_name["OK"]["cse"] == 0 and by_name["INFOROM_CORRUPTED"]["cse"] == 87


@pytest.mark.parametrize("arg", ["31", "checksum_mismatch", "CHECKSUM-MISMATCH"])
def test_explain_by_number_or_name(arg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", arg]) == 0
    out = capsys.readouterr().out
    assert out.startswith("31 CHECKSUM_MISMATCH") and "what to do" in out


def test_explain_unknown_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "199"]) == 2
    assert "unknown exit code" in capsys.readouterr().err


def test_every_command_ends_a_failure_with_the_same_line() -> None:
    """``bootfsm: [command ]FAILED code=N NAME[ state=S]: first line | hint: ...``: the
    message's first line only (a command's output follows it), the code's own hint."""
    msg = "sha256 mismatch for NVIDIA-Linux-x86_64.run\nexpected abc\ngot def"
    hint = info(Code.CHECKSUM_MISMATCH).hint
    assert verdict_line(Code.CHECKSUM_MISMATCH, msg, state="fetch") == (
        "bootfsm: FAILED code=31 CHECKSUM_MISMATCH state=fetch: sha256 mismatch for "
        f"NVIDIA-Linux-x86_64.run | hint: {hint}"
    )
    assert verdict_line(Code.CHECKSUM_MISMATCH, msg, command="prefetch") == (
        "bootfsm: prefetch FAILED code=31 CHECKSUM_MISMATCH: sha256 mismatch for "
        f"NVIDIA-Linux-x86_64.run | hint: {hint}"
    )
    assert verdict_line(Code.INTERRUPTED, "", state="").startswith(
        "bootfsm: INTERRUPTED code=12 INTERRUPTED state=-:  | hint: "
    )


def test_the_run_hook_and_status_lines_come_from_the_same_builder() -> None:
    """run's OK line, the hook's line (its CSE code, the run id) and `bootfsm status`'s
    line for a failed run: one layout, written out here as a reader sees it."""
    ok = SessionResult(Outcome(Code.OK, "done", "node provisioned"), "0fb68e04", None, 41.26)
    assert run.summary_line(ok, "cse") == (
        "bootfsm: OK code=0 OK state=done: node provisioned in 41.3 s | run 0fb68e04"
    )
    hint = info(Code.DEADLINE_EXCEEDED).hint
    late = Outcome(Code.DEADLINE_EXCEEDED, "driver", "global deadline of 5 s ran out\nmore")
    assert run.summary_line(SessionResult(late, "b3a9e30b", None), "cse") == (
        "bootfsm: FAILED code=100 DEADLINE_EXCEEDED state=driver: global deadline of 5 s ran "
        f"out | hint: {hint} | cse exit 85 ERR_GPU_DRIVERS_INSTALL_TIMEOUT | run b3a9e30b"
    )
    assert run.summary_line(SessionResult(late, "", None)) == (
        "bootfsm: FAILED code=100 DEADLINE_EXCEEDED state=driver: global deadline of 5 s ran "
        f"out | hint: {hint}"
    )
    st = status.Status("failed", 31, state="fetch", run_id="acf95737", code=31)
    st.message = "runfile: sha256 628ff95d != expected 3228d6fe"
    assert status._line(st, 5.0) == (
        "bootfsm: failed: run acf95737 code=31 CHECKSUM_MISMATCH state=fetch: runfile: "
        f"sha256 628ff95d != expected 3228d6fe | hint: {info(Code.CHECKSUM_MISMATCH).hint}"
    )
