"""``tomllib`` on every Python bootfsm runs on (``tomli`` on 3.10); StrEnum is in strenum."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised by the Python 3.10 lane (make test-py310)
    import tomli as tomllib


__all__ = ["tomllib"]
