"""sd_notify: STATUS= datagrams on a real AF_UNIX socket, from the module and from a run."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootfsm.machine.table import STATES
from bootfsm.observe.journal import CONSOLE_EVENTS
from bootfsm.run.notify import Notifier, socket_address, state_status
from tests.conftest import MakeWorld


class Listener:
    """A bound AF_UNIX datagram socket (path or abstract) that a thread drains."""

    def __init__(self, abstract: bool = False) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"bootfsm-test-{secrets.token_hex(6)}"
            self.sock.bind("\0" + name)
            self.env_value = "@" + name
            self._dir: str | None = None
        else:
            self._dir = tempfile.mkdtemp(prefix="nfy", dir="/tmp")  # AF_UNIX paths <= 108
            path = os.path.join(self._dir, "notify")
            self.sock.bind(path)
            self.env_value = path
        self.sock.settimeout(0.1)
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> list[str]:
        """Stop draining (after what is queued) and return every message received."""
        if self._stop.is_set():
            return self.messages
        self._stop.set()
        self._thread.join(5)
        self.sock.settimeout(0)
        try:
            while True:
                self.messages.append(self.sock.recv(4096).decode())
        except OSError:
            pass
        self.sock.close()
        if self._dir:
            Path(self._dir, "notify").unlink(missing_ok=True)
            os.rmdir(self._dir)
        return self.messages


@pytest.fixture
def listener() -> Iterator[Listener]:
    lis = Listener()
    yield lis
    lis.close()


def test_address_forms() -> None:
    """Paths pass through, '@' means the abstract namespace, anything else is unusable."""
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@sd-notify") == "\0sd-notify"
    for unusable in (None, "", "@", "vsock:2:1234", "relative/path"):
        assert socket_address(unusable) is None
    assert not Notifier.from_env({}).enabled
    assert not Notifier.from_env({}).status("anything")


def test_status_datagram_is_one_line(listener: Listener) -> None:
    """A multi-line status becomes one STATUS= line; long text is shortened."""
    n = Notifier(listener.env_value)
    assert n.status("driver:\nbuilding\tthe module")
    assert n.status("x" * 1000)
    n.close()
    got = listener.close()
    assert got[0] == "STATUS=driver: building the module"
    assert got[1].startswith("STATUS=xxx") and got[1].endswith("...") and len(got[1]) <= 407


def test_abstract_namespace_socket() -> None:
    """'@name' reaches a socket bound in the abstract namespace."""
    lis = Listener(abstract=True)
    n = Notifier.from_env({"NOTIFY_SOCKET": lis.env_value})
    assert n.enabled and n.status("fetch: resolve and download verified artifacts")
    n.close()
    assert lis.close() == ["STATUS=fetch: resolve and download verified artifacts"]


def test_missing_socket_and_full_queue_never_fail_or_stall(tmp_path: Path) -> None:
    """No listener: False, no exception. A listener that never reads: sends stop
    succeeding once its queue is full instead of blocking the run."""
    assert not Notifier(str(tmp_path / "nobody")).status("x")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tempfile.mktemp(prefix="nfy", dir="/tmp")
    sock.bind(path)
    try:
        n = Notifier(path)
        results = [n.status(f"state {i}") for i in range(2000)]
        n.close()
    finally:
        sock.close()
        os.unlink(path)
    assert results[0] and not all(results)


def test_state_status_names_the_state_and_its_job() -> None:
    """Every working state has a status line; terminal states are their name."""
    for row in STATES:
        assert state_status(row.name) == f"{row.name}: {row.summary}"
    assert state_status("done") == "done"


def _statuses(messages: list[str]) -> list[str]:
    assert all(m.startswith("STATUS=") and "\n" not in m for m in messages), messages
    return [m.removeprefix("STATUS=") for m in messages]


def test_run_sends_a_status_per_state_then_the_summary(
    make_world: MakeWorld, listener: Listener
) -> None:
    """A real `bootfsm run` child: one STATUS per state entered, in machine order, the
    summary line last, never READY=1 (a oneshot's start ends when it exits); the
    commands bootfsm runs do not inherit NOTIFY_SOCKET (it is bootfsm's alone); the
    console is plain text for the journal."""
    w = make_world("h100-pcie")
    probe = w.base / "probe-bin"
    probe.mkdir()
    seen = w.base / "seen-env"
    script = probe / "ldconfig"
    script.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        f"open({str(seen)!r}, 'a').write(os.environ.get('NOTIFY_SOCKET', '-') + '\\n')\n"
        f"os.execv({str(w.bin_dir / 'ldconfig')!r}, [sys.argv[0], *sys.argv[1:]])\n"
    )
    script.chmod(0o755)
    env = {**w.env(), "NOTIFY_SOCKET": listener.env_value}
    env["PATH"] = f"{probe}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        w.argv(), env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # what journald records: plain lines, one per event, no colour off a TTY
    assert "\x1b[" not in proc.stderr
    assert {line.split()[0] for line in proc.stderr.splitlines()} <= CONSOLE_EVENTS
    got = _statuses(listener.close())
    states = [s.split(":", 1)[0] for s in got[:-1]]
    assert states == ["detect", "fetch", "driver", "verify", "join", "done"]
    assert got[-1] == proc.stdout.strip().removeprefix("bootfsm: ")
    assert got[-1].startswith("OK code=0 OK state=done")
    assert seen.read_text().split() and set(seen.read_text().split()) == {"-"}


def test_failed_run_status_carries_the_code(make_world: MakeWorld) -> None:
    """A failing run over an abstract socket: the last STATUS names code, state and hint."""
    lis = Listener(abstract=True)
    w = make_world("h100-pcie", faults=("artifact-404",))
    proc = subprocess.run(
        w.argv("--quiet"),
        env={**w.env(), "NOTIFY_SOCKET": lis.env_value},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    got = _statuses(lis.close())
    assert proc.returncode == 30
    assert [s.split(":", 1)[0] for s in got[:-1]] == ["detect", "fetch", "failed"]
    assert got[-1].startswith("FAILED code=30 ARTIFACT_NOT_FOUND state=fetch: ")
    assert "| hint: " in got[-1]
