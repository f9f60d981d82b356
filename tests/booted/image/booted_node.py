"""Runs INSIDE a booted-lane image, under the image's own python3 (bootfsm's venv).

Subcommands (each is one unit of the image, see tests/booted/image/units/, except
``prepare``, which the lane runs once per image build in a non-booted container):

  prepare   build the loopback mirror's docroot (real makeself runfile, real dpkg-deb
            debs and Packages indexes) with the simulator's builders, the stand-in
            commands of what needs a GPU, the simulator's node state and bootfsm's config
  setup     at boot, before bootfsm: present the simulated hardware (PCI functions,
            /sys/module, /proc/driver, kernel headers) with mounts made inside the
            container, and let the "kernel" load a built nvidia module as a boot would
  mirror    serve the docroot on 127.0.0.1:MIRROR_PORT (sd_notify READY once bound)
  kubelet   the kubelet stand-in: serves /healthz on 127.0.0.1:10248
  dpkg-lock hold the real dpkg frontend lock for N seconds (scenario: transient 40)
  chaos     SIGKILL bootfsm's main process while nvidia-installer builds (once)
  report    wait until systemd has settled, dump what systemd and the node show into
            /booted/out, power off

Only the simulator (bootfsm.sim) is used to produce tool output; nothing here imports
product code for that.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

BOOTED = Path("/booted")
OUT = BOOTED / "out"
SCENARIO = BOOTED / "scenario.json"
STATE = Path("/var/lib/booted")
DOCROOT = STATE / "mirror"
RUNFILE_NAME = STATE / "runfile-name"
SIM_BIN = Path("/opt/bootfsm-sim/bin")
BOOTFSM = "/opt/bootfsm/bin/bootfsm"
MIRROR_PORT = 8765
KUBELET_PORT = 10248
# Commands that need a GPU (or a kernel the container does not have): stand-ins first on
# bootfsm.service's PATH. Everything else bootfsm runs is the image's real tool: dpkg,
# dpkg-query, ldconfig, systemctl, containerd.
GPU_STANDINS = (
    "nvidia-smi",
    "nvidia-modprobe",
    "modprobe",
    "modinfo",
    "dkms",
    "nvidia-ctk",
    "update-initramfs",
)
REPORT_UNITS = ("bootfsm.service", "kubelet.service", "containerd.service")


def _scenario() -> dict[str, object]:
    return json.loads(SCENARIO.read_text()) if SCENARIO.is_file() else {}


def _notify(text: str) -> None:
    """sd_notify(3) over $NOTIFY_SOCKET (path or @abstract)."""
    addr = os.environ.get("NOTIFY_SOCKET", "")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        s.sendall(text.encode())


# -- prepare (image build time) ---------------------------------------------------------
def prepare(sku: str) -> int:
    from bootfsm.core.archnames import normalize_arch
    from bootfsm.sim.node import SKUS, standin_script
    from bootfsm.sim.world import DRIVER_VERSION, World

    world = World(base=STATE, sku_name=sku)
    world.root = Path("/")  # stand-ins baked into the runfile act on this very node
    world.docroot = DOCROOT
    world._build_mirror()  # the simulator's real-format builders (makeself, dpkg-deb)
    world.mirror = SimpleNamespace(url=f"http://127.0.0.1:{MIRROR_PORT}")  # type: ignore[assignment]
    world.config_overrides = {
        # bootfsm's default list (Ubuntu 22.04, 24.04, Debian 12) and Debian 13
        "detect": {"supported_os": ["ubuntu:22.04", "ubuntu:24.04", "debian:12", "debian:13"]},
        "driver": {"dpkg_lock_timeout": 3.0},
    }
    text = world.config_text()
    # keep the shipped deadline (BOOTFSM_DEADLINE from /etc/default/bootfsm) and the
    # real backoff: drop the simulator's fast [run] section
    text = text.split("[detect]", 1)[1]
    # and the real defaults of the simulator's shortened timeouts (installer, reads,
    # fabric, kubelet): the deadline scenario needs the global deadline to fire first
    text = re.sub(
        r"^(command_timeout|read_timeout|fabric_\w+|kubelet_\w+) = .*\n", "", text, flags=re.M
    )
    cfg = Path("/etc/bootfsm/config.toml")
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text("[detect]" + text)
    names = normalize_arch(SKUS[sku].arch)
    assert names is not None
    RUNFILE_NAME.write_text(f"NVIDIA-Linux-{names.runfile}-{DRIVER_VERSION}.run\n")
    SIM_BIN.mkdir(parents=True, exist_ok=True)
    for name in GPU_STANDINS:
        path = SIM_BIN / name
        path.write_text(standin_script(name, Path("/"), sys.executable))
        path.chmod(0o755)
    sim = Path("/var/lib/bootfsm-sim/sim.json")
    sim.parent.mkdir(parents=True, exist_ok=True)
    sim.write_text(
        json.dumps(
            {"sku": sku, "faults": [], "compile_seconds": 0.5, "fabric_in_progress_calls": 2},
            indent=2,
        )
        + "\n"
    )
    return 0


# -- setup (every boot, before bootfsm) -------------------------------------------------
def _run(*argv: str) -> None:
    subprocess.run(argv, check=True)


def setup() -> int:
    from bootfsm.sim.nodestate import Node
    from bootfsm.sim.skus import SKUS, pci_layout

    scenario = _scenario()
    sim = Path("/var/lib/bootfsm-sim/sim.json")
    state = json.loads(sim.read_text())
    state["faults"] = list(scenario.get("node_faults", []))  # type: ignore[call-overload]
    state["compile_seconds"] = float(scenario.get("compile_seconds", 0.5))  # type: ignore[arg-type]
    sim.write_text(json.dumps(state, indent=2) + "\n")
    sku = SKUS[state["sku"]]
    # PCI functions of the SKU: a tmpfs holding vendor/device/class, over the real list
    pci = Path("/run/booted/pci")
    for func in pci_layout(sku):
        if scenario.get("pci") == "no-gpus" and func.pci_class == 0x030200:
            continue  # a CPU VM size, or a GPU VM size whose GPUs left the bus
        d = pci / func.address
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text(f"0x{func.vendor:04x}\n")
        (d / "device").write_text(f"0x{func.device:04x}\n")
        (d / "class").write_text(f"0x{func.pci_class:06x}\n")
    _run("mount", "--bind", str(pci), "/sys/bus/pci/devices")
    # /sys/module: nspawn's /sys is a read-only tmpfs without it; the nvidia-modprobe
    # stand-in writes /sys/module/nvidia/version there, as the kernel would
    if not Path("/sys/module").is_dir():
        _run("mount", "-o", "remount,rw", "/sys")
        Path("/sys/module").mkdir()
        _run("mount", "-o", "remount,ro", "/sys")
    _run("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/sys/module")
    _run("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/proc/driver")
    if scenario.get("kernel_release"):  # the kernel a signed module package is built for
        # (nspawn cannot bind over a procfs file from outside; a mount inside can, and
        # bootfsm reads the release from this file)
        release = Path("/run/booted/osrelease")
        release.write_text(f"{scenario['kernel_release']}\n")
        _run("mount", "--bind", str(release), "/proc/sys/kernel/osrelease")
    if "secure-boot" in state["faults"]:
        _secure_boot()
    kernel = Path("/proc/sys/kernel/osrelease").read_text().strip()
    build = Path(f"/lib/modules/{kernel}/build")
    build.mkdir(parents=True, exist_ok=True)
    (build / "Makefile").write_text(f"# Linux kernel headers for {kernel} (booted lane)\n")
    (build / ".config").write_text("CONFIG_MODULES=y\nCONFIG_MODULE_UNLOAD=y\n")
    if scenario.get("vm_size"):  # what IMDS says (the simulator's VM_SIZE override)
        Path("/opt/bootfsm-sim/vm-size").write_text(f"{scenario['vm_size']}\n")
    if scenario.get("vm_tags"):  # compute.tagsList beside the pool's (the simulator's VM_TAGS)
        tags = [[k, v] for k, v in scenario["vm_tags"].items()]  # type: ignore[attr-defined]
        Path("/opt/bootfsm-sim/vm-tags.json").write_text(json.dumps(tags) + "\n")
    if scenario.get("aks_gpu_prebake"):
        _aks_gpu_prebake(str(scenario["aks_gpu_prebake"]))
    if scenario.get("fresh_cse"):  # a fresh VHD: kubelet in the image's cache, unconfigured
        Path("/opt/kube").mkdir(exist_ok=True)
        shutil.move("/opt/bin/kubelet", "/opt/kube/kubelet")
        Path("/etc/default/kubelet").unlink()
    node = Node(Path("/"))
    for address, _device in node.gpus():  # a GPU reset (this boot) makes a pending MIG
        current, pending = node.mig_mode(address)  # mode current, as Node.boot does
        if current != pending:
            node.set_mig_mode(address, pending, pending)
    # a reboot, or a prebaked image: udev loads the DKMS module for the GPU's modalias
    # (nothing loads it on a VM size without an NVIDIA GPU)
    if node.built_module() is not None and node.gpus():
        err = node.load_module()
        print(f"booted-sim: nvidia module loaded at boot{': ' + err if err else ''}")
    print(f"booted-sim: {sku.name} hardware presented for kernel {kernel}")
    return 0


def _aks_gpu_prebake(version: str) -> None:
    """The image as aks-gpu's install.sh leaves it after one run (bootfsm/sim/aksgpu.py:
    the DKMS tree and modules, the user-space staged under /usr/bin/lib64 and copied into
    the multiarch directory, /etc/ld.so.conf.d/nvidia.conf, the dkms-marker), then the
    image's real ldconfig, as install.sh runs it; what the real ``ldconfig -p`` resolves
    before bootfsm runs goes to /booted/out/ldconfig-before.txt."""
    from bootfsm.sim.aksgpu import stage_aks_gpu_prebake
    from bootfsm.sim.nodestate import Node

    stage_aks_gpu_prebake(Node(Path("/")), version, initialized=True)
    _run("ldconfig")  # the simulator's ldconfig wrote its own cache: the real one rewrites it
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "ldconfig-before.txt").write_text(_resolved())
    print(f"booted-sim: aks-gpu prebake of {version} staged", flush=True)


# what an aks-gpu prebake leaves (bootfsm/sim/aksgpu.py, Azure/aks-gpu install.sh), and the
# nouveau blacklist AgentBaker's teardown keeps
PREBAKE_GLOBS = (
    "/var/lib/dkms/nvidia/*",
    "/lib/modules/*/updates/dkms/nvidia*.ko*",
    "/lib/modules/*/kernel/drivers/video/nvidia*.ko*",
    "/usr/bin/lib64",
    "/usr/bin/lib64/lib64/libnvidia-ml.so.*",
    "/etc/ld.so.conf.d/nvidia.conf",
    "/opt/azure/aks-gpu/dkms-marker",
    "/usr/bin/nvidia-smi",
    "/usr/bin/nvidia-modprobe",
    "/usr/bin/nvidia-persistenced",
    "/usr/lib/*-linux-gnu/libnvidia-ml.so*",
    "/usr/lib/*-linux-gnu/libcuda.so*",
    "/sys/module/nvidia*",
    "/etc/modprobe.d/blacklist-nouveau.conf",
)


def _resolved() -> str:
    """The real ``ldconfig -p``, and for each NVIDIA or CUDA library it lists the file its
    path resolves to (the loader opens the SONAME link): ``name path target`` lines."""
    p = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False)
    lines = [f"# ldconfig -p exit {p.returncode}", *p.stdout.splitlines()]
    for line in p.stdout.splitlines():
        m = re.match(r"\s+(lib(?:nvidia|cuda)\S*) \(.*\) => (\S+)$", line)
        if m:
            lines.append(f"resolved {m[1]} {m[2]} {os.path.realpath(m[2])}")
    return "\n".join(lines) + "\n"


def _secure_boot() -> None:
    """A Trusted Launch VM with Secure Boot on, as the simulator lays it out
    (node_layout._write_firmware: the EFI variable SecureBoot = 1, lockdown integrity,
    module.sig_enforce Y), on tmpfs mounts inside the container: nspawn's /sys has no
    firmware/ and its kernel/ is the host's read-only sysfs."""
    from bootfsm.sim import node_layout
    from bootfsm.sim.nodestate import Node

    for where in ("/sys/firmware", "/sys/kernel/security"):
        if not Path(where).is_dir():
            _run("mount", "-o", "remount,rw", "/sys")
            Path(where).mkdir()
            _run("mount", "-o", "remount,ro", "/sys")
        _run("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", where)
    node_layout._write_firmware(Node(Path("/")), secure_boot=True)


# -- mirror -----------------------------------------------------------------------------
def mirror() -> int:
    from bootfsm.sim import mirror as mm
    from bootfsm.sim.node import imds_instance

    faults = {
        "checksum-mismatch": mm.Corrupt(),
        "artifact-404": mm.NotFound(),
        "http-503x3": mm.Status(503, times=3),
    }
    m = mm.Mirror(DOCROOT)
    # Mirror.start() binds an ephemeral port; the image's config names a fixed one
    server = mm.MirrorServer(("127.0.0.1", MIRROR_PORT), mm.MirrorHandler)
    server.mirror = m
    m._server = server
    # Azure's IMDS answers only a request with "Metadata: true" (bootfsm's and the CSE
    # caller's curl both send it)
    m.add_route(
        "/metadata/instance", lambda: imds_instance(Path("/")), require=("Metadata", "true")
    )
    runfile = RUNFILE_NAME.read_text().strip()
    for name in _scenario().get("mirror_faults", []):  # type: ignore[attr-defined]
        m.add_fault(runfile, faults[name])
    _notify("READY=1\nSTATUS=serving " + str(DOCROOT))
    server.serve_forever(poll_interval=0.2)
    return 0


# -- kubelet stand-in -------------------------------------------------------------------
class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        ok = self.path.split("?")[0] == "/healthz"
        body = b"ok" if ok else b"404 page not found\n"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def kubelet(argv: list[str]) -> int:
    known = ("--enable-server", "--node-labels", "--v", "--max-pods")  # kubelet's own flags
    for arg in argv:
        if arg.startswith("--") and arg.split("=", 1)[0] not in known:
            print(f"Error: unknown flag: {arg.split('=', 1)[0]}", file=sys.stderr)
            return 1
    server = ThreadingHTTPServer(("127.0.0.1", KUBELET_PORT), _Healthz)
    print(f"kubelet stand-in: serving http://127.0.0.1:{KUBELET_PORT}/healthz", flush=True)
    server.serve_forever()
    return 0


# -- dpkg lock holder -------------------------------------------------------------------
def dpkg_lock() -> int:
    seconds = float((BOOTED / "dpkg-lock-seconds").read_text())
    fd = os.open("/var/lib/dpkg/lock-frontend", os.O_RDWR | os.O_CREAT, 0o640)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    _notify("READY=1")
    print(f"booted-dpkg-lock: holding /var/lib/dpkg/lock-frontend for {seconds:g} s", flush=True)
    time.sleep(seconds)
    return 0


# -- chaos: SIGKILL mid-driver ----------------------------------------------------------
def _installer_building() -> bool:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if any(a.endswith(b"/nvidia-installer") for a in argv) and b"--dkms" in argv:
                return True
    return False


def chaos() -> int:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if _installer_building():
            time.sleep(0.5)
            # --kill-who: systemd 249 knows no other spelling (252 added --kill-whom)
            _run("systemctl", "kill", "--kill-who=main", "--signal=SIGKILL", "bootfsm.service")
            (OUT / "chaos.txt").write_text(f"killed at {time.monotonic():.3f}\n")
            print("booted-chaos: SIGKILL sent to bootfsm's main process mid-driver", flush=True)
            return 0
        time.sleep(0.1)
    (OUT / "chaos.txt").write_text("installer never seen\n")
    return 1


# -- report -----------------------------------------------------------------------------
def _out(*argv: str) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    return p.stdout + (f"\n[stderr]\n{p.stderr}" if p.stderr.strip() else "")


def _show(unit: str) -> dict[str, str]:
    text = _out("systemctl", "show", unit)
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _settled() -> bool:
    jobs = _out("systemctl", "list-jobs", "--no-legend", "--plain")
    others = [
        j
        for j in jobs.splitlines()
        if j.strip() and "booted-report" not in j and ".target " not in j
    ]
    b = _show("bootfsm.service")
    return (
        not others
        and b.get("ActiveState") in ("active", "failed", "inactive")
        and (b.get("SubState") not in ("auto-restart", "start"))
    )


def report() -> int:
    limit = float(_scenario().get("settle_timeout", 200))  # type: ignore[arg-type]
    start = time.monotonic()
    stable = 0
    while time.monotonic() - start < limit:
        stable = stable + 1 if _settled() else 0
        if stable >= 4:
            break
        time.sleep(0.5)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "settled.txt").write_text(
        f"settled={stable >= 4} after={time.monotonic() - start:.1f}\n"
        f"uptime={Path('/proc/uptime').read_text().split()[0]}\n"
    )
    for unit in REPORT_UNITS:
        name = unit.split(".")[0]
        (OUT / f"show-{name}.txt").write_text(_out("systemctl", "show", unit))
        (OUT / f"status-{name}.txt").write_text(
            _out("systemctl", "status", "--no-pager", "-l", "-n", "80", unit)
        )
    (OUT / "jobs.txt").write_text(_out("systemctl", "list-jobs", "--no-pager"))
    loaded = Path("/sys/module/nvidia/version")  # what the simulated kernel loaded
    (OUT / "sys-module-nvidia-version.txt").write_text(
        loaded.read_text() if loaded.is_file() else ""
    )
    (OUT / "journal.txt").write_text(
        _out("journalctl", "-b", "--no-pager", "-o", "short-monotonic")
    )
    # bootfsm's structured entries (bootfsm/host/journald.py): what an operator would type
    (OUT / "journal-warning.txt").write_text(
        _out("journalctl", "-b", "-u", "bootfsm", "-p", "warning", "--no-pager", "-o", "cat")
    )
    (OUT / "journal-code.txt").write_text(
        _out("journalctl", "-b", "CODE_NAME=CHECKSUM_MISMATCH", "--no-pager", "-o", "json")
    )
    (OUT / "trace.json").write_text(_out(BOOTFSM, "trace", "--json"))
    (OUT / "systemd-version.txt").write_text(_out("systemctl", "--version"))
    # the exposure score of the unit as this systemd loaded it (drop-ins included)
    (OUT / "security.txt").write_text(
        _out("systemd-analyze", "security", "--no-pager", "bootfsm.service")
    )
    # journals of runs through the provisioning hook (/var/log/azure/bootfsm), in order
    for n, path in enumerate(sorted(Path("/var/log/azure/bootfsm").glob("run-*.jsonl"))):
        shutil.copy(path, OUT / f"azure-run-{n}.jsonl")
    # the unit's own runs (log_dir), in order: their teardown events
    for n, path in enumerate(sorted(Path("/var/log/bootfsm").glob("run-*.jsonl"))):
        shutil.copy(path, OUT / f"unit-run-{n}.jsonl")
    (OUT / "ldconfig-p.txt").write_text(_resolved())
    found = sorted({p for g in PREBAKE_GLOBS for p in glob.glob(g)})
    (OUT / "prebake.txt").write_text("".join(f"{p}\n" for p in found))
    for src in ("/var/lib/bootfsm-sim/calls.jsonl", "/var/log/dpkg.log"):
        if Path(src).is_file():
            shutil.copy(src, OUT / Path(src).name)
    (OUT / "dpkg-l.txt").write_text(
        _out("dpkg-query", "-W", "-f=${db:Status-Abbrev}|${Package}|${Version}\n")
    )
    _run("systemctl", "poweroff", "--no-block")
    return 0


def main(argv: list[str]) -> int:
    cmd, rest = (argv[0], argv[1:]) if argv else ("", [])
    if cmd == "prepare":
        return prepare(rest[0])
    if cmd == "kubelet":
        return kubelet(rest)
    table = {
        "setup": setup,
        "mirror": mirror,
        "dpkg-lock": dpkg_lock,
        "chaos": chaos,
        "report": report,
    }
    if cmd not in table:
        print(f"usage: booted_node.py {{prepare SKU|kubelet|{'|'.join(table)}}}", file=sys.stderr)
        return 2
    return table[cmd]()


if __name__ == "__main__":
    threading.current_thread().name = "booted"
    sys.exit(main(sys.argv[1:]))
