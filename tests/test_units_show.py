"""`systemctl show -p UnitFileState -p ActiveState UNIT`: one command answers what
`is-enabled` and `is-active` answered in two (postconditions ask both)."""

from __future__ import annotations

from bootfsm.install.units import UnitState, parse_show


def test_enabled_and_active() -> None:
    # systemd prints ActiveState before UnitFileState (the Unit interface's vtable order)
    assert parse_show("ActiveState=active\nUnitFileState=enabled\n") == UnitState("enabled", True)


def test_order_and_other_lines_do_not_matter() -> None:
    out = "UnitFileState=masked\nSubState=dead\nActiveState=inactive\n"
    assert parse_show(out) == UnitState("masked", False)


def test_no_unit_file_and_unknown_states() -> None:
    # a unit systemd cannot find: LoadState=not-found, UnitFileState empty
    assert parse_show("ActiveState=inactive\nUnitFileState=\n") == UnitState("", False)
    assert parse_show("ActiveState=activating\nUnitFileState=generated\n") == UnitState("", False)
    assert parse_show("Failed to connect to bus: Host is down\n") == UnitState("", False)
    assert parse_show("ActiveState=failed\nUnitFileState=static\n") == UnitState("static", False)
