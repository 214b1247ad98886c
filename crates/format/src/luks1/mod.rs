//! LUKS1 (LUKS1 On-Disk Format Specification v1.2.3), laid out exactly as cryptsetup's
//! `lib/luks1` does, so volumes move freely between cryptsetup and cryptblk.
//!
//! Layout written by [`Luks1Header::format`]: the 592-byte phdr at offset 0 (cryptsetup
//! writes it as a 1024-byte struct whose tail is zero), keyslot 0's material at 4096 bytes,
//! each slot's area (`key_bytes * 4000` rounded up to 512) rounded up to 4096, and the
//! payload aligned to 1 MiB unless an offset is given (0 with a detached header).

mod header;
mod keyslot;
mod repair;

#[cfg(test)]
mod tests;

use std::fmt;

use crate::Storage;
use crate::{Error, FormatOptions, KeyslotInfo, LuksHeader, Result};
use cryptblk_crypto::{
    BlockCipherAlg, CipherSpec, HashAlg, IvOptions, Kdf, KdfKind, KdfRequest, SecretBytes,
    constant_time_eq,
};
use header::{CIPHER_MODE_LEN, CIPHER_NAME_LEN, DIGEST_SIZE, HASH_SPEC_LEN, MAX_AREA_BYTES};
use keyslot::SlotCrypto;

pub use header::Luks1Keyslot;
pub(crate) use header::Phdr;
pub use repair::{Luks1Repair, repair};

/// The LUKS magic, shared by LUKS1 and the LUKS2 primary header.
pub const MAGIC: &[u8] = b"LUKS\xba\xbe";
/// Size of the phdr fields.
pub const PHDR_SIZE: usize = 592;
/// Size cryptsetup writes (the phdr struct padded with zeros to 1024 bytes).
pub const PHDR_DISK_SIZE: u64 = 1024;
/// Keyslot descriptors in the phdr (`LUKS_NUMKEYS`).
pub const NUM_KEYSLOTS: usize = 8;
/// Length in bytes of the `mk-digest-salt` field and of each keyslot's `salt`
/// (`LUKS_SALTSIZE`).
pub const SALT_SIZE: usize = 32;
/// AF stripes of every keyslot cryptsetup writes.
pub const STRIPES: u32 = 4000;
/// Keyslot `active` field value of a slot holding key material (`LUKS_KEY_ENABLED`).
pub const KEY_ENABLED: u32 = 0x00AC_71F3;
/// Keyslot `active` field value of a free slot (`LUKS_KEY_DISABLED`).
pub const KEY_DISABLED: u32 = 0x0000_DEAD;
/// cryptsetup: minimum PBKDF2 iterations of the volume key digest and of keyslots.
pub const MKD_ITERATIONS_MIN: u32 = 1000;
/// cryptsetup: the digest gets the iterations of this many milliseconds (`LUKS_MKD_ITERATIONS_MS`).
pub const MKD_ITERATIONS_MS: u32 = 125;

const SECTOR_SIZE: u64 = 512;
/// Keyslot areas start 4096-aligned (`LUKS_ALIGN_KEYSLOTS`), in sectors.
const ALIGN_KEYSLOTS_SECTORS: u64 = 4096 / SECTOR_SIZE;
/// Default payload alignment: 1 MiB.
const DEFAULT_ALIGNMENT_SECTORS: u64 = 2048;

/// Sectors of AF material for a key of `key_bytes` split into `stripes` (rounded up).
pub(crate) fn af_sectors(key_bytes: usize, stripes: u32) -> u64 {
    (key_bytes as u64 * u64::from(stripes)).div_ceil(SECTOR_SIZE)
}

/// What can be wrong with a LUKS1 header.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Luks1Error {
    /// LUKS magic with a version other than 1.
    UnsupportedVersion(u16),
    /// A string field is not NUL-terminated inside its field or not UTF-8, or (when
    /// formatting) a value is too long for its field.
    BadString {
        /// The phdr field, as this crate names it: "cipher_name", "cipher_mode", "hash_spec"
        /// or "uuid".
        field: &'static str,
        /// What is wrong: "not NUL-terminated", "not valid UTF-8" or "too long for its field".
        reason: &'static str,
    },
    /// The `cipher-name` and `cipher-mode` fields (given joined by `-`) name a cipher or
    /// mode this implementation does not support.
    UnsupportedCipher(String),
    /// The `hash-spec` field (given) names a hash this implementation does not support.
    UnsupportedHash(String),
    /// `key_bytes` does not fit the cipher (or is 0 / absurdly large).
    KeyBytes {
        /// The header's cipher spec.
        cipher: String,
        /// The phdr `key-bytes` value: volume key length in bytes.
        key_bytes: u32,
    },
    /// The volume key digest has 0 iterations.
    DigestIterations,
    /// A keyslot state that is neither ENABLED nor DISABLED.
    SlotState {
        /// Keyslot number (0..8).
        slot: u32,
        /// The on-disk `active` value.
        state: u32,
    },
    /// A slot (free or active) whose stripes are not 4000, as cryptsetup requires, or
    /// whose area is larger than LUKS1 allows (16 MiB).
    Stripes {
        /// Keyslot number (0..8).
        slot: u32,
        /// The slot's `stripes` field.
        stripes: u32,
    },
    /// Active slot with 0 PBKDF2 iterations.
    SlotIterations {
        /// Keyslot number (0..8).
        slot: u32,
    },
    /// Key material area overlaps the phdr or reaches into the payload.
    SlotArea {
        /// Keyslot number (0..8).
        slot: u32,
        /// Where the area lies and what it collides with, in sectors.
        reason: String,
    },
    /// Two key material areas overlap.
    SlotOverlap {
        /// Keyslot whose area starts first.
        a: u32,
        /// Keyslot whose area starts inside `a`'s.
        b: u32,
    },
    /// A volume key that does not match the header digest was given to store.
    VolumeKeyMismatch,
}

impl fmt::Display for Luks1Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Luks1Error::UnsupportedVersion(v) => write!(f, "unsupported LUKS version {v}"),
            Luks1Error::BadString { field, reason } => write!(f, "header field {field} {reason}"),
            Luks1Error::UnsupportedCipher(c) => write!(f, "unsupported cipher '{c}'"),
            Luks1Error::UnsupportedHash(h) => write!(f, "unsupported hash '{h}'"),
            Luks1Error::KeyBytes { cipher, key_bytes } => {
                write!(
                    f,
                    "key size {key_bytes} bytes is invalid for cipher {cipher}"
                )
            }
            Luks1Error::DigestIterations => write!(f, "volume key digest has 0 iterations"),
            Luks1Error::SlotState { slot, state } => {
                write!(f, "keyslot {slot} has invalid state 0x{state:08x}")
            }
            Luks1Error::Stripes { slot, stripes } => {
                write!(f, "keyslot {slot} has an invalid stripe count {stripes}")
            }
            Luks1Error::SlotIterations { slot } => write!(f, "keyslot {slot} has 0 iterations"),
            Luks1Error::SlotArea { slot, reason } => {
                write!(f, "keyslot {slot} is invalid: {reason}")
            }
            Luks1Error::SlotOverlap { a, b } => {
                write!(f, "key material of keyslots {a} and {b} overlaps")
            }
            Luks1Error::VolumeKeyMismatch => {
                write!(f, "volume key does not match the header digest")
            }
        }
    }
}

impl std::error::Error for Luks1Error {}

/// A validated LUKS1 header. Holds no secrets (salts and the key digest are public).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Luks1Header {
    phdr: Phdr,
    cipher: CipherSpec,
    hash: HashAlg,
}

impl Luks1Header {
    /// Parses and validates a phdr from memory (at least 592 bytes; the device-size check of
    /// [`Luks1Header::read`] is not done).
    pub fn from_bytes(buf: &[u8]) -> Result<Self> {
        let phdr = Phdr::parse(buf)?;
        let (cipher, hash) = phdr.validate()?;
        Ok(Luks1Header { phdr, cipher, hash })
    }

    /// Reads and validates the header at offset 0 of `dev`; the device must also hold every
    /// keyslot area.
    pub fn read(dev: &mut dyn Storage) -> Result<Self> {
        let have = dev.size()?;
        if have < PHDR_SIZE as u64 {
            return Err(Error::Truncated {
                need: PHDR_SIZE as u64,
                have,
            });
        }
        let mut buf = [0u8; PHDR_SIZE];
        dev.read_at(&mut buf, 0)?;
        let hdr = Self::from_bytes(&buf)?;
        let need = hdr.header_size();
        if have < need {
            return Err(Error::Truncated { need, have });
        }
        Ok(hdr)
    }

    /// A header from its fields (a conversion from LUKS2), validated as a read one is.
    pub(crate) fn from_phdr(phdr: Phdr) -> Result<Self> {
        let (cipher, hash) = phdr.validate()?;
        Ok(Luks1Header { phdr, cipher, hash })
    }

    /// The header's fields (a conversion to LUKS2).
    pub(crate) fn phdr(&self) -> &Phdr {
        &self.phdr
    }

    /// The 592 bytes of the phdr.
    pub fn to_bytes(&self) -> [u8; PHDR_SIZE] {
        self.phdr.to_bytes()
    }

    /// Writes the phdr (zero-padded to 1024 bytes, as cryptsetup does) at offset 0.
    /// Does not sync.
    pub fn write(&self, dev: &mut dyn Storage) -> Result<()> {
        let mut buf = [0u8; PHDR_DISK_SIZE as usize];
        buf[..PHDR_SIZE].copy_from_slice(&self.phdr.to_bytes());
        dev.write_at(&buf, 0)?;
        Ok(())
    }

    fn write_synced(&self, dev: &mut dyn Storage) -> Result<()> {
        self.write(dev)?;
        dev.sync()?;
        Ok(())
    }

    /// Creates a LUKS1 volume header on `dev` with `volume_key` stored under `passphrase`
    /// in `opts.keyslot` (default 0), exactly as `cryptsetup luksFormat --type luks1`.
    ///
    /// The header area is wiped first: zeros from 0 to the payload offset (only the first
    /// 4096 bytes for a detached header), then random data over every keyslot area.
    ///
    /// Digest iterations follow cryptsetup's `LUKS_generate_phdr`: the PBKDF2 speed measured
    /// for the keyslot times 125 ms, at least 1000. With `--pbkdf-force-iterations`
    /// (`opts.kdf.forced_iterations`) cryptsetup does not benchmark and sets the digest to the
    /// minimum, 1000 iterations, whatever the forced keyslot count is; so do we.
    pub fn format(
        dev: &mut dyn Storage,
        opts: &FormatOptions,
        volume_key: &[u8],
        passphrase: &[u8],
    ) -> Result<Self> {
        check_options(opts, volume_key)?;
        let key_bytes = opts.key_len;
        let cipher_name = opts.cipher.cipher_name().to_string();
        let cipher_mode = opts.cipher.cipher_mode();
        let hash_spec = opts.hash.name().to_string();

        let (offsets, payload_offset) = layout(opts, key_bytes)?;
        let uuid = match &opts.uuid {
            Some(u) => parse_uuid(u)?,
            None => uuid::Uuid::new_v4().hyphenated().to_string(),
        };

        let (slot_kdf, digest_iterations) = kdf_plan(opts, key_bytes)?;

        let mut mk_digest_salt = [0u8; SALT_SIZE];
        cryptblk_crypto::random_bytes(&mut mk_digest_salt)?;
        let mut mk_digest = [0u8; DIGEST_SIZE];
        Kdf::Pbkdf2 {
            hash: opts.hash,
            iterations: digest_iterations,
        }
        .derive(volume_key, &mk_digest_salt, &mut mk_digest)?;

        let phdr = Phdr {
            cipher_name,
            cipher_mode,
            hash_spec,
            payload_offset,
            key_bytes: key_bytes as u32,
            mk_digest,
            mk_digest_salt,
            mk_digest_iterations: digest_iterations,
            uuid,
            slots: offsets.map(Luks1Keyslot::disabled),
        };
        let (cipher, hash) = phdr.validate()?;
        let mut hdr = Luks1Header { phdr, cipher, hash };

        wipe_areas(dev, &hdr)?;
        hdr.write_synced(dev)?;

        hdr.store_key(dev, volume_key, passphrase, opts.keyslot, &slot_kdf)?;
        Ok(hdr)
    }

    /// Hash of PBKDF2, the AF splitter and the digest.
    pub fn hash(&self) -> HashAlg {
        self.hash
    }

    /// The `hash_spec` field as stored.
    pub fn hash_spec(&self) -> &str {
        &self.phdr.hash_spec
    }

    /// The `cipher-name` field as stored (e.g. "aes").
    pub fn cipher_name(&self) -> &str {
        &self.phdr.cipher_name
    }

    /// The `cipher-mode` field as stored (e.g. "xts-plain64").
    pub fn cipher_mode(&self) -> &str {
        &self.phdr.cipher_mode
    }

    /// The `mk-digest` field: PBKDF2 of the volume key, used to check a recovered key.
    pub fn mk_digest(&self) -> &[u8; DIGEST_SIZE] {
        &self.phdr.mk_digest
    }

    /// The `mk-digest-salt` field: salt of the volume key digest.
    pub fn mk_digest_salt(&self) -> &[u8; SALT_SIZE] {
        &self.phdr.mk_digest_salt
    }

    /// The `mk-digest-iter` field: PBKDF2 iterations of the volume key digest.
    pub fn mk_digest_iterations(&self) -> u32 {
        self.phdr.mk_digest_iterations
    }

    /// Payload offset in 512-byte sectors (0 with a detached header).
    pub fn payload_offset_sectors(&self) -> u32 {
        self.phdr.payload_offset
    }

    /// The `key-bytes` field: volume key length in bytes.
    pub fn key_bytes(&self) -> u32 {
        self.phdr.key_bytes
    }

    /// Keyslot `i` (0..8).
    pub fn slot(&self, i: u32) -> Option<&Luks1Keyslot> {
        self.phdr.slots.get(i as usize)
    }

    fn slot_crypto(&self, i: usize) -> SlotCrypto<'_> {
        let s = &self.phdr.slots[i];
        SlotCrypto {
            cipher: self.cipher,
            hash: self.hash,
            key_bytes: self.phdr.key_bytes as usize,
            iterations: s.iterations,
            salt: &s.salt,
            stripes: s.stripes,
            offset_sectors: s.key_material_offset,
        }
    }

    fn check_slot_index(slot: u32) -> Result<usize> {
        if (slot as usize) < NUM_KEYSLOTS {
            Ok(slot as usize)
        } else {
            Err(Error::Keyslot(format!(
                "keyslot {slot} out of range 0..{NUM_KEYSLOTS}"
            )))
        }
    }

    /// Stores the key in a free slot with already resolved KDF costs.
    fn store_key(
        &mut self,
        dev: &mut dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: Option<u32>,
        kdf: &Kdf,
    ) -> Result<u32> {
        let Kdf::Pbkdf2 { iterations, .. } = *kdf else {
            return Err(Error::InvalidOption(
                "LUKS1 supports only the pbkdf2 PBKDF".into(),
            ));
        };
        if iterations < MKD_ITERATIONS_MIN {
            return Err(Error::InvalidOption(format!(
                "{iterations} PBKDF2 iterations is below the LUKS1 minimum {MKD_ITERATIONS_MIN}"
            )));
        }
        let i = match slot {
            Some(s) => {
                let i = Self::check_slot_index(s)?;
                if self.phdr.slots[i].active {
                    return Err(Error::Keyslot(format!(
                        "keyslot {s} is active, kill it first"
                    )));
                }
                i
            }
            None => self
                .phdr
                .slots
                .iter()
                .position(|s| !s.active)
                .ok_or(Error::NoFreeKeyslot)?,
        };
        // The area was validated for the slot's stripe count; cryptsetup refuses fewer
        // than the standard 4000.
        let stripes = self.phdr.slots[i].stripes;
        if stripes < STRIPES {
            return Err(Error::Keyslot(format!(
                "keyslot {i} has too few stripes ({stripes})"
            )));
        }
        let mut salt = [0u8; SALT_SIZE];
        cryptblk_crypto::random_bytes(&mut salt)?;
        let mut new_slot = Luks1Keyslot {
            active: false,
            iterations,
            salt,
            key_material_offset: self.phdr.slots[i].key_material_offset,
            stripes,
        };
        {
            let mut sc = self.slot_crypto(i);
            sc.iterations = new_slot.iterations;
            sc.salt = &new_slot.salt;
            sc.stripes = new_slot.stripes;
            sc.store(dev, volume_key, passphrase)?;
        }
        new_slot.active = true;
        let old = std::mem::replace(&mut self.phdr.slots[i], new_slot);
        if let Err(e) = self.write_synced(dev) {
            self.phdr.slots[i] = old;
            return Err(e);
        }
        Ok(i as u32)
    }
}

fn parse_uuid(u: &str) -> Result<String> {
    // libuuid's uuid_parse accepts only the 36-character hyphenated form; uuid_unparse
    // writes it back in lower case.
    match uuid::Uuid::try_parse(u) {
        Ok(p) if u.len() == 36 => Ok(p.hyphenated().to_string()),
        _ => Err(Error::InvalidOption(format!(
            "wrong LUKS UUID format '{u}'"
        ))),
    }
}

impl LuksHeader for Luks1Header {
    fn version(&self) -> u8 {
        1
    }
    fn set_uuid(&mut self, dev: &mut dyn Storage, uuid: &str) -> Result<()> {
        let uuid = parse_uuid(uuid)?;
        let old = std::mem::replace(&mut self.phdr.uuid, uuid);
        if let Err(e) = self.write_synced(dev) {
            self.phdr.uuid = old;
            return Err(e);
        }
        Ok(())
    }

    fn uuid(&self) -> &str {
        &self.phdr.uuid
    }

    fn cipher(&self) -> CipherSpec {
        self.cipher
    }

    fn key_len(&self) -> usize {
        self.phdr.key_bytes as usize
    }

    fn sector_size(&self) -> u32 {
        SECTOR_SIZE as u32
    }

    fn iv_options(&self) -> IvOptions {
        IvOptions::default()
    }

    fn data_offset(&self) -> u64 {
        u64::from(self.phdr.payload_offset) * SECTOR_SIZE
    }

    fn data_length(&self) -> Option<u64> {
        None
    }

    fn header_size(&self) -> u64 {
        self.phdr.end_sectors() * SECTOR_SIZE
    }

    fn keyslots(&self) -> Vec<KeyslotInfo> {
        self.phdr
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let (start, end) = self.phdr.slot_area(i);
                KeyslotInfo {
                    id: i as u32,
                    active: s.active,
                    kdf: s.active.then_some(Kdf::Pbkdf2 {
                        hash: self.hash,
                        iterations: s.iterations,
                    }),
                    salt: s.salt.to_vec(),
                    area_offset: start * SECTOR_SIZE,
                    area_size: (end - start) * SECTOR_SIZE,
                    stripes: s.stripes,
                    af_hash: self.hash,
                }
            })
            .collect()
    }

    fn max_keyslots(&self) -> u32 {
        NUM_KEYSLOTS as u32
    }

    fn unlock(
        &self,
        dev: &mut dyn Storage,
        passphrase: &[u8],
        slot: Option<u32>,
    ) -> Result<(u32, SecretBytes)> {
        let candidates: Vec<usize> = match slot {
            Some(s) => {
                let i = Self::check_slot_index(s)?;
                if !self.phdr.slots[i].active {
                    return Err(Error::Keyslot(format!("keyslot {s} is not active")));
                }
                vec![i]
            }
            None => (0..NUM_KEYSLOTS)
                .filter(|&i| self.phdr.slots[i].active)
                .collect(),
        };
        if candidates.is_empty() {
            return Err(Error::NoUsableKeyslot);
        }
        for i in candidates {
            let key = self.slot_crypto(i).open(dev, passphrase)?;
            if self.verify_volume_key(&key)? {
                // cryptsetup accepts only the empty passphrase with cipher_null.
                if self.cipher.cipher == BlockCipherAlg::Null && !passphrase.is_empty() {
                    continue;
                }
                return Ok((i as u32, key));
            }
        }
        Err(Error::WrongPassphrase)
    }

    fn verify_volume_key(&self, key: &[u8]) -> Result<bool> {
        if key.len() != self.phdr.key_bytes as usize {
            return Ok(false);
        }
        let mut digest = [0u8; DIGEST_SIZE];
        Kdf::Pbkdf2 {
            hash: self.hash,
            iterations: self.phdr.mk_digest_iterations,
        }
        .derive(key, &self.phdr.mk_digest_salt, &mut digest)?;
        Ok(constant_time_eq(&digest, &self.phdr.mk_digest))
    }

    fn add_keyslot(
        &mut self,
        dev: &mut dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: Option<u32>,
        kdf: &KdfRequest,
    ) -> Result<u32> {
        if kdf.kind != KdfKind::Pbkdf2 {
            return Err(Error::InvalidOption(
                "LUKS1 supports only the pbkdf2 PBKDF".into(),
            ));
        }
        // Fail on slot problems before spending time on calibration.
        match slot {
            Some(s) if self.phdr.slots[Self::check_slot_index(s)?].active => {
                return Err(Error::Keyslot(format!(
                    "keyslot {s} is active, kill it first"
                )));
            }
            None if self.phdr.slots.iter().all(|s| s.active) => return Err(Error::NoFreeKeyslot),
            _ => {}
        }
        if !self.verify_volume_key(volume_key)? {
            return Err(Luks1Error::VolumeKeyMismatch.into());
        }
        let request = KdfRequest {
            hash: self.hash,
            ..kdf.clone()
        };
        let resolved = request.resolve(self.phdr.key_bytes as usize)?;
        self.store_key(dev, volume_key, passphrase, slot, &resolved)
    }

    fn kill_keyslot(&mut self, dev: &mut dyn Storage, slot: u32) -> Result<()> {
        let i = Self::check_slot_index(slot)?;
        if !self.phdr.slots[i].active {
            return Err(Error::Keyslot(format!("keyslot {slot} is not active")));
        }
        // The header first, then the wipe (cryptsetup wipes first): a crash in between
        // leaves unreferenced key material, never an ENABLED slot whose material is gone.
        // The descriptors of slots 0-5 lie in the header's first sector, so for them the
        // header write is a single atomic sector write.
        let old = self.phdr.slots[i].clone();
        let s = &mut self.phdr.slots[i];
        s.active = false;
        s.salt = [0; SALT_SIZE];
        s.iterations = 0;
        if let Err(e) = self.write_synced(dev) {
            self.phdr.slots[i] = old;
            return Err(e);
        }
        // cryptsetup overwrites the area 39 times and finally with random data; on today's
        // storage one random pass leaves the same final state.
        let (start, end) = self.phdr.slot_area(i);
        keyslot::wipe_random(dev, start * SECTOR_SIZE, (end - start) * SECTOR_SIZE)?;
        dev.sync()?;
        Ok(())
    }
}

/// The options LUKS1 cannot hold, checked before anything is written.
fn check_options(opts: &FormatOptions, volume_key: &[u8]) -> Result<()> {
    let invalid = |s: String| Err(Error::InvalidOption(s));
    if opts.kdf.kind != KdfKind::Pbkdf2 {
        return invalid("LUKS1 supports only the pbkdf2 PBKDF".into());
    }
    if opts.sector_size != SECTOR_SIZE as u32 {
        return invalid(format!(
            "LUKS1 supports only 512-byte sectors, not {}",
            opts.sector_size
        ));
    }
    if opts.label.is_some() || opts.subsystem.is_some() {
        return invalid("labels and subsystems need LUKS2".into());
    }
    if opts.luks2_metadata_size.is_some() || opts.luks2_keyslots_size.is_some() {
        return invalid("metadata and keyslots area sizes are LUKS2 options".into());
    }
    if opts.keyslot_encryption.is_some() {
        return invalid("keyslot encryption parameters can be set only for LUKS2".into());
    }
    if volume_key.len() != opts.key_len {
        return invalid(format!(
            "volume key is {} bytes, key size is {} bytes",
            volume_key.len(),
            opts.key_len
        ));
    }
    let key_bytes = opts.key_len;
    if key_bytes == 0 || key_bytes > 4096 || !opts.cipher.valid_key_len(key_bytes) {
        return invalid(format!(
            "key size {} bits is invalid for {}",
            key_bytes * 8,
            opts.cipher
        ));
    }
    header::check_field_len(&opts.cipher.cipher_name(), CIPHER_NAME_LEN, "cipher_name")?;
    header::check_field_len(&opts.cipher.cipher_mode(), CIPHER_MODE_LEN, "cipher_mode")?;
    header::check_field_len(opts.hash.name(), HASH_SPEC_LEN, "hash_spec")?;
    if opts.hash.output_len() < DIGEST_SIZE {
        return invalid(format!("hash {} is too short for LUKS1", opts.hash));
    }
    if let Some(s) = opts.keyslot
        && s as usize >= NUM_KEYSLOTS
    {
        return Err(Error::Keyslot(format!(
            "keyslot {s} out of range 0..{NUM_KEYSLOTS}"
        )));
    }
    Ok(())
}

/// Keyslot areas (the first at 4096 bytes, each rounded up to 4096 bytes) and the payload
/// offset in sectors, as `LUKS_generate_phdr` lays them out.
fn layout(opts: &FormatOptions, key_bytes: usize) -> Result<([u32; NUM_KEYSLOTS], u32)> {
    let invalid = |s: String| Err(Error::InvalidOption(s));
    let slot_sectors = af_sectors(key_bytes, STRIPES);
    let mut end = ALIGN_KEYSLOTS_SECTORS;
    let mut offsets = [0u32; NUM_KEYSLOTS];
    for o in offsets.iter_mut() {
        *o = end as u32; // at most 8 * 16 MiB / 512: fits
        end = (end + slot_sectors).next_multiple_of(ALIGN_KEYSLOTS_SECTORS);
    }
    let payload_sectors = match opts.data_offset.filter(|&d| d != 0) {
        Some(d) if d % SECTOR_SIZE != 0 => {
            return invalid(format!("data offset {d} is not a multiple of 512 bytes"));
        }
        Some(d) => d / SECTOR_SIZE,
        None if opts.detached_header => 0,
        None => end.next_multiple_of(DEFAULT_ALIGNMENT_SECTORS),
    };
    if payload_sectors != 0 && payload_sectors < end {
        return invalid(format!(
            "data offset must be 0 or at least the header size ({} bytes)",
            end * SECTOR_SIZE
        ));
    }
    let payload_offset = u32::try_from(payload_sectors)
        .map_err(|_| Error::InvalidOption("data offset too large for LUKS1".into()))?;
    Ok((offsets, payload_offset))
}

/// The keyslot's KDF and the digest's iteration count: one calibration serves both, as in
/// cryptsetup.
fn kdf_plan(opts: &FormatOptions, key_bytes: usize) -> Result<(Kdf, u32)> {
    let invalid = |s: String| Err(Error::InvalidOption(s));
    let request = KdfRequest {
        hash: opts.hash,
        ..opts.kdf.clone()
    };
    Ok(match request.forced_iterations {
        Some(_) => (request.resolve(key_bytes)?, MKD_ITERATIONS_MIN),
        None => {
            if request.iter_time_ms == 0 {
                return invalid("PBKDF target time cannot be zero".into());
            }
            let kdf = request.resolve(key_bytes)?;
            let Kdf::Pbkdf2 { iterations, .. } = kdf else {
                return invalid("LUKS1 supports only the pbkdf2 PBKDF".into());
            };
            let d = u64::from(iterations) * u64::from(MKD_ITERATIONS_MS)
                / u64::from(request.iter_time_ms);
            (
                kdf,
                u32::try_from(d).unwrap_or(u32::MAX).max(MKD_ITERATIONS_MIN),
            )
        }
    })
}

/// cryptsetup's `LUKS_wipe_header_areas`: zeros over the header (its first 4096 bytes when
/// detached), random data over every keyslot area.
fn wipe_areas(dev: &mut dyn Storage, hdr: &Luks1Header) -> Result<()> {
    let payload_bytes = u64::from(hdr.phdr.payload_offset) * SECTOR_SIZE;
    let zero_len = if payload_bytes == 0 || payload_bytes > MAX_AREA_BYTES * NUM_KEYSLOTS as u64 {
        4096
    } else {
        payload_bytes
    };
    keyslot::wipe_zero(dev, 0, zero_len)?;
    for i in 0..NUM_KEYSLOTS {
        let (start, end) = hdr.phdr.slot_area(i);
        // Up to the next 4 KiB, as cryptsetup's wipe writes whole blocks of a file: the
        // areas start 4 KiB-aligned, so this is the alignment gap (or, after the last one,
        // what its layout reserves before the data). A detached header file ends there.
        let len = ((end - start) * SECTOR_SIZE).next_multiple_of(4096);
        keyslot::wipe_random(dev, start * SECTOR_SIZE, len)?;
    }
    Ok(())
}
