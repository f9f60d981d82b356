#!/bin/sh
# booted lane: runs INSIDE the booted node (real-report.service)
out=/booted/out
systemctl is-system-running --wait >"$out/system-running.txt" 2>&1
for u in nvidia-persistenced nvidia-fabricmanager nvidia-imex bootfsm kubelet; do
    systemctl show "$u.service" >"$out/show-$u.txt" 2>&1
    systemctl status --no-pager -l -n 20 "$u.service" >"$out/status-$u.txt" 2>&1
    systemctl cat "$u.service" >"$out/unit-$u.txt" 2>&1
done
journalctl -b --no-pager -o short-monotonic >"$out/journal.txt" 2>&1
systemctl --version >"$out/systemd-version.txt"
systemctl poweroff --no-block
