//! One virtio-blk request: its descriptor chain turned into guest memory slices, checked,
//! served on the [`BlockDevice`], and its status written back.
//!
//! A guest is not trusted: descriptors outside guest memory, chains that loop or end
//! without a status byte, headers in writable memory, requests past the end of the
//! device, sector numbers whose byte offset overflows, and requests larger than the
//! advertised limits are refused with `VIRTIO_BLK_S_IOERR` (or, where there is no status
//! byte to write, completed with nothing written), and the backend carries on.

use crate::stats::Stats;
use cryptblk_device::BlockDevice;
use std::io;
use std::sync::atomic::Ordering::Relaxed;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileSlice};

/// virtio-blk request types (virtio 1.2, 5.2.6).
pub(crate) const T_IN: u32 = 0;
pub(crate) const T_OUT: u32 = 1;
pub(crate) const T_FLUSH: u32 = 4;
pub(crate) const T_GET_ID: u32 = 8;
pub(crate) const T_DISCARD: u32 = 11;
pub(crate) const T_WRITE_ZEROES: u32 = 13;
/// Request status values.
pub(crate) const S_OK: u8 = 0;
pub(crate) const S_IOERR: u8 = 1;
pub(crate) const S_UNSUPP: u8 = 2;
/// Length of the `GET_ID` answer.
pub(crate) const ID_BYTES: usize = 20;
/// virtio-blk counts in 512-byte sectors whatever the logical block size.
pub(crate) const SECTOR: u64 = 512;
/// One `virtio_blk_discard_write_zeroes` segment.
const DWZ_SEGMENT: usize = 16;
const DWZ_F_UNMAP: u32 = 1;

type Slice<'a> = VolatileSlice<'a, ()>;

/// A run of guest memory slices, each with whether the device may write it.
struct Segments<'a> {
    parts: Vec<(Slice<'a>, bool)>,
}

impl<'a> Segments<'a> {
    fn len(&self) -> usize {
        self.parts.iter().map(|(s, _)| s.len()).sum()
    }

    fn all(&self, writable: bool) -> bool {
        self.parts.iter().all(|(_, w)| *w == writable)
    }

    /// Takes the first `n` bytes off the front.
    fn split_front(&mut self, mut n: usize) -> Option<Segments<'a>> {
        let mut front = Vec::new();
        while n > 0 {
            let (s, w) = self.parts.first().copied()?;
            if s.len() <= n {
                n -= s.len();
                front.push((s, w));
                self.parts.remove(0);
            } else {
                front.push((s.subslice(0, n).ok()?, w));
                self.parts[0].0 = s.offset(n).ok()?;
                n = 0;
            }
        }
        Some(Segments { parts: front })
    }

    /// Takes the last byte off the back.
    fn split_last_byte(&mut self) -> Option<(Slice<'a>, bool)> {
        let (s, w) = self.parts.pop()?;
        if s.len() > 1 {
            self.parts.push((s.subslice(0, s.len() - 1).ok()?, w));
        }
        Some((s.offset(s.len() - 1).ok()?, w))
    }

    fn copy_out(&self, buf: &mut [u8]) {
        let mut at = 0;
        for (s, _) in &self.parts {
            at += s.copy_to(&mut buf[at..]);
        }
    }

    fn copy_in(&self, buf: &[u8]) {
        let mut at = 0;
        for (s, _) in &self.parts {
            let n = s.len().min(buf.len() - at);
            s.subslice(0, n)
                .expect("within the slice")
                .copy_from(&buf[at..at + n]);
            at += n;
        }
    }

    /// The slices with neighbours that are contiguous in host memory merged (guest pages
    /// that are contiguous in the guest's physical memory are, in one region).
    fn merged(&self) -> Vec<Slice<'a>> {
        let mut out: Vec<Slice<'a>> = Vec::with_capacity(self.parts.len());
        for (s, _) in &self.parts {
            if let Some(last) = out.last_mut() {
                let end = last.ptr_guard().as_ptr() as usize + last.len();
                if end == s.ptr_guard().as_ptr() as usize {
                    // SAFETY: both slices are live mappings of guest memory from the same
                    // `GuestMemoryMmap` borrowed for 'a, and `s` starts where `last` ends, so
                    // the joined range is mapped for 'a as well.
                    *last = unsafe {
                        VolatileSlice::new(last.ptr_guard_mut().as_ptr(), last.len() + s.len())
                    };
                    continue;
                }
            }
            out.push(*s);
        }
        out
    }
}

/// What the backend needs to serve a request.
pub(crate) struct Limits {
    /// Largest data transfer accepted (seg_max * size_max).
    pub(crate) max_bytes: usize,
    /// The `GET_ID` string.
    pub(crate) id: [u8; ID_BYTES],
    /// Writes, discards and write-zeroes refused.
    pub(crate) read_only: bool,
}

/// Serves one descriptor chain; returns the used length (bytes written to the guest).
/// `bounce` is the queue's own buffer for data that cannot be handled in place.
pub(crate) fn serve(
    mem: &GuestMemoryMmap<()>,
    descs: &[Descriptor],
    truncated: bool,
    dev: &dyn BlockDevice,
    limits: &Limits,
    stats: &Stats,
    bounce: &mut Vec<u8>,
) -> u32 {
    let Some(mut segs) = slices(mem, descs) else {
        stats.errors.fetch_add(1, Relaxed);
        return status_in_last(mem, descs, S_IOERR);
    };
    if truncated {
        stats.errors.fetch_add(1, Relaxed);
        return status_in_last(mem, descs, S_IOERR);
    }
    let Some((status, status_writable)) = segs.split_last_byte() else {
        stats.errors.fetch_add(1, Relaxed);
        return 0;
    };
    if !status_writable {
        // Nowhere to say it failed; the request is completed with nothing written.
        stats.errors.fetch_add(1, Relaxed);
        return 0;
    }
    let mut header = [0u8; 16];
    let hdr = match segs.split_front(16) {
        Some(h) if h.all(false) => h,
        _ => {
            stats.errors.fetch_add(1, Relaxed);
            status.copy_from(&[S_IOERR]);
            return 1;
        }
    };
    hdr.copy_out(&mut header);
    let kind = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
    let sector = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    let (result, written) = execute(kind, sector, &segs, dev, limits, stats, bounce);
    let code = match result {
        Ok(()) => S_OK,
        Err(e) if e.kind() == io::ErrorKind::Unsupported => S_UNSUPP,
        Err(_) => {
            stats.errors.fetch_add(1, Relaxed);
            S_IOERR
        }
    };
    status.copy_from(&[code]);
    written as u32 + 1
}

/// The chain's descriptors as guest memory slices; `None` if any lies outside guest memory.
fn slices<'a>(mem: &'a GuestMemoryMmap<()>, descs: &[Descriptor]) -> Option<Segments<'a>> {
    let mut parts = Vec::with_capacity(descs.len());
    for d in descs {
        for s in GuestMemoryBackend::get_slices(mem, d.addr(), d.len() as usize) {
            parts.push((s.ok()?, d.is_write_only()));
        }
    }
    Some(Segments { parts })
}

/// A malformed chain: writes `code` into its last byte if that is guest memory the device
/// may write (where a status byte would be), else completes it with nothing written.
fn status_in_last(mem: &GuestMemoryMmap<()>, descs: &[Descriptor], code: u8) -> u32 {
    let Some(last) = descs.last() else { return 0 };
    if !last.is_write_only() || last.len() == 0 || last.has_next() {
        return 0;
    }
    let at = GuestAddress(last.addr().0.wrapping_add(u64::from(last.len()) - 1));
    match GuestMemoryBackend::get_slice(mem, at, 1) {
        Ok(s) => {
            s.copy_from(&[code]);
            1
        }
        Err(_) => 0,
    }
}

fn ioerr(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.to_string())
}

/// The byte range `sector`, `len` bytes, checked against the device.
fn range(dev: &dyn BlockDevice, sector: u64, len: u64) -> io::Result<u64> {
    let off = sector
        .checked_mul(SECTOR)
        .ok_or_else(|| ioerr("sector out of range"))?;
    let end = off
        .checked_add(len)
        .ok_or_else(|| ioerr("sector out of range"))?;
    if end > dev.size() {
        return Err(ioerr("past the end of the device"));
    }
    // The guest was told the block size (`blk_size`); a request off it is a driver bug,
    // refused even where the device could read-modify-write.
    let bs = u64::from(dev.block_size());
    if !off.is_multiple_of(bs) || !len.is_multiple_of(bs) {
        return Err(ioerr("not aligned to the logical block size"));
    }
    Ok(off)
}

fn execute(
    kind: u32,
    sector: u64,
    data: &Segments<'_>,
    dev: &dyn BlockDevice,
    limits: &Limits,
    stats: &Stats,
    bounce: &mut Vec<u8>,
) -> (io::Result<()>, usize) {
    let len = data.len();
    match kind {
        T_IN => {
            if !data.all(true) || len > limits.max_bytes {
                return (Err(ioerr("bad read request")), 0);
            }
            let r = range(dev, sector, len as u64).and_then(|off| read(data, off, dev, bounce));
            if r.is_ok() {
                stats.reads.fetch_add(1, Relaxed);
                stats.bytes_read.fetch_add(len as u64, Relaxed);
                (r, len)
            } else {
                (r, 0)
            }
        }
        T_OUT => {
            if !data.all(false) || len > limits.max_bytes {
                return (Err(ioerr("bad write request")), 0);
            }
            if limits.read_only {
                return (Err(ioerr("read-only")), 0);
            }
            let r = range(dev, sector, len as u64).and_then(|off| {
                bounce.resize(len, 0);
                data.copy_out(&mut bounce[..len]);
                dev.write_at_mut(&mut bounce[..len], off, false)
            });
            if r.is_ok() {
                stats.writes.fetch_add(1, Relaxed);
                stats.bytes_written.fetch_add(len as u64, Relaxed);
            }
            (r, 0)
        }
        T_FLUSH => {
            stats.flushes.fetch_add(1, Relaxed);
            (dev.flush(), 0)
        }
        T_GET_ID => {
            if !data.all(true) {
                return (Err(ioerr("bad GET_ID request")), 0);
            }
            let n = len.min(ID_BYTES);
            let part = Segments {
                parts: data.parts.clone(),
            };
            part.copy_in(&limits.id[..n]);
            (Ok(()), n)
        }
        T_DISCARD | T_WRITE_ZEROES if limits.read_only => (Err(ioerr("read-only")), 0),
        T_DISCARD | T_WRITE_ZEROES => (zero_or_discard(kind, data, dev, stats), 0),
        _ => (Err(io::Error::from(io::ErrorKind::Unsupported)), 0),
    }
}

/// Reads into guest memory: each merged slice that holds whole blocks is read and
/// decrypted in place; anything else goes through the bounce buffer in one call.
fn read(
    data: &Segments<'_>,
    off: u64,
    dev: &dyn BlockDevice,
    bounce: &mut Vec<u8>,
) -> io::Result<()> {
    let merged = data.merged();
    let bs = dev.block_size() as usize;
    if merged.len() == 1
        || merged
            .iter()
            .all(|s| s.len() % bs == 0 && s.len() >= 64 << 10)
    {
        let mut at = off;
        for s in &merged {
            // SAFETY: `s` is a mapping of guest memory that stays mapped while `mem` is
            // borrowed (the whole request); the guest handed these bytes to the device to
            // fill and must not touch them until the request completes. A guest that does
            // only scrambles its own buffer: nothing of ours lives there.
            let buf =
                unsafe { std::slice::from_raw_parts_mut(s.ptr_guard_mut().as_ptr(), s.len()) };
            dev.read_at(buf, at)?;
            at += s.len() as u64;
        }
        return Ok(());
    }
    let len = data.len();
    bounce.resize(len, 0);
    dev.read_at(&mut bounce[..len], off)?;
    data.copy_in(&bounce[..len]);
    Ok(())
}

fn zero_or_discard(
    kind: u32,
    data: &Segments<'_>,
    dev: &dyn BlockDevice,
    stats: &Stats,
) -> io::Result<()> {
    let len = data.len();
    if !data.all(false)
        || len == 0
        || !len.is_multiple_of(DWZ_SEGMENT)
        || len / DWZ_SEGMENT > crate::MAX_DWZ_SEGMENTS as usize
    {
        return Err(ioerr("bad discard/write-zeroes request"));
    }
    let mut raw = vec![0u8; len];
    data.copy_out(&mut raw);
    for seg in raw.chunks_exact(DWZ_SEGMENT) {
        let sector = u64::from_le_bytes(seg[0..8].try_into().expect("8 bytes"));
        let count = u32::from_le_bytes(seg[8..12].try_into().expect("4 bytes"));
        let flags = u32::from_le_bytes(seg[12..16].try_into().expect("4 bytes"));
        if count > crate::MAX_DWZ_SECTORS {
            return Err(ioerr("discard/write-zeroes segment too large"));
        }
        let bytes = u64::from(count) * SECTOR;
        let off = range(dev, sector, bytes)?;
        if kind == T_DISCARD {
            // Unknown flags in a discard are an error (virtio 1.2, 5.2.6.2).
            if flags != 0 {
                return Err(ioerr("discard with flags"));
            }
            dev.discard(off, bytes)?;
            stats.discards.fetch_add(1, Relaxed);
        } else {
            if flags & !DWZ_F_UNMAP != 0 {
                return Err(ioerr("write-zeroes with unknown flags"));
            }
            dev.write_zeroes(off, bytes, flags & DWZ_F_UNMAP != 0)?;
            stats.write_zeroes.fetch_add(1, Relaxed);
        }
    }
    Ok(())
}
