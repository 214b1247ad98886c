//! Little-endian fields and bounded reads, shared by the parsers of foreign metadata
//! (BitLocker, Core Storage).

use crate::{Error, Result};
use cryptblk_device::Storage;

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads `buf.len()` bytes at `at`, or [`Error::Truncated`] when the device ends first.
pub(crate) fn read_within(dev: &dyn Storage, buf: &mut [u8], at: u64) -> Result<()> {
    let size = dev.size()?;
    if at
        .checked_add(buf.len() as u64)
        .is_none_or(|end| end > size)
    {
        return Err(Error::Truncated {
            need: at.saturating_add(buf.len() as u64),
            have: size,
        });
    }
    dev.read_at(buf, at)?;
    Ok(())
}
