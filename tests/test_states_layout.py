"""states/ (the design card) is the one source of ``bootfsm.states``: pyproject.toml's
[tool.setuptools.package-dir] maps it, and nothing else does. No ``bootfsm/states`` link or
directory is in the tree; the editable install resolves ``bootfsm.states`` to states/;
mypy, which reads source paths and not the editable install's import hook, checks every
states/*.py as ``bootfsm.states.*`` through the link ``make mypy-tree`` makes under build/
(gitignored) and names the file it found the error in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STATES = sorted(p.stem for p in (ROOT / "states").glob("*.py") if p.stem != "__init__")
REINSTALL = "reinstall: .venv/bin/pip install -e '.[dev]' (or make), then rerun"


def test_bootfsm_states_is_neither_tracked_nor_in_the_tree() -> None:
    # the pathspec matches the path itself (a link: mode 120000) and all below it (a directory)
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--stage", "--", "bootfsm/states"],
        capture_output=True, check=True, text=True,
    ).stdout  # fmt: skip
    assert tracked == "", f"bootfsm/states is in git again; states/ is its only source:\n{tracked}"
    # an untracked leftover would shadow the mapping too (found before the editable finder)
    assert not os.path.lexists(ROOT / "bootfsm/states"), "remove bootfsm/states: states/ is it"


def test_the_editable_install_maps_bootfsm_states_to_states(tmp_path: Path) -> None:
    """From a directory outside the checkout nothing but the editable install can supply
    bootfsm; it gives bootfsm from bootfsm/ and bootfsm.states from states/, and no
    top-level ``states``."""
    code = (
        "import importlib, importlib.util, json, bootfsm, bootfsm.states as s\n"
        f"names = {STATES!r}\n"
        "mods = {n: importlib.import_module('bootfsm.states.' + n).__file__ for n in names}\n"
        "print(json.dumps({'bootfsm': bootfsm.__file__, 'states': s.__file__,\n"
        "    'path': list(s.__path__), 'mods': mods,\n"
        "    'top_level_states': importlib.util.find_spec('states') is not None}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert p.returncode == 0, f"{p.stderr}\n{REINSTALL}"
    got = json.loads(p.stdout)
    assert got["bootfsm"] == str(ROOT / "bootfsm/__init__.py"), REINSTALL
    assert got["states"] == str(ROOT / "states/__init__.py"), REINSTALL
    assert got["path"] == [str(ROOT / "states")]
    assert got["mods"] == {n: str(ROOT / "states" / f"{n}.py") for n in STATES}
    assert not got["top_level_states"]
    # and in this test process too (bootfsm from the checkout, bootfsm.states the same)
    import bootfsm.states

    assert bootfsm.states.__file__ == str(ROOT / "states/__init__.py")


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_mypy_checks_every_state_as_bootfsm_states(tmp_path: Path) -> None:
    """On a copy of the tree with an error planted in states/fetch.py: after
    ``make mypy-tree``, mypy (the project's config) checks bootfsm/ and every states/*.py
    and reports the planted error, in the file it is in, and fails."""
    pytest.importorskip("mypy")
    src = tmp_path / "src"
    for name in ("bootfsm", "states"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "Makefile"):
        shutil.copy(ROOT / name, src / name)
    fetch = src / "states/fetch.py"
    fetch.write_text(fetch.read_text() + '\n\n_PLANTED: int = "not an int"\n')
    line = len(fetch.read_text().splitlines())
    subprocess.run(["make", "-s", "mypy-tree"], cwd=src, check=True, capture_output=True)
    assert os.readlink(src / "build/mypy/bootfsm/states") == "../../../states"
    p = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
        cwd=src,
        capture_output=True,
        text=True,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    errors = [ln for ln in out.splitlines() if ": error:" in ln]
    assert errors == [
        f"build/mypy/bootfsm/states/fetch.py:{line}: error: Incompatible types in assignment"
        ' (expression has type "str", variable has type "int")  [assignment]'
    ], out
    sources = len(list((ROOT / "bootfsm").rglob("*.py"))) + len(STATES) + 1
    assert f"(checked {sources} source files)" in out, out
