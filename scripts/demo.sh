#!/usr/bin/env bash
# The main job, end to end on a fresh machine: build, format a LUKS2 image, show that
# cryptsetup accepts it, serve it over NBD, write through it, close, reopen, verify.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -q -p cryptblk
CB=$PWD/target/release/cryptblk
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
printf 'demo passphrase' > "$W/pw"
truncate -s 64M "$W/disk.img"
echo "== cryptblk format (LUKS2, aes-xts-plain64, argon2id)"
"$CB" format -q --type luks2 --key-file "$W/pw" --pbkdf-memory 65536 --iter-time 200 "$W/disk.img"
"$CB" dump "$W/disk.img" | sed -n '1,12p'
echo "== cryptsetup accepts it"
cryptsetup open --test-passphrase --key-file "$W/pw" "$W/disk.img" && echo "cryptsetup: passphrase OK"
echo "== serve it over NBD (unix socket), write 16 MiB with qemu-img, close"
head -c 16M /dev/urandom > "$W/data"
SOCK=$W/nbd.sock; URI="nbd+unix:///demo?socket=$SOCK"
"$CB" open "$W/disk.img" demo --nbd "unix:$SOCK" --daemon --run-dir "$W/run" --key-file "$W/pw"
nbdinfo --size "$URI" | awk '{printf "NBD export size: %d MiB\n", $1/1048576}'
qemu-img convert -n -f raw -O raw "$W/data" "$URI"
"$CB" status demo --run-dir "$W/run"
"$CB" close demo --run-dir "$W/run"
echo "== reopen, read the 16 MiB back with nbdcopy, verify"
"$CB" open "$W/disk.img" demo --nbd "unix:$SOCK" --daemon --run-dir "$W/run" --key-file "$W/pw" --readonly
nbdcopy "$URI" "$W/back.full" && head -c 16M "$W/back.full" > "$W/back"
"$CB" close demo --run-dir "$W/run"
sha256sum "$W/data" "$W/back" | sed "s|$W/||"
cmp "$W/data" "$W/back" && echo "plaintext round trip through NBD: identical"
if cmp -s <(head -c 1M "$W/data") <(dd if="$W/disk.img" bs=1M skip=16 count=1 status=none); then
  echo "ERROR: plaintext found on disk"; exit 1
fi
echo "on disk: ciphertext only (data segment differs from the plaintext)"
echo "== cipher speed on this machine (aes-xts-plain64, 512-bit key)"
"$CB" benchmark --cipher aes-xts-plain64 --key-size 512 --seconds 0.2
