"""CLI conventions a user expects: NO_COLOR, versioned JSON, Ctrl-C, finite numbers,
help with defaults and exit codes, shell completion run in real bash (and zsh), a man
page rendered by real groff, and both installed with the wheel."""

from __future__ import annotations

import io
import json
import os
import pty
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from bootfsm.cli import EXIT_CODES, build_parser, main
from bootfsm.commands.completion import bash, manpage, zsh
from bootfsm.observe.journal import Journal
from tests.conftest import MakeWorld
from tests.samples import real_tool

REPO = Path(__file__).resolve().parents[1]
BOOTFSM = [sys.executable, "-m", "bootfsm"]


def _console_through_a_pty(no_color: str | None, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """What a terminal receives from the run console (a real pty: isatty() is true)."""
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    master, slave = pty.openpty()
    with os.fdopen(slave, "w", encoding="utf-8") as console:
        journal = Journal(None, run_id="tty", console=console)
        journal.event("state.failed", level="error", state="fetch", code=30)
        console.flush()
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return out


def test_no_color_turns_colour_off_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert b"\x1b[" in _console_through_a_pty(None, monkeypatch)
    assert b"\x1b[" in _console_through_a_pty("", monkeypatch)  # empty: not set (no-color.org)
    plain = _console_through_a_pty("1", monkeypatch)
    assert b"\x1b[" not in plain and b"state.failed" in plain


def test_a_file_never_gets_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    buf = io.StringIO()
    Journal(None, run_id="f", console=buf).event("state.done", state="detect")
    assert "\x1b[" not in buf.getvalue()


@pytest.mark.parametrize(
    ("argv", "kind"),
    [(["codes", "--json"], "codes"), (["graph", "--format", "json"], "graph")],
)
def test_json_outputs_carry_schema_and_kind(
    argv: list[str], kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["schema"], doc["kind"]) == (1, kind)


def test_run_commands_json_carry_schema_and_kind(make_world: MakeWorld) -> None:
    """plan, status and trace of a real simulated run; demo --json prints JSON only."""
    w = make_world("h100-pcie")
    root = ["--root", str(w.root)]
    plan = subprocess.run([*BOOTFSM, "plan", *root, "--json"], capture_output=True, text=True)
    assert json.loads(plan.stdout)["kind"] == "plan"
    subprocess.run(w.argv(), env=w.env(), capture_output=True, check=True)
    for cmd, kind in (("status", "status"), ("trace", "run")):
        p = subprocess.run([*BOOTFSM, cmd, *root, "--json"], capture_output=True, text=True)
        doc = json.loads(p.stdout)
        assert (doc["schema"], doc["kind"]) == (1, kind), cmd
    demo = subprocess.run(
        [*BOOTFSM, "demo", "--sku", "h100-pcie", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    doc = json.loads(demo.stdout)  # the whole stdout is one JSON document
    assert (doc["schema"], doc["kind"], doc["outcome"]) == (1, "run", "done")
    assert "bootfsm: OK" in demo.stderr  # the run's own summary went to stderr


def test_ctrl_c_in_status_wait_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """Ctrl-C in a terminal: the child starts with SIGINT at its default, as a foreground
    job does. (A suite started in the background by a shell without job control inherits
    SIGINT ignored, and Python then keeps ignoring it: the child would sleep on.)"""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # reset at exec
    try:
        proc = subprocess.Popen(
            [*BOOTFSM, "status", "--root", str(tmp_path), "--wait", "--timeout", "60"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, before)
    _until_sleeping(proc.pid)  # in the wait loop (no run on this node: it waits)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        why = _proc_signals(proc.pid)  # what the kernel says of the child, for the report
        proc.kill()
        proc.communicate()
        raise AssertionError(f"SIGINT did not end bootfsm status --wait: {why}") from None
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "interrupted" in err


def test_ctrl_c_before_the_command_runs_exits_130_without_a_traceback() -> None:
    """SIGINT while the parser or a command's module loads (main() has not reached the
    command yet): one line and 130, as inside a command, not the interpreter's report."""
    code = (
        "import bootfsm.cli as c\n"
        "def main(argv=None):\n"
        "    raise KeyboardInterrupt\n"
        "c.main = main\n"
        "c.entry()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 130, p.stderr
    assert p.stderr == "bootfsm: interrupted\n"


def _until_sleeping(pid: int, limit_s: float = 30.0) -> None:
    """Wait until the child sleeps in nanosleep (its poll loop), per /proc/PID/wchan; a
    kernel that hides wchan gets a fixed second instead."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        except OSError:
            return
        if wchan in ("", "0"):
            time.sleep(1.0)
            return
        if "nanosleep" in wchan:
            return
        time.sleep(0.01)
    raise AssertionError(f"bootfsm status --wait never reached its wait loop: {_proc_signals(pid)}")


def _proc_signals(pid: int) -> str:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError as exc:
        return str(exc)
    keep = [x for x in lines if x.startswith(("State", "Threads", "SigPnd", "ShdPnd", "Sig"))]
    return f"wchan={wchan} " + " ".join(keep)


def test_the_process_exit_keeps_every_byte_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console script ends without the interpreter's teardown: what sat in stdout's
    buffer (a file is block-buffered) must still be written, and the exit code kept."""
    assert main(["codes"]) == 0
    expected = capsys.readouterr().out
    out = tmp_path / "codes.txt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with out.open("w") as fh:
        p = subprocess.run([*BOOTFSM, "codes"], stdout=fh, stderr=subprocess.PIPE, env=env)
    assert p.returncode == 0 and p.stderr == b""
    assert out.read_text() == expected and 0 < len(expected) < 8192  # all of it buffered
    bad = subprocess.run([*BOOTFSM, "explain", "NO_SUCH_CODE"], capture_output=True)
    assert bad.returncode == main(["explain", "NO_SUCH_CODE"]) != 0


def test_a_reader_that_goes_away_ends_quietly_with_141() -> None:
    """``bootfsm codes | head -1``: the closed pipe is not a traceback. The read end is
    closed before the child runs, so its first write meets EPIPE every time."""
    read, write = os.pipe()
    os.close(read)
    try:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        p = subprocess.run(
            [*BOOTFSM, "codes"], stdout=write, stderr=subprocess.PIPE, text=True, env=env
        )
    finally:
        os.close(write)
    assert p.returncode == 141, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--wait", "--timeout", "nan"],
        ["status", "--wait", "--timeout", "-1"],
        ["run", "--wait-lock", "nan"],
        ["run", "--wait-lock", "inf"],
    ],
)
def test_non_finite_numbers_are_usage_errors(argv: list[str], tmp_path: Path) -> None:
    """Refused at once with exit 2 and a message, never a wait that cannot end."""
    p = subprocess.run(
        [*BOOTFSM, *argv, "--root", str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 2
    assert "finite number" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "1e309", "0"])
def test_non_finite_deadline_is_config_invalid(value: str, tmp_path: Path) -> None:
    """--deadline is the hook's own contract: a bad value is CONFIG_INVALID (10)."""
    p = subprocess.run(
        [*BOOTFSM, "run", "--deadline", value, "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 10 and "must be a positive number" in p.stdout + p.stderr


@pytest.mark.parametrize("command", sorted(EXIT_CODES))
def test_every_command_help_shows_its_exit_codes(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "bash", "--help"] if command == "completion" else [command, "--help"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "exit codes:" in out and "130     interrupted" in out


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "(default: 0.0)" in out and "(default: bootfsm)" in out


def _bash_complete(words: str) -> list[str]:
    """Ask real bash for the completions of a command line (the cursor at its end)."""
    script = REPO / "docs" / "completion" / "bootfsm.bash"
    line = words.split(" ")
    code = (
        f"source {script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in line)}); COMP_CWORD={len(line) - 1}\n"
        "_bootfsm; printf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    p = subprocess.run([real_tool("bash"), "-c", code], capture_output=True, text=True, check=True)
    return p.stdout.split()


def test_bash_completion_in_real_bash() -> None:
    assert _bash_complete("bootfsm ru") == ["run"]
    assert set(_bash_complete("bootfsm run --exit-codes ")) == {"bootfsm", "cse"}
    assert "--wait-lock" in _bash_complete("bootfsm run --w")
    assert set(_bash_complete("bootfsm completion ")) >= {"bash", "zsh"}
    assert set(_bash_complete("bootfsm graph --format ")) == {"mermaid", "json", "markdown"}


def test_zsh_completion_parses_in_real_zsh() -> None:
    zsh_bin = real_tool("zsh")
    script = REPO / "docs" / "completion" / "_bootfsm"
    assert script.read_text().startswith("#compdef bootfsm\n")
    p = subprocess.run([zsh_bin, "-n", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_man_page_renders_in_groff_without_warnings() -> None:
    page = REPO / "docs" / "man" / "bootfsm.1"
    p = subprocess.run(
        [real_tool("groff"), "-t", "-man", "-Tutf8", "-ww", "-P", "-cbou", str(page)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0 and p.stderr == "", p.stderr
    for section in ("NAME", "SYNOPSIS", "COMMANDS", "EXIT STATUS", "ENVIRONMENT"):
        assert section in p.stdout
    assert "CHECKSUM_MISMATCH" in p.stdout and "NO_COLOR" in p.stdout


def test_generated_files_match_the_parser() -> None:
    """docs/man and docs/completion are `make docs` output of today's parser."""
    parser = build_parser()
    docs = REPO / "docs"
    assert (docs / "man" / "bootfsm.1").read_text() == manpage(parser, EXIT_CODES)
    assert (docs / "completion" / "bootfsm.bash").read_text() == bash(parser)
    assert (docs / "completion" / "_bootfsm").read_text() == zsh(parser)


def test_wheel_installs_the_man_page_and_completions(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("bootfsm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for path in (
        "data/share/man/man1/bootfsm.1",
        "data/share/bash-completion/completions/bootfsm.bash",
        "data/share/zsh/site-functions/_bootfsm",
    ):
        assert any(n.endswith(".data/" + path) for n in names), path
