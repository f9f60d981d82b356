"""The simulated node's systemd units: unit files, enablement, state, start and stop.

:class:`NodeUnits` adds to :class:`nodestate_driver.NodeDriver` what systemctl sees:
unit files in the systemd search path (:data:`UNIT_DIRS`), ``[Install]`` sections and
their enable links, masking, the active state under ``run/`` (cleared by a reboot), and
the start failures of the units the driver stack brings (nvidia-persistenced, fabric
manager; each message cites the capture or source it follows).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from bootfsm.sim.nodestate_base import IB_PORT_GUID, RUN_DIR, UNIT_JOURNAL
from bootfsm.sim.nodestate_driver import NodeDriver

__all__ = ["CDI_REFRESH", "DEVICE_UNITS", "FABRIC_MANAGER", "NVLSM", "UNIT_DIRS", "UNIT_JOURNAL",
           "NodeUnits", "unit_name"]  # fmt: skip

UNIT_DIRS = (
    "etc/systemd/system",
    "run/systemd/system",
    "lib/systemd/system",
    "usr/lib/systemd/system",
)
_UNIT_SUFFIXES = frozenset(
    {"service", "socket", "target", "path", "timer", "mount", "device", "slice", "scope"}
)
FABRIC_MANAGER = "nvidia-fabricmanager.service"
NVLSM = "nvlsm.service"
_FM_CMD = "/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg"
CDI_REFRESH = "nvidia-cdi-refresh.service"
_NVLSM_BIN = "/opt/nvidia/nvlsm/sbin/nvlsm"
_NVLSM_INSTALL = 'Please make sure to install "Nvidia NVLink Subnet Manager"(nvlsm) package.'
_NOTHING_TO_DO = (
    "request to query NVSwitch device information from NVSwitch driver failed with"
    " error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]"
)


DEVICE_UNITS = ("nvidia-persistenced.service", FABRIC_MANAGER, "nvidia-imex.service")
"""Units whose daemon keeps /dev/nvidia* open while it runs, so the nvidia module is in
use: NVIDIA's driver container stops the persistence daemon and fabric manager (and
IMEX) before it unloads the modules (NVIDIA/gpu-driver-container, nvidia-driver
``_unload_driver``), and nvidia-persistenced's whole job is to hold the devices open
(NVIDIA/nvidia-persistenced README)."""


def unit_name(arg: str) -> str:
    """Normalise a unit argument: "containerd" -> "containerd.service"."""
    if "." in arg and arg.rsplit(".", 1)[1] in _UNIT_SUFFIXES:
        return arg
    return f"{arg}.service"


class NodeUnits(NodeDriver):
    """A node with its units (see the module docstring)."""

    def is_masked(self, unit: str) -> bool:
        """A /dev/null symlink for the unit in etc/ or run/systemd/system."""
        for base in ("etc/systemd/system", "run/systemd/system"):
            path = self.p(f"{base}/{unit}")
            if path.is_symlink() and os.readlink(path) == "/dev/null":
                return True
        return False

    def unit_file(self, unit: str) -> str | None:
        """Node path of the unit file systemd would load (masks ignored), or None."""
        for base in UNIT_DIRS:
            path = self.p(f"{base}/{unit}")
            if path.is_symlink() and os.readlink(path) == "/dev/null":
                continue
            if path.is_file() or path.is_symlink():
                return f"/{base}/{unit}"
        return None

    def _read_in_root(self, node_path: str) -> str | None:
        """Read a node file, following symlinks inside the root (never onto the host)."""
        path = self.p(node_path)
        for _ in range(8):
            if not path.is_symlink():
                break
            target = os.readlink(path)
            path = self.p(target) if target.startswith("/") else path.parent / target
        try:
            return path.read_text()
        except OSError:
            return None

    def _section(self, unit: str, name: str) -> dict[str, list[str]]:
        """One section's keys of a unit file, each key's values in file order."""
        node_path = self.unit_file(unit)
        text = self._read_in_root(node_path) if node_path else None
        keys: dict[str, list[str]] = {}
        section = ""
        for raw in (text or "").splitlines():
            line = raw.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
            elif section == name and "=" in line:
                key, value = line.split("=", 1)
                keys.setdefault(key.strip(), []).extend(value.split())
        return keys

    def _install_section(self, unit: str) -> dict[str, list[str]]:
        """[Install] keys of a unit file (WantedBy=, RequiredBy=, Alias=)."""
        return self._section(unit, "Install")

    def _unmet_condition(self, unit: str) -> str | None:
        """Why the unit's ConditionPathExists= checks fail, as systemd names it, or None
        (systemd.unit(5); only this condition is modelled): every plain one must hold
        ("!" negates) and, when there are triggering ones ("|" prefix), at least one."""
        plain: list[tuple[str, bool]] = []
        triggers: list[tuple[str, bool]] = []
        for value in self._section(unit, "Unit").get("ConditionPathExists", []):
            check = value.removeprefix("|")
            path, negate = check.removeprefix("!"), check.startswith("!")
            holds = self.p(path.lstrip("/")).exists() != negate
            (triggers if value.startswith("|") else plain).append((value, holds))
        for value, holds in plain:
            if not holds:
                return f"ConditionPathExists={value}"
        if triggers and not any(holds for _, holds in triggers):
            return "no trigger condition checks were met"
        return None

    def _missing_environment_file(self, unit: str) -> str | None:
        """An EnvironmentFile= without the "-" prefix that does not exist (systemd.exec(5):
        then the unit fails to start), or None."""
        for value in self._section(unit, "Service").get("EnvironmentFile", []):
            if not value.startswith("-") and not self.p(value.lstrip("/")).is_file():
                return value
        return None

    def wanted_by(self, unit: str) -> list[str]:
        """Targets whose .wants/ gets the unit's enable symlink (empty: static unit)."""
        install = self._install_section(unit)
        return install.get("WantedBy", []) + install.get("RequiredBy", [])

    def enable_links(self, unit: str) -> list[Path]:
        """Existing enable symlinks of the unit under etc/systemd/system/*.{wants,requires}.

        The links point at node-absolute paths, so they dangle from the host's view:
        existence is tested with lexists.
        """
        base = self.p("etc/systemd/system")
        if not base.is_dir():
            return []
        dirs = [d for d in base.iterdir() if d.name.endswith((".wants", ".requires"))]
        return sorted(d / unit for d in dirs if os.path.lexists(d / unit))

    def is_enabled(self, unit: str) -> bool:
        """Whether an enable symlink exists (and the unit is not masked)."""
        return not self.is_masked(unit) and bool(self.enable_links(unit))

    def enabled_units(self) -> list[str]:
        """Every unit with an enable symlink, sorted."""
        base = self.p("etc/systemd/system")
        if not base.is_dir():
            return []
        dirs = [d for d in base.iterdir() if d.name.endswith((".wants", ".requires"))]
        return sorted({link.name for d in dirs if d.is_dir() for link in d.iterdir()})

    def nvidia_users(self) -> list[str]:
        """What keeps the nvidia module in use (its refcount), by name: the modules
        holding it (/sys/module/nvidia/holders), the active daemons of DEVICE_UNITS and
        the other processes with a /dev/nvidia* file open."""
        holders = self.p("sys/module/nvidia/holders")
        users = sorted(h.name for h in holders.iterdir()) if holders.is_dir() else []
        users += [u for u in DEVICE_UNITS if self.unit_state(u) == "active"]
        return users + [f"{comm} (pid {pid})" for pid, comm in self.device_processes()]

    def unit_state(self, unit: str) -> str:
        """active, failed or inactive."""
        if self.p(f"{RUN_DIR}/active/{unit}").exists():
            return "active"
        if self.p(f"{RUN_DIR}/failed/{unit}").exists():
            return "failed"
        return "inactive"

    def set_unit_state(self, unit: str, state: str) -> None:
        """Record active / failed / inactive for a unit."""
        for kind in ("active", "failed"):
            if kind == state:
                self.write(f"{RUN_DIR}/{kind}/{unit}", f"{time.time():.3f}\n")
            else:
                self.remove(f"{RUN_DIR}/{kind}/{unit}")

    def cdi_problem(self) -> str | None:
        """Why `nvidia-ctk cdi generate` fails here, as it logs it (msg=), or None: no
        driver or NVML, or (MIG mode on with no MIG instances, no other GPU) no device at
        all, "invalid device, empty device edits" (kaito-project/kaito#2326 quotes
        nvidia-ctk 1.19.1 on an AKS A100; Azure/AgentBaker #8736)."""
        if self.fault("cdi-fails") or self.loaded_module() is None or self.nvml_version() is None:
            return (
                "failed to generate CDI spec: failed to create device CDI specs:"
                " failed to initialize NVML: ERROR_UNKNOWN"
            )
        devices = [
            a for a, _d in self.visible_gpus() if not self.mig_mode(a)[0] or self.mig_instances(a)
        ]
        if not devices:
            return "failed to generate CDI spec: invalid device, empty device edits"
        return None

    def invocation(self, unit: str) -> str:
        """The InvocationID of the unit's last start ("" before any)."""
        return (self.read(f"{RUN_DIR}/invocation/{unit}") or "").strip()

    def unit_journal(self, unit: str, messages: list[str]) -> None:
        """Journal entries a unit's processes wrote in this invocation (stdout/stderr
        lines carry _SYSTEMD_UNIT and _SYSTEMD_INVOCATION_ID: systemd.journal-fields(7))."""
        path = self.p(UNIT_JOURNAL)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            for message in messages:
                entry = {"_SYSTEMD_UNIT": unit, "_SYSTEMD_INVOCATION_ID": self.invocation(unit),
                         "MESSAGE": message}  # fmt: skip
                fh.write(json.dumps(entry) + "\n")

    def start_unit(self, unit: str, verb: str = "start") -> tuple[int, str]:
        """Start (or restart) a unit as systemctl would: (exit code, stderr text)."""
        if self.is_masked(unit):
            return 1, f"Failed to {verb} {unit}: Unit {unit} is masked.\n"
        if self.unit_file(unit) is None:
            return 5, f"Failed to {verb} {unit}: Unit {unit} not found.\n"
        unmet = self._unmet_condition(unit)
        if unmet is not None:  # the job succeeds, the unit stays as it was (systemd.unit(5))
            why = unmet if unmet.startswith("no ") else f"of an unmet condition check ({unmet})"
            title = " ".join(self._section(unit, "Unit").get("Description", [])) or unit
            self.journal(f"systemd[1]: {unit} - {title} was skipped because {why}.")  # 252+
            return 0, ""
        self.write(f"{RUN_DIR}/invocation/{unit}", uuid.uuid4().hex + "\n")
        env_file = self._missing_environment_file(unit)
        if env_file is not None:  # systemd's words: src/core/execute.c, src/core/service.c
            self.set_unit_state(unit, "failed")
            self.journal(
                f"systemd[1]: {unit}: Failed to load environment files: No such file or directory"
            )
            self.journal(
                f"systemd[1]: {unit}: Failed to run 'start' task: No such file or directory"
            )
            self.journal(f"systemd[1]: {unit}: Failed with result 'resources'.")
            return 1, (
                f"Job for {unit} failed because of unavailable resources or another system error.\n"
                f'See "systemctl status {unit}" and "journalctl -xeu {unit}" for details.\n'
            )
        reason = self._start_failure(unit, verb)
        if reason is not None:
            self.set_unit_state(unit, "failed")
            self.journal(f"{unit.removesuffix('.service')}: {reason}")
            self.journal(
                f"systemd[1]: {unit}: Control process exited, code=exited, status=1/FAILURE"
            )
            return 1, (
                f"Job for {unit} failed because the control process exited with error code.\n"
                f'See "systemctl status {unit}" and "journalctl -xeu {unit}" for details.\n'
            )
        self.set_unit_state(unit, "active")
        if unit == FABRIC_MANAGER and self.nvlink5():
            self.set_unit_state(NVLSM, "active")
        self.journal(f"systemd[1]: Started {unit}.")
        return 0, ""

    def _start_failure(self, unit: str, verb: str) -> str | None:
        """Why starting this unit fails on this node, or None when it starts."""
        if unit == FABRIC_MANAGER:
            return self.fabric_manager_failure()
        if unit == NVLSM and not self.nvlink5():
            return "no NVLink5 switch-management port found"
        if unit == "nvidia-persistenced.service":
            return self.persistenced_failure()
        if unit == "nvidia-imex.service" and self.loaded_module() is None:
            return "IMEX failed to open the NVIDIA driver: driver not loaded"
        if unit == CDI_REFRESH:  # ExecStart=/usr/bin/nvidia-ctk cdi generate (toolkit 1.18)
            problem = self.cdi_problem()
            if problem is not None:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                self.unit_journal(unit, [f'time="{stamp}" level=error msg="{problem}"'])
            return problem
        if (
            unit == "containerd.service"
            and verb == "restart"
            and self.fault("containerd-restart-fails")
        ):
            return "failed to load TOML: /etc/containerd/config.toml: invalid plugin configuration"
        return None

    def persistenced_failure(self) -> str | None:
        """Why nvidia-persistenced.service does not start, or None. References: systemd
        exits 203/EXEC when ExecStart's binary is missing; NVIDIA/nvidia-persistenced's
        nvidia-persistenced.c prints "nvidia-persistenced failed to initialize. Check
        syslog for more details." when the daemon cannot open the devices (a real
        journal shows it after "Please ensure that the NVIDIA device files (/dev/nvidia*)
        exist")."""
        if not self.p("usr/bin/nvidia-persistenced").exists():
            return "Failed to execute /usr/bin/nvidia-persistenced: No such file or directory"
        if self.loaded_module() is None or not self.p("dev/nvidiactl").exists():
            return "nvidia-persistenced failed to initialize. Check syslog for more details."
        return None

    def fabric_manager_failure(self) -> str | None:
        """Why fabric manager cannot start here, or None: the start script's NVLink5
        checks (ib_umad loaded, NVLSM installed), then the daemon's (the driver, then
        the switches). The wording is what nvidia-fabricmanager-start.sh and
        nv-fabricmanager 580.196.07 print (Ubuntu's nvidia-fabricmanager-580, run by the
        booted lane's comparisons, tests/booted/real_nvidia.py)."""
        if self.nvlink5() and not self.p("sys/module/ib_umad").exists():
            return 'Kernel module "ib_umad" has not been loaded, fabric manager cannot be started'
        if self.nvlink5() and not self.p("opt/nvidia/nvlsm/sbin/nvlsm").exists():
            return f'"{_NVLSM_BIN}" does not exist. {_NVLSM_INSTALL}'
        if self.loaded_module() is None:
            return "failed to allocate handle (client) to NVIDIA GPU driver"
        if not self.nvswitches() and not self.nvlink5():
            return _NOTHING_TO_DO
        return None

    def fabric_start_script(self, mode: str = "start") -> tuple[int, str, str]:
        """nvidia-fabricmanager-start.sh --mode MODE: (exit code, stdout, stderr), as the
        580.196.07 script answers (see fabric_manager_failure).

        ``precheck`` only waits for an InfiniBand device when an NVLink5 adapter is
        there (printing that it polls) and exits 0: it checks neither ib_umad, NVLSM nor
        the driver. ``start`` detects NVLink5 from the InfiniBand VPD (SW_MNG) and the
        port ibstat shows, checks ib_umad and NVLSM, starts NVLSM, then the daemon; the
        script's lines go to stdout, the daemon's error to stderr. Any other mode does
        nothing and exits 0. Run by hand, the script starts the daemons outside systemd:
        the unit stays as it was (``start_unit`` runs it as ExecStartPre/ExecStart)."""
        if mode == "precheck":
            polling = "Polling for at least one Infiniband device before starting Fabric Manager..."
            return 0, polling + "\n" if self.nvlink5() else "", ""
        if mode != "start":
            return 0, "", ""
        if self.nvlink5():
            out = (
                f"Checking mlx5_0...\nUsing device mlx5_0, port {IB_PORT_GUID}\n"
                "Detected NVL5+ system\n"
            )
        else:
            out = "Detected Pre-NVL5 system\n"
        reason = self.fabric_manager_failure()
        if reason is not None and reason.startswith("Kernel module"):
            return (
                1,
                f'{out}{reason}\nPlease run "modprobe ib_umad" before starting fabric manager\n',
                "",
            )
        if reason is not None and reason.startswith(f'"{_NVLSM_BIN}"'):
            return 1, f"{out}{reason}\n", ""
        if self.nvlink5():
            out += 'Started "Nvidia NVLink Subnet Manager"\n'
        if reason is not None:
            return 1, f'{out}"{_FM_CMD}" failed! Exit code: 1\n', reason + "\n"
        self.write(f"{RUN_DIR}/fm-daemon", "started by nvidia-fabricmanager-start.sh\n")
        return 0, out + 'Started "Nvidia Fabric Manager"\n', ""

    def stop_unit(self, unit: str, verb: str = "stop") -> tuple[int, str]:
        """Stop a unit: (exit code, stderr text)."""
        if self.unit_file(unit) is None and self.unit_state(unit) == "inactive":
            return 5, f"Failed to {verb} {unit}: Unit {unit} not loaded.\n"
        self.set_unit_state(unit, "inactive")
        if unit == FABRIC_MANAGER:
            self.set_unit_state(NVLSM, "inactive")
        return 0, ""
