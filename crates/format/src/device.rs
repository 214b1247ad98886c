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

/// How the write that is cut by a simulated power loss reaches the disk, at 512-byte
/// sector granularity (sectors are assumed atomic, whole writes are not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tear {
    /// Nothing of the interrupted write is persisted.
    Lost,
    /// The first half of its sectors (at least one) is persisted, the rest keeps the old bytes.
    Prefix,
    /// The last half of its sectors (at least one) is persisted, the front keeps the old bytes.
    Suffix,
}

/// A [`HeaderDevice`] that simulates power loss during its `crash_at`-th write (1-based),
/// for crash-consistency tests.
///
/// Reads see every write, as a page cache would. Only writes followed by a `sync` are
/// durable. When power fails, writes issued since the last `sync` are dropped (or, with
/// `keep_unsynced`, persisted in order, as a disk that got to write them would), the
/// interrupted write is torn as [`Tear`] says, and every later call fails with an I/O
/// error, so the operation under test stops there. [`CrashDevice::after_power_loss`] then
/// gives the image a reboot would find.
#[derive(Debug, Clone)]
pub struct CrashDevice {
    durable: MemDevice,
    view: MemDevice,
    pending: Vec<(u64, Vec<u8>)>,
    writes: usize,
    crash_at: Option<usize>,
    tear: Tear,
    keep_unsynced: bool,
    crashed: bool,
}

fn power_lost() -> io::Error {
    io::Error::other("simulated power loss")
}

impl CrashDevice {
    /// Starts from `base` (taken as durable). `crash_at: None` never crashes (use it to
    /// count the writes of an operation with [`CrashDevice::writes`]).
    pub fn new(base: MemDevice, crash_at: Option<usize>, tear: Tear, keep_unsynced: bool) -> Self {
        CrashDevice {
            view: base.clone(),
            durable: base,
            pending: Vec::new(),
            writes: 0,
            crash_at,
            tear,
            keep_unsynced,
            crashed: false,
        }
    }

    /// Writes issued so far (including the interrupted one).
    pub fn writes(&self) -> usize {
        self.writes
    }

    /// Whether the power failed.
    pub fn crashed(&self) -> bool {
        self.crashed
    }

    /// The image after the power comes back: durable writes only (plus the unsynced ones
    /// before the interrupted write with `keep_unsynced`, plus its torn part). Without a
    /// crash, power is lost right now: unsynced writes are dropped.
    pub fn after_power_loss(mut self) -> MemDevice {
        if !self.crashed && self.keep_unsynced {
            self.persist_pending();
        }
        self.durable
    }

    fn persist_pending(&mut self) {
        for (off, data) in std::mem::take(&mut self.pending) {
            // MemDevice writes never fail for offsets that fit usize (checked on entry).
            let _ = self.durable.write_at(&data, off);
        }
    }
}

impl HeaderDevice for CrashDevice {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.crashed {
            return Err(power_lost());
        }
        self.view.read_at(buf, offset)
    }
    fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.crashed {
            return Err(power_lost());
        }
        usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(buf.len()))
            .ok_or(io::ErrorKind::InvalidInput)?;
        self.writes += 1;
        if self.crash_at == Some(self.writes) {
            self.crashed = true;
            if self.keep_unsynced {
                self.persist_pending();
            }
            self.pending.clear();
            let sectors = buf.len().div_ceil(512);
            let half = (sectors / 2).max(1) * 512;
            let (lo, hi) = match self.tear {
                Tear::Lost => (0, 0),
                Tear::Prefix => (0, half.min(buf.len())),
                Tear::Suffix => (buf.len().saturating_sub(half), buf.len()),
            };
            if lo < hi {
                self.durable.write_at(&buf[lo..hi], offset + lo as u64)?;
            }
            return Err(power_lost());
        }
        self.view.write_at(buf, offset)?;
        self.pending.push((offset, buf.to_vec()));
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        if self.crashed {
            return Err(power_lost());
        }
        self.persist_pending();
        Ok(())
    }
    fn size(&mut self) -> io::Result<u64> {
        if self.crashed {
            return Err(power_lost());
        }
        self.view.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_device_drops_unsynced_and_tears() {
        let base = MemDevice::new(4096);
        let run = |crash_at, tear, keep| {
            let mut d = CrashDevice::new(base.clone(), crash_at, tear, keep);
            let r = (|| {
                d.write_at(&[1; 512], 0)?;
                d.sync()?;
                d.write_at(&[2; 512], 512)?;
                d.write_at(&[3; 2048], 1024)?;
                d.sync()
            })();
            (r.is_ok(), d.after_power_loss().data)
        };
        // No crash: everything synced is there.
        let (ok, img) = run(None, Tear::Lost, false);
        assert!(ok);
        assert_eq!((img[0], img[512], img[1024], img[3071]), (1, 2, 3, 3));
        // Crash in write 3: write 2 was not synced and is dropped, or kept.
        let (ok, img) = run(Some(3), Tear::Lost, false);
        assert!(!ok);
        assert_eq!((img[0], img[512], img[1024]), (1, 0, 0));
        let (_, img) = run(Some(3), Tear::Lost, true);
        assert_eq!((img[512], img[1024]), (2, 0));
        // Torn 4-sector write: first two or last two sectors persisted.
        let (_, img) = run(Some(3), Tear::Prefix, false);
        assert_eq!((img[1024], img[2047], img[2048], img[3071]), (3, 3, 0, 0));
        let (_, img) = run(Some(3), Tear::Suffix, false);
        assert_eq!((img[1024], img[2047], img[2048], img[3071]), (0, 0, 3, 3));
        // Everything after the crash fails.
        let mut d = CrashDevice::new(base.clone(), Some(1), Tear::Lost, false);
        assert!(d.write_at(&[1], 0).is_err());
        assert!(d.sync().is_err() && d.read_at(&mut [0], 0).is_err());
    }
}
