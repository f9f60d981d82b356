"""Tests for bootfsm.parsers.nvidia_smi on real `nvidia-smi -q` captures."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import SmiFailure, SmiGpu, classify_smi_failure, device_id_of
from tests.samples import sample
from tests.smi_excerpts import parse_fabric_block
from tests.smi_text import parse_smi_query

H100 = "nvidia-smi/q_8xH100-HBM3_hgx_535.161.08_gpud.txt"
A10 = "nvidia-smi/q_1xA10_535.129.03_gpud.txt"
TITANV = "nvidia-smi/q_1xTITANV_560.35.03_gpud.txt"
TRUNCATED = "nvidia-smi/q_H100_truncated_invalid_535.183.01_gpud.txt"


ZERO = "00000000-0000-0000-0000-000000000000"


# Written by hand from each file's "Device Id" and Fabric lines.
@pytest.mark.parametrize(
    ("path", "device_id", "clique", "cluster"),
    [
        (H100, 0x2330, "", ""),  # 535 layout: no CliqueId / ClusterUUID lines
        ("nvidia-smi/q_8xH100-HBM3_hgx_535.183.01_gpud.txt", 0x2330, "", ""),
        ("nvidia-smi/thamada/H100SXMx8_nvidia-smi-repo_q.txt", 0x2330, "0", ZERO),
        ("nvidia-smi/thamada/H200x1_gls_q.txt", 0x2335, "0", ZERO),
        (A10, 0x2236, "", ""),
        (TITANV, 0x1D81, "N/A", "N/A"),
        ("nvidia-smi/thamada/RTX5090x1_gls_q.txt", 0x2B85, "N/A", "N/A"),
        ("nvidia-smi/thamada/H100NVLx2_gls_q.txt", 0x2321, "N/A", "N/A"),
        ("nvidia-smi/thamada/GH200x1_gls_q.txt", 0x2342, "N/A", "N/A"),
        ("nvidia-smi/thamada/A100SXMx4_gls_q.txt", 0x20B2, "N/A", "N/A"),
        ("nvidia-smi/azhpc-diagnostics/q_8xA100-SXM4-40GB_ndv4_460.32.03.txt", 0x20B0, "", ""),
    ],
)
def test_device_id_and_clique_of_every_text_capture(
    path: str, device_id: int, clique: str, cluster: str
) -> None:
    gpus = parse_smi_query(sample(path)).gpus
    assert {(g.device_id, g.clique_id, g.cluster_uuid) for g in gpus} == {
        (device_id, clique, cluster)
    }
    assert {g.health_summary for g in gpus} == {""}  # no text capture has a Summary line


def test_azure_ndv4_capture_has_no_fabric_block() -> None:
    # 460.32.03 predates the Fabric block; PCI domains are 00000001.. as on Azure.
    report = parse_smi_query(
        sample("nvidia-smi/azhpc-diagnostics/q_8xA100-SXM4-40GB_ndv4_460.32.03.txt")
    )
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == (
        "460.32.03",
        "11.2",
        8,
    )
    domains = ["1", "2", "3", "4", "B", "C", "D", "E"]
    assert [g.bus_id for g in report.gpus] == [f"0000000{d}:00:00.0" for d in domains]
    assert {(g.fabric_state, g.fabric_status) for g in report.gpus} == {("", "")}
    assert {g.product_name for g in report.gpus} == {"A100-SXM4-40GB"}


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
        (
            "nvidia-smi/thamada/H100SXMx8_nvidia-smi-repo_q.txt",
            "565.57.01",
            "12.7",
            ["NVIDIA H100 80GB HBM3"] * 8,
            ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"],
            ("Completed", "Success"),
        ),
        (
            "nvidia-smi/thamada/RTX5090x1_gls_q.txt",
            "570.124.06",
            "12.8",
            ["NVIDIA GeForce RTX 5090"],
            ["02"],
            ("N/A", "N/A"),
        ),
        (
            "nvidia-smi/thamada/H100NVLx2_gls_q.txt",
            "550.54.14",
            "12.4",
            ["NVIDIA H100 NVL"] * 2,
            ["AD", "AE"],
            ("N/A", "N/A"),
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
    assert report.gpus[0] == SmiGpu(
        "00000000:07:00.0",
        "NVIDIA A10",
        "",
        "",
        device_id=0x2236,
        mig_current="N/A",  # "MIG Mode / Current : N/A" in the capture (no MIG on an A10)
        mig_pending="N/A",
        license_status=None,  # no "vGPU Software Licensed Product" block: no vGPU guest
        virtualization_mode="Pass-Through",  # "GPU Virtualization Mode" in the capture
    )


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


EXCERPTS = "nvidia-smi/fabric_state_excerpts.txt"


def _excerpt(tag: str) -> str:
    """The lines of block [tag] of the excerpts file, annotations (#) and shell lines ($) out."""
    text = sample(EXCERPTS)
    start = text.index(f"# --- [{tag}]")
    end = text.find("# --- [", start + 1)
    block = text[start : end if end != -1 else len(text)]
    return "\n".join(line for line in block.splitlines() if not line.startswith(("#", "$", "--")))


# Values written by hand from fabric_state_excerpts.txt.
@pytest.mark.parametrize(
    ("tag", "state", "status", "clique", "cluster", "health"),
    [
        ("A", "In Progress", "N/A", "", "", ""),
        ("B", "Completed", "Success", "", "", ""),
        ("D", "Completed", "Success", "2", "dc6e40c4-d722-4357-9ba6-5291dd461278", "Unhealthy"),
        ("E", "Completed", "Insufficient Resources", "0", ZERO, ""),
        ("G", "In Progress", "N/A", "", "", ""),
        ("H", "In Progress", "N/A", "", "", ""),
    ],
)
def test_fabric_block_excerpts(
    tag: str, state: str, status: str, clique: str, cluster: str, health: str
) -> None:
    g = parse_fabric_block(_excerpt(tag))
    assert (g.fabric_state, g.fabric_status, g.clique_id, g.cluster_uuid, g.health_summary) == (
        state,
        status,
        clique,
        cluster,
        health,
    )


def test_fabric_block_compacted_gb300_excerpt() -> None:
    # [C] has the key column narrowed by its author: still read by key, not by column.
    g = parse_fabric_block(_excerpt("C"))
    assert (g.fabric_state, g.fabric_status, g.clique_id, g.cluster_uuid, g.health_summary) == (
        "In Progress",
        "N/A",
        "N/A",
        "N/A",
        "N/A",
    )


@pytest.mark.parametrize("text", ["", "State : Completed", "    Fabric\n    Processes : None"])
def test_fabric_block_garbage(text: str) -> None:
    with pytest.raises(ParseError, match="fabric block"):
        parse_fabric_block(text)


@pytest.mark.parametrize(
    ("value", "device"),
    [("0x233010DE", 0x2330), ("31C210DE", 0x31C2), ("0x2b8510de", 0x2B85), ("N/A", 0), ("", 0)],
)
def test_device_id_of(value: str, device: int) -> None:
    assert device_id_of(value) == device


def test_classify_no_devices() -> None:
    assert classify_smi_failure("No devices were found\n") is SmiFailure.NO_DEVICES


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
