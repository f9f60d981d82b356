"""The `nvidia-smi -q -x` template of one <gpu> element (used by :mod:`standin_smi_render`).

Reference (read, not copied): the 580.173.02 layout of
k8s-test-infra_hardware_xml/qx-gb300.xml and qx-gb200.xml for 580 and later drivers,
the 570.148.08 layout of qx-a100.xml before (``nvsmi_device_v13.dtd`` / ``v12``
DOCTYPE, one tab a level, ``<fabric>`` with ``cliqueId``/``clusterUuid``/``<health>``, a
``<supported_clocks>`` list of every graphics clock, which is most of its 29-44 KB per
GPU). A vGPU guest's ``[vgpu] vgpu_software_licensed_product`` element follows
``gpu_virtualization_mode``, as NVML's own nvidia_smi.py (pynvml) writes it, with the
element names and ``Licensed (Expiry: ...)`` value of a public 580.105.08 L40S-2Q guest's
`-q -x`.

Notation: that of :mod:`standin_smi_text` (two spaces a level, ``key: value``, ``key``
a section), plus ``tag!`` an empty element printed open and closed on two lines,
``tag: value  #NL`` a value on its own line, ``@supported_graphics_clocks`` the clock
list, and a ``[580]`` / ``[570]`` prefix a line only 580-and-later / earlier drivers
print (``[vgpu]``: only a vGPU guest).
"""

from __future__ import annotations

__all__ = ["XML_GPU"]


# -q -x, one <gpu> element: the 580.173.02 layout (qx-gb300.xml, qx-gb200.xml); lines
# marked [580] are printed by 580 and later drivers only, lines marked [570] by earlier
# ones only, which gives the 570.148.08 layout of qx-a100.xml.
XML_GPU = """\
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
  virtualization_mode: {virtualization_mode}
  host_vgpu_mode: N/A
  vgpu_heterogeneous_mode: N/A
[vgpu] vgpu_software_licensed_product
  licensed_product_name: {licensed_product}
  license_status: {license_status}
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
