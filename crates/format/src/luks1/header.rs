//! The LUKS1 partition header (`phdr`): 592 big-endian bytes at offset 0, parsed and
//! serialized field by field, and checked against everything a hostile image can get wrong.

use super::{
    KEY_DISABLED, KEY_ENABLED, Luks1Error, MAGIC, NUM_KEYSLOTS, PHDR_DISK_SIZE, PHDR_SIZE,
    SALT_SIZE, SECTOR_SIZE, STRIPES, af_sectors,
};
use crate::{Error, Result};
use cryptblk_crypto::{CipherSpec, HashAlg};

// Field offsets and lengths (LUKS1 On-Disk Format Specification v1.2.3, table 1).
const OFF_VERSION: usize = 6;
const OFF_CIPHER_NAME: usize = 8;
const LEN_CIPHER_NAME: usize = 32;
const OFF_CIPHER_MODE: usize = 40;
const LEN_CIPHER_MODE: usize = 32;
const OFF_HASH_SPEC: usize = 72;
const LEN_HASH_SPEC: usize = 32;
const OFF_PAYLOAD: usize = 104;
const OFF_KEY_BYTES: usize = 108;
const OFF_MK_DIGEST: usize = 112;
pub(crate) const DIGEST_SIZE: usize = 20;
const OFF_MK_SALT: usize = 132;
const OFF_MK_ITER: usize = 164;
const OFF_UUID: usize = 168;
const LEN_UUID: usize = 40;
const OFF_KEYSLOTS: usize = 208;
const KEYSLOT_SIZE: usize = 48;

/// Largest volume key we accept from a header (cryptsetup's LUKS1 limit: 32768 bits).
const MAX_KEY_BYTES: u32 = 4096;
/// Largest key material area of one slot (cryptsetup's `LUKS_MAX_KEYSLOT_SIZE`, 16 MiB).
pub(crate) const MAX_AREA_BYTES: u64 = 16 * 1024 * 1024;

/// One of the eight keyslot descriptors of the phdr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Luks1Keyslot {
    /// `ENABLED` (true) or `DISABLED` (false); any other on-disk value is rejected on read.
    pub active: bool,
    /// PBKDF2 iterations for the passphrase (0 in a wiped slot).
    pub iterations: u32,
    /// PBKDF2 salt for the passphrase.
    pub salt: [u8; SALT_SIZE],
    /// Start of the key material, in 512-byte sectors.
    pub key_material_offset: u32,
    /// AF stripes (4000 in every header cryptsetup writes).
    pub stripes: u32,
}

impl Luks1Keyslot {
    /// A free slot whose material lives at `offset` sectors.
    pub(crate) fn disabled(offset: u32) -> Self {
        Luks1Keyslot {
            active: false,
            iterations: 0,
            salt: [0; SALT_SIZE],
            key_material_offset: offset,
            stripes: STRIPES,
        }
    }
}

/// Every field of the phdr, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Phdr {
    pub cipher_name: String,
    pub cipher_mode: String,
    pub hash_spec: String,
    pub payload_offset: u32,
    pub key_bytes: u32,
    pub mk_digest: [u8; DIGEST_SIZE],
    pub mk_digest_salt: [u8; SALT_SIZE],
    pub mk_digest_iterations: u32,
    pub uuid: String,
    pub slots: [Luks1Keyslot; NUM_KEYSLOTS],
}

fn be32(buf: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]])
}

fn put_be32(buf: &mut [u8], off: usize, v: u32) {
    buf[off..off + 4].copy_from_slice(&v.to_be_bytes());
}

/// A NUL-terminated string field; the NUL must lie inside the field.
fn c_string(buf: &[u8], off: usize, len: usize, field: &'static str) -> Result<String> {
    let raw = &buf[off..off + len];
    let end = raw
        .iter()
        .position(|&b| b == 0)
        .ok_or(Luks1Error::BadString {
            field,
            reason: "not NUL-terminated",
        })?;
    let s = std::str::from_utf8(&raw[..end]).map_err(|_| Luks1Error::BadString {
        field,
        reason: "not valid UTF-8",
    })?;
    Ok(s.to_string())
}

fn put_c_string(buf: &mut [u8], off: usize, len: usize, s: &str) {
    let bytes = s.as_bytes();
    // Callers validated the length; keep at least one NUL regardless.
    let n = bytes.len().min(len - 1);
    buf[off..off + n].copy_from_slice(&bytes[..n]);
    buf[off + n..off + len].fill(0);
}

/// Checks that a string fits its field with its terminating NUL.
pub(crate) fn check_field_len(s: &str, len: usize, field: &'static str) -> Result<()> {
    if s.len() >= len || s.as_bytes().contains(&0) {
        return Err(Luks1Error::BadString {
            field,
            reason: "too long for its field",
        }
        .into());
    }
    Ok(())
}

pub(crate) const CIPHER_NAME_LEN: usize = LEN_CIPHER_NAME;
pub(crate) const CIPHER_MODE_LEN: usize = LEN_CIPHER_MODE;
pub(crate) const HASH_SPEC_LEN: usize = LEN_HASH_SPEC;

impl Phdr {
    /// Parses the raw fields. Only the magic, version and string encoding are checked here;
    /// [`Phdr::validate`] checks the contents.
    pub(crate) fn parse(buf: &[u8]) -> Result<Self> {
        if buf.len() < PHDR_SIZE {
            return Err(Error::Truncated {
                need: PHDR_SIZE as u64,
                have: buf.len() as u64,
            });
        }
        if &buf[..MAGIC.len()] != MAGIC {
            return Err(Error::NotLuks);
        }
        let version = u16::from_be_bytes([buf[OFF_VERSION], buf[OFF_VERSION + 1]]);
        if version != 1 {
            return Err(Luks1Error::UnsupportedVersion(version).into());
        }
        let mut slots: [Luks1Keyslot; NUM_KEYSLOTS] =
            std::array::from_fn(|_| Luks1Keyslot::disabled(0));
        for (i, slot) in slots.iter_mut().enumerate() {
            let o = OFF_KEYSLOTS + i * KEYSLOT_SIZE;
            let state = be32(buf, o);
            slot.active = match state {
                KEY_ENABLED => true,
                KEY_DISABLED => false,
                _ => {
                    return Err(Luks1Error::SlotState {
                        slot: i as u32,
                        state,
                    }
                    .into());
                }
            };
            slot.iterations = be32(buf, o + 4);
            slot.salt.copy_from_slice(&buf[o + 8..o + 8 + SALT_SIZE]);
            slot.key_material_offset = be32(buf, o + 40);
            slot.stripes = be32(buf, o + 44);
        }
        let mut mk_digest = [0u8; DIGEST_SIZE];
        mk_digest.copy_from_slice(&buf[OFF_MK_DIGEST..OFF_MK_DIGEST + DIGEST_SIZE]);
        let mut mk_digest_salt = [0u8; SALT_SIZE];
        mk_digest_salt.copy_from_slice(&buf[OFF_MK_SALT..OFF_MK_SALT + SALT_SIZE]);
        Ok(Phdr {
            cipher_name: c_string(buf, OFF_CIPHER_NAME, LEN_CIPHER_NAME, "cipher_name")?,
            cipher_mode: c_string(buf, OFF_CIPHER_MODE, LEN_CIPHER_MODE, "cipher_mode")?,
            hash_spec: c_string(buf, OFF_HASH_SPEC, LEN_HASH_SPEC, "hash_spec")?,
            payload_offset: be32(buf, OFF_PAYLOAD),
            key_bytes: be32(buf, OFF_KEY_BYTES),
            mk_digest,
            mk_digest_salt,
            mk_digest_iterations: be32(buf, OFF_MK_ITER),
            uuid: c_string(buf, OFF_UUID, LEN_UUID, "uuid")?,
            slots,
        })
    }

    pub(crate) fn to_bytes(&self) -> [u8; PHDR_SIZE] {
        let mut b = [0u8; PHDR_SIZE];
        b[..MAGIC.len()].copy_from_slice(MAGIC);
        b[OFF_VERSION..OFF_VERSION + 2].copy_from_slice(&1u16.to_be_bytes());
        put_c_string(&mut b, OFF_CIPHER_NAME, LEN_CIPHER_NAME, &self.cipher_name);
        put_c_string(&mut b, OFF_CIPHER_MODE, LEN_CIPHER_MODE, &self.cipher_mode);
        put_c_string(&mut b, OFF_HASH_SPEC, LEN_HASH_SPEC, &self.hash_spec);
        put_be32(&mut b, OFF_PAYLOAD, self.payload_offset);
        put_be32(&mut b, OFF_KEY_BYTES, self.key_bytes);
        b[OFF_MK_DIGEST..OFF_MK_DIGEST + DIGEST_SIZE].copy_from_slice(&self.mk_digest);
        b[OFF_MK_SALT..OFF_MK_SALT + SALT_SIZE].copy_from_slice(&self.mk_digest_salt);
        put_be32(&mut b, OFF_MK_ITER, self.mk_digest_iterations);
        put_c_string(&mut b, OFF_UUID, LEN_UUID, &self.uuid);
        for (i, s) in self.slots.iter().enumerate() {
            let o = OFF_KEYSLOTS + i * KEYSLOT_SIZE;
            put_be32(&mut b, o, if s.active { KEY_ENABLED } else { KEY_DISABLED });
            put_be32(&mut b, o + 4, s.iterations);
            b[o + 8..o + 8 + SALT_SIZE].copy_from_slice(&s.salt);
            put_be32(&mut b, o + 40, s.key_material_offset);
            put_be32(&mut b, o + 44, s.stripes);
        }
        b
    }

    /// Checks every field that later code relies on and returns the parsed cipher and hash.
    pub(crate) fn validate(&self) -> Result<(CipherSpec, HashAlg)> {
        let cipher =
            CipherSpec::from_parts(&self.cipher_name, &self.cipher_mode).map_err(|_| {
                Luks1Error::UnsupportedCipher(format!("{}-{}", self.cipher_name, self.cipher_mode))
            })?;
        if self.key_bytes == 0
            || self.key_bytes > MAX_KEY_BYTES
            || !cipher.valid_key_len(self.key_bytes as usize)
        {
            return Err(Luks1Error::KeyBytes {
                cipher: cipher.to_string(),
                key_bytes: self.key_bytes,
            }
            .into());
        }
        let hash = HashAlg::from_name(&self.hash_spec)
            .map_err(|_| Luks1Error::UnsupportedHash(self.hash_spec.clone()))?;
        if self.mk_digest_iterations == 0 {
            return Err(Luks1Error::DigestIterations.into());
        }
        self.check_keyslots()?;
        Ok((cipher, hash))
    }

    /// Area of slot `i` as (start, end) in 512-byte sectors, without overflow.
    pub(crate) fn slot_area(&self, i: usize) -> (u64, u64) {
        let s = &self.slots[i];
        let start = u64::from(s.key_material_offset);
        (
            start,
            start + af_sectors(self.key_bytes as usize, s.stripes),
        )
    }

    fn check_keyslots(&self) -> Result<()> {
        let bad = |slot: usize, reason: String| -> Error {
            Luks1Error::SlotArea {
                slot: slot as u32,
                reason,
            }
            .into()
        };
        for (i, s) in self.slots.iter().enumerate() {
            // cryptsetup (LUKS_check_keyslots) insists on 4000 stripes in every slot, free
            // ones included since they get reused, and refuses the header otherwise.
            if s.stripes != STRIPES {
                return Err(Luks1Error::Stripes {
                    slot: i as u32,
                    stripes: s.stripes,
                }
                .into());
            }
            if s.active && s.iterations == 0 {
                return Err(Luks1Error::SlotIterations { slot: i as u32 }.into());
            }
            let (start, end) = self.slot_area(i);
            if (end - start) * SECTOR_SIZE > MAX_AREA_BYTES {
                return Err(Luks1Error::Stripes {
                    slot: i as u32,
                    stripes: s.stripes,
                }
                .into());
            }
            if start * SECTOR_SIZE < PHDR_DISK_SIZE {
                return Err(bad(
                    i,
                    format!("material at sector {start} overlaps the header"),
                ));
            }
            // With a detached header the payload offset is 0 and bounds nothing.
            let payload = u64::from(self.payload_offset);
            if payload != 0 && end > payload {
                return Err(bad(
                    i,
                    format!(
                        "material (sectors {start}..{end}) reaches past the payload offset {payload}"
                    ),
                ));
            }
        }
        let mut order: Vec<usize> = (0..NUM_KEYSLOTS).collect();
        order.sort_by_key(|&i| self.slots[i].key_material_offset);
        for w in order.windows(2) {
            let (a, b) = (w[0], w[1]);
            if self.slot_area(b).0 < self.slot_area(a).1 {
                return Err(Luks1Error::SlotOverlap {
                    a: a as u32,
                    b: b as u32,
                }
                .into());
            }
        }
        Ok(())
    }

    /// End of the last keyslot area, in sectors (cryptsetup's `LUKS_device_sectors`).
    pub(crate) fn end_sectors(&self) -> u64 {
        (0..NUM_KEYSLOTS)
            .map(|i| self.slot_area(i).1)
            .max()
            .unwrap_or(0)
    }
}
