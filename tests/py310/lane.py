#!/usr/bin/env python3
"""The Python 3.10 lane: the whole test suite under Ubuntu 22.04's own CPython 3.10.

Ubuntu 22.04 is a supported node OS and its system Python is 3.10, so bootfsm must run
there. This machine has no 3.10, so the lane takes the interpreter Ubuntu ships: the
three .debs of python3.10 from the jammy release pocket (frozen at release, never
removed from the archive), pinned below by sha256 and checked before use. They are
unpacked with the real ``dpkg-deb -x`` into a cache directory (not installed: nothing on
this machine changes), a virtualenv is made with that interpreter, bootfsm and its test
dependencies go in with pip (tomli comes in through the ``python_version < '3.11'``
marker, as it would on a node), and pytest runs the suite exactly as ``make test`` does.

The binary is Ubuntu's; the shared libraries it loads (libc, libssl, libffi...) are this
Debian 12 machine's, which are ABI-compatible (Ubuntu 22.04: glibc 2.35, OpenSSL 3.0;
Debian 12: glibc 2.36, OpenSSL 3.0). What this proves is the language and standard
library of 3.10, which is what differs between the versions.

Usage: python3 tests/py310/lane.py [pytest args...]   ($PY310_CACHE overrides the cache)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = os.environ.get("PY310_UBUNTU_ARCHIVE", "http://archive.ubuntu.com/ubuntu")
# jammy/main/binary-amd64/Packages (release pocket): Filename and SHA256 of each
DEBS = (
    (
        "pool/main/p/python3.10/python3.10-minimal_3.10.4-3_amd64.deb",
        "beb041e53740a7720e4289f0caf3e418469951cd66bb5efbefb298e6b016a187",
    ),
    (
        "pool/main/p/python3.10/libpython3.10-minimal_3.10.4-3_amd64.deb",
        "e83f695339a6b6b691ccfe11e50a54693606371d294351bdeaaedf2fcc1ba09a",
    ),
    (
        "pool/main/p/python3.10/libpython3.10-stdlib_3.10.4-3_amd64.deb",
        "9f631dd658cf253c4a0016d17072056218d8f839383fb41c28fbba1f860364d4",
    ),
)
CACHE = Path(os.environ.get("PY310_CACHE", Path.home() / ".cache" / "bootfsm-py310"))
VENV = REPO / ".venv-py310"


def log(msg: str) -> None:
    print(f"py310: {msg}", flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(rel: str, want: str) -> Path:
    """The .deb at ``rel`` in the cache, downloaded if absent; refused unless its
    sha256 is the pinned one."""
    dest = CACHE / "debs" / Path(rel).name
    if dest.exists() and sha256(dest) == want:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    url = f"{ARCHIVE}/{rel}"
    log(f"downloading {url}")
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
    with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=120) as resp:
        shutil.copyfileobj(resp, out)
    got = sha256(Path(tmp))
    if got != want:
        os.unlink(tmp)
        raise SystemExit(f"py310: {url}: sha256 {got}, pinned {want}: refusing it")
    os.replace(tmp, dest)
    return dest


def interpreter() -> Path:
    """Ubuntu's python3.10, unpacked once per set of pins."""
    key = hashlib.sha256("".join(w for _, w in DEBS).encode()).hexdigest()[:12]
    root = CACHE / f"root-{key}"
    python = root / "usr" / "bin" / "python3.10"
    if python.exists():
        return python
    debs = [fetch(rel, want) for rel, want in DEBS]
    tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=".root-"))
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp)], check=True)
    tmp.rename(root)
    return python


def main(argv: list[str]) -> int:
    python = interpreter()
    out = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version.split()[0])"],
        check=True,
        capture_output=True,
        text=True,
    )
    log(f"interpreter {python} (CPython {out.stdout.strip()}, Ubuntu 22.04 jammy)")
    stamp = VENV / ".installed"
    pyproject = (REPO / "pyproject.toml").read_bytes()
    key = hashlib.sha256(pyproject + str(python).encode()).hexdigest()
    if not stamp.exists() or stamp.read_text() != key:
        shutil.rmtree(VENV, ignore_errors=True)
        # Debian-family Pythons keep ensurepip in a separate package: make the venv
        # bare and let this machine's pip install into it
        subprocess.run([str(python), "-m", "venv", "--without-pip", str(VENV)], check=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(VENV / "bin" / "python"),
                "install",
                "-q",
                "pip",  # the tests build wheels with the interpreter's own pip
                "-e",
                f"{REPO}[dev]",
            ],
            check=True,
        )
        stamp.write_text(key)
    venv_py = VENV / "bin" / "python"
    args = argv or ["-n", "2", "--dist", "loadfile"]
    cmd = [str(venv_py), "-m", "pytest", "-p", "no:cacheprovider", *args]
    log("running " + " ".join(cmd[1:]))
    return subprocess.run(cmd, cwd=REPO, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
