#!/usr/bin/env bash
# Installs what cryptblk's build, tests and demo need, only if missing. Idempotent.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have cryptsetup || need+=(cryptsetup-bin)
have fio || need+=(fio)
have nbdkit || need+=(nbdkit)
have nbdinfo || need+=(libnbd-bin)
have nbdcopy || need+=(libnbd-bin)
have qemu-img || need+=(qemu-utils)
have qemu-io || need+=(qemu-utils)
have openssl || need+=(openssl)
have mkfs.ext4 || need+=(e2fsprogs)
have fusermount3 || need+=(fuse3)
have nbd-client || need+=(nbd-client)
have mkfs.xfs || need+=(xfsprogs)
have python3 || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
fi
if ! have cargo; then
  echo "setup: cargo not found; install Rust stable (https://rustup.rs) first" >&2
  exit 1
fi
