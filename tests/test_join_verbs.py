"""join's verbs beside their tools: the ready marker is one type (its file's keys spelled
once), and containerd's config dump is captured by the context's runner, under the
command's timeout and the state's time limit like every other command."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.config import parse_config
from bootfsm.core.config_files import load_config
from bootfsm.core.deadline import Deadline
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host
from bootfsm.install.marker import MarkerError, ReadyMarker, ready_path
from bootfsm.machine.context import Context
from bootfsm.machine.table import row
from bootfsm.observe.journal import Journal
from bootfsm.sim.world import World
from bootfsm.states import join
from tests.conftest import run_in_process

# the ready marker as join wrote it before it was a type (json.dumps of a dict in this
# key order, then a newline): a node upgraded in place still has this file
WRITTEN = (
    '{"driver_version": "580.95.05", "config_digest": "9f2c4e", '
    '"run_id": "20261207T231502Z-4b1d", "wall_time": 1796684102.25}\n'
)


def test_a_marker_join_wrote_reads_back_field_by_field() -> None:
    m = ReadyMarker.parse(WRITTEN)
    assert m.driver_version == "580.95.05"
    assert m.config_digest == "9f2c4e"
    assert m.run_id == "20261207T231502Z-4b1d"
    assert m.wall_time == 1796684102.25


def test_the_marker_is_written_byte_for_byte_as_before() -> None:
    m = ReadyMarker("580.95.05", "9f2c4e", "20261207T231502Z-4b1d", 1796684102.25)
    assert m.render() == WRITTEN
    assert ReadyMarker.parse(m.render()) == m


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        '{"config_digest": "9f2c4e"}',
        '{"driver_version": 580, "config_digest": "x"}',
    ],
)
def test_a_marker_that_cannot_say_what_joined_is_a_marker_error(text: str) -> None:
    with pytest.raises(MarkerError):
        ReadyMarker.parse(text)


def test_the_marker_fits_only_its_own_driver_and_config() -> None:
    cfg = parse_config({"driver": {"version": "580.95.05"}})
    other = parse_config({"driver": {"version": "570.172.08"}})
    m = ReadyMarker(cfg.driver.version, cfg.digest())
    assert m.fits(cfg)
    assert not m.fits(other)
    assert not ReadyMarker(cfg.driver.version, "stale").fits(cfg)
    assert ready_path(cfg) == "/var/lib/bootfsm/ready"


def _ctx(tmp_path: Path, state_limit: float | None = None) -> Context:
    host = Host(tmp_path, env=dict(os.environ))
    ctx = Context.create(parse_config({}), host, Journal(None, run_id="test"))
    if state_limit is not None:
        ctx.state, ctx.state_row = "join", row("join")
        ctx.state_deadline = Deadline(state_limit, host.monotonic)
    return ctx


_SLOW = [
    sys.executable,
    "-c",
    "import sys, time; print('dump'); sys.stdout.flush(); time.sleep(30)",
]


def test_capture_keeps_stdout_apart_from_stderr(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('[plugins]'); sys.stderr.write('warn\\n')"]
    r, out = _ctx(tmp_path).capture(argv, timeout=30)
    assert r.ok and out == "[plugins]\n" and "warn" in r.output and "[plugins]" not in r.output


def test_capture_past_its_own_timeout_is_a_failed_result(tmp_path: Path) -> None:
    r, _ = _ctx(tmp_path).capture(_SLOW, timeout=0.5)
    assert r.timed_out and not r.ok


def test_capture_cut_by_the_state_limit_is_the_states_timeout(tmp_path: Path) -> None:
    with pytest.raises(BootError) as err:
        _ctx(tmp_path, state_limit=0.5).capture(_SLOW, timeout=30)
    assert err.value.code == Code.KUBELET_NOT_HEALTHY  # join's timeout code in the table
    assert "ran past its time limit" in str(err.value)


# -- join's postcondition reads each step's result from the node -------------------------


@pytest.fixture(scope="module")
def joined(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, Context]]:
    with World(tmp_path_factory.mktemp("joined"), "h100-pcie") as w:
        assert run_in_process(w).outcome.ok
        cfg = load_config(w.config_path, required=True)
        yield w, Context.create(cfg, Host(w.root, env=w.env()), Journal(None, run_id="t"))


@contextmanager
def changed(
    path: Path, text: str | None = None, *, newer_than: Path | None = None
) -> Iterator[None]:
    """``path`` rewritten (or only made newer than ``newer_than``), put back afterwards."""
    before, st = path.read_bytes(), path.stat()
    try:
        if text is not None:
            path.write_text(text)
        if newer_than is not None:
            t = newer_than.stat().st_mtime + 5
            os.utime(path, (t, t))
        yield
    finally:
        path.write_bytes(before)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_joined_node_is_satisfied(joined: tuple[World, Context]) -> None:
    assert join.satisfied(joined[1])


def test_config_toml_no_longer_importing_the_dropin_means_join_again(
    joined: tuple[World, Context],
) -> None:
    w, ctx = joined
    config = w.root / "etc/containerd/config.toml"
    without = "\n".join(
        ln for ln in config.read_text().splitlines() if not ln.startswith("imports")
    )
    with changed(config, without + "\n"):
        assert not join.satisfied(ctx)
    assert join.satisfied(ctx)


def test_a_reboot_after_the_spec_was_written_means_join_again(
    joined: tuple[World, Context],
) -> None:
    w, ctx = joined
    spec = w.root / "etc/cdi/nvidia.yaml"
    with changed(w.root / "dev/nvidia-uvm", newer_than=spec):  # devtmpfs: made at boot
        assert not join.satisfied(ctx)


@pytest.mark.parametrize("how", ["another config", "not json"])
def test_a_marker_of_another_config_or_unreadable_means_join_again(
    joined: tuple[World, Context], how: str
) -> None:
    w, ctx = joined
    marker = w.root / "var/lib/bootfsm/ready"
    m = ReadyMarker.parse(marker.read_text())
    text = ReadyMarker(m.driver_version, "0" * 64).render() if how == "another config" else "{"
    with changed(marker, text):
        assert not join.satisfied(ctx)
