"""`bootfsm graph --format mermaid` and docs/machine.md render in real Mermaid.

Each pinned Mermaid release (its own browser bundle, `dist/mermaid.min.js` from the npm
package, fetched by `make deps` into .venv/mermaid/<version>/) renders the diagram in
headless Chromium; the page writes "OK svg" or Mermaid's own error into the DOM. Without
the bundles or Chromium the tests skip outside CI and fail on CI.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bootfsm.commands.graph import mermaid
from tests.samples import on_ci

REPO = Path(__file__).resolve().parents[1]
MERMAID_DIR = REPO / ".venv" / "mermaid"
VERSIONS = ("10.9.8", "11.17.2")  # keep in step with MERMAID_VERSIONS in the Makefile
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

_PAGE = """<!doctype html><html><head><meta charset="utf-8">
<script src="{bundle}"></script></head><body><div id="out">pending</div><script>
mermaid.initialize({{startOnLoad: false}});
const out = document.getElementById("out");
mermaid.render("g", {source}).then(
  r => {{ out.textContent = r.svg.includes("<svg") ? "OK svg" : "no svg"; }},
  e => {{ out.textContent = "ERROR " + String((e && e.message) || e); }});
</script></body></html>
"""


def _bundle(version: str) -> Path:
    path = MERMAID_DIR / version / "mermaid.min.js"
    missing = None if path.is_file() else f"{path} missing (make deps fetches it)"
    if CHROMIUM is None:
        missing = "chromium not installed (make deps)"
    if missing:
        if on_ci():
            pytest.fail(missing, pytrace=False)
        pytest.skip(missing)
    return path


def _render(version: str, source: str, tmp_path: Path) -> str:
    bundle = _bundle(version)
    page = tmp_path / "page.html"
    page.write_text(_PAGE.format(bundle=bundle.as_uri(), source=json.dumps(source)))
    assert CHROMIUM is not None
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<div id="out">([^<]*)</div>', proc.stdout)
    assert found, proc.stdout[-2000:]
    return html.unescape(found.group(1))


@pytest.mark.parametrize("version", VERSIONS)
def test_graph_renders(version: str, tmp_path: Path) -> None:
    """The diagram `bootfsm graph` prints renders to an SVG, not to a syntax error."""
    assert _render(version, mermaid(), tmp_path) == "OK svg"


@pytest.mark.parametrize("version", VERSIONS)
def test_machine_doc_block_renders(version: str, tmp_path: Path) -> None:
    """The mermaid block in docs/machine.md (what GitHub shows) renders too."""
    doc = (REPO / "docs" / "machine.md").read_text()
    block = doc.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert _render(version, block, tmp_path) == "OK svg"


@pytest.mark.parametrize("version", VERSIONS)
def test_harness_reports_mermaid_errors(version: str, tmp_path: Path) -> None:
    """The harness can fail: a note on a state no edge declared yet is an error."""
    bad = "stateDiagram-v2\n    [*] --> a\n    note right of failed: x\n    failed --> [*]\n"
    assert _render(version, bad, tmp_path).startswith("ERROR")
