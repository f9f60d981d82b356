"""The simulator's nvidia-smi against the real captures: same keys, same indentation,
same order of blocks, real sizes, the real argv grammar (bootfsm.sim.standin_smi)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import pytest

from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml
from bootfsm.sim import (
    standin_smi,
    standin_smi_mig,
    standin_smi_render,
    standin_smi_text,
    standin_smi_vgpu,
    standin_smi_xml,
)
from bootfsm.sim.node import SKUS, build_node, standin_script
from bootfsm.sim.nodestate import Node
from tests.samples import sample
from tests.smi_text import parse_smi_query

VERSION = "570.211.01"
TEXT_570 = "nvidia-smi/thamada/RTX5090x1_gls_q.txt"
XML = "nvidia-smi/k8s-test-infra_hardware_xml/"


class Sim:
    def __init__(
        self, tmp_path: Path, sku: str, module_type: str | None = None, version: str = VERSION
    ) -> None:
        self.root = tmp_path / sku
        self.bin_dir = build_node(self.root, SKUS[sku], (), compile_seconds=0.01)
        arch = SKUS[sku].arch
        extract = self.root / f"var/lib/bootfsm/extract/NVIDIA-Linux-{arch}-{version}"
        extract.mkdir(parents=True)
        installer = extract / "nvidia-installer"
        installer.write_text(standin_script("nvidia-installer", self.root))
        installer.chmod(0o755)
        if module_type is None:
            out = self.run(str(installer), "--print-recommended-kernel-module-type").stdout
            module_type = out.strip()  # one word, as the real installer prints
        kernel = SKUS[sku].kernel
        done = self.run(
            str(installer), "-s", "-a", "--no-drm", "--dkms", f"-k={kernel}",
            f"--kernel-module-type={module_type}", f"--log-file-name={self.root}/i.log",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        return subprocess.run(
            list(argv), env=env, capture_output=True, text=True, timeout=60, check=False
        )

    def load(self) -> None:
        loaded = self.run("nvidia-modprobe", "-u", "-c0")
        assert loaded.returncode == 0, loaded.stderr


def _text_keys(text: str) -> list[tuple[int, str]]:
    """(indent, key) of the first GPU block of `-q` text, values dropped."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("GPU "))
    out: list[tuple[int, str]] = []
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith("GPU "):
            break
        key = line.split(" : ")[0] if " : " in line or line.endswith(" :") else line
        key = key.rstrip(":").rstrip()
        out.append((len(line) - len(line.lstrip(" ")), key.strip()))
    return out


def _colons(text: str) -> set[int]:
    return {line.index(" : ") + 1 for line in text.splitlines() if " : " in line}


def _xml_paths(text: str) -> list[str]:
    """Element paths of the first <gpu>, consecutive repeats folded (clock lists)."""
    root = ET.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", text))
    out: list[str] = []

    def walk(e: ET.Element, prefix: str) -> None:
        for child in e:
            path = f"{prefix}/{child.tag}"
            if not out or out[-1] != path:
                out.append(path)
            walk(child, path)

    gpu = root.find("gpu")
    assert gpu is not None
    walk(gpu, "")
    return out


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    sim = Sim(tmp_path_factory.mktemp("h100"), "h100-hgx")
    sim.load()
    return sim


@pytest.fixture(scope="module")
def gb300(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    sim = Sim(tmp_path_factory.mktemp("gb300"), "gb300")
    sim.load()
    return sim


@pytest.fixture(scope="module")
def gb300_580(tmp_path_factory: pytest.TempPathFactory) -> Sim:
    sim = Sim(tmp_path_factory.mktemp("gb300-580"), "gb300", version="580.173.02")
    sim.load()
    return sim


@pytest.mark.parametrize("sku", ["h100", "gb300"])
def test_text_has_the_real_570_layout(sku: str, request: pytest.FixtureRequest) -> None:
    sim: Sim = request.getfixturevalue(sku)
    out = sim.run("nvidia-smi", "-q").stdout
    real = sample(TEXT_570)
    assert _text_keys(out) == _text_keys(real)
    assert _colons(out) == _colons(real) == {42}
    frame = [ln.split(" : ")[0].rstrip() for ln in out.splitlines()[:7]]
    assert frame == [ln.split(" : ")[0].rstrip() for ln in real.splitlines()[:7]]
    assert "    GPU Memory Power Readings \n" in out  # the real trailing space


@pytest.mark.parametrize(
    ("sku", "capture"),
    [
        ("gb300_580", "qx-gb300.xml"),  # 580.173.02 driver: the 580.173.02 layout
        ("gb300_580", "qx-gb200.xml"),
        ("h100", "qx-a100.xml"),  # 570.211.01 driver: the 570.148.08 layout
        ("gb300", "qx-a100.xml"),
    ],
)
def test_xml_has_the_real_layout_of_its_branch(
    sku: str, capture: str, request: pytest.FixtureRequest
) -> None:
    sim: Sim = request.getfixturevalue(sku)
    out = sim.run("nvidia-smi", "-q", "-x").stdout
    real = sample(XML + capture)
    assert _xml_paths(out) == _xml_paths(real)
    assert out.splitlines()[:3] == real.splitlines()[:3]  # declaration, DOCTYPE, root
    tabs = {len(ln) - len(ln.lstrip("\t")) for ln in out.splitlines() if ln.strip()}
    assert tabs == {len(ln) - len(ln.lstrip("\t")) for ln in real.splitlines() if ln.strip()}
    top = [e.tag for e in ET.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", out))]
    assert top[:4] == ["timestamp", "driver_version", "cuda_version", "attached_gpus"]


def test_sizes_are_real(h100: Sim, gb300_580: Sim) -> None:
    # real: 8x H100 -q 73-80 KB, -q -x 212 KB; 4x GB300 -q -x 118 KB
    q, qx = h100.run("nvidia-smi", "-q").stdout, h100.run("nvidia-smi", "-q", "-x").stdout
    assert 70_000 < len(q) < 95_000
    assert 180_000 < len(qx) < 260_000
    gx = gb300_580.run("nvidia-smi", "-q", "-x").stdout
    assert abs(len(gx) - len(sample(XML + "qx-gb300.xml"))) < 12_000


def test_both_formats_parse_and_agree(h100: Sim) -> None:
    text = parse_smi_query(h100.run("nvidia-smi", "-q").stdout)
    xml = parse_smi_xml(h100.run("nvidia-smi", "-q", "-x").stdout)
    assert text.driver_version == xml.driver_version == VERSION
    assert [g.bus_id for g in text.gpus] == [g.bus_id for g in xml.gpus]
    assert {g.device_id for g in xml.gpus} == {0x2330}


HELP = "Please run 'nvidia-smi -h' for help."
INVALID = f"Invalid combination of input arguments. {HELP}"
CAPTURE = Path(__file__).resolve().parents[1] / "captures/h200_580.159.04"
# the real 580.159.04 with its driver loaded (smi-bogus.txt, exit 255 in exit-status.txt)
UNKNOWN = "ERROR: Option {} is not recognized. Please run 'nvidia-smi -h'."


@pytest.mark.parametrize(
    ("argv", "rc", "message"),
    [
        (["--bogus"], 255, UNKNOWN.format("--bogus")),
        (["-q", "-X"], 255, UNKNOWN.format("-X")),
        (["-i"], 2, f"ERROR: Option -i is missing its value. {HELP}"),
        (["-x"], 2, INVALID),
        (["-L", "-q"], 2, INVALID),
        (["query"], 2, INVALID),
    ],
)
def test_bogus_arguments_fail_like_the_real_tool(
    h100: Sim, argv: list[str], rc: int, message: str
) -> None:
    r = h100.run("nvidia-smi", *argv)
    assert (r.returncode, r.stdout) == (rc, message + "\n\n")


def test_unknown_option_is_the_real_captures_answer(h100: Sim) -> None:
    r = h100.run("nvidia-smi", "--no-such-option")
    statuses = dict(ln.split() for ln in (CAPTURE / "exit-status.txt").read_text().splitlines())
    assert r.stdout == (CAPTURE / "smi-bogus.txt").read_text()
    assert r.returncode == int(statuses["smi-bogus.txt"]) == 255


def test_without_a_driver_every_command_line_gets_the_no_driver_answer(tmp_path: Path) -> None:
    """Ubuntu 24.04's real nvidia-smi 550.67 without the module (make test-booted compares
    it): the message, a blank line, exit 9, before the arguments are read; only -h
    answers."""
    bin_dir = build_node(tmp_path / "bare", SKUS["h100-pcie"], (), compile_seconds=0.01)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def smi(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["nvidia-smi", *argv], env=env, capture_output=True, text=True, check=False
        )

    message = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make"
        " sure that the latest NVIDIA driver is installed and running.\n\n"
    )
    for argv in ([], ["-L"], ["-q", "-x"], ["--no-such-option"], ["-x"], ["mig", "-lgip"]):
        r = smi(*argv)
        assert (r.returncode, r.stdout, r.stderr) == (9, message, ""), argv
    assert smi("-h").returncode == 0


def test_select_one_gpu(h100: Sim) -> None:
    one = parse_smi_xml(h100.run("nvidia-smi", "-q", "-x", "-i", "3").stdout)
    assert [g.bus_id for g in one.gpus] == ["00000004:00:00.0"]


def test_proprietary_module_on_blackwell_finds_no_devices(tmp_path: Path) -> None:
    sim = Sim(tmp_path, "b200-hgx", module_type="proprietary")
    assert Node(sim.root).load_module(force=True) is None  # forced in: the real driver loads
    for argv in ([], ["-q", "-x"], ["-L"]):
        r = sim.run("nvidia-smi", *argv)
        assert (r.returncode, r.stdout) == (6, "No devices were found\n")


@pytest.mark.parametrize(
    "module",
    [standin_smi, standin_smi_mig, standin_smi_render, standin_smi_text, standin_smi_vgpu,
     standin_smi_xml],
)  # fmt: skip
def test_the_stand_in_uses_no_product_code(module: ModuleType) -> None:
    tree = ast.parse(Path(str(module.__file__)).read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    assert {m for m in imported if m.startswith("bootfsm")} <= {
        "bootfsm.sim.nodestate",
        "bootfsm.sim.standin_driver",
        "bootfsm.sim.standin_smi_mig",
        "bootfsm.sim.standin_smi_render",
        "bootfsm.sim.standin_smi_text",
        "bootfsm.sim.standin_smi_vgpu",
        "bootfsm.sim.standin_smi_xml",
    }
