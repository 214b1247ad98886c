#!/usr/bin/env python3
"""Writes a VeraCrypt volume whose headers are keyed with Argon2id (VeraCrypt 1.26.29+),
made independently of cryptblk: Argon2id and AES-XTS from Python `cryptography` (OpenSSL),
the layout from VeraCrypt's documentation and sources (Volumes.c, Pkcs5.c): a 512-byte
header (64-byte salt, then 448 bytes AES-XTS under the first 64 of 192 Argon2id bytes,
one lane, PIM-derived costs), 128 KiB header areas at both ends (the backup header under
its own salt), AES-XTS data from 128 KiB with IVs counted from the volume's start.

usage: veracrypt-argon2-create.py IMAGE PASSPHRASE PIM SIZE PLAINTEXT_OUT
(PIM 0: VeraCrypt's default, 12). The data area is filled with a pattern, which is also
written, decrypted, to PLAINTEXT_OUT.
"""
import os, struct, sys, zlib
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.argon2 import Argon2id

image, passphrase, pim, size, plain_out = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
AREA = 128 * 1024
data_size = size - 2 * AREA

def costs(pim):
    # VeraCrypt's get_argon2_params.
    pim = pim or 12
    mib = min(64 + (pim - 1) * 32, 1024)
    passes = 3 + (pim - 1) // 3 if pim <= 31 else 13 + (pim - 31)
    return passes, mib * 1024

def xts(key, tweak, data, enc=True):
    c = Cipher(algorithms.AES(key), modes.XTS(tweak))
    op = c.encryptor() if enc else c.decryptor()
    return op.update(data) + op.finalize()

master = os.urandom(64)  # AES-256-XTS: data key, tweak key
fields = bytearray(448)
fields[0:4] = b"VERA"
struct.pack_into(">HH", fields, 4, 5, 0x010B)
struct.pack_into(">I", fields, 8, zlib.crc32(master + bytes(192)))
struct.pack_into(">QQQQII", fields, 28, 0, data_size, AREA, data_size, 0, 512)
struct.pack_into(">I", fields, 188, zlib.crc32(bytes(fields[:188])))
fields[192:256] = master

def header():
    salt = os.urandom(64)
    passes, kib = costs(pim)
    dk = Argon2id(salt=salt, length=192, iterations=passes, lanes=1, memory_cost=kib).derive(passphrase)
    return salt + xts(dk[:64], bytes(16), bytes(fields))

pattern = bytes((i * 2654435761 >> 13) & 0xFF for i in range(data_size))
with open(image, "wb") as f:
    f.truncate(size)
    f.write(header())
    f.seek(AREA)
    for s in range(data_size // 512):
        f.write(xts(master, (AREA // 512 + s).to_bytes(16, "little"), pattern[s * 512:(s + 1) * 512]))
    f.seek(size - AREA)
    f.write(header())
with open(plain_out, "wb") as f:
    f.write(pattern)
