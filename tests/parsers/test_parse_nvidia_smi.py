"""Tests for bootfsm.parsers.nvidia_smi on real `nvidia-smi -q` captures."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import (
    SmiFailure,
    SmiGpu,
    classify_smi_failure,
    parse_smi_query,
    render_smi_query,
)
from tests.samples import sample

H100 = "nvidia-smi/q_8xH100-HBM3_hgx_535.161.08_gpud.txt"
A10 = "nvidia-smi/q_1xA10_535.129.03_gpud.txt"
TITANV = "nvidia-smi/q_1xTITANV_560.35.03_gpud.txt"
TRUNCATED = "nvidia-smi/q_H100_truncated_invalid_535.183.01_gpud.txt"


@pytest.mark.parametrize(
    ("path", "driver", "cuda", "names", "buses", "fabric"),
    [
        (
            H100,
            "535.161.08",
            "12.2",
            ["NVIDIA H100 80GB HBM3"] * 8,
            ["19", "3B", "4C", "5D", "9B", "BB", "CB", "DB"],
            ("Completed", "Success"),
        ),
        (A10, "535.129.03", "12.2", ["NVIDIA A10"], ["07"], ("N/A", "N/A")),
        (TITANV, "560.35.03", "12.6", ["NVIDIA TITAN V"], ["01"], ("N/A", "N/A")),
        (
            "nvidia-smi/thamada/A100SXMx4_gls_q.txt",
            "555.42.02",
            "12.5",
            ["NVIDIA A100-SXM4-80GB"] * 4,
            ["68", "9E", "C2", "D4"],
            ("N/A", "N/A"),
        ),
        (
            "nvidia-smi/thamada/GH200x1_gls_q.txt",
            "550.127.05",
            "12.4",
            ["NVIDIA GH200 480GB"],
            ["DD"],
            ("N/A", "N/A"),
        ),
        (
            "nvidia-smi/thamada/H200x1_gls_q.txt",
            "550.90.12",
            "12.4",
            ["NVIDIA H200"],
            ["03"],
            ("Completed", "Success"),
        ),
    ],
)
def test_real_samples(
    path: str,
    driver: str,
    cuda: str,
    names: list[str],
    buses: list[str],
    fabric: tuple[str, str],
) -> None:
    report = parse_smi_query(sample(path))
    assert (report.driver_version, report.cuda_version) == (driver, cuda)
    assert report.attached_gpus == len(names) == len(report.gpus)
    assert [g.product_name for g in report.gpus] == names
    assert [g.bus_id for g in report.gpus] == [f"00000000:{b}:00.0" for b in buses]
    assert {(g.fabric_state, g.fabric_status) for g in report.gpus} == {fabric}
    assert report.inforom_corrupted == ()


def test_truncated_capture_is_refused() -> None:
    # The capture says 8 GPUs but stops inside the first GPU's block.
    with pytest.raises(ParseError, match=r"'Attached GPUs' says 8 but 1 GPU blocks"):
        parse_smi_query(sample(TRUNCATED))


def test_every_line_cut_of_the_h100_capture_is_refused() -> None:
    lines = sample(H100).splitlines(keepends=True)
    last_header = max(i for i, line in enumerate(lines) if line.startswith("GPU "))
    for cut in range(last_header):
        with pytest.raises(ParseError):
            parse_smi_query("".join(lines[:cut]))


def test_layout_without_fabric_block() -> None:
    lines = sample(A10).splitlines(keepends=True)
    start = lines.index("    Fabric\n")
    report = parse_smi_query("".join(lines[:start] + lines[start + 3 :]))
    assert report.gpus[0] == SmiGpu("00000000:07:00.0", "NVIDIA A10", "", "")


def test_in_progress_fabric_state() -> None:
    text = sample(H100).replace(": Completed", ": In Progress", 1)
    states = [g.fabric_state for g in parse_smi_query(text).gpus]
    assert states == ["In Progress"] + ["Completed"] * 7


@pytest.mark.parametrize("where", ["before", "inside", "after"])
def test_inforom_warnings_mixed_in(where: str) -> None:
    text = sample(A10)
    warning = "WARNING: infoROM is corrupted at gpu 0000:07:00.0  \n"  # real trailing spaces
    if where == "before":
        text = warning + text
    elif where == "inside":
        text = text.replace("    Fabric\n", warning + "    Fabric\n")
    else:
        text = text + warning
    report = parse_smi_query(text)
    assert report.inforom_corrupted == ("0000:07:00.0",)
    assert report.gpus[0].fabric_state == "N/A"
    assert classify_smi_failure(text) is SmiFailure.INFOROM_CORRUPTED


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no 'Attached GPUs'"),
        ("No devices were found\n", "no 'Attached GPUs'"),
        ("Driver Version : 1.2\nAttached GPUs : eight\n", "not a number"),
        ("Attached GPUs : 0\n", "no 'Driver Version'"),
        ("Driver Version : 1\nAttached GPUs : 1\n", "says 1 but 0 GPU blocks"),
        (
            "Driver Version : 1\nAttached GPUs : 2\nGPU 0000:01:00.0\nGPU 0000:01:00.0\n",
            "duplicate GPU bus ids",
        ),
    ],
)
def test_garbage(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_smi_query(text)


def test_default_table_output_is_not_q_output() -> None:
    with pytest.raises(ParseError, match="Attached GPUs"):
        parse_smi_query(sample("nvidia-smi/table_550.90.07_gpud.txt"))


def _blocks(text: str) -> dict[str, str]:
    """Split an excerpt file into its '# --- [X]' blocks (annotation lines kept out)."""
    blocks: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if line.startswith("# --- ["):
            key = line[7]
            blocks[key] = ""
        elif key and not line.startswith("#"):
            blocks[key] += line + "\n"
    return blocks


def test_classify_real_failure_excerpts() -> None:
    blocks = _blocks(sample("nvidia-smi/nvml_error_excerpts.txt"))
    for key in "ABC":
        assert classify_smi_failure(blocks[key]) is SmiFailure.DRIVER_LIBRARY_MISMATCH, key
    assert classify_smi_failure(blocks["D"]) is None  # a dmesg line, not nvidia-smi output
    assert classify_smi_failure(blocks["E"]) is SmiFailure.INFOROM_CORRUPTED


def test_classify_no_driver_and_healthy() -> None:
    text = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    assert classify_smi_failure(text) is SmiFailure.NO_DRIVER
    assert classify_smi_failure(sample(H100)) is None


def test_render_matches_the_real_560_layout() -> None:
    real = sample(TITANV).splitlines()
    gpu = SmiGpu("00000000:01:00.0", "NVIDIA TITAN V", "N/A", "N/A")
    text = render_smi_query("560.35.03", "12.6", [gpu], timestamp="Fri Oct 18 10:13:00 2024")
    rendered = text.splitlines()
    assert rendered[:9] == real[:9]  # header, first GPU line and its Product Name line
    fabric = real.index("    Fabric")
    assert rendered[9:] == real[fabric : fabric + 5]


def test_render_round_trips_and_omits_absent_fabric() -> None:
    gpus = [
        SmiGpu("00000008:01:00.0", "NVIDIA GB200", "Completed", "Success"),
        SmiGpu("00000009:01:00.0", "NVIDIA GB200", "In Progress", "N/A"),
        SmiGpu("00000018:01:00.0", "NVIDIA GB200", "", ""),
    ]
    text = render_smi_query("580.173.02", "13.0", gpus)
    assert text.count("    Fabric\n") == 2
    report = parse_smi_query(text)
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == (
        "580.173.02",
        "13.0",
        3,
    )
    assert report.gpus == tuple(gpus)


@pytest.mark.parametrize(
    "gpu",
    [
        SmiGpu("not-a-bus", "x", "", ""),
        SmiGpu("0000:01:00.0 ", "x", "", ""),
        SmiGpu("0000:01:00.0", " padded", "", ""),
        SmiGpu("0000:01:00.0", "two\nlines", "", ""),
    ],
)
def test_render_refuses_unrenderable_values(gpu: SmiGpu) -> None:
    with pytest.raises(ValueError, match="render_smi_query"):
        render_smi_query("570.1", "12.8", [gpu])


_VALUE = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=30
).map(str.strip)
_BUS = st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F)).map(
    lambda t: f"{t[0]:08X}:{t[1]:02X}:{t[2]:02X}.0"
)


@given(
    driver=_VALUE.filter(bool),
    cuda=_VALUE,
    gpus=st.lists(
        st.builds(SmiGpu, _BUS, _VALUE, _VALUE, _VALUE), max_size=4, unique_by=lambda g: g.bus_id
    ),
)
def test_render_parse_round_trip_property(driver: str, cuda: str, gpus: list[SmiGpu]) -> None:
    report = parse_smi_query(render_smi_query(driver, cuda, gpus))
    assert (report.driver_version, report.cuda_version) == (driver, cuda)
    assert report.gpus == tuple(gpus)


@given(st.text())
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    try:
        report = parse_smi_query(text)
    except ParseError:
        return
    assert report.attached_gpus == len(report.gpus)


@given(st.data())
def test_shuffled_real_lines_parse_or_raise_parse_error(data: st.DataObject) -> None:
    real = sample(A10).splitlines()
    lines = data.draw(st.lists(st.sampled_from(real), max_size=60))
    with contextlib.suppress(ParseError):
        parse_smi_query("\n".join(lines))
