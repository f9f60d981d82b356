"""The CLI as a user runs it: plan, trace, demo, run summary lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bootfsm.cli import main
from tests.conftest import MakeWorld, processes_naming


def test_plan_json_has_no_side_effects(
    make_world: MakeWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    w = make_world("h100-hgx")
    before = sorted(p.relative_to(w.root) for p in w.root.rglob("*") if "bootfsm-sim" not in str(p))
    rc = main(["plan", "--root", str(w.root), "--json"])
    plan = json.loads(capsys.readouterr().out)
    after = sorted(p.relative_to(w.root) for p in w.root.rglob("*") if "bootfsm-sim" not in str(p))
    assert rc == 0 and before == after
    assert plan["fail_fast"] is None
    assert plan["guards"] == {
        "gpu_install_skipped": False,  # plan does not ask IMDS for the VM tags
        "installs_gpu_driver": True,
        "mig_configured": False,  # no mig.profile (and no VM tags asked)
        "mig_not_configured": True,
        "needs_fabric_manager": True,
        "needs_imex": False,
        "no_nvlink_fabric": False,
    }
    assert [s["state"] for s in plan["states"]] == [
        "detect",
        "fetch",
        "driver",
        "fabric",
        "verify",
        "join",
    ]
    names = {a["name"]: a for a in plan["artifacts"]}
    assert {"runfile", "fabricmanager", "nvidia-container-toolkit"} <= set(names)
    assert all(len(a["sha256"]) == 64 for a in plan["artifacts"])
    assert names["fabricmanager"]["url"].endswith(
        "fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-580.159.04-archive.tar.xz"
    )
    installs = [
        c
        for c in w.calls()
        if c["cmd"] in ("nvidia-installer", "dpkg", "systemctl")
        and not {"is-active", "is-enabled"} & set(c["argv"])
    ]
    assert installs == []


def test_plan_shows_the_mig_state_when_a_profile_is_configured(
    make_world: MakeWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    w = make_world("h100-pcie", config_overrides={"mig": {"profile": "MIG1g"}})
    assert main(["plan", "--root", str(w.root), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["guards"]["mig_configured"] is True
    assert [s["state"] for s in plan["states"]][-2:] == ["mig", "join"]
    assert [c for c in w.calls() if "-cgi" in c["argv"] or "-mig" in c["argv"]] == []


def test_plan_reports_fail_fast_code(
    make_world: MakeWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    w = make_world("gb300", driver_kind="grid")
    assert main(["plan", "--root", str(w.root)]) == 21
    assert "would fail in detect: 21 DRIVER_KIND_UNSUPPORTED_ON_ARCH" in capsys.readouterr().out


def test_run_summary_and_trace_of_a_failure(make_world: MakeWorld) -> None:
    w = make_world("gb300", ("checksum-mismatch",))
    p = w.run_cli()
    assert p.returncode == 31
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("bootfsm: FAILED code=31 CHECKSUM_MISMATCH state=fetch:")
    assert "hint:" in last
    t = subprocess.run(
        [sys.executable, "-m", "bootfsm", "trace", "--root", str(w.root)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert t.returncode == 0
    assert "root cause" in t.stdout and "31 CHECKSUM_MISMATCH" in t.stdout
    j = subprocess.run(
        [sys.executable, "-m", "bootfsm", "trace", "--json", "--root", str(w.root)],
        capture_output=True,
        text=True,
        check=False,
    )
    data = json.loads(j.stdout)
    assert data["failed_state"] == "fetch" and data["code"] == 31


def test_run_with_invalid_config_exits_10(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    cfg = Path(str(tmp_path)) / "c.toml"
    cfg.write_text("[driver]\nmodule_type = 'closed'\n")
    assert main(["run", "--root", str(tmp_path), "--config", str(cfg)]) == 10
    assert "driver.module_type" in capsys.readouterr().err


def test_demo_lists_faults_boots_and_leaves_no_gpg_agent() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "bootfsm", "demo", "--fault", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0 and "checksum-mismatch" in p.stdout and "installer-hangs" in p.stdout
    # The demo signs its mirror with a real gpg key, whose agent is a daemon: when the
    # demo ends, the agent is gone and its home removed (the console script ends with
    # os._exit, so this cannot be left to atexit). A short TMPDIR: gpg-agent's sockets
    # live in its home, and a unix socket path has 108 bytes.
    with tempfile.TemporaryDirectory(prefix="bfsm-") as short:
        tmp = Path(short)
        p = subprocess.run(
            [sys.executable, "-m", "bootfsm", "demo", "--sku", "h100-pcie"],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
            env={**os.environ, "TMPDIR": str(tmp)},
        )
        homes, pids = sorted(tmp.glob("bootfsm-sim-gpg-*")), processes_naming(tmp)
        for pid in pids:  # leave nothing running even when the assertion fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert p.returncode == 0, p.stderr
    assert "bootfsm: OK code=0" in p.stdout and "verify" in p.stdout
    assert (homes, pids) == ([], [])
    bad = subprocess.run(
        [sys.executable, "-m", "bootfsm", "demo", "--fault", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "unknown fault" in bad.stderr
