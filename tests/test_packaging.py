"""Packaging: the wheel holds bootfsm.states (not a top-level `states`) and a console script;
the CLI's fast commands do not import the heavy libraries."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_layout_and_console_script(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    [wheel] = tmp_path.glob("bootfsm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for state in ("detect", "fetch", "driver", "fabric", "imex", "verify", "join"):
        assert f"bootfsm/states/{state}.py" in names
    assert not [n for n in names if n.startswith("states/")]
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "bootfsm = bootfsm.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


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
