#!/usr/bin/env bash
# Generates the seed corpora of the fuzz targets, from volumes made by the real cryptsetup
# (small headers only: 16 KiB LUKS2 metadata, one or two keyslot areas, minimum KDF costs;
# every passphrase is "fuzz"). Nothing here is committed: run it before fuzzing
# (scripts/fuzz.sh does). Usage: fuzz/seed.sh [OUTDIR]  (default fuzz/seeds)
set -euo pipefail
out=$(realpath -m "${1:-$(dirname "$0")/seeds}")
cd "$(dirname "$0")"
CRYPTSETUP=${CRYPTSETUP:-/usr/sbin/cryptsetup}
if ! [ -x "$CRYPTSETUP" ]; then
    echo "seed.sh: cryptsetup not found at $CRYPTSETUP (set CRYPTSETUP)" >&2
    exit 1
fi
rm -rf "$out"
mkdir -p "$out"/{luks1_header,luks2_header,luks2_json,cipher_spec,nbd_session,tcrypt_header,bitlk_header,fvault2_header}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf fuzz > "$tmp/key"
cs() { "$CRYPTSETUP" --batch-mode --key-file "$tmp/key" "$@"; }
pbkdf2=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
argon=(--pbkdf argon2id --pbkdf-force-iterations 4 --pbkdf-memory 32 --pbkdf-parallel 1)

# LUKS1: the phdr and keyslot 0's material (the target zero-fills the other slots).
luks1() { # name, cut, luksFormat options...
    local name=$1 cut=$2
    shift 2
    truncate -s 4M "$tmp/$name"
    cs luksFormat --type luks1 "${pbkdf2[@]}" "$@" "$tmp/$name"
    head -c "$cut" "$tmp/$name" > "$out/luks1_header/$name"
}
luks1 l1-cbc128 $((4096 + 64000)) --cipher aes-cbc-essiv:sha256 --key-size 128
luks1 l1-xts256 $((4096 + 128000)) --cipher aes-xts-plain64 --key-size 256 --hash sha1
luks1 l1-phdr 1024 --cipher aes-xts-plain64 --key-size 512 --hash sha512

# LUKS2: both 16 KiB copies plus the keyslots area (or only the copies).
luks2() { # name, keyslots size, luksFormat options...
    local name=$1 ks=$2
    shift 2
    truncate -s 4M "$tmp/$name"
    cs luksFormat --type luks2 --luks2-metadata-size 16k --luks2-keyslots-size "$ks" \
        "$@" "$tmp/$name"
}
emit2() { # name, bytes: the LUKS2 image seed (with a leading flags byte) and its JSON
    local name=$1 bytes=$2
    { printf '\x03'; head -c "$bytes" "$tmp/$name"; } > "$out/luks2_header/$name"
    { printf '\x00'; head -c "$bytes" "$tmp/$name"; } > "$out/luks2_header/$name-nofix"
    head -c 16384 "$tmp/$name" | tail -c +4097 | tr -d '\0' > "$out/luks2_json/$name.json"
}
luks2 l2-cbc128 64k --cipher aes-cbc-essiv:sha256 --key-size 128 "${pbkdf2[@]}"
emit2 l2-cbc128 $((32768 + 65536))
luks2 l2-argon 64k --cipher aes-cbc-plain64 --key-size 128 "${argon[@]}" \
    --label fuzzlabel --subsystem fuzzsub --sector-size 4096
emit2 l2-argon $((32768 + 65536))
luks2 l2-two 128k --cipher aes-cbc-essiv:sha256 --key-size 128 "${pbkdf2[@]}"
printf fuzz2 > "$tmp/key2"
cs luksAddKey "${pbkdf2[@]}" --new-keyfile "$tmp/key2" "$tmp/l2-two"
cs config --priority prefer --key-slot 1 "$tmp/l2-two"
cat > "$tmp/token.json" <<'JSON'
{"type":"fuzz-token","keyslots":["0"],"extra":{"nested":[1,2,3]}}
JSON
cs token import --json-file "$tmp/token.json" --token-id 3 "$tmp/l2-two"
emit2 l2-two $((32768 + 131072))
luks2 l2-xts 128k --cipher aes-xts-plain64 --key-size 256 "${pbkdf2[@]}" \
    --offset 4096
emit2 l2-xts 32768
# A damaged primary, so the secondary-copy search has a seed.
cp "$tmp/l2-cbc128" "$tmp/l2-noprimary"
dd if=/dev/zero of="$tmp/l2-noprimary" bs=512 count=1 conv=notrunc status=none
emit2 l2-noprimary $((32768 + 65536))
rm -f "$out/luks2_json/l2-noprimary.json"

# Cipher specs, LUKS1 name/mode pairs and hashes (NUL-separated, see the target).
i=0
for s in 'aes-xts-plain64\0aes\0xts-plain64\0sha256\0abcd' \
    'aes-cbc-essiv:sha256\0aes\0cbc-essiv:sha256\0ripemd160\0abcdefgh' \
    'aes-xts-plain64be\0aes\0xts-plain\0sha512:16\0x' \
    'cipher_null-ecb\0cipher_null\0ecb\0plain\0' \
    'aes-cbc-plain\0AES\0cbc-null\0plain:8\0abcdefghabcdefgh' \
    'aes-ecb\0aes\0ecb\0sha1:20\0abcdefghabcdefghabcdefghabcdefgh'; do
    printf "$s" > "$out/cipher_spec/spec$i"
    i=$((i + 1))
done

# NBD client byte streams: fixed newstyle handshake, then requests.
be32() { printf "$(printf '\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)))"; }
opt() { # option number, payload (printf format)
    local payload
    payload=$(printf "$2" | od -An -tx1 | tr -d ' \n')
    printf 'IHAVEOPT'
    be32 "$1"
    be32 $((${#payload} / 2))
    printf "$2"
}
req() { # flags(16) type(16) offset len [payload bytes]
    printf '\x25\x60\x95\x13'
    printf "$(printf '\\x%02x' $(($1 >> 8)) $(($1 & 255)) $(($2 >> 8)) $(($2 & 255)))"
    printf 'cookie!!'
    be32 0
    be32 "$3"
    be32 "$4"
    if [ -n "${5:-}" ]; then head -c "$4" /dev/zero | tr '\0' "$5"; fi
}
{
    be32 3
    opt 8 ''
    opt 6 '\x00\x00\x00\x04disk\x00\x02\x00\x01\x00\x02'
    opt 3 ''
    opt 7 '\x00\x00\x00\x04disk\x00\x01\x00\x03'
    req 0 0 0 4096
    req 1 1 4096 1024 x
    req 0 3 0 0
    req 0 4 8192 4096
    req 2 6 0 512
    req 0 0 1048064 512
    req 0 2 0 0
} > "$out/nbd_session/go-structured"
{
    be32 1
    opt 5 ''
    opt 1 'disk'
    req 0 1 0 512 y
    req 0 0 0 512
    req 0 7 0 0
    req 0 2 0 0
} > "$out/nbd_session/export-name"
{
    be32 3
    opt 7 '\x00\x00\x00\x02ro\x00\x00'
    req 0 1 0 4096 z
    req 0 0 0 4096
} > "$out/nbd_session/readonly"
{
    be32 3
    opt 2 ''
} > "$out/nbd_session/abort"
{
    # Metadata contexts: LIST everything, SET base:allocation, then BLOCK_STATUS (with and
    # without REQ_ONE), CACHE and a fast WRITE_ZEROES.
    be32 3
    opt 8 ''
    opt 9 '\x00\x00\x00\x04disk\x00\x00\x00\x00'
    opt 10 '\x00\x00\x00\x04disk\x00\x00\x00\x02\x00\x00\x00\x0fbase:allocation\x00\x00\x00\x05base:'
    opt 7 '\x00\x00\x00\x04disk\x00\x00'
    req 0 7 0 65536
    req 8 7 4096 4096
    req 0 5 0 8192
    req 16 6 0 4096
    req 0 2 0 0
} > "$out/nbd_session/meta-context"

# TCRYPT: plaintext headers made valid by the flag byte (magic, both CRCs): version 5,
# sizes and offsets as VeraCrypt writes them, and a zero one.
python3 - "$out/tcrypt_header" <<'PY'
import struct, sys
d = sys.argv[1]
def hdr(version, vol, off):
    h = bytearray(448)
    h[0:4] = b"TRUE"
    struct.pack_into(">HH", h, 4, version, 0x0700)
    struct.pack_into(">QQQQ", h, 28, 0, vol, off, vol)
    struct.pack_into(">II", h, 60, 0, 512)
    return bytes(h)
for name, flags, size, body in [("v5", 7, 1 << 19, hdr(5, 1 << 18, 131072)),
                                ("v2", 7, 1 << 16, hdr(2, 0, 0)),
                                ("zero", 0, 4096, bytes(448))]:
    open(f"{d}/{name}", "wb").write(bytes([flags]) + struct.pack("<I", size) + body)
PY
# BITLK: the boot sector and first FVE metadata block of each of cryptsetup's test images
# (scripts/fetch-cryptsetup-images.sh), the block moved to 4096 and the boot sector's
# offsets pointed at it (the fuzz target's layout); flag byte 0, nothing forced.
bitlk=../target/cryptsetup-tests/bitlk-images
[ -d "$bitlk" ] || { echo "seed.sh: $bitlk missing: run scripts/fetch-cryptsetup-images.sh" >&2; exit 1; }
python3 - "$out/bitlk_header" "$bitlk" <<'PY'
import glob, os, struct, sys
d, src = sys.argv[1:]
for img in sorted(glob.glob(f"{src}/*.img")):
    with open(img, "rb") as f:
        boot = bytearray(f.read(512))
        sb = 424 if boot[3:11] == b"MSWIN4.1" else 160
        meta = struct.unpack_from("<Q", boot, sb + 16)[0]
        f.seek(meta)
        block = f.read(65536)
    size = struct.unpack_from("<I", block, 64)[0]
    for i in range(3):
        struct.pack_into("<Q", boot, sb + 16 + 8 * i, 4096)
    image = bytes(boot) + bytes(4096 - 512) + block[:112 + size]
    open(f"{d}/{os.path.basename(img)[:-4]}", "wb").write(b"\0" + image)
PY
# FVAULT2: cryptsetup's test image's volume header, disk label and decrypted metadata
# blocks (Python cryptography's AES-XTS), moved to the fuzz target's layout; the flag
# byte has the target re-seal and re-encrypt them (bits 0-2) and says how many blocks.
fvault2=../target/cryptsetup-tests/fvault2-images/small
[ -f "$fvault2" ] || { echo "seed.sh: $fvault2 missing: run scripts/fetch-cryptsetup-images.sh" >&2; exit 1; }
python3 - "$out/fvault2_header" "$fvault2" <<'PY'
import struct, sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
d, img = sys.argv[1:]
with open(img, "rb") as f:
    vh = f.read(512)
    bs, label_blk = struct.unpack_from("<IxxxxQ", vh, 96)
    f.seek(label_blk * bs); label = f.read(8192)
    f.seek(label_blk * bs + struct.unpack_from("<I", label, 220)[0]); vg = f.read(40)
    n, start = struct.unpack_from("<Q", vg, 8)[0], struct.unpack_from("<Q", vg, 32)[0]
    f.seek(start * bs)
    blocks = []
    for i in range(n):
        enc = f.read(8192)
        if enc == bytes(8192):
            break
        dec = Cipher(algorithms.AES(vh[176:192] + vh[304:320]), modes.XTS(i.to_bytes(16, "little"))).decryptor()
        blocks.append(dec.update(enc) + dec.finalize())
# Only the blocks the parser reads (0x0019, 0x001A, 0x0305), at most seven.
keep = [b for b in blocks if struct.unpack_from("<H", b, 10)[0] in (0x19, 0x1A, 0x305)][:7]
image = vh + bytes(4096 - 512) + label + vg + bytes(16384 - 4096 - 8192 - 40) + b"".join(keep)
open(f"{d}/small", "wb").write(bytes([7 | len(keep) << 4]) + image)
PY
for d in "$out"/*; do
    echo "seed.sh: $(basename "$d"): $(ls "$d" | wc -l) seeds, $(du -sk "$d" | cut -f1) KiB"
done
