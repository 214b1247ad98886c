//! `SectorCipher`: encrypts and decrypts runs of consecutive sectors exactly as dm-crypt does.

use crate::aes_generic::AesKey;
use crate::spec::{BlockCipherAlg, ChainMode, CipherSpec, IvMode};
use crate::{Backend, Error, Result};
use zeroize::Zeroize;

/// How dm-crypt numbers IVs (its `iv_offset` and `iv_large_sectors` table parameters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IvOptions {
    /// IVs count encryption sectors instead of 512-byte sectors (LUKS2 with sectors > 512
    /// and plain mode's `--iv-large-sectors`).
    pub large_sectors: bool,
    /// Added to the 512-byte sector number before any shift (plain mode's `--skip`).
    pub offset: u64,
}

/// Most IVs prepared on the stack at once; longer runs are handled in batches.
const IV_BATCH: usize = 64;
/// IV buffer of requests up to this many sectors (4 KiB of 512-byte sectors).
const SMALL_IV_BATCH: usize = 8;

enum Engine {
    Null,
    Xts {
        data: AesKey,
        tweak: AesKey,
        fast: Option<crate::secret::LockedBox<crate::x86::XtsKeys>>,
    },
    Cbc {
        key: AesKey,
        fast: Option<crate::secret::LockedBox<crate::x86::AesKeys>>,
    },
    Ecb {
        key: AesKey,
    },
}

/// A volume cipher bound to its key, sector size and IV numbering.
///
/// `encrypt`/`decrypt` take any number of whole sectors and process them in one call:
/// the data path never loops over sectors itself, so vector backends can interleave them.
pub struct SectorCipher {
    spec: CipherSpec,
    sector_size: u32,
    iv: IvOptions,
    backend: Backend,
    essiv: Option<AesKey>,
    engine: Engine,
}

impl std::fmt::Debug for SectorCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SectorCipher")
            .field("spec", &self.spec.to_string())
            .field("sector_size", &self.sector_size)
            .field("iv", &self.iv)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

pub(crate) fn check_sector_size(s: u32) -> Result<()> {
    if matches!(s, 512 | 1024 | 2048 | 4096) {
        Ok(())
    } else {
        Err(Error::InvalidSectorSize(s))
    }
}

impl SectorCipher {
    /// A cipher on the backend chosen for this CPU (or forced by `CRYPTBLK_CRYPTO_BACKEND`).
    pub fn new(spec: CipherSpec, key: &[u8], sector_size: u32, iv: IvOptions) -> Result<Self> {
        Self::with_backend(spec, key, sector_size, iv, Backend::current()?)
    }

    /// A cipher on a given backend (tests force each one).
    pub fn with_backend(
        spec: CipherSpec,
        key: &[u8],
        sector_size: u32,
        iv: IvOptions,
        backend: Backend,
    ) -> Result<Self> {
        check_sector_size(sector_size)?;
        if !backend.is_supported() {
            return Err(Error::BackendUnavailable(format!(
                "{backend} is not supported by this CPU"
            )));
        }
        if !spec.valid_key_len(key.len()) {
            return Err(Error::InvalidKeyLength {
                cipher: spec.to_string(),
                len: key.len(),
            });
        }
        let essiv = match spec.iv {
            IvMode::Essiv(h) => {
                let mut salt = h.digest(key);
                let k = AesKey::new(&salt).map_err(|_| Error::UnsupportedCipher(spec.to_string()));
                salt.zeroize();
                Some(k?)
            }
            _ => None,
        };
        let use_fast = backend != Backend::Generic;
        let engine = match (spec.cipher, spec.mode) {
            (BlockCipherAlg::Null, _) => Engine::Null,
            (BlockCipherAlg::Aes, ChainMode::Xts) => {
                let (k1, k2) = key.split_at(key.len() / 2);
                Engine::Xts {
                    data: AesKey::new(k1)?,
                    tweak: AesKey::new(k2)?,
                    fast: if use_fast {
                        crate::x86::XtsKeys::new(k1, k2)
                    } else {
                        None
                    },
                }
            }
            (BlockCipherAlg::Aes, ChainMode::Cbc) => Engine::Cbc {
                key: AesKey::new(key)?,
                fast: if use_fast {
                    crate::x86::AesKeys::new(key)
                } else {
                    None
                },
            },
            (BlockCipherAlg::Aes, ChainMode::Ecb) => Engine::Ecb {
                key: AesKey::new(key)?,
            },
        };
        // Key schedules were built on this thread's stack before moving into locked memory.
        crate::secret::scrub_stack();
        Ok(SectorCipher {
            spec,
            sector_size,
            iv,
            backend,
            essiv,
            engine,
        })
    }

    /// The cipher specification this cipher implements.
    pub fn spec(&self) -> &CipherSpec {
        &self.spec
    }

    /// Encryption sector size in bytes (512, 1024, 2048 or 4096); buffers passed to
    /// `encrypt`/`decrypt` must be multiples of it.
    pub fn sector_size(&self) -> u32 {
        self.sector_size
    }

    /// The IV numbering options the cipher was built with.
    pub fn iv_options(&self) -> IvOptions {
        self.iv
    }

    /// The AES implementation in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Encrypts `data` (whole sectors) in place; `sector` is the index, in units of the
    /// sector size, of its first sector within the encrypted segment.
    pub fn encrypt(&self, sector: u64, data: &mut [u8]) -> Result<()> {
        self.process(sector, data, true)
    }

    /// Decrypts `data` (whole sectors) in place; see [`SectorCipher::encrypt`].
    pub fn decrypt(&self, sector: u64, data: &mut [u8]) -> Result<()> {
        self.process(sector, data, false)
    }

    /// dm-crypt's IV sector number for encryption sector `sector`.
    fn iv_sector(&self, sector: u64) -> u64 {
        let shift = self.sector_size.trailing_zeros() - 9;
        let s512 = (sector << shift).wrapping_add(self.iv.offset);
        if self.iv.large_sectors {
            s512 >> shift
        } else {
            s512
        }
    }

    fn iv_step(&self) -> u64 {
        if self.iv.large_sectors {
            1
        } else {
            (self.sector_size / 512) as u64
        }
    }

    /// Fills `ivs` with the IV blocks of consecutive sectors whose first IV sector is `first`.
    fn fill_ivs(&self, first: u64, ivs: &mut [[u8; 16]]) {
        let step = self.iv_step();
        for (i, iv) in ivs.iter_mut().enumerate() {
            let n = first.wrapping_add(step.wrapping_mul(i as u64));
            *iv = [0u8; 16];
            match self.spec.iv {
                IvMode::Plain => iv[..4].copy_from_slice(&(n as u32).to_le_bytes()),
                IvMode::Plain64 | IvMode::Essiv(_) => iv[..8].copy_from_slice(&n.to_le_bytes()),
                IvMode::Plain64Be => iv[8..].copy_from_slice(&n.to_be_bytes()),
                IvMode::Null | IvMode::None => {}
            }
        }
        if let Some(essiv) = &self.essiv {
            let flat = ivs.as_flattened_mut();
            essiv.encrypt_blocks(flat);
        }
    }

    fn process(&self, sector: u64, data: &mut [u8], enc: bool) -> Result<()> {
        // Round keys get spilled to this thread's stack: keep that part of it locked in RAM
        // and wiped when the thread ends.
        crate::secret::guard_stack();
        let ss = self.sector_size as usize;
        // Sector sizes are powers of two (checked at construction): a mask, not a division,
        // on this per-request path.
        debug_assert!(ss.is_power_of_two());
        if data.len() & (ss - 1) != 0 {
            return Err(Error::UnalignedLength {
                len: data.len(),
                sector_size: self.sector_size,
            });
        }
        if let Engine::Null = self.engine {
            return Ok(());
        }
        if let Engine::Ecb { key } = &self.engine {
            if enc {
                key.encrypt_blocks(data)
            } else {
                key.decrypt_blocks(data)
            }
            return Ok(());
        }
        // Small requests (the common case) get a small IV buffer: zeroing the whole batch
        // buffer cost more than the crypto of one 512-byte sector.
        if data.len() <= ss * SMALL_IV_BATCH {
            self.process_batches::<SMALL_IV_BATCH>(sector, data, enc);
        } else {
            self.process_batches::<IV_BATCH>(sector, data, enc);
        }
        Ok(())
    }

    /// Runs the IV-based engines over `data` (whole sectors) in batches of up to `N` sectors.
    fn process_batches<const N: usize>(&self, sector: u64, data: &mut [u8], enc: bool) {
        let ss = self.sector_size as usize;
        let mut iv_buf = [[0u8; 16]; N];
        let mut first = sector;
        for batch in data.chunks_mut(ss * N) {
            let n = batch.len() >> ss.trailing_zeros();
            let ivs = &mut iv_buf[..n];
            self.fill_ivs(self.iv_sector(first), ivs);
            match &self.engine {
                Engine::Xts {
                    data: k1,
                    tweak: k2,
                    fast,
                } => match fast {
                    Some(f) => f.xts(self.backend, ivs, batch, ss, enc),
                    None => xts_generic(k1, k2, ivs, batch, ss, enc),
                },
                Engine::Cbc { key, fast } => match fast {
                    Some(f) => f.cbc(self.backend, ivs, batch, ss, enc),
                    None => cbc_generic(key, ivs, batch, ss, enc),
                },
                Engine::Null | Engine::Ecb { .. } => unreachable!("handled above"),
            }
            first = first.wrapping_add(n as u64);
            // The fast XTS paths leave encrypted tweaks here: wipe what was used.
            crate::secret::wipe_blocks(ivs);
        }
    }
}

/// Multiplies an XTS tweak by α (x) in GF(2^128), little-endian as IEEE 1619 defines.
#[inline]
pub(crate) fn gf_mul_x(t: u128) -> u128 {
    (t << 1) ^ ((t >> 127) * 0x87)
}

/// Blocks handled per pass of the generic XTS loop.
const XTS_CHUNK: usize = 32;

pub(crate) fn xts_generic(
    k1: &AesKey,
    k2: &AesKey,
    ivs: &mut [[u8; 16]],
    data: &mut [u8],
    ss: usize,
    enc: bool,
) {
    let mut tweaks = [[0u8; 16]; XTS_CHUNK];
    for (iv, sector) in ivs.iter_mut().zip(data.chunks_mut(ss)) {
        k2.encrypt_block(iv);
        let mut t = u128::from_le_bytes(*iv);
        for chunk in sector.chunks_mut(16 * XTS_CHUNK) {
            let n = chunk.len() / 16;
            for tw in tweaks[..n].iter_mut() {
                *tw = t.to_le_bytes();
                t = gf_mul_x(t);
            }
            xor_in(chunk, tweaks[..n].as_flattened());
            if enc {
                k1.encrypt_blocks(chunk)
            } else {
                k1.decrypt_blocks(chunk)
            }
            xor_in(chunk, tweaks[..n].as_flattened());
        }
    }
    tweaks.as_flattened_mut().zeroize();
}

fn cbc_generic(key: &AesKey, ivs: &[[u8; 16]], data: &mut [u8], ss: usize, enc: bool) {
    for (iv, sector) in ivs.iter().zip(data.chunks_mut(ss)) {
        let mut prev = *iv;
        if enc {
            for b in sector.chunks_exact_mut(16) {
                let b: &mut [u8; 16] = b.try_into().expect("16-byte chunk");
                xor_in(b, &prev);
                key.encrypt_block(b);
                prev = *b;
            }
        } else {
            // Keep a copy of each chunk's ciphertext: it chains into the next block.
            let mut saved = [0u8; 16 * XTS_CHUNK];
            for chunk in sector.chunks_mut(16 * XTS_CHUNK) {
                let saved = &mut saved[..chunk.len()];
                saved.copy_from_slice(chunk);
                key.decrypt_blocks(chunk);
                xor_in(&mut chunk[..16], &prev);
                xor_in(&mut chunk[16..], &saved[..saved.len() - 16]);
                prev.copy_from_slice(&saved[saved.len() - 16..]);
            }
            saved.zeroize();
        }
    }
}

#[inline]
pub(crate) fn xor_in(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn debug_output_never_shows_key_material() {
        let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(29) ^ 0xb7).collect();
        for spec in ["aes-xts-plain64", "aes-cbc-essiv:sha256", "aes-ecb"] {
            let spec = CipherSpec::parse(spec).unwrap();
            let k = &key[..spec.default_key_len()];
            for backend in [Backend::Generic, Backend::current().unwrap()] {
                let c = SectorCipher::with_backend(spec, k, 512, IvOptions::default(), backend)
                    .unwrap();
                let d = format!("{c:?} {c:#?}");
                let hex: String = k[..4].iter().map(|b| format!("{b:02x}")).collect();
                let dec = format!("{}, {}", k[0], k[1]);
                assert!(d.contains("SectorCipher") && !d.contains(&hex) && !d.contains(&dec));
                assert!(!d.contains("enc") && !d.contains("round"), "{d}");
            }
        }
        let s = crate::SecretBytes::from_slice(&key);
        let d = format!("{s:?} {s:#?}");
        assert!(!d.contains(&format!("{}, {}", key[0], key[1])), "{d}");
        assert!(d.contains("REDACTED"));
    }

    #[test]
    fn ieee1619_vector_10_aes256_512_byte_unit() {
        // IEEE 1619-2007 vector 10: data unit 0xff, plaintext bytes 0..=255 twice.
        let key = hex_bytes(concat!(
            "2718281828459045235360287471352662497757247093699959574966967627",
            "3141592653589793238462643383279502884197169399375105820974944592"
        ));
        let mut pt: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
        let spec = CipherSpec::parse("aes-xts-plain64").unwrap();
        for b in Backend::supported() {
            let c = SectorCipher::with_backend(spec, &key, 512, IvOptions::default(), b).unwrap();
            let mut buf = pt.clone();
            c.encrypt(0xff, &mut buf).unwrap();
            assert_eq!(
                hex_str(&buf[..16]),
                "1c3b3a102f770386e4836c99e370cf9b",
                "{b}"
            );
            assert_eq!(
                hex_str(&buf[496..]),
                "c4f36ffda9fcea70b9c6e693e148c151",
                "{b}"
            );
            c.decrypt(0xff, &mut buf).unwrap();
            assert_eq!(buf, pt);
        }
        pt.clear();
    }

    fn hex_bytes(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn hex_str(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn every_backend_matches_generic() {
        let specs = [
            "aes-xts-plain64",
            "aes-xts-plain",
            "aes-xts-plain64be",
            "aes-cbc-essiv:sha256",
            "aes-cbc-plain64",
            "aes-cbc-plain",
            "aes-ecb",
            "cipher_null-ecb",
        ];
        let mut seed = 1;
        for s in specs {
            let spec = CipherSpec::parse(s).unwrap();
            for key_len in [16usize, 24, 32, 48, 64] {
                if !spec.valid_key_len(key_len) {
                    continue;
                }
                for ss in [512u32, 4096] {
                    for (large, n) in [(false, 1usize), (true, 8), (false, 67), (true, 3)] {
                        seed += 1;
                        let key = pseudo(seed, key_len);
                        let pt = pseudo(seed + 1000, n * ss as usize);
                        let iv = IvOptions {
                            large_sectors: large,
                            offset: seed % 7,
                        };
                        let start = (seed * 0x12_3456_7890) % (1 << 40);
                        let g = SectorCipher::with_backend(spec, &key, ss, iv, Backend::Generic)
                            .unwrap();
                        let mut want = pt.clone();
                        g.encrypt(start, &mut want).unwrap();
                        for b in Backend::supported() {
                            let c = SectorCipher::with_backend(spec, &key, ss, iv, b).unwrap();
                            let mut got = pt.clone();
                            c.encrypt(start, &mut got).unwrap();
                            assert!(
                                got == want,
                                "{s} key {key_len} ss {ss} n {n} backend {b}: encrypt differs"
                            );
                            c.decrypt(start, &mut got).unwrap();
                            assert!(
                                got == pt,
                                "{s} key {key_len} ss {ss} n {n} backend {b}: decrypt differs"
                            );
                        }
                    }
                }
            }
        }
    }
}
