"""The simulator's `nvidia-smi`: full-size output in the real layouts, from its own templates.

References (read, not copied; no product code is used to make this output):

* argv grammar and exit codes: nvidia-smi(1), "RETURN VALUE" (0 success, 2 "a supplied
  argument or flag is invalid", 6 "a query to find an object was unsuccessful", 9 "the
  NVIDIA driver is not loaded", 14 "infoROM is corrupted", 18 driver/library version
  mismatch as observed); an unknown flag prints
  ``ERROR: Option <flag> is not recognized. Please run 'nvidia-smi -h' for help.`` and
  a flag without its value ``ERROR: Option <flag> is missing its value. ...`` (both as
  quoted in public user reports of the real tool); ``-x`` without ``-q`` and other bad
  mixes print ``Invalid combination of input arguments. Please run 'nvidia-smi -h' for
  help.``. A loaded driver that manages no GPU (the proprietary module on a Blackwell
  GPU) prints ``No devices were found`` and exits 6.
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

The templates below use a small notation of their own: two spaces a level, ``Key:
value`` for a line, ``Key`` for a section, ``Key|`` for a section heading the real
tool prints with a trailing space; in XML ``tag!`` is an empty element printed open
and closed on two lines, ``tag: value  #NL`` a value on its own line, and
``@supported_graphics_clocks`` the clock list, and a ``[580]`` / ``[570]`` prefix a
line only 580-and-later / earlier drivers print. Values in braces come from the board
table and the node.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from xml.sax.saxutils import escape

from bootfsm.sim.nodestate import FABRIC_MANAGER, RUN_DIR, Node, smi_bus_id
from bootfsm.sim.standin_driver import cuda_version_for
from bootfsm.sim.standin_smi_mig import mig_command, mig_mode_values, set_mig_mode_command

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
_KEY_COLUMN = 42  # where the colon of "-q" text sits (real layouts, all branches)

# -q, one GPU block, 570.124.06 layout.
_TEXT_GPU = """\
Product Name: {product_name}
Product Brand: {brand}
Product Architecture: {architecture}
Display Mode: Disabled
Display Active: Disabled
Persistence Mode: Enabled
Addressing Mode: {addressing_mode}
MIG Mode
  Current: {mig_current}
  Pending: {mig_pending}
Accounting Mode: Disabled
Accounting Mode Buffer Size: 4000
Driver Model
  Current: N/A
  Pending: N/A
Serial Number: {serial}
GPU UUID: {uuid}
Minor Number: {minor}
VBIOS Version: {vbios}
MultiGPU Board: No
Board ID: {board_id}
Board Part Number: {board_part}
GPU Part Number: {gpu_part}
FRU Part Number: N/A
Platform Info
  Chassis Serial Number: {chassis_serial}
  Slot Number: {slot}
  Tray Index: {tray}
  Host ID: 1
  Peer Type: {peer_type}
  Module Id: {module_id}
  GPU Fabric GUID: {fabric_guid}
Inforom Version
  Image Version: {inforom_image}
  OEM Object: 2.1
  ECC Object: {inforom_ecc}
  Power Management Object: N/A
Inforom BBX Object Flush
  Latest Timestamp: N/A
  Latest Duration: N/A
GPU Operation Mode
  Current: N/A
  Pending: N/A
GPU C2C Mode: {c2c_mode}
GPU Virtualization Mode
  Virtualization Mode: None
  Host VGPU Mode: N/A
  vGPU Heterogeneous Mode: N/A
GPU Reset Status
  Reset Required: Requested functionality has been deprecated
  Drain and Reset Recommended: Requested functionality has been deprecated
GPU Recovery Action: None
GSP Firmware Version: {driver_version}
IBMNPU
  Relaxed Ordering Mode: N/A
PCI
  Bus: 0x{pci_bus}
  Device: 0x{pci_device}
  Domain: 0x{pci_domain4}
  Base Classcode: 0x3
  Sub Classcode: 0x2
  Device Id: 0x{device_id}10DE
  Bus Id: {bus_id}
  Sub System Id: 0x{subsystem_id}
  GPU Link Info
    PCIe Generation
      Max: {pcie_gen}
      Current: {pcie_gen}
      Device Current: {pcie_gen}
      Device Max: {pcie_gen}
      Host Max: {host_pcie_gen}
    Link Width
      Max: 16x
      Current: 16x
  Bridge Chip
    Type: N/A
    Firmware: N/A
  Replays Since Reset: 0
  Replay Number Rollovers: 0
  Tx Throughput: 0 KB/s
  Rx Throughput: 0 KB/s
  Atomic Caps Outbound: N/A
  Atomic Caps Inbound: {atomic_caps}
Fan Speed: N/A
Performance State: P0
Clocks Event Reasons
  Idle: Not Active
  Applications Clocks Setting: Not Active
  SW Power Cap: Active
  HW Slowdown: Not Active
    HW Thermal Slowdown: Not Active
    HW Power Brake Slowdown: Not Active
  Sync Boost: Not Active
  SW Thermal Slowdown: Not Active
  Display Clock Setting: Not Active
Sparse Operation Mode: N/A
FB Memory Usage
  Total: {fb_total} MiB
  Reserved: {fb_reserved} MiB
  Used: 0 MiB
  Free: {fb_free} MiB
BAR1 Memory Usage
  Total: {bar1} MiB
  Used: 0 MiB
  Free: {bar1} MiB
Conf Compute Protected Memory Usage
  Total: 0 MiB
  Used: 0 MiB
  Free: 0 MiB
Compute Mode: Default
Utilization
  GPU: 0 %
  Memory: 0 %
  Encoder: 0 %
  Decoder: 0 %
  JPEG: 0 %
  OFA: 0 %
Encoder Stats
  Active Sessions: 0
  Average FPS: 0
  Average Latency: 0
FBC Stats
  Active Sessions: 0
  Average FPS: 0
  Average Latency: 0
DRAM Encryption Mode
  Current: Disabled
  Pending: Disabled
ECC Mode
  Current: Enabled
  Pending: Enabled
ECC Errors
  Volatile
    SRAM Correctable: N/A
    SRAM Uncorrectable Parity: N/A
    SRAM Uncorrectable SEC-DED: N/A
    DRAM Correctable: N/A
    DRAM Uncorrectable: N/A
  Aggregate
    SRAM Correctable: N/A
    SRAM Uncorrectable Parity: N/A
    SRAM Uncorrectable SEC-DED: N/A
    DRAM Correctable: N/A
    DRAM Uncorrectable: N/A
    SRAM Threshold Exceeded: N/A
  Aggregate Uncorrectable SRAM Sources
    SRAM L2: N/A
    SRAM SM: N/A
    SRAM Microcontroller: N/A
    SRAM PCIE: N/A
    SRAM Other: N/A
Retired Pages
  Single Bit ECC: N/A
  Double Bit ECC: N/A
  Pending Page Blacklist: N/A
Remapped Rows: N/A
Temperature
  GPU Current Temp: {temp} C
  GPU T.Limit Temp: {tlimit} C
  GPU Shutdown T.Limit Temp: -5 C
  GPU Slowdown T.Limit Temp: -2 C
  GPU Max Operating T.Limit Temp: 0 C
  GPU Target Temperature: N/A
  Memory Current Temp: {mem_temp} C
  Memory Max Operating T.Limit Temp: N/A
GPU Power Readings
  Average Power Draw: {power_draw} W
  Instantaneous Power Draw: {power_draw} W
  Current Power Limit: {power_limit} W
  Requested Power Limit: {power_limit} W
  Default Power Limit: {power_limit} W
  Min Power Limit: {power_min} W
  Max Power Limit: {power_limit} W
GPU Memory Power Readings|
  Average Power Draw: N/A
  Instantaneous Power Draw: N/A
Module Power Readings
  Average Power Draw: N/A
  Instantaneous Power Draw: N/A
  Current Power Limit: N/A
  Requested Power Limit: N/A
  Default Power Limit: N/A
  Min Power Limit: N/A
  Max Power Limit: N/A
Power Smoothing: N/A
Workload Power Profiles
  Requested Profiles: N/A
  Enforced Profiles: N/A
Clocks
  Graphics: {idle_clock} MHz
  SM: {idle_clock} MHz
  Memory: {mem_clock} MHz
  Video: {video_idle} MHz
Applications Clocks
  Graphics: {max_clock} MHz
  Memory: {mem_clock} MHz
Default Applications Clocks
  Graphics: {max_clock} MHz
  Memory: {mem_clock} MHz
Deferred Clocks
  Memory: N/A
Max Clocks
  Graphics: {max_clock} MHz
  SM: {max_clock} MHz
  Memory: {mem_clock} MHz
  Video: {max_video} MHz
Max Customer Boost Clocks
  Graphics: {max_clock} MHz
Clock Policy
  Auto Boost: N/A
  Auto Boost Default: N/A
Voltage
  Graphics: N/A
Fabric
  State: {fabric_state}
  Status: {fabric_status}
  CliqueId: {clique_id}
  ClusterUUID: {cluster_uuid}
  Health
    Bandwidth: {health_bandwidth}
    Route Recovery in progress: {health_flag}
    Route Unhealthy: {health_flag}
    Access Timeout Recovery: {health_flag}
Processes: None
Capabilities
  EGM: disabled
"""

# -q -x, one <gpu> element: the 580.173.02 layout (qx-gb300.xml, qx-gb200.xml); lines
# marked [580] are printed by 580 and later drivers only, lines marked [570] by earlier
# ones only, which gives the 570.148.08 layout of qx-a100.xml.
_XML_GPU = """\
product_name: {product_name}
product_brand: {brand}
product_architecture: {architecture}
display_mode: Requested functionality has been deprecated
[580] display_attached: No
display_active: Disabled
persistence_mode: Enabled
addressing_mode: {addressing_mode}
mig_mode
  current_mig: {mig_current}
  pending_mig: {mig_pending}
mig_devices: None  #NL
accounting_mode: Disabled
accounting_mode_buffer_size: 4000
driver_model
  current_dm: N/A
  pending_dm: N/A
serial: {serial}
uuid: {uuid}
[580] pdi: {pdi}
minor_number: {minor}
vbios_version: {vbios}
multigpu_board: No
board_id: {board_id}
board_part_number: {board_part}
gpu_part_number: {gpu_part}
gpu_fru_part_number: N/A
platformInfo
  chassis_serial_number: {chassis_serial}
  slot_number: {slot}
  tray_index: {tray}
  host_id: 1
  peer_type: {peer_type}
  module_id: {module_id}
  gpu_fabric_guid: {fabric_guid}
inforom_version
  img_version: {inforom_image}
  oem_object: 2.1
  ecc_object: {inforom_ecc}
  pwr_object: N/A
inforom_bbx_flush
  latest_timestamp: N/A
  latest_duration: N/A
gpu_operation_mode
  current_gom: N/A
  pending_gom: N/A
c2c_mode: {c2c_mode}
gpu_virtualization_mode
  virtualization_mode: None
  host_vgpu_mode: N/A
  vgpu_heterogeneous_mode: N/A
[570] gpu_reset_status
  reset_required: Requested functionality has been deprecated
  drain_and_reset_recommended: Requested functionality has been deprecated
gpu_recovery_action: None
gsp_firmware_version: {driver_version}
ibmnpu
  relaxed_ordering_mode: N/A
pci
  pci_bus: {pci_bus}
  pci_device: {pci_device}
  pci_domain: {pci_domain}
  pci_base_class: 3
  pci_sub_class: 2
  pci_device_id: {device_id}10DE
  pci_bus_id: {bus_id}
  pci_sub_system_id: {subsystem_id}
  pci_gpu_link_info
    pcie_gen
      max_link_gen: {pcie_gen}
      current_link_gen: {pcie_gen}
      device_current_link_gen: {pcie_gen}
      max_device_link_gen: {pcie_gen}
      max_host_link_gen: {host_pcie_gen}
    link_widths
      max_link_width: 16x
      current_link_width: 16x
  pci_bridge_chip
    bridge_chip_type: N/A
    bridge_chip_fw: N/A
  replay_counter: 0
  replay_rollover_counter: 0
  tx_util: 0 KB/s
  rx_util: 0 KB/s
  atomic_caps_outbound: N/A
  atomic_caps_inbound: {atomic_caps}
fan_speed: N/A
performance_state: P0
clocks_event_reasons
  clocks_event_reason_gpu_idle: Active
  clocks_event_reason_applications_clocks_setting: Not Active
  clocks_event_reason_sw_power_cap: Not Active
  clocks_event_reason_hw_slowdown: Not Active
  clocks_event_reason_hw_thermal_slowdown: Not Active
  clocks_event_reason_hw_power_brake_slowdown: Not Active
  clocks_event_reason_sync_boost: Not Active
  clocks_event_reason_sw_thermal_slowdown: Not Active
  clocks_event_reason_display_clocks_setting: Not Active
[580] clocks_event_reasons_counters
  clocks_event_reasons_counters_sw_power_cap: 0 us
  clocks_event_reasons_counters_sync_boost: 0 us
  clocks_event_reasons_counters_sw_therm_slowdown: 0 us
  clocks_event_reasons_counters_hw_therm_slowdown: 0 us
  clocks_event_reasons_counters_hw_power_brake: 0 us
sparse_operation_mode: N/A
fb_memory_usage
  total: {fb_total} MiB
  reserved: {fb_reserved} MiB
  used: 0 MiB
  free: {fb_free} MiB
bar1_memory_usage
  total: {bar1} MiB
  used: 0 MiB
  free: {bar1} MiB
cc_protected_memory_usage
  total: 0 MiB
  used: 0 MiB
  free: 0 MiB
compute_mode: Default
utilization
  gpu_util: 0 %
  memory_util: 0 %
  encoder_util: 0 %
  decoder_util: 0 %
  jpeg_util: 0 %
  ofa_util: 0 %
encoder_stats
  session_count: 0
  average_fps: 0
  average_latency: 0
fbc_stats
  session_count: 0
  average_fps: 0
  average_latency: 0
dram_encryption_mode
  current_dram_encryption: N/A
  pending_dram_encryption: N/A
ecc_mode
  current_ecc: Enabled
  pending_ecc: Enabled
ecc_errors
  volatile
    sram_correctable: 0
    sram_uncorrectable_parity: 0
    sram_uncorrectable_secded: 0
    dram_correctable: 0
    dram_uncorrectable: 0
  aggregate
    sram_correctable: 0
    sram_uncorrectable_parity: 0
    sram_uncorrectable_secded: 0
    dram_correctable: 0
    dram_uncorrectable: 0
    sram_threshold_exceeded: No
  aggregate_uncorrectable_sram_sources
    sram_l2: 0
    sram_sm: 0
    sram_microcontroller: 0
    sram_pcie: 0
    sram_other: 0
  [580] channel_repair_pending: No
  [580] tpc_repair_pending: No
  [580] unrepairable_memory: No
retired_pages
  multiple_single_bit_retirement
    retired_count: N/A
    retired_pagelist: N/A
  double_bit_retirement
    retired_count: N/A
    retired_pagelist: N/A
  pending_blacklist: N/A
  pending_retirement: N/A
remapped_rows
  remapped_row_corr: 0
  [580] remapped_row_corr_inactive: 0
  remapped_row_unc: 0
  [580] remapped_row_unc_inactive: 0
  remapped_row_pending: No
  remapped_row_failure: No
  row_remapper_histogram
    row_remapper_histogram_max: {banks} bank(s)
    row_remapper_histogram_high: 0 bank(s)
    row_remapper_histogram_partial: 0 bank(s)
    row_remapper_histogram_low: 0 bank(s)
    row_remapper_histogram_none: 0 bank(s)
temperature
  gpu_temp: {temp} C
  gpu_temp_tlimit: {tlimit} C
  [580] gpu_temp_max_tlimit_threshold: -5 C
  [570] gpu_temp_max_threshold: {temp_shutdown} C
  [580] gpu_temp_slow_tlimit_threshold: -2 C
  [570] gpu_temp_slow_threshold: {temp_slowdown} C
  [580] gpu_temp_max_gpu_tlimit_threshold: 0 C
  [570] gpu_temp_max_gpu_threshold: {temp_max_gpu} C
  gpu_target_temperature: N/A
  memory_temp: {mem_temp} C
  [580] gpu_temp_max_mem_tlimit_threshold: 0 C
  [570] gpu_temp_max_mem_threshold: {temp_max_mem} C
supported_gpu_target_temp
  gpu_target_temp_min: N/A
  gpu_target_temp_max: N/A
gpu_power_readings
  power_state: P0
  average_power_draw: {power_draw} W
  instant_power_draw: {power_draw} W
  current_power_limit: {power_limit} W
  requested_power_limit: {power_limit} W
  default_power_limit: {power_limit} W
  min_power_limit: {power_min} W
  max_power_limit: {power_limit} W
gpu_memory_power_readings
  average_power_draw: {mem_power}
  instant_power_draw: N/A
module_power_readings
  power_state: {module_pstate}
  average_power_draw: {module_draw}
  instant_power_draw: {module_draw}
  current_power_limit: {module_limit}
  requested_power_limit: {module_limit}
  default_power_limit: {module_limit}
  min_power_limit: {module_min}
  max_power_limit: {module_limit}
power_smoothing: {power_smoothing}
power_profiles
  power_profile_requested_profiles: N/A
  power_profile_enforced_profiles: N/A
clocks
  graphics_clock: {idle_clock} MHz
  sm_clock: {idle_clock} MHz
  mem_clock: {mem_clock} MHz
  video_clock: {video_idle} MHz
applications_clocks
  graphics_clock: {max_clock} MHz
  mem_clock: {mem_clock} MHz
default_applications_clocks
  graphics_clock: {max_clock} MHz
  mem_clock: {mem_clock} MHz
deferred_clocks
  mem_clock: N/A
max_clocks
  graphics_clock: {max_clock} MHz
  sm_clock: {max_clock} MHz
  mem_clock: {mem_clock} MHz
  video_clock: {max_video} MHz
max_customer_boost_clocks
  graphics_clock: {max_clock} MHz
clock_policy
  auto_boost: N/A
  auto_boost_default: N/A
[570] voltage
  graphics_volt: N/A
fabric
  state: {fabric_state}
  status: {fabric_status}
  cliqueId: {clique_id}
  clusterUuid: {cluster_uuid}
  health
    [580] summary: {health_summary}
    bandwidth: {health_bandwidth}
    route_recovery_in_progress: {health_flag}
    route_unhealthy: {health_flag}
    access_timeout_recovery: {health_flag}
    [580] incorrect_configuration: {health_config}
    [580] partition_assigned: N/A
supported_clocks
  supported_mem_clock
    value: {mem_clock} MHz
    @supported_graphics_clocks
processes!
accounted_processes!
capabilities
  egm: disabled
"""


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


_TEXT_LINES = _lines(_TEXT_GPU)
_XML_LINES = _lines(_XML_GPU)


def _text_gpu(values: Mapping[str, str]) -> str:
    """One `-q` GPU block."""
    lines = [f"GPU {values['bus_id']}"]
    for depth, key, value in _TEXT_LINES:
        indent = " " * (4 * depth + 4)
        if value is None:
            lines.append(indent + (key[:-1] + " " if key.endswith("|") else key))
        else:
            lines.append(f"{indent}{key}".ljust(_KEY_COLUMN) + ": " + value.format_map(values))
    return "\n".join(lines) + "\n"


def _for_branch(template: list[_Line], branch: int) -> list[_Line]:
    """The template lines a driver branch prints: [580] lines from 580 on, [570] lines
    before it; a section left out takes its children with it."""
    out: list[_Line] = []
    skip_below: int | None = None
    for depth, key, value in template:
        if skip_below is not None and depth > skip_below:
            continue
        skip_below = None
        tag, _, rest = key.partition("] ")
        if key.startswith("[") and rest:
            wanted = branch >= 580 if tag == "[580" else branch < 580
            if not wanted:
                skip_below = depth
                continue
            key = rest
        out.append((depth, key, value))
    return out


def _branch(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def _xml_gpu(values: Mapping[str, str], clocks: list[int]) -> str:
    """One `-q -x` <gpu> element."""
    lines = [f'\t<gpu id="{values["bus_id"]}">']
    stack: list[str] = []
    for depth, key, value in _for_branch(_XML_LINES, _branch(values["driver_version"])):
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
        return head + body + "</nvidia_smi_log>\n"
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


def _table(node: Node, version: str, gpus: list[tuple[int, str, int]]) -> str:
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
            raise _Usage(f"ERROR: Option {arg} is not recognized. {_HELP}")
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
    try:
        flags, target, mig = _parse_argv([]) if subcommand else _parse_argv(argv)
    except _Usage as exc:
        print(exc)
        print()
        return 2
    if "help" in flags:
        print("NVIDIA System Management Interface -- bootfsm simulator")
        print("nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...")
        return 0
    library = node.nvml_version()
    module = node.loaded_module()
    if library is None or module is None:
        print(_NO_DRIVER)
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
    if "query" in flags:
        if inforom:
            print(warning)
        sys.stdout.write(render_query(node, module.version, gpus, xml="xml" in flags))
        return 0
    sys.stdout.write(_table(node, module.version, gpus))
    if inforom:
        print(warning)
        return 14
    return 0


COMMANDS: Mapping[str, Callable[[Node, list[str]], int]] = {"nvidia-smi": nvidia_smi}
