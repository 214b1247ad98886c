//! Plain dm-crypt mappings: a key (derived from a passphrase, or a key file's bytes) and
//! the geometry cryptsetup's plain options give.

use super::*;
use crate::{Result, Volume, VolumeParams};
use cryptblk_device::DataDevice;
use std::path::Path;

/// Opens a plain dm-crypt mapping of `device` with an already derived key.
pub fn open_plain(device: &Path, key: &[u8], params: &VolumeParams) -> Result<Volume> {
    open_plain_with(device, key, params, FileIo::default())
}

/// [`open_plain`] with a choice of I/O engine and O_DIRECT (a local file or block device).
pub fn open_plain_with(
    device: &Path,
    key: &[u8],
    params: &VolumeParams,
    io: FileIo,
) -> Result<Volume> {
    let data = Devices::default().open(device, params.read_only)?;
    open_plain_on(data, key, params, io)
}

/// A plain dm-crypt mapping of the opened device `data` with an already derived key.
pub fn open_plain_on(
    data: DataDevice,
    key: &[u8],
    params: &VolumeParams,
    io: FileIo,
) -> Result<Volume> {
    let storage = io.storage(data, params.sector_size)?;
    volume_from_key(storage, key, params)
}
