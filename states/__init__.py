"""The states: one module each, with a read-only postcondition and an action.

``REGISTRY`` maps each working state to its module, ``CALLBACKS`` each transition
callback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from bootfsm.machine.table import STATES
from bootfsm.states import detect, driver, fabric, fetch, imex, join, mig, verify

if TYPE_CHECKING:
    from bootfsm.machine.context import Context

__all__ = [
    "CALLBACKS",
    "NAMES",
    "REGISTRY",
    "ExplainsSkip",
    "StateModule",
]

NAMES = tuple(s.name for s in STATES)
"""Every working state of the table; each is the module ``bootfsm.states.<name>``."""


class StateModule(Protocol):
    """What the engine needs of a state."""

    NAME: str

    def satisfied(self, ctx: Context) -> bool:
        """Read-only: is this state's goal already true on the node?"""
        ...

    def run(self, ctx: Context) -> None:
        """Make it true, or raise BootError / TransientError."""
        ...


class ExplainsSkip(Protocol):
    """Optional for a state: the engine journals this as ``state.skip``'s reason."""

    def skip_reason(self, ctx: Context) -> str | None:
        """Read-only, called only after ``satisfied`` held; None: "postcondition holds"."""
        ...


REGISTRY: Mapping[str, StateModule] = {
    m.NAME: m for m in (detect, fetch, driver, fabric, imex, verify, mig, join)
}
if TYPE_CHECKING:  # mypy checks the optional protocols too
    _EXPLAINS_SKIP: tuple[ExplainsSkip, ...] = (driver, fetch)

CALLBACKS: Mapping[str, Callable[[Context], None]] = {
    "disable_stale_fabric_manager": fabric.disable_stale_unit,
}
