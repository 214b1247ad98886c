//! FileVault 2 (Core Storage): the logical volume under its AES-XTS key.

use super::*;
use crate::{Result, Volume, VolumeParams};
use cryptblk_format::fvault2::Fvault2Header;
use std::path::Path;

/// FileVault 2's volume key: AES-128-XTS.
pub(crate) const FVAULT2_KEY_LEN: usize = 32;

/// An unlocked FileVault 2 volume and the metadata that opened it.
pub struct UnlockedFvault2 {
    /// The volume, ready for I/O: the logical volume as cryptsetup maps it.
    pub volume: Volume,
    /// The Core Storage metadata (for `status` and `fvault2Dump`).
    pub header: Fvault2Header,
}

/// Reads the FileVault 2 (Core Storage) metadata of `device` without unlocking anything.
pub fn fvault2_header(device: &Path, devices: &Devices) -> Result<Fvault2Header> {
    let dev = devices.open_header(device, true)?;
    Ok(Fvault2Header::read(&dev)?)
}

/// Unlocks a FileVault 2 volume (`cryptsetup open --type fvault2`) and maps its logical
/// volume as cryptsetup does: aes-xts-plain64 from the volume's offset, IVs from 0.
pub fn open_fvault2(
    device: &Path,
    opts: &OpenOptions,
    secret: Unlock<'_>,
) -> Result<UnlockedFvault2> {
    let data = opts.devices.open(device, opts.read_only)?;
    let header = Fvault2Header::read(&data)?;
    let cipher = match secret {
        Unlock::Passphrase(p) => header.sector_cipher(&header.volume_key(p)?)?,
        Unlock::VolumeKey(k) if k.len() == FVAULT2_KEY_LEN => header.sector_cipher(k)?,
        Unlock::VolumeKey(k) => return Err(wrong_key_len(k, FVAULT2_KEY_LEN)),
    };
    let params = VolumeParams {
        cipher: *cipher.spec(),
        sector_size: 512,
        iv: cipher.iv_options(),
        data_offset: header.volume_offset,
        data_length: Some(header.volume_size / 512 * 512),
        read_only: opts.read_only,
        allow_discards: opts.allow_discards,
    };
    let storage = opts.io.storage(data, 512)?;
    let volume = Volume::new(storage, cipher, &params)?;
    Ok(UnlockedFvault2 { volume, header })
}
