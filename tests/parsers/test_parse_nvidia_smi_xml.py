"""Tests for bootfsm.parsers.nvidia_smi_xml on every real `nvidia-smi -q -x` capture.

Expected values are written by hand from the files (k8s-test-infra_hardware_xml/).
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml
from tests.samples import sample

XML = "nvidia-smi/k8s-test-infra_hardware_xml/"
ZERO = "00000000-0000-0000-0000-000000000000"
SCRUBBED = "00000001-0000-0000-0000-000000000001"  # upstream's clusterUuid placeholder


def _buses(domain: str, *buses: str) -> list[str]:
    return [f"{domain}:{b}:00.0" for b in buses]


@pytest.mark.parametrize(
    ("name", "driver", "cuda", "product", "device", "buses", "fabric"),
    [
        ("qx-h100.xml", "580.105.08", "13.0", "NVIDIA H100 80GB HBM3", 0x2330,
         _buses("00000000", "53", "64", "75", "86", "97", "A8", "B9", "CA"),
         ("Completed", "Success", "0", ZERO, "N/A")),
        ("qx-b200.xml", "580.105.08", "13.0", "NVIDIA B200", 0x2901,
         _buses("00000000", "8F", "90", "96", "97", "C4", "C5", "CB", "CC"),
         ("Completed", "Success", "0", ZERO, "Healthy")),
        ("qx-gb200.xml", "580.173.02", "13.0", "NVIDIA GB200", 0x2941,
         _buses("00000000", "29", "3F", "9C", "B2"),
         ("Completed", "Success", "2", SCRUBBED, "Healthy")),
        ("qx-gb300.xml", "580.173.02", "13.0", "NVIDIA GB300", 0x31C2,
         ["00000008:06:00.0", "00000009:06:00.0", "00000018:06:00.0", "00000019:06:00.0"],
         ("Completed", "Success", "32766", SCRUBBED, "Healthy")),
        ("qx-a100.xml", "570.148.08", "12.8", "NVIDIA A100-SXM4-40GB", 0x20B0,
         _buses("00000000", "06"), ("N/A", "N/A", "N/A", "N/A", "")),  # 570: no <summary>
        ("qx-l40s.xml", "595.91.07", "13.2", "NVIDIA L40S", 0x26B9,
         _buses("00000000", "30"), ("N/A", "N/A", "N/A", "N/A", "N/A")),
        ("qx-t4.xml", "595.91.07", "13.2", "Tesla T4", 0x1EB8,
         ["00000000:00:1E.0"], ("N/A", "N/A", "N/A", "N/A", "N/A")),
    ],
)  # fmt: skip
def test_every_xml_capture(
    name: str,
    driver: str,
    cuda: str,
    product: str,
    device: int,
    buses: list[str],
    fabric: tuple[str, str, str, str, str],
) -> None:
    report = parse_smi_xml(sample(XML + name))
    assert (report.driver_version, report.cuda_version) == (driver, cuda)
    assert report.attached_gpus == len(buses) == len(report.gpus)
    assert [g.bus_id for g in report.gpus] == buses
    assert {g.product_name for g in report.gpus} == {product}
    assert {g.device_id for g in report.gpus} == {device}
    assert {
        (g.fabric_state, g.fabric_status, g.clique_id, g.cluster_uuid, g.health_summary)
        for g in report.gpus
    } == {fabric}
    assert report.inforom_corrupted == ()


def test_kmd_version_replaces_driver_version() -> None:
    # 615.23's capture says <driver_version> will be replaced by <kmd_version>.
    text = sample(XML + "qx-gb300.xml").replace("driver_version>", "kmd_version>")
    assert "<driver_version>" not in text
    assert parse_smi_xml(text).driver_version == "580.173.02"


def test_truncated_capture_is_refused() -> None:
    text = sample(XML + "qx-h100.xml")
    with pytest.raises(ParseError, match="not well-formed"):
        parse_smi_xml(text[: len(text) // 2])


def test_missing_gpu_element_is_refused() -> None:
    text = sample(XML + "qx-gb300.xml")
    start = text.index('\t<gpu id="00000019:06:00.0">')
    end = text.index("</gpu>", start) + len("</gpu>")
    with pytest.raises(ParseError, match="says 4 but 3"):
        parse_smi_xml(text[:start] + text[end:])


BOMB = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>
<nvidia_smi_log><driver_version>&b;</driver_version></nvidia_smi_log>
"""
EXTERNAL = """<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd" [<!ENTITY x SYSTEM "file:///etc/shadow">]>
<nvidia_smi_log><driver_version>&x;</driver_version></nvidia_smi_log>
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BOMB, "refusing markup declaration"),
        (EXTERNAL, "refusing markup declaration"),
        ('<!DOCTYPE nvidia_smi_log SYSTEM "http://evil/x.dtd"><nvidia_smi_log/>', "refusing"),
        ('<?xml-stylesheet href="x"?><nvidia_smi_log/>', "processing instruction"),
        ("", "not well-formed"),
        ("No devices were found\n", "not well-formed"),
        ("<nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>", "driver_version"),
        ("<other/>", "root element"),
        (
            "<nvidia_smi_log><driver_version>1</driver_version>"
            "<attached_gpus>x</attached_gpus></nvidia_smi_log>",
            "not a number",
        ),
        (
            "<nvidia_smi_log><driver_version>1</driver_version><attached_gpus>1</attached_gpus>"
            '<gpu id="zz"/></nvidia_smi_log>',
            "not a PCI bus id",
        ),
        (
            "<nvidia_smi_log><driver_version>1</driver_version><attached_gpus>2</attached_gpus>"
            '<gpu id="0000:01:00.0"/><gpu id="0000:01:00.0"/></nvidia_smi_log>',
            "duplicate",
        ),
    ],
)
def test_refused(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_smi_xml(text)


def test_inforom_warning_around_the_xml() -> None:
    text = sample(XML + "qx-t4.xml")
    report = parse_smi_xml("WARNING: infoROM is corrupted at gpu 0000:00:1E.0\n" + text)
    assert report.inforom_corrupted == ("0000:00:1E.0",)
    assert report.attached_gpus == 1


@given(st.text())
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        report = parse_smi_xml(text)
        assert report.attached_gpus == len(report.gpus)


@given(st.data())
def test_cut_real_xml_parses_or_raises_parse_error(data: st.DataObject) -> None:
    text = sample(XML + "qx-a100.xml")
    cut = data.draw(st.integers(0, len(text)))
    with contextlib.suppress(ParseError):
        parse_smi_xml(text[:cut])
