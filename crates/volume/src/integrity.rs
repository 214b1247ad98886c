//! dm-integrity served without the kernel (issue 38): blocks and their tags over
//! dm-integrity's layout (data in areas, each block's tag packed in the metadata run before
//! its area) and journal, both from `cryptblk_format::integrity`. The tags come from a
//! [`SectorTags`]: dm-crypt's authenticated sectors (`AeadSectorCipher`, LUKS2 with
//! integrity) or dm-integrity's own checksum (`IntegrityHash`, standalone volumes).
//!
//! Writes go through the journal as the kernel's journal mode does, so that a crash never
//! leaves a block whose data and tag disagree: a write is sealed, its blocks become journal
//! entries (sections filled in memory; the writer that fills one takes the ring's next
//! section for it and writes it outside the journal's lock, as other writers write
//! theirs), and they reach their home only once the journal holding them is on stable
//! storage. As the kernel does, that starts when half the ring holds written sections not
//! yet home (its `journal_watermark`): the writer whose write reached it writes them home,
//! also outside the lock, while the others fill the other half; a section is reused only
//! once what it held is home and stable. A flush waits for the sections taken before it,
//! then syncs. Until they are home, reads take those blocks from memory. Opening replays
//! the journal as the kernel's `replay_journal` does (read-write: the entries are written
//! home and the journal emptied; read-only: they are read from memory), so a volume the
//! kernel left mid-write opens with the kernel's result, and the kernel replays ours.
//!
//! A block whose tag does not verify is never handed out: the read fails with EIO and the
//! failure is counted (`status`: `integrity_errors`).

use cryptblk_crypto::{IntegrityHash, JournalSectionCipher, SecretBytes, SectorTags};
use cryptblk_device::Storage;
use cryptblk_format::integrity::{Geometry, Journal, SECTION_MAC_BYTES, Superblock, flags};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// The most data one home write carries (a run of neighbouring blocks is split beyond it).
const HOME_RUN_BYTES: usize = 1 << 20;

/// A part of a run that one write put there written straight from that write's buffer
/// from this size on; smaller parts are gathered with their neighbours.
const HOME_DIRECT_BYTES: usize = 32 << 10;

/// Bitmap mode: how long a region stays marked after its writes are stable before a flush
/// clears the bitmap (the kernel's `bitmap_flush_interval`, 10 s by default): clearing at
/// every flush would cost every next write a bitmap write and a sync first.
const BITMAP_CLEAR_INTERVAL: Duration = Duration::from_secs(10);

/// The journal's own protection, besides the blocks' tags (integritysetup's options; the
/// superblock records a MAC, never an encryption).
#[derive(Debug, Default)]
pub struct JournalKeys {
    /// `--journal-integrity`: each section's MAC, and the superblock's with `fix_hmac`.
    pub mac: Option<IntegrityHash>,
    /// `--journal-crypt`: a cipher's name and key: a stream cipher's keystream XORed over
    /// the journal, or a block cipher (`cbc-aes`) encrypting each section on its own.
    pub crypt: Option<(String, SecretBytes)>,
}

/// How the journal is encrypted on the device (integritysetup's `--journal-crypt`).
enum JournalCrypt {
    /// A stream cipher: its keystream from the journal's first byte, XORed.
    Xor(SecretBytes),
    /// A block cipher: each section on its own.
    Sections(JournalSectionCipher),
}

/// The journal of `sb`/`geo` under `crypt`: its layout (with the commit id bases a stream
/// cipher changes) and its encryption.
fn journal_under(
    sb: &Superblock,
    geo: &Geometry,
    crypt: Option<&(String, SecretBytes)>,
) -> crate::Result<(Journal, Option<JournalCrypt>)> {
    let bad = |s: String| crate::Error::Invalid(format!("dm-integrity metadata: {s}"));
    let journal = Journal::of(sb, geo).map_err(|e| bad(e.to_string()))?;
    let Some((name, key)) = crypt else {
        return Ok((journal, None));
    };
    if let Some(c) = JournalSectionCipher::new(name, key)? {
        return Ok((journal, Some(JournalCrypt::Sections(c))));
    }
    // The kernel encrypts zeros over the journal's pages, then the four commit id bases.
    let pages = journal.bytes().next_multiple_of(4096) as usize;
    let ks = cryptblk_crypto::integrity_journal_keystream(name, key, pages + 32)?;
    let mut bases = journal.commit_bases();
    for (b, k) in bases.iter_mut().zip(&ks[pages..]) {
        *b ^= k;
    }
    let xor = SecretBytes::from_slice(&ks[..journal.bytes() as usize]);
    Ok((
        journal.with_commit_bases(&bases),
        Some(JournalCrypt::Xor(xor)),
    ))
}

/// What [`Integrity::reseal`] puts in blocks: sealed zeros, or new tags over their data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reseal {
    Zeros,
    Tags,
}

/// How writes reach their place, as dm-integrity's modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IntegrityMode {
    /// Through the journal (mode 'J', the default): a crash never leaves a block whose
    /// data and tag disagree.
    #[default]
    Journal,
    /// Straight home (mode 'D', `--integrity-no-journal`): a crash mid-write can leave
    /// that block failing verification.
    Direct,
    /// Straight home, each region marked in a bitmap on the device before its first
    /// write (mode 'B', `--integrity-bitmap-mode`): after a crash, the tags of the marked
    /// regions are recalculated from their data. Checksums only (standalone volumes).
    Bitmap,
}

/// Bitmap mode's bitmap, as the kernel keeps it at the start of the journal area: bit `i`
/// (byte `i / 8`, bit `i % 8`) covers blocks `[i << log2_blocks, (i + 1) << log2_blocks)`.
/// What is here is what is on the device (bits are written, and synced, before the writes
/// they cover).
struct Bitmap {
    bits: Vec<u8>,
    log2_blocks: u8,
    /// Since when a set bit's writes may not yet be stable (a flush after
    /// [`BITMAP_CLEAR_INTERVAL`] clears them).
    since: Option<Instant>,
}

impl Bitmap {
    /// The bitmap's bytes on the device: whole 4 KiB blocks (the kernel's
    /// `n_bitmap_blocks`).
    fn bytes_for(sb: &Superblock) -> u64 {
        let blocks = sb.provided_data_sectors >> sb.log2_sectors_per_block;
        let bits = blocks.div_ceil(1u64 << sb.log2_blocks_per_bitmap_bit);
        bits.div_ceil(4096 * 8) * 4096
    }

    fn of(sb: &Superblock, bits: Vec<u8>) -> Bitmap {
        Bitmap {
            bits,
            log2_blocks: sb.log2_blocks_per_bitmap_bit,
            since: None,
        }
    }

    fn bit(&self, i: u64) -> bool {
        self.bits[(i / 8) as usize] & (1 << (i % 8)) != 0
    }

    /// Runs of blocks (first, count) under set bits, within `blocks`.
    fn dirty_runs(&self, blocks: u64) -> Vec<(u64, u64)> {
        let per = 1u64 << self.log2_blocks;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for i in 0..blocks.div_ceil(per) {
            if !self.bit(i) {
                continue;
            }
            let (first, n) = (i * per, per.min(blocks - i * per));
            match runs.last_mut() {
                Some((f, k)) if *f + *k == first => *k += n,
                _ => runs.push((first, n)),
            }
        }
        runs
    }

    /// Sets the bits of blocks `[first, first + n)`; returns the byte range of the 4 KiB
    /// bitmap blocks that changed (to be written), if any did.
    fn mark(&mut self, first: u64, n: u64) -> Option<std::ops::Range<usize>> {
        if n == 0 {
            return None;
        }
        let (lo, hi) = (
            first >> self.log2_blocks,
            (first + n - 1) >> self.log2_blocks,
        );
        let mut changed: Option<std::ops::Range<usize>> = None;
        for i in lo..=hi {
            if self.bit(i) {
                continue;
            }
            self.bits[(i / 8) as usize] |= 1 << (i % 8);
            let page = (i / 8) as usize / 4096 * 4096;
            changed = Some(match changed {
                Some(r) => r.start.min(page)..r.end.max(page + 4096),
                None => page..page + 4096,
            });
        }
        if changed.is_some() {
            self.since.get_or_insert_with(Instant::now);
        }
        changed
    }
}

/// A data segment's dm-integrity device, opened.
pub struct Integrity {
    /// What makes and checks the tags: dm-crypt's authenticated sectors (LUKS2), or
    /// dm-integrity's own checksum (standalone volumes).
    auth: Box<dyn SectorTags>,
    geo: Geometry,
    journal: Journal,
    /// Block (= encryption sector) size in bytes.
    block: u64,
    state: RwLock<State>,
    read_only: bool,
    mode: IntegrityMode,
    failures: AtomicU64,
    /// The superblock as last written (its flags change: bitmap mode, recalculation).
    sb: Mutex<Superblock>,
    /// The journal's MAC (`HAVE_JOURNAL_MAC`, integritysetup's `--journal-integrity`):
    /// each section's, and the superblock's with `FIXED_HMAC`.
    journal_mac: Option<IntegrityHash>,
    /// How the journal is encrypted on the device (`--journal-crypt`).
    journal_crypt: Option<JournalCrypt>,
    /// Where it is, in bytes.
    start: u64,
    /// Counts what a writer may wait for: a section written to the ring, sections written
    /// home (or an attempt failed).
    progress: (Mutex<u64>, Condvar),
}

impl std::fmt::Debug for Integrity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Integrity")
            .field("tags", &self.auth.description())
            .field("geometry", &self.geo)
            .finish()
    }
}

/// A block on its way home: block `index` of a sealed write's ciphertext and tags (or of a
/// replayed journal entry), shared by all the blocks of that write rather than copied per
/// block; a run of them goes home straight from the write's buffer.
#[derive(Clone)]
struct Pending {
    data: Arc<[u8]>,
    tags: Arc<[u8]>,
    index: usize,
}

impl Pending {
    /// The same version of a block (a later write of it is another buffer).
    fn same(&self, other: &Pending) -> bool {
        Arc::ptr_eq(&self.data, &other.data) && self.index == other.index
    }
    fn data(&self, bs: usize) -> &[u8] {
        &self.data[self.index * bs..][..bs]
    }
    fn tag(&self, ts: usize) -> &[u8] {
        &self.tags[self.index * ts..][..ts]
    }
}

/// A section of the ring in use.
struct Held {
    /// Its blocks, in entry order (a block may appear twice: the later wins).
    entries: SectionBlocks,
    /// Its write to the ring has completed (a writer writes it without the lock).
    written: bool,
}

/// Marks a section [`Integrity::commit`] took as written ([`SectionDone::mark`], or when
/// dropped unmarked: its writer panicked), `error` failing the device, and wakes those
/// waiting.
struct SectionDone<'a> {
    me: &'a Integrity,
    number: u64,
    error: Option<String>,
    marked: bool,
}

impl SectionDone<'_> {
    /// Marks it under the lock the caller holds (and goes on with).
    fn mark(&mut self, st: &mut State) {
        // Homing takes written sections only, from the front: this one is still held.
        let at = (self.number - (st.taken - st.held.len() as u64)) as usize;
        st.held[at].written = true;
        if let Some(e) = self.error.take() {
            st.failed.get_or_insert(e);
        }
        self.marked = true;
        self.me.progressed();
    }
}

impl Drop for SectionDone<'_> {
    fn drop(&mut self) {
        if !self.marked {
            let mut st = self.me.state.write().unwrap_or_else(|e| e.into_inner());
            self.mark(&mut st);
        }
    }
}

/// Ends a writing home ([`Integrity::home`]) when dropped: with its `blocks` (it
/// succeeded) their sections are free and they leave `journaled`; without (it failed or
/// panicked) the sections stay in use. Either way another may begin, and those waiting
/// wake.
struct HomingDone<'a> {
    me: &'a Integrity,
    blocks: Option<BTreeMap<u64, Pending>>,
}

impl Drop for HomingDone<'_> {
    fn drop(&mut self) {
        let mut st = self.me.state.write().unwrap_or_else(|e| e.into_inner());
        if let Some(blocks) = self.blocks.take() {
            for (b, p) in &blocks {
                if st.journaled.get(b).is_some_and(|q| q.same(p)) {
                    st.journaled.remove(b);
                }
            }
            let done = st.homing;
            st.held.drain(..done);
        }
        st.homing = 0;
        drop(st);
        self.me.progressed();
    }
}

/// Blocks on their way home, the newest version of each.
#[derive(Default)]
struct State {
    /// In the journal (written, perhaps not yet stable), not yet home, by block: the
    /// newest version of each block in `held`.
    journaled: BTreeMap<u64, Pending>,
    /// The ring's sections in use, oldest first (the one before `next_section` last): a
    /// section is free again once its blocks are home, stable.
    held: VecDeque<Held>,
    /// Sections taken from the ring so far (the last in `held` is number `taken - 1`).
    taken: u64,
    /// How many of `held`'s first sections a writer is writing home (outside the lock).
    homing: usize,
    /// A section could not be written to the ring: the ring has a hole that a replay
    /// would stop at, so nothing written since may be called stable (the kernel fails
    /// the device likewise). Writes and flushes fail until the device is opened again.
    failed: Option<String>,
    /// The section being filled, not yet written, by block (a block may appear twice: the
    /// later wins).
    open: Vec<(u64, Pending)>,
    /// Where the next section goes, and its ring pass (the first after the last in
    /// `held`: sections are used, and freed, in ring order, as replay expects).
    next_section: u32,
    seq: u8,
    /// Bitmap mode's bitmap, while the device is open read-write in that mode.
    bitmap: Option<Bitmap>,
}

type StateGuard<'a> = RwLockWriteGuard<'a, State>;

/// A section's blocks, shared by the ring's bookkeeping and whoever writes them.
type SectionBlocks = Arc<[(u64, Pending)]>;

fn eio(msg: String) -> io::Error {
    io::Error::other(msg)
}

impl Integrity {
    /// Opens the dm-integrity device whose superblock is at byte `start` of `storage`,
    /// under `auth`, written in `mode`. What an earlier user left is put right first, as
    /// the kernel does on activation: the journal replayed; or, for a volume left in bitmap
    /// mode (`DIRTY_BITMAP`), the tags of the regions its bitmap marks recalculated; or
    /// the tags a recalculation had not reached yet (`RECALCULATING`). The last two need
    /// a checksum ([`SectorTags::recomputable`]) and a read-write open (the kernel would
    /// serve those blocks unverified meanwhile; cryptblk refuses instead). Returns the
    /// device and the bytes it provides.
    pub fn open(
        storage: &dyn Storage,
        start: u64,
        auth: Box<dyn SectorTags>,
        read_only: bool,
        mode: IntegrityMode,
    ) -> crate::Result<(Integrity, u64)> {
        Integrity::open_with(
            storage,
            start,
            auth,
            JournalKeys::default(),
            read_only,
            mode,
        )
    }

    /// [`Integrity::open`] with the journal's MAC (a device formatted with one needs it;
    /// the superblock's MAC and every replayed section's are checked with it) and its
    /// encryption.
    pub fn open_with(
        storage: &dyn Storage,
        start: u64,
        auth: Box<dyn SectorTags>,
        keys: JournalKeys,
        read_only: bool,
        mode: IntegrityMode,
    ) -> crate::Result<(Integrity, u64)> {
        let JournalKeys {
            mac: journal_mac,
            crypt,
        } = keys;
        let bad = |s: String| crate::Error::Invalid(format!("dm-integrity metadata: {s}"));
        let mut sb_bytes = [0u8; 512];
        storage.read_at(&mut sb_bytes, start)?;
        let sb = Superblock::parse(&sb_bytes).map_err(|e| bad(e.to_string()))?;
        match (sb.flags & flags::HAVE_JOURNAL_MAC != 0, &journal_mac) {
            (true, None) => {
                return Err(bad(
                    "its journal has a MAC: give it (--journal-integrity and its key)".into(),
                ));
            }
            (false, Some(_)) => {
                return Err(bad("its journal has no MAC (--journal-integrity)".into()));
            }
            (true, Some(m)) if sb.flags & flags::FIXED_HMAC != 0 => {
                let at = Superblock::mac_at(m.digest_size());
                let mut want = vec![0u8; m.digest_size()];
                m.digest(&[&sb_bytes[..at]], &mut want);
                if !cryptblk_crypto::constant_time_eq(&want, &sb_bytes[at..]) {
                    return Err(bad(
                        "the superblock's MAC does not verify (a wrong --journal-integrity \
                         key, or a changed superblock)"
                            .into(),
                    ));
                }
            }
            _ => {}
        }
        let dirty = sb.flags & flags::DIRTY_BITMAP != 0;
        let recalc =
            sb.flags & flags::RECALCULATING != 0 && sb.recalc_sector < sb.provided_data_sectors;
        if (dirty || recalc || mode == IntegrityMode::Bitmap) && !auth.recomputable() {
            return Err(bad(format!(
                "flags {:#x} or bitmap mode: tags to recalculate, which only dm-integrity's \
                 own checksums allow (standalone volumes; LUKS2 never uses them)",
                sb.flags
            )));
        }
        if (dirty || recalc) && read_only {
            return Err(bad(format!(
                "{} tags not yet recalculated ({}): open it read-write once to \
                 recalculate them",
                if dirty {
                    "a volume left in bitmap mode has"
                } else {
                    "a recalculating volume has"
                },
                if dirty {
                    "dirty bitmap"
                } else {
                    "recalculating"
                }
            )));
        }
        if usize::from(sb.tag_size) != auth.tag_size() {
            return Err(bad(format!(
                "tag size {} where {} needs {}",
                sb.tag_size,
                auth.description(),
                auth.tag_size()
            )));
        }
        let block = u64::from(auth.sector_size());
        if 512u64 << sb.log2_sectors_per_block != block {
            return Err(bad(format!(
                "block size {} where the segment's sector size is {block}",
                512u64 << sb.log2_sectors_per_block
            )));
        }
        let geo = Geometry::of(&sb, start / 512);
        if crypt.is_some() && (dirty || mode == IntegrityMode::Bitmap) {
            return Err(bad(
                "bitmap mode with an encrypted journal is not supported".into(),
            ));
        }
        let (journal, journal_crypt) = journal_under(&sb, &geo, crypt.as_ref())?;
        let provided = geo.provided_data_sectors;
        let dev_sectors = storage.size()? / 512;
        if provided == 0 || geo.data_sector(provided - 1) >= dev_sectors {
            return Err(crate::Error::TooSmall {
                need: (geo.data_sector(provided.max(1) - 1) + 1) * 512,
                have: dev_sectors * 512,
            });
        }
        let bitmap_bytes = Bitmap::bytes_for(&sb);
        if (dirty || mode == IntegrityMode::Bitmap) && bitmap_bytes > journal.bytes() {
            return Err(bad(format!(
                "a bitmap of {bitmap_bytes} bytes does not fit in the journal ({})",
                journal.bytes()
            )));
        }
        let mut me = Integrity {
            auth,
            geo,
            journal,
            block,
            state: RwLock::new(State::default()),
            read_only,
            mode,
            failures: AtomicU64::new(0),
            sb: Mutex::new(sb.clone()),
            journal_mac,
            journal_crypt,
            start,
            progress: (Mutex::new(0), Condvar::new()),
        };
        let mut jbytes = vec![0u8; me.journal.bytes() as usize];
        storage.read_at(&mut jbytes, me.journal.section_offset(0))?;
        me.crypt_journal(0, &mut jbytes, false);
        let mut state = State::default();
        if dirty {
            // The journal area holds the bitmap, not a journal. The regions it marks may
            // hold blocks whose tags were not written: their tags are recalculated; then
            // the area becomes an empty journal again (the kernel's `init_journal`).
            let bitmap = Bitmap::of(&sb, jbytes[..bitmap_bytes as usize].to_vec());
            for (first, n) in bitmap.dirty_runs(me.blocks()) {
                me.reseal(storage, first, n, Reseal::Tags, &mut |_, _| {})?;
            }
            storage.sync()?;
            me.empty_journal(storage, 0)?;
            storage.read_at(&mut jbytes, me.journal.section_offset(0))?;
            let mut sb = me.sb.lock().unwrap_or_else(|e| e.into_inner());
            sb.flags &= !flags::DIRTY_BITMAP;
            me.write_superblock(storage, &sb)?;
        }
        let replay = me.journal.replay(&jbytes);
        // As the kernel replays: each section taken must carry its MAC. A mismatch leaves
        // the journal as it is (the kernel fails the device).
        let ss = me.journal.section_bytes();
        for &i in &replay.sections {
            let section = &jbytes[i as usize * ss..][..ss];
            if me.journal.mac && me.section_mac(i, section) != me.journal.stored_mac(section) {
                return Err(bad(format!(
                    "journal section {i}'s MAC does not verify: a wrong --journal-integrity \
                     key, or a changed journal (left as it is)"
                )));
            }
        }
        for e in replay.entries.iter().cloned() {
            let b = e.sector * 512 / block;
            let (data, tags) = (Arc::from(e.data), Arc::from(e.tag));
            let p = Pending {
                data,
                tags,
                index: 0,
            };
            state.journaled.insert(b, p);
        }
        if !read_only {
            // Home, stable, then the journal emptied as the kernel clears it.
            me.write_home(storage, &state.journaled)?;
            storage.sync()?;
            state.journaled.clear();
            let (erase, next) = replay.erase_and_next_seq();
            me.empty_journal(storage, erase)?;
            state.seq = next;
        }
        if recalc {
            let from = sb.recalc_sector * 512 / block;
            me.reseal(
                storage,
                from,
                me.blocks() - from,
                Reseal::Tags,
                &mut |_, _| {},
            )?;
            storage.sync()?;
            let mut sb = me.sb.lock().unwrap_or_else(|e| e.into_inner());
            // As the kernel ends a recalculation: the position at the end, the flag kept.
            sb.recalc_sector = sb.provided_data_sectors;
            me.write_superblock(storage, &sb)?;
        }
        if mode == IntegrityMode::Bitmap && !read_only {
            // Marked in use in bitmap mode before the first write: a crash from here on
            // leaves DIRTY_BITMAP for the next open to act on.
            let bitmap = Bitmap::of(&sb, vec![0u8; bitmap_bytes as usize]);
            storage.write_at(&bitmap.bits, me.journal.section_offset(0))?;
            let mut sb = me.sb.lock().unwrap_or_else(|e| e.into_inner());
            sb.flags |= flags::DIRTY_BITMAP;
            me.write_superblock(storage, &sb)?;
            drop(sb);
            state.bitmap = Some(bitmap);
        }
        *me.state.get_mut().unwrap_or_else(|e| e.into_inner()) = state;
        Ok((me, provided * 512))
    }

    /// Blocks the device provides (the superblock's count: [`Integrity::grow`] raises it).
    fn blocks(&self) -> u64 {
        let sb = self.sb.lock().unwrap_or_else(|e| e.into_inner());
        sb.provided_data_sectors * 512 / self.block
    }

    /// Bytes the device provides.
    pub fn provided_bytes(&self) -> u64 {
        self.blocks() * self.block
    }

    /// Bytes the device can provide on `storage` as it is now (the kernel's
    /// `get_provided_data_sectors`; a file or device that grew), at least what it provides.
    pub fn growable_bytes(&self, storage: &dyn Storage) -> crate::Result<u64> {
        let sectors = storage.refresh_size()? / 512;
        let most = self
            .geo
            .largest_provided(sectors)
            .map_err(|e| crate::Error::Invalid(format!("dm-integrity: {e}")))?;
        Ok((most * 512 / self.block * self.block).max(self.provided_bytes()))
    }

    /// Grows the device to all `storage` holds now ([`Integrity::growable_bytes`]), as the
    /// kernel's resume does: the blocks past the old end are sealed as zeros with their
    /// tags and written home (integritysetup's `resize --wipe`; without it the kernel
    /// recalculates a checksum's tags over what the blocks hold, and under dm-crypt's
    /// authenticated sectors leaves them failing verification until written), synced, and
    /// only then does the superblock say the new size, so a crash before that leaves the
    /// old size and nothing else changed. Existing blocks do not move (areas keep their
    /// places; the last one fills up, new ones follow). I/O goes on meanwhile: nothing
    /// reads or writes the new blocks yet, and those whose tags share the last area's
    /// metadata with served blocks are written under the state lock, with no writer
    /// writing blocks home (whose tag writes could overwrite theirs). Returns the bytes
    /// provided.
    ///
    /// Refused read-only and in bitmap mode (the bitmap's granularity follows the size),
    /// unless there is nothing to grow.
    pub fn grow(&self, storage: &dyn Storage) -> crate::Result<u64> {
        let old = self.blocks();
        let most = self.growable_bytes(storage)? / self.block;
        if most <= old {
            return Ok(old * self.block);
        }
        let bad =
            |s: &str| crate::Error::Invalid(format!("cannot grow the dm-integrity device: {s}"));
        if self.read_only {
            return Err(bad("it is open read-only"));
        }
        if self.mode == IntegrityMode::Bitmap {
            return Err(bad(
                "it is open in bitmap mode, whose bitmap is sized for the old size: close \
                 it and open it in journal mode to resize",
            ));
        }
        let shared = old.next_multiple_of(self.area_blocks()).min(most);
        {
            let _home_writes = self.quiet(false);
            self.reseal(storage, old, shared - old, Reseal::Zeros, &mut |_, _| {})?;
        }
        self.reseal(
            storage,
            shared,
            most - shared,
            Reseal::Zeros,
            &mut |_, _| {},
        )?;
        storage.sync()?;
        let mut sb = self.sb.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = sb.clone();
        next.provided_data_sectors = most * self.block / 512;
        self.write_superblock(storage, &next)?;
        *sb = next;
        Ok(most * self.block)
    }

    /// Seals blocks `[first, first + n)` home, a MiB at a time, `progress(done, n)` in
    /// bytes after each: as zeros (data and tags written: a format's or a growth's wipe,
    /// never through the journal, which holds none of them), or their data as it is
    /// (tags only: a checksum's recalculation, the kernel's `integrity_recalc`).
    fn reseal(
        &self,
        storage: &dyn Storage,
        first: u64,
        n: u64,
        what: Reseal,
        progress: &mut dyn FnMut(u64, u64),
    ) -> io::Result<()> {
        let (bs, ts) = (self.block as usize, self.auth.tag_size());
        let chunk = ((1 << 20) / self.block).max(1);
        let mut b = first;
        while b < first + n {
            let k = chunk.min(first + n - b);
            for (b0, len) in self.runs(b, k) {
                let mut data = vec![0u8; len as usize * bs];
                let mut tags = vec![0u8; len as usize * ts];
                if what == Reseal::Tags {
                    storage.read_at(&mut data, self.data_at(b0))?;
                }
                self.auth
                    .seal(b0, &mut data, &mut tags)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
                if what == Reseal::Zeros {
                    storage.write_at(&data, self.data_at(b0))?;
                }
                storage.write_at(&tags, self.tag_at(b0))?;
            }
            b += k;
            progress((b - first) * self.block, n * self.block);
        }
        Ok(())
    }

    /// Section `i`'s MAC (the kernel's `section_mac`), of its bytes `section`.
    fn section_mac(&self, i: u32, section: &[u8]) -> [u8; SECTION_MAC_BYTES] {
        let mut mac = [0u8; SECTION_MAC_BYTES];
        if let Some(m) = &self.journal_mac {
            let salt = {
                let sb = self.sb.lock().unwrap_or_else(|e| e.into_inner());
                (sb.flags & flags::FIXED_HMAC != 0).then_some(sb.salt)
            };
            m.digest(
                &[&self.journal.mac_input(i, salt.as_ref(), section)],
                &mut mac,
            );
        }
        mac
    }

    /// Encrypts (`encrypt`) or decrypts `bytes`, whole sections at byte `at` of the
    /// journal, where the journal is encrypted.
    fn crypt_journal(&self, at: usize, bytes: &mut [u8], encrypt: bool) {
        match &self.journal_crypt {
            None => {}
            Some(JournalCrypt::Xor(ks)) => {
                for (b, k) in bytes.iter_mut().zip(&ks[at..]) {
                    *b ^= k;
                }
            }
            Some(JournalCrypt::Sections(c)) => {
                let ss = self.journal.section_bytes();
                c.crypt((at / ss) as u32, ss, bytes, encrypt);
            }
        }
    }

    /// Section `i` (its bytes) with its MAC, where the journal has one.
    fn sealed_section(&self, i: u32, mut section: Vec<u8>) -> Vec<u8> {
        if self.journal.mac {
            let mac = self.section_mac(i, &section);
            self.journal.set_mac(&mut section, &mac);
        }
        section
    }

    /// The journal ring written empty (every section's commit ids of pass `seq`), stable.
    fn empty_journal(&self, storage: &dyn Storage, seq: u8) -> io::Result<()> {
        let mut empty = Vec::with_capacity(self.journal.bytes() as usize);
        for i in 0..self.journal.sections {
            empty.extend(self.sealed_section(i, self.journal.section(i, seq, &[])));
        }
        self.crypt_journal(0, &mut empty, true);
        storage.write_at(&empty, self.journal.section_offset(0))?;
        storage.sync()
    }

    /// Writes `sb` (its version as the kernel sets it for its flags), stable.
    fn write_superblock(&self, storage: &dyn Storage, sb: &Superblock) -> io::Result<()> {
        let mut sb = sb.clone();
        // The kernel's `sb_set_version`, at every superblock write.
        sb.version = Superblock::version_for(sb.flags, self.mode == IntegrityMode::Bitmap);
        let mut area = vec![0u8; 4096];
        area[..64].copy_from_slice(&sb.to_bytes());
        if let Some(m) = self
            .journal_mac
            .as_ref()
            .filter(|_| sb.flags & flags::FIXED_HMAC != 0)
        {
            // The kernel's `sb_mac`: the first sector's MAC at its end.
            let at = Superblock::mac_at(m.digest_size());
            let (covered, mac) = area[..512].split_at_mut(at);
            m.digest(&[covered], mac);
        }
        storage.write_at(&area, self.start)?;
        storage.sync()
    }

    /// Writes a new dm-integrity device at byte `start` of `storage`, as the kernel formats
    /// one for cryptsetup (`Geometry::format`: journal mode, default interleave and journal,
    /// fixed padding; with `salt`, `fix_hmac` and that salt, which `auth` must hash), its
    /// journal empty. With `wipe`, every block is then sealed zeros
    /// with its tag (cryptsetup's wipe; `progress(done, total)` in bytes follows it):
    /// without it, a block never written fails verification when read, as it does under
    /// the kernel. Returns the bytes the device provides.
    pub fn format(
        storage: &dyn Storage,
        start: u64,
        auth: Box<dyn SectorTags>,
        salt: Option<[u8; 16]>,
        wipe: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> crate::Result<u64> {
        Integrity::format_with(
            storage,
            start,
            auth,
            JournalKeys::default(),
            salt,
            wipe,
            progress,
        )
    }

    /// [`Integrity::format`] with a journal MAC (`HAVE_JOURNAL_MAC`; with `salt`, the
    /// superblock's MAC too), as integritysetup's `--journal-integrity` formats.
    pub fn format_with(
        storage: &dyn Storage,
        start: u64,
        auth: Box<dyn SectorTags>,
        keys: JournalKeys,
        salt: Option<[u8; 16]>,
        wipe: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> crate::Result<u64> {
        let bad = |s: String| crate::Error::Invalid(format!("dm-integrity: {s}"));
        let sectors = storage.size()? / 512;
        let tag = u16::try_from(auth.tag_size()).map_err(|_| bad("tag size".into()))?;
        let mut sb = Geometry::format_with(
            sectors,
            start / 512,
            tag,
            auth.sector_size(),
            keys.mac.is_some(),
        )
        .map_err(|e| bad(e.to_string()))?;
        if let Some(salt) = salt {
            // fix_hmac: the salt goes into every tag (`auth` was built with it).
            sb.flags |= flags::FIXED_HMAC;
            sb.salt = salt;
        }
        let geo = Geometry::of(&sb, start / 512);
        let (journal, journal_crypt) = journal_under(&sb, &geo, keys.crypt.as_ref())?;
        let me = Integrity {
            block: u64::from(auth.sector_size()),
            auth,
            geo,
            journal,
            state: RwLock::new(State::default()),
            read_only: false,
            mode: IntegrityMode::Direct,
            failures: AtomicU64::new(0),
            sb: Mutex::new(sb.clone()),
            journal_mac: keys.mac,
            journal_crypt,
            start,
            progress: (Mutex::new(0), Condvar::new()),
        };
        me.empty_journal(storage, 0)?;
        me.write_superblock(storage, &sb)?;
        let total = geo.provided_data_sectors * 512;
        if wipe {
            me.reseal(storage, 0, total / me.block, Reseal::Zeros, progress)?;
        }
        storage.sync()?;
        Ok(total)
    }

    /// Sectors whose tag did not verify, since the volume was opened.
    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
    }

    /// Where the device starts, whether it was opened read-only, and how writes reach
    /// their place: what opening it again (a resume) takes besides the keys.
    pub(crate) fn reopen_params(&self) -> (u64, bool, IntegrityMode) {
        (self.start, self.read_only, self.mode)
    }

    /// Counts on from `n` failed sectors (the device opened again after a suspend keeps
    /// the count `status` showed).
    pub(crate) fn carry_failures(&self, n: u64) {
        self.failures.store(n, Relaxed);
    }

    /// `encryption + integrity`, for `status`.
    pub fn description(&self) -> &str {
        self.auth.description()
    }

    /// Blocks per area (an area's data is contiguous on the device).
    fn area_blocks(&self) -> u64 {
        (1u64 << self.geo.log2_interleave_sectors) * 512 / self.block
    }

    /// Runs of blocks `[first, first + n)` that stay inside one area: (first, count).
    fn runs(&self, first: u64, n: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let per = self.area_blocks();
        let mut b = first;
        std::iter::from_fn(move || {
            (b < first + n).then(|| {
                let k = (per - b % per).min(first + n - b);
                let run = (b, k);
                b += k;
                run
            })
        })
    }

    fn data_at(&self, b: u64) -> u64 {
        self.geo.data_sector(b * self.block / 512) * 512
    }

    fn tag_at(&self, b: u64) -> u64 {
        self.geo.tag_offset(b * self.block / 512)
    }

    /// Reads, verifies and decrypts whole blocks at byte `rel` of the provided device.
    pub fn read(&self, storage: &dyn Storage, rel: u64, buf: &mut [u8]) -> io::Result<()> {
        let (bs, ts) = (self.block as usize, self.auth.tag_size());
        let first = rel / self.block;
        let st = self.state.read().unwrap_or_else(|e| e.into_inner());
        let mut done = 0usize;
        let mut bad = Vec::new();
        for (b0, k) in self.runs(first, buf.len() as u64 / self.block) {
            let chunk = &mut buf[done..][..k as usize * bs];
            let mut tags = vec![0u8; k as usize * ts];
            storage.read_at(chunk, self.data_at(b0))?;
            storage.read_at(&mut tags, self.tag_at(b0))?;
            for i in 0..k as usize {
                let b = b0 + i as u64;
                let newer = st
                    .open
                    .iter()
                    .rev()
                    .find(|(ob, _)| *ob == b)
                    .map(|(_, p)| p)
                    .or_else(|| st.journaled.get(&b));
                if let Some(p) = newer {
                    chunk[i * bs..][..bs].copy_from_slice(p.data(bs));
                    tags[i * ts..][..ts].copy_from_slice(p.tag(ts));
                }
            }
            let before = bad.len();
            self.auth
                .open(b0, chunk, &tags, &mut bad)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
            for i in &mut bad[before..] {
                *i += done / bs;
            }
            done += chunk.len();
        }
        if let Some(&i) = bad.first() {
            self.failures.fetch_add(bad.len() as u64, Relaxed);
            return Err(eio(format!(
                "integrity check failed: {} of {} sectors from sector {} (first: {})",
                bad.len(),
                buf.len() as u64 / self.block,
                first,
                first + i as u64
            )));
        }
        Ok(())
    }

    /// Seals whole blocks at byte `rel` and hands them to the journal. `buf` holds the
    /// ciphertext afterwards.
    pub fn write(&self, storage: &dyn Storage, rel: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "read-only volume",
            ));
        }
        let (bs, ts) = (self.block as usize, self.auth.tag_size());
        let first = rel / self.block;
        let n = buf.len() / bs;
        let mut tags = vec![0u8; n * ts];
        // Sealed before the journal is taken: writers seal in parallel (two writes to one
        // block land in the order they take it).
        self.auth
            .seal(first, buf, &mut tags)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        if self.mode == IntegrityMode::Journal {
            // The journal's copy, also taken outside the lock.
            let (data, tags): (Arc<[u8]>, Arc<[u8]>) = (Arc::from(&buf[..]), Arc::from(tags));
            let full = self.journal.entries_per_section;
            let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
            Self::usable(&st)?;
            for index in 0..n {
                // A commit lets the lock go while it writes its section: others may have
                // filled the open section again meanwhile.
                while st.open.len() >= full {
                    st = self.commit(storage, st, true)?;
                }
                let p = Pending {
                    data: data.clone(),
                    tags: tags.clone(),
                    index,
                };
                st.open.push((first + index as u64, p));
            }
            if st.open.len() >= full {
                st = self.commit(storage, st, true)?;
            }
            let due = self.homing_due(&mut st);
            drop(st);
            return match due {
                Some(blocks) => self.home(storage, blocks),
                None => Ok(()),
            };
        }
        // Modes 'D' and 'B': data, then tags, at their places (under the lock, so no read
        // sees one without the other; a crash between them can: in bitmap mode, only once
        // the bitmap on the device marks their region).
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        if let Some(bitmap) = st.bitmap.as_mut()
            && let Some(r) = bitmap.mark(first, n as u64)
        {
            storage.write_at(
                &bitmap.bits[r.clone()],
                self.journal.section_offset(0) + r.start as u64,
            )?;
            storage.sync()?;
        }
        let mut done = 0;
        for (b0, k) in self.runs(first, n as u64) {
            let len = k as usize;
            storage.write_at(&buf[done * bs..][..len * bs], self.data_at(b0))?;
            storage.write_at(&tags[done * ts..][..len * ts], self.tag_at(b0))?;
            done += len;
        }
        Ok(())
    }

    /// An error if the ring has a hole (see `State::failed`).
    fn usable(st: &State) -> io::Result<()> {
        match &st.failed {
            None => Ok(()),
            Some(e) => Err(io::Error::other(format!(
                "the dm-integrity journal could not be written ({e}): nothing written since \
                 is stable; open the device again"
            ))),
        }
    }

    /// Takes the ring's next section for the open section (padded: its other entries
    /// unused) and writes it there, without the lock (writers build and write their
    /// sections in parallel; a flush waits for those before it). The section must be
    /// free: if the ring is full, this waits for the writer writing its oldest sections
    /// home, or (none is) writes them home itself. `full_only`:
    /// only a full section (a writer that waited may find its entries taken by another,
    /// and others' in the open section).
    fn commit<'a>(
        &'a self,
        storage: &dyn Storage,
        mut st: StateGuard<'a>,
        full_only: bool,
    ) -> io::Result<StateGuard<'a>> {
        loop {
            Self::usable(&st)?;
            if st.open.is_empty() || (full_only && st.open.len() < self.journal.entries_per_section)
            {
                return Ok(st);
            }
            if st.held.len() < self.journal.sections as usize {
                break;
            }
            match self.homing_due(&mut st) {
                // The ring full and all written (a request longer than half the ring, or
                // a writing home that failed): this writer writes it home, without the
                // lock as at the mark.
                Some(sections) => {
                    drop(st);
                    self.home(storage, sections)?;
                    st = self.state.write().unwrap_or_else(|e| e.into_inner());
                }
                None => st = self.await_progress(st),
            }
        }
        debug_assert!(st.open.len() <= self.journal.entries_per_section);
        let (i, seq, number) = (st.next_section, st.seq, st.taken);
        st.taken += 1;
        st.next_section += 1;
        if st.next_section == self.journal.sections {
            st.next_section = 0;
            st.seq = (st.seq + 1) % 4;
        }
        let entries: SectionBlocks = std::mem::take(&mut st.open).into();
        for (b, p) in entries.iter() {
            st.journaled.insert(*b, p.clone());
        }
        st.held.push_back(Held {
            entries: entries.clone(),
            written: false,
        });
        drop(st);
        let mut done = SectionDone {
            me: self,
            number,
            error: Some("the writer panicked".into()),
            marked: false,
        };
        let r = self.write_section(storage, i, seq, &entries);
        done.error = r.as_ref().err().map(|e| e.to_string());
        // One taking of the lock: marked, and kept for the caller.
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        done.mark(&mut st);
        r?;
        Ok(st)
    }

    /// Section `i` of ring pass `seq`, holding `entries`, built and written.
    fn write_section(
        &self,
        storage: &dyn Storage,
        i: u32,
        seq: u8,
        entries: &[(u64, Pending)],
    ) -> io::Result<()> {
        let (bs, ts, spb) = (self.block as usize, self.auth.tag_size(), self.block / 512);
        let entries = entries
            .iter()
            .map(|(b, p)| (b * spb, p.data(bs), p.tag(ts)));
        let mut section = self.sealed_section(i, self.journal.section_of(i, seq, entries));
        self.crypt_journal(
            i as usize * self.journal.section_bytes(),
            &mut section,
            true,
        );
        storage.write_at(&section, self.journal.section_offset(i))
    }

    /// Once half the ring's sections are written and no writer is writing sections home,
    /// the caller becomes that writer: the written sections from the oldest on (which
    /// become the ones being written home), for [`Integrity::home`] once the lock is let
    /// go. The kernel starts at the same mark (`journal_watermark`, 50 % by default).
    fn homing_due(&self, st: &mut State) -> Option<Vec<SectionBlocks>> {
        let mark = (self.journal.sections as usize / 2).max(1);
        if st.homing > 0 || st.held.len() < mark || st.failed.is_some() {
            return None;
        }
        let written = st.held.iter().take_while(|h| h.written).count();
        if written < mark {
            return None;
        }
        st.homing = written;
        Some(
            st.held
                .iter()
                .take(written)
                .map(|h| h.entries.clone())
                .collect(),
        )
    }

    /// Writes [`Integrity::homing_due`]'s sections' blocks home (each block's last
    /// version among them), without the lock: the journal holding them stable first (a
    /// torn home write is mended by its replay), their homes stable after; then their
    /// sections are free. A block written again since keeps its newer version in
    /// `journaled` (and the older one, written home now, is overwritten when that goes
    /// home). On an error the sections stay in use (the next writer to reach the mark,
    /// or to find the ring full, tries again).
    fn home(&self, storage: &dyn Storage, sections: Vec<SectionBlocks>) -> io::Result<()> {
        let mut blocks = BTreeMap::new();
        for (b, p) in sections.iter().flat_map(|s| s.iter()) {
            blocks.insert(*b, p.clone());
        }
        let mut done = HomingDone {
            me: self,
            blocks: None,
        };
        let r = storage
            .sync()
            .and_then(|()| self.write_home(storage, &blocks))
            .and_then(|()| storage.sync());
        if r.is_ok() {
            done.blocks = Some(blocks);
        }
        drop(done);
        r
    }

    /// Wakes the writers waiting in [`Integrity::await_progress`]; called once the state
    /// changed, with the state lock held or let go (a waiter reads the count under that
    /// lock, and never waits for it while holding the count's).
    fn progressed(&self) {
        let (count, cv) = &self.progress;
        *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        cv.notify_all();
    }

    /// Lets the lock go until a section is written or sections are written home (or
    /// either failed), and takes it again.
    fn await_progress<'a>(&'a self, st: StateGuard<'a>) -> StateGuard<'a> {
        let (count, cv) = &self.progress;
        // Read under the state lock: progress is counted only after the state changed
        // under it, so the count cannot have moved on unseen.
        let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
        let seen = *n;
        drop(st);
        while *n == seen {
            n = cv.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        drop(n);
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The lock, with no sections being written home, and with `written` every section
    /// taken written too.
    fn quiet(&self, written: bool) -> StateGuard<'_> {
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        while st.homing > 0 || (written && st.held.iter().any(|h| !h.written)) {
            st = self.await_progress(st);
        }
        st
    }

    /// Every section in use written home, stably, under the lock (all written, none
    /// being written home by another writer): the ring is free. (A close's: writers
    /// write home without the lock.)
    fn home_all(&self, storage: &dyn Storage, st: &mut State) -> io::Result<()> {
        debug_assert!(st.homing == 0 && st.held.iter().all(|h| h.written));
        storage.sync()?;
        self.write_home(storage, &st.journaled)?;
        storage.sync()?;
        st.journaled.clear();
        st.held.clear();
        Ok(())
    }

    /// Makes every write so far stable: the open section to the journal, every section
    /// taken so far written (other writers write theirs without the lock), the journal to
    /// stable storage (a crash from here on replays it). The blocks stay in the journal
    /// until half the ring is in use, as the kernel keeps them (writing them home at
    /// every flush cost each flush its writes' data twice over).
    pub fn flush(&self, storage: &dyn Storage) -> io::Result<()> {
        if self.read_only {
            // Nothing written; what the replay found stays in memory (never written home).
            return Ok(());
        }
        let st = self.state.write().unwrap_or_else(|e| e.into_inner());
        let mut st = self.commit(storage, st, false)?;
        if st.bitmap.is_none() {
            // Those taken from here on are not this flush's to wait for.
            let taken = st.taken;
            loop {
                Self::usable(&st)?;
                let first = st.taken - st.held.len() as u64;
                let upto = (taken.saturating_sub(first) as usize).min(st.held.len());
                if st.held.iter().take(upto).all(|h| h.written) {
                    break;
                }
                st = self.await_progress(st);
            }
            let due = self.homing_due(&mut st);
            drop(st);
            return match due {
                // Its first sync is this flush's (and, failing, it frees the homing).
                Some(sections) => self.home(storage, sections),
                None => storage.sync(),
            };
        }
        // Bitmap mode: every marked write is stable now (writes hold the lock); the marks
        // are cleared once they are old enough.
        storage.sync()?;
        if let Some(bitmap) = st.bitmap.as_mut()
            && bitmap
                .since
                .is_some_and(|t| t.elapsed() >= BITMAP_CLEAR_INTERVAL)
        {
            bitmap.bits.fill(0);
            bitmap.since = None;
            storage.write_at(&bitmap.bits, self.journal.section_offset(0))?;
            storage.sync()?;
        }
        Ok(())
    }

    /// Flushes, and in bitmap mode leaves the device clean as the kernel does when it
    /// stops (the kernel's `dm_integrity_postsuspend`): the area an empty journal again,
    /// `DIRTY_BITMAP` cleared. A device never closed (a crash, `kill -9`) keeps its marks:
    /// the next open recalculates those regions.
    pub fn close(&self, storage: &dyn Storage) -> io::Result<()> {
        self.flush(storage)?;
        let mut st = self.quiet(true);
        if !st.held.is_empty() {
            // Home, as the kernel leaves a device it stops (the journal keeps them too:
            // the next open replays them again, to the same result).
            self.home_all(storage, &mut st)?;
        }
        if st.bitmap.is_some() {
            self.empty_journal(storage, 0)?;
            let mut sb = self.sb.lock().unwrap_or_else(|e| e.into_inner());
            sb.flags &= !flags::DIRTY_BITMAP;
            self.write_superblock(storage, &sb)?;
            // Only now: a device whose close failed keeps marking regions before it writes.
            st.bitmap = None;
        }
        Ok(())
    }

    /// Writes `blocks` (data and tags) to their places: a run of neighbours within one
    /// area as one write of its tags and as few of its data as it allows (a write per
    /// block cost a system call per 4 KiB): each part of the run that one write put there
    /// in order (a NBD request's blocks) straight from that write's buffer where it is at
    /// least [`HOME_DIRECT_BYTES`] or the whole run, the smaller parts gathered. (Gathering
    /// whole runs copied every sequential write's data once more: a fifth of a journal
    /// write.)
    fn write_home(&self, storage: &dyn Storage, blocks: &BTreeMap<u64, Pending>) -> io::Result<()> {
        let (bs, ts) = (self.block as usize, self.auth.tag_size());
        let per = self.area_blocks();
        let mut it = blocks.iter().peekable();
        let mut run: Vec<&Pending> = Vec::new();
        let (mut data, mut tags) = (Vec::new(), Vec::new());
        while let Some((&b0, p0)) = it.next() {
            run.clear();
            run.push(p0);
            let mut last = b0;
            while let Some(&(&b, p)) = it.peek() {
                if b != last + 1 || b % per == 0 || run.len() * bs >= HOME_RUN_BYTES {
                    break;
                }
                run.push(p);
                last = b;
                it.next();
            }
            tags.clear();
            for p in &run {
                tags.extend_from_slice(p.tag(ts));
            }
            storage.write_at(&tags, self.tag_at(b0))?;
            // The run's data, part by part: `data` gathers small parts from block
            // `gathered_from` on until a large part (or the run's end) writes them.
            data.clear();
            let mut gathered_from = b0;
            let mut i = 0;
            while i < run.len() {
                let p = run[i];
                let mut k = 1;
                while i + k < run.len()
                    && Arc::ptr_eq(&run[i + k].data, &p.data)
                    && run[i + k].index == p.index + k
                {
                    k += 1;
                }
                let part = &p.data[p.index * bs..][..k * bs];
                let at = b0 + i as u64;
                if part.len() >= HOME_DIRECT_BYTES || k == run.len() {
                    if !data.is_empty() {
                        storage.write_at(&data, self.data_at(gathered_from))?;
                        data.clear();
                    }
                    storage.write_at(part, self.data_at(at))?;
                    gathered_from = at + k as u64;
                } else {
                    data.extend_from_slice(part);
                }
                i += k;
            }
            if !data.is_empty() {
                storage.write_at(&data, self.data_at(gathered_from))?;
            }
        }
        Ok(())
    }
}
