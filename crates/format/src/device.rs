//! Where headers live: a file, a block device, or memory (tests, crash simulation).

use std::io;
use std::os::unix::fs::FileExt;

/// Positioned I/O on the device that holds a LUKS header (the data device, or a detached
/// header file). Reads are exact: a short read is `UnexpectedEof`.
pub trait HeaderDevice {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes everything written so far durable (fdatasync for files).
    fn sync(&mut self) -> io::Result<()>;
    /// Current size in bytes.
    fn size(&mut self) -> io::Result<u64>;
}

impl HeaderDevice for std::fs::File {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_exact_at(buf, offset)
    }
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_all_at(buf, offset)
    }
    fn sync(&mut self) -> io::Result<()> {
        self.sync_data()
    }
    fn size(&mut self) -> io::Result<u64> {
        use std::io::{Seek, SeekFrom};
        // Block devices report 0 in metadata; seeking to the end works for both.
        self.seek(SeekFrom::End(0))
    }
}

/// A header device in memory that grows on write, like a sparse file.
#[derive(Debug, Default, Clone)]
pub struct MemDevice {
    pub data: Vec<u8>,
}

impl MemDevice {
    pub fn new(size: usize) -> Self {
        MemDevice {
            data: vec![0; size],
        }
    }
}

impl HeaderDevice for MemDevice {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let off = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let src = off
            .checked_add(buf.len())
            .and_then(|end| self.data.get(off..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let off = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let end = off + buf.len();
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[off..end].copy_from_slice(buf);
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn size(&mut self) -> io::Result<u64> {
        Ok(self.data.len() as u64)
    }
}
