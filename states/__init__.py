"""The states: one module each, with a read-only postcondition and an action.

``REGISTRY`` maps every working state of the table to its module; ``CALLBACKS`` maps
every transition callback name. mypy checks each module against ``StateModule``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from bootfsm.machine.context import Context
from bootfsm.states import detect, driver, fabric, fetch, imex, join, mig, verify

__all__ = ["CALLBACKS", "EXPLAINS_SKIP", "REGISTRY", "ExplainsSkip", "StateModule"]


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


EXPLAINS_SKIP: tuple[ExplainsSkip, ...] = (driver,)
"""States that explain a skip (listed so mypy checks their ``skip_reason``)."""

REGISTRY: Mapping[str, StateModule] = {
    m.NAME: m for m in (detect, fetch, driver, fabric, imex, verify, mig, join)
}

CALLBACKS: Mapping[str, Callable[[Context], None]] = {
    "disable_stale_fabric_manager": fabric.disable_stale_unit,
}
