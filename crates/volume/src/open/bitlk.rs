//! BitLocker and BitLocker To Go: the FVEK from a protector, the volume mapped as
//! cryptsetup maps it (metadata areas as zeros, the boot sectors relocated).

use super::*;
use crate::storage::Storage;
use crate::{DataSegment, Result, Volume};
use cryptblk_crypto::SectorCipher;
use cryptblk_format::bitlk::BitlkHeader;
use std::path::Path;

/// An unlocked BitLocker volume and the metadata that opened it.
pub struct UnlockedBitlk {
    /// The volume, ready for I/O: the whole device as cryptsetup maps it.
    pub volume: Volume,
    /// The metadata (for `status` and `bitlkDump`).
    pub header: BitlkHeader,
}

/// Reads the BitLocker metadata of `device` without unlocking anything.
pub fn bitlk_header(device: &Path, devices: &Devices) -> Result<BitlkHeader> {
    let dev = devices.open_header(device, true)?;
    Ok(BitlkHeader::read(&dev)?)
}

/// Unlocks a BitLocker volume (`cryptsetup open --type bitlk`) and maps it as cryptsetup
/// does: the metadata areas read as zeros, the relocated boot sectors appear at the start.
pub fn open_bitlk(device: &Path, opts: &OpenOptions, secret: Unlock<'_>) -> Result<UnlockedBitlk> {
    let data = opts.devices.open(device, opts.read_only)?;
    let header = BitlkHeader::read(&data)?;
    header.check_mappable()?;
    let key = match secret {
        Unlock::Passphrase(s) => header.volume_key(s)?,
        Unlock::VolumeKey(k) if k.len() * 8 == header.encryption.key_bits() => {
            cryptblk_crypto::SecretBytes::from_slice(k)
        }
        Unlock::VolumeKey(k) => return Err(wrong_key_len(k, header.encryption.key_bits() / 8)),
    };
    let size = data.size()?;
    let zero_spec = cryptblk_crypto::CipherSpec::parse("cipher_null-ecb")?;
    let segments = header
        .segments(size)?
        .into_iter()
        .map(|s| {
            let (storage_offset, cipher, zero) = match s.crypt {
                Some((at, iv)) => (at, header.sector_cipher(&key, iv)?, false),
                None => (
                    s.start,
                    SectorCipher::new(zero_spec, &[], header.sector_size, Default::default())?,
                    true,
                ),
            };
            Ok(DataSegment {
                start: s.start,
                len: s.len,
                storage_offset,
                cipher,
                zero,
                integrity: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let storage = opts.io.storage(data, header.sector_size)?;
    let volume = Volume::with_segments(storage, segments, opts.read_only, opts.allow_discards)?;
    Ok(UnlockedBitlk { volume, header })
}
