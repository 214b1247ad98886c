#!/usr/bin/env bash
# Packs what the RBD and remote-NBD benchmarks need on a machine without Ceph, fio, qemu-nbd
# or nbdkit (the lent device machine: Ubuntu 24.04, no network): this host's (Debian 12's)
# ceph-mon, ceph-osd, rados, rbd, monmaptool, ceph-authtool, fio, qemu-nbd and nbdkit (with
# its file plugin), every library they load except the C library's own, Ceph's plugins,
# and cryptblk's CI build (cryptblk, rbd_load). The machine then runs
# scripts/device-bench.sh. Writes target/device-bundle.tar.xz (an ignored path: carry it
# with the call) and checks first that everything runs with nothing but the C library and
# the bundle (a chroot).
# usage: scripts/device-bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --profile ci -p cryptblk -p cryptblk-rbd --bins --examples >/dev/null
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
D=$W/bundle; mkdir -p "$D/bin" "$D/lib"
TOOLS="ceph-mon ceph-osd rados rbd monmaptool ceph-authtool fio qemu-nbd nbdkit"
ARCH_LIB=/usr/lib/x86_64-linux-gnu
for t in $TOOLS; do cp "$(command -v "$t")" "$D/bin/"; done
cp target/ci/cryptblk target/ci/examples/rbd_load "$D/bin/"
cp -r "$ARCH_LIB/ceph" "$D/lib/ceph-plugins"
cp "$ARCH_LIB/nbdkit/plugins/nbdkit-file-plugin.so" "$D/lib/"
# The C library stays the machine's own (a newer one runs these); everything else comes.
skip='/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux-x86-64)\.so'
deps() { ldd "$@" 2>/dev/null | awk '/=> \//{print $3}' | grep -Ev "$skip" || true; }
{ deps "$D"/bin/*; deps $(find "$D/lib/ceph-plugins" -name '*.so*' -type f);
  deps "$ARCH_LIB/librbd.so.1" "$ARCH_LIB/librados.so.2"; echo "$ARCH_LIB/librbd.so.1";
  echo "$ARCH_LIB/librados.so.2"; } | sort -u | while read -r l; do cp -L "$l" "$D/lib/"; done
cat > "$D/env.sh" <<'ENV'
# Sourced on the machine: the bundle's tools and libraries first.
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=$B/bin:$PATH LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CEPH_PLUGIN_DIR=$B/lib/ceph-plugins CRYPTBLK_BIN=$B/bin/cryptblk RBD_LOAD_BIN=$B/bin/rbd_load
export NBDKIT_FILE_PLUGIN=$B/lib/nbdkit-file-plugin.so
ENV
# Nothing but the C library and the bundle: no program or library may miss one (the
# dynamic loader's list of each, in a chroot), and every program starts.
R=$W/root; mkdir -p "$R/lib64" "$R/lib/x86_64-linux-gnu" "$R/b"
for l in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 ld-linux-x86-64.so.2; do
  cp -L "$ARCH_LIB/$l" "$R/lib/x86_64-linux-gnu/"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
cp -r "$D"/. "$R/b/"
missing=0
while read -r f; do
  out=$(LD_LIBRARY_PATH=/b/lib chroot "$R" /lib64/ld-linux-x86-64.so.2 --list "/b/${f#"$D"/}" 2>&1 || true)
  if grep -q "not found\|error while loading" <<< "$out"; then
    echo "${f#"$D"/}: $(grep "not found\|error while loading" <<< "$out")" >&2; missing=1
  fi
done < <(find "$D/bin" "$D/lib" -type f -name '*' ! -name '*.sh')
[ $missing = 0 ] || { echo "the bundle misses libraries (above)" >&2; exit 1; }
for t in $TOOLS cryptblk rbd_load; do
  out=$(LD_LIBRARY_PATH=/b/lib chroot "$R" "/b/bin/$t" --version 2>&1 || true)
  if grep -qi "error while loading\|not found" <<< "$out"; then echo "$t: $out" >&2; exit 1; fi
done
tar -C "$W/bundle" -cf - . | xz -T0 -6 > target/device-bundle.tar.xz
ls -l target/device-bundle.tar.xz
