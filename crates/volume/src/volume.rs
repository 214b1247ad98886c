//! `Volume`: plaintext I/O on an encrypted data segment, done inline on the caller's thread.

use crate::storage::{Storage, THREAD_BUFFER_MAX};
use crate::{Error, Result};
use cryptblk_crypto::{CipherSpec, IvOptions, SectorCipher};
use cryptblk_device::{BlockDevice, SplitIo};
use std::cell::RefCell;
use std::io;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How the data segment is laid out and encrypted.
#[derive(Debug, Clone)]
pub struct VolumeParams {
    /// Cipher specification of the data segment, e.g. `aes-xts-plain64`.
    pub cipher: CipherSpec,
    /// Encryption sector size in bytes (512, 1024, 2048 or 4096); also the volume's block
    /// size. The segment length is rounded down to a multiple of it.
    pub sector_size: u32,
    /// dm-crypt IV numbering (`iv_large_sectors`, IV offset).
    pub iv: IvOptions,
    /// Start of the data segment on the storage, in bytes.
    pub data_offset: u64,
    /// Segment length in bytes; `None` = to the end of the storage.
    pub data_length: Option<u64>,
    /// Refuse writes, write-zeroes and discards.
    pub read_only: bool,
    /// dm-crypt's `allow_discards`: pass discards down (reveals which sectors are unused).
    pub allow_discards: bool,
}

/// Counters for `status` and for tests of the data path's shape.
#[derive(Debug, Default)]
pub struct VolumeStats {
    /// Read requests that passed the bounds check (inline and split path).
    pub reads: AtomicU64,
    /// Write requests that passed the checks (inline and split path); a write-zeroes
    /// counts once per piece of up to 1 MiB.
    pub writes: AtomicU64,
    /// Plaintext bytes read.
    pub read_bytes: AtomicU64,
    /// Plaintext bytes written, zeroes from write-zeroes included.
    pub written_bytes: AtomicU64,
    /// Flushes, including those a split-path frontend reports via `note_flush`.
    pub flushes: AtomicU64,
    /// Discards accepted (allowed and in bounds).
    pub discards: AtomicU64,
    /// Calls into the sector cipher (one per request on the aligned path).
    pub crypto_calls: AtomicU64,
    /// Requests served by read-modify-write because they were not sector-aligned.
    pub unaligned: AtomicU64,
}

/// One stretch of a volume with its own key, cipher and place on the storage. A volume
/// has one; a LUKS2 volume in the middle of a reencryption has one per key (the part
/// already reencrypted, the part not yet), and a linear (`cipher_null`) one while it is
/// being encrypted or decrypted.
pub struct DataSegment {
    /// First plaintext byte of the volume it covers.
    pub start: u64,
    /// Bytes it covers: a multiple of the volume's block size.
    pub len: u64,
    /// Where its first byte lies on the storage.
    pub storage_offset: u64,
    /// Its keyed cipher; the IV offset (LUKS2 `iv_tweak`) is part of it.
    pub cipher: SectorCipher,
}

impl std::fmt::Debug for DataSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataSegment")
            .field("start", &self.start)
            .field("len", &self.len)
            .field("storage_offset", &self.storage_offset)
            .field("cipher", &self.cipher.spec().to_string())
            .field("sector_size", &self.cipher.sector_size())
            .finish()
    }
}

/// An unlocked volume. Shared by all frontend threads; each request is encrypted or
/// decrypted on the thread that submits it, all its sectors in one cipher call (one per
/// segment it touches).
pub struct Volume {
    storage: Box<dyn Storage>,
    /// Sorted, contiguous from 0 to `size`; never empty.
    segments: Vec<DataSegment>,
    size: u64,
    sector: u64,
    read_only: bool,
    allow_discards: bool,
    /// Aligned I/O shares it; read-modify-write takes it alone, so a partial-sector write
    /// never interleaves with another write to the same sector.
    rmw: RwLock<()>,
    stats: VolumeStats,
}

thread_local! {
    /// Per-thread scratch for ciphertext of writes that cannot be encrypted in place and
    /// for the boundary sectors of unaligned requests; never above [`THREAD_BUFFER_MAX`]
    /// (larger requests go through it in pieces), so that what a client sends cannot
    /// grow a thread's memory.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` bytes of this thread's scratch (`len` ≤ [`THREAD_BUFFER_MAX`]).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    assert!(len <= THREAD_BUFFER_MAX, "scratch request of {len} bytes");
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < len {
            s.resize(len, 0);
        }
        f(&mut s[..len])
    })
}

fn crypto_io(e: cryptblk_crypto::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

impl Volume {
    /// How the ciphertext storage is reached (for `status`).
    pub fn storage_description(&self) -> String {
        self.storage.describe()
    }

    /// Binds a cipher (already keyed) to storage. Fails if the storage cannot hold the segment.
    pub fn new(
        storage: Box<dyn Storage>,
        cipher: SectorCipher,
        params: &VolumeParams,
    ) -> Result<Self> {
        let sector = params.sector_size as u64;
        let have = storage.size()?;
        let size = match params.data_length {
            Some(len) => {
                let end = params.data_offset.checked_add(len).ok_or(Error::TooSmall {
                    need: u64::MAX,
                    have,
                })?;
                if end > have {
                    return Err(Error::TooSmall { need: end, have });
                }
                len
            }
            None => have.saturating_sub(params.data_offset),
        } / sector
            * sector;
        if size == 0 {
            return Err(Error::TooSmall {
                need: params.data_offset + sector,
                have,
            });
        }
        if !params.data_offset.is_multiple_of(512) {
            return Err(Error::Invalid(format!(
                "data offset {} is not 512-byte aligned",
                params.data_offset
            )));
        }
        let segment = DataSegment {
            start: 0,
            len: size,
            storage_offset: params.data_offset,
            cipher,
        };
        Ok(Volume {
            storage,
            segments: vec![segment],
            size,
            sector,
            read_only: params.read_only,
            allow_discards: params.allow_discards,
            rmw: RwLock::new(()),
            stats: VolumeStats::default(),
        })
    }

    /// A volume of several segments (e.g. a LUKS2 volume in the middle of a reencryption).
    /// They must be sorted, contiguous from byte 0, each a whole number of the largest
    /// sector size among them (the volume's block size), and inside the storage.
    pub fn with_segments(
        storage: Box<dyn Storage>,
        segments: Vec<DataSegment>,
        read_only: bool,
        allow_discards: bool,
    ) -> Result<Self> {
        let sector = segments
            .iter()
            .map(|s| s.cipher.sector_size() as u64)
            .max()
            .ok_or_else(|| Error::Invalid("a volume needs at least one segment".into()))?;
        let have = storage.size()?;
        let mut at = 0u64;
        for (i, s) in segments.iter().enumerate() {
            if s.start != at {
                return Err(Error::Invalid(format!(
                    "segment {i} starts at byte {}, not {at}",
                    s.start
                )));
            }
            if s.len == 0 || !s.len.is_multiple_of(sector) || !s.storage_offset.is_multiple_of(512)
            {
                return Err(Error::Invalid(format!(
                    "segment {i} ({} bytes at storage offset {}) is empty or not aligned to {sector} bytes",
                    s.len, s.storage_offset
                )));
            }
            let end = s.storage_offset.checked_add(s.len).ok_or(Error::TooSmall {
                need: u64::MAX,
                have,
            })?;
            if end > have {
                return Err(Error::TooSmall { need: end, have });
            }
            at += s.len;
        }
        Ok(Volume {
            storage,
            segments,
            size: at,
            sector,
            read_only,
            allow_discards,
            rmw: RwLock::new(()),
            stats: VolumeStats::default(),
        })
    }

    /// The keyed sector cipher of the first segment (its spec, sector size and backend).
    pub fn cipher(&self) -> &SectorCipher {
        &self.segments[0].cipher
    }
    /// The segments, in volume order (one, unless the volume is mid-reencryption).
    pub fn segments(&self) -> &[DataSegment] {
        &self.segments
    }
    /// Start of the (first) data segment on the storage, in bytes.
    pub fn data_offset(&self) -> u64 {
        self.segments[0].storage_offset
    }
    /// Live counters of the data path.
    pub fn stats(&self) -> &VolumeStats {
        &self.stats
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "I/O beyond the end of the volume",
            )),
        }
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.read_only {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "volume is read-only",
            ))
        } else {
            Ok(())
        }
    }

    /// Reads whole sectors starting at sector `sector` of the segment into `buf`.
    pub fn read_sectors(&self, sector: u64, buf: &mut [u8]) -> io::Result<()> {
        let off = self.aligned(sector, buf.len())?;
        self.read_bytes(buf, off)
    }

    /// Writes whole sectors; the plaintext is copied once into per-thread scratch to be
    /// encrypted. Use [`Volume::write_sectors_in_place`] when the buffer may be consumed.
    pub fn write_sectors(&self, sector: u64, buf: &[u8]) -> io::Result<()> {
        let off = self.aligned(sector, buf.len())?;
        self.write_bytes(WriteData::Borrowed(buf), off, false)
    }

    /// Writes whole sectors, encrypting `buf` in place (its contents are ciphertext after).
    pub fn write_sectors_in_place(&self, sector: u64, buf: &mut [u8]) -> io::Result<()> {
        let off = self.aligned(sector, buf.len())?;
        self.write_bytes(WriteData::Consumable(buf), off, false)
    }

    fn aligned(&self, sector: u64, len: usize) -> io::Result<u64> {
        if !(len as u64).is_multiple_of(self.sector) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "length is not a whole number of sectors",
            ));
        }
        let off = sector.checked_mul(self.sector).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "sector number overflows")
        })?;
        self.check(off, len as u64)?;
        Ok(off)
    }

    /// Calls `f(segment, offset in it, piece of buf)` for each segment an aligned range at
    /// volume offset `off` touches, in order.
    fn per_segment(
        &self,
        off: u64,
        buf: &mut [u8],
        mut f: impl FnMut(&DataSegment, u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        if let [only] = self.segments.as_slice() {
            return f(only, off, buf);
        }
        let end = off + buf.len() as u64;
        let first = self.segments.partition_point(|s| s.start + s.len <= off);
        for s in &self.segments[first..] {
            if s.start >= end {
                break;
            }
            let (lo, hi) = (off.max(s.start), end.min(s.start + s.len));
            f(
                s,
                lo - s.start,
                &mut buf[(lo - off) as usize..(hi - off) as usize],
            )?;
        }
        Ok(())
    }

    /// Reads and decrypts an aligned range (volume byte offset).
    fn read_raw(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.per_segment(off, buf, |seg, rel, piece| {
            self.storage.read_at(piece, seg.storage_offset + rel)?;
            self.stats.crypto_calls.fetch_add(1, Relaxed);
            let sector = rel / seg.cipher.sector_size() as u64;
            seg.cipher.decrypt(sector, piece).map_err(crypto_io)
        })
    }

    /// Encrypts `buf` in place and writes it at an aligned volume offset.
    fn write_raw(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.per_segment(off, buf, |seg, rel, piece| {
            self.stats.crypto_calls.fetch_add(1, Relaxed);
            let sector = rel / seg.cipher.sector_size() as u64;
            seg.cipher.encrypt(sector, piece).map_err(crypto_io)?;
            self.storage.write_at(piece, seg.storage_offset + rel)
        })
    }

    fn is_aligned(&self, offset: u64, len: u64) -> bool {
        offset.is_multiple_of(self.sector) && len.is_multiple_of(self.sector)
    }

    /// Byte-granular read: aligned requests decrypt straight into `buf`.
    fn read_bytes(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.read_bytes.fetch_add(buf.len() as u64, Relaxed);
        if buf.is_empty() {
            return Ok(());
        }
        let _shared = self.rmw.read().unwrap_or_else(|e| e.into_inner());
        if self.is_aligned(offset, buf.len() as u64) {
            return self.read_raw(offset, buf);
        }
        self.stats.unaligned.fetch_add(1, Relaxed);
        // The whole sectors inside the range straight into `buf`; the partial ones at
        // either end through one sector of scratch.
        let r = self.split_unaligned(offset, buf.len() as u64);
        if let Some(head) = r.head {
            self.read_partial(head, offset, buf)?;
        }
        if r.middle.1 > r.middle.0 {
            let (a, b) = r.middle;
            self.read_raw(a, &mut buf[(a - offset) as usize..(b - offset) as usize])?;
        }
        if let Some(tail) = r.tail {
            self.read_partial(tail, offset, buf)?;
        }
        Ok(())
    }

    /// Reads the sector at `sector_start` and copies the part of it inside the request
    /// (`buf` at `offset`) out.
    fn read_partial(&self, sector_start: u64, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        let (lo, hi) = (
            sector_start.max(offset),
            (sector_start + self.sector).min(end),
        );
        with_scratch(self.sector as usize, |s| {
            self.read_raw(sector_start, s)?;
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&s[(lo - sector_start) as usize..(hi - sector_start) as usize]);
            Ok(())
        })
    }

    /// Read-modify-write of the sector at `sector_start` with the request's bytes in it.
    fn write_partial(
        &self,
        sector_start: u64,
        offset: u64,
        data: &WriteData<'_>,
    ) -> io::Result<()> {
        let end = offset + data.len() as u64;
        let (lo, hi) = (
            sector_start.max(offset),
            (sector_start + self.sector).min(end),
        );
        with_scratch(self.sector as usize, |s| {
            self.read_raw(sector_start, s)?;
            let dst = &mut s[(lo - sector_start) as usize..(hi - sector_start) as usize];
            let src = (lo - offset) as usize..(hi - offset) as usize;
            match data {
                WriteData::Borrowed(b) => dst.copy_from_slice(&b[src]),
                WriteData::Consumable(b) => dst.copy_from_slice(&b[src]),
                WriteData::Zeroes(_) => dst.fill(0),
            }
            self.write_raw(sector_start, s)
        })
    }

    /// Writes an aligned range: in place when the caller's buffer may be consumed, else
    /// through scratch, [`THREAD_BUFFER_MAX`] bytes at a time.
    fn write_aligned(&self, off: u64, data: WriteData<'_>) -> io::Result<()> {
        let chunks = |fill: &dyn Fn(&mut [u8], usize)| -> io::Result<()> {
            let len = data.len();
            let mut at = 0;
            while at < len {
                let n = (len - at).min(THREAD_BUFFER_MAX);
                with_scratch(n, |s| {
                    fill(s, at);
                    self.write_raw(off + at as u64, s)
                })?;
                at += n;
            }
            Ok(())
        };
        match data {
            WriteData::Consumable(b) => self.write_raw(off, b),
            WriteData::Borrowed(b) => chunks(&|s, at| s.copy_from_slice(&b[at..at + s.len()])),
            WriteData::Zeroes(_) => chunks(&|s, _| s.fill(0)),
        }
    }

    /// The sectors an unaligned request touches: a partial first sector, the whole ones,
    /// a partial last one (absent when the first one covers the request's end).
    fn split_unaligned(&self, offset: u64, len: u64) -> Unaligned {
        let ss = self.sector;
        let end = offset + len;
        let first = offset / ss * ss;
        let middle_start = offset.div_ceil(ss) * ss;
        let middle_end = (end / ss * ss).max(middle_start);
        let head = (first != offset).then_some(first);
        let last = end / ss * ss;
        let tail = (last != end && last >= middle_start).then_some(last);
        Unaligned {
            head,
            middle: (middle_start, middle_end),
            tail,
        }
    }

    /// Byte-granular write. Aligned: one copy into scratch (or none, in place) and one
    /// cipher call. Unaligned: read-modify-write of the boundary sectors, exclusively.
    fn write_bytes(&self, data: WriteData<'_>, offset: u64, fua: bool) -> io::Result<()> {
        let len = data.len() as u64;
        self.check_writable()?;
        self.check(offset, len)?;
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats.written_bytes.fetch_add(len, Relaxed);
        if len == 0 {
            return Ok(());
        }
        if self.is_aligned(offset, len) {
            let _shared = self.rmw.read().unwrap_or_else(|e| e.into_inner());
            self.write_aligned(offset, data)?;
        } else {
            self.stats.unaligned.fetch_add(1, Relaxed);
            // Exclusive: no other write may touch the boundary sectors between our read
            // and our write of them.
            let _excl = self.rmw.write().unwrap_or_else(|e| e.into_inner());
            let r = self.split_unaligned(offset, len);
            if let Some(head) = r.head {
                self.write_partial(head, offset, &data)?;
            }
            if let Some(tail) = r.tail {
                self.write_partial(tail, offset, &data)?;
            }
            let (a, b) = r.middle;
            if b > a {
                let (from, to) = ((a - offset) as usize, (b - offset) as usize);
                let middle = match data {
                    WriteData::Borrowed(d) => WriteData::Borrowed(&d[from..to]),
                    WriteData::Consumable(d) => WriteData::Consumable(&mut d[from..to]),
                    WriteData::Zeroes(_) => WriteData::Zeroes(to - from),
                };
                self.write_aligned(a, middle)?;
            }
        }
        if fua { self.storage.sync() } else { Ok(()) }
    }
}

/// How an unaligned request splits into sectors (segment-relative byte offsets).
struct Unaligned {
    /// Start of the partial first sector.
    head: Option<u64>,
    /// The whole sectors: `[start, end)`, empty when `end <= start`.
    middle: (u64, u64),
    /// Start of the partial last sector, if it is not the first one.
    tail: Option<u64>,
}

/// The three ways bytes to write arrive.
enum WriteData<'a> {
    Borrowed(&'a [u8]),
    /// The caller's buffer may be encrypted in place.
    Consumable(&'a mut [u8]),
    Zeroes(usize),
}

impl WriteData<'_> {
    fn len(&self) -> usize {
        match self {
            WriteData::Borrowed(b) => b.len(),
            WriteData::Consumable(b) => b.len(),
            WriteData::Zeroes(n) => *n,
        }
    }
}

/// Largest write-zeroes piece handled at once (each is then encrypted through scratch,
/// [`THREAD_BUFFER_MAX`] at a time).
const ZERO_CHUNK: u64 = 1 << 20;

impl BlockDevice for Volume {
    fn size(&self) -> u64 {
        self.size
    }
    fn block_size(&self) -> u32 {
        self.sector as u32
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn byte_granular(&self) -> bool {
        true
    }
    fn can_discard(&self) -> bool {
        self.allow_discards && !self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_bytes(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.write_bytes(WriteData::Borrowed(buf), offset, fua)
    }
    fn write_at_mut(&self, buf: &mut [u8], offset: u64, fua: bool) -> io::Result<()> {
        self.write_bytes(WriteData::Consumable(buf), offset, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.stats.flushes.fetch_add(1, Relaxed);
        self.storage.sync()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.can_discard() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "discards are not allowed on this volume",
            ));
        }
        self.check(offset, len)?;
        self.stats.discards.fetch_add(1, Relaxed);
        // Only whole sectors can be released; partial ones are left as they are (a discard
        // is advisory).
        let start = offset.div_ceil(self.sector) * self.sector;
        let end = (offset + len) / self.sector * self.sector;
        for s in &self.segments {
            let (lo, hi) = (start.max(s.start), end.min(s.start + s.len));
            if hi > lo {
                self.storage
                    .punch_hole(s.storage_offset + (lo - s.start), hi - lo)?;
            }
        }
        Ok(())
    }
    /// Only for one segment: the split path maps a request to one storage range and one
    /// cipher.
    fn split_io(&self) -> Option<&dyn SplitIo> {
        if self.segments.len() != 1 {
            return None;
        }
        self.storage.raw_fd().map(|_| self as &dyn SplitIo)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _may_unmap: bool) -> io::Result<()> {
        // A hole would read back as decrypted zero ciphertext, i.e. garbage, so zeroes are
        // always written encrypted.
        self.check_writable()?;
        self.check(offset, len)?;
        let mut done = 0;
        while done < len {
            // Pieces end on ZERO_CHUNK boundaries: only the first and the last can be
            // unaligned (read-modify-write under the exclusive lock), and no piece holds
            // that lock for long.
            let n = (len - done).min(ZERO_CHUNK - (offset + done) % ZERO_CHUNK);
            self.write_bytes(WriteData::Zeroes(n as usize), offset + done, false)?;
            done += n;
        }
        Ok(())
    }
}

/// The split data path (see [`SplitIo`]): the frontend moves the ciphertext, the volume
/// en/decrypts it in the caller's buffer, one cipher call per request, counted as the
/// inline path counts.
impl SplitIo for Volume {
    fn fd(&self) -> std::os::fd::RawFd {
        self.storage
            .raw_fd()
            .expect("split_io is only offered for file storage")
    }
    fn map(&self, offset: u64, len: u64, write: bool) -> io::Result<u64> {
        if write {
            self.check_writable()?;
        }
        self.check(offset, len)?;
        if !self.is_aligned(offset, len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "split I/O must be whole sectors",
            ));
        }
        Ok(self.segments[0].storage_offset + offset)
    }
    fn seal(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.map(offset, buf.len() as u64, true)?;
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats
            .written_bytes
            .fetch_add(buf.len() as u64, Relaxed);
        self.stats.crypto_calls.fetch_add(1, Relaxed);
        self.segments[0]
            .cipher
            .encrypt(offset / self.sector, buf)
            .map_err(crypto_io)
    }
    fn unseal(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.map(offset, buf.len() as u64, false)?;
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.read_bytes.fetch_add(buf.len() as u64, Relaxed);
        self.stats.crypto_calls.fetch_add(1, Relaxed);
        self.segments[0]
            .cipher
            .decrypt(offset / self.sector, buf)
            .map_err(crypto_io)
    }
    fn note_flush(&self) {
        self.stats.flushes.fetch_add(1, Relaxed);
    }
}
