"""The state registry loads a state's code when a run reaches it, and a run's registry
starts loading the states that can follow while the current one works."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from bootfsm.machine.table import STATES, TRANSITIONS
from bootfsm.states import CALLBACKS, NAMES, REGISTRY, ahead

_PROBE = """
import json, sys, threading
import bootfsm.states as s
loaded = lambda: sorted(n for n in s.NAMES if "bootfsm.states." + n in sys.modules)
out = {"package": loaded()}
s.REGISTRY["driver"]
out["registry"] = loaded()
s.ahead()["driver"]
for t in threading.enumerate():
    if t.name == "bootfsm-preload":
        t.join(30)
out["ahead"] = loaded()
print(json.dumps(out))
"""


_NO_THREADS = """
import json, sys, threading
def refuse(self):
    raise RuntimeError("can't start new thread")
threading.Thread.start = refuse
import bootfsm.states as s
m = s.ahead()["driver"]
print(json.dumps([m.NAME, sorted(n for n in s.NAMES if "bootfsm.states." + n in sys.modules)]))
"""


def _probe(code: str = _PROBE) -> Any:
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(p.stdout)


def test_a_node_out_of_threads_still_gets_each_state_only_without_preloading() -> None:
    assert _probe(_NO_THREADS) == ["driver", ["driver"]]


def test_the_package_loads_no_state_and_a_state_loads_on_first_use() -> None:
    got = _probe()
    assert got["package"] == []
    assert got["registry"] == ["driver"]


def test_a_runs_registry_preloads_the_states_the_table_can_move_to() -> None:
    nxt = sorted({t.dest for t in TRANSITIONS if t.source == "driver"} & set(NAMES))
    assert nxt == ["fabric", "imex", "verify"]  # the table: driver -> fabric | imex | verify
    assert _probe()["ahead"] == ["driver", *nxt]


def test_every_state_module_is_handed_out_by_name_and_unknown_names_are_refused() -> None:
    for name in (s.name for s in STATES):  # every state of the table has its module
        assert name == REGISTRY[name].NAME
        assert ahead()[name] is REGISTRY[name]
    with pytest.raises(KeyError):
        REGISTRY["os"]  # never an arbitrary module by name
    assert callable(CALLBACKS["disable_stale_fabric_manager"])
