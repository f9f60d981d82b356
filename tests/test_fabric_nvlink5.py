"""NVLink5 (HGX B200/B300): fabric manager starts through its unit (which runs the
start script), after ib_umad is loaded and NVLSM is installed from the redist manifest,
verified by its sha256."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bootfsm.core.archnames import ARCHES
from bootfsm.core.codes import Code
from bootfsm.core.config import DEFAULTS
from bootfsm.core.errors import BootError
from bootfsm.fetch.artifacts import resolve
from bootfsm.node.facts import NodeFacts
from tests.conftest import MakeWorld, run_in_process
from tests.samples import sample_bytes

UNIT = "nvidia-fabricmanager.service"


def _b200(raw_arch: str = "x86_64") -> NodeFacts:
    return NodeFacts(
        raw_arch=raw_arch,
        arch=ARCHES[raw_arch],
        os_id="ubuntu",
        os_version="24.04",
        kernel="6.8.0-1021-azure",
        gpus=(),
        nvswitches=(),
        nvlink5=True,
        loaded_driver=None,
    )


def _indexes(manifest: str) -> dict[str, str]:
    return {"toolkit_packages": "", "redistrib": manifest}


def test_nvlsm_resolved_from_the_real_580_manifest() -> None:
    """redistrib_cuda_13.0.2 lists nvlsm 2025.06.6; values read by hand from the file."""
    text = sample_bytes("redistrib/redistrib_cuda_13.0.2_driver-components_trimmed.json").decode()
    cfg = replace(
        DEFAULTS,
        driver=replace(DEFAULTS.driver, version="580.95.05", install=True),
        sources=replace(DEFAULTS.sources, toolkit_packages=(), runfile_sha256="a" * 64),
    )
    arts = {a.role: a for a in resolve(cfg, _b200(), _indexes(text))}
    nvlsm = arts["nvlsm"]
    assert nvlsm.url == (
        "https://developer.download.nvidia.com/compute/nvidia-driver/redist/"
        "nvlsm/linux-x86_64/nvlsm-linux-x86_64-2025.06.6-archive.tar.xz"
    )
    assert nvlsm.sha256 == "bd77ad2504966450aab15041223eea34538a57e870b7d447c097ec721efba792"
    assert nvlsm.size == 7005320
    assert arts["fabricmanager"].sha256 == (
        "f0220bfb67d04b4107acf00cc95abe5a9268fd8f8b5bae26971f4df232e4369c"
    )
    pre_nvl5 = {a.role for a in resolve(cfg, replace(_b200(), nvlink5=False, nvswitches=("x",)),
                                        _indexes(text))}  # fmt: skip
    assert "nvlsm" not in pre_nvl5 and "fabricmanager" in pre_nvl5


def test_a_manifest_without_nvlsm_is_55() -> None:
    """The 570-series manifest (redistrib_cuda_12.8.2) has no nvlsm: NVLink5 cannot run."""
    text = sample_bytes("redistrib/redistrib_cuda_12.8.2_driver-components_trimmed.json").decode()
    cfg = replace(
        DEFAULTS,
        sources=replace(DEFAULTS.sources, toolkit_packages=(), runfile_sha256="a" * 64),
    )
    with pytest.raises(BootError) as err:
        resolve(cfg, _b200(), _indexes(text))
    assert err.value.code is Code.NVLSM_INSTALL_FAILED
    assert "nvlsm for linux-x86_64 is not listed" in err.value.message


def test_b200_boots_through_the_unit_with_nvlsm_and_ib_umad(make_world: MakeWorld) -> None:
    w = make_world("b200-hgx")
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    calls = [(c["cmd"], c["argv"]) for c in w.calls()]
    modprobe = calls.index(("modprobe", ["ib_umad"]))
    start = calls.index(("systemctl", ["start", UNIT]))
    assert modprobe < start
    assert not [c for c in calls if c[0] == "nvidia-fabricmanager-start.sh"]  # the unit runs it
    assert (w.root / "opt/nvidia/nvlsm/sbin/nvlsm").stat().st_mode & 0o111
    assert (w.root / "usr/share/nvidia/nvlsm/nvlsm.conf").is_file()
    assert (w.root / "etc/modules-load.d/ib_umad.conf").read_text() == "ib_umad\n"
    events = [json.loads(x) for x in result.journal.read_text().splitlines()]  # type: ignore[union-attr]
    assert [e["archive"] for e in events if e.get("event") == "nvlsm.installed"] == [
        "nvlsm-linux-x86_64-2025.06.6-archive.tar.xz"
    ]
    again = run_in_process(w)  # idempotent: everything already holds
    assert again.outcome.ok
    skipped = [json.loads(x) for x in again.journal.read_text().splitlines()]  # type: ignore[union-attr]
    assert any(e.get("event") == "state.skip" and e.get("state") == "fabric" for e in skipped)


def test_without_ib_umad_the_run_stops_56(make_world: MakeWorld) -> None:
    w = make_world("b200-hgx", ("ib-umad-missing",))
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.IB_UMAD_NOT_LOADED, "fabric")
    assert not [c for c in w.calls() if c["cmd"] == "systemctl" and c["argv"][:1] == ["start"]
                and UNIT in c["argv"]]  # fmt: skip


def test_nvlsm_archive_is_verified_by_its_sha256(make_world: MakeWorld) -> None:
    """The mirror serves NVLSM bytes that differ from the manifest's sha256: 31 in fetch,
    nothing installed."""
    w = make_world("b200-hgx")
    [archive] = list((w.docroot / "redist/nvlsm").rglob("*.tar.xz"))
    data = bytearray(archive.read_bytes())
    data[-100] ^= 0xFF
    archive.write_bytes(bytes(data))
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.CHECKSUM_MISMATCH, "fetch")
    assert not (w.root / "opt/nvidia/nvlsm").exists()
