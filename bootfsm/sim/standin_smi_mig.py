"""The simulator's `nvidia-smi mig ...` and `nvidia-smi [-i N] -mig 0|1`, over the node's
MIG state (bootfsm.sim.nodestate: the mode per GPU survives a reboot, a pending mode
becomes current at boot, the instances do not survive it).

References (read, not copied; nothing of bootfsm outside the simulator makes this text):

* argv grammar: `nvidia-smi mig -h` as printed by a real driver (quoted whole in a public
  CUDA notes repository): -h, -i/--id (index, PCI bus id, comma list), -gi, -ci, -lgip,
  -lgipp, -C, -cgi LIST (profile names or ids), -dgi, -lgi, -lcip, -cci, -dci, -lci.
  The unknown-option and missing-value lines are nvidia-smi's top-level wording
  (``ERROR: Option -x is not recognized. Please run 'nvidia-smi -h' for help.``, quoted
  in public user reports) with the subcommand's help command, which no capture shows.
* `-lgip`: the 81-column layout of an H100 80GB HBM3 capture (public field notes,
  jbarrow.ai "Nvidia MIG"), profile for profile (ids 19, 20, 15, 14, 9, 5, 0, their
  memory, SM, DEC/ENC, CE/JPEG/OFA); A100 40GB values from a 510.47.03 capture (HPE
  Japan presales notes). `-lgi` / `-lci`: the 57- and 70-column layouts of that 510
  capture. GPU instance ids by placement (start:size) as those captures show them
  (1g@0 = 11, 1g@1 = 12, 2g@2 = 6, 3g@4 = 1, 3g@0 = 2; A100 -lgipp placements
  {0..6}:1, {0,2,4}:2, {0,4}:4, {0}:4, {0}:8); the first free start is taken.
* messages: ``Successfully created GPU instance ID %2d on GPU %2d using profile MIG
  3g.20gb (ID %2d)``, ``Successfully created compute instance ID ... GPU instance ID ...
  using profile ... (ID  2)``, ``Unable to create a GPU instance on GPU  0 using profile
  9: Insufficient Resources`` + ``Failed to create GPU instances: Insufficient
  Resources`` (NVIDIA's MIG user guide), ``...: Invalid Argument`` for an unknown
  profile, ``...: In use by another client`` (public captures), ``Successfully
  destroyed compute instance ID  0 from GPU  1 GPU instance ID  3`` / ``Successfully
  destroyed GPU instance ID  9 from GPU  0``, ``No GPU instances found: Not Found``,
  ``No compute instances found: Not Found``, ``No MIG-enabled devices found.``;
  `-mig 1`: ``Enabled MIG Mode for GPU 00000000:4F:00.0`` ... ``All done.``, and on an
  A100 in a VM ``Warning: MIG mode is in pending enable state for GPU
  00000000:0F:00.0:Not Supported`` + ``Reboot the system or try nvidia-smi --gpu-reset
  to make MIG mode effective on GPU 00000000:0F:00.0`` (510 capture; a GPU held by a
  client says ``:In use by another client``, NVIDIA's MIG guide). "Unable to destroy"
  lines follow the "Unable to create" form (no capture seen).
* exit codes: nvidia-smi(1) RETURN VALUE: 2 invalid argument, 3 not supported, 6 not
  found (the "No ... found" lines exit 6, as scripts on real nodes test), 255 other
  (Insufficient Resources, In use by another client).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bootfsm.sim.nodestate import Node, smi_bus_id

__all__ = ["MIG_BOARDS", "mig_command", "mig_mode_values", "set_mig_mode_command"]

_HELP = "Please run 'nvidia-smi mig -h' for help."


@dataclass(frozen=True)
class _Profile:
    name: str
    pid: int
    total: int
    mem: str
    sm: int
    dec: int
    enc: int
    ce: int
    jpeg: int
    ofa: int
    size: int  # memory slices (placement size)
    slices: int  # compute slices
    starts: tuple[int, ...]
    ci_pid: int  # the default compute instance profile (-C)


_ALL1, _EVEN2, _FOUR = (0, 1, 2, 3, 4, 5, 6), (0, 2, 4), (0, 4)
_H100_80GB = (
    _Profile("MIG 1g.10gb", 19, 7, "9.75", 16, 1, 0, 1, 1, 0, 1, 1, _ALL1, 0),
    _Profile("MIG 1g.10gb+me", 20, 1, "9.75", 16, 1, 0, 1, 1, 1, 1, 1, _ALL1, 0),
    _Profile("MIG 1g.20gb", 15, 4, "19.62", 26, 1, 0, 1, 1, 0, 2, 1, (0, 2, 4, 6), 0),
    _Profile("MIG 2g.20gb", 14, 3, "19.62", 32, 2, 0, 2, 2, 0, 2, 2, _EVEN2, 1),
    _Profile("MIG 3g.40gb", 9, 2, "39.50", 60, 3, 0, 3, 3, 0, 4, 3, _FOUR, 2),
    _Profile("MIG 4g.40gb", 5, 1, "39.50", 64, 4, 0, 4, 4, 0, 4, 4, (0,), 3),
    _Profile("MIG 7g.80gb", 0, 1, "79.25", 132, 7, 0, 8, 7, 1, 8, 7, (0,), 4),
)
_A100_40GB = (
    _Profile("MIG 1g.5gb", 19, 7, "4.75", 14, 0, 0, 1, 0, 0, 1, 1, _ALL1, 0),
    _Profile("MIG 1g.5gb+me", 20, 1, "4.75", 14, 1, 0, 1, 1, 1, 1, 1, _ALL1, 0),
    _Profile("MIG 2g.10gb", 14, 3, "9.75", 28, 1, 0, 2, 0, 0, 2, 2, _EVEN2, 1),
    _Profile("MIG 3g.20gb", 9, 2, "19.62", 42, 2, 0, 3, 0, 0, 4, 3, _FOUR, 2),
    _Profile("MIG 4g.20gb", 5, 1, "19.62", 56, 2, 0, 4, 0, 0, 4, 4, (0,), 3),
    _Profile("MIG 7g.40gb", 0, 1, "39.50", 98, 5, 0, 7, 1, 1, 8, 7, (0,), 4),
)
MIG_BOARDS: dict[int, tuple[_Profile, ...]] = {
    0x2330: _H100_80GB,
    0x2331: _H100_80GB,
    0x20B0: _A100_40GB,
}
"""MIG-capable boards the simulator knows the profiles of; every other GPU reports N/A."""
_RESET_NEEDS_REBOOT = frozenset({0x20B0})
"""A100: in a VM the GPU cannot be reset, so `-mig 1` stays pending until a reboot
(AgentBaker's cse_main.sh comment on MIG nodes; the 510 capture's "Not Supported")."""
_GI_IDS = {8: {0: 0}, 4: {4: 1, 0: 2}, 2: {4: 3, 6: 4, 0: 5, 2: 6}}
_GI_IDS[1] = {4: 7, 5: 8, 6: 9, 3: 10, 0: 11, 1: 12, 2: 13}


class _Fail(Exception):
    def __init__(self, text: str, rc: int) -> None:
        super().__init__(text)
        self.rc = rc


def mig_mode_values(node: Node, address: str, device: int) -> tuple[str, str]:
    """(Current, Pending) as `-q` prints them: Enabled/Disabled, N/A without MIG."""
    if device not in MIG_BOARDS:
        return "N/A", "N/A"
    current, pending = node.mig_mode(address)
    return ("Enabled" if current else "Disabled"), ("Enabled" if pending else "Disabled")


def set_mig_mode_command(node: Node, gpus: list[tuple[int, str, int]], enable: bool) -> int:
    """`nvidia-smi [-i N] -mig 0|1` for the selected (index, address, device) GPUs."""
    word = "enable" if enable else "disable"
    for _i, address, device in gpus:
        bus = smi_bus_id(address)
        if device not in MIG_BOARDS:
            print(f"Unable to {word} MIG Mode for GPU {bus}: Not Supported")
            return 3
        ampere = device in _RESET_NEEDS_REBOOT
        held = node.fault("mig-gpu-in-use")
        current, _ = node.mig_mode(address)
        if current == enable:
            print(f"{word.capitalize()}d MIG Mode for GPU {bus}")
        elif ampere or held:  # a VM cannot reset an A100; a client holds the GPU
            why = "In use by another client" if held else "Not Supported"
            node.set_mig_mode(address, current, enable)
            print(f"Warning: MIG mode is in pending {word} state for GPU {bus}:{why}")
            print(
                "Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective"
                f" on GPU {bus}"
            )
        else:
            node.set_mig_mode(address, enable, enable)
            print(f"{word.capitalize()}d MIG Mode for GPU {bus}")
    print("All done.")
    return 0


# ---------------------------------------------------------------- argv grammar

_COMMANDS = {"-lgip": "lgip", "--list-gpu-instance-profiles": "lgip", "-lgi": "lgi",
             "--list-gpu-instances": "lgi", "-lci": "lci", "--list-compute-instances": "lci",
             "-cgi": "cgi", "--create-gpu-instance": "cgi", "-dgi": "dgi",
             "--destroy-gpu-instance": "dgi", "-dci": "dci", "--destroy-compute-instance": "dci",
             "-h": "help", "--help": "help"}  # fmt: skip
_VALUED = {"-i": "id", "--id": "id", "-gi": "gi", "--gpu-instance-id": "gi",
           "-ci": "ci", "--compute-instance-id": "ci"}  # fmt: skip
_UNSIMULATED = ("-lgipp", "--list-gpu-instance-possible-placements", "-lcip", "-cci",
                "--list-compute-instance-profiles", "--create-compute-instance")  # fmt: skip


def _parse(argv: list[str]) -> tuple[str, dict[str, str], bool]:
    """(command, valued options, -C) by `nvidia-smi mig -h`'s grammar; _Fail otherwise."""
    command, opts, default_ci = "", {}, False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-C", "--default-compute-instance"):
            default_ci = True
        elif arg in _COMMANDS or arg in _VALUED:
            key = _COMMANDS.get(arg) or _VALUED[arg]
            if key == "cgi" or arg in _VALUED:
                if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                    raise _Fail(f"ERROR: Option {arg} is missing its value. {_HELP}", 2)
                i += 1
                opts[key] = argv[i]
            if arg in _COMMANDS:
                if command:
                    raise _Fail(f"Invalid combination of input arguments. {_HELP}", 2)
                command = key
        elif arg in _UNSIMULATED:
            raise _Fail(f"bootfsm simulator: nvidia-smi mig {arg} is not simulated", 2)
        elif arg.startswith("-"):
            raise _Fail(f"ERROR: Option {arg} is not recognized. {_HELP}", 2)
        else:
            raise _Fail(f"Invalid combination of input arguments. {_HELP}", 2)
        i += 1
    if not command or (default_ci and command != "cgi"):
        raise _Fail(f"Invalid combination of input arguments. {_HELP}", 2)
    return command, opts, default_ci


def _select(gpus: list[tuple[int, str, int]], target: str | None) -> list[tuple[int, str, int]]:
    if target is None:
        return gpus
    wanted = {t.strip() for t in target.split(",")}
    return [g for g in gpus if wanted & {str(g[0]), smi_bus_id(g[1])}]


def _used(gis: list[dict[str, Any]]) -> tuple[set[int], int]:
    """(memory slices taken, compute slices taken) by a GPU's instances."""
    taken: set[int] = set()
    for gi in gis:
        taken |= set(range(int(gi["start"]), int(gi["start"]) + int(gi["size"])))
    return taken, sum(int(gi["slices"]) for gi in gis)


def _place(profile: _Profile, gis: list[dict[str, Any]]) -> int | None:
    """The first free start for ``profile``, or None (Insufficient Resources)."""
    taken, compute = _used(gis)
    if compute + profile.slices > 7:
        return None
    if sum(1 for gi in gis if int(gi["profile"]) == profile.pid) >= profile.total:
        return None
    for start in profile.starts:
        if not taken & set(range(start, start + profile.size)):
            return start
    return None


def _free(profile: _Profile, gis: list[dict[str, Any]]) -> int:
    """How many more instances of ``profile`` fit (the Free column)."""
    trial = list(gis)
    while (start := _place(profile, trial)) is not None:
        trial.append({"start": start, "size": profile.size, "slices": profile.slices,
                      "profile": profile.pid})  # fmt: skip
    return len(trial) - len(gis)


def _box(width: int, title: str, header: list[str], rows: list[list[str]]) -> str:
    rule = "+" + "-" * (width - 2) + "+"
    out = [rule, f"| {title}".ljust(width - 1) + "|", *header, "|" + "=" * (width - 2) + "|"]
    for row in rows:
        out += [*row, rule]
    if not rows:
        out.append(rule)
    return "\n".join(out) + "\n"


def _lgip(node: Node, gpus: list[tuple[int, str, int]]) -> str:
    rows = []
    for index, address, device in gpus:
        gis = node.mig_instances(address)
        for p in MIG_BOARDS[device]:
            free = f"{_free(p, gis)}/{p.total}"
            rows.append([
                f"|{index:>4}  {p.name:<19}{p.pid:>3}     {free:<11}{p.mem:<11}No   "
                f"{p.sm:>4}{p.dec:>6}{p.enc:>6}   |",
                "|" + " " * 60 + f"{p.ce:>4}{p.jpeg:>6}{p.ofa:>6}   |",
            ])  # fmt: skip
    header = [
        "| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |",
        "|                                Free/Total   GiB              CE    JPEG  OFA  |",
    ]
    return _box(81, "GPU instance profiles:", header, rows)


def _profile(device: int, pid: int) -> _Profile:
    return next(p for p in MIG_BOARDS[device] if p.pid == pid)


def _lgi(node: Node, gpus: list[tuple[int, str, int]]) -> str:
    rows = []
    for index, address, device in gpus:
        for gi in node.mig_instances(address):
            name = _profile(device, int(gi["profile"])).name
            place = f"{gi['start']}:{gi['size']}"
            rows.append(
                [f"|{index:>4}  {name:<19}{gi['profile']:>3}{gi['gi']:>9}{place:>13}     |"]
            )
    if not rows:
        raise _Fail("No GPU instances found: Not Found", 6)
    header = [
        "| GPU   Name             Profile  Instance   Placement  |",
        "|                          ID       ID       Start:Size |",
    ]
    return _box(57, "GPU instances:", header, rows)


def _lci(node: Node, gpus: list[tuple[int, str, int]]) -> str:
    rows = []
    for index, address, device in gpus:
        for gi in node.mig_instances(address):
            p = _profile(device, int(gi["profile"]))
            for ci in gi["cis"]:
                rows.append([
                    f"|{index:>4}{gi['gi']:>7}       {p.name:<18}{p.ci_pid:>4}{ci:>10}"
                    f"{f'0:{p.slices}':>13}     |"
                ])  # fmt: skip
    if not rows:
        raise _Fail("No compute instances found: Not Found", 6)
    header = [
        "| GPU     GPU       Name             Profile   Instance   Placement  |",
        "|       Instance                       ID        ID       Start:Size |",
        "|         ID                                                         |",
    ]
    return _box(70, "Compute instances:", header, rows)


def _resolve(device: int, item: str) -> _Profile | None:
    for p in MIG_BOARDS[device]:
        if item.strip() in (str(p.pid), p.name.removeprefix("MIG ")):
            return p
    return None


def _cgi(node: Node, gpus: list[tuple[int, str, int]], layout: str, default_ci: bool) -> int:
    held = node.fault("mig-gpu-in-use")
    for index, address, device in gpus:
        gis = node.mig_instances(address)
        for item in layout.split(","):
            p = _resolve(device, item)
            start = None if p is None or held else _place(p, gis)
            if p is None or start is None:
                why = (
                    "Invalid Argument"
                    if p is None
                    else ("In use by another client" if held else "Insufficient Resources")
                )
                node.set_mig_instances(address, gis)
                print(
                    f"Unable to create a GPU instance on GPU {index:2d} using profile {item}: {why}"
                )
                print(f"Failed to create GPU instances: {why}")
                return 2 if p is None else 255
            gi_id = _GI_IDS[p.size][start]
            gis.append({"gi": gi_id, "profile": p.pid, "start": start, "size": p.size,
                        "slices": p.slices, "cis": [0] if default_ci else []})  # fmt: skip
            print(
                f"Successfully created GPU instance ID {gi_id:2d} on GPU {index:2d} using"
                f" profile {p.name} (ID {p.pid:2d})"
            )
            if default_ci:
                print(
                    f"Successfully created compute instance ID  0 on GPU {index:2d} GPU instance"
                    f" ID {gi_id:2d} using profile {p.name} (ID {p.ci_pid:2d})"
                )
        node.set_mig_instances(address, gis)
    return 0


def _destroy(node: Node, gpus: list[tuple[int, str, int]], what: str) -> int:
    """`-dci` (every compute instance) or `-dgi` (every GPU instance without one)."""
    held, done = node.fault("mig-gpu-in-use"), 0
    for index, address, _device in gpus:
        gis = node.mig_instances(address)
        for gi in gis:
            targets = gi["cis"] if what == "dci" else [gi["gi"]]
            for target in list(targets):
                where = (
                    f"GPU {index:2d} GPU instance ID {gi['gi']:2d}"
                    if what == "dci"
                    else f"GPU {index:2d}"
                )
                kind = "compute" if what == "dci" else "GPU"
                if held or (what == "dgi" and gi["cis"]):
                    busy = "In use by another client"
                    print(f"Unable to destroy {kind} instance ID {target:2d} from {where}: {busy}")
                    print(f"Failed to destroy {kind} instances: In use by another client")
                    node.set_mig_instances(address, gis)
                    return 255
                print(f"Successfully destroyed {kind} instance ID {target:2d} from {where}")
                done += 1
                if what == "dci":
                    gi["cis"].remove(target)
        node.set_mig_instances(address, [] if what == "dgi" else gis)
    if not done:
        kind = "compute" if what == "dci" else "GPU"
        print(f"No {kind} instances found: Not Found")
        return 6
    return 0


def mig_command(node: Node, gpus: list[tuple[int, str, int]], argv: list[str]) -> int:
    """`nvidia-smi mig ARGS` over the visible (index, address, device) GPUs."""
    try:
        command, opts, default_ci = _parse(argv)
        if command == "help":
            print("    mig -- Multi Instance GPU management. (bootfsm simulator)\n")
            print("    Usage: nvidia-smi mig [options]")
            print("    [-i | --id] [-gi] [-ci] -lgip -lgi -cgi LIST [-C] -dgi -lci -dci")
            return 0
        chosen = _select(gpus, opts.get("id"))
        if opts.get("id") is not None and not chosen:
            raise _Fail("No devices were found", 6)
        enabled = [g for g in chosen if g[2] in MIG_BOARDS and node.mig_mode(g[1])[0]]
        if not enabled:
            raise _Fail("No MIG-enabled devices found.", 6)
        if command == "lgip":
            print(_lgip(node, enabled), end="")
        elif command == "lgi":
            print(_lgi(node, enabled), end="")
        elif command == "lci":
            print(_lci(node, enabled), end="")
        elif command == "cgi":
            return _cgi(node, enabled, opts["cgi"], default_ci)
        else:
            return _destroy(node, enabled, command)
    except _Fail as exc:
        print(exc)
        return exc.rc
    return 0
