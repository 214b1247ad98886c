#!/usr/bin/env python3
"""Decrypts LEN bytes of an aes-xts-plain64 mapping (512-byte sectors, IVs from IVOFFSET,
default 0) that starts at OFFSET in IMAGE, with the volume key in hex, to standard output:
an AES-XTS independent of cryptblk's (Python cryptography, i.e. OpenSSL).

usage: xts-decrypt.py KEYHEX IMAGE OFFSET START LEN [IVOFFSET]
(START, LEN: bytes into the mapping; IVOFFSET: 512-byte sectors)
"""
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

key = bytes.fromhex(sys.argv[1])
image, offset, start, length = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
iv_offset = int(sys.argv[6]) if len(sys.argv) > 6 else 0
assert start % 512 == 0 and length % 512 == 0
out = sys.stdout.buffer
with open(image, "rb") as f:
    f.seek(offset + start)
    for sector in range(start // 512, (start + length) // 512):
        data = f.read(512)
        assert len(data) == 512, "image ends early"
        tweak = (iv_offset + sector).to_bytes(16, "little")
        d = Cipher(algorithms.AES(key), modes.XTS(tweak)).decryptor()
        out.write(d.update(data) + d.finalize())
