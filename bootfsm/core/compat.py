"""What differs between the Pythons bootfsm runs on: 3.10 (Ubuntu 22.04's system
Python) through 3.13 (Debian 13's).

Only two things: ``tomllib`` arrived in 3.11 (``tomli``, the same code under its
original name, is the dependency on 3.10), and so did ``enum.StrEnum``. Everything
else in bootfsm is plain 3.10.
"""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum

    import tomllib
else:  # pragma: no cover - exercised by the Python 3.10 lane (make test-py310)
    import tomli as tomllib

    class StrEnum(str, Enum):
        """``enum.StrEnum`` of 3.11: members are strings; str() and format() give the value."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


__all__ = ["StrEnum", "tomllib"]
