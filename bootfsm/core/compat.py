"""What differs between the Pythons bootfsm runs on: 3.10 (Ubuntu 22.04's system
Python) through 3.13 (Debian 13's).

Only two things: ``tomllib`` arrived in 3.11 (``tomli``, the same code under its
original name, is the dependency on 3.10), and so did ``enum.StrEnum``
(bootfsm/core/strenum.py). Everything else in bootfsm is plain 3.10.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised by the Python 3.10 lane (make test-py310)
    import tomli as tomllib


__all__ = ["tomllib"]
