#!/bin/sh
# booted lane: runs INSIDE the Ubuntu node with Canonical's 580 packages installed (image/real/
# real_node.sh calls it; a non-booted container: no GPU, no
# NVIDIA kernel module). Each case's stdout, stderr and exit status go to /booted/out as
# CASE.out, CASE.err, CASE.rc; tests/booted/real_nvidia.py compares them with the
# simulator's stand-ins run the same way.
out=/booted/out
mkdir -p "$out"
run_case() {
    name=$1
    shift
    "$@" >"$out/$name.out" 2>"$out/$name.err"
    echo $? >"$out/$name.rc"
}
# fabric manager first: nvidia-smi, run as root, creates /dev/nvidiactl, which changes what
# nv-fabricmanager says afterwards
run_case fm-precheck nvidia-fabricmanager-start.sh --mode precheck
run_case fm-start nvidia-fabricmanager-start.sh --mode start
run_case fm-mode-bogus nvidia-fabricmanager-start.sh --mode bogus
# NVLink5: the simulator's InfiniBand layout of an HGX B200 (its ConnectX-7's VPD with
# SW_MNG, its port) over /sys/class; ib_umad is not loaded
mount -t tmpfs -o mode=755 tmpfs /sys/class
cp -r /booted/nvl5/sys/class/. /sys/class/
run_case fm-start-nvl5 nvidia-fabricmanager-start.sh --mode start
umount /sys/class
run_case persistenced nvidia-persistenced --verbose
run_case smi-plain nvidia-smi
run_case smi-L nvidia-smi -L
run_case smi-qx nvidia-smi -q -x
run_case smi-bogus nvidia-smi --no-such-option
run_case smi-x-alone nvidia-smi -x
run_case smi-help nvidia-smi --help
dpkg-query -W -f='${Package} ${Version}\n' nvidia-utils-580-server nvidia-compute-utils-580-server \
    nvidia-fabricmanager-580 nvidia-imex-580 >"$out/versions.txt"
dpkg -L nvidia-fabricmanager-580 >"$out/fm-files.txt"
cp /lib/systemd/system/nvidia-fabricmanager.service "$out/fm-unit.txt"
cp /usr/lib/systemd/system/nvidia-persistenced.service "$out/persistenced-unit.txt"
