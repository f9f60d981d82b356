"""The state of a simulated node, kept entirely in its node directory.

Shared by the stand-in commands and :mod:`bootfsm.sim.node`. Node facts (kernel, arch,
PCI devices) are read from the node's own files every time, so a test that edits the
node directory changes what the stand-ins report. Runtime state (active units, the
loaded driver, counters) lives where Linux keeps it: under ``run/``, ``sys/``,
``proc/`` and ``dev/``, which a reboot clears.

The node is built in layers: files, host facts and MIG (:mod:`nodestate_base`), the
driver (:mod:`nodestate_driver`), the units (:mod:`nodestate_units`); :class:`Node` adds
the boot. The shared names are re-exported here, where the stand-ins import them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import bootfsm
from bootfsm.sim.nodestate_base import CALLS_LOG, RUN_DIR, SIM_DIR, SIM_STATE, log_call, smi_bus_id
from bootfsm.sim.nodestate_driver import UVM_MAJOR, Module
from bootfsm.sim.nodestate_units import (
    FABRIC_MANAGER,
    NVLSM,
    UNIT_DIRS,
    UNIT_JOURNAL,
    NodeUnits,
    unit_name,
)

__all__ = [
    "CALLS_LOG",
    "FABRIC_MANAGER",
    "NVLSM",
    "RUN_DIR",
    "SIM_DIR",
    "SIM_STATE",
    "UNIT_DIRS",
    "UNIT_JOURNAL",
    "UVM_MAJOR",
    "Module",
    "Node",
    "log_call",
    "smi_bus_id",
    "standin_script",
    "unit_name",
]


class Node(NodeUnits):
    """A simulated node rooted at ``root`` (the directory bootfsm sees as ``/``)."""

    def boot(self) -> None:
        """What systemd does at boot: load the driver if built, start enabled units."""
        self.p(f"{RUN_DIR}/active").mkdir(parents=True, exist_ok=True)
        for address, _device in self.gpus():
            current, pending = self.mig_mode(address)
            if current != pending:  # a pending MIG mode takes effect at the GPU's reset
                self.set_mig_mode(address, pending, pending)
        if self.built_module() is not None:
            self.load_module()
        for unit in self.enabled_units():
            if not self.is_masked(unit):
                self.start_unit(unit)


_SHEBANG_MAX = 255


def standin_script(name: str, root: Path, python: str = sys.executable) -> str:
    """Text of a stand-in executable: runs ``bootfsm.sim.standins.main(name, root, argv)``.

    The node root and the directory holding the ``bootfsm`` package are baked in, so the
    script works from any PATH or working directory. Raises ValueError when the
    interpreter path cannot go on a shebang line.
    """
    shebang = f"#!{python}"
    if any(c.isspace() for c in python) or len(shebang) > _SHEBANG_MAX:
        raise ValueError(f"interpreter path unusable on a shebang line: {python!r}")
    package_parent = Path(bootfsm.__file__).resolve().parent.parent
    return (
        f"{shebang}\n"
        f'"""bootfsm simulator stand-in for {name}."""\n'
        "import sys\n\n"
        f"sys.path.insert(0, {str(package_parent)!r})\n"
        "from bootfsm.sim.standins import main\n\n"
        f"sys.exit(main({name!r}, {str(Path(root).absolute())!r}, sys.argv[1:]))\n"
    )
