//! dm-integrity served without the kernel (issue 38): blocks and their tags over
//! dm-integrity's layout (data in areas, each block's tag packed in the metadata run before
//! its area) and journal, both from `cryptblk_format::integrity`. The tags come from a
//! [`SectorTags`]: dm-crypt's authenticated sectors (`AeadSectorCipher`, LUKS2 with
//! integrity) or dm-integrity's own checksum (`IntegrityHash`, standalone volumes).
//!
//! Writes go through the journal as the kernel's journal mode does, so that a crash never
//! leaves a block whose data and tag disagree: a write is sealed, its blocks become journal
//! entries (sections filled in memory, written when full), and they reach their home only
//! once the journal holding them is on stable storage (at a flush, or when the ring wraps
//! and its sections are about to be reused). Until then reads take those blocks from
//! memory. Opening replays the journal as the kernel's `replay_journal` does (read-write:
//! the entries are written home and the journal emptied; read-only: they are read from
//! memory), so a volume the kernel left mid-write opens with the kernel's result, and the
//! kernel replays ours.
//!
//! A block whose tag does not verify is never handed out: the read fails with EIO and the
//! failure is counted (`status`: `integrity_errors`).

use cryptblk_crypto::SectorTags;
use cryptblk_device::Storage;
use cryptblk_format::integrity::{Geometry, Journal, Superblock, flags};
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

/// The most data one home write carries (a run of neighbouring blocks is split beyond it).
const HOME_RUN_BYTES: usize = 1 << 20;

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
    /// Writes go through the journal (mode 'J'); else straight home (mode 'D').
    journal_writes: bool,
    failures: AtomicU64,
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
    fn data(&self, bs: usize) -> &[u8] {
        &self.data[self.index * bs..][..bs]
    }
    fn tag(&self, ts: usize) -> &[u8] {
        &self.tags[self.index * ts..][..ts]
    }
}

/// Blocks on their way home, the newest version of each.
#[derive(Default)]
struct State {
    /// In the journal (written, perhaps not yet stable), not yet home, by block.
    journaled: BTreeMap<u64, Pending>,
    /// The section being filled, not yet written, by block (a block may appear twice: the
    /// later wins).
    open: Vec<(u64, Pending)>,
    /// Where the next section goes, and its ring pass.
    next_section: u32,
    seq: u8,
}

fn eio(msg: String) -> io::Error {
    io::Error::other(msg)
}

impl Integrity {
    /// Opens the dm-integrity device whose superblock is at byte `start` of `storage`,
    /// under `auth`; replays its journal. Returns it and the bytes it provides.
    pub fn open(
        storage: &dyn Storage,
        start: u64,
        auth: Box<dyn SectorTags>,
        read_only: bool,
        journal_writes: bool,
    ) -> crate::Result<(Integrity, u64)> {
        let bad = |s: String| crate::Error::Invalid(format!("dm-integrity metadata: {s}"));
        let mut sb_bytes = [0u8; 512];
        storage.read_at(&mut sb_bytes, start)?;
        let sb = Superblock::parse(&sb_bytes).map_err(|e| bad(e.to_string()))?;
        if sb.flags & (flags::RECALCULATING | flags::DIRTY_BITMAP) != 0 {
            return Err(bad(format!(
                "flags {:#x}: recalculation or bitmap mode, which LUKS2 never uses",
                sb.flags
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
        let journal = Journal::of(&sb, &geo).map_err(|e| bad(e.to_string()))?;
        let provided = geo.provided_data_sectors;
        let dev_sectors = storage.size()? / 512;
        if provided == 0 || geo.data_sector(provided - 1) >= dev_sectors {
            return Err(crate::Error::TooSmall {
                need: (geo.data_sector(provided.max(1) - 1) + 1) * 512,
                have: dev_sectors * 512,
            });
        }
        let mut jbytes = vec![0u8; journal.bytes() as usize];
        storage.read_at(&mut jbytes, journal.section_offset(0))?;
        let replay = journal.replay(&jbytes);
        let mut state = State::default();
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
        let me = Integrity {
            auth,
            geo,
            journal,
            block,
            state: RwLock::new(State::default()),
            read_only,
            journal_writes,
            failures: AtomicU64::new(0),
        };
        if !read_only {
            // Home, stable, then the journal emptied as the kernel clears it.
            me.write_home(storage, &state.journaled)?;
            storage.sync()?;
            state.journaled.clear();
            let (erase, next) = replay.erase_and_next_seq();
            let mut empty = Vec::with_capacity(jbytes.len());
            for i in 0..me.journal.sections {
                empty.extend(me.journal.section(i, erase, &[]));
            }
            storage.write_at(&empty, me.journal.section_offset(0))?;
            storage.sync()?;
            state.seq = next;
        }
        *me.state.write().unwrap_or_else(|e| e.into_inner()) = state;
        Ok((me, provided * 512))
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
        let bad = |s: String| crate::Error::Invalid(format!("dm-integrity: {s}"));
        let sectors = storage.size()? / 512;
        let tag = u16::try_from(auth.tag_size()).map_err(|_| bad("tag size".into()))?;
        let mut sb = Geometry::format(sectors, start / 512, tag, auth.sector_size())
            .map_err(|e| bad(e.to_string()))?;
        if let Some(salt) = salt {
            // fix_hmac: the salt goes into every tag (`auth` was built with it).
            sb.flags |= flags::FIXED_HMAC;
            sb.salt = salt;
            sb.version = Superblock::version_for(sb.flags, false);
        }
        let geo = Geometry::of(&sb, start / 512);
        let journal = Journal::of(&sb, &geo).map_err(|e| bad(e.to_string()))?;
        let mut area = vec![0u8; 4096];
        area[..64].copy_from_slice(&sb.to_bytes());
        let mut empty = Vec::with_capacity(journal.bytes() as usize);
        for i in 0..journal.sections {
            empty.extend(journal.section(i, 0, &[]));
        }
        storage.write_at(&empty, journal.section_offset(0))?;
        storage.write_at(&area, start)?;
        let me = Integrity {
            block: u64::from(auth.sector_size()),
            auth,
            geo,
            journal,
            state: RwLock::new(State::default()),
            read_only: false,
            journal_writes: false,
            failures: AtomicU64::new(0),
        };
        let total = geo.provided_data_sectors * 512;
        if wipe {
            let (bs, ts) = (me.block as usize, me.auth.tag_size());
            let chunk = (1 << 20) / bs as u64;
            let blocks = total / me.block;
            let mut b = 0;
            while b < blocks {
                for (b0, k) in me.runs(b, chunk.min(blocks - b)) {
                    let mut data = vec![0u8; k as usize * bs];
                    let mut tags = vec![0u8; k as usize * ts];
                    me.auth
                        .seal(b0, &mut data, &mut tags)
                        .map_err(|e| bad(e.to_string()))?;
                    storage.write_at(&data, me.data_at(b0))?;
                    storage.write_at(&tags, me.tag_at(b0))?;
                }
                b += chunk.min(blocks - b);
                progress(b * me.block, total);
            }
        }
        storage.sync()?;
        Ok(total)
    }

    /// Sectors whose tag did not verify, since the volume was opened.
    pub fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
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
        if self.journal_writes {
            // The journal's copy, also taken outside the lock.
            let (data, tags): (Arc<[u8]>, Arc<[u8]>) = (Arc::from(&buf[..]), Arc::from(tags));
            let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
            for index in 0..n {
                let p = Pending {
                    data: data.clone(),
                    tags: tags.clone(),
                    index,
                };
                st.open.push((first + index as u64, p));
                if st.open.len() == self.journal.entries_per_section {
                    self.commit(storage, &mut st)?;
                }
            }
            return Ok(());
        }
        // Mode 'D': data, then tags, at their places (under the lock, so no read sees one
        // without the other; a crash between them can).
        let _st = self.state.write().unwrap_or_else(|e| e.into_inner());
        let mut done = 0;
        for (b0, k) in self.runs(first, n as u64) {
            let len = k as usize;
            storage.write_at(&buf[done * bs..][..len * bs], self.data_at(b0))?;
            storage.write_at(&tags[done * ts..][..len * ts], self.tag_at(b0))?;
            done += len;
        }
        Ok(())
    }

    /// Writes the open section (padded: its other entries unused) to the journal ring.
    fn commit(&self, storage: &dyn Storage, st: &mut State) -> io::Result<()> {
        if st.open.is_empty() {
            return Ok(());
        }
        if st.next_section == self.journal.sections {
            // The ring is full: what its sections hold goes home, stably, before the
            // first of them is reused in the next pass.
            storage.sync()?;
            self.write_home(storage, &st.journaled)?;
            storage.sync()?;
            st.journaled.clear();
            st.next_section = 0;
            st.seq = (st.seq + 1) % 4;
        }
        let (bs, ts, spb) = (self.block as usize, self.auth.tag_size(), self.block / 512);
        let entries = st
            .open
            .iter()
            .map(|(b, p)| (b * spb, p.data(bs), p.tag(ts)));
        let section = self.journal.section_of(st.next_section, st.seq, entries);
        storage.write_at(&section, self.journal.section_offset(st.next_section))?;
        st.next_section += 1;
        let State {
            open, journaled, ..
        } = st;
        journaled.extend(open.drain(..));
        Ok(())
    }

    /// Makes every write so far stable: the open section to the journal, the journal to
    /// stable storage (a crash from here on replays it); then the blocks go home (stable
    /// at the next sync; the journal keeps them until then).
    pub fn flush(&self, storage: &dyn Storage) -> io::Result<()> {
        if self.read_only {
            // Nothing written; what the replay found stays in memory (never written home).
            return Ok(());
        }
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        self.commit(storage, &mut st)?;
        storage.sync()?;
        if !st.journaled.is_empty() {
            self.write_home(storage, &st.journaled)?;
            st.journaled.clear();
        }
        Ok(())
    }

    /// Writes `blocks` (data and tags) to their places: a run of neighbours within one
    /// area in two writes, its data and its tags (a write per block cost a system call
    /// per 4 KiB), each straight from its write's buffer when the run came from one write
    /// in order (a NBD request's blocks), else gathered.
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
            let one_write = run
                .iter()
                .enumerate()
                .all(|(i, p)| Arc::ptr_eq(&p.data, &p0.data) && p.index == p0.index + i);
            if one_write {
                storage.write_at(
                    &p0.data[p0.index * bs..][..run.len() * bs],
                    self.data_at(b0),
                )?;
                storage.write_at(&p0.tags[p0.index * ts..][..run.len() * ts], self.tag_at(b0))?;
                continue;
            }
            data.clear();
            tags.clear();
            for p in &run {
                data.extend_from_slice(p.data(bs));
                tags.extend_from_slice(p.tag(ts));
            }
            storage.write_at(&data, self.data_at(b0))?;
            storage.write_at(&tags, self.tag_at(b0))?;
        }
        Ok(())
    }
}
