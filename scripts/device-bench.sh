#!/usr/bin/env bash
# A benchmark on a machine without Ceph, fio, qemu-nbd or nbdkit of its own (the lent device
# machine), from target/device-bundle.tar.xz (scripts/device-bundle.sh, run here first;
# carry target/device-bundle.tar.xz with the call), each side on CPUs of its own:
#   rbd     scripts/bench-rbd.sh: the cluster on the upper half of the CPUs, fio, cryptblk
#           and rbd_load on the lower half (CLUSTER_CPUS, CLIENT_CPUS)
#   remote  scripts/bench-remote.sh: fio on the first quarter, cryptblk on the next third,
#           the remote server on the rest (CLIENT_CPUS, SERVER_CPUS, REMOTE_CPUS)
# ROUNDS as in those scripts, 2 by default here.
# usage: scripts/device-bench.sh rbd|remote [runtime_s]
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?usage: device-bench.sh rbd|remote [runtime_s]}; RT=${2:-5}
[ -f target/device-bundle.tar.xz ] ||
  { echo "target/device-bundle.tar.xz missing: run scripts/device-bundle.sh and carry it" >&2; exit 1; }
X=$(mktemp -d /tmp/cryptblk-bundle.XXXXXX)
trap 'rm -rf "$X"' EXIT
tar -C "$X" -xJf target/device-bundle.tar.xz
# shellcheck source=/dev/null
source "$X/env.sh"
export ROUNDS=${ROUNDS:-2}
n=$(nproc)
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) ($n CPUs)"
case $what in
  rbd)
    h=$((n / 2))
    CLUSTER_CPUS=${CLUSTER_CPUS:-$h-$((n - 1))} CLIENT_CPUS=${CLIENT_CPUS:-0-$((h - 1))} \
      bash scripts/bench-rbd.sh "$RT" ;;
  remote)
    q=$((n / 4)); t=$((q + (n - q) / 2))
    CLIENT_CPUS=${CLIENT_CPUS:-0-$((q - 1))} SERVER_CPUS=${SERVER_CPUS:-$q-$((t - 1))} \
      REMOTE_CPUS=${REMOTE_CPUS:-$t-$((n - 1))} bash scripts/bench-remote.sh "$RT" ;;
  *) echo "usage: device-bench.sh rbd|remote [runtime_s]" >&2; exit 2 ;;
esac
