//! On-disk formats of cryptsetup/dm-crypt volumes: LUKS1, LUKS2, plain mode, loop-AES,
//! TrueCrypt/VeraCrypt (TCRYPT), BitLocker (BITLK) and FileVault 2 (FVAULT2); and
//! dm-integrity's layout, under LUKS2 with integrity.
//!
//! Each format lives in its own module; all LUKS versions implement [`LuksHeader`], so the
//! CLI and the data path never need to know which version they hold.

#![forbid(unsafe_code)]

pub mod bitlk;
mod bytes;
pub mod crash;
mod error;
pub mod fvault2;
pub mod integrity;
pub mod loopaes;
pub mod luks1;
pub mod luks2;
pub mod plain;
mod signatures;
pub mod tcrypt;

pub use crash::{CrashDevice, Tear};
pub use cryptblk_device::{MemStorage, Storage};
pub use error::{Error, Result};

use cryptblk_crypto::{CipherSpec, HashAlg, IvOptions, Kdf, KdfRequest, SecretBytes};

/// A volume key as cryptsetup's dumps print it after "MK dump:": hex bytes, 16 to a line,
/// further lines indented by two tabs.
pub(crate) fn key_dump_hex(key: &[u8]) -> String {
    let mut s = String::new();
    for (i, b) in key.iter().enumerate() {
        if i > 0 {
            s.push_str(if i % 16 == 0 { "\n\t\t" } else { " " });
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// One keyslot as `dump` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyslotInfo {
    /// Keyslot number (LUKS1: 0..8, position in the phdr; LUKS2: the `keyslots` JSON key).
    pub id: u32,
    /// In use (LUKS1 `ENABLED`, LUKS2: present in the JSON).
    pub active: bool,
    /// KDF and costs, for active slots.
    pub kdf: Option<Kdf>,
    /// Salt of the passphrase KDF.
    pub salt: Vec<u8>,
    /// Start of the key material area on the header device, in bytes (LUKS1
    /// `key-material-offset` × 512, LUKS2 `area.offset`).
    pub area_offset: u64,
    /// Length of the key material area in bytes (LUKS1: the AF-split key rounded up to
    /// 512-byte sectors, LUKS2 `area.size`).
    pub area_size: u64,
    /// AF stripes (LUKS1 `stripes`, LUKS2 `af.stripes`; 0 for a LUKS2 slot we cannot parse).
    pub stripes: u32,
    /// Hash of the AF splitter (LUKS1: the phdr `hash-spec`, LUKS2 `af.hash`).
    pub af_hash: HashAlg,
}

/// What `format` takes (cryptsetup luksFormat's options, in bytes and parsed types).
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// Data cipher (`--cipher`, e.g. aes-xts-plain64).
    pub cipher: CipherSpec,
    /// Volume key length in bytes (`--key-size` / 8).
    pub key_len: usize,
    /// Encryption sector size (LUKS1: always 512).
    pub sector_size: u32,
    /// `--hash`: PBKDF2 hash for keyslots (if PBKDF2), the AF splitter and the digest.
    pub hash: HashAlg,
    /// Passphrase KDF and its costs for the first keyslot (`--pbkdf`, `--iter-time`,
    /// `--pbkdf-memory`, ...).
    pub kdf: KdfRequest,
    /// `--uuid`; random when `None`.
    pub uuid: Option<String>,
    /// LUKS2 `--label` (binary header `label`, at most 47 bytes); LUKS1 refuses it.
    pub label: Option<String>,
    /// LUKS2 `--subsystem` (binary header `subsystem`, at most 47 bytes); LUKS1 refuses it.
    pub subsystem: Option<String>,
    /// `--offset` in bytes: where the data segment starts. Default: after the header and
    /// keyslot areas (cryptsetup's alignment), or 0 with a detached header.
    pub data_offset: Option<u64>,
    /// Header on a separate device (`--header`).
    pub detached_header: bool,
    /// Keyslot for the first passphrase (`--key-slot`), else the first free one.
    pub keyslot: Option<u32>,
    /// LUKS2 `--luks2-metadata-size`: size of one header copy (binary header + JSON area)
    /// in bytes; `None` = 16 KiB.
    pub luks2_metadata_size: Option<u64>,
    /// LUKS2 `--luks2-keyslots-size`: size of the keyslots area (JSON `config.keyslots_size`)
    /// in bytes, a multiple of 4096; `None` = the space between the two header copies and
    /// the data offset, or up to 16 MiB from the device start when no offset is given.
    pub luks2_keyslots_size: Option<u64>,
    /// LUKS2 `--keyslot-cipher` and `--keyslot-key-size` (bytes): how the first keyslot's
    /// area is encrypted; `None` = with the data cipher. LUKS1 refuses it.
    pub keyslot_encryption: Option<(String, usize)>,
    /// LUKS2 `--integrity`: the data segment's authenticated encryption (its `encryption`
    /// replaces `cipher`, which is then ignored; the volume key is the cipher's key and
    /// then the MAC's). The dm-integrity metadata under it is the volume layer's to write.
    pub integrity: Option<SegmentIntegrity>,
}

impl FormatOptions {
    /// cryptsetup's defaults: aes-xts-plain64, 512-bit key, 512-byte sectors, sha256.
    pub fn new(kdf: KdfRequest) -> Self {
        let cipher = CipherSpec::parse("aes-xts-plain64").expect("built-in spec parses");
        FormatOptions {
            key_len: cipher.default_key_len(),
            cipher,
            sector_size: 512,
            hash: HashAlg::Sha256,
            kdf,
            uuid: None,
            label: None,
            subsystem: None,
            data_offset: None,
            detached_header: false,
            keyslot: None,
            luks2_metadata_size: None,
            luks2_keyslots_size: None,
            keyslot_encryption: None,
            integrity: None,
        }
    }
}

/// Operations common to LUKS1 and LUKS2 headers.
///
/// Every method that changes the header writes it (both copies for LUKS2) before it
/// returns, and wipes keyslot material it removes.
pub trait LuksHeader: std::fmt::Debug + Send {
    /// 1 or 2.
    fn version(&self) -> u8;
    /// Volume UUID as stored in the header (`uuid` field), e.g. for `luksUUID`.
    fn uuid(&self) -> &str;
    /// Data segment cipher (LUKS1 `cipher_name`-`cipher_mode`, LUKS2 segment `encryption`).
    fn cipher(&self) -> CipherSpec;
    /// Volume key length in bytes.
    fn key_len(&self) -> usize;
    /// Encryption sector size of the data segment in bytes (LUKS1: always 512, LUKS2:
    /// segment `sector_size`).
    fn sector_size(&self) -> u32;
    /// IV numbering of the data segment as dm-crypt gets it from cryptsetup.
    fn iv_options(&self) -> IvOptions;
    /// Start of the data segment on the data device, in bytes.
    fn data_offset(&self) -> u64;
    /// Data segment length in bytes; `None` means "to the end of the device".
    fn data_length(&self) -> Option<u64>;
    /// Bytes occupied by header and keyslot areas (what header-backup saves).
    fn header_size(&self) -> u64;
    /// Every keyslot, as `luksDump` lists them: all 8 for LUKS1 (free ones inactive), only
    /// the existing ones for LUKS2.
    fn keyslots(&self) -> Vec<KeyslotInfo>;
    /// Maximum number of keyslots (8 for LUKS1, 32 for LUKS2).
    fn max_keyslots(&self) -> u32;
    /// Tries the passphrase on one slot or on every active slot; returns slot and volume key.
    fn unlock(
        &self,
        dev: &mut dyn Storage,
        passphrase: &[u8],
        slot: Option<u32>,
    ) -> Result<(u32, SecretBytes)>;
    /// Unlocks every key the data needs and lays the data out for a data device of
    /// `data_size` bytes: one segment, except for a LUKS2 volume in the middle of a
    /// reencryption (one per key, and plaintext stretches while encrypting or decrypting).
    /// Returns the keyslot that opened it and the segments in volume order.
    fn unlock_segments(
        &self,
        dev: &mut dyn Storage,
        passphrase: &[u8],
        slot: Option<u32>,
        data_size: u64,
    ) -> Result<(u32, Vec<SegmentKey>)> {
        single_segment(self, dev, passphrase, slot, data_size)
    }
    /// The data laid out with `volume_key` (cryptsetup's `open --volume-key-file`): the
    /// key is checked against the digest; no keyslot is used. A volume in the middle of
    /// a reencryption needs two keys and its passphrase: refused.
    fn segments_from_volume_key(
        &self,
        volume_key: &[u8],
        data_size: u64,
    ) -> Result<Vec<SegmentKey>> {
        if self.in_reencryption() || self.interrupted_step() {
            return Err(Error::InvalidOption(
                "a volume in the middle of a reencryption opens with its passphrase only".into(),
            ));
        }
        if volume_key.len() != self.key_len() || !self.verify_volume_key(volume_key)? {
            return Err(Error::WrongPassphrase);
        }
        single_segment_with_key(self, volume_key, data_size)
    }
    /// Recovers the step of a LUKS2 reencryption that a crash cut off, as cryptsetup does
    /// on activation: the hot zone is rewritten from its resilience data (checksums,
    /// journal or the shifted copy) on `data` (a `data_size`-byte device), then the
    /// metadata records the step as done (and the reencryption as finished if it was the
    /// last). Returns whether there was such a step. Needs the passphrase of both keys.
    fn recover_interrupted_step(
        &mut self,
        _dev: &mut dyn Storage,
        _data: &dyn Storage,
        _passphrase: &[u8],
        _slot: Option<u32>,
        _data_size: u64,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Wipes every keyslot (`erase`): no passphrase opens the volume again.
    fn erase(&mut self, dev: &mut dyn Storage) -> Result<()> {
        let active: Vec<u32> = self
            .keyslots()
            .iter()
            .filter(|k| k.active)
            .map(|k| k.id)
            .collect();
        for slot in active {
            self.kill_keyslot(dev, slot)?;
        }
        Ok(())
    }
    /// The data segment's authenticated encryption, where it has one (LUKS2 with
    /// integrity).
    fn integrity(&self) -> Option<SegmentIntegrity> {
        None
    }
    /// Whether an unfinished reencryption is recorded (LUKS2 `online-reencrypt-v2/3`).
    fn in_reencryption(&self) -> bool {
        false
    }
    /// Whether a reencryption step was cut off (a segment is flagged `in-reencryption`):
    /// its hot zone must be recovered ([`LuksHeader::recover_interrupted_step`]) before
    /// the data can be read.
    fn interrupted_step(&self) -> bool {
        false
    }
    /// Sets the volume UUID (`luksUUID --uuid`; the hyphenated 36-character form) and
    /// writes the header.
    fn set_uuid(&mut self, dev: &mut dyn Storage, uuid: &str) -> Result<()>;
    /// Checks a volume key against the stored digest.
    fn verify_volume_key(&self, key: &[u8]) -> Result<bool>;
    /// The tokens (LUKS2's `tokens` section): id and JSON object each; none for LUKS1.
    fn tokens(&self) -> Vec<(u32, serde_json::Value)> {
        Vec::new()
    }
    /// How the keyslots added or changed from now on encrypt their areas
    /// (`--keyslot-cipher`, `--keyslot-key-size`; cryptsetup's
    /// `crypt_keyslot_set_encryption`). Only LUKS2 keyslots have a cipher of their own.
    fn set_keyslot_encryption(&mut self, _cipher: &str, _key_bytes: usize) -> Result<()> {
        Err(Error::InvalidOption(
            "keyslot encryption parameters can be set only for a LUKS2 device".into(),
        ))
    }
    /// Stores `volume_key` under `passphrase` in `slot` (or the first free slot).
    fn add_keyslot(
        &mut self,
        dev: &mut dyn Storage,
        volume_key: &[u8],
        passphrase: &[u8],
        slot: Option<u32>,
        kdf: &KdfRequest,
    ) -> Result<u32>;
    /// Wipes the slot's key material and marks it free.
    fn kill_keyslot(&mut self, dev: &mut dyn Storage, slot: u32) -> Result<()>;
    /// Gives `volume_key` a keyslot under `new_passphrase` (`new_slot`, or the first free
    /// one) and removes `old_slot` (`luksChangeKey`). This default is LUKS1's, as
    /// cryptsetup does it with one header copy: the new slot first, the old one wiped
    /// after, so a crash in between leaves both passphrases working. Only with every
    /// keyslot in use is the old one rewritten in place (cryptsetup's way, and its crash
    /// window). Formats that can do both in one metadata update (LUKS2) override it.
    fn replace_keyslot(
        &mut self,
        dev: &mut dyn Storage,
        old_slot: u32,
        volume_key: &[u8],
        new_passphrase: &[u8],
        new_slot: Option<u32>,
        kdf: &KdfRequest,
    ) -> Result<u32> {
        if new_slot == Some(old_slot) {
            // The same keyslot number (cryptsetup's -S): the new passphrase goes to a free
            // slot first, the old slot is rewritten from it, then the copy goes; a crash
            // at any point leaves one of the two passphrases working. With no free slot it
            // is rewritten in place (cryptsetup's own way, and its crash window).
            match self.add_keyslot(dev, volume_key, new_passphrase, None, kdf) {
                Ok(copy) => {
                    self.kill_keyslot(dev, old_slot)?;
                    let slot =
                        self.add_keyslot(dev, volume_key, new_passphrase, Some(old_slot), kdf)?;
                    self.kill_keyslot(dev, copy)?;
                    return Ok(slot);
                }
                Err(Error::NoFreeKeyslot) => {
                    self.kill_keyslot(dev, old_slot)?;
                    return self.add_keyslot(dev, volume_key, new_passphrase, Some(old_slot), kdf);
                }
                Err(e) => return Err(e),
            }
        }
        match self.add_keyslot(dev, volume_key, new_passphrase, new_slot, kdf) {
            Ok(slot) => {
                self.kill_keyslot(dev, old_slot)?;
                Ok(slot)
            }
            // Every keyslot in use and none asked for: rewritten in place, as cryptsetup.
            Err(Error::NoFreeKeyslot) if new_slot.is_none() => {
                self.kill_keyslot(dev, old_slot)?;
                self.add_keyslot(dev, volume_key, new_passphrase, Some(old_slot), kdf)
            }
            Err(e) => Err(e),
        }
    }
}

/// A LUKS2 data segment's `integrity` object: dm-crypt's authenticated mode over a
/// dm-integrity layout (issue 38; docs/integrity-format.md §5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentIntegrity {
    /// The segment's `encryption`, e.g. `aes-gcm-random`.
    pub encryption: String,
    /// Its `type`: `aead`, `poly1305`, `hmac(sha256)`, ...
    pub kind: String,
    /// `journal_encryption` (cryptsetup only writes `none`).
    pub journal_encryption: String,
    /// `journal_integrity` (cryptsetup only writes `none`).
    pub journal_integrity: String,
}

/// One stretch of an unlocked volume's data: where it is and how it is encrypted.
#[derive(Debug)]
pub struct SegmentKey {
    /// First plaintext byte of the volume it covers.
    pub start: u64,
    /// Bytes it covers.
    pub len: u64,
    /// Where its first byte lies on the data device.
    pub storage_offset: u64,
    /// Its cipher; `cipher_null-ecb` (and an empty key) for plaintext.
    pub cipher: CipherSpec,
    /// Its encryption sector size.
    pub sector_size: u32,
    /// Its IV numbering (LUKS2 `iv_tweak` is the offset).
    pub iv: IvOptions,
    /// Its volume key.
    pub key: SecretBytes,
    /// Authenticated encryption over dm-integrity's layout instead of `cipher` (which is
    /// then `cipher_null-ecb`, giving only the sector size).
    pub integrity: Option<SegmentIntegrity>,
}

/// The one data segment of a header, unlocked (the default of
/// [`LuksHeader::unlock_segments`]); its length is what fits the data device, rounded down
/// to whole sectors (0 when nothing does: the volume layer reports that).
pub(crate) fn single_segment<H: LuksHeader + ?Sized>(
    h: &H,
    dev: &mut dyn Storage,
    passphrase: &[u8],
    slot: Option<u32>,
    data_size: u64,
) -> Result<(u32, Vec<SegmentKey>)> {
    let (slot, key) = h.unlock(dev, passphrase, slot)?;
    Ok((slot, vec![segment_with_key(h, key, data_size)]))
}

/// The header's one data segment, keyed with `key`, on a `data_size`-byte device.
fn segment_with_key<H: LuksHeader + ?Sized>(h: &H, key: SecretBytes, data_size: u64) -> SegmentKey {
    let ss = h.sector_size() as u64;
    let off = h.data_offset();
    let len = h
        .data_length()
        .unwrap_or_else(|| data_size.saturating_sub(off))
        / ss
        * ss;
    SegmentKey {
        start: 0,
        len,
        storage_offset: off,
        cipher: h.cipher(),
        sector_size: h.sector_size(),
        iv: h.iv_options(),
        key,
        integrity: h.integrity(),
    }
}

/// Reads whichever LUKS version the device holds.
pub fn load_header(dev: &mut dyn Storage) -> Result<Box<dyn LuksHeader>> {
    load_header_as(dev, luks2::Luks2Header::read)
}

/// [`load_header`], a LUKS2 header with unknown mandatory requirements included (see
/// [`luks2::Luks2Header::read_ignoring_requirements`]: inspected, passphrases checked,
/// keyslots destroyed; never mapped or otherwise changed).
pub fn load_header_with_requirements(dev: &mut dyn Storage) -> Result<Box<dyn LuksHeader>> {
    load_header_as(dev, luks2::Luks2Header::read_ignoring_requirements)
}

fn load_header_as(
    dev: &mut dyn Storage,
    read_luks2: fn(&mut dyn Storage) -> Result<luks2::Luks2Header>,
) -> Result<Box<dyn LuksHeader>> {
    let mut magic = [0u8; 8];
    let have = dev.size()?;
    if have < 8 {
        return Err(Error::Truncated { need: 4096, have });
    }
    dev.read_at(&mut magic, 0)?;
    let version = u16::from_be_bytes([magic[6], magic[7]]);
    match (&magic[..6], version) {
        (luks1::MAGIC, 1) => Ok(Box::new(luks1::Luks1Header::read(dev)?)),
        (luks1::MAGIC, 2) | (luks2::SECONDARY_MAGIC, 2) => Ok(Box::new(read_luks2(dev)?)),
        // A readable primary of another version (as cryptsetup does): the volume may have
        // been converted, so an older secondary copy must not be used behind its back.
        (luks1::MAGIC, v) => Err(luks1::Luks1Error::UnsupportedVersion(v).into()),
        // The primary may be wiped or damaged: LUKS2 can still be found from its secondary copy.
        _ => read_luks2(dev).map(|h| Box::new(h) as Box<dyn LuksHeader>),
    }
}

/// [`LuksHeader::segments_from_volume_key`] once the key is checked: the one segment.
pub(crate) fn single_segment_with_key<H: LuksHeader + ?Sized>(
    h: &H,
    volume_key: &[u8],
    data_size: u64,
) -> Result<Vec<SegmentKey>> {
    Ok(vec![segment_with_key(
        h,
        SecretBytes::from_slice(volume_key),
        data_size,
    )])
}
