#!/bin/bash
# Read-only checks of bootfsm on a real GPU node (docs/testing.md, "A real GPU").
#
# Usage: tests/real_node/check.sh OUTDIR
#   Needs bootfsm importable by python3 (an installed wheel, or PYTHONPATH).
#
# It changes nothing on the node: it captures what the real tools print (nvidia-smi in
# its plain, -q, -q -x, --help and error forms, the kernel module's /proc and /sys files,
# the PCI functions of NVIDIA devices) into OUTDIR, with each command's exit status, then
# runs `bootfsm plan --offline` against / (detect's facts, the guards, every state's
# read-only postcondition: the driver's and verify's included) and bootfsm's parsers on
# the captured output. Nothing is downloaded, installed, loaded or started.
set -u
out=${1:?usage: check.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # bootfsm is imported with OUTDIR as the working directory
cap() { # cap NAME CMD...: stdout+stderr to OUTDIR/NAME, exit status to OUTDIR/NAME.rc
    local name=$1
    shift
    timeout 120 "$@" >"$out/$name" 2>&1
    echo $? >"$out/$name.rc"
}

cap uname.txt uname -a
cap os-release.txt cat /etc/os-release
cap smi-plain.txt nvidia-smi
cap smi-q.txt nvidia-smi -q
cap smi-qx.xml nvidia-smi -q -x
cap smi-L.txt nvidia-smi -L
cap smi-help.txt nvidia-smi --help
cap smi-bogus.txt nvidia-smi --no-such-option
cap smi-mig-lgip.txt nvidia-smi mig -lgip
cap smi-query-csv.txt nvidia-smi --query-gpu=name,pci.bus_id,driver_version,mig.mode.current,mig.mode.pending --format=csv
{
    for f in /proc/driver/nvidia/version /proc/driver/nvidia/params /sys/module/nvidia/version \
        /proc/driver/nvidia/gpus/*/information; do
        echo "== $f"
        cat "$f" 2>&1
    done
    echo "== /proc/modules (nvidia)"
    grep -E '^nvidia' /proc/modules
    echo "== /dev/nvidia*"
    ls -la /dev/nvidia* 2>&1
    echo "== PCI functions of vendor 0x10de"
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
        echo "$(basename "$d") vendor=$(cat "$d/vendor") device=$(cat "$d/device") class=$(cat "$d/class") driver=$(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null)"
    done
    echo "== /sys/class/infiniband"
    ls /sys/class/infiniband 2>&1
} >"$out/kernel.txt" 2>&1

# bootfsm's own view: the facts, guards and postconditions (no download: --offline).
os_key=$(. /etc/os-release && echo "${ID}:${VERSION_ID}")
cat >"$out/config.toml" <<EOF
[detect]
supported_os = ["ubuntu:22.04", "ubuntu:24.04", "debian:12", "$os_key"]
imds = false

[sources]
# plan --offline fetches nothing; detect only asks that the runfile be pinned
runfile_sha256 = "$(printf '0%.0s' $(seq 64))"
EOF
(cd "$out" && python3 -m bootfsm plan --root / --config "$out/config.toml" --offline --json >plan.json 2>plan.stderr)
echo $? >"$out/plan.rc"

(cd "$out" && python3 - "$out" >parsed.txt 2>&1) <<'EOF'
import sys
from dataclasses import asdict
from pathlib import Path

from bootfsm.parsers.nvidia_smi import classify_smi_failure
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml

out = Path(sys.argv[1])
for name, parse in (("smi-qx.xml", parse_smi_xml),):  # bootfsm reads only -q -x
    try:
        print(f"{name}: {asdict(parse((out / name).read_text(errors='replace')))}")
    except Exception as exc:  # a parser refusing the real output is what this looks for
        print(f"{name}: {type(exc).__name__}: {exc}")
for name in ("smi-plain.txt", "smi-q.txt", "smi-qx.xml", "smi-bogus.txt"):
    print(f"{name}: classify_smi_failure -> {classify_smi_failure((out / name).read_text(errors='replace'))}")
EOF
echo $? >"$out/parsed.rc"
