"""bootfsm installed the way a node has it, for whole-process benchmarks.

A node runs bootfsm from a wheel install: plain files in site-packages, byte-compiled
at install. The development venv has an editable install instead, whose import hook
(loaded by ``site`` at every interpreter start) and path remapping cost a node nothing.
This builds ``build/bench-node/``: the wheel's files installed with pip (``--target``,
no dependencies, compiled), with the development venv's third-party packages
(requests, structlog, tenacity, transitions) reached through a ``.pth`` line, so no
network is needed. Rebuilt on every benchmark run (a few seconds).
"""

from __future__ import annotations

import compileall
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "build" / "bench-node"
PYTHON = NODE / "bin" / "python"


def install() -> Path:
    """A fresh venv ``build/bench-node`` with bootfsm's wheel files in its site-packages;
    returns its interpreter."""
    shutil.rmtree(NODE, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(NODE)], check=True)
    site = Path(
        subprocess.run(
            [str(PYTHON), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
    subprocess.run(
        [*pip, "--no-compile", "--target", str(site), str(ROOT)], check=True, capture_output=True
    )
    compileall.compile_dir(site / "bootfsm", quiet=1)
    deps = sysconfig.get_paths()["purelib"]  # the dev venv: requests, structlog, ...
    (site / "bench-deps.pth").write_text(deps + "\n")  # a path line: its .pth files stay off
    script = NODE / "bin" / "bootfsm"  # what pip writes for [project.scripts]
    script.write_text(
        f"#!{PYTHON}\nimport sys\nfrom bootfsm.cli import entry\n"
        "if __name__ == '__main__':\n    sys.exit(entry())\n"
    )
    script.chmod(0o755)
    check()
    return PYTHON


def argv(*args: str) -> list[str]:
    """``bootfsm ARGS``: the node install's console script."""
    return [str(NODE / "bin" / "bootfsm"), *args]


def env(base: dict[str, str]) -> dict[str, str]:
    """``base`` without development-only interpreter settings (a unit has neither)."""
    drop = ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH")
    return {k: v for k, v in base.items() if k not in drop}


def check() -> None:
    """Fail loudly unless bootfsm is imported from the node install, without the
    editable install's hook."""
    code = "import sys, bootfsm; print(bootfsm.__file__, any('editable' in m for m in sys.modules))"
    p = subprocess.run(
        [str(PYTHON), "-c", code],
        env=env(dict(os.environ)),
        capture_output=True,
        text=True,
        cwd=NODE,  # not the source tree: -c puts the working directory on the path
    )
    where, hooked = [*p.stdout.split(), "", ""][:2]
    if p.returncode != 0 or not where.startswith(str(NODE)) or hooked != "False":
        raise SystemExit(f"bench: node install broken: {p.stdout.strip()} {p.stderr[-300:]}")
