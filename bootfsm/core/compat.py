"""``tomllib`` on every Python bootfsm runs on (3.10-3.13; ``tomli`` on 3.10).

The only other difference, ``enum.StrEnum``, is in ``bootfsm.core.strenum``.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised by the Python 3.10 lane (make test-py310)
    import tomli as tomllib


__all__ = ["tomllib"]
