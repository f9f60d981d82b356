"""Packaging: the wheel holds bootfsm.states (not a top-level `states`) and a console script;
the CLI's fast commands do not import the heavy libraries."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _wheel(tmp_path: Path) -> Path:
    """The wheel of this checkout's tracked tree, built from a clean copy (a stale build/
    directory of an older layout can never leak into it)."""
    src = tmp_path / "src"
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True, check=True, text=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path / "dist"
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    [wheel] = out.glob("bootfsm-*.whl")
    return wheel


def test_wheel_layout_and_console_script(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    for state in ("detect", "fetch", "driver", "fabric", "imex", "verify", "join"):
        assert f"bootfsm/states/{state}.py" in names
    assert not [n for n in names if n.startswith("states/")]
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "bootfsm = bootfsm.cli:entry" in zipfile.ZipFile(wheel).read(entry).decode()
    # the simulator (stand-ins, mirror, demo) is test tooling: never on a node
    assert not [n for n in names if n.startswith("bootfsm/sim")]
    shipped = {n: zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith(".py")}
    runs_commands = sorted(n for n, text in shipped.items() if "import subprocess" in text)
    assert runs_commands == ["bootfsm/host/process.py"]
    # PEP 639: an SPDX expression and the licence text itself, not the deprecated table
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA")))
    assert "License-Expression: MIT" in meta.decode().splitlines()
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]


def test_an_installed_wheel_says_the_demo_needs_the_source_tree(tmp_path: Path) -> None:
    """From the wheel (no simulator), `bootfsm demo` explains itself and exits 2."""
    site = tmp_path / "site"
    with zipfile.ZipFile(_wheel(tmp_path)) as zf:
        zf.extractall(site)
    # -S: no site-packages processing, so this checkout's editable install is not seen;
    # the dependencies come from this interpreter's site-packages as a plain path
    deps = ":".join(p for p in sys.path if p.endswith("site-packages"))
    code = "import sys; from bootfsm.cli import main; sys.exit(main())"
    p = subprocess.run(
        [sys.executable, "-S", "-c", code, "demo"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={"PYTHONPATH": f"{site}:{deps}", "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 2, p.stderr
    assert "the simulator is not installed" in p.stderr
    assert "make demo" in p.stderr


def test_fast_commands_do_not_import_heavy_libraries() -> None:
    code = (
        "import sys, io, contextlib\n"
        "from bootfsm.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['codes']); main(['explain', '84']); main(['graph'])\n"
        "heavy = ('requests', 'tenacity', 'structlog', 'transitions')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == ""
