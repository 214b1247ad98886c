//! BitLocker and BitLocker To Go volumes (cryptsetup's `--type bitlk`, `bitlkDump`).
//!
//! The boot sector names the format (`-FVE-FS-`, or `MSWIN4.1` for To Go) and points at
//! three copies of the FVE metadata: a list of entries holding the volume master key
//! (VMK) once per protector - each wrapped with AES-CCM under a key stretched from a
//! passphrase or recovery password, read from a startup key (.BEK) file, or stored in
//! clear while protection is suspended - and the full volume encryption key (FVEK)
//! wrapped under the VMK. The data is AES-XTS, AES-CBC with the `eboiv` IV, or AES-CBC
//! with the Elephant diffuser; the metadata areas read as zeros and the original boot
//! sector is kept encrypted elsewhere ("volume header") and mapped back to the start.
//! The rules are cryptsetup's `lib/bitlk`, read from its sources and checked against its
//! test images; the clear key, which cryptsetup refuses, follows dislocker.

use crate::bytes::{read_within as read, u16_at, u32_at, u64_at};
use crate::{Error, Result};
use cryptblk_crypto::{
    CipherSpec, HashAlg, IvOptions, SecretBytes, SectorCipher, aes_ccm_decrypt, kdf,
};
use cryptblk_device::Storage;
use std::fmt::Write as _;

/// What can be wrong with a BitLocker volume or its startup key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BitlkError {
    /// No BitLocker signature in the boot sector.
    NotBitlk,
    /// Metadata that does not parse or contradicts itself (what is wrong).
    CorruptMetadata(String),
    /// A BitLocker variant cryptsetup does not support either (which).
    Unsupported(String),
    /// A volume cryptsetup refuses to map: mid-conversion, encrypt-on-write, of unknown
    /// type (which).
    NotMappable(String),
    /// Every protector needs a TPM or a smart card.
    OnlyHardwareProtectors,
    /// A startup key (.BEK) file that is damaged or not this volume's (why).
    StartupKey(String),
}

impl std::fmt::Display for BitlkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BitlkError::NotBitlk => write!(f, "device is not a valid BITLK device"),
            BitlkError::CorruptMetadata(what) => write!(f, "corrupt metadata: {what}"),
            BitlkError::Unsupported(what) => write!(f, "unsupported: {what}"),
            BitlkError::NotMappable(why) => write!(f, "{why}: cannot be activated"),
            BitlkError::OnlyHardwareProtectors => write!(
                f,
                "only TPM or smart card protectors: this operation is not supported"
            ),
            BitlkError::StartupKey(why) => write!(f, "startup key: {why}"),
        }
    }
}

const SIGNATURE: &[u8; 8] = b"-FVE-FS-";
const SIGNATURE_TOGO: &[u8; 8] = b"MSWIN4.1";
const BOOTCODE_V1: &[u8; 3] = b"\xeb\x52\x90";
const BOOTCODE_V2: &[u8; 3] = b"\xeb\x58\x90";
/// Where the GUID and metadata offsets sit in the boot sector.
const SUPERBLOCK_OFFSET: u64 = 160;
const SUPERBLOCK_OFFSET_TOGO: u64 = 424;
/// FVE metadata block header (64 bytes) and metadata header (48 bytes).
const BLOCK_HEADER_LEN: usize = 64;
const METADATA_HEADER_LEN: usize = 48;
/// Bytes of each FVE metadata area: mapped as zeros.
pub const METADATA_AREA_LEN: u64 = 64 * 1024;
const ENTRY_HEADER_LEN: usize = 8;
const VMK_HEADER_LEN: usize = 28;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// Bytes before the key in a decrypted key blob (its size, version and type).
const KEY_BLOB_HEADER_LEN: usize = 12;
const BEK_HEADER_LEN: usize = 48;
const STARTUP_KEY_HEADER_LEN: usize = 24;
const STATE_NORMAL: u16 = 0x0004;

const GUID_NORMAL: [u8; 16] = [
    0x3b, 0xd6, 0x67, 0x49, 0x29, 0x2e, 0xd8, 0x4a, 0x83, 0x99, 0xf6, 0xa3, 0x39, 0xe3, 0xd0, 0x01,
];
const GUID_EOW: [u8; 16] = [
    0x3b, 0x4d, 0xa8, 0x92, 0x80, 0xdd, 0x0e, 0x4d, 0x9e, 0x4e, 0xb1, 0xe3, 0x28, 0x4e, 0xae, 0xd8,
];

// Entry types and value types of the FVE metadata.
const ENTRY_PROPERTY: u16 = 0x0000;
const ENTRY_VMK: u16 = 0x0002;
const ENTRY_FVEK: u16 = 0x0003;
const ENTRY_STARTUP_KEY: u16 = 0x0006;
const ENTRY_DESCRIPTION: u16 = 0x0007;
const ENTRY_VOLUME_HEADER: u16 = 0x000f;
const ENTRY_VOLUME_GUID: u16 = 0x0019;
const VALUE_KEY: u16 = 0x0001;
const VALUE_STRING: u16 = 0x0002;
const VALUE_STRETCH_KEY: u16 = 0x0003;
const VALUE_USE_KEY: u16 = 0x0004;
const VALUE_ENCRYPTED_KEY: u16 = 0x0005;
const VALUE_EXTERNAL_KEY: u16 = 0x0009;
const VALUE_RECOVERY_TIME: u16 = 0x0015;
const VALUE_GUID: u16 = 0x0017;

/// How a VMK is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// Stored in clear: BitLocker protection is suspended.
    ClearKey,
    /// TPM only (cannot be opened off the machine).
    Tpm,
    /// A startup key (.BEK file on a USB stick).
    StartupKey,
    /// TPM and PIN.
    TpmPin,
    /// The 48-digit recovery password.
    RecoveryPassphrase,
    /// A passphrase.
    Passphrase,
    /// A smart card.
    SmartCard,
    /// Anything else.
    Unknown(u16),
}

impl Protection {
    fn from_raw(v: u16) -> Self {
        match v {
            0x0000 => Protection::ClearKey,
            0x0100 => Protection::Tpm,
            0x0200 => Protection::StartupKey,
            0x0500 => Protection::TpmPin,
            0x0800 => Protection::RecoveryPassphrase,
            0x1000 => Protection::SmartCard,
            0x2000 => Protection::Passphrase,
            v => Protection::Unknown(v),
        }
    }

    /// What `bitlkDump` says of it.
    pub fn describe(&self) -> &'static str {
        match self {
            Protection::ClearKey => "VMK protected with clear key",
            Protection::Tpm => "VMK protected with TPM",
            Protection::StartupKey => "VMK protected with startup key",
            Protection::TpmPin => "VMK protected with TPM and PIN",
            Protection::RecoveryPassphrase => "VMK protected with recovery passphrase",
            Protection::Passphrase => "VMK protected with passphrase",
            Protection::SmartCard => "VMK protected with smart card",
            Protection::Unknown(_) => "VMK with unknown protection",
        }
    }

    /// Whether cryptblk can open it here.
    fn usable(&self) -> bool {
        matches!(
            self,
            Protection::ClearKey
                | Protection::StartupKey
                | Protection::RecoveryPassphrase
                | Protection::Passphrase
        )
    }
}

/// A key wrapped with AES-CCM.
#[derive(Clone)]
pub struct WrappedKey {
    nonce: [u8; NONCE_LEN],
    tag: [u8; TAG_LEN],
    data: Vec<u8>,
}

impl WrappedKey {
    fn parse(body: &[u8]) -> Result<Self> {
        if body.len() < NONCE_LEN + TAG_LEN {
            return Err(corrupt("wrapped key too short"));
        }
        Ok(WrappedKey {
            nonce: body[..NONCE_LEN].try_into().expect("12 bytes"),
            tag: body[NONCE_LEN..NONCE_LEN + TAG_LEN]
                .try_into()
                .expect("16 bytes"),
            data: body[NONCE_LEN + TAG_LEN..].to_vec(),
        })
    }

    /// Bytes of the wrapped blob (`bitlkDump`'s "Key data size").
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the blob is empty.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Unwraps with `key`: the blob's key bytes (after its 12-byte header), or `None`
    /// when the tag does not match (a wrong key).
    fn unwrap_with(&self, key: &[u8]) -> Result<Option<SecretBytes>> {
        let mut blob = SecretBytes::from_slice(&self.data);
        if aes_ccm_decrypt(key, &self.nonce, &self.tag, &mut blob).is_err() {
            return Ok(None);
        }
        // The blob's first two bytes are its own size.
        if blob.len() < KEY_BLOB_HEADER_LEN
            || u16::from_le_bytes([blob[0], blob[1]]) as usize != blob.len()
        {
            return Err(corrupt("unexpected key data size"));
        }
        Ok(Some(SecretBytes::from_slice(&blob[KEY_BLOB_HEADER_LEN..])))
    }
}

impl std::fmt::Debug for WrappedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WrappedKey({} bytes)", self.data.len())
    }
}

/// One protector of the VMK (a "keyslot" in cryptsetup's dump).
#[derive(Debug, Clone)]
pub struct Vmk {
    /// The protector's GUID (a startup key file names it).
    pub guid: String,
    /// Its name, when it has one.
    pub name: Option<String>,
    /// What protects it.
    pub protection: Protection,
    /// Salt of the key stretching (passphrase and recovery password).
    pub salt: [u8; 16],
    /// The VMK, wrapped.
    pub keys: Vec<WrappedKey>,
    /// The clear key of a suspended volume.
    clear_key: Option<SecretBytes>,
}

/// What encrypts the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encryption {
    /// AES-CBC with the Elephant diffuser (Vista/7), 128 or 256-bit AES keys.
    CbcElephant(usize),
    /// AES-CBC with `eboiv` IVs (Windows 8+ "AES-CBC").
    Cbc(usize),
    /// AES-XTS (Windows 10 1511+), 128 or 256-bit AES keys.
    Xts(usize),
}

impl Encryption {
    fn from_raw(v: u16) -> Option<Self> {
        Some(match v {
            0x8000 => Encryption::CbcElephant(128),
            0x8001 => Encryption::CbcElephant(256),
            0x8002 => Encryption::Cbc(128),
            0x8003 => Encryption::Cbc(256),
            0x8004 => Encryption::Xts(128),
            0x8005 => Encryption::Xts(256),
            _ => return None,
        })
    }

    /// cryptsetup's cipher mode name.
    pub fn mode(&self) -> &'static str {
        match self {
            Encryption::CbcElephant(_) => "cbc-elephant",
            Encryption::Cbc(_) => "cbc-eboiv",
            Encryption::Xts(_) => "xts-plain64",
        }
    }

    /// The data cipher.
    pub fn spec(&self) -> CipherSpec {
        CipherSpec::from_parts("aes", self.mode()).expect("BITLK specs parse")
    }

    /// Bits of the volume key as cryptsetup counts them (both XTS halves, CBC and
    /// diffuser keys).
    pub fn key_bits(&self) -> usize {
        match *self {
            Encryption::CbcElephant(b) | Encryption::Xts(b) => 2 * b,
            Encryption::Cbc(b) => b,
        }
    }
}

/// Whether the volume is fully encrypted the normal way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeKind {
    /// Normal.
    Normal,
    /// Encrypt-on-write ("used space only" encryption still in progress).
    EncryptOnWrite,
    /// Unknown GUID.
    Unknown,
}

/// A parsed BitLocker header: everything `bitlkDump` shows, and the wrapped keys.
#[derive(Debug, Clone)]
pub struct BitlkHeader {
    /// BitLocker To Go (FAT boot sector).
    pub togo: bool,
    /// Encryption sector size (512 or 4096).
    pub sector_size: u32,
    /// The volume's size according to the metadata.
    pub volume_size: u64,
    /// Current and next state are both "normal" (not mid-conversion).
    pub state_normal: bool,
    /// Normal or encrypt-on-write.
    pub kind: VolumeKind,
    /// Data encryption.
    pub encryption: Encryption,
    /// The volume's GUID.
    pub guid: String,
    /// Creation time, seconds since 1970.
    pub created: i64,
    /// The description Windows wrote (machine name, drive, date).
    pub description: Option<String>,
    /// The FVE metadata version (2).
    pub metadata_version: u16,
    /// Byte offsets of the three FVE metadata areas.
    pub metadata_offsets: [u64; 3],
    /// Where the original boot sectors are kept (encrypted), and how many bytes.
    pub volume_header_offset: u64,
    /// Bytes of the relocated volume header.
    pub volume_header_size: u64,
    /// The VMK protectors, in metadata order.
    pub vmks: Vec<Vmk>,
    /// The FVEK, wrapped under the VMK.
    pub fvek: WrappedKey,
}

/// One stretch of the mapped volume (cryptsetup's dm table for BITLK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitlkSegment {
    /// First byte of the volume it covers.
    pub start: u64,
    /// Bytes it covers.
    pub len: u64,
    /// `None` for a zero segment (metadata), else where its data lies on the device and
    /// the IV offset (512-byte sectors) of its first sector.
    pub crypt: Option<(u64, u64)>,
}

fn corrupt(what: &str) -> Error {
    BitlkError::CorruptMetadata(what.to_string()).into()
}

/// A Windows GUID (first three fields little-endian) as text.
fn guid_at(b: &[u8], at: usize) -> String {
    let bytes: [u8; 16] = b[at..at + 16].try_into().expect("16 bytes");
    uuid::Uuid::from_bytes_le(bytes).to_string()
}

/// A UTF-16LE string, up to its first NUL.
fn utf16(b: &[u8]) -> Result<String> {
    let units: Vec<u16> = b
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|&u| u != 0)
        .collect();
    String::from_utf16(&units).map_err(|_| corrupt("invalid UTF-16 string"))
}

/// The entries of a list: `(type, value, body)`, where body excludes the 8-byte entry
/// header. Stops at an entry of size 0 (the list's end).
fn entries(list: &[u8]) -> Result<Vec<(u16, u16, &[u8])>> {
    let mut out = Vec::new();
    let mut at = 0;
    while list.len() - at >= 6 {
        let size = u16_at(list, at) as usize;
        if size == 0 {
            break;
        }
        if size > list.len() - at || size < ENTRY_HEADER_LEN {
            return Err(corrupt("entry overruns its list"));
        }
        out.push((
            u16_at(list, at + 2),
            u16_at(list, at + 4),
            &list[at + ENTRY_HEADER_LEN..at + size],
        ));
        at += size;
    }
    Ok(out)
}

impl BitlkHeader {
    /// Reads and parses the BitLocker metadata of `dev` (cryptsetup's `BITLK_read_sb`).
    pub fn read(dev: &dyn Storage) -> Result<Self> {
        let mut boot = [0u8; 512];
        read(dev, &mut boot, 0)?;
        let (togo, sb_offset) = if &boot[3..11] == SIGNATURE {
            (false, SUPERBLOCK_OFFSET)
        } else if &boot[3..11] == SIGNATURE_TOGO {
            (true, SUPERBLOCK_OFFSET_TOGO)
        } else {
            return Err(BitlkError::NotBitlk.into());
        };
        if &boot[..3] == BOOTCODE_V1 {
            return Err(BitlkError::Unsupported("version 1".into()).into());
        }
        if &boot[..3] != BOOTCODE_V2 {
            return Err(corrupt("invalid or unknown boot signature"));
        }
        let sector_size = match u16_at(&boot, 11) {
            0 => 512,
            s @ (512 | 4096) => s as u32,
            s => {
                return Err(BitlkError::Unsupported(format!("sector size {s}")).into());
            }
        };
        let sb = &boot[sb_offset as usize..sb_offset as usize + 40];
        let kind = match sb[..16].try_into().expect("16 bytes") {
            GUID_NORMAL => VolumeKind::Normal,
            GUID_EOW => VolumeKind::EncryptOnWrite,
            _ => VolumeKind::Unknown,
        };
        let metadata_offsets = [u64_at(sb, 16), u64_at(sb, 24), u64_at(sb, 32)];

        let mut fve = [0u8; BLOCK_HEADER_LEN + METADATA_HEADER_LEN];
        read(dev, &mut fve, metadata_offsets[0])?;
        if &fve[..8] != SIGNATURE || u16_at(&fve, 10) != 2 {
            return Err(corrupt("no FVE metadata block (version 2) at its offset"));
        }
        let state_normal = u16_at(&fve, 12) == STATE_NORMAL && u16_at(&fve, 14) == STATE_NORMAL;
        let volume_size = u64_at(&fve, 16);
        let mh = &fve[BLOCK_HEADER_LEN..];
        let metadata_size = u32_at(mh, 0) as usize;
        let guid = guid_at(mh, 16);
        let encryption = Encryption::from_raw(u16_at(mh, 36)).ok_or_else(|| {
            Error::from(BitlkError::Unsupported(format!(
                "encryption type {:#x}",
                u16_at(mh, 36)
            )))
        })?;
        let filetime = u64_at(mh, 40);
        // Windows FILETIME: 100 ns units since 1601.
        let created = (filetime / 10_000_000) as i64 - 11_644_473_600;
        if metadata_size < METADATA_HEADER_LEN + 4 || metadata_size as u64 > METADATA_AREA_LEN {
            return Err(corrupt("metadata size out of range"));
        }
        let mut list = vec![0u8; metadata_size - METADATA_HEADER_LEN];
        read(
            dev,
            &mut list,
            metadata_offsets[0] + (BLOCK_HEADER_LEN + METADATA_HEADER_LEN) as u64,
        )?;

        let mut vmks = Vec::new();
        let mut fvek = None;
        let mut description = None;
        let mut volume_header = None;
        for (ty, _value, body) in entries(&list)? {
            match ty {
                ENTRY_VMK => vmks.push(parse_vmk(body)?),
                ENTRY_FVEK if fvek.is_none() => fvek = Some(WrappedKey::parse(body)?),
                ENTRY_VOLUME_HEADER => {
                    if body.len() < 16 {
                        return Err(corrupt("volume header entry too short"));
                    }
                    volume_header = Some((u64_at(body, 0), u64_at(body, 8)));
                }
                ENTRY_DESCRIPTION if description.is_none() => description = Some(utf16(body)?),
                _ => {}
            }
        }
        let fvek = fvek.ok_or_else(|| corrupt("no FVEK entry"))?;
        let (volume_header_offset, volume_header_size) =
            volume_header.ok_or_else(|| corrupt("no volume header entry"))?;
        Ok(BitlkHeader {
            togo,
            sector_size,
            volume_size,
            state_normal,
            kind,
            encryption,
            guid,
            created,
            description,
            metadata_version: u16_at(&fve, 10),
            metadata_offsets,
            volume_header_offset,
            volume_header_size,
            vmks,
            fvek,
        })
    }

    /// Whether a protector can be opened without any secret (protection suspended).
    pub fn has_clear_key(&self) -> bool {
        self.vmks.iter().any(|v| v.clear_key.is_some())
    }

    /// What cryptsetup refuses to map (and so does cryptblk): a volume mid-conversion
    /// (partially encrypted or decrypted) or encrypt-on-write.
    pub fn check_mappable(&self) -> Result<()> {
        if !self.state_normal {
            return Err(BitlkError::NotMappable(
                "partially encrypted or decrypted (an unsupported state)".into(),
            )
            .into());
        }
        match self.kind {
            VolumeKind::Normal => Ok(()),
            VolumeKind::EncryptOnWrite => {
                Err(BitlkError::NotMappable("type 'encrypt-on-write'".into()).into())
            }
            VolumeKind::Unknown => Err(BitlkError::NotMappable("type 'unknown'".into()).into()),
        }
    }

    /// The FVEK (the volume key) from a passphrase, a recovery password or the contents
    /// of a startup key (.BEK) file, trying each protector that fits. An empty secret
    /// opens a volume whose protection is suspended (clear key).
    pub fn volume_key(&self, secret: &[u8]) -> Result<SecretBytes> {
        for vmk in &self.vmks {
            let key = match vmk.protection {
                Protection::ClearKey => vmk.clear_key.clone(),
                Protection::Passphrase if !secret.is_empty() => passphrase_key(secret, &vmk.salt),
                Protection::RecoveryPassphrase => {
                    recovery_key(secret).map(|k| stretch(&k, &vmk.salt))
                }
                Protection::StartupKey => startup_key(secret, vmk, &self.guid)?,
                // TPM, smart card, or a passphrase protector with no secret given.
                _ => None,
            };
            let Some(key) = key else { continue };
            for wrapped in &vmk.keys {
                let Some(vmk_key) = wrapped.unwrap_with(&key)? else {
                    continue;
                };
                if let Some(fvek) = self.fvek.unwrap_with(&vmk_key)? {
                    return self.fvek_volume_key(fvek);
                }
            }
        }
        if !self.vmks.is_empty() && self.vmks.iter().all(|v| !v.protection.usable()) {
            return Err(BitlkError::OnlyHardwareProtectors.into());
        }
        Err(Error::WrongPassphrase)
    }

    /// The volume key as the data cipher takes it, from the decrypted FVEK blob.
    fn fvek_volume_key(&self, fvek: SecretBytes) -> Result<SecretBytes> {
        let want = self.encryption.key_bits() / 8;
        let key = match self.encryption {
            // Key data is CBC key, 16 empty bytes, diffuser key, 16 empty bytes.
            Encryption::CbcElephant(128) if fvek.len() == 64 => {
                let mut k = SecretBytes::zeroed(32);
                k[..16].copy_from_slice(&fvek[..16]);
                k[16..].copy_from_slice(&fvek[32..48]);
                k
            }
            _ => fvek,
        };
        if key.len() != want {
            return Err(corrupt(&format!(
                "FVEK of {} bytes for {}-bit {}",
                key.len(),
                want * 8,
                self.encryption.mode()
            )));
        }
        Ok(key)
    }

    /// The data cipher of segment `iv_offset` (512-byte sectors) under `key`.
    pub fn sector_cipher(&self, key: &[u8], iv_offset: u64) -> Result<SectorCipher> {
        let iv = IvOptions {
            large_sectors: self.sector_size != 512,
            offset: iv_offset,
        };
        Ok(SectorCipher::new(
            self.encryption.spec(),
            key,
            self.sector_size,
            iv,
        )?)
    }

    /// How a device of `device_size` bytes maps (cryptsetup's `_activate`): the three
    /// metadata areas and the volume header area read as zeros, the volume header's
    /// sectors appear at the start, and everything else is decrypted in place.
    pub fn segments(&self, device_size: u64) -> Result<Vec<BitlkSegment>> {
        let ss = self.sector_size as u64;
        let size = device_size / ss * ss;
        let hdr = (self.volume_header_offset, self.volume_header_size);
        let mut zeros: Vec<(u64, u64)> = self
            .metadata_offsets
            .iter()
            .map(|&o| (o, METADATA_AREA_LEN))
            .chain(std::iter::once(hdr))
            .collect();
        zeros.sort();
        let mut end_prev = hdr.1;
        for &(o, l) in &zeros {
            let aligned = o.is_multiple_of(ss) && l.is_multiple_of(ss);
            let end = o.checked_add(l).filter(|&e| e <= size);
            if !aligned || end.is_none() || l == 0 || o < end_prev {
                return Err(corrupt(&format!(
                    "metadata area at {o} ({l} bytes) overlaps another, is not aligned to \
                     {ss} bytes or lies past the device's {size} bytes"
                )));
            }
            end_prev = o + l;
        }
        let mut out = vec![BitlkSegment {
            start: 0,
            len: hdr.1,
            crypt: Some((hdr.0, hdr.0 / 512)),
        }];
        let mut at = hdr.1;
        for &(o, l) in &zeros {
            if o > at {
                out.push(BitlkSegment {
                    start: at,
                    len: o - at,
                    crypt: Some((at, at / 512)),
                });
            }
            out.push(BitlkSegment {
                start: o,
                len: l,
                crypt: None,
            });
            at = o + l;
        }
        if size > at {
            out.push(BitlkSegment {
                start: at,
                len: size - at,
                crypt: Some((at, at / 512)),
            });
        }
        Ok(out.into_iter().filter(|s| s.len > 0).collect())
    }

    /// cryptsetup's `bitlkDump` text.
    pub fn dump(&self, device: &str) -> String {
        let mut s = String::new();
        let togo = if self.togo { " To Go" } else { "" };
        let _ = writeln!(s, "Info for BITLK{togo} device {device}.");
        let _ = writeln!(s, "Version:      \t{}", self.metadata_version);
        let _ = writeln!(s, "GUID:         \t{}", self.guid);
        let _ = writeln!(s, "Sector size:  \t{} [bytes]", self.sector_size);
        let _ = writeln!(s, "Volume size:  \t{} [bytes]", self.volume_size);
        let _ = writeln!(s, "Created:      \t{}", ctime_utc(self.created));
        let _ = writeln!(
            s,
            "Description:  \t{}",
            self.description.as_deref().unwrap_or("(null)")
        );
        let _ = writeln!(s, "Cipher name:  \taes");
        let _ = writeln!(s, "Cipher mode:  \t{}", self.encryption.mode());
        let _ = writeln!(s, "Cipher key:   \t{} bits", self.encryption.key_bits());
        let _ = writeln!(s);
        let _ = writeln!(s, "Keyslots:");
        for (i, v) in self.vmks.iter().enumerate() {
            let _ = writeln!(s, " {i}: VMK");
            if let Some(n) = &v.name {
                let _ = writeln!(s, "\tName:       \t{n}");
            }
            let _ = writeln!(s, "\tGUID:       \t{}", v.guid);
            let _ = writeln!(s, "\tProtection: \t{}", v.protection.describe());
            let _ = writeln!(s, "\tSalt:       \t{}", hex(&v.salt));
            for k in &v.keys {
                let _ = writeln!(s, "\tKey data size:\t{} [bytes]", k.len());
            }
        }
        let _ = writeln!(s, " {}: FVEK", self.vmks.len());
        let _ = writeln!(s, "\tKey data size:\t{} [bytes]", self.fvek.len());
        let _ = writeln!(s);
        let _ = writeln!(s, "Metadata segments:");
        for (i, o) in self.metadata_offsets.iter().enumerate() {
            let _ = writeln!(s, " {i}: FVE metadata area");
            let _ = writeln!(s, "\tOffset: \t{o} [bytes]");
            let _ = writeln!(s, "\tSize:   \t{METADATA_AREA_LEN} [bytes]");
        }
        let _ = writeln!(s, " 3: Volume header");
        let _ = writeln!(s, "\tOffset: \t{} [bytes]", self.volume_header_offset);
        let _ = writeln!(s, "\tSize:   \t{} [bytes]", self.volume_header_size);
        let _ = writeln!(s, "\tCipher: \taes-{}", self.encryption.mode());
        s
    }
}

impl BitlkHeader {
    /// cryptsetup's `bitlkDump --dump-volume-key` text for volume key `key`.
    pub fn dump_volume_key(&self, device: &str, key: &[u8]) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "BITLK header information for {device}");
        let _ = writeln!(s, "Cipher name:   \taes");
        let _ = writeln!(s, "Cipher mode:   \t{}", self.encryption.mode());
        let _ = writeln!(s, "UUID:          \t{}", self.guid);
        let _ = writeln!(s, "MK bits:       \t{}", key.len() * 8);
        let _ = writeln!(s, "MK dump:\t{}", crate::key_dump_hex(key));
        s
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `ctime`'s layout ("Wed Jun 30 21:49:08 1993"), in UTC.
fn ctime_utc(t: i64) -> String {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    // Civil date from days since 1970 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WD: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MON: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {year}",
        WD[days.rem_euclid(7) as usize],
        MON[(month - 1) as usize],
        day,
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// One VMK entry (its body after the 8-byte entry header).
fn parse_vmk(body: &[u8]) -> Result<Vmk> {
    if body.len() < VMK_HEADER_LEN {
        return Err(corrupt("VMK entry too short"));
    }
    let protection = Protection::from_raw(u16_at(body, 26));
    let mut vmk = Vmk {
        guid: guid_at(body, 0),
        name: None,
        protection,
        salt: [0; 16],
        keys: Vec::new(),
        clear_key: None,
    };
    let strict = protection.usable();
    for (ty, value, e) in entries(&body[VMK_HEADER_LEN..])? {
        if ty != ENTRY_PROPERTY && strict {
            return Err(corrupt(&format!(
                "unexpected entry type {ty} in a {}",
                protection.describe()
            )));
        }
        match value {
            // Skip the 4-byte encryption method of the stretch key.
            VALUE_STRETCH_KEY if e.len() >= 20 => vmk.salt.copy_from_slice(&e[4..20]),
            VALUE_ENCRYPTED_KEY => vmk.keys.push(WrappedKey::parse(e)?),
            // A clear key (4 bytes of method first): suspended protection.
            VALUE_KEY if protection == Protection::ClearKey && e.len() > 4 => {
                vmk.clear_key = Some(SecretBytes::from_slice(&e[4..]))
            }
            VALUE_KEY | VALUE_RECOVERY_TIME => {}
            VALUE_USE_KEY if protection == Protection::StartupKey => {}
            VALUE_STRING if vmk.name.is_none() => vmk.name = Some(utf16(e)?),
            v if strict => {
                return Err(corrupt(&format!(
                    "unexpected entry value {v} in a {}",
                    protection.describe()
                )));
            }
            _ => {}
        }
    }
    Ok(vmk)
}

/// SHA-256 over the passphrase in UTF-16LE, twice, then stretched; `None` when the
/// secret is not text (a .BEK file's contents), so no passphrase.
fn passphrase_key(pass: &[u8], salt: &[u8; 16]) -> Option<SecretBytes> {
    let text = std::str::from_utf8(pass).ok()?;
    let mut utf16 = SecretBytes::zeroed(text.encode_utf16().count() * 2);
    for (o, u) in utf16.chunks_exact_mut(2).zip(text.encode_utf16()) {
        o.copy_from_slice(&u.to_le_bytes());
    }
    let once = SecretBytes::from_vec(HashAlg::Sha256.digest(&utf16));
    Some(stretch(&once, salt))
}

/// The stretched key of `input` (the passphrase's SHA-256, or the 16-byte recovery
/// key): its SHA-256 is the stretch's starting point.
fn stretch(input: &[u8], salt: &[u8; 16]) -> SecretBytes {
    let d = SecretBytes::from_vec(HashAlg::Sha256.digest(input));
    let initial: &[u8; 32] = d[..].try_into().expect("SHA-256 digest");
    kdf::bitlk_stretch(initial, salt)
}

/// The 16-byte key of a recovery password (eight groups of six digits, each a multiple
/// of 11 below 720896), or `None` when the secret is not one.
fn recovery_key(secret: &[u8]) -> Option<SecretBytes> {
    let s = secret.strip_suffix(b"\n").unwrap_or(secret);
    if s.len() != 55 {
        return None;
    }
    let mut key = SecretBytes::zeroed(16);
    for (i, group) in s.split(|&b| b == b'-').enumerate() {
        if i >= 8 || group.len() != 6 || !group.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n: u32 = std::str::from_utf8(group).ok()?.parse().ok()?;
        if !n.is_multiple_of(11) || n / 11 > 0xffff {
            return None;
        }
        key[2 * i..2 * i + 2].copy_from_slice(&((n / 11) as u16).to_le_bytes());
    }
    Some(key)
}

/// The key in a startup key (.BEK) file meant for `vmk` (`None` when the file is not a
/// BEK file or is another protector's).
fn startup_key(file: &[u8], vmk: &Vmk, volume_guid: &str) -> Result<Option<SecretBytes>> {
    if file.len() < BEK_HEADER_LEN + 6 || guid_at(file, 16) != vmk.guid {
        return Ok(None);
    }
    if u32_at(file, 4) != 1 {
        return Err(BitlkError::StartupKey(format!(
            "unsupported BEK metadata version {}",
            u32_at(file, 4)
        ))
        .into());
    }
    if u32_at(file, 0) as usize != file.len() {
        return Err(BitlkError::StartupKey(
            "BEK metadata size does not match the BEK file's length".into(),
        )
        .into());
    }
    let list = entries(&file[BEK_HEADER_LEN..])?;
    let Some(&(ENTRY_STARTUP_KEY, VALUE_EXTERNAL_KEY, body)) = list.first() else {
        return Err(BitlkError::StartupKey("unexpected metadata entry".into()).into());
    };
    if body.len() < STARTUP_KEY_HEADER_LEN {
        return Err(corrupt("startup key entry too short"));
    }
    for (ty, value, e) in entries(&body[STARTUP_KEY_HEADER_LEN..])? {
        if ty != ENTRY_PROPERTY && ty != ENTRY_VOLUME_GUID {
            return Err(
                BitlkError::StartupKey(format!("unexpected metadata entry type {ty}")).into(),
            );
        }
        match value {
            VALUE_KEY if e.len() > 4 => return Ok(Some(SecretBytes::from_slice(&e[4..]))),
            VALUE_STRING => {}
            VALUE_GUID if e.len() >= 16 => {
                let g = guid_at(e, 0);
                if g != volume_guid {
                    return Err(BitlkError::StartupKey(format!(
                        "BEK file GUID '{g}' does not match GUID of the volume"
                    ))
                    .into());
                }
            }
            v => {
                return Err(
                    BitlkError::StartupKey(format!("unexpected metadata entry value {v}")).into(),
                );
            }
        }
    }
    Err(corrupt("no key in the startup key file"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_passwords() {
        let k = recovery_key(b"042647-302313-590458-071500-554323-116567-412181-516978").unwrap();
        assert_eq!(&k[..2], &(42647u16 / 11).to_le_bytes());
        assert!(
            recovery_key(b"042647-302313-590458-071500-554323-116567-412181-516978\n").is_some()
        );
        // Not a multiple of 11, wrong grouping, too short.
        assert!(recovery_key(b"042648-302313-590458-071500-554323-116567-412181-516978").is_none());
        assert!(recovery_key(b"0426473-02313-590458-071500-554323-116567-412181-516978").is_none());
        assert!(recovery_key(b"anaconda").is_none());
    }

    #[test]
    fn ctime_layout() {
        assert_eq!(ctime_utc(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(ctime_utc(741_476_948), "Wed Jun 30 21:49:08 1993");
    }

    #[test]
    fn segments_as_cryptsetup_maps_them() {
        let mut h = dummy();
        h.metadata_offsets = [0x200_0000, 0x300_0000, 0x400_0000];
        h.volume_header_offset = 0x210_0000;
        h.volume_header_size = 0x2000;
        let segs = h.segments(100 << 20).unwrap();
        assert_eq!(segs[0].crypt, Some((0x210_0000, 0x210_0000 / 512)));
        assert_eq!((segs[0].start, segs[0].len), (0, 0x2000));
        let mut at = 0;
        for s in &segs {
            assert_eq!(s.start, at);
            if let (Some((off, iv)), true) = (s.crypt, s.start > 0) {
                assert_eq!((off, iv), (s.start, s.start / 512));
            }
            at += s.len;
        }
        assert_eq!(at, 100 << 20);
        assert_eq!(segs.iter().filter(|s| s.crypt.is_none()).count(), 4);
        h.volume_header_offset = 0x200_8000;
        assert!(h.segments(100 << 20).is_err(), "overlap refused");
        h.volume_header_offset = 0x210_0000;
        assert!(h.segments(0x300_0000).is_err(), "area past the end refused");
    }

    fn dummy() -> BitlkHeader {
        BitlkHeader {
            togo: false,
            sector_size: 512,
            volume_size: 0,
            state_normal: true,
            kind: VolumeKind::Normal,
            encryption: Encryption::Xts(128),
            guid: String::new(),
            created: 0,
            description: None,
            metadata_version: 2,
            metadata_offsets: [0; 3],
            volume_header_offset: 0,
            volume_header_size: 0,
            vmks: Vec::new(),
            fvek: WrappedKey {
                nonce: [0; 12],
                tag: [0; 16],
                data: Vec::new(),
            },
        }
    }
}
