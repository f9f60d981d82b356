"""The states: one module each, with a read-only postcondition and an action.

``REGISTRY`` maps every working state of the table to its module; ``CALLBACKS`` maps
every transition callback name. mypy checks each module against ``StateModule``.

A state's module is imported the first time the registry hands it out, not with this
package (``bootfsm fetch`` loads detect and fetch, not the installers). The registry a
run drives the engine with (``ahead``) also starts loading, on a helper thread, the
states the table can move to from the one it hands out: their code loads while the
current state waits on its commands and downloads, off the boot's critical path.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, cast

from bootfsm.machine.table import STATES, TRANSITIONS

if TYPE_CHECKING:
    from bootfsm.machine.context import Context

__all__ = [
    "CALLBACKS",
    "NAMES",
    "REGISTRY",
    "ExplainsSkip",
    "StateModule",
    "ahead",
    "preload",
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


if TYPE_CHECKING:  # mypy checks every module against the protocols; nothing is imported
    from bootfsm.states import detect, driver, fabric, fetch, imex, join, mig, verify

    _CHECKED: Mapping[str, StateModule] = {
        m.NAME: m for m in (detect, fetch, driver, fabric, imex, verify, mig, join)
    }
    _EXPLAINS_SKIP: tuple[ExplainsSkip, ...] = (driver,)
    _CALLBACK: Callable[[Context], None] = fabric.disable_stale_unit


def _load(name: str) -> StateModule:
    if name not in NAMES:
        raise KeyError(name)
    return cast("StateModule", importlib.import_module(f"{__name__}.{name}"))


class _Registry(Mapping[str, StateModule]):
    """name -> state module, each imported on first use (imports are thread-safe). With
    ``ahead``, handing out a state also starts loading the states the table can move to
    from it (``preload``), so their code is ready when the engine gets there."""

    def __init__(self, *, ahead: bool = False) -> None:
        self._ahead = ahead

    def __getitem__(self, name: str) -> StateModule:
        module = _load(name)
        if self._ahead:
            preload(t.dest for t in TRANSITIONS if t.source == name)
        return module

    def __iter__(self) -> Iterator[str]:
        return iter(NAMES)

    def __len__(self) -> int:
        return len(NAMES)


REGISTRY: Mapping[str, StateModule] = _Registry()


def ahead() -> Mapping[str, StateModule]:
    """The registry a run drives the engine with: as ``REGISTRY``, and entering a state
    preloads the states that can follow it."""
    return _Registry(ahead=True)


def _disable_stale_fabric_manager(ctx: Context) -> None:
    from bootfsm.states import fabric

    fabric.disable_stale_unit(ctx)


CALLBACKS: Mapping[str, Callable[[Context], None]] = {
    "disable_stale_fabric_manager": _disable_stale_fabric_manager,
}


def preload(names: Iterable[str]) -> threading.Thread | None:
    """Import these states' modules on a daemon thread, and return it (None when every
    one is loaded already). Loading is most of the CPU a state costs before its first
    command; the thread shares the GIL with the main thread while that one runs Python
    and runs alone while it waits on a command or a download, off the critical path.
    An import error is left for the engine's own import of that module to report;
    where no thread can be started (a cgroup's tasks limit), nothing is preloaded."""
    todo = [n for n in names if n in NAMES and f"{__name__}.{n}" not in sys.modules]
    if not todo:
        return None

    def load() -> None:
        for n in todo:
            try:
                _load(n)
            except Exception:  # noqa: S112 - reported when the engine loads it
                continue

    t = threading.Thread(target=load, name="bootfsm-preload", daemon=True)
    try:
        t.start()
    except RuntimeError:  # no thread to spare (a tasks limit): the engine loads it later
        return None
    return t
