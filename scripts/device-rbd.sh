#!/usr/bin/env bash
# The RBD benchmark (scripts/bench-rbd.sh) on a machine without Ceph or fio of its own (the
# lent device machine), from target/device-bundle.tar.xz (scripts/device-bundle.sh, run
# here first; carry target/device-bundle.tar.xz with the call). The cluster and the clients
# get CPUs of their own: by default the upper half of the CPUs for the cluster, the lower
# half for fio, cryptblk and rbd_load (CLUSTER_CPUS, CLIENT_CPUS and ROUNDS as in
# bench-rbd.sh; ROUNDS defaults to 2 here).
# usage: scripts/device-rbd.sh [runtime_s]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f target/device-bundle.tar.xz ] ||
  { echo "target/device-bundle.tar.xz missing: run scripts/device-bundle.sh and carry it" >&2; exit 1; }
X=$(mktemp -d /tmp/cryptblk-bundle.XXXXXX)
trap 'rm -rf "$X"' EXIT
tar -C "$X" -xJf target/device-bundle.tar.xz
# shellcheck source=/dev/null
source "$X/env.sh"
n=$(nproc); half=$((n / 2))
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) ($n CPUs)"
CLUSTER_CPUS=${CLUSTER_CPUS:-$half-$((n - 1))} CLIENT_CPUS=${CLIENT_CPUS:-0-$((half - 1))} \
  ROUNDS=${ROUNDS:-2} bash scripts/bench-rbd.sh "${1:-5}"
