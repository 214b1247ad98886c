//! loop-AES (`cryptsetup open --type loopaes`): the keys of a key file (1, 64 or 65 of
//! them: dm-crypt's `lmk` v2/v3 for many) on 512-byte sectors.

use super::{FileIo, OpenOptions};
use crate::{Result, Volume, VolumeParams};
use cryptblk_crypto::{BlockCipherAlg, HashAlg};
use cryptblk_format::loopaes::{LoopAesKey, parse_keyfile};
use std::path::Path;

/// loop-AES's options (cryptsetup's names, its defaults).
#[derive(Debug, Clone)]
pub struct LoopAesOptions {
    /// `--cipher`: aes by default.
    pub cipher: BlockCipherAlg,
    /// `--key-size` / 8: 32 by default (cryptsetup's compiled-in 256 bits).
    pub key_len: usize,
    /// `--hash` for the key file's lines; SHA-256/384/512 by key size unless given.
    pub hash: Option<HashAlg>,
    /// `--offset`: where the data starts, in 512-byte sectors.
    pub offset: u64,
    /// `--skip`: the IV offset in 512-byte sectors (`offset` unless given).
    pub skip: Option<u64>,
    /// `--size` in 512-byte sectors (to the device's end unless given).
    pub size: Option<u64>,
}

impl Default for LoopAesOptions {
    fn default() -> Self {
        LoopAesOptions {
            cipher: BlockCipherAlg::Aes,
            key_len: 32,
            hash: None,
            offset: 0,
            skip: None,
            size: None,
        }
    }
}

impl LoopAesOptions {
    /// The keys of `file` (a key file, as read) and the mapping they open.
    pub fn keys(&self, file: &[u8]) -> Result<LoopAesKey> {
        Ok(parse_keyfile(file, self.cipher, self.key_len, self.hash)?)
    }

    fn params(&self, k: &LoopAesKey, read_only: bool, allow_discards: bool) -> VolumeParams {
        VolumeParams {
            cipher: k.cipher,
            sector_size: 512,
            iv: cryptblk_crypto::IvOptions {
                large_sectors: false,
                offset: self.skip.unwrap_or(self.offset),
            },
            data_offset: self.offset * 512,
            data_length: self.size.map(|s| s * 512),
            read_only,
            allow_discards,
        }
    }
}

/// Opens a loop-AES volume with the key file's contents `file`.
pub fn open_loopaes(device: &Path, opts: &OpenOptions, file: &[u8]) -> Result<Volume> {
    let k = opts.loopaes.keys(file)?;
    let params = opts.loopaes.params(&k, opts.read_only, opts.allow_discards);
    let data = opts.devices.open(device, opts.read_only)?;
    super::open_plain_on(data, &k.key, &params, FileIo { ..opts.io })
}
