"""The state registry: one module per state of the table, handed out by name."""

from __future__ import annotations

import pytest

from bootfsm.machine.table import STATES
from bootfsm.states import CALLBACKS, NAMES, REGISTRY


def test_every_state_module_is_handed_out_by_name_and_unknown_names_are_refused() -> None:
    assert sorted(REGISTRY) == sorted(NAMES) == sorted(s.name for s in STATES)
    for name in NAMES:  # every state of the table has its module, named as the table does
        assert name == REGISTRY[name].NAME
        assert REGISTRY[name].__name__ == f"bootfsm.states.{name}"
    with pytest.raises(KeyError):
        REGISTRY["os"]  # never an arbitrary module by name
    assert callable(CALLBACKS["disable_stale_fabric_manager"])
