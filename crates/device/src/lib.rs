//! Block devices as frontends (NBD, FUSE, ublk) see them, the positioned I/O on the
//! storage under them, and the devices a DEVICE argument opens to (opened by a
//! [`DeviceOpener`]: local files here, remote storage in `cryptblk-storage`).

#![forbid(unsafe_code)]

use std::io;

mod data_device;
pub mod errno;
mod partition;
mod storage;
pub use data_device::{
    DataDevice, DeviceOpener, LocalDevices, open_local, open_local_header, open_local_shared,
};
pub use errno::errno_of;
pub use partition::{Partition, partition_of};
pub use storage::{
    MemStorage, MemoryDevice, RawDevice, Storage, file_prefetch, file_seek_data, file_seek_hole,
    storage_extents,
};

/// A run of a device's bytes in one allocation state, as [`BlockDevice::block_status`]
/// reports them (NBD's `base:allocation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Bytes in the run.
    pub len: u64,
    /// Not allocated on the storage (a hole).
    pub hole: bool,
    /// Reads back as zeros. Never set where a read returns anything else: a hole under an
    /// encrypted volume decrypts to garbage, so it is a hole but not zero.
    pub zero: bool,
}

/// Most runs one [`BlockDevice::block_status`] call returns (the client asks again for the
/// rest).
pub const MAX_EXTENTS: usize = 1024;

/// A byte-addressed block device shared by the threads of a frontend.
///
/// Offsets and lengths handed in are multiples of [`BlockDevice::block_size`] unless the
/// implementation says otherwise; frontends check bounds before calling.
pub trait BlockDevice: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Smallest unit of I/O (the encryption sector size for encrypted volumes).
    fn block_size(&self) -> u32;
    /// Whether the device refuses writes, write-zeroes and discards.
    fn read_only(&self) -> bool;
    /// Whether reads, writes, write-zeroes and discards may start and end anywhere, not only
    /// on block boundaries (the device then does read-modify-write itself). Frontends may
    /// pass such requests through instead of refusing them: a kernel NBD client set up
    /// with 512-byte blocks on a 4096-byte-sector volume keeps working.
    fn byte_granular(&self) -> bool {
        false
    }
    /// Whether `discard` does anything (off by default for encrypted volumes, as in dm-crypt).
    fn can_discard(&self) -> bool;
    /// Fills `buf` with the device bytes starting at byte `offset`; the whole buffer is
    /// read or an error is returned.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes `buf`; with `fua` the data is durable when this returns.
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()>;
    /// Like `write_at`, but the device may use `buf` as scratch (an encrypted volume
    /// encrypts it in place, saving a copy). Frontends whose buffer is their own call this.
    fn write_at_mut(&self, buf: &mut [u8], offset: u64, fua: bool) -> io::Result<()> {
        self.write_at(buf, offset, fua)
    }
    /// Makes all completed writes durable.
    fn flush(&self) -> io::Result<()>;
    /// Releases the range (punches a hole); `Unsupported` when discards are not allowed.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Makes the range read back as zeros; may unmap it when `may_unmap` and discards are allowed.
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> io::Result<()>;
    /// Like `write_zeroes`, but only where that is much faster than writing zeros (a hole
    /// punched, memory cleared); otherwise fails with `Unsupported` and leaves the range as
    /// it was (NBD's fast zero: a client pre-zeroing a disk then skips it).
    fn write_zeroes_fast(&self, _offset: u64, _len: u64, _may_unmap: bool) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
    /// The allocation state of `len` bytes from `offset` (a checked, block-aligned range),
    /// as runs back to back from `offset`: each non-empty, together at most `len` bytes (at
    /// least one run), at most [`MAX_EXTENTS`]. The default, always true: all data.
    fn block_status(&self, _offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        Ok(vec![Extent {
            len,
            hole: false,
            zero: false,
        }])
    }
    /// The range will be read soon: the device may fetch it ahead (a hint; the default
    /// does nothing; devices on files start the kernel's readahead of it).
    fn cache(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// The device's data path split in two, for frontends that do the storage I/O
    /// themselves (io_uring) and keep the transform inline; `None` if it cannot be split.
    fn split_io(&self) -> Option<&dyn SplitIo> {
        None
    }
}

/// A device whose bytes live at known offsets of one file descriptor, transformed in memory
/// (encrypted volumes on a file or block device). Requests must be whole blocks.
///
/// Writing `buf` at `offset` = `seal(offset, buf)`, then writing `buf` to `fd()` at
/// `map(offset, len, true)`. Reading = reading from `fd()` at `map(offset, len, false)`, then
/// `unseal(offset, buf)`. A flush = `fdatasync(fd())` (call `note_flush` for the counters).
pub trait SplitIo: Send + Sync {
    /// The storage's file descriptor; valid as long as the device lives.
    fn fd(&self) -> std::os::fd::RawFd;
    /// Where device bytes `offset..offset + len` are on the storage; checks bounds,
    /// alignment and, for writes, that the device is writable.
    fn map(&self, offset: u64, len: u64, write: bool) -> io::Result<u64>;
    /// Transforms data to be written at `offset` in place (one cipher call).
    fn seal(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Transforms data read from `offset` in place (one cipher call).
    fn unseal(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Counts a flush done through `fd()`.
    fn note_flush(&self) {}
}
