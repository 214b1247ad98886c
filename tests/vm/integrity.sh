#!/usr/bin/env bash
# Runs INSIDE the test VM (tests/vm/vm.sh; Debian's 6.12 kernel with dm-integrity), as root.
# LUKS2 with integrity (issue 38) both ways between cryptblk (userspace, in this guest) and
# the kernel (cryptsetup open: dm-crypt's AEAD mode over dm-integrity): each mode formatted
# by one tool or the other in turn (cryptblk without the kernel, cryptsetup with its wipe);
# cryptblk writes, the kernel reads every sector and the data; the kernel writes, cryptblk
# reads; a copy of the image taken while the kernel's journal still held the last writes
# (the state a power cut leaves) reads in cryptblk as the kernel's data; the kernel replays
# cryptblk's journal (a written block's home copy wiped after cryptblk closed); a flipped
# ciphertext byte fails the same sector in both.
# Standalone integritysetup volumes (dm-integrity's own checksums, no encryption) the same
# way: formatted by integritysetup or by cryptblk (with and without a journal MAC),
# written, replayed and tampered with in both directions; and bitmap mode.
# usage: integrity.sh /path/to/cryptblk [luks2] [standalone]   (default: both parts)
set -uo pipefail
CB=$1
shift
PARTS=" ${*:-luks2 standalone} "
pass=0 fail=0
check() { # name, command...
  local name=$1; shift
  if "$@"; then pass=$((pass+1)); echo "ok   $name"; else fail=$((fail+1)); echo "FAIL $name"; fi
}
modprobe loop 2>/dev/null; modprobe dm-integrity 2>/dev/null
for m in gcm chacha20poly1305 authenc aegis128; do modprobe "$m" 2>/dev/null; done
cd /tmp
printf 'integrity passphrase' > pw
SZ=1048576
# The byte offset of the home copy of logical 512-byte sector S of the image IMG, whose
# superblock is at sector START (LUKS2: the data offset, 16 MiB; standalone: 0):
# docs/integrity-format.md §2.3.
home() { # IMG S [START]
  python3 - "$1" "$2" "${3:-32768}" << 'PY'
import struct, sys
img, s, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(img, "rb") as f:
    f.seek(start * 512)
    sb = f.read(64)
assert sb[:8] == b"integrt\0", "no dm-integrity superblock"
tag, sections = struct.unpack_from("<HI", sb, 10)
flags, = struct.unpack_from("<I", sb, 24)
l2i, l2spb = sb[9], sb[28]
spb = 1 << l2spb
entry = -(-(8 + 8 * spb + tag) // 8) * 8
section = (504 // entry) * 8 * spb + 8
initial = 8 + sections * section
pad = 4096 if flags & 8 else 131072
run = -(-(tag << (l2i - l2spb)) // pad) * pad // 512
area, off = s >> l2i, s & ((1 << l2i) - 1)
print((start + initial + (area << l2i) + (area + 1) * run + off) * 512)
PY
}
one() { # formatter cipher integrity sector-size [key bits]
  local fmt=$1 cipher=$2 integ=$3 ss=$4 name="$1-made $2 + $3, $4-byte sectors"
  local ks=(); [ -n "${5:-}" ] && ks=(--key-size "$5")
  rm -f img snap.img; truncate -s 20M img
  if [ "$fmt" = cryptblk ]; then
    "$CB" format -q --type luks2 --cipher "$cipher" "${ks[@]}" --integrity "$integ" --sector-size "$ss" \
      --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw img || { fail=$((fail+1)); echo "FAIL $name: format"; return; }
  else
    cryptsetup luksFormat -q --type luks2 --cipher "$cipher" "${ks[@]}" --integrity "$integ" --sector-size "$ss" \
      --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw img > /dev/null || { fail=$((fail+1)); echo "FAIL $name: luksFormat"; return; }
  fi
  head -c $SZ /dev/urandom > a.bin; head -c $SZ /dev/urandom > b.bin
  "$CB" import --key-file pw img a.bin || { fail=$((fail+1)); echo "FAIL $name: import"; return; }
  # The home copy of the last block cryptblk wrote, wiped: only cryptblk's journal has it.
  local last; last=$(home img $(( (SZ - ss) / 512 )))
  dd if=/dev/zero of=img bs=1 seek="$last" count="$ss" conv=notrunc status=none
  local L; L=$(losetup -f --show img)
  cryptsetup open --key-file pw "$L" t || { fail=$((fail+1)); echo "FAIL $name: cryptsetup open"; losetup -d "$L"; return; }
  check "$name: cryptblk writes, the kernel reads (its journal replayed by the kernel)" cmp -n $SZ /dev/mapper/t a.bin
  check "$name: every sector verifies in the kernel" dd if=/dev/mapper/t of=/dev/null bs=1M status=none
  dd if=b.bin of=/dev/mapper/t bs=64k oflag=direct conv=fsync status=none
  # What a power cut now would leave: the journal has the last writes, their homes may not.
  cp --sparse=always img snap.img
  cryptsetup close t; losetup -d "$L"
  "$CB" export --key-file pw --length $SZ img out.bin
  check "$name: the kernel writes, cryptblk reads" cmp out.bin b.bin
  "$CB" export --key-file pw img /dev/null
  check "$name: every sector verifies in cryptblk" test $? -eq 0
  "$CB" export --key-file pw --length $SZ snap.img out.bin
  check "$name: the kernel's journal replayed by cryptblk (a copy taken mid-write)" cmp out.bin b.bin
}
# standalone FORMATTER SECTOR-SIZE OPTIONS...: a standalone integrity volume (options as
# both tools take them: -I, --integrity-key-file, --integrity-key-size).
standalone() {
  local fmt=$1 ss=$2; shift 2
  local opts=("$@") name
  name="$fmt-made standalone integrity ${opts[*]:-crc32c}, $ss-byte sectors"
  rm -f simg ssnap.img; truncate -s 12M simg
  if [ "$fmt" = cryptblk ]; then
    "$CB" format -q --type integrity "${opts[@]}" --sector-size "$ss" simg || { fail=$((fail+1)); echo "FAIL $name: format"; return; }
  else
    integritysetup format -q "${opts[@]}" --sector-size "$ss" simg > /dev/null || { fail=$((fail+1)); echo "FAIL $name: integritysetup format"; return; }
  fi
  head -c $SZ /dev/urandom > a.bin; head -c $SZ /dev/urandom > b.bin
  "$CB" import --type integrity "${opts[@]}" simg a.bin || { fail=$((fail+1)); echo "FAIL $name: import"; return; }
  # The home copy of the last block cryptblk wrote, wiped: only cryptblk's journal has it.
  local last; last=$(home simg $(( (SZ - ss) / 512 )) 0)
  dd if=/dev/zero of=simg bs=1 seek="$last" count="$ss" conv=notrunc status=none
  local L; L=$(losetup -f --show simg)
  integritysetup open "${opts[@]}" "$L" s || { fail=$((fail+1)); echo "FAIL $name: integritysetup open"; losetup -d "$L"; return; }
  check "$name: cryptblk writes, the kernel reads (its journal replayed by the kernel)" cmp -n $SZ /dev/mapper/s a.bin
  check "$name: every sector verifies in the kernel" dd if=/dev/mapper/s of=/dev/null bs=1M status=none
  dd if=b.bin of=/dev/mapper/s bs=64k oflag=direct conv=fsync status=none
  cp --sparse=always simg ssnap.img
  integritysetup close s; losetup -d "$L"
  "$CB" export --type integrity "${opts[@]}" --length $SZ simg out.bin
  check "$name: the kernel writes, cryptblk reads" cmp out.bin b.bin
  "$CB" export --type integrity "${opts[@]}" simg /dev/null
  check "$name: every sector verifies in cryptblk" test $? -eq 0
  "$CB" export --type integrity "${opts[@]}" --length $SZ ssnap.img out.bin
  check "$name: the kernel's journal replayed by cryptblk (a copy taken mid-write)" cmp out.bin b.bin
  # One flipped data byte (block 3): both fail that block and read its neighbour.
  local off; off=$(home simg $(( 3 * ss / 512 )) 0)
  local b; b=$(dd if=simg bs=1 skip=$((off + 9)) count=1 status=none | od -An -tu1 | tr -d ' ')
  printf "\\x$(printf %02x $((b ^ 1)))" | dd of=simg bs=1 seek=$((off + 9)) conv=notrunc status=none
  L=$(losetup -f --show simg)
  integritysetup open "${opts[@]}" "$L" s
  check "$name: tampered, the kernel fails the block" bash -c "! dd if=/dev/mapper/s of=/dev/null bs=$ss skip=3 count=1 iflag=direct status=none 2>/dev/null"
  check "$name: tampered, the kernel reads its neighbour" dd if=/dev/mapper/s of=/dev/null bs="$ss" skip=4 count=1 iflag=direct status=none
  integritysetup close s; losetup -d "$L"
  check "$name: tampered, cryptblk fails the block" bash -c "! '$CB' export --type integrity ${opts[*]} --at $((3 * ss)) --length $ss simg /dev/null 2>/dev/null"
  check "$name: tampered, cryptblk reads the blocks before it" "$CB" export --type integrity "${opts[@]}" --length $((3 * ss)) simg /dev/null
}
# Bitmap mode (-B) both ways: a copy of the image taken while one side has it open in
# bitmap mode (its regions marked, DIRTY_BITMAP set: what a crash leaves), one block's
# data then changed without its tag (a torn write), opens in the other with that region's
# tags recalculated: every block reads, the changed one as changed. The kernel's bitmap
# has a bit per 64 sectors here, and the torn block (sector 700) is under bit 10, so the
# bits' order on disk is checked too.
bitmap() {
  local name="bitmap mode" L
  rm -f bimg bsnap.img; truncate -s 12M bimg
  integritysetup format -q bimg > /dev/null || { fail=$((fail+1)); echo "FAIL $name: format"; return; }
  head -c $SZ /dev/urandom > a.bin; head -c 512 /dev/urandom > blk.bin
  cp a.bin want.bin; dd if=blk.bin of=want.bin bs=512 seek=700 conv=notrunc status=none
  L=$(losetup -f --show bimg)
  integritysetup open -B --bitmap-sectors-per-bit 64 "$L" b || { fail=$((fail+1)); echo "FAIL $name: integritysetup open -B"; losetup -d "$L"; return; }
  dd if=a.bin of=/dev/mapper/b bs=64k oflag=direct conv=fsync status=none
  cp --sparse=always bimg bsnap.img
  integritysetup close b; losetup -d "$L"
  check "$name: the kernel marks the device while it is open" bash -c "'$CB' dump bsnap.img | grep -q dirty_bitmap"
  check "$name: the kernel's clean close clears the mark" bash -c "! '$CB' dump bimg | grep -q dirty_bitmap"
  dd if=blk.bin of=bsnap.img bs=1 seek="$(home bsnap.img 700 0)" conv=notrunc status=none
  check "$name: cryptblk refuses to read a marked device unverified" bash -c "! '$CB' export --type integrity bsnap.img /dev/null 2>/dev/null"
  check "$name: cryptblk recalculates the kernel's marked regions (a read-write open)" "$CB" import --type integrity bsnap.img /dev/null
  "$CB" export --type integrity --length $SZ bsnap.img out.bin
  check "$name: then reads the kernel's data, the torn block as written" cmp out.bin want.bin
  # The other way: cryptblk's FUSE daemon in bitmap mode, copied while it serves.
  mkdir -p /tmp/bmnt
  "$CB" open bimg b --fuse /tmp/bmnt --run-dir /tmp/brun --daemon --type integrity -B > /dev/null ||
    { fail=$((fail+1)); echo "FAIL $name: cryptblk open -B"; return; }
  dd if=a.bin of=/tmp/bmnt/b bs=64k conv=notrunc,fsync status=none
  cp --sparse=always bimg bsnap.img
  "$CB" close b --run-dir /tmp/brun
  check "$name: cryptblk marks the device while it serves" bash -c "integritysetup dump bsnap.img | grep -q dirty_bitmap"
  check "$name: cryptblk's clean close clears the mark" bash -c "! integritysetup dump bimg | grep -q dirty_bitmap"
  dd if=blk.bin of=bsnap.img bs=1 seek="$(home bsnap.img 700 0)" conv=notrunc status=none
  L=$(losetup -f --show bsnap.img)
  integritysetup open "$L" b || { fail=$((fail+1)); echo "FAIL $name: integritysetup open"; losetup -d "$L"; return; }
  check "$name: the kernel reads cryptblk's data, the torn block as written" cmp -n $SZ /dev/mapper/b want.bin
  # Its recalculation runs in the background: wait for it, then every tag must verify.
  # (`dmsetup status`: start, length, target, mismatches, provided, recalc position or -.)
  for _ in $(seq 60); do dmsetup status b | awk '{exit !($6 == "-" || $6 == $5)}' && break; sleep 1; done
  integritysetup close b
  integritysetup open "$L" b
  check "$name: after the kernel's recalculation every block verifies" dd if=/dev/mapper/b of=/dev/null bs=1M iflag=direct status=none
  integritysetup close b; losetup -d "$L"
}
# Growth (cryptsetup and integritysetup refuse to resize these; cryptblk grows them): a
# volume the kernel's tools made, its image grown, resized while cryptblk serves it; the
# kernel then opens it at the new size, every sector verifies (the new ones read as
# zeros), the data written before is intact, and what the kernel writes past the old end
# cryptblk reads.
grow() { # luks2|standalone
  local kind=$1 name="grow: $1 volume made by the kernel's tools, grown by cryptblk"
  local o=() k=() dev=g
  rm -rf gimg cbrun; truncate -s 20M gimg
  head -c $SZ /dev/urandom > a.bin; head -c 65536 /dev/urandom > c.bin
  if [ "$kind" = luks2 ]; then
    cryptsetup luksFormat -q --type luks2 --cipher aes-gcm-random --integrity aead --sector-size 4096 \
      --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw gimg > /dev/null || { fail=$((fail+1)); echo "FAIL $name: format"; return; }
    k=(--key-file pw)
  else
    integritysetup format -q --batch-mode -s 4096 gimg > /dev/null || { fail=$((fail+1)); echo "FAIL $name: format"; return; }
    o=(--type integrity)
  fi
  "$CB" import "${o[@]}" "${k[@]}" gimg a.bin || { fail=$((fail+1)); echo "FAIL $name: import"; return; }
  local L old new
  L=$(losetup -f --show gimg)
  if [ "$kind" = luks2 ]; then cryptsetup open "${k[@]}" "$L" $dev; else integritysetup open "$L" $dev; fi
  old=$(blockdev --getsize64 /dev/mapper/$dev)
  if [ "$kind" = luks2 ]; then cryptsetup close $dev; else integritysetup close $dev; fi
  losetup -d "$L"
  truncate -s 36M gimg
  "$CB" open "${o[@]}" "${k[@]}" gimg vol --daemon --run-dir cbrun --nbd unix:/tmp/cbrun.sock || { fail=$((fail+1)); echo "FAIL $name: open"; return; }
  check "$name: cryptblk resizes it" "$CB" resize vol --run-dir cbrun
  "$CB" close vol --run-dir cbrun
  L=$(losetup -f --show gimg)
  if [ "$kind" = luks2 ]; then cryptsetup open "${k[@]}" "$L" $dev; else integritysetup open "$L" $dev; fi
  new=$(blockdev --getsize64 /dev/mapper/$dev)
  check "$name: the kernel opens it at the new size ($old -> $new bytes)" test "$new" -gt $((old + 15 * 1048576))
  check "$name: every sector verifies in the kernel" dd if=/dev/mapper/$dev of=/dev/null bs=1M iflag=direct status=none
  check "$name: the new sectors read as zeros in the kernel" cmp -n $((new - old)) -i "$old:0" /dev/mapper/$dev /dev/zero
  check "$name: the data written before is intact" cmp -n $SZ /dev/mapper/$dev a.bin
  dd if=c.bin of=/dev/mapper/$dev bs=65536 seek=$((old / 65536)) oflag=direct conv=fsync status=none
  if [ "$kind" = luks2 ]; then cryptsetup close $dev; else integritysetup close $dev; fi
  losetup -d "$L"
  "$CB" export "${o[@]}" "${k[@]}" --at $((old / 65536 * 65536)) --length 65536 gimg out.bin
  check "$name: what the kernel wrote past the old end, cryptblk reads" cmp out.bin c.bin
}
if [[ $PARTS == *" standalone "* ]]; then
  head -c 32 /dev/urandom > hkey
  standalone integritysetup 512
  head -c 32 /dev/urandom > jkey
  # With a journal MAC (--journal-integrity) and an encrypted journal (--journal-crypt)
  # both ways: each side checks the other's superblock MAC and section MACs, and decrypts
  # the other's journal, when it replays it.
  # The journal encrypted too (--journal-crypt, a stream cipher), each way.
  standalone cryptblk 4096 -I hmac-sha256 --integrity-key-file hkey --integrity-key-size 32 \
    --journal-integrity hmac-sha256 --journal-integrity-key-file jkey --journal-integrity-key-size 32 \
    --journal-crypt chacha20 --journal-crypt-key-file jkey --journal-crypt-key-size 32
  standalone integritysetup 4096 -I sha256 \
    --journal-integrity hmac-sha256 --journal-integrity-key-file jkey --journal-integrity-key-size 32 \
    --journal-crypt ctr-aes --journal-crypt-key-file jkey --journal-crypt-key-size 32
  # A block cipher's journal encryption (each section in CBC on its own), each way.
  standalone cryptblk 512 --journal-crypt cbc-aes --journal-crypt-key-file jkey --journal-crypt-key-size 32
  standalone integritysetup 4096 --journal-crypt cbc-aes --journal-crypt-key-file jkey --journal-crypt-key-size 16
  bitmap
  grow standalone
fi
[[ $PARTS == *" luks2 "* ]] || { echo "integrity: $pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit; }
one cryptsetup aes-gcm-random aead 4096
one cryptblk chacha20-random poly1305 512
one cryptsetup aes-xts-plain64 hmac-sha256 512
one cryptblk aes-xts-random hmac-sha256 4096
one cryptsetup aegis128-random aead 512 128
grow luks2
# Tampering: one flipped ciphertext byte fails that sector, in both, and no other.
if [ -f img ]; then
  off=$(home img 16)
  b=$(dd if=img bs=1 skip=$((off + 100)) count=1 status=none | od -An -tu1 | tr -d ' ')
  printf "\\x$(printf %02x $((b ^ 1)))" | dd of=img bs=1 seek=$((off + 100)) conv=notrunc status=none
  L=$(losetup -f --show img)
  cryptsetup open --readonly --key-file pw "$L" t
  check "tampered: the kernel fails the sector" bash -c '! dd if=/dev/mapper/t of=/dev/null bs=4096 skip=2 count=1 iflag=direct status=none 2>/dev/null'
  check "tampered: the kernel reads its neighbour" dd if=/dev/mapper/t of=/dev/null bs=4096 skip=3 count=1 iflag=direct status=none
  cryptsetup close t; losetup -d "$L"
  check "tampered: cryptblk fails a read through the sector" bash -c "! '$CB' export --key-file pw --length 12288 img /dev/null 2>/dev/null"
  check "tampered: cryptblk reads the sectors before it" "$CB" export --key-file pw --length 8192 img /dev/null
fi
echo "integrity: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
