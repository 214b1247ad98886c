#!/usr/bin/env bash
# cryptblk's VM harness: boots Debian's stock kernel in a throwaway QEMU guest whose root
# is this host's / (read-only over 9p, with a tmpfs overlay for writes), runs a shell
# command in it as root and exits with the command's status. Kernel features the host may
# lack (dm-crypt, loop, nbd, ublk) are there, and so are the host's tools and our binary.
#
#   tests/vm/vm.sh setup              install QEMU etc., fetch + unpack the kernel, build
#                                     the initramfs (idempotent; needs root and apt)
#   tests/vm/vm.sh run [-r DIR] CMD   boot, run CMD (output streamed), power off; DIR is
#                                     writable in the guest as /results (and the cwd)
#   tests/vm/vm.sh info               what is cached
#
# Settings (environment): CRYPTBLK_VM_CACHE (default /var/cache/cryptblk-vm; never inside
# the repository), CRYPTBLK_VM_KERNEL (a linux-image-* package; default the newest
# *-amd64 one apt knows), CRYPTBLK_VM_MEM (4G), CRYPTBLK_VM_CPUS (2), CRYPTBLK_VM_TIMEOUT
# (seconds, 1800), CRYPTBLK_VM_ACCEL (auto|kvm|tcg), CRYPTBLK_VM_DEBUG=1 (kernel log),
# CRYPTBLK_VM_TPM=1 (a TPM 2.0 in the guest: QEMU's tpm-tis over a host swtpm, fresh for
# each run; /dev/tpmrm0 there), CRYPTBLK_VM_VHOST_USER_BLK="SOCKET[:QUEUES] ..." (a
# vhost-user-blk disk per socket, served on the host, /dev/vda... in the guest in that
# order; QEMU reconnects to a socket whose server was replaced; guest memory then lives in
# a shared memfd, as vhost-user needs).
set -euo pipefail

SELF_DIR=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
CACHE=${CRYPTBLK_VM_CACHE:-/var/cache/cryptblk-vm}
MEM=${CRYPTBLK_VM_MEM:-4G}
CPUS=${CRYPTBLK_VM_CPUS:-2}
TIMEOUT=${CRYPTBLK_VM_TIMEOUT:-1800}
# What the host needs to build and boot the guest (the guest itself runs host binaries).
HOST_PACKAGES=(qemu-system-x86 busybox-static kmod xz-utils zstd cpio)
# Drivers the initramfs must load to reach the host's root (the rest load from the
# overlay root once it is mounted; built-in ones are skipped).
EARLY_MODULES="virtio_pci virtio_console 9pnet_virtio 9p overlay"
# Loaded in the guest before the command: what the suites use without parameters.
GUEST_MODULES="dm_mod dm_crypt xts ecb cbc crypto_null af_alg algif_skcipher algif_hash ublk_drv"

say() { echo "vm: $*" >&2; }
die() { say "$*"; exit 1; }

apt_ready=
apt_refresh() { [ -n "$apt_ready" ] || { apt-get update -qq >&2; apt_ready=1; }; }

# hardware KVM, or QEMU's emulator (TCG): functional, not for timings. A /dev/kvm that
# is PVM (no vmx/svm flag) cannot run a stock kernel, so it counts as none.
accel() {
  case ${CRYPTBLK_VM_ACCEL:-auto} in
    kvm | tcg) echo "$CRYPTBLK_VM_ACCEL" ;;
    auto)
      if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
        echo kvm
      else
        echo tcg
      fi
      ;;
    *) die "CRYPTBLK_VM_ACCEL is auto, kvm or tcg" ;;
  esac
}

newest_kernel_package() {
  apt-cache search --names-only '^linux-image-[0-9].*-amd64$' 2>/dev/null |
    cut -d' ' -f1 | grep -vE -- '-(rt|cloud|dbg)-amd64$|-unsigned' |
    sort -V | tail -n1
}

# The initramfs: busybox, the early drivers (decompressed: busybox insmod reads plain
# .ko only), and our init.
make_initramfs() { # kernel_root kver out
  local root=$1 kver=$2 out=$3 work line path name
  work=$(mktemp -d)
  mkdir -p "$work/bin" "$work/lib/early" "$work/dev" "$work/proc" "$work/sys"
  cp /bin/busybox "$work/bin/"
  ln -s busybox "$work/bin/sh"
  : > "$work/lib/early/list"
  modprobe --all --dirname "$root" --set-version "$kver" --show-depends $EARLY_MODULES |
    while read -r line; do
      [ "${line%% *}" = insmod ] || continue # "builtin X": nothing to load
      path=$(echo "$line" | cut -d' ' -f2)
      name=$(basename "$path"); name=${name%%.ko*}.ko
      grep -qxF "$name" "$work/lib/early/list" && continue
      case $path in
        *.zst) zstd -qdc "$path" ;;
        *.xz) xz -dc "$path" ;;
        *.gz) gzip -dc "$path" ;;
        *) cat "$path" ;;
      esac > "$work/lib/early/$name"
      echo "$name" >> "$work/lib/early/list"
    done
  install -m 0755 "$SELF_DIR/guest/init" "$work/init"
  (cd "$work" && find . | cpio -o -H newc --quiet | gzip -1) > "$out.part"
  mv "$out.part" "$out"
  rm -rf "$work"
}

setup() {
  [ "$(id -u)" -eq 0 ] || die "setup needs root (apt-get, the cache in $CACHE)"
  local missing=() p
  for p in "${HOST_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt_refresh
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi
  local pkg=${CRYPTBLK_VM_KERNEL:-}
  [ -n "$pkg" ] || pkg=$(newest_kernel_package)
  [ -n "$pkg" ] || { apt_refresh; pkg=$(newest_kernel_package); }
  [ -n "$pkg" ] || die "apt knows no linux-image-*-amd64 package"
  local dir=$CACHE/$pkg
  if [ ! -f "$dir/kver" ]; then
    say "fetching $pkg"
    rm -rf "$dir"
    mkdir -p "$dir/deb"
    chown _apt "$dir/deb" 2>/dev/null || true # apt downloads as _apt
    (cd "$dir/deb" && apt-get download -q "$pkg" >&2) ||
      { apt_refresh; (cd "$dir/deb" && apt-get download -q "$pkg" >&2); }
    dpkg-deb -x "$dir"/deb/*.deb "$dir/root"
    local kver
    kver=$(ls "$dir/root/lib/modules")
    [ -f "$dir/root/boot/vmlinuz-$kver" ] || die "$pkg has no vmlinuz"
    depmod -b "$dir/root" "$kver" # the package ships no modules.dep
    rm -rf "$dir/deb"
    echo "$kver" > "$dir/kver" # written last: marks the cache entry complete
  fi
  local kver stamp
  kver=$(cat "$dir/kver")
  stamp=$(cat "$SELF_DIR/guest/init" "$SELF_DIR/vm.sh" /bin/busybox | sha256sum | cut -c1-12)
  if [ ! -f "$dir/initramfs-$stamp.gz" ]; then
    say "building the initramfs"
    rm -f "$dir"/initramfs-*.gz
    make_initramfs "$dir/root" "$kver" "$dir/initramfs-$stamp.gz"
  fi
  ln -sfn "$pkg" "$CACHE/current"
  say "ready: $pkg, kernel $kver, $(accel) ($CACHE)"
}

info() {
  [ -f "$CACHE/current/kver" ] || die "nothing cached; run: $0 setup"
  local dir
  dir=$(readlink -f "$CACHE/current")
  echo "package:   $(basename "$dir")"
  echo "kernel:    $(cat "$dir/kver")"
  echo "initramfs: $(ls "$dir"/initramfs-*.gz)"
  echo "accel:     $(accel)"
}

run() {
  local results=""
  while [ $# -gt 0 ]; do
    case $1 in
      -r) mkdir -p "$2"; results=$(readlink -f "$2"); shift 2 ;;
      --) shift; break ;;
      -*) die "unknown option $1" ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || die "usage: $0 run [-r DIR] COMMAND"
  [ -f "$CACHE/current/kver" ] || die "not set up: run '$0 setup' first"
  local dir kver initramfs job how rc
  dir=$(readlink -f "$CACHE/current")
  kver=$(cat "$dir/kver")
  initramfs=$(ls "$dir"/initramfs-*.gz | head -n1)
  how=$(accel)
  if [ "$how" = tcg ]; then
    say "no hardware virtualisation here: QEMU emulates the CPU (TCG) — correct, slow, no timings"
  else
    say "KVM"
  fi
  job=$(mktemp -d /tmp/cryptblk-vm-job.XXXXXX)
  trap 'rm -rf "$job"' EXIT
  printf '%s\n' "$*" > "$job/command"
  cp "$SELF_DIR/guest/stage2.sh" "$job/"
  {
    printf 'VM_KVER=%q\n' "$kver"
    printf 'VM_MODULES_DIR=%q\n' "$dir/root/lib/modules/$kver"
    printf 'VM_LOAD=%q\n' "$GUEST_MODULES"
    printf 'VM_RESULTS=%q\n' "${results:+/results}"
    printf 'VM_ACCEL=%q\n' "$how"
  } > "$job/env"
  local cpu=(-accel kvm -cpu host)
  [ "$how" = tcg ] && cpu=(-accel tcg,thread=multi -cpu max)
  local loglevel=3
  [ -n "${CRYPTBLK_VM_DEBUG:-}" ] && loglevel=7
  local share=security_model=none
  local args=("${cpu[@]}" -smp "$CPUS" -m "$MEM" -nodefaults -display none -no-reboot
    -kernel "$dir/root/boot/vmlinuz-$kver" -initrd "$initramfs"
    -append "console=ttyS0 loglevel=$loglevel panic=-1 rdinit=/init"
    -serial "file:$job/kernel.log"
    -chardev stdio,id=cmdout -device virtio-serial-pci -device virtconsole,chardev=cmdout
    -device virtio-rng-pci
    -virtfs "local,path=/,mount_tag=host,$share,readonly=on,multidevs=remap"
    -virtfs "local,path=$job,mount_tag=job,$share")
  [ -n "$results" ] && args+=(-virtfs "local,path=$results,mount_tag=results,$share")
  [ -n "${CRYPTBLK_VM_TPM:-}" ] && args+=(-chardev "socket,id=chrtpm,path=$job/swtpm.sock"
    -tpmdev emulator,id=tpm0,chardev=chrtpm -device tpm-tis,tpmdev=tpm0)
  if [ -n "${CRYPTBLK_VM_VHOST_USER_BLK:-}" ]; then
    args+=(-object "memory-backend-memfd,id=mem,size=$MEM,share=on" -machine memory-backend=mem)
    local n=0 spec sock queues
    for spec in $CRYPTBLK_VM_VHOST_USER_BLK; do
      sock=${spec%%:*} queues=1
      [ "$spec" != "$sock" ] && queues=${spec#*:}
      args+=(-chardev "socket,id=vub$n,path=$sock,reconnect=1"
        -device "vhost-user-blk-pci,chardev=vub$n,num-queues=$queues")
      n=$((n + 1))
    done
  fi
  tpm_pid=
  trap 'kill $tpm_pid 2>/dev/null || true; rm -rf "$job"' EXIT
  # A second boot only when the guest died before its command began (stage2.sh marks the
  # start in the job directory), never after: under TCG the guest kernel has been seen to
  # oops once in its initcalls (a page fault in patched code, multi-threaded TCG). Said
  # loudly, with the first boot's kernel log.
  local boot
  for boot in 1 2; do
    boot_once "${args[@]}"
    [ -f "$job/status" ] || [ -f "$job/started" ] || [ "$rc" -eq 124 ] || [ "$boot" -eq 2 ] && break
    say "the guest died while booting, before its command began (qemu exit $rc); its kernel log:"
    tail -n 40 "$job/kernel.log" >&2 || true
    say "booting it a second time (once only)"
  done
  [ -n "${CRYPTBLK_VM_DEBUG:-}" ] && { say "kernel log:"; cat "$job/kernel.log" >&2; }
  if [ -f "$job/status" ]; then
    exit "$(cat "$job/status")"
  fi
  [ "$rc" -eq 124 ] && say "the guest ran past ${TIMEOUT}s"
  say "the guest reported no exit status (qemu exit $rc); end of its kernel log:"
  tail -n 40 "$job/kernel.log" >&2 || true
  exit 125
}

# One boot of the guest with QEMU arguments "$@"; sets rc. A TPM is fresh for each boot.
boot_once() {
  rm -f "$job/kernel.log"
  if [ -n "${CRYPTBLK_VM_TPM:-}" ]; then
    command -v swtpm > /dev/null || die "CRYPTBLK_VM_TPM needs swtpm (apt-get install swtpm)"
    rm -rf "$job/tpm" "$job/swtpm.sock"
    mkdir "$job/tpm"
    swtpm socket --tpm2 --tpmstate "dir=$job/tpm" --ctrl "type=unixio,path=$job/swtpm.sock" \
      --terminate > "$job/swtpm.log" 2>&1 &
    tpm_pid=$!
    for _ in $(seq 100); do [ -S "$job/swtpm.sock" ] && break; sleep 0.05; done
    [ -S "$job/swtpm.sock" ] || die "swtpm did not start: $(cat "$job/swtpm.log")"
  fi
  set +e
  timeout --foreground "$TIMEOUT" qemu-system-x86_64 "$@" < /dev/null
  rc=$?
  set -e
  if [ -n "$tpm_pid" ]; then
    kill "$tpm_pid" 2> /dev/null || true
    wait "$tpm_pid" 2> /dev/null || true
    tpm_pid=
  fi
  return 0
}

case ${1:-} in
  setup) shift; setup "$@" ;;
  run) shift; run "$@" ;;
  info) shift; info ;;
  *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
