#!/bin/bash
# An AgentBaker-shaped CSE caller of the GPU step, for tests only (tests/test_hook.py).
#
# Its order follows Azure/AgentBaker parts/linux/cloud-init/artifacts/cse_main.sh (commit
# 007879e8cdf481cca63e96de7f9028abdd33bbd7): REBOOTREQUIRED=false; the GPU step (here the
# documented hook line, in place of ensureGPUDrivers, and of cleanUpGPUDrivers on a node
# that is no GPU node); then installKubeletKubectlAndKubeProxy (the kubelet binary into
# /usr/local/bin), ensureKubelet (it alone writes /etc/default/kubelet, then
# systemctlEnableAndStart kubelet, failing with ERR_KUBELET_START_FAIL); at the end a
# reboot when REBOOTREQUIRED. The environment is the one cse_cmd.sh gives the script
# (GPU_NODE, GPU_DRIVER_VERSION, GPU_DRIVER_TYPE, GPU_NEEDS_FABRIC_MANAGER, MIG_NODE,
# GPU_INSTANCE_PROFILE, CONFIG_GPU_DRIVER_IF_NEEDED), and cse_helpers.sh exports GPU_DV and
# NVIDIA_GPU_DRIVER_TYPE from the two driver ones, as here.
#
# The retry wrapper is shaped like cse_helpers.sh's _retrycmd_internal (commit
# 0036c27059cfe3e79d2fdee91d14c106ca22858b): each try under timeout(1), a sleep between
# tries, no new try once the CSE budget (780 s since CSE_STARTTIME_SECONDS,
# check_cse_timeout) is spent. Two deliberate differences: it returns the command's own
# exit status (the original returns 1 or 2, which would fold every outcome into one
# code), and it retries only what CSE calls a timeout.
#
# The node is a directory: files of the node are written under $ROOT, and `systemctl` is
# the one first on PATH (the simulator's, acting on that node).
#
# Usage: cse_caller.sh ROOT HOOK-COMMAND [ARG...]   (the documented `bootfsm run` line)
# Env:   the cse_cmd.sh variables above; GPU_STEP_TRIES (2), GPU_STEP_TIMEOUT (seconds per
#        try, 700), CSE_STARTTIME_SECONDS; KUBELET_CACHE (where the image keeps the kubelet
#        binary that installKubeletKubectlAndKubeProxy installs; default $ROOT/opt/kube/kubelet)
set -u
ROOT=$1
shift

# AgentBaker's codes (names and numbers from cse_helpers.sh)
ERR_SYSTEMCTL_START_FAIL=4
ERR_KUBELET_START_FAIL=34
ERR_GPU_DOWNLOAD_TIMEOUT=83
ERR_GPU_DRIVERS_START_FAIL=84
ERR_GPU_DRIVERS_INSTALL_TIMEOUT=85
ERR_GPU_DEVICE_PLUGIN_START_FAIL=86
ERR_GPU_INFO_ROM_CORRUPTED=87
CSE_BUDGET_SECONDS=780

# cse_helpers.sh
export GPU_DV="${GPU_DRIVER_VERSION:=}"
export NVIDIA_GPU_DRIVER_TYPE="${GPU_DRIVER_TYPE:=}"

cse_name() {
    case "$1" in
        "$ERR_SYSTEMCTL_START_FAIL") echo ERR_SYSTEMCTL_START_FAIL ;;
        "$ERR_KUBELET_START_FAIL") echo ERR_KUBELET_START_FAIL ;;
        "$ERR_GPU_DOWNLOAD_TIMEOUT") echo ERR_GPU_DOWNLOAD_TIMEOUT ;;
        "$ERR_GPU_DRIVERS_START_FAIL") echo ERR_GPU_DRIVERS_START_FAIL ;;
        "$ERR_GPU_DRIVERS_INSTALL_TIMEOUT") echo ERR_GPU_DRIVERS_INSTALL_TIMEOUT ;;
        "$ERR_GPU_DEVICE_PLUGIN_START_FAIL") echo ERR_GPU_DEVICE_PLUGIN_START_FAIL ;;
        "$ERR_GPU_INFO_ROM_CORRUPTED") echo ERR_GPU_INFO_ROM_CORRUPTED ;;
        *) echo UNKNOWN ;;
    esac
}

# true while the CSE budget lasts (no start time: always, as during an image build)
cse_budget_left() {
    [ -z "${CSE_STARTTIME_SECONDS:-}" ] && return 0
    [ $(($(date +%s) - CSE_STARTTIME_SECONDS)) -le "$CSE_BUDGET_SECONDS" ]
}

# retry_gpu_step TRIES PAUSE LIMIT COMMAND...: the command's last exit status
retry_gpu_step() {
    local tries=$1 pause=$2 limit=$3
    shift 3
    local i=0 status=0
    while [ "$i" -lt "$tries" ]; do
        i=$((i + 1))
        timeout "$limit" "$@"
        status=$?
        [ "$status" -eq 0 ] && break
        if ! cse_budget_left; then
            echo "caller: CSE budget spent after try $i" >&2
            break
        fi
        case "$status" in
            "$ERR_GPU_DOWNLOAD_TIMEOUT" | "$ERR_GPU_DRIVERS_INSTALL_TIMEOUT") ;;
            *) break ;;
        esac
        [ "$i" -lt "$tries" ] && sleep "$pause"
    done
    echo "caller: GPU step ran $i time(s), last exit $status" >&2
    return "$status"
}

fail() {
    echo "caller: provisioning failed: exit $1 $(cse_name "$1")"
    exit "$1"
}

# By default, never reboot new nodes.
REBOOTREQUIRED=false

# the GPU step: the hook line (bootfsm decides GPU node or not, and asks for a reboot
# by writing /run/bootfsm/reboot-required when a MIG mode change needs one)
retry_gpu_step "${GPU_STEP_TRIES:-2}" 1 "${GPU_STEP_TIMEOUT:-700}" "$@"
ret=$?
case "$ret" in
    0) ;;
    "$ERR_SYSTEMCTL_START_FAIL" | "$ERR_KUBELET_START_FAIL" | "$ERR_GPU_DOWNLOAD_TIMEOUT" | \
        "$ERR_GPU_DRIVERS_START_FAIL" | "$ERR_GPU_DRIVERS_INSTALL_TIMEOUT" | \
        "$ERR_GPU_DEVICE_PLUGIN_START_FAIL" | "$ERR_GPU_INFO_ROM_CORRUPTED")
        fail "$ret"
        ;;
    *)
        echo "caller: the GPU step exited $ret, which is not a code this caller knows"
        exit "$ret"
        ;;
esac
[ -e "$ROOT/run/bootfsm/reboot-required" ] && REBOOTREQUIRED=true
echo "caller: GPU step done, continuing with kubelet"

# installKubeletKubectlAndKubeProxy: the binaries from the image's cache
if [ ! -x "$ROOT/usr/local/bin/kubelet" ]; then
    mkdir -p "$ROOT/usr/local/bin"
    install -m 0755 "${KUBELET_CACHE:-$ROOT/opt/kube/kubelet}" "$ROOT/usr/local/bin/kubelet" ||
        fail "$ERR_KUBELET_START_FAIL"
fi

# ensureKubelet: its configuration, then systemctlEnableAndStart kubelet
mkdir -p "$ROOT/etc/default"
cat >"$ROOT/etc/default/kubelet" <<'EOF'
KUBELET_FLAGS=--node-labels=kubernetes.azure.com/role=agent --max-pods=30
KUBELET_NODE_LABELS=kubernetes.azure.com/mode=user,kubernetes.azure.com/accelerator=nvidia
EOF
systemctl enable kubelet || fail "$ERR_KUBELET_START_FAIL"
systemctl restart kubelet || fail "$ERR_KUBELET_START_FAIL"
echo "caller: kubelet started"

if $REBOOTREQUIRED; then
    echo 'reboot required, rebooting node in 1 minute'
fi
exit 0
