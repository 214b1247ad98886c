#!/usr/bin/env bash
# Checks docs/integrity-format.md against bytes the kernel writes (issue 38 groundwork): in
# the test VM (tests/vm/vm.sh; `bash tests/vm/vm.sh setup` first), cryptsetup formats LUKS2
# volumes with integrity (dm-crypt AEAD over dm-integrity), writes a known 8 KiB at byte 4096
# and closes; on the host, scripts/probe_integrity_layout.py finds each sector and its tag by
# the document's formulas and decrypts/verifies it with Python's `cryptography` (an
# implementation independent of the kernel's). Exit 0 only if every mode checks out.
# Usage: scripts/probe-integrity-layout.sh [DIR]   (DIR keeps the images; default a temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-$(mktemp -d)}
mkdir -p "$dir"
chmod 700 "$dir"
cat > "$dir/guest.sh" <<'G'
set -euo pipefail
cd /results
modprobe loop; modprobe dm-integrity
for m in gcm aegis128 chacha20-poly1305; do modprobe "$m" 2>/dev/null || true; done
printf 'probe passphrase' > /tmp/pw
python3 -c "import sys; sys.stdout.buffer.write(bytes((i*7+3)&255 for i in range(8192)))" > pattern
# name | cryptsetup's cipher options | sector size
while IFS='|' read -r name opts ss; do
  truncate -s 40M "/tmp/$name.img"
  dev=$(losetup -f --show "/tmp/$name.img")
  # shellcheck disable=SC2086
  cryptsetup luksFormat -q --type luks2 $opts --sector-size "$ss" --pbkdf pbkdf2 \
    --pbkdf-force-iterations 1000 --integrity-no-wipe --key-file /tmp/pw "$dev"
  cryptsetup open --key-file /tmp/pw "$dev" "probe-$name"
  dd if=pattern of="/dev/mapper/probe-$name" bs=4096 seek=1 oflag=direct conv=fsync status=none
  cryptsetup close "probe-$name"
  losetup -d "$dev"
  cryptsetup luksDump -q --dump-volume-key --volume-key-file "/tmp/$name.vk" --key-file /tmp/pw "/tmp/$name.img" >/dev/null
  cryptsetup luksDump "/tmp/$name.img" > "$name.dump"
  cp "/tmp/$name.vk" "$name.vk"; cp "/tmp/$name.img" "$name.img"
  echo "$name $ss" >> made
done <<'M'
gcm-512|--cipher aes-gcm-random --integrity aead --key-size 256|512
gcm-4096|--cipher aes-gcm-random --integrity aead --key-size 256|4096
chachapoly-512|--cipher chacha20-random --integrity poly1305 --key-size 256|512
hmac-plain64-512|--cipher aes-xts-plain64 --integrity hmac-sha256|512
hmac-plain64-4096|--cipher aes-xts-plain64 --integrity hmac-sha256|4096
hmac-random-512|--cipher aes-xts-random --integrity hmac-sha256|512
aegis128-512|--cipher aegis128-random --integrity aead --key-size 128|512
M
G
rm -f "$dir/made"
bash tests/vm/vm.sh run -r "$dir" "bash /results/guest.sh"
python3 scripts/probe_integrity_layout.py "$dir"
