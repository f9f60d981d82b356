"""A corrupted infoROM is judged from the command that reports it (issue 31 item 1).

The plain `nvidia-smi` prints ``WARNING: infoROM is corrupted at gpu <bus id>`` after
its table and exits 14; `nvidia-smi -q -x` exits 0 without it (samples
nvidia-smi/nvml_error_excerpts.txt [E] with the microsoft/pai #3756 note, and the 8x
V100 capture azhpc-diagnostics/table_8xV100_inforom-warning_460.32.03.txt). AgentBaker's
validateGPUDrivers exits 87 on it; so does bootfsm, from the driver's post-load
`nvidia-smi` and from verify (a rerun whose driver is already satisfied).
"""

from __future__ import annotations

import json

from bootfsm.core.codes import Code
from bootfsm.install.driver_init import inforom_error
from bootfsm.parsers.nvidia_smi import inforom_warnings
from bootfsm.sim.nodestate import SIM_STATE
from tests.conftest import MakeWorld, run_in_process
from tests.samples import sample

V100_TABLE = "nvidia-smi/azhpc-diagnostics/table_8xV100_inforom-warning_460.32.03.txt"
NVML_ERRORS = "nvidia-smi/nvml_error_excerpts.txt"


def test_the_real_table_with_its_warning_is_inforom_corrupted() -> None:
    text = sample(V100_TABLE)
    assert inforom_warnings(text) == ("0008:00:00.0",)  # the capture's last line
    error = inforom_error(text, 14)
    assert error is not None and error.code is Code.INFOROM_CORRUPTED
    assert "0008:00:00.0" in error.message


def test_every_warning_line_of_the_excerpts_is_read() -> None:
    # [E]: the gpu-operator #20 title, and the tail of a real table (a trailing space)
    assert inforom_warnings(sample(NVML_ERRORS)) == ("0000:B3:00.0", "0000:01:00.0")


def test_exit_14_alone_is_the_inforom_and_a_clean_table_is_not() -> None:
    # nvidia-smi(1), RETURN VALUE: 14 means the infoROM is corrupted
    error = inforom_error("", 14)
    assert error is not None and error.code is Code.INFOROM_CORRUPTED
    table = sample("nvidia-smi/table_550.90.07_gpud.txt")
    assert inforom_error(table, 0) is None
    assert inforom_error(sample(NVML_ERRORS).split("# --- [E]")[0], 18) is None


def test_corrupted_inforom_fails_87_in_the_driver_state(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie", ("inforom-corrupted",))
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.INFOROM_CORRUPTED, "driver")
    assert "0001:00:00.0" in result.outcome.message
    table = [c for c in w.calls() if c["cmd"] == "nvidia-smi" and c["argv"] == []]
    assert [c["rc"] for c in table] == [14]  # final at once: never retried


def test_a_rerun_past_a_satisfied_driver_still_reports_it(make_world: MakeWorld) -> None:
    """The infoROM goes bad after a good boot: the driver state is satisfied on the rerun,
    so verify's own plain `nvidia-smi` is what catches it (the -q -x it reads says
    nothing)."""
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok
    state = w.root / SIM_STATE
    data = json.loads(state.read_text())
    data["faults"] = [*data.get("faults", []), "inforom-corrupted"]
    state.write_text(json.dumps(data))
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.INFOROM_CORRUPTED, "verify")
