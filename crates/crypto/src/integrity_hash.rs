//! dm-integrity's own checksum (its `internal_hash`), as standalone integritysetup volumes
//! use it: each block's tag is a hash of the block, the data stored as it is. The kernel's
//! `integrity_sector_checksum` hashes, in order: the superblock's salt (only when the
//! superblock has `FIXED_HMAC`), le64(the block's first 512-byte sector on the provided
//! device), the block; the digest is cut to the tag size or padded with zeros.
//!
//! The names are integritysetup's `--integrity`: `crc32c` (its default; the kernel's
//! `crc32c`: the usual CRC-32C), `crc32` (the kernel's `crc32` shash: no inversions), a
//! hash (`sha256`, `sha1`, `sha512`, `blake2b-512`...) or a keyed `hmac-sha1`,
//! `hmac-sha256`, `hmac-sha512`.

use crate::secret::SecretBytes;
use crate::sha256_lanes::{MESSAGES, Sha256Lanes};
use crate::{Error, HashAlg, Result};

/// The hashes the kernel accepts for `hmac(...)` that cryptblk computes.
const HMAC_HASHES: [HashAlg; 3] = [HashAlg::Sha1, HashAlg::Sha256, HashAlg::Sha512];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Alg {
    Crc32c,
    Crc32,
    Hash(HashAlg),
    Hmac(HashAlg),
}

impl Alg {
    fn parse(name: &str) -> Result<Alg> {
        let lower = name.to_ascii_lowercase();
        let unknown = || {
            Error::UnsupportedCipher(format!(
                "integrity algorithm '{name}' (cryptblk computes crc32c, crc32, a hash such \
                 as sha256, or hmac-sha1/-sha256/-sha512)"
            ))
        };
        Ok(match lower.as_str() {
            "crc32c" => Alg::Crc32c,
            "crc32" => Alg::Crc32,
            _ => {
                // cryptsetup's `hmac-sha256` or the kernel's `hmac(sha256)`.
                let keyed = lower.strip_prefix("hmac-").or_else(|| {
                    lower
                        .strip_prefix("hmac(")
                        .and_then(|h| h.strip_suffix(')'))
                });
                match keyed {
                    Some(h) => {
                        let h = HashAlg::from_name(h).map_err(|_| unknown())?;
                        if !HMAC_HASHES.contains(&h) {
                            return Err(unknown());
                        }
                        Alg::Hmac(h)
                    }
                    None => {
                        let h = HashAlg::from_name(&lower).map_err(|_| unknown())?;
                        if h.is_essiv_only() {
                            return Err(unknown());
                        }
                        Alg::Hash(h)
                    }
                }
            }
        })
    }

    fn digest_size(self) -> usize {
        match self {
            Alg::Crc32c | Alg::Crc32 => 4,
            Alg::Hash(h) | Alg::Hmac(h) => h.output_len(),
        }
    }
}

/// The largest tag a block may have (a digest padded with zeros).
const MAX_TAG: usize = 424;

/// One volume's dm-integrity checksum over blocks of a fixed size.
pub struct IntegrityHash {
    alg: Alg,
    key: Option<SecretBytes>,
    /// The superblock's salt, hashed first, when it has `FIXED_HMAC`.
    salt: Option<[u8; 16]>,
    tag_size: usize,
    block: u32,
    name: String,
    /// `sha256` and `hmac-sha256` up to 32 blocks at a time, where the CPU has AVX-512:
    /// set up at the first request (a journal MAC never needs them).
    lanes: std::sync::OnceLock<Option<Sha256Lanes>>,
}

impl std::fmt::Debug for IntegrityHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl IntegrityHash {
    /// The digest size of `name` in bytes: integritysetup's default tag size for it.
    pub fn digest_size_of(name: &str) -> Result<usize> {
        Ok(Alg::parse(name)?.digest_size())
    }

    /// Whether `name` is keyed (needs `--integrity-key-file`).
    pub fn is_keyed(name: &str) -> Result<bool> {
        Ok(matches!(Alg::parse(name)?, Alg::Hmac(_)))
    }

    /// The checksum `name` over `block`-byte blocks with tags of `tag_size` bytes; `key`
    /// for the HMACs (and only for them), `salt` when the superblock has `FIXED_HMAC`.
    pub fn new(
        name: &str,
        key: Option<&[u8]>,
        tag_size: usize,
        block: u32,
        salt: Option<[u8; 16]>,
    ) -> Result<IntegrityHash> {
        if !(512..=4096).contains(&block) || !block.is_power_of_two() {
            return Err(Error::InvalidSectorSize(block));
        }
        let alg = Alg::parse(name)?;
        let key = match (alg, key) {
            (Alg::Hmac(_), Some(k)) if !k.is_empty() => Some(SecretBytes::from_slice(k)),
            (Alg::Hmac(_), _) => {
                return Err(Error::UnsupportedCipher(format!(
                    "{name} needs a key (--integrity-key-file)"
                )));
            }
            (_, Some(_)) => {
                return Err(Error::UnsupportedCipher(format!("{name} takes no key")));
            }
            (_, None) => None,
        };
        if tag_size == 0 || tag_size > MAX_TAG {
            return Err(Error::UnsupportedCipher(format!("tag size {tag_size}")));
        }
        Ok(IntegrityHash {
            alg,
            key,
            lanes: std::sync::OnceLock::new(),
            salt,
            tag_size,
            block,
            name: name.to_ascii_lowercase(),
        })
    }

    /// The tag of one block whose first 512-byte sector is `sector`, into `out` (the tag
    /// size).
    fn tag(&self, sector: u64, block: &[u8], out: &mut [u8]) {
        let le = sector.to_le_bytes();
        let mut parts: [&[u8]; 3] = [&[], &le, block];
        if let Some(s) = &self.salt {
            parts[0] = s;
        }
        self.digest(&parts, out);
    }

    /// The lanes for this algorithm, where they run (built at the first call).
    fn lanes(&self) -> Option<&Sha256Lanes> {
        self.lanes
            .get_or_init(|| match self.alg {
                Alg::Hash(HashAlg::Sha256) | Alg::Hmac(HashAlg::Sha256)
                    if crate::sha256_lanes::fits(24, self.block as usize) =>
                {
                    Sha256Lanes::new(self.key.as_deref())
                }
                _ => None,
            })
            .as_ref()
    }

    /// Each block's tag (blocks of `data` from the one whose first 512-byte sector is
    /// `sector`), handed to `each` with the block's index: up to 32 blocks side by side
    /// where the lanes run and there are enough, else one by one. Keyed, the stack its
    /// frames used is wiped after (as deep as the HMAC sector engines reach).
    fn each_tag(&self, sector: u64, data: &[u8], mut each: impl FnMut(usize, &[u8])) {
        let (bs, per) = (self.block as usize, u64::from(self.block / 512));
        let mut buf = [0u8; MAX_TAG];
        let tag = &mut buf[..self.tag_size];
        for (g, group) in data.chunks(MESSAGES * bs).enumerate() {
            let first = g * MESSAGES;
            let k = group.len() / bs;
            match self.lanes() {
                Some(l) if k >= crate::sha256_lanes::WORTH_FROM => {
                    // Each block's prefix: the salt (with FIXED_HMAC), le64(its sector).
                    let p = if self.salt.is_some() { 24 } else { 8 };
                    let pre: [[u8; 24]; MESSAGES] = std::array::from_fn(|i| {
                        let mut x = [0u8; 24];
                        let s = (sector + (first + i) as u64) * per;
                        if let Some(salt) = &self.salt {
                            x[..16].copy_from_slice(salt);
                        }
                        x[p - 8..p].copy_from_slice(&s.to_le_bytes());
                        x
                    });
                    let pre: [&[u8]; MESSAGES] = std::array::from_fn(|i| &pre[i][..p]);
                    let n = tag.len().min(32);
                    for (i, d) in l.blocks(&pre, group, bs)[..k].iter().enumerate() {
                        tag[..n].copy_from_slice(&d[..n]);
                        tag[n..].fill(0);
                        each(first + i, tag);
                    }
                }
                _ => {
                    for (i, b) in group.chunks_exact(bs).enumerate() {
                        self.tag((sector + (first + i) as u64) * per, b, tag);
                        each(first + i, tag);
                    }
                }
            }
        }
        if self.key.is_some() {
            crate::secret::scrub_frames::<{ crate::aead_sector::WIPE_HMAC }>();
        }
    }

    /// The algorithm (keyed where it is an HMAC) over the concatenation of `parts`, cut to
    /// `out`'s length or padded with zeros (as dm-integrity uses a digest: a tag, a journal
    /// section's MAC, the superblock's MAC).
    pub fn digest(&self, parts: &[&[u8]], out: &mut [u8]) {
        let mut digest = [0u8; 64];
        let d = &mut digest[..self.alg.digest_size()];
        match self.alg {
            Alg::Crc32c => {
                let c = parts.iter().fold(0, |c, p| crc32c::crc32c_append(c, p));
                d.copy_from_slice(&c.to_le_bytes());
            }
            Alg::Crc32 => {
                // The kernel's `crc32`: the register from 0, not inverted at either end;
                // crc32fast keeps the inverted one.
                let mut h = crc32fast::Hasher::new_with_initial(!0);
                parts.iter().for_each(|p| h.update(p));
                d.copy_from_slice(&(!h.finalize()).to_le_bytes());
            }
            Alg::Hash(h) => h.digest_parts(parts, d),
            Alg::Hmac(h) => {
                let key = self.key.as_ref().expect("HMACs are built with a key");
                crate::aead_sector::hmac_into(h, key, parts, d);
            }
        }
        let n = out.len().min(d.len());
        out[..n].copy_from_slice(&d[..n]);
        out[n..].fill(0);
        zeroize::Zeroize::zeroize(&mut digest);
    }

    /// The digest's size in bytes.
    pub fn digest_size(&self) -> usize {
        self.alg.digest_size()
    }

    fn check(&self, data: &[u8], tags: &[u8]) -> Result<usize> {
        let bs = self.block as usize;
        if !data.len().is_multiple_of(bs) {
            return Err(Error::UnalignedLength {
                len: data.len(),
                sector_size: self.block,
            });
        }
        let n = data.len() / bs;
        if tags.len() != n * self.tag_size {
            return Err(Error::UnsupportedCipher(format!(
                "{}: {} bytes of tags for {n} blocks",
                self.name,
                tags.len()
            )));
        }
        Ok(n)
    }
}

impl crate::SectorTags for IntegrityHash {
    fn tag_size(&self) -> usize {
        self.tag_size
    }
    fn sector_size(&self) -> u32 {
        self.block
    }
    fn description(&self) -> &str {
        &self.name
    }
    fn recomputable(&self) -> bool {
        true
    }
    fn seal(&self, sector: u64, data: &mut [u8], tags: &mut [u8]) -> Result<()> {
        self.check(data, tags)?;
        let ts = self.tag_size;
        self.each_tag(sector, data, |i, t| tags[i * ts..][..ts].copy_from_slice(t));
        Ok(())
    }
    fn open(&self, sector: u64, data: &mut [u8], tags: &[u8], bad: &mut Vec<usize>) -> Result<()> {
        self.check(data, tags)?;
        let (bs, ts) = (self.block as usize, self.tag_size);
        let first = bad.len();
        self.each_tag(sector, data, |i, t| {
            if !crate::constant_time_eq(t, &tags[i * ts..][..ts]) {
                bad.push(i);
            }
        });
        for &i in &bad[first..] {
            data[i * bs..][..bs].fill(0);
        }
        Ok(())
    }
}

/// The keystream a stream-cipher journal encryption XORs over dm-integrity's journal
/// (integritysetup's `--journal-crypt`; the kernel's `create_journal` with a cipher of
/// block size 1): `name` (`chacha20`, or `ctr-aes`/`ctr(aes)`) under `key` with an IV of
/// zeros over `len` zero bytes. The kernel takes the journal's pages and then the 32 bytes
/// of commit id bases this way.
pub fn integrity_journal_keystream(name: &str, key: &[u8], len: usize) -> Result<SecretBytes> {
    let mut ks = SecretBytes::zeroed(len);
    match name.to_ascii_lowercase().as_str() {
        "chacha20" => {
            use chacha20::cipher::{KeyIvInit, StreamCipher};
            let key: &[u8; 32] = key.try_into().map_err(|_| Error::InvalidKeyLength {
                cipher: name.into(),
                len: key.len(),
            })?;
            // The kernel's 16-byte IV of zeros: block counter 0, nonce 0 (RFC 7539's).
            let mut c = chacha20::ChaCha20::new(key.into(), &[0u8; 12].into());
            c.apply_keystream(&mut ks);
        }
        "ctr-aes" | "ctr(aes)" => {
            let aes = crate::block::BlockKey::aes_scrubbed(key)?;
            // Big-endian 128-bit counter blocks from zero, encrypted.
            for (n, block) in ks.chunks_mut(16).enumerate() {
                let mut b = [0u8; 16];
                b[8..].copy_from_slice(&(n as u64).to_be_bytes());
                aes.encrypt_blocks(&mut b);
                block.copy_from_slice(&b[..block.len()]);
                zeroize::Zeroize::zeroize(&mut b);
            }
        }
        _ => {
            return Err(Error::UnsupportedCipher(format!(
                "journal encryption '{name}' (cryptblk computes the stream ciphers chacha20 \
                 and ctr-aes, and the block cipher cbc-aes)"
            )));
        }
    }
    Ok(ks)
}

/// A block cipher's journal encryption (integritysetup's `--journal-crypt cbc-aes`, the
/// kernel's `cbc(aes)`; its `create_journal` for a cipher whose block size is not 1): each
/// journal section is encrypted on its own in CBC mode, under an IV that is the cipher's
/// encryption of the section's number (le32, zero-padded to a block, CBC from a zero IV:
/// one block). The commit ids stay as they are (a stream cipher encrypts those too).
pub struct JournalSectionCipher {
    aes: crate::block::BlockKey,
}

impl std::fmt::Debug for JournalSectionCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalSectionCipher(cbc(aes))")
    }
}

impl JournalSectionCipher {
    /// The cipher `name` under `key` where it is a block cipher cryptblk computes
    /// (`cbc-aes`, `cbc(aes)`; AES-128/192/256 by the key's length); `None` for a stream
    /// cipher ([`integrity_journal_keystream`] takes those).
    pub fn new(name: &str, key: &[u8]) -> Result<Option<JournalSectionCipher>> {
        match name.to_ascii_lowercase().as_str() {
            "cbc-aes" | "cbc(aes)" => Ok(Some(JournalSectionCipher {
                aes: crate::block::BlockKey::aes_scrubbed(key)?,
            })),
            _ => Ok(None),
        }
    }

    fn iv(&self, section: u32) -> [u8; 16] {
        let mut iv = [0u8; 16];
        iv[..4].copy_from_slice(&section.to_le_bytes());
        self.aes.encrypt_blocks(&mut iv);
        iv
    }

    /// Encrypts (`encrypt`) or decrypts `bytes`: whole sections from section `first` on,
    /// each `section_bytes` long (a multiple of 16).
    pub fn crypt(&self, first: u32, section_bytes: usize, bytes: &mut [u8], encrypt: bool) {
        assert!(section_bytes.is_multiple_of(16) && bytes.len().is_multiple_of(section_bytes));
        let n = (bytes.len() / section_bytes) as u32;
        let ivs: Vec<[u8; 16]> = (first..first + n).map(|i| self.iv(i)).collect();
        crate::modes::cbc_generic(&self.aes, &ivs, bytes, section_bytes, encrypt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SectorTags;

    /// Each algorithm against an independent computation of the kernel's rule for a
    /// 512-byte block of `(i * 7 + 3) & 255` at sector 9: the table-driven CRCs of
    /// `crc.rs`, and HMACs computed with Python's `hmac`.
    #[test]
    fn tags_are_the_kernels_checksums() {
        let block: Vec<u8> = (0..512u32).map(|i| ((i * 7 + 3) & 255) as u8).collect();
        let mut input = 9u64.to_le_bytes().to_vec();
        input.extend(&block);
        let salt = [0x5au8; 16];
        let mut salted = salt.to_vec();
        salted.extend(&input);
        let key: &[u8] = &(0..32).collect::<Vec<u8>>();
        // (name, key, salt, tag size, the tag).
        type Case<'a> = (&'a str, Option<&'a [u8]>, Option<[u8; 16]>, usize, Vec<u8>);
        let cases: [Case; 7] = [
            ("crc32c", None, None, 4, {
                (!crate::crc32c_update(!0, &input)).to_le_bytes().to_vec()
            }),
            // The kernel's crc32: no inversions at either end.
            (
                "crc32",
                None,
                None,
                4,
                crate::crc32_update(0, &input).to_le_bytes().to_vec(),
            ),
            ("sha256", None, None, 32, HashAlg::Sha256.digest(&input)),
            (
                "sha256",
                None,
                Some(salt),
                32,
                HashAlg::Sha256.digest(&salted),
            ),
            // Cut to the tag size, and padded with zeros beyond the digest.
            (
                "sha1",
                None,
                None,
                8,
                HashAlg::Sha1.digest(&input)[..8].to_vec(),
            ),
            ("crc32c", None, None, 6, {
                let mut t = (!crate::crc32c_update(!0, &input)).to_le_bytes().to_vec();
                t.extend([0, 0]);
                t
            }),
            (
                "hmac-sha256",
                Some(key),
                None,
                32,
                hex::decode("06746a277cd6e5e9ebb4522ebfbb1e8e574ac35ada64ae73ef57d8d754ef7574")
                    .unwrap(),
            ),
        ];
        for (name, key, salt, ts, want) in cases {
            let h = IntegrityHash::new(name, key, ts, 512, salt).unwrap();
            let mut data = block.clone();
            let mut tag = vec![0u8; ts];
            h.seal(9, &mut data, &mut tag).unwrap();
            assert_eq!(
                hex::encode(&tag),
                hex::encode(&want),
                "{name} salt {salt:?}"
            );
            assert_eq!(data, block, "the data is stored as it is");
            let mut bad = Vec::new();
            h.open(9, &mut data, &tag, &mut bad).unwrap();
            assert!(bad.is_empty());
            data[100] ^= 1;
            h.open(9, &mut data, &tag, &mut bad).unwrap();
            assert_eq!(bad, [0], "{name}: a flipped bit fails");
            assert!(
                data.iter().all(|&b| b == 0),
                "a failed block is never handed out"
            );
        }
        let salted_hmac = IntegrityHash::new("hmac-sha1", Some(key), 20, 512, Some(salt)).unwrap();
        let mut tag = [0u8; 20];
        salted_hmac.seal(9, &mut block.clone(), &mut tag).unwrap();
        assert_eq!(hex::encode(tag), "02304a45895b2e049ff7c3a1021c279ab82590b5");
    }

    #[test]
    fn keys_go_with_hmacs_only() {
        assert!(IntegrityHash::new("hmac-sha256", None, 32, 512, None).is_err());
        assert!(IntegrityHash::new("crc32c", Some(b"k"), 4, 512, None).is_err());
        assert!(IntegrityHash::new("hmac-md5", Some(b"k"), 16, 512, None).is_err());
        assert!(IntegrityHash::new("nonsense", None, 4, 512, None).is_err());
        assert!(IntegrityHash::new("crc32c", None, 4, 1000, None).is_err());
        assert_eq!(IntegrityHash::digest_size_of("sha256").unwrap(), 32);
        assert_eq!(IntegrityHash::digest_size_of("crc32c").unwrap(), 4);
        assert!(IntegrityHash::is_keyed("hmac(sha256)").unwrap());
    }

    /// A request of many blocks (sha256 and hmac-sha256 take up to 32 at a time from six
    /// on, where the CPU has AVX-512): every tag as one block alone gives it (the checked
    /// rule above), cut or padded to the tag size, and damaged blocks refused alone.
    #[test]
    fn many_blocks_are_tagged_as_each_alone() {
        let key = [0x42u8; 32];
        for (name, key, salt, ts) in [
            ("sha256", None, None, 32),
            ("sha256", None, Some([7u8; 16]), 20),
            ("hmac-sha256", Some(&key[..]), None, 32),
            ("hmac-sha256", Some(&key[..]), Some([9u8; 16]), 40),
            ("crc32c", None, None, 4),
        ] {
            for bs in [512usize, 4096] {
                let h = IntegrityHash::new(name, key, ts, bs as u32, salt).unwrap();
                for n in [1usize, 6, 16, 21] {
                    let label = format!(
                        "{name} salt {:?} {bs}-byte blocks, {n} blocks",
                        salt.is_some()
                    );
                    let mut data: Vec<u8> = (0..n * bs).map(|i| (i * 5 + i / 777) as u8).collect();
                    let keep = data.clone();
                    let mut tags = vec![0u8; n * ts];
                    h.seal(3, &mut data, &mut tags).unwrap();
                    let per = bs as u64 / 512;
                    for i in 0..n {
                        let mut want = vec![0u8; ts];
                        h.tag((3 + i as u64) * per, &data[i * bs..][..bs], &mut want);
                        assert_eq!(tags[i * ts..][..ts], want[..], "{label}: block {i}");
                    }
                    let hit: Vec<usize> = if n > 1 { vec![1, n - 1] } else { vec![0] };
                    for &i in &hit {
                        data[i * bs + 3] ^= 1;
                    }
                    let mut bad = Vec::new();
                    h.open(3, &mut data, &tags, &mut bad).unwrap();
                    assert_eq!(bad, hit, "{label}: refused");
                    for i in 0..n {
                        let got = &data[i * bs..][..bs];
                        if hit.contains(&i) {
                            assert!(got.iter().all(|&b| b == 0), "{label}: block {i} handed out");
                        } else {
                            assert_eq!(got, &keep[i * bs..][..bs], "{label}: block {i}");
                        }
                    }
                }
            }
        }
    }
}
