"""`bootfsm plan`: what a run would do here, and whether it would fail fast, with no side
effects (read-only queries; index GETs unless --offline)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from bootfsm.commands.common import load_or_exit
from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_text, redact_url
from bootfsm.fetch.artifacts import index_urls, resolve
from bootfsm.fetch.indexes import index_text
from bootfsm.host.host import Host
from bootfsm.host.http import check_url
from bootfsm.machine.context import Context
from bootfsm.machine.table import TRANSITIONS
from bootfsm.node.facts import NodeFacts, gather_facts
from bootfsm.node.guards import GUARDS
from bootfsm.node.verdict import judge, keeps_image_driver, kept_image_driver, no_gpu_reason
from bootfsm.observe.journal import Journal

__all__ = ["main", "make_plan"]


def _path(ctx: Context) -> list[str]:
    path, state = [], "detect"
    while state not in ("done", "failed"):
        path.append(state)
        state = next(
            t.dest
            for t in TRANSITIONS
            if t.source == state
            and t.trigger == "advance"
            and all(GUARDS[g](ctx.facts) for g in t.guards)
        )
    return path


def make_plan(ctx: Context, offline: bool) -> dict[str, Any]:
    """The plan as data (pure apart from read-only node queries and index GETs)."""
    from bootfsm.states import REGISTRY

    facts = gather_facts(ctx.host)
    if ctx.config.mig.profile:  # plan asks no IMDS: the VM tag is not seen here
        facts = replace(facts, mig_profile=ctx.config.mig.profile, mig_profile_source="config")
    plan: dict[str, Any] = {
        "facts": facts.summary(),
        "fail_fast": None,
        "states": [],
        "guards": {},
        "artifacts": [],
        "indexes": {},
    }
    facts = replace(facts, no_gpu=no_gpu_reason(ctx.config, facts))  # no IMDS: no VM size
    if facts.no_gpu is not None:
        plan["facts"] = facts.summary()
        plan["states"] = [{"state": "detect", "would_run": True}]
        return plan
    if keeps_image_driver(ctx.config, facts):  # the run checks (loads) it first; plan only looks
        plan["image_driver"] = {"keep": True, "kept": kept_image_driver(ctx.config, facts)}
    try:
        judge(ctx.config, facts)
    except BootError as exc:
        plan["fail_fast"] = _fail_fast("detect", exc, _unless_image_driver(plan))
        return plan
    ctx.facts_ = facts
    plan["guards"] = {name: fn(facts) for name, fn in GUARDS.items()}
    for name in _path(ctx):
        ctx.state = name
        done = name != "detect" and REGISTRY[name].satisfied(ctx)
        plan["states"].append({"state": name, "would_run": not done})
    try:
        urls = index_urls(ctx.config, facts)  # a URL template that does not expand: 10
        plan["indexes"] = {k: redact_url(v) for k, v in urls.items()}
        if not offline:
            plan["artifacts"] = _artifacts(ctx, facts, urls)
    except (BootError, TransientError) as exc:
        plan["fail_fast"] = _fail_fast("fetch", exc)
    return plan


def _artifacts(ctx: Context, facts: NodeFacts, urls: dict[str, str]) -> list[dict[str, Any]]:
    """The artifacts a run would fetch, resolved from the indexes at ``urls`` (GETs)."""
    texts = {}
    for key, url in urls.items():
        check_url(url, ctx.config.fetch.allow_http_hosts)
        texts[key] = index_text(key, url, ctx.http.get(url, timeout=10).body)
    return [
        {**a.to_json(), "url": redact_url(a.url), "mirrors": [redact_url(m) for m in a.mirrors]}
        for a in resolve(ctx.config, facts, texts)
    ]


def _unless_image_driver(plan: dict[str, Any]) -> str:
    """The condition a fail-fast verdict on driver.version holds under: with
    driver.keep_image_driver and no module loaded, the run first tries to load the
    image's (validateGPUDrivers), which plan does not do."""
    image = plan.get("image_driver")
    if image is None or image["kept"] is not None:
        return ""
    return "if the image's driver does not load (the run tries nvidia-modprobe -u -c0 first): "


def _fail_fast(state: str, exc: BootError | TransientError, unless: str = "") -> dict[str, Any]:
    message = unless + redact_text(exc.message)
    return {"state": state, "code": int(exc.code), "name": exc.code.name, "message": message}


def _secure_boot_line(f: dict[str, Any]) -> str:
    """Secure Boot, who said so, and whether the kernel refuses unsigned modules."""
    state = {True: "on", False: "off"}.get(f["secure_boot"], "unknown")
    source = f" ({f['secure_boot_source']})" if f["secure_boot_source"] else ""
    enforced = "enforced" if f["module_signatures_enforced"] else "not enforced"
    enrolled = "yes" if f["dkms_key_enrolled"] else "no"
    return (
        f"secure boot: {state}{source}, lockdown {f['lockdown'] or 'unknown'}, "
        f"module signatures {enforced}, DKMS key enrolled {enrolled}"
    )


def _show(plan: dict[str, Any]) -> None:
    """The plan for people: node, guards, states, artifacts, the fail-fast verdict."""
    f = plan["facts"]
    print(
        f"node: {f['arch']} {f['os']} kernel {f['kernel']} {f['gpu_count']}x "
        f"{f['gpu_model']} nvswitches={f['nvswitches']} nvlink5={f['nvlink5']}"
    )
    print(_secure_boot_line(f))
    for name, value in plan["guards"].items():
        print(f"guard {name} = {value}")
    if image := plan.get("image_driver"):
        kept = image["kept"]
        print(
            f"image driver: {kept} loaded, kept (driver.keep_image_driver)"
            if kept
            else "image driver: none loaded; the run tries nvidia-modprobe -u -c0 first "
            "(driver.keep_image_driver) and installs driver.version only if it loads none"
        )
    for s in plan["states"]:
        print(f"  {s['state']:<8} {'run' if s['would_run'] else 'skip (satisfied)'}")
    if f["no_gpu"]:
        print(f"nothing to provision: {f['no_gpu']}")
    for a in plan["artifacts"]:
        print(f"  artifact {a['name']}: {a['url']} sha256={a['sha256'] or '(none)'}")
    ff = plan["fail_fast"]
    if ff:
        print(f"would fail in {ff['state']}: {ff['code']} {ff['name']}: {ff['message']}")


def main(args: argparse.Namespace) -> int:
    """Print the plan; exit 0, or the code the run would fail fast with."""
    if isinstance(cfg := load_or_exit(args), int):
        return cfg
    host = Host(Path(args.root))
    ctx = Context.create(cfg, host, Journal(None, run_id="plan"))
    plan = make_plan(ctx, args.offline)
    if args.json:
        print(json.dumps({"schema": 1, "kind": "plan", **plan}, indent=1, default=str))
    else:
        _show(plan)
    ff = plan["fail_fast"]
    return int(ff["code"]) if ff else int(Code.OK)
