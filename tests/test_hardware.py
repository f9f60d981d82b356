"""Tests for bootfsm.core.hardware, the PCI id knowledge table."""

from __future__ import annotations

import pytest

from bootfsm.core.hardware import (
    GPU_MODELS,
    MELLANOX_VENDOR,
    NVIDIA_VENDOR,
    NVSWITCH_CLASS,
    NVSWITCH_MODELS,
    DeviceRole,
    Family,
    GpuModel,
    blackwell_or_later,
    classify,
    has_fabric_probe,
    model_for,
    requires_open_module,
)
from tests.lspci import parse_lspci_nn
from tests.samples import sample


@pytest.mark.parametrize(
    ("device_id", "family", "grace"),
    [
        (0x20B0, Family.AMPERE, False),
        (0x20B2, Family.AMPERE, False),
        (0x2236, Family.AMPERE, False),
        (0x2330, Family.HOPPER, False),
        (0x2331, Family.HOPPER, False),
        (0x2321, Family.HOPPER, False),
        (0x2335, Family.HOPPER, False),
        (0x233B, Family.HOPPER, False),
        (0x2342, Family.HOPPER, True),
        (0x2348, Family.HOPPER, True),
        (0x2901, Family.BLACKWELL, False),
        (0x2941, Family.BLACKWELL, True),
        (0x31C2, Family.BLACKWELL, True),
        (0x31C3, Family.BLACKWELL, True),
        (0x2B85, Family.BLACKWELL, False),
        (0x3182, Family.BLACKWELL, False),
    ],
)
def test_table(device_id: int, family: Family, grace: bool) -> None:
    model = GPU_MODELS[device_id]
    assert (model.device_id, model.family, model.grace) == (device_id, family, grace)
    assert model_for(device_id) is model


def test_names() -> None:
    assert model_for(0x2330).name == "H100 SXM5"
    assert model_for(0x2335).name == "H200 SXM"
    assert model_for(0x2941).name == "GB200"
    assert NVSWITCH_MODELS == {0x1AF1: "A100 NVSwitch", 0x22A3: "H100 NVSwitch"}


def test_unknown_id() -> None:
    assert model_for(0x1234) == GpuModel(0x1234, "NVIDIA 0x1234", Family.UNKNOWN, grace=False)


@pytest.mark.parametrize(
    ("vendor", "device", "pci_class", "role"),
    [
        (NVIDIA_VENDOR, 0x20B0, 0x030200, DeviceRole.GPU),  # sysfs form (NCCL dump)
        (NVIDIA_VENDOR, 0x2330, 0x0302, DeviceRole.GPU),  # lspci -nn form
        (NVIDIA_VENDOR, 0x1234, 0x030000, DeviceRole.GPU),  # unknown VGA-class NVIDIA GPU
        (NVIDIA_VENDOR, 0x22A3, NVSWITCH_CLASS, DeviceRole.NVSWITCH),
        (NVIDIA_VENDOR, 0x1AF1, 0x0680, DeviceRole.NVSWITCH),
        (NVIDIA_VENDOR, 0x22BA, 0x040300, DeviceRole.OTHER),  # HDMI audio function
        (MELLANOX_VENDOR, 0x101C, 0x020700, DeviceRole.OTHER),
        (0x1A03, 0x2000, 0x030000, DeviceRole.OTHER),  # ASPEED BMC VGA
    ],
)
def test_classify(vendor: int, device: int, pci_class: int, role: DeviceRole) -> None:
    """The class decides, whatever the device id."""
    assert classify(vendor, pci_class) is role


def test_classify_real_azure_nd96asr_v4() -> None:
    devices = parse_lspci_nn(sample("lspci/lspci-nn_azure_nd96asr_a100_gpud.txt"))
    roles = [classify(d.vendor, d.class_code) for d in devices]
    assert roles.count(DeviceRole.GPU) == 8
    assert roles.count(DeviceRole.NVSWITCH) == 6
    gpus = [model_for(d.device) for d, r in zip(devices, roles) if r is DeviceRole.GPU]
    assert {g.name for g in gpus} == {"A100 SXM4 80GB"}
    assert not requires_open_module(gpus)


def test_requires_open_module() -> None:
    assert requires_open_module([model_for(0x2330), model_for(0x2901)])
    assert requires_open_module(iter([model_for(0x2941)]))
    assert not requires_open_module([model_for(0x2342), model_for(0x1234)])
    assert not requires_open_module([])


@pytest.mark.parametrize(
    ("device_id", "needs_open"),
    [
        (0x2900, True),  # the first Blackwell id
        (0x2909, True),  # not in the table: the rule, not the list, decides
        (0x3182, True),  # B300 SXM6 AC (lspci_b300_excerpts.txt)
        (0x31C2, True),  # GB300 (qx-gb300.xml pci_device_id 31C210DE)
        (0x2B85, True),  # GeForce RTX 5090 (RTX5090x1_gls_q.txt Device Id 0x2B8510DE)
        (0x2E12, True),  # an id the table does not name
        (0x307F, True),  # Rubin (the 615.23 capture's pci_device_id), unknown here
        (0x28FF, False),  # the last id below the rule (Ada range)
        (0x26B9, False),  # L40S (qx-l40s.xml)
        (0x2342, False),  # GH200: Hopper
        (0x20B0, False),
    ],
)
def test_open_module_rule_is_by_id(device_id: int, needs_open: bool) -> None:
    assert blackwell_or_later(device_id) is needs_open
    assert requires_open_module([model_for(device_id)]) is needs_open


def test_names_of_new_ids() -> None:
    assert model_for(0x3182).name == "B300 SXM6 AC"
    assert model_for(0x2B85).name == "GeForce RTX 5090"
    assert model_for(0x2909).name == "NVIDIA 0x2909"  # named by nobody, still open-only


def test_fabric_probe_by_family() -> None:
    assert not has_fabric_probe(model_for(0x20B2))  # A100: Fabric N/A by design
    assert not has_fabric_probe(model_for(0x2236))  # A10
    assert has_fabric_probe(model_for(0x2330))
    assert has_fabric_probe(model_for(0x31C2))
    assert has_fabric_probe(model_for(0x1234))  # unknown ids are judged by what they report


def test_every_gpu_in_the_table_has_its_branches_and_the_default_driver_drives_it() -> None:
    """The default driver (docs/config.md) must drive every GPU bootfsm knows: a row of
    SUPPORTED_BRANCHES per model, and the default's branch inside each row's range."""
    from bootfsm.core.config import DEFAULTS
    from bootfsm.core.hardware import _MODELS, SUPPORTED_BRANCHES, branch_problem

    assert len(GPU_MODELS) == len(_MODELS)  # no device id twice
    assert set(SUPPORTED_BRANCHES) == set(GPU_MODELS)
    assert branch_problem(DEFAULTS.driver.version, GPU_MODELS.values()) is None


def test_a_branch_too_old_for_a_gpu_is_named() -> None:
    from bootfsm.core.hardware import branch_problem

    gb300, h100 = model_for(0x31C2), model_for(0x2330)
    assert branch_problem("570.211.01", [h100, gb300]) == (
        "GB300 needs driver branch R580 or newer; 570.211.01 is R570"
    )
    assert branch_problem("570.211.01", [h100]) is None
    assert branch_problem("470.82.01", [model_for(0x1234)]) is None  # unknown: not judged
