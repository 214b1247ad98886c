#!/usr/bin/env bash
# A benchmark on a machine without Ceph, fio, qemu-nbd or nbdkit of its own (the lent device
# machine), from target/device-bundle.tar.xz (scripts/device-bundle.sh, run here first;
# carry target/device-bundle.tar.xz with the call), each side on CPUs of its own, taken in
# order from the CPUs this process may use:
#   rbd     scripts/bench-rbd.sh: the cluster on the second half, fio, cryptblk and
#           rbd_load on the first (CLUSTER_CPUS, CLIENT_CPUS); at least 2 CPUs unless both
#           lists are given
#   remote  scripts/bench-remote.sh: fio on the first quarter, cryptblk on half of the
#           rest, the remote server on the others (CLIENT_CPUS, SERVER_CPUS,
#           REMOTE_CPUS); at least 4 CPUs unless all three lists are given
# ROUNDS as in those scripts, 2 by default here. Images go to /dev/shm, or to a fresh
# private directory in /tmp when /dev/shm has less than 4 GiB free.
# usage: scripts/device-bench.sh rbd|remote [runtime_s]
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: device-bench.sh rbd|remote [runtime_s]" >&2; exit 2; }
what=${1:-}; RT=${2:-5}
[ -f target/device-bundle.tar.xz ] ||
  { echo "target/device-bundle.tar.xz missing: run scripts/device-bundle.sh and carry it" >&2; exit 1; }
X=$(mktemp -d /tmp/cryptblk-bundle.XXXXXX)
trap 'rm -rf "$X"' EXIT
if command -v xz >/dev/null; then
  tar -C "$X" -xJf target/device-bundle.tar.xz
else
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    target/device-bundle.tar.xz "$X"
fi
# shellcheck source=/dev/null
source "$X/env.sh"
export ROUNDS=${ROUNDS:-2}
mapfile -t cpus < <(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)), sep="\n")')
n=${#cpus[@]}
list() { local IFS=,; echo "${cpus[*]:$1:$2}"; } # CPUs $1 .. $1+$2-1, as a taskset list
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) ($n CPUs usable)"
if [ -z "${PEER_DIR:-}" ] && [ "$(df --output=avail -k /dev/shm | tail -1)" -lt $((4 << 20)) ]; then
  # A fresh private directory (mktemp: 0700), never one another user could have made.
  PEER_DIR=$(mktemp -d /tmp/cryptblk-peer.XXXXXX); export PEER_DIR
  trap 'rm -rf "$X" "$PEER_DIR"' EXIT
fi
case $what in
  rbd)
    [ "$n" -ge 2 ] || { [ -n "${CLUSTER_CPUS:-}" ] && [ -n "${CLIENT_CPUS:-}" ]; } ||
      { echo "rbd needs at least 2 CPUs (or CLUSTER_CPUS and CLIENT_CPUS)" >&2; exit 1; }
    h=$((n / 2))
    CLUSTER_CPUS=${CLUSTER_CPUS:-$(list "$h" $((n - h)))} CLIENT_CPUS=${CLIENT_CPUS:-$(list 0 "$h")} \
      bash scripts/bench-rbd.sh "$RT" ;;
  remote)
    [ "$n" -ge 4 ] || { [ -n "${CLIENT_CPUS:-}" ] && [ -n "${SERVER_CPUS:-}" ] && [ -n "${REMOTE_CPUS:-}" ]; } ||
      { echo "remote needs at least 4 CPUs (or CLIENT_CPUS, SERVER_CPUS and REMOTE_CPUS)" >&2; exit 1; }
    q=$((n / 4)); s=$(((n - q) / 2))
    CLIENT_CPUS=${CLIENT_CPUS:-$(list 0 "$q")} SERVER_CPUS=${SERVER_CPUS:-$(list "$q" "$s")} \
      REMOTE_CPUS=${REMOTE_CPUS:-$(list $((q + s)) $((n - q - s)))} bash scripts/bench-remote.sh "$RT" ;;
  *) usage ;;
esac
