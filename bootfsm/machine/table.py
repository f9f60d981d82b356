"""The one definition of the machine: states, edges, guards, retries, limits, codes.

The engine, ``bootfsm graph`` and the generated docs/machine.md all read it."""

from __future__ import annotations

from dataclasses import dataclass

from bootfsm.core.codes import Code

__all__ = [
    "INITIAL",
    "STATES",
    "TERMINAL",
    "TRANSITIONS",
    "RetryPolicy",
    "StateRow",
    "TransitionRow",
    "row",
    "stop_after",
]


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of a state's action on transient errors (exponential, jittered)."""

    attempts: int = 1
    initial_wait: float = 1.0
    max_wait: float = 30.0


@dataclass(frozen=True)
class StateRow:
    """One working state: what it does, how long it may take, how it fails."""

    name: str
    summary: str
    time_limit: float
    failure_code: Code  # the action ran but the postcondition still does not hold
    timeout_code: Code  # the state ran past its time limit
    retry: RetryPolicy = RetryPolicy()


@dataclass(frozen=True)
class TransitionRow:
    """An edge: ``trigger`` moves ``source`` to ``dest`` when every guard holds."""

    trigger: str
    source: str
    dest: str
    guards: tuple[str, ...] = ()
    after: tuple[str, ...] = ()


INITIAL = "detect"
TERMINAL = ("done", "failed")

STATES: tuple[StateRow, ...] = (
    StateRow(
        "detect",
        "read node facts; fail fast on anything permanent",
        30,
        Code.INTERNAL_ERROR,
        Code.STATE_TIMEOUT,
    ),
    StateRow(
        "fetch",
        "resolve and download verified artifacts",
        360,
        Code.CHECKSUM_MISMATCH,
        Code.DOWNLOAD_TIMEOUT,
        RetryPolicy(attempts=5, initial_wait=1.0, max_wait=20.0),
    ),
    StateRow(
        "driver",
        "toolkit debs, nouveau off, DKMS driver build, module loaded",
        600,
        Code.DRIVER_INSTALL_FAILED,
        Code.DRIVER_INSTALL_TIMEOUT,
        RetryPolicy(attempts=2, initial_wait=2.0, max_wait=10.0),
    ),
    StateRow(
        "fabric",
        "install and start fabric manager (x86_64 NVSwitch/NVLink5)",
        180,
        Code.FABRIC_MANAGER_FAILED,
        Code.FABRIC_MANAGER_FAILED,
        RetryPolicy(attempts=3, initial_wait=2.0, max_wait=10.0),
    ),
    StateRow(
        "imex",
        "install nvidia-imex, keep its host service masked (arm64 Grace-Blackwell)",
        120,
        Code.IMEX_INSTALL_FAILED,
        Code.IMEX_INSTALL_FAILED,
        RetryPolicy(attempts=2, initial_wait=2.0, max_wait=10.0),
    ),
    StateRow(
        "verify",
        "nvidia-smi answers, GPU count matches, fabric Completed",
        360,
        Code.DRIVER_NOT_STARTED,
        Code.FABRIC_NOT_READY,
        RetryPolicy(attempts=3, initial_wait=2.0, max_wait=10.0),
    ),
    StateRow(
        "mig",
        "MIG mode current on every GPU, the configured GPU and compute instances",
        180,
        Code.MIG_CONFIG_FAILED,
        Code.MIG_CONFIG_FAILED,
    ),
    StateRow(
        "join",
        "containerd NVIDIA runtime, /dev/char symlinks, CDI spec; optional last step"
        " (join.start_kubelet): kubelet healthy; the ready marker records it all",
        240,
        Code.KUBELET_NOT_HEALTHY,
        Code.KUBELET_NOT_HEALTHY,
        RetryPolicy(attempts=2, initial_wait=2.0, max_wait=10.0),
    ),
)

TRANSITIONS: tuple[TransitionRow, ...] = (
    TransitionRow("advance", "detect", "fetch", ("installs_gpu_driver",)),
    TransitionRow("advance", "detect", "done", ("gpu_install_skipped",)),
    TransitionRow("advance", "fetch", "driver"),
    TransitionRow("advance", "driver", "fabric", ("needs_fabric_manager",)),
    TransitionRow("advance", "driver", "imex", ("needs_imex",), ("disable_stale_fabric_manager",)),
    TransitionRow(
        "advance", "driver", "verify", ("no_nvlink_fabric",), ("disable_stale_fabric_manager",)
    ),
    TransitionRow("advance", "fabric", "verify"),
    TransitionRow("advance", "imex", "verify"),
    TransitionRow("advance", "verify", "mig", ("mig_configured",)),
    TransitionRow("advance", "verify", "join", ("mig_not_configured",)),
    TransitionRow("advance", "mig", "join"),
    TransitionRow("advance", "join", "done"),
    *(TransitionRow("fail", s.name, "failed") for s in STATES),
)


def row(name: str) -> StateRow:
    """The table row of working state ``name``; KeyError for terminal or unknown."""
    return {s.name: s for s in STATES}[name]


def stop_after(stop: str) -> tuple[TransitionRow, ...]:
    """The sub-table of a partial run ending at ``stop``: its advance edges become one
    ``stop -> done``, and only edges out of states reachable from ``INITIAL`` stay."""
    row(stop)  # KeyError for a terminal or unknown state
    edges = [t for t in TRANSITIONS if t.source != stop or t.trigger != "advance"]
    edges.append(TransitionRow("advance", stop, "done"))
    reach, todo = {INITIAL}, [INITIAL]
    while todo:
        here = todo.pop()
        for t in edges:
            if t.source == here and t.dest not in reach:
                reach.add(t.dest)
                todo.append(t.dest)
    return tuple(t for t in edges if t.source in reach)
