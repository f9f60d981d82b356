"""``enum.StrEnum`` before 3.11 too; apart from ``compat`` so an enum imports no TOML parser."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - exercised by the Python 3.10 lane (make test-py310)

    class StrEnum(str, Enum):
        """``enum.StrEnum`` of 3.11: members are strings; str() and format() give the value."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


__all__ = ["StrEnum"]
