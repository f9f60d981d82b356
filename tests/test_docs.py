"""Generated docs stay in step with the tables they come from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bootfsm.cli import main
from bootfsm.commands.codes import markdown as codes_markdown
from bootfsm.commands.graph import markdown as machine_markdown
from bootfsm.commands.graph import mermaid

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_machine_doc_is_generated_from_the_table() -> None:
    assert (DOCS / "machine.md").read_text() == machine_markdown()


def test_codes_doc_is_generated_from_the_table() -> None:
    assert (DOCS / "codes.md").read_text() == codes_markdown()


def test_graph_mermaid_names_every_guard(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["graph", "--format", "mermaid"]) == 0
    out = capsys.readouterr().out
    assert out == mermaid()
    for guard in ("needs_fabric_manager", "needs_imex", "no_nvlink_fabric"):
        assert guard in out
    assert "driver --> fabric: needs_fabric_manager" in out


def test_graph_json_is_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["graph", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in data["states"]] == [
        "detect",
        "fetch",
        "driver",
        "fabric",
        "imex",
        "verify",
        "mig",
        "join",
    ]
    assert data["terminal"] == ["done", "failed"]
    driver = next(s for s in data["states"] if s["name"] == "driver")
    assert driver["timeout_code"] == {"code": 85, "name": "DRIVER_INSTALL_TIMEOUT"}
