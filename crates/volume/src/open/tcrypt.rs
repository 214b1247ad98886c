//! TrueCrypt and VeraCrypt: the header found by decryption, the data mapped where
//! cryptsetup maps it.

use super::*;
use crate::storage::Storage;
use crate::{Result, Volume, VolumeParams};
use cryptblk_device::DataDevice;
use cryptblk_format::tcrypt::{TcryptHeader, TcryptOptions};
use std::path::Path;

/// An unlocked TrueCrypt/VeraCrypt volume with its decrypted header.
pub struct UnlockedTcrypt {
    /// The volume, ready for I/O.
    pub volume: Volume,
    /// The header that opened it (for `status` and `tcryptDump`).
    pub header: TcryptHeader,
    /// Where the data starts, in 512-byte sectors.
    pub data_offset: u64,
}

/// Decrypts the TrueCrypt/VeraCrypt header of `data` (or of the header file `header`)
/// without mapping anything (`test-passphrase`, `tcryptDump`).
pub fn tcrypt_header(
    data: &DataDevice,
    header: Option<&Path>,
    devices: &Devices,
    tc: &TcryptOptions,
    passphrase: &[u8],
) -> Result<TcryptHeader> {
    let dev = match header {
        Some(h) => devices.open_header(h, true)?,
        None => data.clone(),
    };
    let size = dev.size()?;
    Ok(TcryptHeader::open(&dev, size, tc, passphrase)?)
}

/// Unlocks a TrueCrypt/VeraCrypt volume (`cryptsetup open --type tcrypt`): the header
/// `tc` selects (outer, hidden, system, backup; from `opts.header` if given) opened with
/// `passphrase` and `tc`'s keyfiles, the data mapped where cryptsetup maps it.
pub fn open_tcrypt(
    device: &Path,
    opts: &OpenOptions,
    tc: &TcryptOptions,
    passphrase: &[u8],
) -> Result<UnlockedTcrypt> {
    let data = opts.devices.open(device, opts.read_only)?;
    let data_size = data.size()?;
    let header = match &opts.header {
        Some(h) => {
            let f = opts.devices.open_header(h, true)?;
            let size = f.size()?;
            TcryptHeader::open(&f, size, tc, passphrase)?
        }
        None => TcryptHeader::open(&data, data_size, tc, passphrase)?,
    };
    let offset = header.data_offset(tc, data_size);
    let cipher = header.sector_cipher(header.iv_offset(tc, data_size))?;
    let params = VolumeParams {
        cipher: *cipher.spec(),
        sector_size: cipher.sector_size(),
        iv: cipher.iv_options(),
        data_offset: offset * 512,
        data_length: Some(header.data_len(tc, data_size)),
        read_only: opts.read_only,
        allow_discards: opts.allow_discards,
    };
    let storage = opts.io.storage(data, params.sector_size)?;
    let volume = Volume::new(storage, cipher, &params)?;
    Ok(UnlockedTcrypt {
        volume,
        header,
        data_offset: offset,
    })
}
