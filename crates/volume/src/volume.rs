//! `Volume`: plaintext I/O on an encrypted data segment, done inline on the caller's thread.

use crate::storage::{Storage, THREAD_BUFFER_MAX};
use crate::{Error, Result};
use cryptblk_crypto::{CipherSpec, IvOptions, SectorCipher};
use cryptblk_device::{BlockDevice, Extent, MAX_EXTENTS, SplitIo, storage_extents};
use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

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
    /// Reads that crossed the zone an online reencryption step was rewriting.
    pub hot_zone_reads: AtomicU64,
    /// Writes (and discards) that waited for an online reencryption step to end.
    pub hot_zone_waits: AtomicU64,
    /// Sectors whose integrity tag did not verify (LUKS2 with integrity): each read of
    /// one failed with EIO.
    pub integrity_errors: AtomicU64,
    /// Bytes of the discards accepted.
    pub discarded_bytes: AtomicU64,
    /// Errors, requests in flight and latency per operation (`open --metrics`).
    pub requests: crate::RequestMetrics,
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
    /// dm-zero instead of dm-crypt: reads return zeros, writes and discards are dropped
    /// and the storage under it is never touched (BitLocker's metadata areas); the
    /// cipher only gives the sector size.
    pub zero: bool,
    /// LUKS2 with integrity: authenticated sectors over dm-integrity's layout, whose
    /// superblock is at `storage_offset`; `cipher` then only gives the sector size.
    pub integrity: Option<Arc<crate::Integrity>>,
}

impl std::fmt::Debug for DataSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataSegment")
            .field("start", &self.start)
            .field("len", &self.len)
            .field("storage_offset", &self.storage_offset)
            .field("cipher", &self.cipher.description())
            .field("sector_size", &self.cipher.sector_size())
            .field("zero", &self.zero)
            .field("integrity", &self.integrity)
            .finish()
    }
}

/// An unlocked volume. Shared by all frontend threads; each request is encrypted or
/// decrypted on the thread that submits it, all its sectors in one cipher call (one per
/// segment it touches).
pub struct Volume {
    storage: Box<dyn Storage>,
    /// Aligned I/O shares it; read-modify-write takes it alone, so a partial-sector write
    /// never interleaves with another write to the same sector; a reencryption step takes
    /// it alone for a moment to start or end (no request is then in flight).
    layout: RwLock<Layout>,
    /// Bytes the volume serves; changes only by [`Volume::resize`].
    size: AtomicU64,
    sector: u64,
    read_only: bool,
    allow_discards: bool,
    stats: VolumeStats,
    /// A frontend moves the ciphertext itself ([`SplitIo`]): the layout must stay as it is.
    split_handed_out: AtomicBool,
    summary: Mutex<CipherSummary>,
    /// The dm-integrity device of a LUKS2 volume with integrity (its one segment's): what
    /// a flush commits, without the layout lock. None while suspended (its keys dropped,
    /// its journal emptied); a resume installs the device opened again.
    integrity: RwLock<Option<Arc<crate::Integrity>>>,
    /// Whether the volume has integrity protection (suspended or not).
    integrity_protected: bool,
}

/// The volume's segments and, while a reencryption step runs, its hot zone.
pub(crate) struct Layout {
    /// Sorted, contiguous from 0 to `size`; never empty but while the volume is
    /// suspended (no request gets the lock then).
    pub(crate) segments: Vec<DataSegment>,
    pub(crate) hot: Option<Arc<HotZone>>,
}

/// What `status` shows of the first segment, kept apart from the layout so that it can
/// be read while the volume is suspended (its layout lock held).
#[derive(Debug, Clone)]
pub struct CipherSummary {
    /// Cipher specification, e.g. `aes-xts-plain64`.
    pub spec: String,
    /// Encryption sector size.
    pub sector_size: u32,
    /// The CPU backend doing the work.
    pub backend: &'static str,
    /// Where the first segment starts on the storage, in bytes.
    pub data_offset: u64,
    /// dm-crypt's `iv_offset` of the first segment (plain `--skip`), in 512-byte sectors.
    pub iv_offset: u64,
}

impl CipherSummary {
    fn of(segments: &[DataSegment]) -> Mutex<CipherSummary> {
        let s = &segments[0];
        Mutex::new(CipherSummary {
            spec: match &s.integrity {
                Some(i) => i.description().to_string(),
                None => s.cipher.description(),
            },
            sector_size: s.cipher.sector_size(),
            backend: s.cipher.backend().name(),
            data_offset: s.storage_offset,
            iv_offset: s.cipher.iv_options().offset,
        })
    }
}

/// Bytes of the hot zone stored at once by the rewriter (the unit in which readers see
/// it change key).
pub(crate) const HOT_PIECE: u64 = 1 << 20;

/// A stretch being rewritten under a new key while the volume serves it (one step of an
/// online reencryption). Reads see each piece under the key it is under at that moment.
/// Writes wait: for the pieces they touch to be rewritten (then they go under the new key)
/// where the step's crash recovery keeps such writes, else for the step to end.
pub(crate) struct HotZone {
    /// The zone under its new key.
    seg: DataSegment,
    /// Writes may go to rewritten pieces before the step ends: only where the step's
    /// crash recovery keeps them (`StepRecovery::keeps_rewritten_writes`: checksums leave
    /// blocks that no longer match alone; a journal, a data shift rewrite the whole zone).
    piecewise_writes: bool,
    /// Per [`HOT_PIECE`]: stored under the new key yet? Readers hold it shared while they
    /// read ciphertext; the rewriter holds it alone while it stores a piece.
    converted: RwLock<Vec<bool>>,
    /// `Some(true)` once the step ended, `Some(false)` if it failed; its condition variable
    /// also wakes writers when a piece is rewritten.
    ended: Mutex<Option<bool>>,
    changed: Condvar,
    /// Writers waiting for pieces: the rewriter then takes no pauses.
    waiting: std::sync::atomic::AtomicUsize,
}

impl HotZone {
    fn overlaps(&self, off: u64, len: u64) -> bool {
        off < self.seg.start + self.seg.len && self.seg.start < off + len
    }

    /// The pieces `[off, off+len)` touches, as indexes (the range must overlap the zone).
    fn pieces(&self, off: u64, len: u64) -> std::ops::RangeInclusive<usize> {
        let (zs, ze) = (self.seg.start, self.seg.start + self.seg.len);
        let (lo, hi) = (off.max(zs), (off + len).min(ze));
        ((lo - zs) / HOT_PIECE) as usize..=((hi - 1 - zs) / HOT_PIECE) as usize
    }

    /// Whether a write to `[off, off+len)` may go ahead now (under the new key inside).
    fn writable(&self, off: u64, len: u64) -> bool {
        self.piecewise_writes && {
            let conv = self.converted.read().unwrap_or_else(|e| e.into_inner());
            conv[self.pieces(off, len)].iter().all(|&c| c)
        }
    }

    /// Blocks until a write to `[off, off+len)` may go ahead, or the step ended; an error
    /// if it failed.
    fn wait_writable(&self, off: u64, len: u64) -> io::Result<()> {
        let mut e = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        self.waiting.fetch_add(1, Relaxed);
        // A rewriter pausing for the clients' sake goes on at once.
        self.changed.notify_all();
        while e.is_none() && !self.writable(off, len) {
            e = self.changed.wait(e).unwrap_or_else(|e| e.into_inner());
        }
        self.waiting.fetch_sub(1, Relaxed);
        if *e == Some(false) {
            return Err(io::Error::other(
                "a reencryption step over this range failed: close the volume; opening it \
                 again recovers the step",
            ));
        }
        Ok(())
    }

    /// Sleeps up to `d` to leave the CPU to clients, less if a writer starts waiting for
    /// the zone (none waits for this one).
    pub(crate) fn pause(&self, d: std::time::Duration) {
        let e = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        if self.waiting.load(Relaxed) == 0 {
            let _ = self
                .changed
                .wait_timeout_while(e, d, |_| self.waiting.load(Relaxed) == 0);
        }
    }

    /// A piece was stored, or the step ended (`Some(ok)`): wakes the waiting writers.
    fn changed(&self, ended: Option<bool>) {
        let mut e = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        if ended.is_some() {
            *e = ended;
        }
        self.changed.notify_all();
    }
}

/// The layout locked shared or alone.
enum LayoutGuard<'a> {
    Shared(RwLockReadGuard<'a, Layout>),
    Alone(RwLockWriteGuard<'a, Layout>),
}

impl std::ops::Deref for LayoutGuard<'_> {
    type Target = Layout;
    fn deref(&self) -> &Layout {
        match self {
            LayoutGuard::Shared(g) => g,
            LayoutGuard::Alone(g) => g,
        }
    }
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

    /// Flushes, then lets the storage go ([`Storage::close`]) even if the flush failed:
    /// the last call on a volume put away while other threads still hold it (a server
    /// about to exit). The first error is returned. On storage that holds something
    /// elsewhere (an RBD image, an NBD export), requests after it fail.
    pub fn close(&self) -> io::Result<()> {
        let flushed = match self.integrity() {
            Some(i) => {
                self.stats.flushes.fetch_add(1, Relaxed);
                i.close(&*self.storage)
            }
            None => BlockDevice::flush(self),
        };
        let closed = self.storage.close();
        flushed.and(closed)
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
        let segments = vec![DataSegment {
            start: 0,
            len: size,
            storage_offset: params.data_offset,
            cipher,
            zero: false,
            integrity: None,
        }];
        Ok(Volume {
            storage,
            summary: CipherSummary::of(&segments),
            layout: RwLock::new(Layout {
                segments,
                hot: None,
            }),
            size: size.into(),
            sector,
            read_only: params.read_only,
            allow_discards: params.allow_discards,
            stats: VolumeStats::default(),
            split_handed_out: AtomicBool::new(false),
            integrity: RwLock::new(None),
            integrity_protected: false,
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
        let (size, sector) = check_segments(&segments, storage.size()?)?;
        let integrity = segments.iter().find_map(|s| s.integrity.clone());
        Ok(Volume {
            storage,
            summary: CipherSummary::of(&segments),
            layout: RwLock::new(Layout {
                segments,
                hot: None,
            }),
            size: size.into(),
            sector,
            read_only,
            allow_discards,
            stats: VolumeStats::default(),
            split_handed_out: AtomicBool::new(false),
            integrity_protected: integrity.is_some(),
            integrity: RwLock::new(integrity),
        })
    }

    /// Calls `f` with the keyed sector cipher of the first segment (its spec, sector size
    /// and backend).
    pub fn with_cipher<R>(&self, f: impl FnOnce(&SectorCipher) -> R) -> R {
        f(&self.layout().segments[0].cipher)
    }
    /// Where the segments lie: `(start, len)` in volume bytes, in order (one, unless the
    /// volume is mid-reencryption).
    pub fn segment_spans(&self) -> Vec<(u64, u64)> {
        self.layout()
            .segments
            .iter()
            .map(|s| (s.start, s.len))
            .collect()
    }
    /// Start of the (first) data segment on the storage, in bytes.
    pub fn data_offset(&self) -> u64 {
        self.layout().segments[0].storage_offset
    }

    /// Bytes of the storage the volume lives on (data device, header included).
    pub fn storage_size(&self) -> io::Result<u64> {
        self.storage.size()
    }

    /// The checks of a split-path request (bounds, whole sectors, writable), without
    /// taking the layout lock: `seal`/`unseal` take it once, for the cipher.
    fn check_split(&self, offset: u64, len: u64, write: bool) -> io::Result<()> {
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
        Ok(())
    }

    /// The ciphertext storage, for the reencryption that rewrites it.
    pub(crate) fn storage(&self) -> &dyn Storage {
        &*self.storage
    }

    /// Whether the layout may change while the volume serves: not read-only, and no
    /// frontend moves the ciphertext itself.
    pub(crate) fn check_layout_changeable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::Invalid("the volume is open read-only".into()));
        }
        if self.split_handed_out.load(Relaxed) {
            return Err(Error::Invalid(
                "the frontend moves the ciphertext itself (ublk with --io-engine io_uring); \
                 reencrypt with the volume closed, or serve it with --io-engine psync"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Starts a reencryption step over `seg`'s range (`seg` under its new key): waits for
    /// the requests in flight, then closes the range to writes until
    /// [`Volume::set_layout`] (reads go on, each piece under the key it is under).
    pub(crate) fn begin_hot_zone(
        &self,
        seg: DataSegment,
        piecewise_writes: bool,
    ) -> Result<Arc<HotZone>> {
        self.check_layout_changeable()?;
        let ss = seg.cipher.sector_size() as u64;
        if ss > self.sector || !seg.start.is_multiple_of(self.sector) || seg.len == 0 {
            return Err(Error::Invalid(format!(
                "a rewritten stretch of {} bytes at {} with {ss}-byte sectors does not fit a \
                 volume of {}-byte blocks",
                seg.len, seg.start, self.sector
            )));
        }
        if seg.start + seg.len > self.size() {
            return Err(Error::Invalid(
                "the rewritten stretch ends past the volume".into(),
            ));
        }
        let mut l = self.layout_alone();
        if l.hot.is_some() {
            return Err(Error::Invalid(
                "a reencryption step is already running".into(),
            ));
        }
        let pieces = seg.len.div_ceil(HOT_PIECE) as usize;
        let h = Arc::new(HotZone {
            seg,
            piecewise_writes,
            converted: RwLock::new(vec![false; pieces]),
            ended: Mutex::new(None),
            changed: Condvar::new(),
            waiting: Default::default(),
        });
        l.hot = Some(h.clone());
        Ok(h)
    }

    /// Stores a piece of the hot zone rewritten under the new key: `buf` is its
    /// ciphertext, for volume byte `pos` (a whole [`HOT_PIECE`] from the zone's start, or
    /// its last piece).
    pub(crate) fn store_rewritten(&self, h: &HotZone, pos: u64, buf: &[u8]) -> io::Result<()> {
        let rel = pos.wrapping_sub(h.seg.start);
        let len = buf.len() as u64;
        if rel >= h.seg.len
            || !rel.is_multiple_of(HOT_PIECE)
            || (len != HOT_PIECE && rel + len != h.seg.len)
            || rel + len > h.seg.len
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a rewritten piece that is not one of the hot zone's",
            ));
        }
        {
            let mut conv = h.converted.write().unwrap_or_else(|e| e.into_inner());
            self.storage.write_at(buf, h.seg.storage_offset + rel)?;
            conv[(rel / HOT_PIECE) as usize] = true;
        }
        h.changed(None);
        Ok(())
    }

    /// The volume reads and writes through `segments` from now on (the same size, blocks
    /// no larger); a hot zone ends and the writes waiting for it go on.
    pub(crate) fn set_layout(&self, segments: Vec<DataSegment>) -> Result<()> {
        self.check_layout(&segments)?;
        let mut l = self.layout_alone();
        self.install(&mut l, segments);
        let hot = l.hot.take();
        drop(l);
        if let Some(h) = hot {
            h.changed(Some(true));
        }
        Ok(())
    }

    /// Checks that `segments` can replace the layout: the same size, blocks no larger.
    pub(crate) fn check_layout(&self, segments: &[DataSegment]) -> Result<()> {
        let (size, sector) = check_segments(segments, self.storage.size()?)?;
        if size != self.size() || !self.sector.is_multiple_of(sector) {
            return Err(Error::Invalid(format!(
                "a layout of {size} bytes in {sector}-byte blocks for a volume of {} bytes \
                 in {}-byte blocks",
                self.size(),
                self.sector
            )));
        }
        Ok(())
    }

    /// Puts checked `segments` in the locked layout.
    pub(crate) fn install(&self, l: &mut Layout, segments: Vec<DataSegment>) {
        *self.summary.lock().unwrap_or_else(|e| e.into_inner()) = CipherSummary::of(&segments)
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        self.set_integrity(segments.iter().find_map(|s| s.integrity.clone()));
        l.segments = segments;
    }

    /// The first segment's cipher and place, for `status` (readable while suspended).
    pub fn cipher_summary(&self) -> CipherSummary {
        self.summary
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A reencryption step failed: reads go on as they were; writes to its range fail
    /// from now on (reopening the volume recovers the step).
    pub(crate) fn fail_hot_zone(&self) {
        if let Some(h) = self.layout().hot.clone() {
            h.changed(Some(false));
        }
    }

    fn layout(&self) -> RwLockReadGuard<'_, Layout> {
        self.layout.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn layout_alone(&self) -> RwLockWriteGuard<'_, Layout> {
        self.layout.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The layout, locked shared (or `alone`) with no hot zone over `[off, off+len)`: a
    /// write there waits until the reencryption step rewriting it ends.
    fn layout_for_write(&self, off: u64, len: u64, alone: bool) -> io::Result<LayoutGuard<'_>> {
        loop {
            let g = if alone {
                LayoutGuard::Alone(self.layout_alone())
            } else {
                LayoutGuard::Shared(self.layout())
            };
            match g.hot.as_ref().filter(|h| h.overlaps(off, len)) {
                None => return Ok(g),
                Some(h) if h.writable(off, len) => return Ok(g),
                Some(h) => {
                    let h = h.clone();
                    drop(g);
                    self.stats.hot_zone_waits.fetch_add(1, Relaxed);
                    h.wait_writable(off, len)?;
                }
            }
        }
    }
    /// Changes the size of the volume (`resize`, as cryptsetup resizes an active device):
    /// to `new` bytes, or without it to what the storage now holds after the data offset
    /// (a file or device that grew). The one data segment is changed under the layout
    /// lock taken alone, so no request is in flight. Refused mid-reencryption, while
    /// suspended, and once a frontend moves ciphertext itself (the split path).
    ///
    /// Over dm-integrity (LUKS2 with integrity, standalone volumes), where cryptsetup
    /// refuses: shrinking only lowers the size served, as the kernel's shorter table does
    /// (the superblock keeps what it provides); growing past what it provides grows the
    /// dm-integrity device first, to all the storage holds, as the kernel's resume does
    /// ([`crate::Integrity::grow`]: the new blocks sealed as zeros while I/O goes on, then
    /// the superblock), so the kernel opens it at that size too.
    pub fn resize(&self, new: Option<u64>) -> Result<u64> {
        if self.split_handed_out.load(Relaxed) {
            return Err(Error::Invalid(
                "the frontend moves ciphertext itself (io_uring split path): close and \
                 reopen to change the size"
                    .into(),
            ));
        }
        let refused = |new: u64, max: u64| {
            Error::Invalid(format!(
                "cannot resize to {new} bytes: a multiple of the {}-byte sector size, at most \
                 the {max} bytes the device holds after the data offset",
                self.sector
            ))
        };
        let fits = |new: u64, max: u64| new > 0 && new <= max && new.is_multiple_of(self.sector);
        // Over dm-integrity, the size its superblock provides: grown first, while I/O goes
        // on (the new blocks sealed as zeros, then the superblock), where more is asked
        // for, or all the storage now holds; a size it cannot reach changes nothing.
        if let Some(i) = self.integrity() {
            let most = i.growable_bytes(&*self.storage)?;
            let want = new.unwrap_or(most);
            if !fits(want, most) {
                return Err(refused(want, most));
            }
            if want > i.provided_bytes() {
                i.grow(&*self.storage)?;
            }
        }
        let have = self.storage.refresh_size()?;
        let mut l = self.layout_alone();
        if l.segments.is_empty() {
            return Err(Error::Invalid("the volume is suspended".into()));
        }
        if l.hot.is_some() || l.segments.len() != 1 {
            return Err(Error::Invalid(
                "a reencryption is in progress: resize after it".into(),
            ));
        }
        let seg = &mut l.segments[0];
        let max = match &seg.integrity {
            Some(i) => i.provided_bytes(),
            None => {
                let max = have.saturating_sub(seg.storage_offset);
                max - max % self.sector
            }
        };
        let new = new.unwrap_or(max);
        if !fits(new, max) {
            return Err(refused(new, max));
        }
        seg.len = new;
        self.size.store(new, Relaxed);
        Ok(new)
    }

    /// Whether the volume is LUKS2 with integrity (authenticated sectors over dm-integrity).
    pub fn integrity_protected(&self) -> bool {
        self.integrity_protected
    }

    /// The dm-integrity device now serving (none while suspended).
    pub(crate) fn integrity(&self) -> Option<Arc<crate::Integrity>> {
        self.integrity
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Installs (a resume) or drops (a suspend) the dm-integrity device flushes commit.
    pub(crate) fn set_integrity(&self, i: Option<Arc<crate::Integrity>>) {
        *self.integrity.write().unwrap_or_else(|e| e.into_inner()) = i;
    }

    /// Live counters of the data path.
    pub fn stats(&self) -> &VolumeStats {
        &self.stats
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
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
        segments: &[DataSegment],
        off: u64,
        buf: &mut [u8],
        mut f: impl FnMut(&DataSegment, u64, &mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        if let [only] = segments {
            // Checked again under the layout lock: a `resize` may have shrunk the volume
            // since the request was checked.
            if off + buf.len() as u64 > only.len {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "I/O beyond the end of the volume",
                ));
            }
            return f(only, off, buf);
        }
        let end = off + buf.len() as u64;
        let first = segments.partition_point(|s| s.start + s.len <= off);
        for s in &segments[first..] {
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

    /// Decrypts `piece`, the ciphertext at byte `rel` of `seg`.
    fn decrypt(&self, seg: &DataSegment, rel: u64, piece: &mut [u8]) -> io::Result<()> {
        if seg.zero {
            piece.fill(0);
            return Ok(());
        }
        self.stats.crypto_calls.fetch_add(1, Relaxed);
        let sector = rel / seg.cipher.sector_size() as u64;
        seg.cipher.decrypt(sector, piece).map_err(crypto_io)
    }

    /// Reads and decrypts an aligned range (volume byte offset).
    fn read_raw(&self, l: &Layout, off: u64, buf: &mut [u8]) -> io::Result<()> {
        if let Some(h) = l.hot.as_ref().filter(|h| h.overlaps(off, buf.len() as u64)) {
            return self.read_across_hot(l, h, off, buf);
        }
        Self::per_segment(&l.segments, off, buf, |seg, rel, piece| {
            self.load(seg, rel, piece)
        })
    }

    /// Reads and decrypts `piece` at byte `rel` of `seg` (zeros for a zero segment).
    fn load(&self, seg: &DataSegment, rel: u64, piece: &mut [u8]) -> io::Result<()> {
        if seg.zero {
            piece.fill(0);
            return Ok(());
        }
        if let Some(i) = &seg.integrity {
            self.stats.crypto_calls.fetch_add(1, Relaxed);
            return i.read(&*self.storage, rel, piece).inspect_err(|_| {
                self.stats.integrity_errors.store(i.failures(), Relaxed);
            });
        }
        // Decrypted straight out of the page cache where the storage lends its bytes (the
        // mmap engine): one pass over memory instead of a copy and then the cipher.
        let at = seg.storage_offset + rel;
        let sector = rel / seg.cipher.sector_size() as u64;
        let mut decrypted = Ok(());
        let lent = self.storage.read_in_place(piece.len(), at, &mut |src| {
            decrypted = seg.cipher.decrypt_from(sector, src, piece);
        });
        if let Some(clean) = lent {
            self.stats.crypto_calls.fetch_add(1, Relaxed);
            decrypted.map_err(crypto_io)?;
            if clean {
                return Ok(());
            }
        }
        self.storage.read_at(piece, at)?;
        self.decrypt(seg, rel, piece)
    }

    /// A read touching the hot zone: outside it as usual; inside, the ciphertext is read
    /// while no piece is being stored, and each piece decrypted under the key it was under
    /// then (the new one once rewritten, else the layout's).
    fn read_across_hot(&self, l: &Layout, h: &HotZone, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.stats.hot_zone_reads.fetch_add(1, Relaxed);
        let zs = h.seg.start;
        let (lo, hi, inside) = split_at_zone(h, off, buf, |at, b| {
            Self::per_segment(&l.segments, at, b, |seg, rel, piece| {
                self.load(seg, rel, piece)
            })
        })?;
        // Each piece's ciphertext from where it is now: a rewritten piece from the zone's
        // new place, the others from the layout's (another place when the job moves the
        // data); read while no piece is being stored.
        let first = (lo - zs) / HOT_PIECE;
        let done: Vec<bool> = {
            let conv = h.converted.read().unwrap_or_else(|e| e.into_inner());
            for_each_piece(lo, hi, zs, inside, |piece, at, part| {
                if conv[piece as usize] {
                    self.storage.read_at(part, h.seg.storage_offset + (at - zs))
                } else {
                    Self::per_segment(&l.segments, at, part, |seg, rel, p| {
                        self.storage.read_at(p, seg.storage_offset + rel)
                    })
                }
            })?;
            conv[first as usize..=((hi - 1 - zs) / HOT_PIECE) as usize].to_vec()
        };
        for_each_piece(lo, hi, zs, inside, |piece, at, part| {
            if done[(piece - first) as usize] {
                self.decrypt(&h.seg, at - zs, part)
            } else {
                Self::per_segment(&l.segments, at, part, |seg, rel, p| {
                    self.decrypt(seg, rel, p)
                })
            }
        })
    }

    /// Encrypts `piece` for byte `rel` of `seg` and stores it; `piece` is scratch
    /// afterwards (ciphertext, or still plaintext when it was encrypted into a mapping).
    fn encrypt_store(&self, seg: &DataSegment, rel: u64, piece: &mut [u8]) -> io::Result<()> {
        if seg.zero {
            // dm-zero drops writes: the metadata under it stays as it is.
            return Ok(());
        }
        if let Some(i) = &seg.integrity {
            self.stats.crypto_calls.fetch_add(1, Relaxed);
            return i.write(&*self.storage, rel, piece);
        }
        self.stats.crypto_calls.fetch_add(1, Relaxed);
        let sector = rel / seg.cipher.sector_size() as u64;
        let at = seg.storage_offset + rel;
        // Encrypted straight into the page cache where the storage lends its bytes (the
        // mmap engine): one pass over memory instead of the cipher and then a copy.
        // Only where the cipher writes nothing but ciphertext there: never plaintext in
        // the page cache, not even for a moment.
        let mut encrypted = Ok(());
        let lent = if seg.cipher.transforms_in_one_pass() {
            self.storage.write_in_place(piece.len(), at, &mut |dst| {
                encrypted = seg.cipher.encrypt_from(sector, piece, dst);
            })
        } else {
            None
        };
        if let Some(clean) = lent {
            encrypted.map_err(crypto_io)?;
            if clean {
                return Ok(());
            }
        }
        seg.cipher.encrypt(sector, piece).map_err(crypto_io)?;
        self.storage.write_at(piece, at)
    }

    /// Encrypts `buf` in place and writes it at an aligned volume offset. Inside a hot zone
    /// only rewritten pieces are written ([`Volume::layout_for_write`] sees to that), under
    /// the new key.
    fn write_raw(&self, l: &Layout, off: u64, buf: &mut [u8]) -> io::Result<()> {
        let outside = |at: u64, b: &mut [u8]| {
            Self::per_segment(&l.segments, at, b, |seg, rel, piece| {
                self.encrypt_store(seg, rel, piece)
            })
        };
        match l.hot.as_ref().filter(|h| h.overlaps(off, buf.len() as u64)) {
            None => outside(off, buf),
            Some(h) => {
                let (lo, _, inside) = split_at_zone(h, off, buf, outside)?;
                self.encrypt_store(&h.seg, lo - h.seg.start, inside)
            }
        }
    }

    fn is_aligned(&self, offset: u64, len: u64) -> bool {
        offset.is_multiple_of(self.sector) && len.is_multiple_of(self.sector)
    }

    /// A discard (see `BlockDevice::discard`), timed by the caller.
    fn discard_timed(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.can_discard() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "discards are not allowed on this volume",
            ));
        }
        self.check(offset, len)?;
        self.stats.discards.fetch_add(1, Relaxed);
        self.stats.discarded_bytes.fetch_add(len, Relaxed);
        // Only whole sectors can be released; partial ones are left as they are (a discard
        // is advisory).
        let start = offset.div_ceil(self.sector) * self.sector;
        let end = (offset + len) / self.sector * self.sector;
        let l = self.layout_for_write(offset, len, false)?;
        for s in &l.segments {
            let (lo, hi) = (start.max(s.start), end.min(s.start + s.len));
            if hi > lo && !s.zero {
                self.storage
                    .punch_hole(s.storage_offset + (lo - s.start), hi - lo)?;
            }
        }
        Ok(())
    }

    /// Byte-granular read: aligned requests decrypt straight into `buf`.
    fn read_bytes(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.stats
            .requests
            .measure(crate::Op::Read, || self.read_bytes_timed(buf, offset))
    }

    fn read_bytes_timed(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.read_bytes.fetch_add(buf.len() as u64, Relaxed);
        if buf.is_empty() {
            return Ok(());
        }
        let l = self.layout();
        if self.is_aligned(offset, buf.len() as u64) {
            return self.read_raw(&l, offset, buf);
        }
        self.stats.unaligned.fetch_add(1, Relaxed);
        // The whole sectors inside the range straight into `buf`; the partial ones at
        // either end through one sector of scratch.
        let r = self.split_unaligned(offset, buf.len() as u64);
        if let Some(head) = r.head {
            self.read_partial(&l, head, offset, buf)?;
        }
        if r.middle.1 > r.middle.0 {
            let (a, b) = r.middle;
            self.read_raw(
                &l,
                a,
                &mut buf[(a - offset) as usize..(b - offset) as usize],
            )?;
        }
        if let Some(tail) = r.tail {
            self.read_partial(&l, tail, offset, buf)?;
        }
        Ok(())
    }

    /// Reads the sector at `sector_start` and copies the part of it inside the request
    /// (`buf` at `offset`) out.
    fn read_partial(
        &self,
        l: &Layout,
        sector_start: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        let (lo, hi) = (
            sector_start.max(offset),
            (sector_start + self.sector).min(end),
        );
        with_scratch(self.sector as usize, |s| {
            self.read_raw(l, sector_start, s)?;
            buf[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&s[(lo - sector_start) as usize..(hi - sector_start) as usize]);
            Ok(())
        })
    }

    /// Read-modify-write of the sector at `sector_start` with the request's bytes in it.
    fn write_partial(
        &self,
        l: &Layout,
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
            self.read_raw(l, sector_start, s)?;
            let dst = &mut s[(lo - sector_start) as usize..(hi - sector_start) as usize];
            let src = (lo - offset) as usize..(hi - offset) as usize;
            match data {
                WriteData::Borrowed(b) => dst.copy_from_slice(&b[src]),
                WriteData::Consumable(b) => dst.copy_from_slice(&b[src]),
                WriteData::Zeroes(_) => dst.fill(0),
            }
            self.write_raw(l, sector_start, s)
        })
    }

    /// Writes an aligned range: in place when the caller's buffer may be consumed, else
    /// through scratch, [`THREAD_BUFFER_MAX`] bytes at a time.
    fn write_aligned(&self, l: &Layout, off: u64, data: WriteData<'_>) -> io::Result<()> {
        let chunks = |fill: &dyn Fn(&mut [u8], usize)| -> io::Result<()> {
            let len = data.len();
            let mut at = 0;
            while at < len {
                let n = (len - at).min(THREAD_BUFFER_MAX);
                with_scratch(n, |s| {
                    fill(s, at);
                    self.write_raw(l, off + at as u64, s)
                })?;
                at += n;
            }
            Ok(())
        };
        match data {
            WriteData::Consumable(b) => self.write_raw(l, off, b),
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
        self.stats.requests.measure(crate::Op::Write, || {
            self.write_bytes_timed(data, offset, fua)
        })
    }

    fn write_bytes_timed(&self, data: WriteData<'_>, offset: u64, fua: bool) -> io::Result<()> {
        let len = data.len() as u64;
        self.check_writable()?;
        self.check(offset, len)?;
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats.written_bytes.fetch_add(len, Relaxed);
        if len == 0 {
            return Ok(());
        }
        if self.is_aligned(offset, len) {
            let l = self.layout_for_write(offset, len, false)?;
            self.write_aligned(&l, offset, data)?;
        } else {
            self.stats.unaligned.fetch_add(1, Relaxed);
            // Alone: no other write may touch the boundary sectors between our read and
            // our write of them.
            let l = self.layout_for_write(offset, len, true)?;
            let r = self.split_unaligned(offset, len);
            if let Some(head) = r.head {
                self.write_partial(&l, head, offset, &data)?;
            }
            if let Some(tail) = r.tail {
                self.write_partial(&l, tail, offset, &data)?;
            }
            let (a, b) = r.middle;
            if b > a {
                let (from, to) = ((a - offset) as usize, (b - offset) as usize);
                let middle = match data {
                    WriteData::Borrowed(d) => WriteData::Borrowed(&d[from..to]),
                    WriteData::Consumable(d) => WriteData::Consumable(&mut d[from..to]),
                    WriteData::Zeroes(_) => WriteData::Zeroes(to - from),
                };
                self.write_aligned(&l, a, middle)?;
            }
        }
        if fua { self.commit() } else { Ok(()) }
    }

    /// Makes every completed write durable: the dm-integrity device's journal committed
    /// (its open section held the writes in memory, which a bare sync left there), or the
    /// storage synced. Holds the device's guard, so a suspend's drop of its keys waits for
    /// a commit already running.
    fn commit(&self) -> io::Result<()> {
        let i = self.integrity.read().unwrap_or_else(|e| e.into_inner());
        match i.as_ref() {
            Some(i) => i.flush(&*self.storage),
            None => self.storage.sync(),
        }
    }
}

/// Splits a request at volume offset `off` that overlaps the hot zone: `outside(at, part)`
/// handles the parts before and after it; returns the part inside, with its bounds.
/// Calls `f(piece, at, part)` for each hot-zone piece of `inside` (volume bytes
/// `[lo, hi)` of a zone starting at `zs`), in order.
fn for_each_piece(
    lo: u64,
    hi: u64,
    zs: u64,
    inside: &mut [u8],
    mut f: impl FnMut(u64, u64, &mut [u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut at = lo;
    while at < hi {
        let piece = (at - zs) / HOT_PIECE;
        let next = (zs + (piece + 1) * HOT_PIECE).min(hi);
        f(
            piece,
            at,
            &mut inside[(at - lo) as usize..(next - lo) as usize],
        )?;
        at = next;
    }
    Ok(())
}

fn split_at_zone<'b>(
    h: &HotZone,
    off: u64,
    buf: &'b mut [u8],
    outside: impl Fn(u64, &mut [u8]) -> io::Result<()>,
) -> io::Result<(u64, u64, &'b mut [u8])> {
    let end = off + buf.len() as u64;
    let (lo, hi) = (off.max(h.seg.start), end.min(h.seg.start + h.seg.len));
    let (head, rest) = buf.split_at_mut((lo - off) as usize);
    let (inside, tail) = rest.split_at_mut((hi - lo) as usize);
    if !head.is_empty() {
        outside(off, head)?;
    }
    if !tail.is_empty() {
        outside(hi, tail)?;
    }
    Ok((lo, hi, inside))
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
        self.size.load(Relaxed)
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
        self.stats
            .requests
            .measure(crate::Op::Flush, || self.commit())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.stats
            .requests
            .measure(crate::Op::Discard, || self.discard_timed(offset, len))
    }
    /// Readahead of the ciphertext under the range (decrypted when it is read).
    fn cache(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(offset, len)?;
        let l = self.layout();
        let end = offset + len;
        for s in &l.segments {
            let (lo, hi) = (offset.max(s.start), end.min(s.start + s.len));
            if hi > lo && !s.zero && s.integrity.is_none() {
                self.storage
                    .prefetch(s.storage_offset + (lo - s.start), hi - lo)?;
            }
        }
        Ok(())
    }
    /// Holes in the storage, only where discards are allowed (otherwise which sectors were
    /// never written stays hidden, as with dm-crypt) and never as zero: a hole decrypts to
    /// garbage. dm-zero segments read as zeros. While a reencryption step moves ciphertext,
    /// and where the storage cannot tell: all data.
    fn block_status(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        self.check(offset, len)?;
        let data = |len| Extent {
            len,
            hole: false,
            zero: false,
        };
        if !self.allow_discards {
            return Ok(vec![data(len)]);
        }
        let l = self.layout();
        if l.hot.is_some() {
            return Ok(vec![data(len)]);
        }
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        let first = l.segments.partition_point(|s| s.start + s.len <= offset);
        for s in &l.segments[first..] {
            if s.start >= end || out.len() >= MAX_EXTENTS {
                break;
            }
            let (lo, hi) = (offset.max(s.start), end.min(s.start + s.len));
            let runs = if s.zero {
                vec![Extent {
                    len: hi - lo,
                    hole: true,
                    zero: true,
                }]
            } else {
                let at = s.storage_offset + (lo - s.start);
                match storage_extents(&*self.storage, at, hi - lo, self.sector, false) {
                    Ok(r) => r,
                    Err(e) if e.kind() == io::ErrorKind::Unsupported => vec![data(hi - lo)],
                    Err(e) => return Err(e),
                }
            };
            let full = runs.iter().map(|r| r.len).sum::<u64>() == hi - lo;
            for r in runs {
                match out.last_mut() {
                    Some(p) if p.hole == r.hole && p.zero == r.zero => p.len += r.len,
                    _ => out.push(r),
                }
            }
            if !full {
                break; // the storage stopped early: the client asks again from there
            }
        }
        out.truncate(MAX_EXTENTS);
        Ok(out)
    }
    /// Only for one segment: the split path maps a request to one storage range and one
    /// cipher.
    fn split_io(&self) -> Option<&dyn SplitIo> {
        let l = self.layout();
        if l.segments.len() != 1 || l.hot.is_some() || l.segments[0].integrity.is_some() {
            return None;
        }
        let split = self.storage.raw_fd().map(|_| self as &dyn SplitIo);
        if split.is_some() {
            self.split_handed_out.store(true, Relaxed);
        }
        split
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
        self.check_split(offset, len, write)?;
        Ok(self.data_offset() + offset)
    }
    fn seal(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_split(offset, buf.len() as u64, true)?;
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats
            .written_bytes
            .fetch_add(buf.len() as u64, Relaxed);
        self.stats.crypto_calls.fetch_add(1, Relaxed);
        self.layout().segments[0]
            .cipher
            .encrypt(offset / self.sector, buf)
            .map_err(crypto_io)
    }
    fn unseal(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_split(offset, buf.len() as u64, false)?;
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.read_bytes.fetch_add(buf.len() as u64, Relaxed);
        self.stats.crypto_calls.fetch_add(1, Relaxed);
        self.layout().segments[0]
            .cipher
            .decrypt(offset / self.sector, buf)
            .map_err(crypto_io)
    }
    fn note_flush(&self) {
        self.stats.flushes.fetch_add(1, Relaxed);
    }
}

/// Checks a layout: segments sorted, contiguous from byte 0, each a whole number of the
/// largest sector size among them and inside the storage (`have` bytes). Returns the
/// volume's size and block size.
fn check_segments(segments: &[DataSegment], have: u64) -> Result<(u64, u64)> {
    let sector = segments
        .iter()
        .map(|s| s.cipher.sector_size() as u64)
        .max()
        .ok_or_else(|| Error::Invalid("a volume needs at least one segment".into()))?;
    let mut at = 0u64;
    for (i, s) in segments.iter().enumerate() {
        if s.start != at {
            return Err(Error::Invalid(format!(
                "segment {i} starts at byte {}, not {at}",
                s.start
            )));
        }
        if s.len == 0 || !s.len.is_multiple_of(sector) || !s.storage_offset.is_multiple_of(512) {
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
    Ok((at, sector))
}
