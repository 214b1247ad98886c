#!/bin/bash
# Guest stage 2, PID 1 in the overlay of the host's root: the usual mounts, the cached
# kernel's modules at /lib/modules/$(uname -r), then /job/command with its output on
# /dev/hvc0 (the host's stdout), /job/started marking its start. Its exit status goes to /job/status; then power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LC_ALL=C.UTF-8 TERM=dumb DM_DISABLE_UDEV=1
set -a
. /job/env
set +a
mount -t tmpfs -o mode=1777 tmp /tmp
mount -t tmpfs -o mode=0755 run /run
mkdir -p /dev/pts /dev/shm /run/lock /run/cryptsetup "/lib/modules/$VM_KVER"
mount -t devpts devpts /dev/pts
mount -t tmpfs shm /dev/shm
mount --bind "$VM_MODULES_DIR" "/lib/modules/$VM_KVER"
hostname cryptblk-vm
for m in $VM_LOAD; do modprobe -q "$m" 2>/dev/null || true; done
out=/dev/hvc0
stty -F "$out" raw -echo 2>/dev/null
cd "${VM_RESULTS:-/tmp}"
: > /job/started # from here on a failure is the command's (vm.sh boots again only before)
bash /job/command > "$out" 2>&1 < /dev/null
echo $? > /job/status
sync
umount /results /job 2>/dev/null
echo o > /proc/sysrq-trigger
sleep 30
