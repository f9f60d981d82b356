"""Host.run captures what a parser needs whole (up to OUTPUT_LIMIT_BYTES); only the
journaled/shown part is tail-trimmed. Real 8x H100 captures go through it end to end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.host import process as host_mod
from bootfsm.host.host import OUTPUT_LIMIT_BYTES, OUTPUT_TAIL_BYTES, CommandResult, Host
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml
from tests.samples import SAMPLES, sample_bytes
from tests.smi_text import parse_smi_query

H100_Q = "nvidia-smi/q_8xH100-HBM3_hgx_535.183.01_gpud.txt"
H100_Q_565 = "nvidia-smi/thamada/H100SXMx8_nvidia-smi-repo_q.txt"
H100_QX = "nvidia-smi/k8s-test-infra_hardware_xml/qx-h100.xml"


def _script(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text(f"#!{sys.executable}\n{body}\n")
    p.chmod(0o755)


def _cat_host(tmp_path: Path) -> Host:
    # A tiny "cat" on PATH: writes the file named by its argument to stdout, byte for byte.
    _script(
        tmp_path,
        "cat-sample",
        "import sys\nsys.stdout.buffer.write(open(sys.argv[1], 'rb').read())",
    )
    return Host(tmp_path, env={"PATH": str(tmp_path)})


def test_the_limit_is_mebibytes() -> None:
    assert OUTPUT_LIMIT_BYTES == 16 * 1024 * 1024
    assert OUTPUT_TAIL_BYTES < 100_000 < OUTPUT_LIMIT_BYTES  # a real -q -x far exceeds the tail


@pytest.mark.parametrize("path", [H100_Q, H100_Q_565])
def test_real_8x_h100_q_through_host_run(tmp_path: Path, path: str) -> None:
    raw = sample_bytes(path)
    assert len(raw) > 70_000  # the captures are 73-80 KB: far over the old 4 KiB tail
    r = _cat_host(tmp_path).run(["cat-sample", str(SAMPLES / path)], timeout=30)
    assert r.ok and r.output.encode() == raw
    report = parse_smi_query(r.output)
    assert report.attached_gpus == len(report.gpus) == 8
    assert {(g.fabric_state, g.fabric_status) for g in report.gpus} == {("Completed", "Success")}
    assert len(r.tail) == OUTPUT_TAIL_BYTES and r.output.endswith(r.tail)


def test_real_8x_h100_q_x_through_host_run(tmp_path: Path) -> None:
    raw = sample_bytes(H100_QX)
    assert len(raw) > 200_000
    r = _cat_host(tmp_path).run(["cat-sample", str(SAMPLES / H100_QX)], timeout=30)
    report = parse_smi_xml(r.output)
    assert report.driver_version == "580.105.08"
    assert report.attached_gpus == len(report.gpus) == 8


def test_output_over_the_limit_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_mod, "OUTPUT_LIMIT_BYTES", 1 << 20)
    _script(tmp_path, "flood", "import sys\nsys.stdout.write('y' * (3 << 20) + 'LAST')")
    h = Host(tmp_path, env={"PATH": str(tmp_path)})
    seen: list[CommandResult] = []
    h.on_command = seen.append
    with pytest.raises(BootError) as err:
        h.run(["flood"], timeout=30)
    assert err.value.code is Code.HOST_IO_ERROR
    assert err.value.message == (
        f"flood printed {(3 << 20) + 4} bytes, more than the 1 MiB bootfsm reads from one command"
    )
    # the journal still gets the command, with only its tail
    assert len(seen) == 1 and seen[0].output.endswith("LAST")
    assert len(seen[0].output) == OUTPUT_TAIL_BYTES


def test_output_at_the_limit_is_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_mod, "OUTPUT_LIMIT_BYTES", 1 << 20)
    _script(tmp_path, "exact", "import sys\nsys.stdout.write('z' * (1 << 20))")
    r = Host(tmp_path, env={"PATH": str(tmp_path)}).run(["exact"], timeout=30)
    assert r.ok and len(r.output) == 1 << 20
