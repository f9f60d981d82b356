"""The `nvidia-smi -q` text template of one GPU block (used by :mod:`standin_smi_render`).

Reference (read, not copied): the 570.124.06 layout of
samples/nvidia-smi/thamada/RTX5090x1_gls_q.txt (key column 42, four spaces a level, one
blank line after each GPU block, the trailing space after "GPU Memory Power Readings"
and after an empty Chassis Serial Number); the 535/550/565 captures beside it have the
same frame with fewer keys.

Notation (shared with :mod:`standin_smi_xml`): two spaces a level, ``Key: value`` for a
line, ``Key`` for a section, ``Key|`` for a section heading the real tool prints with a
trailing space, ``[vgpu] Key`` for a section only a vGPU guest (a GRID driver) prints:
its "vGPU Software Licensed Product" block follows "GPU Virtualization Mode" with
"Virtualization Mode : VGPU", as in a real 535.216.01 `-q` of a GRID V100D-8C guest
quoted in a public GPU Operator vGPU guide, and ``License Status`` words from NVIDIA's
vGPU licensing guides and NVIDIA/gpu-operator #220 (``Unlicensed``). Values in braces
come from the board table and the node (:func:`standin_smi_render._values`).
"""

from __future__ import annotations

__all__ = ["TEXT_GPU"]


# -q, one GPU block, 570.124.06 layout.
TEXT_GPU = """\
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
  Virtualization Mode: {virtualization_mode}
  Host VGPU Mode: N/A
  vGPU Heterogeneous Mode: N/A
[vgpu] vGPU Software Licensed Product
  Product Name: {licensed_product}
  License Status: {license_status}
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
