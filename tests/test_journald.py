"""journald's native protocol (bootfsm/host/journald.py) and the run's console under journald.

A real AF_UNIX datagram socket stands in for /run/systemd/journal/socket; what arrives is
decoded by the rules of systemd's "Native Journal Protocol" document (KEY=value lines; a
key alone on its line, then a little-endian 64-bit length, the bytes and a newline, for a
value with newlines). The real journald is exercised by the booted lane
(tests/booted/lane.py, the permanent-failure scenario).
"""

from __future__ import annotations

import os
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bootfsm.host import journald
from bootfsm.observe.journal import Journal
from tests.conftest import MakeWorld, run_in_process


def decode(data: bytes) -> dict[str, bytes]:
    """Parse one native-protocol entry, by the protocol document (not the encoder's
    reverse). Raises ValueError on garbage."""
    fields: dict[str, bytes] = {}
    i = 0
    while i < len(data):
        nl = data.find(b"\n", i)
        if nl < 0:
            raise ValueError(f"entry ends without a newline at byte {i}")
        line = data[i:nl]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            i = nl + 1
        else:
            key = line
            if nl + 9 > len(data):
                raise ValueError(f"{key!r}: binary field without its length")
            (size,) = struct.unpack("<Q", data[nl + 1 : nl + 9])
            end = nl + 9 + size
            if end >= len(data) or data[end : end + 1] != b"\n":
                raise ValueError(f"{key!r}: binary field of {size} bytes is not closed")
            value = data[nl + 9 : end]
            i = end + 1
        if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", key.decode("ascii", "replace")):
            raise ValueError(f"invalid field name {key!r}")
        fields[key.decode()] = value
    return fields


def test_encode_matches_the_protocol_bytes() -> None:
    """Written by hand from the protocol document, not from the encoder."""
    data = journald.encode({"MESSAGE": "two\nlines", "PRIORITY": 3, "CODE_NAME": "X"})
    want = b"MESSAGE\n" + struct.pack("<Q", 9) + b"two\nlines\nPRIORITY=3\nCODE_NAME=X\n"
    assert data == want


def test_encode_drops_invalid_keys_and_bounds_the_entry() -> None:
    data = journald.encode(
        {"_PID": 1, "lower": "x", "1ST": "x", "STATE": None, "OK": "y", "BIG": "z" * 70000}
    )
    fields = decode(data)
    assert set(fields) == {"OK", "BIG"}  # trusted (_), lower case, digit-first, None dropped
    assert len(fields["BIG"]) == 16 * 1024 and len(data) <= journald.MAX_ENTRY


def test_decode_refuses_garbage() -> None:
    for bad in (
        b"MESSAGE=x",
        b"MESSAGE\n\x05\x00",
        b"lower=x\n",
        b"M\n" + struct.pack("<Q", 9) + b"ab\n",
    ):
        with pytest.raises(ValueError):
            decode(bad)


def test_stream_matches_device_and_inode(tmp_path: Path) -> None:
    with (tmp_path / "a").open("w") as a, (tmp_path / "b").open("w") as b:
        st = os.fstat(a.fileno())
        value = f"{st.st_dev}:{st.st_ino}"
        assert journald.stream_matches(value, a.fileno())
        assert not journald.stream_matches(value, b.fileno())
    for bad in (None, "", "12", "x:y", f"{st.st_dev}:"):
        assert not journald.stream_matches(bad, 1)


def test_priorities_follow_sd_daemon() -> None:
    assert [journald.priority(lv) for lv in ("error", "warning", "info", "debug")] == [3, 4, 6, 7]
    assert journald.prefixed("warning", "x") == "<4>x"


class JournalSocket:
    """A datagram socket where journald's would be, read as journald reads it: all the
    time, on its own thread (the kernel queues only net.unix.max_dgram_qlen datagrams,
    10 by default, for a reader that waits; journald never lets them pile up)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.got: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.got.append(self.sock.recv(1 << 17))
            except TimeoutError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def journal_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[JournalSocket]:
    js = JournalSocket(tmp_path / "journal.sock")
    monkeypatch.setattr(journald, "JOURNAL_SOCKET", str(tmp_path / "journal.sock"))
    yield js
    js.close()


def _received(js: JournalSocket) -> list[dict[str, str]]:
    time.sleep(0.2)  # what is in flight reaches the reader
    return [{k: v.decode() for k, v in decode(data).items()} for data in js.got]


def _stream_env(fh: object) -> dict[str, str]:
    st = os.fstat(fh.fileno())  # type: ignore[attr-defined]
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def test_failed_run_sends_structured_entries(
    make_world: MakeWorld, tmp_path: Path, journal_socket: JournalSocket
) -> None:
    """A checksum failure (31) under journald: entries with PRIORITY from the level and
    RUN_ID/STATE/CODE/CODE_NAME; nothing of it doubled on the stream."""
    w = make_world("h100-pcie", ("checksum-mismatch",))
    with (tmp_path / "stream").open("w") as console:
        result = run_in_process(w, console=console, env={**w.env(), **_stream_env(console)})
    assert result.outcome.code.name == "CHECKSUM_MISMATCH"
    entries = _received(journal_socket)
    by_event = {e["BOOTFSM_EVENT"]: e for e in entries}
    failed = by_event["state.failed"]
    assert failed["PRIORITY"] == "3" and failed["CODE"] == "31"
    assert failed["CODE_NAME"] == "CHECKSUM_MISMATCH" and failed["STATE"] == "fetch"
    assert failed["RUN_ID"] == result.run_id and failed["SYSLOG_IDENTIFIER"] == "bootfsm"
    assert "CHECKSUM_MISMATCH" in failed["MESSAGE"]
    assert by_event["run.end"]["PRIORITY"] == "3"
    assert by_event["state.enter"]["PRIORITY"] == "6"
    assert all(e["RUN_ID"] == result.run_id for e in entries)
    assert "\x1b[" not in failed["MESSAGE"]  # no colour codes in the journal
    assert (tmp_path / "stream").read_text() == ""  # sent natively, not also on the stream


def test_without_the_socket_lines_carry_priority_prefixes(
    make_world: MakeWorld, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journald, "JOURNAL_SOCKET", str(tmp_path / "absent.sock"))
    w = make_world("h100-pcie", ("checksum-mismatch",))
    with (tmp_path / "stream").open("w") as console:
        run_in_process(w, console=console, env={**w.env(), **_stream_env(console)})
    lines = (tmp_path / "stream").read_text().splitlines()
    assert lines and all(line[:3] in ("<3>", "<4>", "<6>") for line in lines)
    assert any(line.startswith("<3>state.failed") for line in lines)
    assert any(line.startswith("<6>state.enter") for line in lines)


def test_other_streams_are_left_alone(tmp_path: Path, journal_socket: JournalSocket) -> None:
    """JOURNAL_STREAM naming another file (a child's inherited stream): plain lines."""
    with (tmp_path / "other").open("w") as other, (tmp_path / "console").open("w") as console:
        j = Journal(None, run_id="r1", console=console, env=_stream_env(other))
        j.event("state.enter", state="detect")
        j.close()
    assert (tmp_path / "console").read_text().startswith("state.enter")
    assert _received(journal_socket) == []
