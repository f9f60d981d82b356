"""The simulator's `nvidia-smi`: full-size output in the real layouts, from its own templates.

References (read, not copied; no product code is used to make this output):

* argv grammar and exit codes: nvidia-smi(1), "RETURN VALUE" (0 success, 2 "a supplied
  argument or flag is invalid", 6 "a query to find an object was unsuccessful", 9 "the
  NVIDIA driver is not loaded", 14 "infoROM is corrupted", 18 driver/library version
  mismatch as observed); a corrupted infoROM is reported only by the default table
  (``WARNING: infoROM is corrupted at gpu <bus id>`` after it, exit 14: the 8x V100
  capture azhpc-diagnostics/table_8xV100_inforom-warning_460.32.03.txt), never by
  ``-q -x``, which exits 0 without it (microsoft/pai #3756). With the driver loaded, an
  unknown flag prints
  ``ERROR: Option <flag> is not recognized. Please run 'nvidia-smi -h'.`` and exits 255
  (580.159.04 on an H200: tests/captures/h200_580.159.04/smi-bogus.txt); a flag
  without its value ``ERROR: Option <flag> is missing its value. ...`` (both as
  quoted in public user reports of the real tool); ``-x`` without ``-q`` and other bad
  mixes print ``Invalid combination of input arguments. Please run 'nvidia-smi -h' for
  help.``. A loaded driver that manages no GPU (the proprietary module on a Blackwell
  GPU) prints ``No devices were found`` and exits 6. Without a driver, every command
  line but ``-h``/``--help`` (a bogus option too) gets the no-driver message and a blank
  line, exit 9, before its arguments are read (Ubuntu 24.04's nvidia-smi 550.67 in a
  container without the module: the booted lane's comparisons,
  tests/booted/real_nvidia.py).
* ``-q`` text: the 570.124.06 layout of samples/nvidia-smi/thamada/RTX5090x1_gls_q.txt
  (key column 42, four spaces a level, one blank line after each GPU block, the
  trailing space after "GPU Memory Power Readings" and after an empty Chassis Serial
  Number); the 535/550/565 captures beside it have the same frame with fewer keys.
* ``-q -x``: the 580.173.02 layout of k8s-test-infra_hardware_xml/qx-gb300.xml and
  qx-gb200.xml for 580 and later drivers, the 570.148.08 layout of qx-a100.xml before
  (``nvsmi_device_v13.dtd`` / ``v12`` DOCTYPE, one tab a level, ``<fabric>`` with
  ``cliqueId``/``clusterUuid``/``<health>``, a ``<supported_clocks>`` list of every
  graphics clock, which is most of its 29-44 KB per GPU).
* the default table: the 550 layout of samples/nvidia-smi/table_550.90.07_gpud.txt.

The templates are in :mod:`standin_smi_text` and :mod:`standin_smi_xml`, the reports
built from them (board table, `-q`, `-q -x`, the default table) in
:mod:`standin_smi_render`; the argv grammar and the driver checks are here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from bootfsm.sim.nodestate import Node, smi_bus_id
from bootfsm.sim.standin_smi_mig import mig_command, set_mig_mode_command
from bootfsm.sim.standin_smi_render import render_query, render_table

__all__ = ["COMMANDS", "nvidia_smi"]

_HELP = "Please run 'nvidia-smi -h' for help."
_INVALID = f"Invalid combination of input arguments. {_HELP}"
_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that"
    " the latest NVIDIA driver is installed and running."
)
_NO_DEVICES = "No devices were found"
# Blackwell (GB100 0x29xx) and every later GPU works only with the open kernel modules
# (NVIDIA driver README, "Open Linux Kernel Modules"); the proprietary one leaves them be.
_FIRST_OPEN_ONLY_ID = 0x2900


# ---------------------------------------------------------------- argv grammar

_FLAGS = {"-h": "help", "--help": "help", "-L": "list", "--list-gpus": "list",
          "-q": "query", "--query": "query", "-x": "xml", "--xml-format": "xml"}  # fmt: skip
_VALUED = {"-i": "id", "--id": "id", "-mig": "mig", "--multi-instance-gpu": "mig"}
# Real options this stand-in does not simulate (nvidia-smi -h): refused with their name.
_REAL_UNSIMULATED = (
    *("-d", "--display", "-f", "--filename", "-l", "--loop", "-u", "--unit", "--query-gpu"),
    *("--format", "-pm", "--persistence-mode", "-r", "--gpu-reset", "-B"),
    *("--list-excluded-gpus", "--dtd", "--debug", "-lms", "--loop-ms"),
)
_SUBCOMMANDS = ("nvlink", "topo", "clocks", "vgpu", "drain", "conf-compute", "c2c")


class _Usage(Exception):
    """A bad command line: nvidia-smi's message; exit 2."""


class _Unknown(_Usage):
    """An option nvidia-smi does not know: its message; exit 255."""


def _parse_argv(argv: list[str]) -> tuple[set[str], str | None, str | None]:
    """(flags given, -i value, -mig value) by nvidia-smi's grammar; _Usage with the real
    wording."""
    flags: set[str] = set()
    values: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        if arg in _FLAGS:
            flags.add(_FLAGS[arg])
        elif name in _VALUED:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 0 if eq or i + 1 >= len(argv) else 1
            if not value:
                raise _Usage(f"ERROR: Option {name} is missing its value. {_HELP}")
            values[_VALUED[name]] = value
        elif name in _REAL_UNSIMULATED or (i == 0 and arg in _SUBCOMMANDS):
            raise _Usage(f"bootfsm simulator: nvidia-smi {name} is not simulated")
        elif arg.startswith("-"):
            raise _Unknown(f"ERROR: Option {arg} is not recognized. Please run 'nvidia-smi -h'.")
        else:
            raise _Usage(_INVALID)
        i += 1
    if "xml" in flags and "query" not in flags:
        raise _Usage(_INVALID)
    if "list" in flags and "query" in flags:
        raise _Usage(_INVALID)
    mig = values.get("mig")
    if mig is not None and (mig not in ("0", "1") or flags - {"help"}):
        raise _Usage(_INVALID)
    return flags, values.get("id"), mig


def _select(gpus: list[tuple[int, str, int]], target: str | None) -> list[tuple[int, str, int]]:
    """Apply `-i`: a GPU index, a bus id or a UUID prefix (as nvidia-smi accepts)."""
    if target is None:
        return gpus
    return [g for g in gpus if target in (str(g[0]), smi_bus_id(g[1]))]


def nvidia_smi(node: Node, argv: list[str]) -> int:
    """`nvidia-smi`, `-L`, `-q`, `-q -x`, `-i N`, reading the node's driver state."""
    subcommand = argv[:1] == ["mig"]
    library = node.nvml_version()
    module = node.loaded_module()
    if (library is None or module is None) and not {"-h", "--help"} & set(argv):
        print(_NO_DRIVER)
        print()
        return 9
    try:
        flags, target, mig = _parse_argv([]) if subcommand else _parse_argv(argv)
    except _Unknown as exc:
        print(exc)
        print()
        return 255
    except _Usage as exc:
        print(exc)
        print()
        return 2
    if "help" in flags:
        print("NVIDIA System Management Interface -- bootfsm simulator")
        print("nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...")
        return 0
    if library is None or module is None:
        print(_NO_DRIVER)
        print()
        return 9
    if library != module.version:
        print("Failed to initialize NVML: Driver/library version mismatch")
        print(f"NVML library version: {'.'.join(library.split('.')[:2])}")
        return 18
    every = [(i, a, d) for i, (a, d) in enumerate(node.visible_gpus())]
    if module.module_type != "open" and any(d >= _FIRST_OPEN_ONLY_ID for _i, _a, d in every):
        # The proprietary module attaches to no Blackwell GPU: NVML finds no device.
        print(_NO_DEVICES)
        return 6
    if subcommand:
        return mig_command(node, every, argv[1:])
    gpus = _select(every, target)
    if mig is not None and gpus:
        return set_mig_mode_command(node, gpus, enable=mig == "1")
    if target is not None and not gpus:
        print(_NO_DEVICES)
        return 6
    warning = f"WARNING: infoROM is corrupted at gpu {every[0][1].upper()}" if every else ""
    inforom = node.fault("inforom-corrupted") and bool(every)
    if "list" in flags:
        for index, address, device in gpus:
            print(f"GPU {index}: {node.product_name(device)} (UUID: {node.gpu_uuid(address)})")
        return 0
    if "query" in flags:  # `-q -x` exits 0 without the infoROM warning (microsoft/pai
        # #3756, samples nvidia-smi/nvml_error_excerpts.txt [E]); only the table warns
        sys.stdout.write(render_query(node, module.version, gpus, xml="xml" in flags))
        return 0
    sys.stdout.write(render_table(node, module.version, gpus))
    if inforom:
        print(warning)
        return 14
    return 0


COMMANDS: Mapping[str, Callable[[Node, list[str]], int]] = {"nvidia-smi": nvidia_smi}
