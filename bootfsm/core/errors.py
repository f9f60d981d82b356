"""The three kinds of failure: transient (retried), permanent (ends the run), command.
States raise them, the engine decides; each message is redacted (``redact_text``) when made."""

from __future__ import annotations

from collections.abc import Sequence

from bootfsm.core.codes import Code
from bootfsm.core.redact import redact_text

__all__ = ["BootError", "CommandError", "TransientError"]


class BootError(Exception):
    """A permanent failure: the run ends with ``code``."""

    def __init__(self, code: Code, message: str, **detail: object) -> None:
        message = redact_text(message)
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail


class TransientError(Exception):
    """A failure that may succeed on retry; ``code`` applies when retries run out."""

    def __init__(self, code: Code, message: str, *, retry_after: float | None = None) -> None:
        message = redact_text(message)
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after


class CommandError(BootError):
    """A command exited non-zero; the message shows argv, exit code and output tail."""

    def __init__(
        self, code: Code, argv: Sequence[str], returncode: int, output_tail: str, what: str = ""
    ) -> None:
        head = what or f"{argv[0]} failed"
        msg = f"{head}: exit {returncode}: {' '.join(argv)}"
        tail = output_tail.strip()
        if tail:
            msg += "\n" + tail
        super().__init__(code, msg, argv=list(argv), returncode=returncode, output=tail)
        self.argv = list(argv)
        self.returncode = returncode
        self.output_tail = output_tail
