#!/usr/bin/env bash
# Makes the kernel-formatted standalone integrity volumes the CLI tests read
# (crates/cli/tests/formats/data/integritysetup, issue 38): in the test VM (tests/vm/vm.sh;
# `bash tests/vm/vm.sh setup` first), integritysetup formats an 8 MiB image per checksum
# (--no-wipe), the kernel writes a known 8 KiB at byte 4096 through dm-integrity, and the
# image, `integritysetup dump` and the kernel's table (key hidden) are kept.
# Usage: scripts/probe-integrity-standalone.sh [DIR]   (default: the test data folder)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-crates/cli/tests/formats/data/integritysetup}
dir=$(mktemp -d /var/tmp/probe-integrity.XXXXXX)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/guest.sh" <<'G'
set -euo pipefail
cd /results
modprobe loop; modprobe dm-integrity
python3 -c "import sys; sys.stdout.buffer.write(bytes((i*7+3)&255 for i in range(8192)))" > pattern
python3 -c "import sys; sys.stdout.buffer.write(bytes(range(32)))" > hkey
# name | options of both format and open | options of format only
while IFS='|' read -r name opts fopts; do
  truncate -s 8M "/tmp/$name.img"
  dev=$(losetup -f --show "/tmp/$name.img")
  # shellcheck disable=SC2086
  integritysetup format -q $opts $fopts --no-wipe "$dev"
  # shellcheck disable=SC2086
  integritysetup open $opts "$dev" "p-$name"
  dd if=pattern of="/dev/mapper/p-$name" bs=4096 seek=1 oflag=direct conv=fsync status=none
  dmsetup table "p-$name" | sed 's/:[0-9a-f]\{16,\}/:KEY/' > "$name.table"
  integritysetup close "p-$name"
  losetup -d "$dev"
  integritysetup dump "/tmp/$name.img" > "$name.dump"
  cp "/tmp/$name.img" "$name.img"
  echo "$name" >> made
done <<'M'
crc32c-512||
crc32-512|--integrity crc32|
sha256-4096|--integrity sha256|--sector-size 4096
sha1-t8-512|--integrity sha1|--tag-size 8
hmac-sha256-512|--integrity hmac-sha256 --integrity-key-file /results/hkey --integrity-key-size 32|
hmac-sha256-legacy-512|--integrity hmac-sha256 --integrity-key-file /results/hkey --integrity-key-size 32 --integrity-legacy-hmac|
crc32c-nojournal-512|--integrity-no-journal|
M
G
bash tests/vm/vm.sh run -r "$dir" "bash /results/guest.sh"
mkdir -p "$out"
while read -r n; do
  xz -9 -c "$dir/$n.img" > "$out/$n.img.xz"
  cp "$dir/$n.dump" "$dir/$n.table" "$out/"
done < "$dir/made"
echo "kernel-formatted volumes in $out"
