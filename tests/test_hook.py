"""The provisioning hook: the exact command line of docs/provisioning-hook.md, run as a
child on simulated nodes: exit code unchanged, one summary line, deadline honoured."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bootfsm.codes import Code, info
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, installer_calls

DOC = Path(__file__).resolve().parent.parent / "docs/provisioning-hook.md"
RUN_ID = r"[0-9a-f]{8}"


def hook_argv() -> list[str]:
    """The documented hook line (the first line of the block after the marker)."""
    text = DOC.read_text()
    block = text[text.index("<!-- hook-command") :].split("```sh\n", 1)[1]
    argv = shlex.split(block.splitlines()[0])
    assert argv[:2] == ["bootfsm", "run"], argv
    return argv


def run_hook(
    w: World, argv: list[str] | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the hook line on the node; `bootfsm` is this checkout's `python -m bootfsm`."""
    line = argv if argv is not None else hook_argv()
    return subprocess.run(
        [sys.executable, "-m", "bootfsm", *line[1:], "--root", str(w.root)],
        env={**w.env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def only_line(p: subprocess.CompletedProcess[str]) -> str:
    """The hook's whole console: one line on stdout, nothing on stderr."""
    assert p.stderr == "", p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert len(lines) == 1, p.stdout
    return lines[0]


def test_hook_line_is_documented_with_a_budget() -> None:
    """The documented line is quiet, bounded (deadline) and waits for the unit, briefly."""
    argv = hook_argv()
    assert "--quiet" in argv
    deadline = float(argv[argv.index("--deadline") + 1])
    wait = float(argv[argv.index("--wait-lock") + 1])
    assert wait + deadline + 15 <= 780  # fits the CSE budget with room to exit


def test_hook_success_is_one_ok_line(make_world: MakeWorld) -> None:
    """A node that provisions: exit 0 and one OK line with the run id."""
    w = make_world("h100-pcie")
    p = run_hook(w)
    assert p.returncode == 0
    assert re.fullmatch(
        rf"bootfsm: OK code=0 OK state=done: node provisioned in \d+\.\d s \| run {RUN_ID}",
        only_line(p),
    )


FAIL_FAST = [
    pytest.param("gb300", (), "grid", Code.DRIVER_KIND_UNSUPPORTED_ON_ARCH, "detect", id="grid"),
    pytest.param(
        "h100-pcie", ("artifact-404",), "cuda", Code.ARTIFACT_NOT_FOUND, "fetch", id="404"
    ),
    pytest.param(
        "h100-pcie", ("checksum-mismatch",), "cuda", Code.CHECKSUM_MISMATCH, "fetch", id="sha256"
    ),
]


@pytest.mark.parametrize(("sku", "faults", "kind", "code", "state"), FAIL_FAST)
def test_hook_fail_fast_codes_pass_through(
    make_world: MakeWorld,
    sku: str,
    faults: tuple[str, ...],
    kind: str,
    code: Code,
    state: str,
) -> None:
    """A permanent problem: bootfsm's code is the hook's exit code, the one line names
    code, name, state and hint, no driver build was attempted, and the trace reads."""
    w = make_world(sku, faults=faults, driver_kind=kind)
    p = run_hook(w)
    assert p.returncode == int(code)
    line = only_line(p)
    head = f"bootfsm: FAILED code={int(code)} {code.name} state={state}: "
    assert line.startswith(head), line
    assert re.search(rf" \| hint: {re.escape(info(code).hint)} \| run {RUN_ID}$", line), line
    assert installer_calls(w) == []
    trace = subprocess.run(
        [sys.executable, "-m", "bootfsm", "trace", "--root", str(w.root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert trace.returncode == 0, trace.stderr
    assert f"{int(code)} {code.name}" in trace.stdout and "root cause" in trace.stdout


@pytest.mark.parametrize("how", ["flag", "env"])
def test_deadline_is_honoured_end_to_end(make_world: MakeWorld, how: str) -> None:
    """A driver build that never returns: the run stops at its deadline (flag, or
    BOOTFSM_DEADLINE) with 100, stopping the build, instead of hanging the hook."""
    w = make_world("h100-pcie", faults=("installer-hangs",))
    argv = hook_argv()
    i = argv.index("--deadline")
    if how == "flag":
        p = run_hook(w, [*argv[:i], "--deadline", "5", *argv[i + 2 :]])
    else:
        p = run_hook(w, [*argv[:i], *argv[i + 2 :]], env={"BOOTFSM_DEADLINE": "5"})
    assert p.returncode == int(Code.DEADLINE_EXCEEDED), p.stdout
    line = only_line(p)
    assert line.startswith("bootfsm: FAILED code=100 DEADLINE_EXCEEDED state=driver: ")
    assert "global deadline of 5 s ran out in state driver" in line
    # the deadline cut the command in flight: journaled as timed out, stopped by SIGTERM
    [journal] = w.journals()
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    assert events[-1]["event"] == "run.end" and events[-1]["code"] == 100
    [cut] = [e for e in events if e["event"] == "command" and e["timed_out"]]
    assert Path(cut["argv"][0]).name == "nvidia-installer" and cut["state"] == "driver"
    assert [c["rc"] for c in installer_calls(w)] == [-15]


@pytest.mark.parametrize(
    ("extra", "env", "says"),
    [
        ((), {"BOOTFSM_DEADLINE": "soon"}, "BOOTFSM_DEADLINE: expected seconds"),
        ((), {"BOOTFSM_DEADLINE": "-5"}, "BOOTFSM_DEADLINE: must be a positive"),
        (("--deadline", "0"), {}, "--deadline: must be a positive"),
    ],
)
def test_bad_deadline_is_config_invalid(
    tmp_path: Path, extra: tuple[str, ...], env: dict[str, str], says: str
) -> None:
    """A deadline that is not a positive number: 10 and the summary line, no run."""
    p = subprocess.run(
        [sys.executable, "-m", "bootfsm", "run", "--quiet", "--root", str(tmp_path), *extra],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == int(Code.CONFIG_INVALID)
    line = only_line(p)
    assert line.startswith("bootfsm: FAILED code=10 CONFIG_INVALID state=-: ") and says in line
    assert not (tmp_path / "var/log/bootfsm").exists()


def test_exit_code_table_maps_every_code() -> None:
    """The CSE-to-bootfsm table names real codes (number and name agree) and every
    failure code appears in it."""
    text = DOC.read_text()
    table = text[text.index("| CSE code today |") : text.index("## Reading the trace")]
    pairs = re.findall(r"`(\d+) ([A-Z_]+)`", table)
    assert pairs
    for number, name in pairs:
        assert Code[name] == int(number), (number, name)
    assert {name for _, name in pairs} == {c.name for c in Code if c is not Code.OK}
