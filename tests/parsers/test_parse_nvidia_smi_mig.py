"""MIG readers: MIG mode in every real `-q -x` and `-q` capture (values read by hand
from the files), and the `nvidia-smi mig -lgip/-lgi/-lci` tables.

No real `-lgip`/`-lgi`/`-lci` capture is in the shared samples; the tables below are
written here in the layout of the public captures the stand-in cites (81-, 57- and
70-column boxes), with values of our own."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootfsm.core.migspec import MigItem, parse_mig_layout
from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi_mig import (
    ComputeInstance,
    GiProfile,
    GpuInstance,
    parse_lci,
    parse_lgi,
    parse_lgip,
)
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml
from tests.samples import sample
from tests.smi_text import parse_smi_query

XML = "nvidia-smi/k8s-test-infra_hardware_xml/"
D, NA = ("Disabled", "Disabled"), ("N/A", "N/A")


@pytest.mark.parametrize(
    ("path", "gpus", "mode"),
    [
        (XML + "qx-a100.xml", 1, D),
        (XML + "qx-b200.xml", 8, D),
        (XML + "qx-gb200.xml", 4, D),
        (XML + "qx-gb300.xml", 4, D),
        (XML + "qx-h100.xml", 8, D),
        (XML + "qx-l40s.xml", 1, NA),
        (XML + "qx-t4.xml", 1, NA),
    ],
)
def test_mig_mode_in_every_xml_capture(path: str, gpus: int, mode: tuple[str, str]) -> None:
    report = parse_smi_xml(sample(path))
    assert [(g.mig_current, g.mig_pending) for g in report.gpus] == [mode] * gpus


@pytest.mark.parametrize(
    ("path", "gpus", "mode"),
    [
        ("nvidia-smi/q_1xA10_535.129.03_gpud.txt", 1, NA),
        ("nvidia-smi/q_1xTITANV_560.35.03_gpud.txt", 1, NA),
        ("nvidia-smi/q_8xH100-HBM3_hgx_535.161.08_gpud.txt", 8, D),
        ("nvidia-smi/q_8xH100-HBM3_hgx_535.183.01_gpud.txt", 8, D),
        ("nvidia-smi/thamada/A100SXMx4_gls_q.txt", 4, D),
        ("nvidia-smi/thamada/GH200x1_gls_q.txt", 1, D),
        ("nvidia-smi/thamada/H100NVLx2_gls_q.txt", 2, D),
        ("nvidia-smi/thamada/H100SXMx8_nvidia-smi-repo_q.txt", 8, D),
        ("nvidia-smi/thamada/H200x1_gls_q.txt", 1, D),
        ("nvidia-smi/thamada/RTX5090x1_gls_q.txt", 1, NA),
        ("nvidia-smi/azhpc-diagnostics/q_8xA100-SXM4-40GB_ndv4_460.32.03.txt", 8, D),
    ],
)
def test_mig_mode_in_every_text_capture(path: str, gpus: int, mode: tuple[str, str]) -> None:
    report = parse_smi_query(sample(path))
    assert [(g.mig_current, g.mig_pending) for g in report.gpus] == [mode] * gpus


def test_pending_mode_in_a_real_capture_with_one_value_changed() -> None:
    text = sample(XML + "qx-h100.xml")
    text = text.replace(
        "<pending_mig>Disabled</pending_mig>", "<pending_mig>Enabled</pending_mig>", 1
    )
    gpus = parse_smi_xml(text).gpus
    assert (gpus[0].mig_current, gpus[0].mig_pending) == ("Disabled", "Enabled")
    assert {(g.mig_current, g.mig_pending) for g in gpus[1:]} == {D}
    q = sample("nvidia-smi/thamada/H200x1_gls_q.txt")
    head, sep, tail = q.partition(
        "    MIG Mode\n        Current                           : Disabled"
    )
    q = head + sep.replace("Disabled", "Enabled") + tail
    (gpu,) = parse_smi_query(q).gpus
    assert (gpu.mig_current, gpu.mig_pending) == ("Enabled", "Disabled")


RULE81 = "+" + "-" * 79 + "+"
LGIP = "\n".join(
    [
        RULE81,
        "| GPU instance profiles:" + " " * 56 + "|",
        "| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |",
        "|                                Free/Total   GiB              CE    JPEG  OFA  |",
        "|" + "=" * 79 + "|",
        "|   1  MIG 2g.20gb         14     1/3        19.62      No     32     2     0   |",
        "|                                                               2     2     0   |",
        RULE81,
        "|   1  MIG 7g.80gb          0     0/1        79.25      No    132     7     0   |",
        "|                                                               8     7     1   |",
        RULE81,
    ]
)
RULE57 = "+" + "-" * 55 + "+"
LGI = "\n".join(
    [
        RULE57,
        "| GPU instances:" + " " * 40 + "|",
        "| GPU   Name             Profile  Instance   Placement  |",
        "|                          ID       ID       Start:Size |",
        "|" + "=" * 55 + "|",
        "|   0  MIG 2g.20gb         14        3          4:2     |",
        RULE57,
        "|   3  MIG 1g.10gb+me      20       13          2:1     |",
        RULE57,
    ]
)
RULE70 = "+" + "-" * 68 + "+"
LCI = "\n".join(
    [
        RULE70,
        "| Compute instances:" + " " * 49 + "|",
        "| GPU     GPU       Name             Profile   Instance   Placement  |",
        "|       Instance                       ID        ID       Start:Size |",
        "|         ID                                                         |",
        "|" + "=" * 68 + "|",
        "|   0      3       MIG 2g.20gb          1         0          0:2     |",
        RULE70,
    ]
)


def test_tables() -> None:
    assert parse_lgip(LGIP) == [
        GiProfile(1, "MIG 2g.20gb", 14, 1, 3, 19.62),
        GiProfile(1, "MIG 7g.80gb", 0, 0, 1, 79.25),
    ]
    assert parse_lgi(LGI) == [
        GpuInstance(0, "MIG 2g.20gb", 14, 3, "4:2"),
        GpuInstance(3, "MIG 1g.10gb+me", 20, 13, "2:1"),
    ]
    assert parse_lci(LCI) == [ComputeInstance(0, 3, "MIG 2g.20gb", 1, 0, "0:2")]
    assert parse_lgi("No GPU instances found: Not Found\n") == []
    assert parse_lci("No compute instances found: Not Found\n") == []


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_lgi, "", "empty output"),
        (parse_lgi, "No MIG-enabled devices found.\n", "no 'GPU instances:' table"),
        (parse_lci, LGI, "no 'Compute instances:' table"),
        (parse_lgi, LGI.rsplit("\n", 1)[0], "not closed"),
        (parse_lgi, LGI.replace("14        3", "14        x"), "unreadable row"),
        (parse_lgip, LGIP.replace("1/3", "4/3"), "free of total"),
        (parse_lgip, LGIP.replace("Memory ", "Mem0ry!"), "unexpected header line"),
        (parse_lgi, LGI.replace("|" + "=" * 55 + "|\n", ""), "no '|===|' rule"),
        (parse_lgip, LGIP.rsplit("\n", 2)[0] + "\n" + RULE81, "without its second line"),
        (parse_lci, "Failed to display compute instances: Unknown Error\n", "no 'Compute"),
    ],
)
def test_garbage_is_a_parse_error(parse: object, text: str, message: str) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        parse(text)  # type: ignore[operator]


@given(st.text(max_size=400))
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    for parse in (parse_lgip, parse_lgi, parse_lci):
        with contextlib.suppress(ParseError):
            parse(text)


@pytest.mark.parametrize(
    ("text", "items"),
    [
        ("MIG1g", (MigItem("slices", "1"),)),
        ("mig7g", (MigItem("slices", "7"),)),
        ("19, 1g.10gb,MIG 3g.40gb,1g.10gb+me", (
            MigItem("id", "19"), MigItem("name", "MIG 1g.10gb"), MigItem("name", "MIG 3g.40gb"),
            MigItem("name", "MIG 1g.10gb+me"))),
        ("09", (MigItem("id", "9"),)),
    ],
)  # fmt: skip
def test_layout_grammar(text: str, items: tuple[MigItem, ...]) -> None:
    assert parse_mig_layout(text) == items


@pytest.mark.parametrize(
    "text", ["", " ", "19,", "MIG9g", "1g10gb", "MIG1g,19", "100", "19;19", ",".join(["19"] * 9)]
)
def test_layout_grammar_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_mig_layout(text)
