"""systemd's sd_notify without libsystemd: ``STATUS=`` datagrams only (a oneshot unit
never sends ``READY=1``). Best effort: no socket or a send error never fails a run."""

from __future__ import annotations

from collections.abc import Mapping

from bootfsm.host.journald import Datagrams

__all__ = ["Notifier", "socket_address", "state_status"]

_MAX_STATUS = 400  # systemctl status shows one line; keep the datagram small


def state_status(state: str) -> str:
    """The STATUS text for a state the run has just entered: name and what it does."""
    from bootfsm.machine.table import TERMINAL, row

    if state in TERMINAL:
        return state
    return f"{state}: {row(state).summary}"


def socket_address(value: str | None) -> str | None:
    """The AF_UNIX address of a ``$NOTIFY_SOCKET`` value (``@name``: abstract ``\\0name``);
    None for anything else (``vsock:...``) or nothing."""
    if not value:
        return None
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None


class Notifier:
    """Sends ``STATUS=`` datagrams to one notify socket; a no-op without one."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self._out = Datagrams(address) if address is not None else None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Notifier:
        """A notifier for ``env['NOTIFY_SOCKET']`` (a no-op when unset or unusable)."""
        return cls(socket_address(env.get("NOTIFY_SOCKET")))

    @property
    def enabled(self) -> bool:
        """True when there is a socket to notify."""
        return self.address is not None

    def status(self, text: str) -> bool:
        """Send ``STATUS=text`` as one line of at most 400 characters (a newline would start
        a new assignment); True when it was sent."""
        if self._out is None:
            return False
        line = " ".join(text.split())
        if len(line) > _MAX_STATUS:
            line = line[: _MAX_STATUS - 3] + "..."
        return self._out.send(f"STATUS={line}".encode("utf-8", "replace"))

    def close(self) -> None:
        """Close the socket (a later send reopens it)."""
        if self._out is not None:
            self._out.close()
