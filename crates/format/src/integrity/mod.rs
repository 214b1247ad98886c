//! dm-integrity's on-disk layout (the kernel's `dm-integrity` target, as LUKS2 with
//! integrity and standalone integritysetup volumes use it): the superblock, the journal's
//! size, and where each data block and its tag live in the interleaved areas.
//!
//! The journal is in `journal.rs`; the data path (reading, verifying, writing through the
//! journal) is the volume crate's `integrity.rs`. docs/integrity-format.md gives the rules
//! and their sources; every figure the tests check was read off volumes the 6.12 kernel
//! formatted (`scripts/probe-integrity-layout.sh`).

mod journal;

pub use journal::{Journal, JournalEntry, Replay, SECTION_MAC_BYTES};

use std::fmt;

/// "integrt" and a NUL.
pub const MAGIC: [u8; 8] = *b"integrt\0";
/// The superblock's area: 4 KiB, of which the first 64 bytes are used.
pub const SUPERBLOCK_SECTORS: u64 = 8;
/// Journal sectors carry 8 bytes of commit id each.
const JOURNAL_SECTOR_DATA: u64 = 504;
/// Journal MAC bytes per journal sector when the journal has a MAC.
const JOURNAL_MAC_PER_SECTOR: u64 = 8;
/// The kernel's default interleave: 2^15 data sectors per area.
pub const DEFAULT_LOG2_INTERLEAVE_SECTORS: u8 = 15;
/// The kernel's default journal: 1/128 of the device, at most 64 MiB.
const DEFAULT_JOURNAL_SIZE_FACTOR: u32 = 7;
const DEFAULT_MAX_JOURNAL_SECTORS: u64 = 131_072;
/// The kernel's default bitmap granularity: 2^15 sectors a bit.
const LOG2_DEFAULT_SECTORS_PER_BITMAP_BIT: u8 = 15;

/// Superblock flags.
pub mod flags {
    /// The journal has a MAC (8 bytes of each journal sector).
    pub const HAVE_JOURNAL_MAC: u32 = 0x01;
    /// Tags are being recalculated, up to `recalc_sector`.
    pub const RECALCULATING: u32 = 0x02;
    /// Bitmap mode: the journal area holds the dirty bitmap.
    pub const DIRTY_BITMAP: u32 = 0x04;
    /// Metadata runs are padded to 4 KiB (else 128 KiB).
    pub const FIXED_PADDING: u32 = 0x08;
    /// The salt is mixed into the internal hash and the MACs.
    pub const FIXED_HMAC: u32 = 0x10;
    /// Tags in the device's own metadata (mode 'I'): no journal, no interleave.
    pub const INLINE: u32 = 0x20;
}

/// What can be wrong with a dm-integrity superblock or geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IntegrityError {
    /// No "integrt" magic where the superblock should be.
    NoSuperblock,
    /// A field outside what the kernel accepts; the text names it.
    Invalid(String),
    /// A layout this implementation does not handle yet (inline tags, a metadata device).
    Unsupported(String),
    /// The device is too small for the superblock, the journal and one block.
    TooSmall {
        /// Sectors of the device.
        sectors: u64,
    },
}

impl fmt::Display for IntegrityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IntegrityError::NoSuperblock => write!(f, "no dm-integrity superblock"),
            IntegrityError::Invalid(s) => write!(f, "invalid dm-integrity superblock: {s}"),
            IntegrityError::Unsupported(s) => write!(f, "unsupported dm-integrity layout: {s}"),
            IntegrityError::TooSmall { sectors } => write!(
                f,
                "device of {sectors} sectors is too small for dm-integrity's metadata"
            ),
        }
    }
}

/// The 64-byte superblock (little-endian fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// 1..=6; the kernel picks the lowest that has the flags used.
    pub version: u8,
    /// log2 of the data sectors between two metadata runs.
    pub log2_interleave_sectors: u8,
    /// Bytes of tag per block.
    pub tag_size: u16,
    /// Journal sections (the journal's size, in the unit [`Geometry::journal_section_sectors`]).
    pub journal_sections: u32,
    /// The size of the device dm-integrity provides, in 512-byte sectors.
    pub provided_data_sectors: u64,
    /// [`flags`].
    pub flags: u32,
    /// log2 of the block size in 512-byte sectors (0 for 512, 3 for 4096).
    pub log2_sectors_per_block: u8,
    /// Bitmap mode's granularity.
    pub log2_blocks_per_bitmap_bit: u8,
    /// How far recalculation has got, when [`flags::RECALCULATING`].
    pub recalc_sector: u64,
    /// Random salt, when [`flags::FIXED_HMAC`].
    pub salt: [u8; 16],
}

impl Superblock {
    /// Parses the first 64 bytes of the superblock area.
    pub fn parse(b: &[u8]) -> Result<Superblock, IntegrityError> {
        if b.len() < 64 || b[..8] != MAGIC {
            return Err(IntegrityError::NoSuperblock);
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let sb = Superblock {
            version: b[8],
            log2_interleave_sectors: b[9],
            tag_size: u16_at(10),
            journal_sections: u32_at(12),
            provided_data_sectors: u64_at(16),
            flags: u32_at(24),
            log2_sectors_per_block: b[28],
            log2_blocks_per_bitmap_bit: b[29],
            recalc_sector: u64_at(32),
            salt: b[48..64].try_into().unwrap(),
        };
        sb.check()?;
        Ok(sb)
    }

    /// The 64 bytes [`Superblock::parse`] reads (the rest of the 4 KiB area is zero).
    pub fn to_bytes(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(&MAGIC);
        b[8] = self.version;
        b[9] = self.log2_interleave_sectors;
        b[10..12].copy_from_slice(&self.tag_size.to_le_bytes());
        b[12..16].copy_from_slice(&self.journal_sections.to_le_bytes());
        b[16..24].copy_from_slice(&self.provided_data_sectors.to_le_bytes());
        b[24..28].copy_from_slice(&self.flags.to_le_bytes());
        b[28] = self.log2_sectors_per_block;
        b[29] = self.log2_blocks_per_bitmap_bit;
        b[32..40].copy_from_slice(&self.recalc_sector.to_le_bytes());
        b[48..64].copy_from_slice(&self.salt);
        b
    }

    /// Where the superblock's MAC goes in its first 512-byte sector (`sb_mac`: a journal
    /// MAC of `mac_size` bytes, with `FIXED_HMAC`): the MAC covers the bytes before it.
    pub fn mac_at(mac_size: usize) -> usize {
        512 - mac_size
    }

    /// What `integritysetup dump` prints for the device `shown`, line for line.
    pub fn dump(&self, shown: &str) -> String {
        let mut out = format!(
            "Info for integrity device {shown}.\n\
             superblock_version {}\n\
             log2_interleave_sectors {}\n\
             integrity_tag_size {}\n\
             journal_sections {}\n\
             provided_data_sectors {}\n\
             sector_size {}\n",
            self.version,
            self.log2_interleave_sectors,
            self.tag_size,
            self.journal_sections,
            self.provided_data_sectors,
            512u32 << self.log2_sectors_per_block
        );
        if self.version >= 2 && self.flags & flags::RECALCULATING != 0 {
            out += &format!("recalc_sector {}\n", self.recalc_sector);
        }
        out += &format!(
            "log2_blocks_per_bitmap {}\nflags ",
            self.log2_blocks_per_bitmap_bit
        );
        for (bit, name) in [
            (flags::HAVE_JOURNAL_MAC, "have_journal_mac"),
            (flags::RECALCULATING, "recalculating"),
            (flags::DIRTY_BITMAP, "dirty_bitmap"),
            (flags::FIXED_PADDING, "fix_padding"),
            (flags::FIXED_HMAC, "fix_hmac"),
        ] {
            if self.flags & bit != 0 {
                out += name;
                out.push(' ');
            }
        }
        out.push('\n');
        out
    }

    /// The version the kernel writes for these flags (`sb_set_version`), in bitmap mode
    /// or not.
    pub fn version_for(flag_bits: u32, bitmap_mode: bool) -> u8 {
        if flag_bits & flags::INLINE != 0 {
            6
        } else if flag_bits & flags::FIXED_HMAC != 0 {
            5
        } else if flag_bits & flags::FIXED_PADDING != 0 {
            4
        } else if bitmap_mode || flag_bits & flags::DIRTY_BITMAP != 0 {
            3
        } else if flag_bits & flags::RECALCULATING != 0 {
            2
        } else {
            1
        }
    }

    fn check(&self) -> Result<(), IntegrityError> {
        let bad = |s: &str| Err(IntegrityError::Invalid(s.into()));
        if !(1..=6).contains(&self.version) {
            return bad(&format!("version {}", self.version));
        }
        if self.flags & flags::INLINE != 0 {
            return Err(IntegrityError::Unsupported("inline tags (mode 'I')".into()));
        }
        if !(3..=31).contains(&self.log2_interleave_sectors) {
            // 0 is a separate metadata device, which LUKS2 never uses.
            return Err(IntegrityError::Unsupported(format!(
                "log2 interleave sectors {} (a separate metadata device?)",
                self.log2_interleave_sectors
            )));
        }
        if self.log2_sectors_per_block > 3 {
            return bad(&format!(
                "block size 2^{} sectors",
                self.log2_sectors_per_block
            ));
        }
        if self.log2_interleave_sectors < self.log2_sectors_per_block {
            return bad("interleave smaller than a block");
        }
        if u32::from(self.log2_sectors_per_block) + u32::from(self.log2_blocks_per_bitmap_bit) > 40
        {
            // A bitmap bit over more than 2^40 sectors (512 TiB): no kernel writes that.
            return bad(&format!(
                "log2 blocks per bitmap bit {}",
                self.log2_blocks_per_bitmap_bit
            ));
        }
        if self.tag_size == 0 || self.tag_size > 424 {
            return bad(&format!("tag size {}", self.tag_size));
        }
        if self.journal_sections == 0 {
            return bad("no journal sections");
        }
        if self.flags & !0x1f != 0 {
            return bad(&format!("unknown flags {:#x}", self.flags));
        }
        Ok(())
    }
}

/// Where things are on a dm-integrity device, from its superblock and its offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// The superblock's sector on the underlying device (LUKS2: the data segment offset).
    pub start: u64,
    /// log2 of the data sectors per area.
    pub log2_interleave_sectors: u8,
    /// log2 of the block size in sectors.
    pub log2_sectors_per_block: u8,
    /// Bytes of tag per block.
    pub tag_size: u64,
    /// Sectors of one journal section.
    pub journal_section_sectors: u64,
    /// Superblock and journal, in sectors from `start`.
    pub initial_sectors: u64,
    /// Sectors of tags ahead of each area's data.
    pub metadata_run: u64,
    /// The size of the device dm-integrity provides, in sectors.
    pub provided_data_sectors: u64,
}

/// Sectors of one journal section (`calculate_journal_section_size`).
fn journal_section_sectors(tag_size: u64, log2_spb: u8, journal_mac: bool) -> u64 {
    let entry = (8 + (8 << log2_spb) + tag_size).div_ceil(8) * 8;
    let space = JOURNAL_SECTOR_DATA
        - if journal_mac {
            JOURNAL_MAC_PER_SECTOR
        } else {
            0
        };
    let entries_per_section = (space / entry) * 8;
    (entries_per_section << log2_spb) + 8
}

/// Sectors of tags ahead of each area (`calculate_device_limits`).
fn metadata_run(tag_size: u64, log2_interleave: u8, log2_spb: u8, fixed_padding: bool) -> u64 {
    let padding: u64 = if fixed_padding { 4096 } else { 128 << 10 };
    (tag_size << (log2_interleave - log2_spb)).div_ceil(padding) * padding / 512
}

impl Geometry {
    /// The layout of an existing device whose superblock is at sector `start`.
    pub fn of(sb: &Superblock, start: u64) -> Geometry {
        let tag_size = u64::from(sb.tag_size);
        let section = journal_section_sectors(
            tag_size,
            sb.log2_sectors_per_block,
            sb.flags & flags::HAVE_JOURNAL_MAC != 0,
        );
        Geometry {
            start,
            log2_interleave_sectors: sb.log2_interleave_sectors,
            log2_sectors_per_block: sb.log2_sectors_per_block,
            tag_size,
            journal_section_sectors: section,
            initial_sectors: SUPERBLOCK_SECTORS + u64::from(sb.journal_sections) * section,
            metadata_run: metadata_run(
                tag_size,
                sb.log2_interleave_sectors,
                sb.log2_sectors_per_block,
                sb.flags & flags::FIXED_PADDING != 0,
            ),
            provided_data_sectors: sb.provided_data_sectors,
        }
    }

    /// The superblock the kernel writes when it formats `device_sectors` (the whole
    /// underlying device) with the superblock at `start`, LUKS2's way: tags of `tag_size`
    /// bytes per block of `block_size` bytes, journal mode, the default interleave and
    /// journal size, fixed padding, no journal MAC.
    pub fn format(
        device_sectors: u64,
        start: u64,
        tag_size: u16,
        block_size: u32,
    ) -> Result<Superblock, IntegrityError> {
        Geometry::format_with(device_sectors, start, tag_size, block_size, false)
    }

    /// [`Geometry::format`], with a journal MAC (`HAVE_JOURNAL_MAC`: 8 bytes of each of a
    /// section's entry sectors hold it) when `journal_mac`.
    pub fn format_with(
        device_sectors: u64,
        start: u64,
        tag_size: u16,
        block_size: u32,
        journal_mac: bool,
    ) -> Result<Superblock, IntegrityError> {
        if !(block_size.is_power_of_two() && (512..=4096).contains(&block_size)) {
            return Err(IntegrityError::Invalid(format!("block size {block_size}")));
        }
        let log2_spb = (block_size / 512).trailing_zeros() as u8;
        let section = journal_section_sectors(u64::from(tag_size), log2_spb, journal_mac);
        let mac_flag = if journal_mac {
            flags::HAVE_JOURNAL_MAC
        } else {
            0
        };
        let journal_sectors =
            (device_sectors >> DEFAULT_JOURNAL_SIZE_FACTOR).min(DEFAULT_MAX_JOURNAL_SECTORS);
        let journal_sections = (journal_sectors / section).max(1);
        let mut sb = Superblock {
            version: Superblock::version_for(flags::FIXED_PADDING | mac_flag, false),
            log2_interleave_sectors: DEFAULT_LOG2_INTERLEAVE_SECTORS,
            tag_size,
            journal_sections: u32::try_from(journal_sections)
                .map_err(|_| IntegrityError::Invalid("journal too large".into()))?,
            provided_data_sectors: 0,
            flags: flags::FIXED_PADDING | mac_flag,
            log2_sectors_per_block: log2_spb,
            log2_blocks_per_bitmap_bit: LOG2_DEFAULT_SECTORS_PER_BITMAP_BIT - log2_spb,
            recalc_sector: 0,
            salt: [0; 16],
        };
        sb.check()?;
        let g = Geometry::of(&sb, start);
        sb.provided_data_sectors = g.largest_provided(device_sectors)?;
        Ok(sb)
    }

    /// The kernel's `get_provided_data_sectors`: the largest multiple of 8 sectors whose
    /// last sector, with the metadata before it, still fits on the device.
    pub fn largest_provided(&self, device_sectors: u64) -> Result<u64, IntegrityError> {
        if self.start + self.initial_sectors + 8 >= device_sectors {
            return Err(IntegrityError::TooSmall {
                sectors: device_sectors,
            });
        }
        let fits = |p: u64| p > 0 && self.data_sector(p - 1) < device_sectors;
        let mut p = 0u64;
        for bit in (3..64 - device_sectors.leading_zeros()).rev() {
            let with = p | 1 << bit;
            if fits(with) {
                p = with;
            }
        }
        if p == 0 {
            return Err(IntegrityError::TooSmall {
                sectors: device_sectors,
            });
        }
        Ok(p)
    }

    /// The sector on the underlying device that holds logical sector `s`.
    pub fn data_sector(&self, s: u64) -> u64 {
        let l = self.log2_interleave_sectors;
        let (area, offset) = (s >> l, s & ((1u64 << l) - 1));
        self.start + self.initial_sectors + (area << l) + (area + 1) * self.metadata_run + offset
    }

    /// The byte on the underlying device where the tag of the block holding logical sector
    /// `s` starts. Tags are packed back to back from the start of the area's metadata run,
    /// across 512-byte sector boundaries.
    pub fn tag_offset(&self, s: u64) -> u64 {
        let l = self.log2_interleave_sectors;
        let (area, offset) = (s >> l, s & ((1u64 << l) - 1));
        let run_start =
            self.start + self.initial_sectors + area * ((1u64 << l) + self.metadata_run);
        run_start * 512 + (offset >> self.log2_sectors_per_block) * self.tag_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Volumes the 6.12 kernel formatted (`scripts/probe-integrity-layout.sh`): a 40 MiB
    /// device, the superblock at 16 MiB (LUKS2's data offset), and what it wrote:
    /// (tag size, block size, journal sections, metadata run, provided sectors).
    const KERNEL: [(u16, u32, u32, u64, u64); 5] = [
        (28, 512, 7, 1792, 44944),  // aes-gcm-random, chacha20-random + poly1305
        (28, 4096, 2, 224, 48168),  // aes-gcm-random, 4 KiB sectors
        (32, 512, 7, 2048, 44432),  // aes-xts-plain64 + hmac-sha256
        (32, 4096, 2, 256, 48104),  // the same, 4 KiB sectors
        (48, 512, 10, 3072, 42360), // aes-xts-random + hmac-sha256
    ];

    #[test]
    fn format_gives_what_the_kernel_wrote() {
        for (tag, bs, sections, run, provided) in KERNEL {
            let sb = Geometry::format(40 << 11, 16 << 11, tag, bs).unwrap();
            assert_eq!(sb.version, 4);
            assert_eq!(sb.flags, flags::FIXED_PADDING);
            assert_eq!(sb.journal_sections, sections, "tag {tag} block {bs}");
            assert_eq!(sb.provided_data_sectors, provided, "tag {tag} block {bs}");
            let g = Geometry::of(&sb, 16 << 11);
            assert_eq!(g.metadata_run, run, "tag {tag} block {bs}");
            // The last block fits on the device, and one more would not.
            assert!(g.data_sector(provided - 1) < 40 << 11);
            assert!(g.data_sector(provided + 7) >= 40 << 11);
            assert_eq!(Superblock::parse(&sb.to_bytes()).unwrap(), sb);
        }
    }

    /// Byte for byte what the kernel wrote (`kernel-superblocks.txt`).
    #[test]
    fn format_writes_the_kernels_superblock_bytes() {
        let text = include_str!("kernel-superblocks.txt");
        let mut n = 0;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let kernel: Vec<u8> = (0..f[2].len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&f[2][i..i + 2], 16).unwrap())
                .collect();
            let sb = Geometry::format(
                40 << 11,
                16 << 11,
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
            )
            .unwrap();
            assert_eq!(sb.to_bytes()[..], kernel[..], "{line}");
            assert_eq!(Superblock::parse(&kernel).unwrap(), sb);
            n += 1;
        }
        assert_eq!(n, 5);
    }

    #[test]
    fn blocks_and_tags_sit_where_the_kernel_put_them() {
        // aes-gcm-random, 512-byte sectors: initial sectors 8 + 7 x 88 = 624.
        let sb = Geometry::format(40 << 11, 16 << 11, 28, 512).unwrap();
        let g = Geometry::of(&sb, 16 << 11);
        assert_eq!(g.journal_section_sectors, 88);
        assert_eq!(g.initial_sectors, 624);
        let first_run = 32768 + 624;
        assert_eq!(g.tag_offset(0), first_run * 512);
        assert_eq!(g.tag_offset(9), first_run * 512 + 9 * 28);
        assert_eq!(g.data_sector(0), first_run + 1792);
        // The second area: its own metadata run after the first area's data.
        let second_run = first_run + 1792 + 32768;
        assert_eq!(g.data_sector(32768), second_run + 1792);
        assert_eq!(g.tag_offset(32769), second_run * 512 + 28);
        // 4 KiB blocks: one tag per 8 sectors.
        let sb = Geometry::format(40 << 11, 16 << 11, 32, 4096).unwrap();
        let g = Geometry::of(&sb, 16 << 11);
        assert_eq!(g.journal_section_sectors, 264);
        assert_eq!(g.tag_offset(16) - g.tag_offset(8), 32);
    }

    #[test]
    fn hostile_superblocks_are_refused() {
        let good = Geometry::format(40 << 11, 0, 28, 512).unwrap().to_bytes();
        assert_eq!(
            Superblock::parse(&[0u8; 64]),
            Err(IntegrityError::NoSuperblock)
        );
        assert_eq!(
            Superblock::parse(&good[..63]),
            Err(IntegrityError::NoSuperblock)
        );
        for (off, val) in [
            (8, 0u8),
            (8, 7),
            (9, 2),
            (9, 40),
            (28, 4),
            (10, 0),
            (12, 0),
            (24, 0x40),
            (29, 60),
        ] {
            let mut b = good;
            b[off] = val;
            if off == 10 {
                b[11] = 0;
            }
            if off == 12 {
                b[13..16].fill(0);
            }
            assert!(Superblock::parse(&b).is_err(), "byte {off} = {val}");
        }
        let mut b = good;
        b[24] |= flags::INLINE as u8;
        assert!(matches!(
            Superblock::parse(&b),
            Err(IntegrityError::Unsupported(_))
        ));
        assert!(matches!(
            Geometry::format(1000, 0, 28, 512),
            Err(IntegrityError::TooSmall { .. })
        ));
        assert!(Geometry::format(1 << 20, 0, 28, 1024 * 3).is_err());
    }
}
