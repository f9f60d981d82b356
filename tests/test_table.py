"""The machine table: every name resolves, guards partition the nodes, terminals absorb."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from transitions import MachineError

from bootfsm.core.archnames import normalize_arch
from bootfsm.core.codes import CODES
from bootfsm.core.hardware import model_for
from bootfsm.machine.engine import build_machine
from bootfsm.machine.table import INITIAL, STATES, TERMINAL, TRANSITIONS
from bootfsm.node.facts import NodeFacts, PciGpu
from bootfsm.node.guards import GUARDS
from bootfsm.states import CALLBACKS, REGISTRY


def test_every_state_guard_and_callback_name_resolves() -> None:
    names = {s.name for s in STATES}
    assert set(REGISTRY) == names
    for t in TRANSITIONS:
        assert t.source in names
        assert t.dest in names | set(TERMINAL)
        for g in t.guards:
            assert g in GUARDS, g
        for a in t.after:
            assert a in CALLBACKS, a
    for s in STATES:
        assert s.failure_code in CODES and s.timeout_code in CODES
        assert s.name == REGISTRY[s.name].NAME
    assert INITIAL in names


def test_terminal_states_have_no_outgoing_transitions() -> None:
    assert not [t for t in TRANSITIONS if t.source in TERMINAL]


def test_every_working_state_can_fail() -> None:
    fails = {t.source for t in TRANSITIONS if t.trigger == "fail"}
    assert fails == {s.name for s in STATES}


DEVICE_IDS = [0x2330, 0x2331, 0x2901, 0x2941, 0x31C2, 0x2342, 0x20B2, 0x1234]


@st.composite
def facts(draw: st.DrawFn) -> NodeFacts:
    arch = draw(st.sampled_from(["x86_64", "aarch64"]))
    dev = draw(st.sampled_from(DEVICE_IDS))
    n = draw(st.integers(0, 8))
    return NodeFacts(
        raw_arch=arch,
        arch=normalize_arch(arch),
        os_id="ubuntu",
        os_version="24.04",
        kernel="6.8.0",
        gpus=tuple(PciGpu(f"0000:{i:02x}:00.0", dev, model_for(dev)) for i in range(n)),
        nvswitches=tuple("0000:f0:00.0" for _ in range(draw(st.integers(0, 2)))),
        nvlink5=draw(st.booleans()),
        loaded_driver=None,
    )


@given(facts())
def test_driver_exit_guards_are_exclusive_and_exhaustive(f: NodeFacts) -> None:
    values = [GUARDS[g](f) for g in ("needs_fabric_manager", "needs_imex", "no_nvlink_fabric")]
    assert sum(values) == 1


@given(facts(), st.sampled_from([None, "VM tag SkipGpuDriverInstall=true"]))
def test_detect_exit_guards_are_exclusive_and_exhaustive(f: NodeFacts, skip: str | None) -> None:
    g = replace(f, skip_gpu_install=skip)
    values = [GUARDS[n](g) for n in ("installs_gpu_driver", "gpu_install_skipped")]
    assert values == ([False, True] if skip else [True, False])
    dests = {t.dest for t in TRANSITIONS if t.source == "detect" and t.trigger == "advance"}
    assert dests == {"fetch", "done"}


@given(facts())
def test_arm64_never_needs_fabric_manager(f: NodeFacts) -> None:
    if f.raw_arch == "aarch64":
        assert not GUARDS["needs_fabric_manager"](f)


class _Ctx:
    def __init__(self, f: NodeFacts) -> None:
        self.facts = f


class _Model:
    state: str


class MachineWalk(RuleBasedStateMachine):
    """Random trigger sequences on the real table: the safety properties always hold."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _Model()
        self.visited: list[str] = []
        self.node: NodeFacts | None = None

    @rule(f=facts())
    @precondition(lambda self: self.node is None)
    def boot(self, f: NodeFacts) -> None:
        self.node = f
        build_machine(self.model, _Ctx(f))  # type: ignore[arg-type]
        self.visited = [self.model.state]

    @rule(trigger=st.sampled_from(["advance", "fail"]))
    @precondition(lambda self: self.node is not None)
    def fire(self, trigger: str) -> None:
        before = self.model.state
        try:
            getattr(self.model, trigger)()
        except MachineError:
            assert before in TERMINAL or trigger == "fail"
            assert self.model.state == before
            return
        if before in TERMINAL:
            pytest.fail(f"{trigger} moved terminal state {before}")
        if self.model.state != before:
            self.visited.append(self.model.state)

    @invariant()
    def join_never_before_verify(self) -> None:
        if "join" in self.visited:
            assert "verify" in self.visited[: self.visited.index("join")]

    @invariant()
    def never_fabric_and_imex(self) -> None:
        assert not ("fabric" in self.visited and "imex" in self.visited)

    @invariant()
    def terminal_absorbs(self) -> None:
        for i, s in enumerate(self.visited):
            if s in TERMINAL:
                assert self.visited[i:] == [s]


MachineWalk.TestCase.settings = settings(max_examples=60, stateful_step_count=15, deadline=None)
TestMachineWalk = MachineWalk.TestCase
