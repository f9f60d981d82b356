"""Signed module package vs a real DKMS build, on this machine.

What an AKS node pays at boot on the runfile/DKMS path (AgentBaker's prebake work puts it
at 80-150 s on real nodes) against what the signed source (`driver.source =
"ubuntu-signed"`) pays: dpkg unpacking Canonical's prebuilt, signed module. Both run in
an Ubuntu 24.04 container (the booted lane's "dkms" image, tests/booted/images.py) with
Canonical's real packages (tests/booted/real_packages.py, checked against the archive's
signed indexes or pinned):

- DKMS: nvidia-kernel-source-580-server-open and nvidia-dkms-580-server-open installed
  once (dkms add), the azure kernel's real headers (linux-headers-<kernel>,
  linux-azure-headers-*); each timed run is ``dkms install -m nvidia -v <driver> -k
  <kernel> --force`` (the compile of the open module and its install), ``dkms remove``
  between runs, untimed.
- signed: each timed run is ``dpkg -i`` of linux-modules-nvidia-580-server-open-<kernel>
  (its postinst runs depmod), ``dpkg --purge`` between runs, untimed. Its only dependency
  a container cannot meet, linux-image-<kernel>, is forced.

Runs interleave (signed, DKMS, signed, DKMS, ...): 3 of each, since one compile takes
minutes on 2 cores. Needs root (systemd-nspawn). `make bench ONLY=dkms`.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "booted"))

from images import IMAGES, base_image  # noqa: E402
from real_packages import DKMS_PINNED, RELEASES, fetch, headers_packages  # noqa: E402

# 3 of each (a compile takes minutes on 2 cores); BENCH_DKMS_RUNS overrides
RUNS = int(os.environ.get("BENCH_DKMS_RUNS", "3"))
SUITE = "noble"
FIELD_S = (80.0, 150.0)
CSE_BUDGET_S = 780.0


def _cache() -> Path:
    env = os.environ.get("BOOTED_CACHE")
    return Path(env) if env else Path("/var/cache/bootfsm-booted")


def _in(root: Path, script: str, *, timeout: float = 3600) -> str:
    p = subprocess.run(
        ["systemd-nspawn", "-q", "-D", str(root), "--register=no", "--keep-unit",
         "--private-network", "--pipe", "/bin/sh", "-c", script],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"{script[:200]}: exit {p.returncode}: {(p.stdout + p.stderr)[-2000:]}")
    return p.stdout


def _timed(root: Path, command: str) -> float:
    """Seconds `command` took inside the container (clock read inside, so the
    container's own start is not counted)."""
    out = _in(root, f"set -e; a=$(date +%s%N); {command} >/tmp/last.log 2>&1; b=$(date +%s%N);"
                    " echo $((b - a))")  # fmt: skip
    return int(out.split()[-1]) / 1e9


def main() -> str:
    if os.geteuid() != 0:
        raise SystemExit(
            "bench dkms: needs root (systemd-nspawn), as make test-booted does;"
            " ONLY=engine,core,... runs the others"
        )
    rel = RELEASES[SUITE]
    img = next(i for i in IMAGES if i.suite == SUITE)
    cache = _cache()
    debs = fetch(cache, rel, DKMS_PINNED, headers_packages(cache, rel))
    base, _ = base_image(img, cache, variant="dkms")
    work = cache / "work" / "bench-dkms"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "root"
    work.mkdir(parents=True)
    subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(root)], check=True)
    (root / "debs").mkdir()
    for d in debs:
        shutil.copy(d.path, root / "debs" / f"{d.package}.deb")
    module = f"/debs/{rel.module_package}.deb"
    headers = [f"/debs/{d.package}.deb" for d in debs if d.package.startswith("linux-")]
    headers.remove(module)
    setup = [f"/debs/{d.package}.deb" for d in debs if not d.package.startswith("linux-")]
    # untimed: the user-space common package, the module source and its dkms package
    # (with no headers yet its postinst only registers the source: dkms add), then the
    # headers unpacked (their postinst would run dkms autoinstall: the first build)
    _in(
        root,
        f"dpkg -i {' '.join(setup)} >/tmp/setup.log 2>&1 && dpkg --unpack {' '.join(headers)}"
        " >>/tmp/setup.log 2>&1 || (tail -30 /tmp/setup.log; exit 1)",
    )
    status = _in(root, "dkms status")
    dkms_cmd = f"dkms install -m nvidia -v {rel.driver} -k {rel.kernel} --force"
    signed_cmd = f"dpkg -i --force-depends {module}"
    times: dict[str, list[float]] = {"signed": [], "dkms": []}
    for n in range(RUNS):
        times["signed"].append(_timed(root, signed_cmd))
        ko = _in(
            root, f"modinfo -F signer /lib/modules/{rel.kernel}/kernel/nvidia-580srv-open/nvidia.ko"
        ).strip()
        _in(root, f"dpkg --purge {rel.module_package} >/dev/null")
        print(f"bench dkms: signed run {n + 1}: {times['signed'][-1]:.2f} s", file=sys.stderr)
        times["dkms"].append(_timed(root, dkms_cmd))
        built = _in(
            root, f"modinfo -F version /lib/modules/{rel.kernel}/updates/dkms/nvidia.ko*"
        ).strip()
        _in(root, f"dkms remove -m nvidia -v {rel.driver} -k {rel.kernel} >/dev/null")
        print(
            f"bench dkms: DKMS run {n + 1}: {times['dkms'][-1]:.1f} s"
            f" (1-minute load {os.getloadavg()[0]:.1f})",
            file=sys.stderr,
        )
    gcc = _in(root, "gcc --version").splitlines()[0]
    cpu = os.cpu_count()
    load = os.getloadavg()[0]
    shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: f"{min(v):.2f}-{max(v):.2f} s" for k, v in times.items()}
    rows = [
        f"| signed: `{signed_cmd.replace(module, rel.module_package + '.deb')}` | "
        f"{med['signed']:.2f} s | {spread['signed']} | none (Canonical's, signer {ko!r}) |",
        f"| DKMS: `{dkms_cmd}` | {med['dkms']:.1f} s | {spread['dkms']} |"
        f" the open module {built}, built here, unsigned |",
    ]
    saved = med["dkms"] - med["signed"]
    return "\n".join(
        [
            "## Signed module package vs a real DKMS build (bench/bench_dkms.py)",
            "",
            f"Ubuntu 24.04 container, kernel {rel.kernel} (its real headers), NVIDIA's open"
            f" module source {rel.driver} (nvidia-kernel-source-580-server-open), {gcc};"
            f" {cpu} cores shared with other work (1-minute load {load:.1f} at the end)."
            f" {RUNS} interleaved runs of each (a compile takes minutes on 2 cores: 3 show"
            " the spread, not a distribution); median and min-max, wall time"
            " inside the container. Packages from Ubuntu's archive as the booted lane gets"
            " them (docs/testing.md: the 580.196.07 files answer 404 here, so the 1073"
            " kernel's module and 580.178.04).",
            "",
            "| path | median | spread (min-max) | compile |",
            "|---|---|---|---|",
            *rows,
            "",
            f"The signed package saves **{saved:.0f} s** per boot here"
            f" ({med['dkms'] / max(med['signed'], 0.01):.0f}x). On real nodes the DKMS"
            f" build takes {FIELD_S[0]:.0f}-{FIELD_S[1]:.0f} s (AgentBaker's prebake work),"
            f" {FIELD_S[0] / CSE_BUDGET_S:.0%}-{FIELD_S[1] / CSE_BUDGET_S:.0%} of the"
            f" {CSE_BUDGET_S:.0f} s CSE budget; dkms status before the runs:"
            f" {status.strip()!r}.",
            "",
        ]
    )


if __name__ == "__main__":
    print(main())
