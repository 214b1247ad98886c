//! dm-integrity's journal (docs/integrity-format.md §2.2, §3.1): a ring of sections, each
//! 8 sectors of entries (a block's logical sector, the last 8 bytes of each of its 512-byte
//! sectors, its tag) followed by the blocks' data, every journal sector ending in a commit
//! id that names its section, its place and the ring pass (one of four sequence numbers).
//!
//! [`Journal::replay`] finds what the kernel's `replay_journal` finds: the consistent run
//! of sections from the oldest, whose entries are applied in order; [`Journal::section`]
//! writes a section as the kernel's commit does, so that either side replays the other's.
//! With a journal MAC (`HAVE_JOURNAL_MAC`, integritysetup's `--journal-integrity`) the
//! entry sectors keep 8 bytes each for the section's MAC ([`Journal::mac_input`],
//! [`Journal::set_mac`]); the journal's encryption (`--journal-crypt`, which the superblock
//! does not record) is not implemented. LUKS2 uses neither.

use super::{Geometry, IntegrityError, SUPERBLOCK_SECTORS, Superblock, flags};

/// Journal sectors hold entries or data in their first 504 bytes.
const SECTOR_DATA: usize = 504;
/// With a journal MAC, each entry sector's bytes 496..504 hold 8 bytes of it.
const MAC_PER_SECTOR: usize = 8;
/// The section MAC's bytes: 8 per entry sector.
pub const SECTION_MAC_BYTES: usize = MAC_PER_SECTOR * ENTRY_SECTORS;
/// The first 8 sectors of a section hold its entries.
const ENTRY_SECTORS: usize = 8;
/// Four ring passes tell sections apart.
const N_COMMIT_IDS: u8 = 4;
/// `sector_hi` of an entry that holds nothing.
const UNUSED_HI: u32 = 0xffff_ffff;

/// One block written through the journal: where it goes and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalEntry {
    /// The block's first logical sector (512-byte units, block-aligned).
    pub sector: u64,
    /// The block as it goes to its home (dm-crypt's ciphertext for LUKS2).
    pub data: Vec<u8>,
    /// Its tag.
    pub tag: Vec<u8>,
}

/// The journal's shape, from the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Journal {
    /// Sections in the ring.
    pub sections: u32,
    /// Sectors per section: 8 of entries, then the data of each entry.
    pub section_sectors: u64,
    /// Entries (blocks) per section.
    pub entries_per_section: usize,
    entry_size: usize,
    /// 512-byte sectors per block.
    spb: usize,
    tag_size: usize,
    /// Byte offset of section 0 on the device.
    offset: u64,
    provided_data_sectors: u64,
    /// The entry sectors carry the section's MAC.
    pub mac: bool,
    /// The four ring passes' commit id bases (the kernel's `commit_ids`: 0x1111...,
    /// 0x2222..., unless the journal is encrypted with a stream cipher, which encrypts
    /// them too: [`Journal::with_commit_bases`]).
    bases: [u64; N_COMMIT_IDS as usize],
}

/// What [`Journal::replay`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    /// The blocks to apply, oldest first (a later entry for a block supersedes an earlier).
    pub entries: Vec<JournalEntry>,
    /// The last ring pass in use (`last_used` in the kernel).
    pub last_used: u8,
    /// Every sector carried a commit id of its place (else the kernel clears the journal
    /// without applying anything, and so do we).
    pub consistent: bool,
    /// The sections whose entries were taken, in order (their MACs are checked, as the
    /// kernel checks them when it replays).
    pub sections: Vec<u32>,
}

impl Replay {
    /// The pass number the kernel clears the journal with, and the one the next commit uses.
    pub fn erase_and_next_seq(&self) -> (u8, u8) {
        let erase = (self.last_used + N_COMMIT_IDS - 2) % N_COMMIT_IDS;
        (erase, (erase + 1) % N_COMMIT_IDS)
    }
}

impl Journal {
    /// The journal of the device with superblock `sb` and layout `g`.
    pub fn of(sb: &Superblock, g: &Geometry) -> Result<Journal, IntegrityError> {
        let mac = sb.flags & flags::HAVE_JOURNAL_MAC != 0;
        let spb = 1usize << g.log2_sectors_per_block;
        let tag_size = g.tag_size as usize;
        let entry_size = (8 + 8 * spb + tag_size).div_ceil(8) * 8;
        let per_sector = (SECTOR_DATA - if mac { MAC_PER_SECTOR } else { 0 }) / entry_size;
        if per_sector == 0 {
            return Err(IntegrityError::Invalid(format!("tag size {tag_size}")));
        }
        Ok(Journal {
            sections: sb.journal_sections,
            section_sectors: g.journal_section_sectors,
            entries_per_section: per_sector * ENTRY_SECTORS,
            entry_size,
            spb,
            tag_size,
            offset: (g.start + SUPERBLOCK_SECTORS) * 512,
            provided_data_sectors: g.provided_data_sectors,
            mac,
            bases: std::array::from_fn(|k| 0x1111_1111_1111_1111u64 * (k as u64 + 1)),
        })
    }

    /// The commit id bases, as 32 little-endian bytes (what a stream-cipher journal
    /// encryption encrypts after the journal: `create_journal`).
    pub fn commit_bases(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        for (k, v) in self.bases.iter().enumerate() {
            b[k * 8..][..8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// This journal with other commit id bases (32 little-endian bytes).
    pub fn with_commit_bases(mut self, b: &[u8; 32]) -> Journal {
        for (k, v) in self.bases.iter_mut().enumerate() {
            *v = u64::from_le_bytes(b[k * 8..][..8].try_into().expect("8 bytes"));
        }
        self
    }

    /// What the kernel's `section_mac` hashes for section `i` (`section`, its bytes):
    /// with `FIXED_HMAC` the superblock's salt and le64(i), then every entry's sector field.
    pub fn mac_input(&self, i: u32, salt: Option<&[u8; 16]>, section: &[u8]) -> Vec<u8> {
        let mut input = Vec::with_capacity(24 + 8 * self.entries_per_section);
        if let Some(salt) = salt {
            input.extend_from_slice(salt);
            input.extend_from_slice(&u64::from(i).to_le_bytes());
        }
        for e in 0..self.entries_per_section {
            let (at, _) = self.entry_at(e);
            input.extend_from_slice(&section[at..at + 8]);
        }
        input
    }

    /// The section's MAC as stored: 8 bytes from each entry sector.
    pub fn stored_mac(&self, section: &[u8]) -> [u8; SECTION_MAC_BYTES] {
        let mut mac = [0u8; SECTION_MAC_BYTES];
        for (j, m) in mac.chunks_exact_mut(MAC_PER_SECTOR).enumerate() {
            m.copy_from_slice(&section[j * 512 + SECTOR_DATA - MAC_PER_SECTOR..][..MAC_PER_SECTOR]);
        }
        mac
    }

    /// Stores `mac` (the digest cut or zero-padded to [`SECTION_MAC_BYTES`]) in the entry
    /// sectors of `section`.
    pub fn set_mac(&self, section: &mut [u8], mac: &[u8; SECTION_MAC_BYTES]) {
        for (j, m) in mac.chunks_exact(MAC_PER_SECTOR).enumerate() {
            section[j * 512 + SECTOR_DATA - MAC_PER_SECTOR..][..MAC_PER_SECTOR].copy_from_slice(m);
        }
    }

    /// Byte offset of section `i` on the device.
    pub fn section_offset(&self, i: u32) -> u64 {
        self.offset + u64::from(i) * self.section_sectors * 512
    }

    /// Bytes of one section.
    pub fn section_bytes(&self) -> usize {
        self.section_sectors as usize * 512
    }

    /// Bytes of the whole journal (from [`Journal::section_offset`]`(0)`).
    pub fn bytes(&self) -> u64 {
        u64::from(self.sections) * self.section_sectors * 512
    }

    /// The commit id of sector `j` of section `i` in pass `seq` (`dm_integrity_commit_id`).
    pub fn commit_id(&self, i: u32, j: u64, seq: u8) -> [u8; 8] {
        let base = self.bases[usize::from(seq)];
        (base ^ ((u64::from(i) << 32) ^ j)).to_le_bytes()
    }

    fn entry_at(&self, n: usize) -> (usize, usize) {
        let sector = n % ENTRY_SECTORS;
        (sector * 512 + (n / ENTRY_SECTORS) * self.entry_size, sector)
    }

    /// What the kernel's `replay_journal` does with `journal` (all sections, as read).
    pub fn replay(&self, journal: &[u8]) -> Replay {
        let n = self.sections as usize;
        let ss = self.section_bytes();
        assert_eq!(journal.len(), n * ss, "the whole journal");
        let section = |i: usize| &journal[i * ss..][..ss];
        let id_at = |i: usize, j: usize| -> &[u8] { &section(i)[j * 512 + SECTOR_DATA..][..8] };
        let mut used = [false; N_COMMIT_IDS as usize];
        let mut max_section = [0usize; N_COMMIT_IDS as usize];
        let mut empty = true;
        let cleared = |last_used| Replay {
            entries: Vec::new(),
            last_used,
            consistent: false,
            sections: Vec::new(),
        };
        for i in 0..n {
            for j in 0..self.section_sectors as usize {
                let Some(k) = (0..N_COMMIT_IDS)
                    .find(|&k| id_at(i, j) == self.commit_id(i as u32, j as u64, k))
                else {
                    return cleared(0);
                };
                used[k as usize] = true;
                max_section[k as usize] = i;
            }
            if empty {
                empty = (0..self.entries_per_section).all(|e| self.unused(section(i), e));
            }
        }
        let prev = |s: u8| (s + N_COMMIT_IDS - 1) % N_COMMIT_IDS;
        let next = |s: u8| (s + 1) % N_COMMIT_IDS;
        let unused = if !used[3] {
            let mut u = 3u8;
            while u > 0 && !used[u as usize - 1] {
                u -= 1;
            }
            u
        } else {
            match (0..N_COMMIT_IDS).find(|&k| !used[k as usize]) {
                Some(u) => u,
                None => return cleared(0),
            }
        };
        let last_used = prev(unused);
        let mut want = prev(last_used);
        if !used[want as usize] && used[prev(want) as usize] {
            empty = true;
        }
        let mut start = max_section[last_used as usize] + 1;
        if start >= n {
            want = next(want);
            start = 0;
        }
        let mut order = Vec::new();
        let mut i = start;
        'scan: for _ in 0..n {
            for j in 0..self.section_sectors as usize {
                if id_at(i, j) != self.commit_id(i as u32, j as u64, want) {
                    break 'scan;
                }
            }
            order.push(i);
            i += 1;
            if i >= n {
                want = next(want);
                i = 0;
            }
        }
        let mut entries = Vec::new();
        if empty {
            order.clear();
        }
        for &i in &order {
            self.entries_of(section(i), &mut entries);
        }
        Replay {
            entries,
            last_used,
            consistent: true,
            sections: order.iter().map(|&i| i as u32).collect(),
        }
    }

    fn unused(&self, section: &[u8], e: usize) -> bool {
        let (at, _) = self.entry_at(e);
        u32::from_le_bytes(section[at + 4..at + 8].try_into().unwrap()) == UNUSED_HI
    }

    /// The used entries of one section, with their data as it goes home.
    fn entries_of(&self, section: &[u8], out: &mut Vec<JournalEntry>) {
        for e in 0..self.entries_per_section {
            if self.unused(section, e) {
                continue;
            }
            let (at, _) = self.entry_at(e);
            let mut sector = u64::from_le_bytes(section[at..at + 8].try_into().unwrap());
            // The kernel rounds a misaligned sector down (and reports it); an entry past
            // the end (or one that was in progress) is skipped.
            sector &= !(self.spb as u64 - 1);
            if sector >= self.provided_data_sectors {
                continue;
            }
            let data_at = (ENTRY_SECTORS + e * self.spb) * 512;
            let mut data = section[data_at..][..self.spb * 512].to_vec();
            for s in 0..self.spb {
                let last = &section[at + 8 + 8 * s..][..8];
                data[s * 512 + SECTOR_DATA..][..8].copy_from_slice(last);
            }
            let tag = section[at + 8 + 8 * self.spb..][..self.tag_size].to_vec();
            out.push(JournalEntry { sector, data, tag });
        }
    }

    /// Section `i` of pass `seq` holding `entries` (at most
    /// [`Journal::entries_per_section`]; the rest unused), as the kernel commits it.
    pub fn section(&self, i: u32, seq: u8, entries: &[JournalEntry]) -> Vec<u8> {
        self.section_of(
            i,
            seq,
            entries.iter().map(|e| (e.sector, &e.data[..], &e.tag[..])),
        )
    }

    /// [`Journal::section`] from borrowed entries: (first logical sector, block, tag).
    pub fn section_of<'a>(
        &self,
        i: u32,
        seq: u8,
        entries: impl ExactSizeIterator<Item = (u64, &'a [u8], &'a [u8])>,
    ) -> Vec<u8> {
        assert!(entries.len() <= self.entries_per_section);
        // The entry sectors zeroed, then each journal sector appended in order: zeroing
        // the whole section first cost as much as a fifth of a journal write.
        let mut s = Vec::with_capacity(self.section_bytes());
        s.resize(ENTRY_SECTORS * 512, 0);
        for e in 0..self.entries_per_section {
            let (at, _) = self.entry_at(e);
            s[at + 4..at + 8].copy_from_slice(&UNUSED_HI.to_le_bytes());
        }
        for (e, (sector, data, tag)) in entries.enumerate() {
            let (at, _) = self.entry_at(e);
            s[at..at + 8].copy_from_slice(&sector.to_le_bytes());
            for k in 0..self.spb {
                let src = &data[k * 512..][..512];
                s[at + 8 + 8 * k..][..8].copy_from_slice(&src[SECTOR_DATA..]);
                let j = (s.len() / 512) as u64;
                s.extend_from_slice(&src[..SECTOR_DATA]);
                s.extend_from_slice(&self.commit_id(i, j, seq));
            }
            s[at + 8 + 8 * self.spb..][..self.tag_size].copy_from_slice(tag);
        }
        // The unused entries' sectors (and any the section has past them): zeros.
        for j in (s.len() / 512) as u64..self.section_sectors {
            s.resize(s.len() + SECTOR_DATA, 0);
            s.extend_from_slice(&self.commit_id(i, j, seq));
        }
        for j in 0..ENTRY_SECTORS {
            s[j * 512 + SECTOR_DATA..][..8].copy_from_slice(&self.commit_id(i, j as u64, seq));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal(tag: u16, bs: u32) -> (Journal, Geometry) {
        let sb = Geometry::format(40 << 11, 16 << 11, tag, bs).unwrap();
        let g = Geometry::of(&sb, 16 << 11);
        (Journal::of(&sb, &g).unwrap(), g)
    }

    fn entry(sector: u64, bs: usize, tag: usize, fill: u8) -> JournalEntry {
        JournalEntry {
            sector,
            data: (0..bs).map(|i| fill ^ (i as u8)).collect(),
            tag: vec![fill; tag],
        }
    }

    fn ring(j: &Journal, seqs: &[(u8, Vec<JournalEntry>)]) -> Vec<u8> {
        seqs.iter()
            .enumerate()
            .flat_map(|(i, (seq, e))| j.section(i as u32, *seq, e))
            .collect()
    }

    #[test]
    fn a_formatted_journal_is_empty() {
        let (j, _) = journal(28, 512);
        assert_eq!(j.entries_per_section, 80);
        assert_eq!(j.section_sectors, 88);
        let all: Vec<_> = (0..j.sections).map(|_| (0, vec![])).collect();
        let r = j.replay(&ring(&j, &all));
        assert!(r.consistent);
        assert!(r.entries.is_empty());
        assert_eq!(r.last_used, 0);
    }

    /// A section byte by byte as the kernel's commit lays it out: every sector ending in
    /// its commit id, each entry's block in its sectors' first 504 bytes and their last 8
    /// in the entry, the unused entries marked and their sectors zero.
    #[test]
    fn a_section_is_laid_out_as_the_kernel_commits_it() {
        for (tag, bs, used) in [(28u16, 512u32, 3usize), (32, 4096, 2), (28, 512, 80)] {
            let (j, _) = journal(tag, bs);
            let (bs, tag) = (bs as usize, tag as usize);
            let spb = bs / 512;
            let es: Vec<_> = (0..used)
                .map(|e| entry((e * spb) as u64 * 3, bs, tag, 0x40 + e as u8))
                .collect();
            let s = j.section(7, 2, &es);
            assert_eq!(s.len(), j.section_bytes());
            for (k, sector) in s.chunks_exact(512).enumerate() {
                assert_eq!(
                    sector[SECTOR_DATA..],
                    j.commit_id(7, k as u64, 2),
                    "sector {k}"
                );
            }
            for e in 0..j.entries_per_section {
                let (at, _) = j.entry_at(e);
                let data = &s[(ENTRY_SECTORS + e * spb) * 512..][..spb * 512];
                match es.get(e) {
                    Some(x) => {
                        assert_eq!(s[at..at + 8], x.sector.to_le_bytes());
                        for k in 0..spb {
                            let src = &x.data[k * 512..][..512];
                            assert_eq!(data[k * 512..][..SECTOR_DATA], src[..SECTOR_DATA]);
                            assert_eq!(s[at + 8 + 8 * k..][..8], src[SECTOR_DATA..]);
                        }
                        assert_eq!(s[at + 8 + 8 * spb..][..tag], x.tag[..]);
                    }
                    None => {
                        assert_eq!(s[at + 4..at + 8], UNUSED_HI.to_le_bytes());
                        assert!(data.chunks_exact(512).all(|d| d[..SECTOR_DATA] == [0; 504]));
                    }
                }
            }
        }
    }

    #[test]
    fn entries_come_back_in_ring_order() {
        for (tag, bs) in [(28u16, 512u32), (32, 4096), (48, 512)] {
            let (j, _) = journal(tag, bs);
            let (bs, tag) = (bs as usize, tag as usize);
            let spb = bs as u64 / 512;
            let n = j.sections as usize;
            // Pass 1 in sections 0 and 1, pass 0 (older, already home) in the rest.
            let mut secs: Vec<(u8, Vec<JournalEntry>)> = (0..n)
                .map(|i| (0, vec![entry(spb * i as u64, bs, tag, 0x10 + i as u8)]))
                .collect();
            secs[0] = (
                1,
                vec![entry(0, bs, tag, 0xa0), entry(spb * 5, bs, tag, 0xa1)],
            );
            secs[1] = (1, vec![entry(spb, bs, tag, 0xb0)]);
            let r = j.replay(&ring(&j, &secs));
            assert!(r.consistent);
            assert_eq!(r.last_used, 1);
            let fills: Vec<u8> = r.entries.iter().map(|e| e.tag[0]).collect();
            let mut want: Vec<u8> = (2..n).map(|i| 0x10 + i as u8).collect();
            want.extend([0xa0, 0xa1, 0xb0]);
            assert_eq!(fills, want, "tag {tag} block {bs}");
            assert_eq!(
                r.entries[n - 2],
                entry(0, bs, tag, 0xa0),
                "data and last bytes"
            );
            assert_eq!(r.erase_and_next_seq(), (3, 0));
        }
    }

    #[test]
    fn a_torn_section_ends_the_replay() {
        let (j, _) = journal(28, 512);
        let n = j.sections as usize;
        let mut secs: Vec<(u8, Vec<JournalEntry>)> = (0..n).map(|_| (0, vec![])).collect();
        secs[0] = (1, vec![entry(8, 512, 28, 1)]);
        secs[1] = (1, vec![entry(16, 512, 28, 2)]);
        let mut bytes = ring(&j, &secs);
        // Section 1 half written: one of its data sectors still carries pass 0's id.
        let at = j.section_bytes() + 50 * 512 + SECTOR_DATA;
        bytes[at..at + 8].copy_from_slice(&j.commit_id(1, 50, 0));
        let r = j.replay(&bytes);
        assert_eq!(r.entries.iter().map(|e| e.sector).collect::<Vec<_>>(), [8]);
        // A sector with no commit id of its place: nothing is applied.
        bytes[SECTOR_DATA] ^= 1;
        let r = j.replay(&bytes);
        assert!(!r.consistent);
        assert!(r.entries.is_empty());
    }

    #[test]
    fn entries_past_the_end_are_skipped() {
        let (j, g) = journal(28, 512);
        let n = j.sections as usize;
        let mut secs: Vec<(u8, Vec<JournalEntry>)> = (0..n).map(|_| (0, vec![])).collect();
        secs[0] = (
            1,
            vec![
                entry(g.provided_data_sectors, 512, 28, 1),
                entry(g.provided_data_sectors - 1, 512, 28, 2),
            ],
        );
        let r = j.replay(&ring(&j, &secs));
        assert_eq!(r.entries.len(), 1);
        assert_eq!(r.entries[0].sector, g.provided_data_sectors - 1);
    }
}
