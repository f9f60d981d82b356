"""The booted lane's teardown scenarios (issue 40): nodes that get no driver, and a driver
that replaces aks-gpu's prebake of another version, under real systemd with the image's
real ldconfig, in AgentBaker's CSE order (tests/cse_caller.sh, Azure/AgentBaker 06836ee).

The image is prebaked as aks-gpu's install.sh leaves it after one run
(bootfsm/sim/aksgpu.py, staged by booted_node.py's setup before bootfsm runs, then the
image's real ``ldconfig``). What the real ``ldconfig -p`` resolved before bootfsm ran is
in ldconfig-before.txt, after it in ldconfig-p.txt (``resolved NAME PATH TARGET`` lines:
the file the SONAME link leads to), the prebake's paths still there in prebake.txt.

Each check asserts what on-call would see: CSE's exit and lines, the unit's summary, the
run's journal (``teardown.done``, ``driver.superseded``), the files, the loader's answer,
kubelet's state. lane.py owns the boots; these functions add to its ``Checks``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

__all__ = [
    "IMDS_URL",
    "OLD_CUDA",
    "SKIP_TAG",
    "cpu_prebake",
    "kubelet_by_ensure_kubelet",
    "no_driver_env",
    "skip_tag",
    "superseded",
]

OLD_CUDA = "535.261.03"
"""The CUDA driver of an older aks-gpu image: the prebake a newer driver replaces."""
SKIP_TAG = {"SkipGpuDriverInstall": "true"}
IMDS_URL = "http://127.0.0.1:8765/metadata/instance?api-version=2021-02-01"
"""booted_node.py's loopback IMDS (the mirror unit, 127.0.0.1 in the node's own network)."""
# the prebake's paths that must be gone on a node that gets no driver (prebake.txt)
GONE = (
    "/var/lib/dkms/nvidia/",
    "/updates/dkms/nvidia",
    "/usr/bin/lib64",
    "/etc/ld.so.conf.d/nvidia.conf",
    "/opt/azure/aks-gpu/dkms-marker",
    "/usr/bin/nvidia-smi",
    "/usr/bin/nvidia-modprobe",
    "/usr/bin/nvidia-persistenced",
    "/libnvidia-ml.so",
    "/libcuda.so",
    "/sys/module/nvidia",
)
NOUVEAU = "/etc/modprobe.d/blacklist-nouveau.conf"  # cleanUpPrebakedGPUDriver keeps it


class _Checks(Protocol):
    problems: list[str]
    facts: list[str]

    def eq(self, what: str, got: object, want: object) -> None: ...

    def true(self, what: str, cond: bool) -> None: ...


class _Boot(Protocol):
    def text(self, name: str) -> str: ...

    def show(self, unit: str) -> dict[str, str]: ...


def no_driver_env() -> str:
    """cse_cmd.sh's values for a CPU VM size (GPU_NODE=false, no driver chosen); no
    IMDS_URL: the tag is read only where the image has curl and jq (scenario 13)."""
    return (
        "GPU_NODE=false\nGPU_DRIVER_VERSION=\nGPU_DRIVER_TYPE=\nGPU_NEEDS_FABRIC_MANAGER=false\n"
        "MIG_NODE=false\nGPU_INSTANCE_PROFILE=\nCONFIG_GPU_DRIVER_IF_NEEDED=true\n"
        "KUBELET_CACHE=/opt/kube/kubelet\n"
    )


def _resolved(text: str) -> list[tuple[str, str]]:
    """(name, the file it resolves to) of each NVIDIA/CUDA library ldconfig -p listed."""
    return [(m[1], m[3]) for m in re.finditer(r"^resolved (\S+) (\S+) (\S+)$", text, re.M)]


def _events(b: _Boot, name: str, prefix: str = "unit-run-") -> list[dict[str, Any]]:
    out = []
    for n in range(20):
        text = b.text(f"{prefix}{n}.jsonl")
        if not text:
            break
        out += [e for e in map(json.loads, text.splitlines()) if e.get("event") == name]
    return out


def _cse(c: _Checks, b: _Boot, skip: str, gpu_node: str) -> None:
    """CSE in AgentBaker's order on a node that gets no driver: 0, the tag as read, no
    hook line, kubelet started, then cleanUpGPUDrivers' place."""
    cse = b.text("cse.txt")
    lines = cse.splitlines()
    c.eq("CSE's exit", lines[-1:], ["rc=0"])
    c.eq("the caller's tag", lines[:1], [f"caller: skip_nvidia_driver_install={skip}"])
    c.true(f"the hook ran in CSE: {cse[-300:]!r}", "bootfsm: " not in cse)
    c.true("CSE never started kubelet", "caller: kubelet started" in lines)
    c.true(
        "CSE did not reach cleanUpGPUDrivers",
        f"caller: cleanUpGPUDrivers (GPU_NODE={gpu_node}, skip_nvidia_driver_install={skip})"
        in lines,
    )


def kubelet_by_ensure_kubelet(c: _Checks, b: _Boot) -> None:
    """The node booted without kubelet's binary in /opt/bin and without
    /etc/default/kubelet (a fresh VHD): kubelet runs, and with the flags of the file only
    CSE's ensureKubelet writes (`systemctl status kubelet` shows its command line)."""
    status = b.text("status-kubelet.txt")
    c.true(
        "kubelet does not run with ensureKubelet's /etc/default/kubelet",
        re.search(r"booted_node\.py kubelet --enable-server --node-labels=kubernetes\.azure"
                  r"\.com/mode=user,\S+ --v=2 --node-labels=\S+ --max-pods=30$", status, re.M)
        is not None,
    )  # fmt: skip


def _torn_down(c: _Checks, b: _Boot, version: str, unloaded: bool) -> None:
    before = _resolved(b.text("ldconfig-before.txt"))
    c.eq(
        "libnvidia-ml.so.1 the real ldconfig resolved before bootfsm ran",
        [t.rsplit("/", 1)[-1] for n, t in before if n == "libnvidia-ml.so.1"],
        [f"libnvidia-ml.so.{version}"],
    )
    after = b.text("ldconfig-p.txt")
    c.true("ldconfig -p failed", after.startswith("# ldconfig -p exit 0\n"))
    c.eq("NVIDIA libraries the real ldconfig resolves", _resolved(after), [])
    left = b.text("prebake.txt").splitlines()
    c.eq("the prebake left", [p for p in left if any(g in p for g in GONE)], [])
    c.true(f"{NOUVEAU} went (AgentBaker keeps it)", NOUVEAU in left)
    [done] = _events(b, "teardown.done") or [{}]
    c.eq("teardown.done status", done.get("status"), "cleaned")
    c.eq("teardown.done kept", done.get("kept"), [])
    unloads = [(e.get("module"), e.get("ok")) for e in _events(b, "teardown.unload")]
    c.eq("modules unloaded", unloads, [("nvidia", True)] if unloaded else [])
    calls = b.text("calls.jsonl")
    c.true("an installer ran", '"nvidia-installer"' not in calls)
    c.facts.append(
        f"{len(before)} NVIDIA libraries resolved before, none after;"
        f" {done.get('removed')} paths removed"
    )


def cpu_prebake(c: _Checks, b: _Boot, version: str) -> None:
    """(a) A CPU VM size of an aks-gpu-prebaked image: bootfsm.service at boot ends 0
    "nothing to provision" after tearing the prebake down; CSE (GPU_NODE=false) ends 0
    and its ensureKubelet starts kubelet."""
    status = b.show("bootfsm").get("StatusText", "")
    want = "OK code=0 OK state=done: nothing to provision: VM size standard_d4s_v5 has no"
    c.true(f"StatusText {status!r}", status.startswith(want))
    _cse(c, b, "false", "false")
    kubelet_by_ensure_kubelet(c, b)
    _torn_down(c, b, version, unloaded=False)


def skip_tag(c: _Checks, b: _Boot, version: str) -> None:
    """(b) A GPU VM size tagged SkipGpuDriverInstall=true in IMDS compute.tagsList: the
    caller's curl and jq read it (the hook never runs), bootfsm.service reads it from the
    same IMDS, unloads the module udev loaded at boot and tears the prebake down."""
    status = b.show("bootfsm").get("StatusText", "")
    c.true(f"StatusText {status!r}", "GPU driver install skipped" in status)
    c.eq(
        "detect.skip_gpu_install events",
        [e.get("reason") for e in _events(b, "detect.skip_gpu_install")],
        ["VM tag SkipGpuDriverInstall=true"],
    )
    _cse(c, b, "true", "true")
    kubelet_by_ensure_kubelet(c, b)
    _torn_down(c, b, version, unloaded=True)


def superseded(c: _Checks, b: _Boot, new: str) -> None:
    """(c) A GPU VM size on an image aks-gpu prebaked with another CUDA driver: the hook
    supersedes it, and the real ldconfig resolves only the installed driver's files."""
    before = dict(_resolved(b.text("ldconfig-before.txt")))
    c.eq(
        "libnvidia-ml.so.1 before bootfsm",
        before.get("libnvidia-ml.so.1", "").rsplit("/", 1)[-1],
        f"libnvidia-ml.so.{OLD_CUDA}",
    )
    after = _resolved(b.text("ldconfig-p.txt"))
    c.true("the real ldconfig resolves no NVIDIA library after bootfsm", bool(after))
    c.eq(
        "drivers the resolved libraries belong to",
        sorted({target.rsplit(".so.", 1)[-1] for _name, target in after}),
        [new],
    )
    left = b.text("prebake.txt").splitlines()
    stale = [p for p in left if OLD_CUDA in p or "/usr/bin/lib64" in p or "nvidia.conf" in p]
    stale += [p for p in left if p.endswith("/dkms-marker")]
    c.eq("the old prebake left", stale, [])
    [event] = _events(b, "driver.superseded", prefix="azure-run-") or [{}]
    c.eq("driver.superseded prebake", event.get("prebake"), [OLD_CUDA])
    c.facts.append(f"{OLD_CUDA} superseded by {new}; {len(after)} libraries resolve, all {new}")
