//! Crash simulation for the storage headers live on (files, block devices and memory are
//! `cryptblk_device::Storage`s).

use std::io;
use std::sync::Mutex;

use cryptblk_device::{MemStorage, Storage};

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

/// A [`Storage`] that simulates power loss during its `crash_at`-th write (1-based),
/// for crash-consistency tests.
///
/// Reads see every write, as a page cache would. Only writes followed by a `sync` are
/// durable. When power fails, writes issued since the last `sync` are dropped (or, with
/// `keep_unsynced`, persisted in order, as a disk that got to write them would; or, with
/// [`CrashDevice::reordering`], every other one, as a disk that wrote its cache out of
/// order would), the interrupted write is torn as [`Tear`] says, and every later call
/// fails with an I/O error, so the operation under test stops there.
/// [`CrashDevice::after_power_loss`] then gives the image a reboot would find.
#[derive(Debug)]
pub struct CrashDevice {
    state: Mutex<CrashState>,
    crash_at: Option<usize>,
    tear: Tear,
    keep_unsynced: bool,
    /// Only every other unsynced write persists, from the first (0) or the second (1)
    /// (see [`CrashDevice::reordering`]).
    reorder: Option<usize>,
}

#[derive(Debug)]
struct CrashState {
    durable: MemStorage,
    view: MemStorage,
    pending: Vec<(u64, Vec<u8>)>,
    writes: usize,
    crashed: bool,
}

impl CrashState {
    fn persist_pending(&mut self) {
        self.persist_pending_every(0, 1);
    }

    /// The unsynced writes persisted: every `step`-th, from the `skip`-th (0-based).
    fn persist_pending_every(&mut self, skip: usize, step: usize) {
        let pending = std::mem::take(&mut self.pending);
        for (off, data) in pending.into_iter().skip(skip).step_by(step) {
            // Memory storage only fails for offsets past usize (checked on entry).
            let _ = self.durable.write_at(&data, off);
        }
    }

    fn alive(&self) -> io::Result<()> {
        if self.crashed {
            Err(io::Error::other("simulated power loss"))
        } else {
            Ok(())
        }
    }
}

impl CrashDevice {
    /// Starts from `base` (taken as durable). `crash_at: None` never crashes (use it to
    /// count the writes of an operation with [`CrashDevice::writes`]).
    pub fn new(base: MemStorage, crash_at: Option<usize>, tear: Tear, keep_unsynced: bool) -> Self {
        CrashDevice {
            state: Mutex::new(CrashState {
                view: base.clone(),
                durable: base,
                pending: Vec::new(),
                writes: 0,
                crashed: false,
            }),
            crash_at,
            tear,
            keep_unsynced,
            reorder: None,
        }
    }

    /// At the power loss, of the writes since the last `sync` only every other one
    /// persists: the first, the third, ... (`second` false) or the second, the fourth,
    /// ... (true); the torn write as [`Tear`] says. A disk that wrote part of its cache,
    /// in its own order: what is written after a `sync` may not count on anything
    /// written since the one before, only on what that `sync` made stable.
    pub fn reordering(mut self, second: bool) -> Self {
        self.reorder = Some(usize::from(second));
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CrashState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes issued so far (including the interrupted one).
    pub fn writes(&self) -> usize {
        self.state().writes
    }

    /// Whether the power failed.
    pub fn crashed(&self) -> bool {
        self.state().crashed
    }

    /// The image after the power comes back: durable writes only (plus the unsynced ones
    /// before the interrupted write with `keep_unsynced`, plus its torn part). Without a
    /// crash, power is lost right now: unsynced writes are dropped.
    pub fn after_power_loss(self) -> MemStorage {
        let mut st = self.state.into_inner().unwrap_or_else(|e| e.into_inner());
        if !st.crashed && self.keep_unsynced {
            st.persist_pending();
        }
        st.durable
    }
}

impl Storage for CrashDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let st = self.state();
        st.alive()?;
        st.view.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut st = self.state();
        st.alive()?;
        usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(buf.len()))
            .ok_or(io::ErrorKind::InvalidInput)?;
        st.writes += 1;
        if self.crash_at == Some(st.writes) {
            st.crashed = true;
            if let Some(skip) = self.reorder {
                st.persist_pending_every(skip, 2);
            } else if self.keep_unsynced {
                st.persist_pending();
            }
            st.pending.clear();
            let sectors = buf.len().div_ceil(512);
            let half = (sectors / 2).max(1) * 512;
            let (lo, hi) = match self.tear {
                Tear::Lost => (0, 0),
                Tear::Prefix => (0, half.min(buf.len())),
                Tear::Suffix => (buf.len().saturating_sub(half), buf.len()),
            };
            if lo < hi {
                st.durable.write_at(&buf[lo..hi], offset + lo as u64)?;
            }
            return st.alive();
        }
        st.view.write_at(buf, offset)?;
        st.pending.push((offset, buf.to_vec()));
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut st = self.state();
        st.alive()?;
        st.persist_pending();
        Ok(())
    }
    fn size(&self) -> io::Result<u64> {
        let st = self.state();
        st.alive()?;
        st.view.size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_device_drops_unsynced_and_tears() {
        let base = MemStorage::new(4096);
        let run = |crash_at, tear, keep| {
            let d = CrashDevice::new(base.clone(), crash_at, tear, keep);
            let r = (|| {
                d.write_at(&[1; 512], 0)?;
                d.sync()?;
                d.write_at(&[2; 512], 512)?;
                d.write_at(&[3; 2048], 1024)?;
                d.sync()
            })();
            (r.is_ok(), d.after_power_loss().to_vec())
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
        let d = CrashDevice::new(base.clone(), Some(1), Tear::Lost, false);
        assert!(d.write_at(&[1], 0).is_err());
        assert!(d.sync().is_err() && d.read_at(&mut [0], 0).is_err());
    }

    #[test]
    fn a_reordering_crash_device_keeps_every_other_unsynced_write() {
        let run = |second| {
            let d = CrashDevice::new(MemStorage::new(4096), Some(6), Tear::Lost, false)
                .reordering(second);
            d.write_at(&[9; 512], 3072).unwrap();
            d.sync().unwrap();
            for (i, v) in [1u8, 2, 3, 4, 5].into_iter().enumerate() {
                let _ = d.write_at(&[v; 512], 512 * i as u64);
            }
            d.after_power_loss().to_vec()
        };
        let img = run(false);
        let at = |i: usize| img[512 * i];
        assert_eq!(
            (img[3072], at(0), at(1), at(2), at(3), at(4)),
            (9, 1, 0, 3, 0, 0)
        );
        let img = run(true);
        let at = |i: usize| img[512 * i];
        // The synced write; of the four unsynced ones the second and the fourth; the fifth
        // (the power failed in it) lost.
        assert_eq!(
            (img[3072], at(0), at(1), at(2), at(3), at(4)),
            (9, 0, 2, 0, 4, 0)
        );
    }
}
