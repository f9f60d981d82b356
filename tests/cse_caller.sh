#!/bin/bash
# An AgentBaker-style CSE caller of the GPU step, for tests only (tests/test_hook.py).
#
# Its shape follows Azure/AgentBaker parts/linux/cloud-init/artifacts/cse_helpers.sh
# (commit 0036c27059cfe3e79d2fdee91d14c106ca22858b): a retry wrapper that runs each try
# under timeout(1), sleeps between tries and stops early when the CSE budget (780 s since
# CSE_STARTTIME_SECONDS, its check_cse_timeout) is spent, and cse_main.sh's handling of
# ensureGPUDrivers (`|| exit` with an ERR_* code). Two deliberate differences: the wrapper
# returns the command's own exit status (the original returns 1 or 2, which would fold
# every outcome into one code), and it retries only what CSE calls a timeout.
#
# Usage: cse_caller.sh HOOK-COMMAND [ARG...]   (the documented `bootfsm run ...` line)
# Env:   GPU_STEP_TRIES (2), GPU_STEP_TIMEOUT (seconds per try, 700), CSE_STARTTIME_SECONDS
set -u

# AgentBaker's codes (names and numbers from cse_helpers.sh)
ERR_SYSTEMCTL_START_FAIL=4
ERR_KUBELET_START_FAIL=34
ERR_GPU_DOWNLOAD_TIMEOUT=83
ERR_GPU_DRIVERS_START_FAIL=84
ERR_GPU_DRIVERS_INSTALL_TIMEOUT=85
ERR_GPU_DEVICE_PLUGIN_START_FAIL=86
ERR_GPU_INFO_ROM_CORRUPTED=87
CSE_BUDGET_SECONDS=780

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

ensureGPUDrivers() {
    retry_gpu_step "${GPU_STEP_TRIES:-2}" 1 "${GPU_STEP_TIMEOUT:-700}" "$@"
}

ensureGPUDrivers "$@"
ret=$?
case "$ret" in
    0)
        echo "caller: GPU step done, continuing with kubelet"
        ;;
    "$ERR_SYSTEMCTL_START_FAIL" | "$ERR_KUBELET_START_FAIL" | "$ERR_GPU_DOWNLOAD_TIMEOUT" | \
        "$ERR_GPU_DRIVERS_START_FAIL" | "$ERR_GPU_DRIVERS_INSTALL_TIMEOUT" | \
        "$ERR_GPU_DEVICE_PLUGIN_START_FAIL" | "$ERR_GPU_INFO_ROM_CORRUPTED")
        echo "caller: provisioning failed: exit $ret $(cse_name "$ret")"
        exit "$ret"
        ;;
    *)
        echo "caller: the GPU step exited $ret, which is not a code this caller knows"
        exit "$ret"
        ;;
esac
