"""Shared helpers of the artifact builders: tool runs, names, fixed times, digests.

:func:`run_tool` runs an external tool (``makeself``, ``dpkg-deb``, ``gpg``) with no
shell and a timeout, raising :class:`ArtifactError`; archive member times are fixed
(:data:`EPOCH`) so that contents are reproducible. Used by :mod:`artifacts_packages`,
:mod:`artifacts_redist` and :mod:`artifacts_signing`.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess  # noqa: TID251 - bootfsm/sim may run subprocesses
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "EPOCH",
    "ArtifactError",
    "check_name",
    "digests",
    "run_tool",
    "sha256_file",
    "touch_tree",
]

EPOCH = 1_735_689_600
"""Fixed member mtime (2025-01-01T00:00:00Z) for reproducible archives."""

_TOOL_TIMEOUT_S = 60.0
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+~:_-]*$")


class ArtifactError(RuntimeError):
    """An external tool (makeself, dpkg-deb) was missing, timed out or failed."""


def run_tool(
    argv: Sequence[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> str:
    """Run argv (no shell) with a timeout; return stdout or raise ArtifactError."""
    try:
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            env=None if env is None else {**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=_TOOL_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ArtifactError(f"{argv[0]} is not installed (needed by bootfsm.sim)") from exc
    except subprocess.TimeoutExpired as exc:
        raise ArtifactError(f"{list(argv)!r} timed out after {_TOOL_TIMEOUT_S:g}s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise ArtifactError(f"{list(argv)!r} exited {proc.returncode}: {tail}")
    return proc.stdout


def check_name(what: str, value: str) -> None:
    if not _SAFE_NAME.fullmatch(value):
        raise ValueError(f"invalid {what}: {value!r}")


def touch_tree(root: Path) -> None:
    """Set every path under root (and root) to the fixed EPOCH mtime."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            os.utime(Path(dirpath, name), (EPOCH, EPOCH), follow_symlinks=False)
    os.utime(root, (EPOCH, EPOCH))


def digests(path: Path, *names: str) -> dict[str, str]:
    """Hash the file once with each hashlib algorithm in names; return hex digests."""
    hashes = {name: hashlib.new(name, usedforsecurity=False) for name in names}
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            for digest in hashes.values():
                digest.update(chunk)
    return {name: digest.hexdigest() for name, digest in hashes.items()}


def sha256_file(path: Path) -> str:
    """Return the lowercase hex SHA-256 of the file at path."""
    return digests(path, "sha256")["sha256"]
