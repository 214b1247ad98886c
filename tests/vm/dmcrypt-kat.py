#!/usr/bin/env python3
"""Known-answer vectors from the kernel's dm-crypt itself, for every cipher, mode and IV
generator cryptblk implements beyond AES-XTS/CBC (those have NIST/IEEE vectors).

Runs INSIDE the test VM (tests/vm/vm.sh; a stock kernel, as root):

    bash tests/vm/vm.sh run -r DIR "python3 /results/dmcrypt-kat.py > /results/dmcrypt.txt"

For each case it maps a dm-crypt target (dmsetup, the spec, a fixed key, IV offset,
sector size) over a loop device, writes a known plaintext at a known sector through the
mapping with O_DIRECT, and records the ciphertext the kernel left in the backing file.
Keys and plaintexts are fixed pseudo-random bytes (SHA-512 of the case name), so the file
can be regenerated and compared. The output is crates/crypto/tests/data/dmcrypt.txt.
"""
import hashlib
import os
import subprocess
import sys

# name, spec, key bits, sector size, iv_large_sectors, iv_offset, first sector, sectors
CASES = [
    ("serpent-xts-plain64 256", "serpent-xts-plain64", 256, 512, 0, 0, 3, 2),
    ("serpent-xts-plain64 512", "serpent-xts-plain64", 512, 512, 0, 9, 1, 2),
    ("serpent-xts-plain64 4096 large", "serpent-xts-plain64", 512, 4096, 1, 0, 2, 2),
    ("twofish-xts-plain64 256", "twofish-xts-plain64", 256, 512, 0, 0, 5, 2),
    ("twofish-xts-plain64 512", "twofish-xts-plain64", 512, 512, 0, 0, 0, 2),
    ("twofish-xts-plain64 384", "twofish-xts-plain64", 384, 512, 0, 0, 2, 1),
    ("camellia-xts-plain64 256", "camellia-xts-plain64", 256, 512, 0, 0, 4, 2),
    ("camellia-xts-plain64 512 4096", "camellia-xts-plain64", 512, 4096, 0, 0, 1, 1),
    ("serpent-cbc-essiv:sha256", "serpent-cbc-essiv:sha256", 256, 512, 0, 0, 6, 2),
    ("twofish-cbc-plain", "twofish-cbc-plain", 128, 512, 0, 3, 2, 2),
    ("camellia-cbc-plain64be", "camellia-cbc-plain64be", 192, 512, 0, 0, 7, 2),
    ("camellia-cbc-essiv:sha256 4096 large", "camellia-cbc-essiv:sha256", 256, 4096, 1, 0, 3, 1),
    ("serpent-ecb", "serpent-ecb", 256, 512, 0, 0, 1, 1),
    ("twofish-ecb", "twofish-ecb", 192, 512, 0, 0, 1, 1),
    ("camellia-ecb", "camellia-ecb", 128, 512, 0, 0, 1, 1),
    ("blowfish-cbc-essiv:sha256", "blowfish-cbc-essiv:sha256", 256, 512, 0, 0, 2, 2),
    ("blowfish-cbc-plain64 448", "blowfish-cbc-plain64", 448, 512, 0, 0, 3, 2),
    ("cast5-cbc-plain", "cast5-cbc-plain", 128, 512, 0, 0, 4, 2),
    ("des3_ede-cbc-plain64", "des3_ede-cbc-plain64", 192, 512, 0, 0, 5, 2),
    ("blowfish-cbc-benbi", "blowfish-cbc-benbi", 256, 512, 0, 0, 3, 2),
    ("aes-lrw-benbi 256", "aes-lrw-benbi", 256, 512, 0, 0, 3, 2),
    ("aes-lrw-benbi 384", "aes-lrw-benbi", 384, 512, 0, 0, 0, 2),
    ("aes-lrw-plain64 384", "aes-lrw-plain64", 384, 512, 0, 0, 6, 2),
    ("serpent-lrw-benbi 384", "serpent-lrw-benbi", 384, 512, 0, 0, 2, 2),
    ("twofish-lrw-benbi 4096 large", "twofish-lrw-benbi", 256, 4096, 1, 0, 1, 1),
    ("aes-cbc-benbi", "aes-cbc-benbi", 256, 512, 0, 0, 9, 2),
    ("aes-xts-benbi", "aes-xts-benbi", 512, 512, 0, 0, 4, 2),
    ("aes-cbc-null", "aes-cbc-null", 128, 512, 0, 0, 2, 2),
    ("aes-cbc-eboiv 512", "aes-cbc-eboiv", 256, 512, 0, 0, 3, 2),
    ("aes-cbc-eboiv 4096 large", "aes-cbc-eboiv", 128, 4096, 1, 0, 2, 1),
    ("aes-cbc-elephant 256", "aes-cbc-elephant", 256, 512, 0, 0, 3, 2),
    ("aes-cbc-elephant 512 offset", "aes-cbc-elephant", 512, 512, 0, 100, 1, 3),
    ("aes-cbc-elephant 4096 large", "aes-cbc-elephant", 256, 4096, 1, 0, 2, 2),
    ("aes-cbc-elephant 512 4096 large", "aes-cbc-elephant", 512, 4096, 1, 8, 0, 1),
    ("aes-xts-essiv:sha256", "aes-xts-essiv:sha256", 512, 512, 0, 0, 2, 2),
    ("aes-xts-essiv:wp256", "aes-xts-essiv:wp256", 512, 512, 0, 0, 1, 2),
    ("aes-cbc-tcw", "aes-cbc-tcw", 512, 512, 0, 0, 3, 2),
    ("aes-cbc-tcw offset", "aes-cbc-tcw", 512, 512, 0, 256, 1, 2),
    ("serpent-cbc-tcw", "serpent-cbc-tcw", 512, 512, 0, 0, 2, 2),
    ("blowfish-cbc-tcw", "blowfish-cbc-tcw", 256 + 64 + 128, 512, 0, 0, 5, 2),
    ("aes-cbc-lmk", "aes-cbc-lmk", 256, 512, 0, 0, 3, 2),
    ("aes-cbc-lmk 128", "aes-cbc-lmk", 128, 512, 0, 0, 0, 2),
    ("aes:4-cbc-lmk v2", "aes:4-cbc-lmk", 4 * 128, 512, 0, 0, 2, 5),
    ("aes:64-cbc-lmk v2", "aes:64-cbc-lmk", 64 * 128, 512, 0, 0, 126, 4),
    ("aes:64-cbc-lmk v3", "aes:64-cbc-lmk", 65 * 256, 512, 0, 8, 62, 4),
    ("serpent:2-xts-plain64", "serpent:2-xts-plain64", 2 * 256, 512, 0, 0, 3, 3),
]


def stream(label, n):
    out = b""
    i = 0
    while len(out) < n:
        out += hashlib.sha512(f"{label}/{i}".encode()).digest()
        i += 1
    return out[:n]


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, **kw).stdout


def one(case):
    name, spec, bits, ss, large, iv_off, first, count = case
    key = stream("key " + name, bits // 8)
    pt = stream("pt " + name, ss * count)
    img = "/tmp/kat.img"
    with open(img, "wb") as f:
        f.truncate(1 << 20)
    loop = sh("losetup", "-f", "--show", img).decode().strip()
    try:
        opts = ""
        if ss != 512 or large:
            params = [f"sector_size:{ss}"] + (["iv_large_sectors"] if large else [])
            opts = f" {len(params)} " + " ".join(params)
        table = f"0 {(1 << 20) // 512} crypt {spec} {key.hex()} {iv_off} {loop} 0{opts}"
        sh("dmsetup", "create", "kat", input=table.encode())
        try:
            fd = os.open("/dev/mapper/kat", os.O_RDWR | os.O_DIRECT)
            try:
                import mmap

                buf = mmap.mmap(-1, len(pt))
                buf.write(pt)
                os.pwritev(fd, [buf], first * ss)
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            sh("dmsetup", "remove", "kat")
    finally:
        sh("losetup", "-d", loop)
    with open(img, "rb") as f:
        f.seek(first * ss)
        ct = f.read(len(pt))
    os.unlink(img)
    assert ct != pt, name
    return name, spec, key, ss, large, iv_off, first, pt, ct


def wrap(label, data):
    h = data.hex()
    lines = [h[i : i + 64] for i in range(0, len(h), 64)]
    return f"{label} = " + ("\n" + " " * (len(label) + 3)).join(lines)


def main():
    print("# dm-crypt known answers: ciphertext the kernel's dm-crypt wrote (tests/vm/dmcrypt-kat.py")
    print(f"# in the test VM, Linux {os.uname().release}). Keys and plaintexts: SHA-512 streams of")
    print("# the case name. `sector` counts sectors of `sector_size` from the mapping's start;")
    print("# iv_offset is dm-crypt's table parameter, large_sectors its iv_large_sectors.")
    for m in ["loop", "dm_crypt", "serpent_generic", "twofish_generic", "camellia_generic", "blowfish_generic",
              "cast5_generic", "des_generic", "lrw", "wp512", "essiv", "md5", "crc32_generic"]:
        subprocess.run(["modprobe", m], capture_output=True)
    failed = 0
    for case in CASES:
        try:
            name, spec, key, ss, large, iv_off, first, pt, ct = one(case)
        except Exception as e:  # report every case, fail at the end
            err = getattr(e, "stderr", b"") or b""
            print(f"FAILED {case[0]}: {e} {err.decode(errors='replace').strip()}", file=sys.stderr)
            failed += 1
            continue
        print()
        print(f"name = {name}")
        print(f"spec = {spec}")
        print(wrap("key", key))
        print(f"sector_size = {ss}")
        print(f"large_sectors = {large}")
        print(f"iv_offset = {iv_off}")
        print(f"sector = {first}")
        print(wrap("pt", pt))
        print(wrap("ct", ct))
    sys.exit(1 if failed else 0)


main()
