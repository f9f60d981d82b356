"""`nvidia-smi` reports from the templates: the board table, `-q`, `-q -x` and the table.

Fills :mod:`standin_smi_text` and :mod:`standin_smi_xml` per GPU from the board table
and the node, and renders the default table. References (read, not copied; no product
code is used to make this output):

* ``-q`` text: key column 42 of samples/nvidia-smi/thamada/RTX5090x1_gls_q.txt.
* ``-q -x``: the XML head and the ``nvsmi_device_v13.dtd`` (580 and later, qx-gb300.xml)
  / ``v12`` (qx-a100.xml) DOCTYPE of k8s-test-infra_hardware_xml.
* the default table: the 550 layout of samples/nvidia-smi/table_550.90.07_gpud.txt.
* board values: each row cites its capture.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from xml.sax.saxutils import escape

from bootfsm.sim.nodestate import FABRIC_MANAGER, RUN_DIR, Node, smi_bus_id
from bootfsm.sim.standin_driver import cuda_version_for
from bootfsm.sim.standin_smi_mig import mig_mode_values
from bootfsm.sim.standin_smi_text import TEXT_GPU
from bootfsm.sim.standin_smi_vgpu import count_license_query, vgpu_values
from bootfsm.sim.standin_smi_xml import XML_GPU

__all__ = ["render_query", "render_table"]

_KEY_COLUMN = 42  # where the colon of "-q" text sits (real layouts, all branches)


@dataclass(frozen=True)
class _Board:
    """What nvidia-smi reports about one board model (the simulator's own numbers)."""

    brand: str
    architecture: str
    vbios: str
    board_part: str
    gpu_part: str
    inforom_image: str
    subsystem_id: str
    fb_total: int
    fb_reserved: int
    bar1: int
    power_limit: int
    power_min: int
    max_clock: int
    mem_clock: int
    max_video: int
    pcie_gen: int
    banks: int
    module_limit: int = 0  # Grace-Blackwell module (GPU + CPU share) power limit, W


_BOARDS: Mapping[int, _Board] = {
    # V100 SXM2 32GB: 300 W, 32510 MiB as the azhpc 8x V100 table; A10-24Q: our numbers
    0x1DB5: _Board("Tesla", "Volta", "88.00.80.00.01", "900-2G503-0430-000", "1DB5-895-A1",
                   "G503.0203.00.05", "124910DE", 32768, 258, 32768, 300, 150, 1530, 877, 1372,
                   3, 0),
    0x2236: _Board("NVIDIA RTX Virtual Workstation", "Ampere", "00.00.00.00.00", "N/A",
                   "2236-892-A1", "N/A", "14D410DE", 24576, 1378, 32768, 150, 100, 1695, 6251,
                   1440, 4, 0),
    # A100 SXM4 40GB: the values of k8s-test-infra_hardware_xml/qx-a100.xml (570.148.08)
    0x20B0: _Board("NVIDIA", "Ampere", "92.00.45.00.03", "692-2G506-0200-003", "20B0-884-A1",
                   "G506.0200.00.04", "134F10DE", 40960, 518, 65536, 400, 100, 1410, 1215, 1290,
                   4, 640),
    0x2330: _Board("NVIDIA", "Hopper", "96.00.99.00.01", "692-2G520-0200-000", "2330-885-A1",
                   "G520.0200.00.05", "16C110DE", 81559, 551, 131072, 700, 200, 1980, 2619, 1755,
                   5, 2560),
    0x2331: _Board("NVIDIA", "Hopper", "96.00.74.00.0D", "900-21010-0000-000", "2331-880-A1",
                   "1010.0200.00.03", "162610DE", 81559, 551, 131072, 350, 200, 1755, 1593, 1545,
                   5, 2560),
    0x2901: _Board("NVIDIA", "Blackwell", "97.00.7E.00.07", "692-2G525-0220-000", "2901-886-A1",
                   "G525.0220.00.02", "199910DE", 183359, 1123, 262144, 1000, 200, 1965, 3996, 1650,
                   6, 5952),
    0x2941: _Board("NVIDIA", "Blackwell", "97.00.62.00.5A", "699-2G548-0201-000", "2941-886-A1",
                   "G548.0201.00.06", "204610DE", 189471, 1023, 262144, 1200, 200, 2062, 3996, 1912,
                   6, 5952, module_limit=2700),
    0x31C2: _Board("NVIDIA", "Blackwell", "97.10.4A.00.20", "900-2G548-0081-000", "31C2-893-A1",
                   "G548.0301.00.03", "21F110DE", 284208, 947, 524288, 1400, 200, 2070, 3996, 1912,
                   6, 5952, module_limit=2900),
}  # fmt: skip
_DEFAULT_BOARD = _BOARDS[0x2330]
# Ampere reports no GPU fabric state even with NVSwitches and fabric manager running
# (qx-a100.xml: <fabric><state>N/A; fabric_state_excerpts.txt, A100 p4d).
_NO_FABRIC_PROBE = frozenset({0x20B0})


def _fabric(node: Node) -> tuple[str, str]:
    """(State, Status) of every GPU's Fabric block right now; counts the query."""
    arm_grace = node.arch == "aarch64"
    switched = bool(node.nvswitches()) or node.nvlink5()
    if (not arm_grace and not switched) or node.sku.gpu_device_id in _NO_FABRIC_PROBE:
        return "N/A", "N/A"
    if node.fault("fabric-in-progress-forever"):
        return "In Progress", "N/A"
    if arm_grace:
        counter = node.p(f"{RUN_DIR}/smi-query-calls")
        seen = int(counter.read_text()) if counter.exists() else 0
        node.write(f"{RUN_DIR}/smi-query-calls", str(seen + 1))
        if seen < node.fabric_in_progress_calls:
            return "In Progress", "N/A"
        return "Completed", "Success"
    if node.unit_state(FABRIC_MANAGER) == "active":
        return "Completed", "Success"
    return "In Progress", "N/A"


def _clocks(board: _Board) -> list[int]:
    """The supported graphics clocks, highest first, in the real 7.5 MHz steps."""
    out: list[int] = []
    clock = float(board.max_clock)
    while clock >= 120:
        out.append(int(clock))
        clock -= 7.5
    return out


def _clique(node: Node) -> tuple[int, str]:
    """(CliqueId, ClusterUUID) of a completed fabric: a Grace-Blackwell tray's NVLink
    domain, else 0 and the all-zero UUID (single-node NVSwitch systems report that)."""
    clique = node.sku.clique_id
    if clique == 0:
        return 0, "00000000-0000-0000-0000-000000000000"
    return clique, str(uuid.uuid5(uuid.NAMESPACE_URL, f"bootfsm-sim:domain:{node.sku.vm_size}"))


def _values(
    node: Node, version: str, index: int, address: str, device: int, fabric: tuple[str, str]
) -> dict[str, str]:
    """Every placeholder of the templates for one GPU."""
    board = _BOARDS.get(device, _DEFAULT_BOARD)
    bus_id = smi_bus_id(address)
    domain, bus, rest = bus_id.split(":")
    grace = node.arch == "aarch64"
    state, status = fabric
    completed = state == "Completed"
    fabric_gpu = state != "N/A"
    clique, cluster = _clique(node)
    mig_current, mig_pending = mig_mode_values(node, address, device)
    return {
        "mig_current": mig_current,
        "mig_pending": mig_pending,
        "product_name": node.product_name(device),
        "brand": board.brand,
        "architecture": board.architecture,
        "addressing_mode": "ATS" if grace else "None",
        "serial": f"165{index + 1:010d}",
        "uuid": node.gpu_uuid(address),
        "pdi": f"0x{0x5A00 + index:016x}",
        "minor": str(index),
        "vbios": board.vbios,
        "board_id": f"0x{int(bus, 16) << 8:x}",
        "board_part": board.board_part,
        "gpu_part": board.gpu_part,
        "chassis_serial": f"182{index // 4 + 1:010d}" if grace else "",
        "slot": str(index // 4 + 1) if grace else "0",
        "tray": str(index // 4) if grace else "0",
        "peer_type": "Switch Connected" if fabric_gpu else "Direct Connected",
        "module_id": str(index % 4 + 1 if grace else index + 1),
        "fabric_guid": f"0x{(0x5A00 + index) if fabric_gpu else 0:016x}" if fabric_gpu else "0x0",
        "inforom_image": board.inforom_image,
        "inforom_ecc": "7.16",
        "c2c_mode": "Enabled" if grace else "N/A",
        "driver_version": version,
        "pci_bus": bus,
        "pci_device": rest.split(".")[0],
        "pci_domain": domain[-4:],
        "pci_domain4": domain[-4:],
        "device_id": f"{device:04X}",
        "bus_id": bus_id,
        "subsystem_id": board.subsystem_id,
        "pcie_gen": str(board.pcie_gen),
        "host_pcie_gen": "4" if grace else str(board.pcie_gen),
        "atomic_caps": "FETCHADD_32 FETCHADD_64 SWAP_32 SWAP_64 CAS_32 CAS_64 " if grace else "N/A",
        "fb_total": str(board.fb_total),
        "fb_reserved": str(board.fb_reserved),
        "fb_free": str(board.fb_total - board.fb_reserved),
        "bar1": str(board.bar1),
        "banks": str(board.banks),
        "temp": str(31 + index % 5),
        "temp_shutdown": "92",
        "temp_slowdown": "89",
        "temp_max_gpu": "85",
        "temp_max_mem": "95",
        "tlimit": str(52 - index % 5),
        "mem_temp": str(33 + index % 4),
        "power_draw": f"{board.power_limit * 0.1 + index * 0.37:.2f}",
        "power_limit": f"{board.power_limit:.2f}",
        "power_min": f"{board.power_min:.2f}",
        "mem_power": f"{board.power_limit * 0.025:.2f} W" if board.module_limit else "N/A",
        "module_pstate": "P0" if board.module_limit else "N/A",
        "module_draw": f"{board.module_limit * 0.17:.2f} W" if board.module_limit else "N/A",
        "module_limit": f"{board.module_limit:.2f} W" if board.module_limit else "N/A",
        "module_min": "500.00 W" if board.module_limit else "N/A",
        "power_smoothing": "Insufficient Permissions" if board.module_limit else "N/A",
        "idle_clock": "345",
        "mem_clock": str(board.mem_clock),
        "video_idle": "765",
        "max_clock": str(board.max_clock),
        "max_video": str(board.max_video),
        "fabric_state": state,
        "fabric_status": status,
        "clique_id": str(clique) if completed else "N/A",
        "cluster_uuid": cluster if completed else "N/A",
        "health_summary": "Healthy" if completed else "N/A",
        "health_bandwidth": "Full" if completed and grace else "N/A",
        "health_flag": "False" if completed and grace else "N/A",
        "health_config": "None" if completed and grace else "N/A",
        **vgpu_values(node),
    }


_Line = tuple[int, str, str | None]  # depth, key, value template (None: a section)


def _lines(template: str) -> list[_Line]:
    """Read a template in the notation above into (depth, key, value) lines."""
    out: list[_Line] = []
    for raw in template.splitlines():
        key = raw.lstrip(" ")
        depth = (len(raw) - len(key)) // 2
        head, sep, value = key.partition(": ")
        out.append((depth, head, value) if sep else (depth, key, None))
    return out


_TEXT_LINES = _lines(TEXT_GPU)
_XML_LINES = _lines(XML_GPU)


def _select(template: list[_Line], values: Mapping[str, str]) -> list[_Line]:
    """The template lines this driver and guest print: [580] lines from 580 on, [570]
    lines before it, [vgpu] lines on a vGPU guest only; a section left out takes its
    children with it."""
    branch = _branch(values["driver_version"])
    keep = {"[580": branch >= 580, "[570": branch < 580, "[vgpu": bool(values["license_status"])}
    out: list[_Line] = []
    skip_below: int | None = None
    for depth, key, value in template:
        if skip_below is not None and depth > skip_below:
            continue
        skip_below = None
        tag, _, rest = key.partition("] ")
        if key.startswith("[") and rest:
            if not keep[tag]:
                skip_below = depth
                continue
            key = rest
        out.append((depth, key, value))
    return out


def _text_gpu(values: Mapping[str, str]) -> str:
    """One `-q` GPU block (the [vgpu] sections only on a vGPU guest)."""
    lines = [f"GPU {values['bus_id']}"]
    for depth, key, value in _select(_TEXT_LINES, values):
        indent = " " * (4 * depth + 4)
        if value is None:
            lines.append(indent + (key[:-1] + " " if key.endswith("|") else key))
        else:
            lines.append(f"{indent}{key}".ljust(_KEY_COLUMN) + ": " + value.format_map(values))
    return "\n".join(lines) + "\n"


def _branch(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def _xml_gpu(values: Mapping[str, str], clocks: list[int]) -> str:
    """One `-q -x` <gpu> element."""
    lines = [f'\t<gpu id="{values["bus_id"]}">']
    stack: list[str] = []
    for depth, key, value in _select(_XML_LINES, values):
        while len(stack) > depth:
            lines.append("\t" * (len(stack) + 1) + f"</{stack.pop()}>")
        tabs = "\t" * (depth + 2)
        if key == "@supported_graphics_clocks":
            lines += [
                f"{tabs}<supported_graphics_clock>{c} MHz</supported_graphics_clock>"
                for c in clocks
            ]
        elif key.endswith("!"):
            lines += [f"{tabs}<{key[:-1]}>", f"{tabs}</{key[:-1]}>"]
        elif value is None:
            lines.append(f"{tabs}<{key}>")
            stack.append(key)
        elif value.endswith("  #NL"):
            text = escape(value[:-5].format_map(values))
            lines += [f"{tabs}<{key}>", f"{tabs}\t{text}", f"{tabs}</{key}>"]
        else:
            lines.append(f"{tabs}<{key}>{escape(value.format_map(values))}</{key}>")
    while stack:
        lines.append("\t" * (len(stack) + 1) + f"</{stack.pop()}>")
    lines.append("\t</gpu>")
    return "\n".join(lines) + "\n\n"


def _stamp() -> str:
    return time.strftime("%a %b %d %H:%M:%S %Y")


def _kv0(key: str, value: str) -> str:
    return key.ljust(_KEY_COLUMN) + ": " + value


def render_query(node: Node, version: str, gpus: list[tuple[int, str, int]], xml: bool) -> str:
    """The whole `-q` (text) or `-q -x` (XML) report for (index, address, device) GPUs."""
    cuda = cuda_version_for(version)
    fabric = _fabric(node)
    per_gpu = [
        (_values(node, version, i, a, d, fabric), _BOARDS.get(d, _DEFAULT_BOARD))
        for i, a, d in gpus
    ]
    if xml:
        dtd = 13 if _branch(version) >= 580 else 12  # qx-gb300.xml: v13, qx-a100.xml: v12
        head = (
            '<?xml version="1.0" ?>\n'
            f'<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v{dtd}.dtd">\n'
            "<nvidia_smi_log>\n"
            f"\t<timestamp>{_stamp()}</timestamp>\n"
            f"\t<driver_version>{version}</driver_version>\n"
            f"\t<cuda_version>{cuda}</cuda_version>\n"
            f"\t<attached_gpus>{len(gpus)}</attached_gpus>\n"
        )
        body = "".join(_xml_gpu(v, _clocks(b)) for v, b in per_gpu)
        count_license_query(node)
        return head + body + "</nvidia_smi_log>\n"
    count_license_query(node)
    head = "\n".join(
        [
            "==============NVSMI LOG==============",
            "",
            _kv0("Timestamp", _stamp()),
            _kv0("Driver Version", version),
            _kv0("CUDA Version", cuda),
            "",
            _kv0("Attached GPUs", str(len(gpus))),
            "",
        ]
    )
    return head + "\n".join(_text_gpu(v) for v, _b in per_gpu)


# ---------------------------------------------------------------- the default table

_TABLE_HEAD = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {v:<23}Driver Version: {v:<15}CUDA Version: {cuda:<9}|
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
"""
_TABLE_GPU = """\
| {i:>3}  {name:<26}     On  |   {bus} Off |                    0 |
| N/A   30C    P0             70W / {watts:>4}W |       1MiB / {mem:>6}MiB |      0%      Default |
|                                         |                        |             {mig:>8} |
+-----------------------------------------+------------------------+----------------------+
"""
_TABLE_TAIL = """\

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""


def render_table(node: Node, version: str, gpus: list[tuple[int, str, int]]) -> str:
    """The default nvidia-smi table (550+ layout, column for column)."""
    text = _stamp() + "\n"
    text += _TABLE_HEAD.format(v=version, cuda=cuda_version_for(version))
    for index, address, device in gpus:
        board = _BOARDS.get(device, _DEFAULT_BOARD)
        name = node.product_name(device)[:26]
        mig = mig_mode_values(node, address, device)[0]
        text += _TABLE_GPU.format(
            i=index,
            name=name,
            bus=smi_bus_id(address),
            watts=board.power_limit,
            mem=board.fb_total,
            mig="Disabled" if mig == "N/A" else mig,
        )
    return text + _TABLE_TAIL
