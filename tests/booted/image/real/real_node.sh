#!/bin/sh
# booted lane: runs INSIDE the Ubuntu node image in a non-booted container (no GPU, the
# host's kernel, no NVIDIA module loaded): installs Canonical's real packages from
# /booted/debs with the image's dpkg (their maintainer scripts run), then records what the
# installed files and systemd say into /booted/out. tests/booted/real_node.py asserts on it.
# $1: the azure kernel release the signed module package is built for.
kernel=$1
out=/booted/out
mkdir -p "$out"
rec() {
    name=$1
    shift
    "$@" >"$out/$name.out" 2>"$out/$name.err"
    echo $? >"$out/$name.rc"
}
# the driver's user-space and the packaged daemons: every dependency is in the image
rec dpkg-user dpkg -i /booted/debs/user/*.deb
# the signed module package depends on linux-image-$kernel (or -unsigned): a container runs
# the host's kernel, so dpkg refuses first (recorded), then configures it with only that
# dependency forced (its postinst runs depmod -a $kernel)
rec dpkg-module dpkg -i /booted/debs/module/*.deb
rec dpkg-module-forced dpkg --force-depends --configure -a
rec dpkg-audit dpkg --audit
dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\n' >"$out/dpkg-l.txt"
# the module file the package installed, read by kmod's modinfo (the signature appended to
# the file: its PKCS#7 signer, key id and hash)
find "/lib/modules/$kernel" -name 'nvidia.ko*' >"$out/ko-path.txt"
ko=$(head -n 1 "$out/ko-path.txt")
for f in signer sig_key sig_hashalgo version vermagic; do
    rec "modinfo-$f" modinfo -F "$f" "$ko"
done
rec smi-version nvidia-smi --version
rec smi-help-first nvidia-smi --help
# the packaged units and bootfsm's and kubelet's, checked by this systemd
rec verify systemd-analyze verify nvidia-persistenced.service nvidia-fabricmanager.service \
    nvidia-imex.service bootfsm.service kubelet.service
getent passwd nvidia-persistenced >"$out/user-persistenced.txt"
# the comparisons with the simulator's stand-ins (tests/booted/real_nvidia.py)
sh /booted/real_nvidia.sh
