//! Standalone dm-integrity volumes, as integritysetup formats them: no encryption, each
//! block checked against dm-integrity's own checksum (`crc32c` by default, a hash, or a
//! keyed HMAC), the superblock at the start of the device. The superblock does not name
//! the checksum: as with `integritysetup open`, the caller does (`--integrity`), and a wrong
//! one reads as failed blocks.

use super::{OpenOptions, integrity_volume_with};
use crate::{Error, Result, Volume};
use cryptblk_crypto::IntegrityHash;
use cryptblk_device::Storage;
use cryptblk_format::integrity::{Superblock, flags};
use std::path::Path;

/// integritysetup's default checksum.
pub const DEFAULT_INTEGRITY_ALGORITHM: &str = "crc32c";

/// How to open a standalone integrity volume.
#[derive(Debug, Clone, Default)]
pub struct IntegrityOptions {
    /// The checksum (`--integrity`): [`DEFAULT_INTEGRITY_ALGORITHM`] when `None`.
    pub algorithm: Option<String>,
    /// The journal's MAC (`--journal-integrity`) and its key, for a volume formatted with
    /// one.
    pub journal_mac: Option<(String, Option<cryptblk_crypto::SecretBytes>)>,
    /// The journal's encryption (`--journal-crypt`: a stream cipher) and its key.
    pub journal_crypt: Option<(String, cryptblk_crypto::SecretBytes)>,
}

impl IntegrityOptions {
    /// The journal's MAC and encryption these options name, keyed.
    pub fn journal_keys(&self) -> Result<crate::JournalKeys> {
        Ok(crate::JournalKeys {
            mac: self.journal_mac()?,
            crypt: self.journal_crypt.clone(),
        })
    }

    /// The journal MAC these options name, keyed.
    fn journal_mac(&self) -> Result<Option<IntegrityHash>> {
        self.journal_mac
            .as_ref()
            .map(|(name, key)| {
                let size = IntegrityHash::digest_size_of(name)?;
                Ok(IntegrityHash::new(name, key.as_deref(), size, 512, None)?)
            })
            .transpose()
    }
}

impl IntegrityOptions {
    /// The checksum's name.
    pub fn algorithm(&self) -> &str {
        self.algorithm
            .as_deref()
            .unwrap_or(DEFAULT_INTEGRITY_ALGORITHM)
    }
}

/// The superblock at the start of `device` (a device that is not dm-integrity is refused).
pub(crate) fn integrity_superblock(device: &Path, opts: &OpenOptions) -> Result<Superblock> {
    let data = opts.devices.open(device, true)?;
    let mut b = [0u8; 512];
    data.read_at(&mut b, 0)?;
    Superblock::parse(&b).map_err(|e| Error::Invalid(format!("{}: {e}", device.display())))
}

/// Opens the standalone integrity volume on `device` with `key` for the keyed checksums.
pub fn open_integrity(device: &Path, opts: &OpenOptions, key: Option<&[u8]>) -> Result<Volume> {
    if opts.allow_discards {
        return Err(Error::Invalid(
            "discards are not supported on integrity volumes yet".into(),
        ));
    }
    if opts.io.direct {
        return Err(Error::Invalid(
            "--direct is not supported on integrity volumes (tags are not sector-aligned)".into(),
        ));
    }
    let sb = integrity_superblock(device, opts)?;
    let salt = (sb.flags & flags::FIXED_HMAC != 0).then_some(sb.salt);
    let block = 512u32 << sb.log2_sectors_per_block;
    let hash = IntegrityHash::new(
        opts.integrity.algorithm(),
        key,
        usize::from(sb.tag_size),
        block,
        salt,
    )?;
    let data = opts.devices.open(device, opts.read_only)?;
    let storage = opts.io.storage(data, block)?;
    integrity_volume_with(
        storage,
        0,
        Box::new(hash),
        opts.integrity.journal_keys()?,
        opts.read_only,
        opts.integrity_mode(),
    )
}
