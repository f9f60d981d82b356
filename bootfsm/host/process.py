"""Commands on PATH: argv only, a time limit, bounded output, the whole group killed.

The command half of ``Host`` (a mixin). Stdin closed, own session, combined output to
an unlinked file read back whole; on timeout SIGTERM then SIGKILL to the group; the
parent-death signal kills a command that would outlive bootfsm."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import signal
import subprocess  # noqa: TID251 - with host.py, the one place that runs commands
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError

__all__ = ["OUTPUT_LIMIT_BYTES", "OUTPUT_TAIL_BYTES", "CommandResult", "Commands"]

OUTPUT_LIMIT_BYTES = 16 << 20
"""The most output of one command bootfsm reads (16 MiB); more is a BootError.

A real `nvidia-smi -q -x` is 25-45 KB per GPU (356 KB for 8x B200), so parsers get
their input whole with a wide margin."""
OUTPUT_TAIL_BYTES = 4096
"""How much of a command's output is journaled or shown (``CommandResult.tail``)."""
_KILL_GRACE_S = 2.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _resolve_prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved once in the parent (the child must not dlopen after fork)."""
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


_PRCTL = _resolve_prctl()


def _die_with(parent: int) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGKILL when the bootfsm thread that started it dies
    (PR_SET_PDEATHSIG, prctl(2)), so killing bootfsm (its process group, a SIGKILL, an
    OOM kill) cannot leave nvidia-installer or dpkg running in their own session for a
    rerun to race. If bootfsm died before the prctl took effect, the child ends itself."""

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


@dataclass(frozen=True)
class CommandResult:
    """What one command did: argv, exit code, duration, its whole output (``tail`` to show).
    ``spawn_s`` is bootfsm's part of ``duration_s``: from start to the command's exec."""

    argv: tuple[str, ...]
    returncode: int
    duration_s: float
    output: str
    timed_out: bool = False
    spawn_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its time limit."""
        return self.returncode == 0 and not self.timed_out

    @property
    def tail(self) -> str:
        """The last ``OUTPUT_TAIL_BYTES`` characters of the output, for journals and messages."""
        return self.output[-OUTPUT_TAIL_BYTES:]


def _wait_exact(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for ``proc`` at most ``timeout`` s; True when it exited (reaped). A pidfd wakes at
    the exit (``Popen.wait`` polls up to 50 ms late); the stdlib wait where it is missing."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return proc.poll() is not None
            if poller.poll(max(1, int(left * 1000 + 0.999))):
                proc.wait()  # it has exited: this only reaps it
                return True
    finally:
        os.close(fd)


def _exec_error(exe: str, exc: OSError) -> BootError:
    """ENOEXEC (not an executable), ETXTBSY (open for writing), EACCES...: EXEC_FAILED."""
    why = {
        errno.ENOEXEC: "not an executable (a truncated or corrupt file?)",
        errno.ETXTBSY: "text file busy: another process has it open for writing",
        errno.EACCES: "permission denied (not executable, or a noexec mount)",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return BootError(Code.EXEC_FAILED, f"cannot execute {exe}: {why}")


class Commands:
    """Host's command methods; ``Host.__init__`` sets the attributes they use."""

    env: dict[str, str]
    monotonic: Callable[[], float]
    on_command: Callable[[CommandResult], None] | None
    _child: subprocess.Popen[bytes] | None

    def which(self, name: str) -> str | None:
        """Absolute path of ``name`` on this host's PATH, or None."""
        if "/" in name:
            return name if os.access(name, os.X_OK) else None
        for d in self.env.get("PATH", os.defpath).split(os.pathsep):
            cand = os.path.join(d or ".", name)
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
        return None

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        die_with_bootfsm: bool = True,
    ) -> CommandResult:
        """Run argv (no shell) with a time limit; its combined output whole, at most
        ``OUTPUT_LIMIT_BYTES`` (else HOST_IO_ERROR); not on PATH: COMMAND_MISSING. With
        ``die_with_bootfsm`` False (readers, systemctl) no parent-death signal, so vfork."""
        exe = self.which(argv[0])
        if exe is None:
            raise BootError(Code.COMMAND_MISSING, f"command not found on PATH: {argv[0]}")
        full_env = {**self.env, "LC_ALL": "C.UTF-8", **(env or {})}
        start = self.monotonic()
        with tempfile.TemporaryFile() as out:
            proc, timed_out, spawned = self._spawn_wait(
                exe, argv, out, subprocess.STDOUT, full_env, cwd, timeout, die_with_bootfsm
            )
            size = out.seek(0, os.SEEK_END)
            out.seek(size - OUTPUT_TAIL_BYTES if size > OUTPUT_LIMIT_BYTES else 0)
            captured = out.read().decode("utf-8", errors="replace")
        result = self._finished(argv, proc, start, spawned, captured, timed_out)
        if size > OUTPUT_LIMIT_BYTES:
            raise BootError(
                Code.HOST_IO_ERROR,
                f"{argv[0]} printed {size} bytes, more than the {OUTPUT_LIMIT_BYTES >> 20} MiB"
                " bootfsm reads from one command",
                output=result.tail,
            )
        return result

    def capture(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        max_bytes: int = 1 << 20,
        die_with_bootfsm: bool = True,
    ) -> tuple[CommandResult, str]:
        """Run argv (no shell) like ``run``, but keep its standard output whole (up to
        ``max_bytes``) for commands whose output is data (``containerd config dump`` is
        larger than ``run``'s tail). The result's output is stderr's tail."""
        exe = self.which(argv[0])
        if exe is None:
            raise BootError(Code.COMMAND_MISSING, f"command not found on PATH: {argv[0]}")
        start = self.monotonic()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            env = {**self.env, "LC_ALL": "C.UTF-8"}
            proc, timed_out, spawned = self._spawn_wait(
                exe, argv, out, err, env, None, timeout, die_with_bootfsm
            )
            out.seek(0)
            data = out.read(max_bytes).decode("utf-8", errors="replace")
            size = err.seek(0, os.SEEK_END)
            err.seek(max(0, size - OUTPUT_TAIL_BYTES))
            tail = err.read().decode("utf-8", errors="replace")
        return self._finished(argv, proc, start, spawned, tail, timed_out), data

    def _finished(
        self,
        argv: Sequence[str],
        proc: subprocess.Popen[bytes],
        start: float,
        spawned: float,
        output: str,
        timed_out: bool,
    ) -> CommandResult:
        """The command's result (-9 when it had to be killed), handed to ``on_command``."""
        result = CommandResult(
            argv=tuple(argv),
            returncode=proc.returncode if proc.returncode is not None else -9,
            duration_s=round(self.monotonic() - start, 4),
            output=output,
            timed_out=timed_out,
            spawn_s=round(spawned - start, 4),
        )
        if self.on_command is not None:
            self.on_command(result)
        return result

    def _spawn_wait(
        self,
        exe: str,
        argv: Sequence[str],
        stdout: IO[bytes],
        stderr: IO[bytes] | int,
        env: Mapping[str, str],
        cwd: Path | None,
        timeout: float,
        die_with_bootfsm: bool,
    ) -> tuple[subprocess.Popen[bytes], bool, float]:
        """Start argv in its own session (stdin closed; SIGKILL if bootfsm dies, when
        ``die_with_bootfsm``) and wait at most ``timeout``; past it the whole group is
        killed. (process, timed out, monotonic time of its exec: Popen returns then)."""
        try:
            proc = subprocess.Popen(
                [exe, *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_die_with(os.getpid()) if die_with_bootfsm else None,
            )
        except OSError as exc:
            raise _exec_error(exe, exc) from exc
        spawned = self.monotonic()
        self._child = proc
        try:
            if _wait_exact(proc, max(timeout, 0.01)):
                return proc, False, spawned
            self._kill_group(proc)
            return proc, True, spawned
        finally:
            self._child = None

    def stop_child(self) -> list[str] | None:
        """Stop the command in flight and its whole process group.

        Returns the argv of the command if it was still running, else None.
        """
        proc = self._child
        if proc is None:
            return None
        running = proc.poll() is None
        args = proc.args
        self._kill_group(proc)
        if not running:
            return None
        return [str(a) for a in args] if isinstance(args, list) else [str(args)]

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM the group, SIGKILL it after a grace period, and always SIGKILL what is
        left (grandchildren that ignored SIGTERM outlive their leader otherwise)."""
        try:
            for sig, wait in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    return
                try:
                    proc.wait(timeout=wait)
                    return
                except subprocess.TimeoutExpired:
                    continue
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
