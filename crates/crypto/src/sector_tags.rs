//! What dm-integrity keeps a tag for: whole sectors turned into the bytes stored and a tag
//! per sector, and checked back. Two kinds slot in behind [`SectorTags`]: dm-crypt's
//! authenticated encryption ([`crate::AeadSectorCipher`], LUKS2 with integrity) and
//! dm-integrity's own checksum ([`crate::IntegrityHash`], standalone integritysetup
//! volumes).

/// Seals and checks whole sectors with a tag each, as the layer above dm-integrity does.
pub trait SectorTags: Send + Sync + std::fmt::Debug {
    /// Bytes of tag per sector (the dm-integrity superblock's tag size).
    fn tag_size(&self) -> usize;
    /// The sector (dm-integrity block) size in bytes.
    fn sector_size(&self) -> u32;
    /// What `status` calls it: `aes-gcm-random + aead`, `crc32c`...
    fn description(&self) -> &str;
    /// Whether a tag can be recomputed from the stored bytes alone, and [`SectorTags::seal`]
    /// leaves the data as it is (a checksum: what dm-integrity's recalculation and bitmap
    /// mode need). Not for encryption, whose tags need the plaintext and fresh IVs.
    fn recomputable(&self) -> bool {
        false
    }
    /// Turns `data` (whole sectors; `sector` the first one's index in sector-size units)
    /// into what is stored, in place, and writes each sector's tag into `tags`.
    fn seal(&self, sector: u64, data: &mut [u8], tags: &mut [u8]) -> crate::Result<()>;
    /// Checks `data` against `tags` and turns it back, in place. A sector that fails is
    /// filled with zeros (its bytes are never handed out) and its index in `data` pushed
    /// onto `bad`.
    fn open(
        &self,
        sector: u64,
        data: &mut [u8],
        tags: &[u8],
        bad: &mut Vec<usize>,
    ) -> crate::Result<()>;
}

impl SectorTags for crate::AeadSectorCipher {
    fn tag_size(&self) -> usize {
        crate::AeadSectorCipher::tag_size(self)
    }
    fn sector_size(&self) -> u32 {
        crate::AeadSectorCipher::sector_size(self)
    }
    fn description(&self) -> &str {
        crate::AeadSectorCipher::description(self)
    }
    fn seal(&self, sector: u64, data: &mut [u8], tags: &mut [u8]) -> crate::Result<()> {
        crate::AeadSectorCipher::seal(self, sector, data, tags)
    }
    fn open(
        &self,
        sector: u64,
        data: &mut [u8],
        tags: &[u8],
        bad: &mut Vec<usize>,
    ) -> crate::Result<()> {
        crate::AeadSectorCipher::open(self, sector, data, tags, bad)
    }
}
