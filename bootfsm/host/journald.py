"""Structured entries for systemd-journald, without libsystemd.

Under systemd every stdout line gets priority 6, so when ``$JOURNAL_STREAM`` is our
console (sd_journal_stream_fd(3)) each console event goes to the native socket with its
own PRIORITY and fields (the "Native Journal Protocol"), at most ``MAX_ENTRY`` bytes.
Else ``prefixed`` gives the ``<N>`` syslog prefix. Best effort: never fails a run."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct
from collections.abc import Mapping

__all__ = [
    "JOURNAL_SOCKET",
    "MAX_ENTRY",
    "Journald",
    "encode",
    "prefixed",
    "priority",
    "stream_matches",
]

JOURNAL_SOCKET = "/run/systemd/journal/socket"
MAX_ENTRY = 48 * 1024
"""Bytes one entry may take; larger values are cut (no memfd fallback needed)."""
_MAX_VALUE = 16 * 1024

#: syslog priorities (sd-daemon(3) SD_ERR ... SD_DEBUG) of the journal's levels
PRIORITIES = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}

_KEY = re.compile(r"[A-Z][A-Z0-9_]{0,63}")  # not starting with "_" (trusted) or a digit


def priority(level: str) -> int:
    """The syslog priority of a journal level (unknown levels are info, 6)."""
    return PRIORITIES.get(level, 6)


def prefixed(level: str, line: str) -> str:
    """``line`` with the ``<N>`` prefix journald reads as its priority."""
    return f"<{priority(level)}>{line}"


def stream_matches(value: str | None, fd: int) -> bool:
    """True when ``$JOURNAL_STREAM`` (``device:inode``) is the file open on ``fd``."""
    if not value:
        return False
    dev, sep, ino = value.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


def encode(fields: Mapping[str, object]) -> bytes:
    """One native-protocol entry; invalid keys and empty values are dropped, values are
    cut to 16 KiB, and the entry to ``MAX_ENTRY`` bytes (MESSAGE first, then the rest)."""
    out = bytearray()
    for key, raw in fields.items():
        if raw is None or not _KEY.fullmatch(key):
            continue
        value = str(raw).encode("utf-8", "replace")[:_MAX_VALUE]
        if b"\n" in value:
            item = key.encode() + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
        else:
            item = key.encode() + b"=" + value + b"\n"
        if len(out) + len(item) > MAX_ENTRY:
            continue
        out += item
    return bytes(out)


class Datagrams:
    """A non-blocking AF_UNIX datagram socket to ``address``, opened at the first send;
    a send error closes it (the next send reopens it)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._sock: socket.socket | None = None

    def send(self, payload: bytes) -> bool:
        """Send one datagram; False when the socket is missing, refuses or is full."""
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)  # a full queue drops a datagram, never stalls
            self._sock.sendto(payload, self.address)
        except BlockingIOError:
            return False
        except OSError:
            self.close()
            return False
        return True

    def close(self) -> None:
        """Close the socket (a later send reopens it)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


class Journald:
    """Sends entries to journald's native socket; ``send`` says whether it was taken."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address or JOURNAL_SOCKET
        self._out = Datagrams(self.address)

    def send(self, fields: Mapping[str, object]) -> bool:
        """Send one entry; False (the caller falls back) when it was not taken."""
        payload = encode(fields)
        return bool(payload) and self._out.send(payload)

    def close(self) -> None:
        """Close the socket (a later send reopens it)."""
        self._out.close()
