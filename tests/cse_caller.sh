#!/bin/bash
# An AgentBaker-shaped CSE caller of the GPU step, for tests only (tests/test_hook.py,
# tests/test_hook_callers.py, the booted lane's booted-cse.service).
#
# It plays cse_start.sh and cse_main.sh's nodePrep as Azure/AgentBaker has them at commit
# 06836ee2301e362039418c3a7ed0fe6004a641fd (parts/linux/cloud-init/artifacts), with the
# GPU step as docs/provisioning-hook.md's "After" recipe has it, in this order:
#   cse_start.sh        CSE_STARTTIME_SECONDS (kept when given: a CSE that started earlier)
#                       and the outer `timeout -k5s ${CSE_TIMEOUT:-15m}`, counted from it
#   configureKubeletAndKubectl   kubelet's binary into /opt/bin/kubelet (the image's cache)
#   fetch_and_cache_imds_instance_metadata, should_skip_nvidia_drivers
#                       the SkipGpuDriverInstall tag of IMDS compute.tagsList, with
#                       get_imds_vm_tag_value's own jq filter
#   REBOOTREQUIRED=false
#   GPU_NODE=true and not skipped:
#                       logs_to_events "AKS.CSE.ensureGPUDrivers" <the hook line> || exit $?
#                       REBOOTREQUIRED=true when the hook asked (/run/bootfsm/reboot-required)
#                       configureManagedGPUExperience (kept; played as one line here)
#   check_cse_timeout   as the GPU step returns (what the next retrycmd_if_failure, the
#                       API server check, asks first): its error on stderr when spent
#   ensureKubelet       it alone writes /etc/default/kubelet, then starts kubelet
#                       (systemctlEnableAndStartNoBlock: `systemctl restart --no-block`;
#                       failing: ERR_KUBELET_START_FAIL)
#   cleanUpGPUDrivers   when GPU_NODE is not true or the tag said skip (played as one line)
#   the reboot          when REBOOTREQUIRED
# No retry wrapper around the hook: the recipe has none (a retrycmd_if_failure would fold
# every code into 1 or 2).
#
# The node is a directory: files of the node are written under $ROOT, and `systemctl` is
# the one first on PATH (the simulator's acting on that node, or the real one when ROOT
# is /).
#
# Usage: cse_caller.sh ROOT HOOK-COMMAND [ARG...]   (the documented `bootfsm run` line)
# Env:   what cse_cmd.sh gives the script (GPU_NODE, GPU_DRIVER_VERSION, GPU_DRIVER_TYPE,
#        GPU_NEEDS_FABRIC_MANAGER, MIG_NODE, GPU_INSTANCE_PROFILE,
#        CONFIG_GPU_DRIVER_IF_NEEDED, ENABLE_MANAGED_GPU, CSE_TIMEOUT); cse_helpers.sh
#        exports GPU_DV and NVIDIA_GPU_DRIVER_TYPE from the two driver ones, as here.
#        CSE_STARTTIME_SECONDS, CSE_MAX_DURATION_SECONDS as cse_start.sh and
#        check_cse_timeout read them. For the tests only: IMDS_URL (the instance document;
#        unset: the tag is not read), KUBELET_CACHE (the binary configureKubeletAndKubectl
#        installs; default $ROOT/opt/kube/kubelet).
set -u
ROOT=$1
shift

# cse_start.sh: the start of CSE's clock, and the outer timeout counted from it
if [ -z "${CSE_CALLER_TIMED:-}" ]; then
    export CSE_STARTTIME_SECONDS="${CSE_STARTTIME_SECONDS:-$(date +%s)}"
    outer="${CSE_TIMEOUT:-15m}"
    case "$outer" in
        *m) outer=$((${outer%m} * 60)) ;;
        *s) outer=${outer%s} ;;
    esac
    left=$((outer - ($(date +%s) - CSE_STARTTIME_SECONDS)))
    [ "$left" -lt 1 ] && left=1
    CSE_CALLER_TIMED=1 timeout -k5s "$left" /bin/bash "$0" "$ROOT" "$@"
    rc=$?
    [ "$rc" -eq 124 ] && echo "caller: killed by the outer timeout (${CSE_TIMEOUT:-15m} since CSE_STARTTIME_SECONDS)"
    exit "$rc"
fi

# AgentBaker's codes (names and numbers from cse_helpers.sh)
ERR_SYSTEMCTL_START_FAIL=4
ERR_KUBELET_START_FAIL=34
ERR_GPU_DOWNLOAD_TIMEOUT=83
ERR_GPU_DRIVERS_START_FAIL=84
ERR_GPU_DRIVERS_INSTALL_TIMEOUT=85
ERR_GPU_DEVICE_PLUGIN_START_FAIL=86
ERR_GPU_INFO_ROM_CORRUPTED=87
EVENTS_LOGGING_DIR="$ROOT/var/log/azure/Microsoft.Azure.Extensions.CustomScript/events/"
IMDS_INSTANCE_METADATA_CACHE_FILE="$ROOT/opt/azure/containers/imds_instance_metadata_cache.json"

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

fail() {
    echo "caller: provisioning failed: exit $1 $(cse_name "$1")"
    exit "$1"
}

# check_cse_timeout, as cse_helpers.sh has it (its messages on stderr)
check_cse_timeout() {
    local maxDurationSeconds=${CSE_MAX_DURATION_SECONDS:-780} elapsedSeconds
    elapsedSeconds=$(($(date +%s) - CSE_STARTTIME_SECONDS))
    if [ "$elapsedSeconds" -gt "$maxDurationSeconds" ]; then
        echo "Error: CSE has been running for $elapsedSeconds seconds, exceeding the limit of $maxDurationSeconds seconds." >&2
        return 1
    fi
    return 0
}

# logs_to_events TASK COMMAND-STRING: the guest-agent event of one step (named by its
# start time, as cse_helpers.sh names it), and the command's status
logs_to_events() {
    local task=$1
    shift
    local eventsFileName startTime endTime ret
    eventsFileName=$(date +%s%3N)
    startTime=$(date -u +"%F %T.%3N")
    "$@"
    ret=$?
    endTime=$(date -u +"%F %T.%3N")
    mkdir -p "$EVENTS_LOGGING_DIR"
    printf '{"Timestamp":"%s","OperationId":"%s","Version":"1.23","TaskName":"%s","EventLevel":"Informational","Message":"Completed: %s","EventPid":"0","EventTid":"0"}\n' \
        "$startTime" "$endTime" "$task" "$*" >"${EVENTS_LOGGING_DIR}${eventsFileName}.json"
    return "$ret"
}

# configureKubeletAndKubectl: the binary from the image's cache into /opt/bin (a node
# that has it there already, a provisioned one, keeps it)
cache="${KUBELET_CACHE:-$ROOT/opt/kube/kubelet}"
if [ -e "$cache" ] || [ ! -x "$ROOT/opt/bin/kubelet" ]; then
    mkdir -p "$ROOT/opt/bin"
    install -m 0755 "$cache" "$ROOT/opt/bin/kubelet" || fail "$ERR_KUBELET_START_FAIL"
fi

# fetch_and_cache_imds_instance_metadata, should_skip_nvidia_drivers
skip_nvidia_driver_install=false
if [ -n "${IMDS_URL:-}" ]; then
    mkdir -p "$(dirname "$IMDS_INSTANCE_METADATA_CACHE_FILE")"
    curl -fsSL -H "Metadata: true" --noproxy "*" --max-time 60 "$IMDS_URL" \
        >"$IMDS_INSTANCE_METADATA_CACHE_FILE" || fail 1
    skip_nvidia_driver_install=$(jq -r --arg name "SkipGpuDriverInstall" \
        '.compute.tagsList | map(select(.name | test($name; "i")))[0].value // "false" | test("true"; "i")' \
        "$IMDS_INSTANCE_METADATA_CACHE_FILE")
    skip_nvidia_driver_install=${skip_nvidia_driver_install,,}
fi
echo "caller: skip_nvidia_driver_install=$skip_nvidia_driver_install"

# By default, never reboot new nodes.
REBOOTREQUIRED=false

if [ "${GPU_NODE:-}" = "true" ] && [ "${skip_nvidia_driver_install}" != "true" ]; then
    # the GPU step: the hook line in place of ensureGPUDrivers (and of the fabric manager
    # and MIG blocks, which bootfsm's fabric and mig states replace)
    logs_to_events "AKS.CSE.ensureGPUDrivers" "$@"
    ret=$?
    # what check_cse_timeout (the next retrycmd's first question) says as the hook returns
    if check_cse_timeout; then
        echo "caller: check_cse_timeout passes as the GPU step returns ($(($(date +%s) - CSE_STARTTIME_SECONDS)) s of ${CSE_MAX_DURATION_SECONDS:-780})"
    fi
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
    if [ -e "$ROOT/run/bootfsm/reboot-required" ]; then REBOOTREQUIRED=true; fi
    echo "caller: GPU step done"
    echo "caller: configureManagedGPUExperience (ENABLE_MANAGED_GPU=${ENABLE_MANAGED_GPU:-})"
fi

echo "caller: continuing with kubelet"

# ensureKubelet: its configuration, then systemctlEnableAndStartNoBlock kubelet
mkdir -p "$ROOT/etc/default"
cat >"$ROOT/etc/default/kubelet" <<'EOF'
KUBELET_FLAGS=--node-labels=kubernetes.azure.com/role=agent --max-pods=30
KUBELET_REGISTER_SCHEDULABLE=true
KUBELET_NODE_LABELS=kubernetes.azure.com/mode=user,kubernetes.azure.com/accelerator=nvidia
EOF
chmod 0600 "$ROOT/etc/default/kubelet"
systemctl daemon-reload || fail "$ERR_KUBELET_START_FAIL"
systemctl restart --no-block kubelet || fail "$ERR_KUBELET_START_FAIL"
systemctl enable kubelet || fail "$ERR_KUBELET_START_FAIL"
echo "caller: kubelet started"

if [ "${GPU_NODE:-}" != "true" ] || [ "${skip_nvidia_driver_install}" = "true" ]; then
    echo "caller: cleanUpGPUDrivers (GPU_NODE=${GPU_NODE:-}, skip_nvidia_driver_install=$skip_nvidia_driver_install)"
fi

if $REBOOTREQUIRED; then
    echo 'reboot required, rebooting node in 1 minute'
fi
exit 0
