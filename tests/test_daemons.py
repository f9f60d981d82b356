"""The daemons' one shape (bootfsm/install/daemons.py) on a simulated node, through its
systemctl stand-in: enable and start only what is not, one failure code per daemon,
masking for a daemon that must not run on the host."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from bootfsm.core.codes import Code
from bootfsm.core.config import parse_config
from bootfsm.core.errors import BootError
from bootfsm.host.host import CommandResult, Host
from bootfsm.install import daemons
from bootfsm.install.daemons import FABRIC_MANAGER, IMEX, KUBELET
from bootfsm.machine.context import Context
from bootfsm.observe.journal import Journal
from bootfsm.sim.node import SKUS, build_node


def _node(tmp_path: Path) -> tuple[Context, list[list[str]]]:
    root = tmp_path / "node"
    bin_dir = build_node(root, SKUS["h100-pcie"], (), compile_seconds=0.01)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    ctx = Context.create(parse_config({}), Host(root, env=env), Journal(None, run_id="t"))
    seen: list[list[str]] = []

    def record(r: CommandResult) -> None:
        seen.append(list(r.argv))

    ctx.host.on_command = record
    return ctx, seen


def test_start_enables_and_starts_only_what_is_not(tmp_path: Path) -> None:
    ctx, seen = _node(tmp_path)
    assert not KUBELET.configured(ctx) and not KUBELET.running(ctx)  # installed, not enabled
    seen.clear()
    KUBELET.ensure_running(ctx)
    assert [a[1] for a in seen] == ["show", "enable", "start", "show"]
    assert KUBELET.ready(ctx) and KUBELET.running(ctx)
    seen.clear()
    KUBELET.ensure_running(ctx)  # already enabled and active: nothing to do
    assert [a[1] for a in seen] == ["show", "show"]


def test_a_daemon_that_cannot_start_fails_with_its_own_code(tmp_path: Path) -> None:
    ctx, _ = _node(tmp_path)  # h100-pcie has no fabric manager unit installed
    with pytest.raises(BootError) as err:
        FABRIC_MANAGER.ensure_running(ctx)
    assert err.value.code is Code.FABRIC_MANAGER_FAILED
    with pytest.raises(BootError) as err2:
        FABRIC_MANAGER.require_running(ctx)
    assert err2.value.code is Code.FABRIC_MANAGER_FAILED
    assert "nvidia-fabricmanager.service is not active" in err2.value.message


def test_a_host_masked_daemon_is_configured_once_masked(tmp_path: Path) -> None:
    ctx, _ = _node(tmp_path)
    unit = ctx.host.path("/lib/systemd/system/nvidia-imex.service")
    unit.write_text("[Unit]\nDescription=IMEX\n[Service]\nExecStart=/bin/true\n"
                    "[Install]\nWantedBy=multi-user.target\n")  # fmt: skip
    assert not IMEX.configured(ctx)
    IMEX.mask(ctx)
    assert IMEX.configured(ctx)
    assert os.readlink(ctx.host.path("/etc/systemd/system/nvidia-imex.service")) == "/dev/null"


def test_every_unit_is_named_once() -> None:
    """The states and libraries take their unit names from the daemons, not their own."""
    units = [d.unit for d in vars(daemons).values() if isinstance(d, daemons.Daemon)]
    assert len(units) == len(set(units)) == 5
    here = Path(__file__).resolve().parents[1]
    for path in [*here.glob("states/*.py"), *here.glob("bootfsm/install/*.py")]:
        if path.name == "daemons.py":
            continue
        text = path.read_text()
        for unit in units:
            assert f'"{unit}"' not in text, f"{path.name} names {unit} itself"


def test_kubelet_is_healthy_only_when_its_healthz_answers_ok(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    # kubelet's /healthz answers 200 "ok", or 500 with the failed checks (kubelet source,
    # pkg/kubelet/server: healthz.InstallHandler); a refused connection is not healthy either
    def healthy(url: str) -> bool:
        config = parse_config({"join": {"kubelet_healthz_url": url}})
        ctx = Context.create(config, Host(tmp_path), Journal(None, run_id="t"))
        return daemons.kubelet_healthy(ctx)

    httpserver.expect_request("/ok").respond_with_data("ok", status=200)
    httpserver.expect_request("/failed").respond_with_data("[-]ping failed", status=500)
    httpserver.expect_request("/other").respond_with_data("okay", status=200)
    assert healthy(httpserver.url_for("/ok"))
    assert not healthy(httpserver.url_for("/failed"))
    assert not healthy(httpserver.url_for("/other"))
    with socket.socket() as s:  # a port nobody listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not healthy(f"http://127.0.0.1:{port}/healthz")
