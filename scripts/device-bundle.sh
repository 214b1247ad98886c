#!/usr/bin/env bash
# Packs what the RBD and remote-NBD benchmarks need on a machine without Ceph, fio, qemu-nbd
# or nbdkit (the lent device machine: Ubuntu 24.04, no network): this host's (Debian 12's)
# ceph-mon, ceph-osd, rados, rbd, monmaptool, ceph-authtool, fio, qemu-nbd and nbdkit (with
# its file plugin), Ceph's plugins and object classes, every library they load except the
# C library's own, and cryptblk's release build (cryptblk, rbd_load; stripped). Each
# program is started by a wrapper in bin/ that points it, and only it, at the bundle's
# libraries. The machine then runs scripts/device-bench.sh. Writes
# target/device-bundle.tar.xz (an ignored path: carry it with the call), after checking
# in a chroot holding nothing but the C library and the bundle that no program, plugin or
# class misses a library and that every program starts.
# usage: scripts/device-bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "device-bundle.sh checks the bundle in a chroot: run it as root" >&2; exit 1; }
cargo build --release -p cryptblk -p cryptblk-rbd --bins --examples >/dev/null
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
D=$W/bundle; mkdir -p "$D/bin" "$D/libexec" "$D/lib"
TOOLS="ceph-mon ceph-osd rados rbd monmaptool ceph-authtool fio qemu-nbd nbdkit"
ARCH_LIB=/usr/lib/x86_64-linux-gnu
for t in $TOOLS; do cp "$(command -v "$t")" "$D/libexec/"; done
strip -o "$D/libexec/cryptblk" target/release/cryptblk
strip -o "$D/libexec/rbd_load" target/release/examples/rbd_load
cp -r "$ARCH_LIB/ceph" "$D/lib/ceph-plugins"
cp -r "$ARCH_LIB/rados-classes" "$D/lib/rados-classes"
cp "$ARCH_LIB/nbdkit/plugins/nbdkit-file-plugin.so" "$D/lib/"
is_elf() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
elves() { find "$D/libexec" "$D/lib" -type f | while read -r f; do is_elf "$f" && echo "$f"; done; }
# The C library stays the machine's own (a newer one runs these); everything else comes.
skip='/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux-x86-64)\.so'
deps() { ldd "$@" 2>/dev/null | awk '/=> \//{print $3}' | grep -Ev "$skip" || true; }
{ elves | while read -r f; do deps "$f"; done
  deps "$ARCH_LIB/librbd.so.1" "$ARCH_LIB/librados.so.2"
  echo "$ARCH_LIB/librbd.so.1"; echo "$ARCH_LIB/librados.so.2"; } |
  sort -u | while read -r l; do cp -L "$l" "$D/lib/"; done
for t in $TOOLS cryptblk rbd_load; do
  cat > "$D/bin/$t" <<WRAP
#!/bin/sh
# The bundle's $t with the bundle's libraries (for it only: the machine's own programs keep theirs).
B=\$(dirname "\$(dirname "\$(readlink -f "\$0")")")
LD_LIBRARY_PATH=\$B/lib exec "\$B/libexec/$t" "\$@"
WRAP
  chmod 755 "$D/bin/$t"
done
cat > "$D/env.sh" <<'ENV'
# Sourced on the machine: the bundle's programs first on PATH, and where Ceph's pieces are.
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=$B/bin:$PATH CEPH_LIBRARY_PATH=$B/lib
export CEPH_PLUGIN_DIR=$B/lib/ceph-plugins CEPH_CLASS_DIR=$B/lib/rados-classes
export CRYPTBLK_BIN=$B/bin/cryptblk RBD_LOAD_BIN=$B/bin/rbd_load
export NBDKIT_FILE_PLUGIN=$B/lib/nbdkit-file-plugin.so
ENV
# The check: nothing but the C library and the bundle.
R=$W/root; mkdir -p "$R/lib64" "$R/lib/x86_64-linux-gnu" "$R/b"
for l in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 ld-linux-x86-64.so.2; do
  cp -L "$ARCH_LIB/$l" "$R/lib/x86_64-linux-gnu/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
cp -r "$D"/. "$R/b/"
chroot "$R" /lib64/ld-linux-x86-64.so.2 --version >/dev/null ||
  { echo "the chroot check cannot run here" >&2; exit 1; }
missing=0
while read -r f; do
  rel=${f#"$D"/}
  if ! out=$(LD_LIBRARY_PATH=/b/lib chroot "$R" /lib64/ld-linux-x86-64.so.2 --list "/b/$rel" 2>&1) ||
     grep -q "not found" <<< "$out"; then
    echo "$rel: $(grep -v '=> /b/lib\|linux-vdso\|/lib64/ld-linux\|/lib/x86_64-linux-gnu/' <<< "$out")" >&2
    missing=1
  fi
done < <(elves)
[ $missing = 0 ] || { echo "the bundle misses libraries (above)" >&2; exit 1; }
for t in $TOOLS; do
  out=$(LD_LIBRARY_PATH=/b/lib chroot "$R" "/b/libexec/$t" --version 2>&1) ||
    { echo "$t --version failed in the chroot: $out" >&2; exit 1; }
done
for t in cryptblk rbd_load; do # they start (usage) and load librbd when asked to
  out=$(LD_LIBRARY_PATH=/b/lib chroot "$R" "/b/libexec/$t" 2>&1 || true)
  grep -qi "usage" <<< "$out" || { echo "$t did not start in the chroot: $out" >&2; exit 1; }
done
out=$(LD_LIBRARY_PATH=/b/lib chroot "$R" /b/libexec/rbd_load --conf /nonexistent rbd/x check 0 2>&1 || true)
grep -q "ceph.conf\|configuration\|nonexistent" <<< "$out" ||
  { echo "rbd_load could not load librbd in the chroot: $out" >&2; exit 1; }
tar -C "$D" -cf - . | xz -T0 -6 > target/device-bundle.tar.xz
ls -l target/device-bundle.tar.xz
