//! FileVault 2 volumes: Apple Core Storage with encryption (cryptsetup's `--type fvault2`,
//! `fvault2Dump`).
//!
//! The physical volume header (512 bytes at the start) carries an AES key half and the
//! physical volume UUID, which together key AES-128-XTS over the encrypted metadata; a
//! disk label block points at that metadata. Three of its 8 KiB blocks matter: 0x0019
//! (an XML plist with the passphrase-wrapped key-encrypting key and the KEK-wrapped
//! volume key, both RFC 3394 AES key wrap), 0x001A (the logical volume's size and family
//! UUID) and 0x0305 (where the logical volume starts). The volume key is the unwrapped
//! 16 bytes followed by the first 16 of SHA-256(key ‖ family UUID); the data is
//! aes-xts-plain64 over 512-byte sectors from the logical volume's start, IVs from 0.
//! The rules are cryptsetup's `lib/fvault2`, read from its sources and checked against
//! its test image. Unlike cryptsetup, which tries only the first, every user's wrapped
//! KEK in the plist is tried (each account of the Mac, and the recovery key, has one).

use crate::bytes::{read_within, u16_at, u32_at, u64_at};
use crate::{Error, Result};
use cryptblk_crypto::{
    BlockCipherAlg, ChainMode, CipherSpec, HashAlg, IvOptions, Kdf, SecretBytes, SectorCipher,
    UnitCipher, aes_key_unwrap, crc32c_update,
};
use cryptblk_device::Storage;
use std::fmt::Write as _;

/// What can be wrong with a FileVault 2 (Core Storage) volume.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fvault2Error {
    /// No Core Storage magic in the volume header.
    NotFvault2,
    /// Metadata that does not parse, fails its CRC or contradicts itself (what is wrong).
    CorruptMetadata(String),
    /// A Core Storage version other than 1.
    UnsupportedVersion(u16),
}

impl std::fmt::Display for Fvault2Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fvault2Error::NotFvault2 => write!(f, "not a FileVault 2 (Core Storage) volume"),
            Fvault2Error::CorruptMetadata(what) => write!(f, "corrupt metadata: {what}"),
            Fvault2Error::UnsupportedVersion(v) => write!(f, "unsupported version {v}"),
        }
    }
}

const VOLUME_HEADER_LEN: usize = 512;
/// Size of one metadata block.
const BLOCK_LEN: usize = 8192;
/// cryptsetup reads no metadata beyond the first GiB.
const MAX_METADATA_OFFSET: u64 = 1024 * 1024 * 1024;
/// "CS", big-endian.
const CORE_STORAGE_MAGIC: u16 = 0x4353;
const AES_KEY_LEN: usize = 16;
const WRAPPED_LEN: usize = 24;
const SALT_LEN: usize = 16;
/// Decoded sizes of PassphraseWrappedKEKStruct and KEKWrappedVolumeKeyStruct.
const PASSPHRASE_WRAPPED_KEK_LEN: usize = 284;
const KEK_WRAPPED_VOLUME_KEY_LEN: usize = 256;
/// More wrapped keys than any Mac has accounts: each costs a PBKDF2 run per attempt.
const MAX_WRAPPED_KEYS: usize = 64;

const BLOCK_DISK_LABEL_VG_OFFSET: usize = 220;
const BLOCK_0019_XML: usize = 112;
const BLOCK_001A_XML: usize = 128;
const BLOCK_0305_LV_BLOCK: usize = 104;

/// A key-encrypting key wrapped under a passphrase (one per user, and the recovery key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassphraseWrappedKek {
    /// PBKDF2-SHA256 iterations.
    pub iterations: u32,
    /// PBKDF2 salt.
    pub salt: [u8; SALT_LEN],
    wrapped: [u8; WRAPPED_LEN],
}

/// The Core Storage metadata of a FileVault 2 volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fvault2Header {
    /// Physical volume UUID (from the volume header).
    pub physical_uuid: String,
    /// Logical volume family UUID (mixed into the volume key).
    pub family_uuid: String,
    family_uuid_bytes: [u8; 16],
    /// Where the logical volume starts on the device, in bytes.
    pub volume_offset: u64,
    /// Size of the logical volume in bytes.
    pub volume_size: u64,
    /// Every passphrase-wrapped KEK, in the plist's order (`dump` shows the first).
    pub passphrase_keks: Vec<PassphraseWrappedKek>,
    kek_wrapped_keys: Vec<[u8; WRAPPED_LEN]>,
}

fn corrupt(what: &str) -> Error {
    Fvault2Error::CorruptMetadata(what.to_string()).into()
}

/// Checks a block's CRC-32C: its first 4 bytes hold the value, the next 4 the seed, which
/// Core Storage always sets to 0xffffffff.
fn check_crc(block: &[u8], what: &str) -> Result<()> {
    if u32_at(block, 4) != 0xffff_ffff || crc32c_update(!0, &block[8..]) != u32_at(block, 0) {
        return Err(corrupt(&format!("{what}: checksum mismatch")));
    }
    Ok(())
}

/// `blocks × block_size`, refused beyond the first GiB (cryptsetup's bound).
fn metadata_offset(blocks: u64, block_size: u64) -> Result<u64> {
    blocks
        .checked_mul(block_size)
        .filter(|&o| o <= MAX_METADATA_OFFSET)
        .ok_or_else(|| corrupt("metadata offset beyond 1 GiB"))
}

/// The values of `<key>KEY</key><TYPE ...>VALUE</TYPE>` in the plist, in order (the
/// pattern cryptsetup matches, without a regex engine).
fn plist_values<'a>(xml: &'a str, key: &str, ty: &str) -> Vec<&'a str> {
    let tag = format!("<key>{key}</key><{ty}");
    let close = format!("</{ty}>");
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(at) = rest.find(&tag) {
        rest = &rest[at + tag.len()..];
        let Some(gt) = rest.find('>') else { break };
        if rest[..gt].contains('<') {
            continue;
        }
        let body = &rest[gt + 1..];
        let end = body.find('<').unwrap_or(body.len());
        if end > 0 && body[end..].starts_with(&close) {
            out.push(&body[..end]);
        }
    }
    out
}

/// The XML at (`off`, `len`) of a metadata block, up to its first NUL.
fn block_xml(block: &[u8], off_field: usize) -> Result<&str> {
    let off = u32_at(block, off_field) as usize;
    let len = u32_at(block, off_field + 4) as usize;
    let bytes = off
        .checked_add(len)
        .filter(|&end| end <= BLOCK_LEN)
        .map(|end| &block[off..end])
        .ok_or_else(|| corrupt("XML beyond its metadata block"))?;
    let bytes = bytes.split(|&b| b == 0).next().unwrap_or_default();
    std::str::from_utf8(bytes).map_err(|_| corrupt("XML is not UTF-8"))
}

fn base64_struct(text: &str, len: usize, what: &str) -> Result<Vec<u8>> {
    use base64::Engine as _;
    let clean: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let raw = base64::engine::general_purpose::STANDARD
        .decode(clean)
        .map_err(|_| corrupt(&format!("{what} is not base64")))?;
    if raw.len() != len {
        return Err(corrupt(&format!(
            "{what} has {} bytes, not {len}",
            raw.len()
        )));
    }
    Ok(raw)
}

/// A plist integer as C's `strtoull(s, NULL, 16)` reads it: optional `0x`, hex digits up
/// to the first other character.
fn hex_integer(s: &str) -> Option<u64> {
    let s = s.trim_start();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    let digits: &str = &s[..s.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(s.len())];
    u64::from_str_radix(digits, 16).ok()
}

/// A UUID in the canonical 36-character form (what `uuid_parse` accepts).
fn parse_uuid(s: &str) -> Result<uuid::Uuid> {
    let hyphens = [8, 13, 18, 23];
    let ok = s.len() == 36
        && s.char_indices().all(|(i, c)| {
            hyphens.contains(&i) == (c == '-') && (c == '-' || c.is_ascii_hexdigit())
        });
    if !ok {
        return Err(corrupt("family UUID is malformed"));
    }
    uuid::Uuid::parse_str(s).map_err(|_| corrupt("family UUID is malformed"))
}

#[derive(Default)]
struct Parsed {
    keks: Option<(Vec<PassphraseWrappedKek>, Vec<[u8; WRAPPED_LEN]>)>,
    volume: Option<(u64, uuid::Uuid)>,
    volume_block: Option<u64>,
}

impl Parsed {
    /// The wrapped keys: the first of each kind must parse (cryptsetup reads only that
    /// one and fails on it); later ones that do not are skipped, and at most
    /// [`MAX_WRAPPED_KEYS`] are kept, so extra entries never cost a volume that opens.
    fn block_0019(&mut self, block: &[u8]) -> Result<()> {
        fn parsed<T>(xml: &str, key: &str, len: usize, f: impl Fn(&[u8]) -> T) -> Result<Vec<T>> {
            let values = plist_values(xml, key, "data");
            let Some(first) = values.first() else {
                return Err(corrupt("no wrapped keys in the encryption context"));
            };
            let mut out = vec![f(&base64_struct(first, len, key)?)];
            out.extend(
                values[1..]
                    .iter()
                    .filter_map(|v| base64_struct(v, len, key).ok())
                    .map(|raw| f(&raw))
                    .take(MAX_WRAPPED_KEYS - 1),
            );
            Ok(out)
        }
        let xml = block_xml(block, BLOCK_0019_XML)?;
        let keks = parsed(
            xml,
            "PassphraseWrappedKEKStruct",
            PASSPHRASE_WRAPPED_KEK_LEN,
            |raw| PassphraseWrappedKek {
                salt: raw[8..8 + SALT_LEN].try_into().expect("16 bytes"),
                wrapped: raw[32..32 + WRAPPED_LEN].try_into().expect("24 bytes"),
                iterations: u32_at(raw, 168),
            },
        )?;
        let vks = parsed(
            xml,
            "KEKWrappedVolumeKeyStruct",
            KEK_WRAPPED_VOLUME_KEY_LEN,
            |raw| raw[8..8 + WRAPPED_LEN].try_into().expect("24 bytes"),
        )?;
        self.keks = Some((keks, vks));
        Ok(())
    }

    fn block_001a(&mut self, block: &[u8]) -> Result<()> {
        let xml = block_xml(block, BLOCK_001A_XML)?;
        let size = plist_values(xml, "com.apple.corestorage.lv.size", "integer")
            .first()
            .and_then(|s| hex_integer(s))
            .filter(|&s| s != 0 && s != u64::MAX)
            .ok_or_else(|| corrupt("no logical volume size"))?;
        let family = plist_values(xml, "com.apple.corestorage.lv.familyUUID", "string");
        let family = parse_uuid(family.first().ok_or_else(|| corrupt("no family UUID"))?)?;
        self.volume = Some((size, family));
        Ok(())
    }
}

impl Fvault2Header {
    /// Reads the Core Storage metadata of `dev` (cryptsetup's `FVAULT2_read_metadata`).
    pub fn read(dev: &dyn Storage) -> Result<Self> {
        let mut vh = [0u8; VOLUME_HEADER_LEN];
        read_within(dev, &mut vh, 0)?;
        if u16::from_be_bytes([vh[88], vh[89]]) != CORE_STORAGE_MAGIC {
            return Err(Fvault2Error::NotFvault2.into());
        }
        check_crc(&vh, "volume header")?;
        let version = u16_at(&vh, 8);
        if version != 1 {
            return Err(Fvault2Error::UnsupportedVersion(version).into());
        }
        if u32_at(&vh, 168) != AES_KEY_LEN as u32 {
            return Err(corrupt("metadata key is not AES-128"));
        }
        let block_size = u32_at(&vh, 96) as u64;
        let physical = &vh[304..320];
        let mut metadata_key = SecretBytes::zeroed(2 * AES_KEY_LEN);
        metadata_key[..AES_KEY_LEN].copy_from_slice(&vh[176..192]);
        metadata_key[AES_KEY_LEN..].copy_from_slice(physical);

        // Disk label, then the volume groups descriptor it points at.
        let mut block = vec![0u8; BLOCK_LEN];
        let label_at = metadata_offset(u64_at(&vh, 104), block_size)?;
        read_within(dev, &mut block, label_at)?;
        check_crc(&block, "disk label")?;
        let vg_at = label_at + u32_at(&block, BLOCK_DISK_LABEL_VG_OFFSET) as u64;
        if vg_at > MAX_METADATA_OFFSET {
            return Err(corrupt("volume groups descriptor beyond 1 GiB"));
        }
        let mut vg = [0u8; 40];
        read_within(dev, &mut vg, vg_at)?;
        let blocks = u64_at(&vg, 8);
        let start = metadata_offset(u64_at(&vg, 32), block_size)?;

        let xts = UnitCipher::new(BlockCipherAlg::Aes, ChainMode::Xts, &metadata_key)?;
        let mut parsed = Parsed::default();
        for i in 0..blocks {
            let at = (i as u128 * BLOCK_LEN as u128 + start as u128)
                .try_into()
                .ok()
                .filter(|&at: &u64| at <= MAX_METADATA_OFFSET)
                .ok_or_else(|| corrupt("encrypted metadata beyond 1 GiB"))?;
            read_within(dev, &mut block, at)?;
            if block.iter().all(|&b| b == 0) {
                break;
            }
            let mut tweak = [0u8; 16];
            tweak[..8].copy_from_slice(&i.to_le_bytes());
            xts.decrypt(&tweak, &mut block)?;
            check_crc(&block, "encrypted metadata block")?;
            match u16_at(&block, 10) {
                0x0019 => parsed.block_0019(&block)?,
                0x001a => parsed.block_001a(&block)?,
                0x0305 => parsed.volume_block = Some(u32_at(&block, BLOCK_0305_LV_BLOCK) as u64),
                _ => {}
            }
        }
        let (Some((passphrase_keks, kek_wrapped_keys)), Some((volume_size, family)), Some(lv)) =
            (parsed.keks, parsed.volume, parsed.volume_block)
        else {
            return Err(corrupt("necessary metadata blocks not found"));
        };
        let volume_offset = lv
            .checked_mul(block_size)
            .ok_or_else(|| corrupt("logical volume offset overflows"))?;
        Ok(Fvault2Header {
            physical_uuid: uuid::Uuid::from_bytes(physical.try_into().expect("16")).to_string(),
            family_uuid: family.to_string(),
            family_uuid_bytes: *family.as_bytes(),
            volume_offset,
            volume_size,
            passphrase_keks,
            kek_wrapped_keys,
        })
    }

    /// The AES-XTS volume key (32 bytes) from a user's passphrase or the recovery key;
    /// [`Error::WrongPassphrase`] when no wrapped KEK accepts it.
    pub fn volume_key(&self, passphrase: &[u8]) -> Result<SecretBytes> {
        let mut derived = SecretBytes::zeroed(AES_KEY_LEN);
        let mut kek = SecretBytes::zeroed(AES_KEY_LEN);
        let mut vk = SecretBytes::zeroed(2 * AES_KEY_LEN);
        for user in &self.passphrase_keks {
            let kdf = Kdf::Pbkdf2 {
                hash: HashAlg::Sha256,
                iterations: user.iterations,
            };
            // A user's damaged entry (0 iterations) must not hide the others.
            if kdf.derive(passphrase, &user.salt, &mut derived).is_err()
                || aes_key_unwrap(&derived, &user.wrapped, &mut kek).is_err()
            {
                continue;
            }
            for wrapped in &self.kek_wrapped_keys {
                if aes_key_unwrap(&kek, wrapped, &mut vk[..AES_KEY_LEN]).is_ok() {
                    let mut digest = SecretBytes::zeroed(32);
                    HashAlg::Sha256
                        .digest_parts(&[&vk[..AES_KEY_LEN], &self.family_uuid_bytes], &mut digest);
                    vk[AES_KEY_LEN..].copy_from_slice(&digest[..AES_KEY_LEN]);
                    return Ok(vk);
                }
            }
        }
        Err(Error::WrongPassphrase)
    }

    /// The data cipher: aes-xts-plain64 over 512-byte sectors, IVs from 0.
    pub fn sector_cipher(&self, key: &[u8]) -> Result<SectorCipher> {
        let spec = CipherSpec::parse("aes-xts-plain64")?;
        Ok(SectorCipher::new(spec, key, 512, IvOptions::default())?)
    }

    /// `fvault2Dump`'s text (cryptsetup 2.6's layout, byte for byte).
    pub fn dump(&self, device: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "Header information for FVAULT2 device {device}.");
        let _ = writeln!(s, "Physical volume UUID: \t{}", self.physical_uuid);
        let _ = writeln!(s, "Family UUID:          \t{}", self.family_uuid);
        let _ = writeln!(s, "Logical volume offset:\t{} [bytes]", self.volume_offset);
        let _ = writeln!(s, "Logical volume size:  \t{} [bytes]", self.volume_size);
        let _ = writeln!(s, "Cipher:               \taes");
        let _ = writeln!(s, "Cipher mode:          \txts-plain64");
        let first = &self.passphrase_keks[0];
        let _ = writeln!(s, "PBKDF2 iterations:    \t{}", first.iterations);
        let _ = writeln!(s, "PBKDF2 salt:          \t{}", hex_spaced(&first.salt));
        s
    }

    /// `fvault2Dump --dump-volume-key`: the dump, then the volume key.
    pub fn dump_volume_key(&self, device: &str, key: &[u8]) -> String {
        let mut s = self.dump(device);
        let _ = writeln!(s, "Volume key:       \t{}", hex_spaced(key));
        s
    }
}

/// Bytes as `crypt_log_hex(..., " ", 0, ...)` prints them: each hex pair followed by a
/// space (the last one too).
fn hex_spaced(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x} ")).collect()
}

#[cfg(test)]
mod tests;
