"""`systemctl show -p UnitFileState -p ActiveState UNIT`: one command answers what
`is-enabled` and `is-active` answered in two (postconditions ask both)."""

from __future__ import annotations

from bootfsm.install.units import UnitState, parse_show, parse_show_units


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


# `systemctl show -p Id -p UnitFileState -p ActiveState A B C` on systemd 252: one block
# per unit named, in that order, an empty line between (src/systemctl/systemctl-show.c
# prints the separator before every unit but the first); within a block systemd's own
# property order (Id, then ActiveState, then UnitFileState), whatever the -p order.
THREE = (
    "Id=nvidia-persistenced.service\nActiveState=active\nUnitFileState=enabled\n"
    "\n"
    "Id=nvidia-imex.service\nActiveState=inactive\nUnitFileState=masked\n"
    "\n"
    "Id=kubelet.service\nActiveState=inactive\nUnitFileState=\n"
)
UNITS = ("nvidia-persistenced.service", "nvidia-imex.service", "kubelet.service")


def test_several_units_in_the_order_named() -> None:
    assert parse_show_units(THREE, UNITS) == {
        "nvidia-persistenced.service": UnitState("enabled", True),
        "nvidia-imex.service": UnitState("masked", False),
        "kubelet.service": UnitState("", False),  # not found: no unit file
    }


def test_a_warning_line_does_not_shift_the_blocks() -> None:
    # stderr is captured with stdout: a daemon-reload warning lands between blocks
    warned = THREE.replace(
        "\n\nId=nvidia-imex",
        "\n\nWarning: The unit file of nvidia-imex.service changed on disk. Run "
        "'systemctl daemon-reload' to reload units.\n\nId=nvidia-imex",
    )
    assert parse_show_units(warned, UNITS)["nvidia-imex.service"] == UnitState("masked", False)


def test_a_block_count_that_does_not_match_guesses_nothing() -> None:
    assert parse_show_units(THREE, (*UNITS, "containerd.service")) == {}
    assert parse_show_units("Failed to connect to bus: Host is down\n", UNITS) == {}
    two = THREE.split("\n\n", 1)[1]
    assert parse_show_units(two, UNITS) == {}
