"""Structural checks of the trace JSON forms against docs/trace.md (keys and types)."""

from __future__ import annotations

from typing import Any

NUM = (int, float)
OPT_NUM = (int, float, type(None))
OUTCOMES = {"done", "failed", "interrupted", "running", "killed", "unknown"}

RUN_KEYS: dict[str, Any] = {
    "schema": int,
    "kind": str,
    "source": str,
    "run_id": str,
    "run_kind": str,
    "started": str,
    "ended": str,
    "version": str,
    "journal_schema": (int, type(None)),
    "config_digest": str,
    "root": str,
    "pid": (int, type(None)),
    "boot_id": str,
    "outcome": str,
    "alive": (bool, type(None)),
    "code": (int, type(None)),
    "code_name": str,
    "failed_state": str,
    "message": str,
    "hint": str,
    "duration_s": OPT_NUM,
    "facts": dict,
    "states": list,
    "blame": list,
    "transitions": list,
    "root_cause": (dict, type(None)),
    "commands": list,
    "notes": list,
    "warnings": list,
    "events": int,
}
STATE_KEYS: dict[str, Any] = {
    "state": str,
    "start_s": NUM,
    "duration_s": NUM,
    "end_s": NUM,
    "attempts": int,
    "attempts_max": (int, type(None)),
    "time_limit_s": OPT_NUM,
    "outcome": str,
    "retries": list,
    "sleep_s": NUM,
    "commands": int,
    "failed_commands": int,
}
RETRY_KEYS: dict[str, Any] = {
    "t": NUM,
    "attempt": (int, type(None)),
    "sleep_s": NUM,
    "code": str,
    "error": str,
}
CAUSE_KEYS: dict[str, Any] = {
    "state": str,
    "code": (int, type(None)),
    "code_name": str,
    "message": str,
    "hint": str,
    "path": list,
    "guards": dict,
    "command": (dict, type(None)),
    "retries": list,
    "notes": list,
    "detail": dict,
}
COMMAND_KEYS: dict[str, Any] = {
    "argv": list,
    "rc": (int, type(None)),
    "duration_s": OPT_NUM,
    "timed_out": bool,
    "output_tail": str,
    "caused_failure": bool,
}


def check_keys(obj: dict[str, Any], spec: dict[str, Any], where: str) -> None:
    """Exactly the documented keys, each of the documented type."""
    assert set(obj) == set(spec), f"{where}: keys {sorted(set(obj) ^ set(spec))}"
    for k, t in spec.items():
        assert isinstance(obj[k], t), f"{where}.{k}: {type(obj[k]).__name__} is not {t}"


def check_trace_json(data: dict[str, Any]) -> None:
    """A `bootfsm trace --json` document, schema 1."""
    check_keys(data, RUN_KEYS, "trace")
    assert data["schema"] == 1 and data["kind"] == "run"
    assert data["outcome"] in OUTCOMES
    for s in data["states"]:
        check_keys(s, STATE_KEYS, "states[]")
        for r in s["retries"]:
            check_keys(r, RETRY_KEYS, "retries[]")
    for b in data["blame"]:
        check_keys(b, {"state": str, "duration_s": NUM, "share": NUM, "outcome": str}, "blame[]")
    durations = [b["duration_s"] for b in data["blame"]]
    assert durations == sorted(durations, reverse=True)
    for t in data["transitions"]:
        check_keys(t, {"t": NUM, "source": str, "dest": str, "trigger": str, "guards": dict}, "tr")
    for c in data["commands"]:
        check_keys(
            c,
            {
                "t": NUM,
                "state": str,
                "argv": list,
                "rc": (int, type(None)),
                "duration_s": NUM,
                "timed_out": bool,
                "probe": bool,
            },
            "commands[]",
        )
    for n in data["notes"]:
        check_keys(n, {"t": NUM, "state": str, "message": str}, "notes[]")
    assert all(isinstance(w, str) for w in data["warnings"])
    rc = data["root_cause"]
    if rc is not None:
        check_keys(rc, CAUSE_KEYS, "root_cause")
        if rc["command"] is not None:
            check_keys(rc["command"], COMMAND_KEYS, "root_cause.command")
