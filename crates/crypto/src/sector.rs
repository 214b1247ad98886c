//! `SectorCipher`: encrypts and decrypts runs of consecutive sectors exactly as dm-crypt does.

use crate::block::BlockKey;
use crate::modes::{LrwTable, cbc_generic, cbc_generic_n, lrw, xor_in, xts_generic};
use crate::secret::LockedBox;
use crate::spec::{BlockCipherAlg, ChainMode, CipherSpec, IvMode, KeyLayout};
use crate::{Backend, Error, Result};
use zeroize::{Zeroize, ZeroizeOnDrop};

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
        data: BlockKey,
        tweak: BlockKey,
        fast: Option<LockedBox<crate::backend::x86::XtsKeys>>,
    },
    Cbc {
        key: BlockKey,
        fast: Option<LockedBox<crate::backend::x86::AesKeys>>,
    },
    Ecb {
        key: BlockKey,
    },
    Lrw {
        key: BlockKey,
        table: LockedBox<LrwTable>,
    },
    /// dm-crypt's key count above one: sector `n` (in 512-byte units, plus the IV offset)
    /// goes through cipher `n mod count`.
    Multi(Vec<SectorCipher>),
    /// Ciphers stacked as cryptsetup stacks dm-crypt targets for TrueCrypt/VeraCrypt
    /// cascades: writes go through the first, then the next...; reads the other way.
    Cascade(Vec<SectorCipher>),
}

/// IV state beyond the sector number.
enum IvKeys {
    None,
    /// ESSIV: the same cipher keyed with hash(volume key).
    Essiv(BlockKey),
    /// `tcw`: IV seed and whitening.
    Tcw(LockedBox<TcwSecrets>),
    /// `lmk`: the hash seed of loop-AES v3 (`None` for v2).
    Lmk(Option<LockedBox<LmkSeed>>),
    /// `elephant`: the diffuser key (AES).
    Elephant(BlockKey),
}

#[derive(Default, Zeroize, ZeroizeOnDrop)]
struct TcwSecrets {
    iv_seed: [u8; 16],
    whitening: [u8; 16],
}

/// loop-AES v3's seed: 16 key bytes hashed ahead of each sector, padded to an MD5 block.
#[derive(Zeroize, ZeroizeOnDrop)]
struct LmkSeed([u8; 64]);

/// A volume cipher bound to its key, sector size and IV numbering.
///
/// `encrypt`/`decrypt` take any number of whole sectors and process them in one call:
/// the data path never loops over sectors itself, so vector backends can interleave them.
pub struct SectorCipher {
    spec: CipherSpec,
    sector_size: u32,
    iv: IvOptions,
    backend: Backend,
    iv_keys: IvKeys,
    engine: Engine,
    /// What `description` prints when the spec alone does not say it (cascades).
    name: Option<String>,
}

impl std::fmt::Debug for SectorCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SectorCipher")
            .field("spec", &self.description())
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

    /// A cipher on a given backend (tests force each one). The backend applies to AES;
    /// the other families have one implementation each.
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
        let bad_len = || Error::InvalidKeyLength {
            cipher: spec.to_string(),
            len: key.len(),
        };
        let layout = spec.key_layout(key.len()).ok_or_else(bad_len)?;
        // tcw whitens and lmk hashes 512-byte sectors: dm-crypt offers them for no other size.
        if matches!(spec.iv, IvMode::Tcw | IvMode::Lmk) && sector_size != 512 {
            return Err(Error::InvalidSectorSize(sector_size));
        }
        // Key schedules are built on this thread's stack before moving into locked memory:
        // in frames of their own, wiped after.
        crate::secret::scrubbed(|| Self::build(spec, key, layout, sector_size, iv, backend))
    }

    fn build(
        spec: CipherSpec,
        key: &[u8],
        layout: KeyLayout,
        sector_size: u32,
        iv: IvOptions,
        backend: Backend,
    ) -> Result<Self> {
        let n = spec.key_count as usize;
        let (keys, extra) = key.split_at(layout.per_key * n);
        let engine = if n > 1 {
            let one = CipherSpec {
                key_count: 1,
                ..spec
            };
            let subs = keys
                .chunks(layout.per_key)
                .map(|k| {
                    let l = KeyLayout {
                        per_key: k.len(),
                        extra: extra.len(),
                    };
                    let mut joined = crate::SecretBytes::zeroed(k.len() + extra.len());
                    joined[..k.len()].copy_from_slice(k);
                    joined[k.len()..].copy_from_slice(extra);
                    Self::build(one, &joined, l, sector_size, iv, backend)
                })
                .collect::<Result<Vec<_>>>()?;
            Engine::Multi(subs)
        } else {
            Self::engine(&spec, keys, backend)?
        };
        let iv_keys = match spec.iv {
            IvMode::Essiv(h) => {
                let mut salt = h.digest(key);
                let k = BlockKey::new(spec.cipher, &salt);
                salt.zeroize();
                IvKeys::Essiv(k.map_err(|_| Error::UnsupportedCipher(spec.to_string()))?)
            }
            IvMode::Tcw => {
                let (seed, white) = extra.split_at(spec.iv_len());
                IvKeys::Tcw(LockedBox::new_with(TcwSecrets::default(), |t| {
                    t.iv_seed[..seed.len()].copy_from_slice(seed);
                    t.whitening.copy_from_slice(white);
                    Ok::<_, Error>(())
                })?)
            }
            IvMode::Lmk if !extra.is_empty() => {
                IvKeys::Lmk(Some(LockedBox::new_with(LmkSeed([0; 64]), |s| {
                    // dm-crypt takes an MD5 digest's worth of the extra part.
                    let m = extra.len().min(16);
                    s.0[..m].copy_from_slice(&extra[..m]);
                    Ok::<_, Error>(())
                })?))
            }
            IvMode::Lmk => IvKeys::Lmk(None),
            IvMode::Elephant => IvKeys::Elephant(BlockKey::new(BlockCipherAlg::Aes, extra)?),
            _ => IvKeys::None,
        };
        Ok(SectorCipher {
            spec,
            sector_size,
            iv,
            backend,
            iv_keys,
            engine,
            name: None,
        })
    }

    /// A TrueCrypt/VeraCrypt cascade (`aes-twofish-serpent` in XTS or LRW, as cryptsetup
    /// maps it with one dm-crypt target per cipher): data is encrypted by `layers[0]`
    /// first and reaches the disk from the last; every layer numbers sectors alike.
    /// `name` is the chain as cryptsetup names it (`aes-twofish-serpent-xts-plain64`).
    pub fn cascade(layers: Vec<SectorCipher>, name: &str) -> Result<Self> {
        let first = layers
            .first()
            .ok_or_else(|| Error::UnsupportedCipher(name.into()))?;
        if layers
            .iter()
            .any(|l| l.sector_size != first.sector_size || l.iv != first.iv)
        {
            return Err(Error::UnsupportedCipher(format!(
                "{name}: layers with different sectors"
            )));
        }
        Ok(SectorCipher {
            spec: first.spec,
            sector_size: first.sector_size,
            iv: first.iv,
            backend: first.backend,
            iv_keys: IvKeys::None,
            name: Some(name.to_string()),
            engine: Engine::Cascade(layers),
        })
    }

    /// The cipher as cryptsetup's `status` prints it: the spec, or the whole chain of a
    /// cascade (`serpent-twofish-aes-xts-plain64`).
    pub fn description(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.spec.to_string())
    }

    /// The engine of one key.
    fn engine(spec: &CipherSpec, key: &[u8], backend: Backend) -> Result<Engine> {
        let fast = backend != Backend::Generic && spec.cipher == BlockCipherAlg::Aes;
        Ok(match (spec.cipher, spec.mode) {
            (BlockCipherAlg::Null, _) => Engine::Null,
            (c, ChainMode::Xts) => {
                let (k1, k2) = key.split_at(key.len() / 2);
                Engine::Xts {
                    data: BlockKey::new(c, k1)?,
                    tweak: BlockKey::new(c, k2)?,
                    fast: fast
                        .then(|| crate::backend::x86::XtsKeys::new(k1, k2))
                        .flatten(),
                }
            }
            (c, ChainMode::Cbc) => Engine::Cbc {
                key: BlockKey::new(c, key)?,
                fast: fast
                    .then(|| crate::backend::x86::AesKeys::new(key))
                    .flatten(),
            },
            (c, ChainMode::Ecb) => Engine::Ecb {
                key: BlockKey::new(c, key)?,
            },
            (c, ChainMode::Lrw) => {
                let (k, t) = key.split_at(key.len() - 16);
                let t: &[u8; 16] = t.try_into().expect("16-byte LRW tweak key");
                Engine::Lrw {
                    key: BlockKey::new(c, k)?,
                    table: LrwTable::locked(t)?,
                }
            }
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

    /// Encrypts `src` (whole sectors) into `dst` (the same length), as
    /// [`SectorCipher::encrypt`] would in place: for writing straight into a mapping of the
    /// storage. AES-XTS with plain IVs on the VAES paths does it in one pass over memory;
    /// everything else is a copy and then the cipher in place.
    pub fn encrypt_from(&self, sector: u64, src: &[u8], dst: &mut [u8]) -> Result<()> {
        self.process_from(sector, src, dst, true)
    }

    /// Decrypts `src` into `dst`; see [`SectorCipher::encrypt_from`] (reading straight out
    /// of a mapping of the storage).
    pub fn decrypt_from(&self, sector: u64, src: &[u8], dst: &mut [u8]) -> Result<()> {
        self.process_from(sector, src, dst, false)
    }

    /// Whether [`SectorCipher::encrypt_from`] writes nothing but ciphertext into its
    /// destination (one pass). Where it does not (a copy of the plaintext, then the cipher
    /// in place), a caller must not let the destination be a mapping of the storage: the
    /// plaintext would sit in the page cache for a moment, and stay in the image if the
    /// process died then.
    pub fn transforms_in_one_pass(&self) -> bool {
        matches!(
            (&self.engine, &self.iv_keys),
            (Engine::Xts { fast: Some(_), .. }, IvKeys::None)
        ) && matches!(self.backend, Backend::Vaes512 | Backend::Vaes256)
    }

    fn process_from(&self, sector: u64, src: &[u8], dst: &mut [u8], enc: bool) -> Result<()> {
        let ss = self.sector_size as usize;
        if src.len() != dst.len() || src.len() & (ss - 1) != 0 {
            return Err(Error::UnalignedLength {
                len: src.len(),
                sector_size: self.sector_size,
            });
        }
        match &self.engine {
            Engine::Xts { fast: Some(f), .. } if self.transforms_in_one_pass() => {
                crate::secret::guard_stack();
                if dst.len() <= ss * SMALL_IV_BATCH {
                    self.xts_from_batches::<SMALL_IV_BATCH>(f, sector, src, dst, enc);
                } else {
                    self.xts_from_batches::<IV_BATCH>(f, sector, src, dst, enc);
                }
                Ok(())
            }
            _ => {
                dst.copy_from_slice(src);
                self.process(sector, dst, enc)
            }
        }
    }

    /// [`SectorCipher::process_from`] on a one-pass XTS path, in batches of up to `N`
    /// sectors (a small IV buffer for small requests, as in `process_small_or_batched`).
    fn xts_from_batches<const N: usize>(
        &self,
        keys: &crate::backend::x86::XtsKeys,
        sector: u64,
        src: &[u8],
        dst: &mut [u8],
        enc: bool,
    ) {
        let ss = self.sector_size as usize;
        let mut iv_buf = [[0u8; 16]; N];
        let mut first = sector;
        for (from, to) in src.chunks(ss * N).zip(dst.chunks_mut(ss * N)) {
            let n = to.len() >> ss.trailing_zeros();
            let ivs = &mut iv_buf[..n];
            self.fill_ivs(self.iv_sector(first), ivs);
            keys.xts_from(self.backend, ivs, from, to, ss, enc);
            first = first.wrapping_add(n as u64);
            crate::secret::wipe_blocks(ivs);
        }
    }

    /// plain64 IVs of consecutive sectors from `first` (an IV sector number).
    fn plain64_ivs(&self, first: u64, ivs: &mut [[u8; 16]]) {
        let step = self.iv_step();
        for (i, iv) in ivs.iter_mut().enumerate() {
            crate::backend::x86::store_u64_le_block(
                iv,
                first.wrapping_add(step.wrapping_mul(i as u64)),
            );
        }
    }

    /// The sector number in 512-byte units, plus the IV offset (dm-crypt's `cc_sector`).
    fn cc_sector(&self, sector: u64) -> u64 {
        let shift = self.sector_size.trailing_zeros() - 9;
        (sector << shift).wrapping_add(self.iv.offset)
    }

    /// dm-crypt's IV sector number for encryption sector `sector`.
    fn iv_sector(&self, sector: u64) -> u64 {
        let shift = self.sector_size.trailing_zeros() - 9;
        let s512 = self.cc_sector(sector);
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

    /// Fills `ivs` with the IV blocks of consecutive sectors whose first IV sector is
    /// `first` (the first `iv_len` bytes of each entry; the rest stays zero).
    fn fill_ivs(&self, first: u64, ivs: &mut [[u8; 16]]) {
        let step = self.iv_step();
        let len = self.spec.iv_len();
        // benbi counts cipher blocks as if sectors were 512 bytes (dm-crypt's shift).
        let benbi_shift = 9 - len.trailing_zeros();
        if self.spec.iv == IvMode::Plain64 && matches!(self.iv_keys, IvKeys::None) {
            return self.plain64_ivs(first, ivs);
        }
        for (i, iv) in ivs.iter_mut().enumerate() {
            let n = first.wrapping_add(step.wrapping_mul(i as u64));
            *iv = [0u8; 16];
            match self.spec.iv {
                IvMode::Plain => iv[..4].copy_from_slice(&(n as u32).to_le_bytes()),
                IvMode::Plain64 | IvMode::Essiv(_) => iv[..8].copy_from_slice(&n.to_le_bytes()),
                IvMode::Plain64Be => iv[len - 8..len].copy_from_slice(&n.to_be_bytes()),
                IvMode::Benbi => {
                    let v = (n << benbi_shift).wrapping_add(1);
                    iv[len - 8..len].copy_from_slice(&v.to_be_bytes())
                }
                IvMode::Eboiv | IvMode::Elephant => {
                    let off = n.wrapping_mul(self.sector_size as u64);
                    iv[..8].copy_from_slice(&off.to_le_bytes())
                }
                IvMode::Null | IvMode::None | IvMode::Tcw | IvMode::Lmk => {}
            }
        }
        let iv_cipher = match (&self.iv_keys, &self.engine, self.spec.iv) {
            (IvKeys::Essiv(k), _, _) => k,
            (_, Engine::Cbc { key, .. }, IvMode::Eboiv | IvMode::Elephant) => key,
            _ => return,
        };
        if len == 16 {
            iv_cipher.encrypt_blocks(ivs.as_flattened_mut());
        } else {
            for iv in ivs.iter_mut() {
                iv_cipher.encrypt_blocks(&mut iv[..len]);
            }
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
        if let (Engine::Xts { fast: Some(f), .. }, IvKeys::None, IvMode::Plain64) =
            (&self.engine, &self.iv_keys, self.spec.iv)
            && data.len() <= ss * SMALL_IV_BATCH
        {
            // dm-crypt's default (aes-xts-plain64) in one request of up to eight sectors:
            // the fewest instructions between two requests, so that the next request's
            // tweak encryption, whose latency nothing else in the request hides, enters the
            // out-of-order window while the previous request's last rounds still run.
            let mut ivs = [[0u8; 16]; SMALL_IV_BATCH];
            let n = data.len() >> ss.trailing_zeros();
            self.plain64_ivs(self.iv_sector(sector), &mut ivs[..n]);
            f.xts(self.backend, &mut ivs[..n], data, ss, enc);
            crate::secret::wipe_blocks(&mut ivs[..n]);
            return Ok(());
        }
        match &self.engine {
            Engine::Null => return Ok(()),
            Engine::Ecb { key } => {
                if enc {
                    key.encrypt_blocks(data)
                } else {
                    key.decrypt_blocks(data)
                }
                return Ok(());
            }
            Engine::Cascade(layers) => {
                if enc {
                    layers
                        .iter()
                        .try_for_each(|l| l.process(sector, data, true))?;
                } else {
                    layers
                        .iter()
                        .rev()
                        .try_for_each(|l| l.process(sector, data, false))?;
                }
                return Ok(());
            }
            Engine::Multi(subs) => {
                let mask = subs.len() as u64 - 1;
                for (i, one) in data.chunks_mut(ss).enumerate() {
                    let s = sector.wrapping_add(i as u64);
                    let sub = &subs[(self.cc_sector(s) & mask) as usize];
                    sub.process(s, one, enc)?;
                }
                return Ok(());
            }
            _ => {}
        }
        if let IvKeys::Elephant(k) = &self.iv_keys {
            // The diffuser works on plaintext: before CBC on writes, after it on reads;
            // the CBC itself still takes the whole request at once.
            let each = |data: &mut [u8]| {
                for (i, one) in data.chunks_mut(ss).enumerate() {
                    let off = self
                        .iv_sector(sector.wrapping_add(i as u64))
                        .wrapping_mul(self.sector_size as u64);
                    if enc {
                        crate::elephant::encrypt_sector(k, off, one);
                    } else {
                        crate::elephant::decrypt_sector(k, off, one);
                    }
                }
            };
            if enc {
                each(data);
            }
            self.process_small_or_batched(sector, data, enc);
            if !enc {
                each(data);
            }
            return Ok(());
        }
        if matches!(self.iv_keys, IvKeys::Tcw(_) | IvKeys::Lmk(_)) {
            for (i, one) in data.chunks_mut(ss).enumerate() {
                self.process_hashed_iv(self.iv_sector(sector.wrapping_add(i as u64)), one, enc);
            }
            return Ok(());
        }
        self.process_small_or_batched(sector, data, enc);
        Ok(())
    }

    fn process_small_or_batched(&self, sector: u64, data: &mut [u8], enc: bool) {
        // Small requests (the common case) get a small IV buffer: zeroing the whole batch
        // buffer cost more than the crypto of one 512-byte sector.
        if data.len() <= self.sector_size as usize * SMALL_IV_BATCH {
            self.process_batches::<SMALL_IV_BATCH>(sector, data, enc);
        } else {
            self.process_batches::<IV_BATCH>(sector, data, enc);
        }
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
                Engine::Lrw { key, table } => lrw(key, table, ivs, batch, ss, enc),
                Engine::Null | Engine::Ecb { .. } | Engine::Multi(_) | Engine::Cascade(_) => {
                    unreachable!("handled above")
                }
            }
            first = first.wrapping_add(n as u64);
            // The fast XTS paths leave encrypted tweaks here: wipe what was used.
            crate::secret::wipe_blocks(ivs);
        }
    }

    /// One 512-byte CBC sector with an IV generator that reads or changes the data
    /// (`tcw`, `lmk`); `n` is its IV sector.
    fn process_hashed_iv(&self, n: u64, sector: &mut [u8], enc: bool) {
        let Engine::Cbc { key, .. } = &self.engine else {
            unreachable!("tcw and lmk are CBC only (spec check)")
        };
        let len = key.block_size();
        let mut iv = [[0u8; 16]];
        match &self.iv_keys {
            IvKeys::Tcw(t) => {
                let nb = n.to_le_bytes();
                for (i, b) in iv[0][..len].iter_mut().enumerate() {
                    *b = t.iv_seed[i] ^ nb[i % 8];
                }
                if !enc {
                    tcw_whiten(t, n, sector);
                }
                cbc_generic_n(key, len, &iv, sector, sector.len(), enc);
                if enc {
                    tcw_whiten(t, n, sector);
                }
            }
            IvKeys::Lmk(seed) => {
                let seed = seed.as_ref().map(|s| &s.0);
                if enc {
                    iv[0] = lmk_iv(seed, n, sector);
                    cbc_generic_n(key, len, &iv, sector, sector.len(), true);
                } else {
                    // Blocks 1.. do not depend on the IV: decrypt with a zero IV, then
                    // hash the plaintext for the IV and fix the first block.
                    cbc_generic_n(key, len, &iv, sector, sector.len(), false);
                    iv[0] = lmk_iv(seed, n, sector);
                    xor_in(&mut sector[..16], &iv[0]);
                }
            }
            _ => unreachable!("called for tcw and lmk only"),
        }
        iv[0].zeroize();
    }
}

/// dm-crypt's `tcw` whitening of one 512-byte sector with IV sector `n`: the whitening key
/// XOR the sector number, each 32-bit word through CRC-32 (the kernel's `crc32`: seed 0, no
/// inversion), folded to 8 bytes, XORed over every 8 bytes. Its own inverse.
fn tcw_whiten(t: &TcwSecrets, n: u64, sector: &mut [u8]) {
    let mut w = tcw_whitening(t, n);
    for word in sector.chunks_exact_mut(8) {
        xor_in(word, &w);
    }
    w.zeroize();
}

/// The 8 whitening bytes of IV sector `n` (see [`tcw_whiten`]).
fn tcw_whitening(t: &TcwSecrets, n: u64) -> [u8; 8] {
    let nb = n.to_le_bytes();
    let mut buf = [0u8; 16];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = t.whitening[i] ^ nb[i % 8];
    }
    for w in buf.chunks_exact_mut(4) {
        let c = crate::crc::crc32_update(0, w);
        w.copy_from_slice(&c.to_le_bytes());
    }
    for i in 0..4 {
        buf[i] ^= buf[12 + i];
        buf[4 + i] ^= buf[8 + i];
    }
    let mut w = [0u8; 8];
    w.copy_from_slice(&buf[..8]);
    buf.zeroize();
    w
}

/// dm-crypt's `lmk` IV for IV sector `n` of the 512-byte plaintext `sector`: the MD5
/// state (no padding, no length) after the seed (v3), blocks 1..31 of the sector and a
/// 16-byte trailer with the sector number cut to 56 bits.
fn lmk_iv(seed: Option<&[u8; 64]>, n: u64, sector: &[u8]) -> [u8; 16] {
    let mut buf = [0u8; 64 + 512];
    let mut len = 0;
    if let Some(s) = seed {
        buf[..64].copy_from_slice(s);
        len = 64;
    }
    buf[len..len + 496].copy_from_slice(&sector[16..512]);
    len += 496;
    buf[len..len + 4].copy_from_slice(&(n as u32).to_le_bytes());
    let hi = ((n >> 32) as u32 & 0x00ff_ffff) | 0x8000_0000;
    buf[len + 4..len + 8].copy_from_slice(&hi.to_le_bytes());
    buf[len + 8..len + 12].copy_from_slice(&4024u32.to_le_bytes());
    len += 16;
    let mut state = [0x6745_2301u32, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
    let (blocks, rest) = buf[..len].as_chunks::<64>();
    debug_assert!(rest.is_empty());
    md5::block_api::compress(&mut state, blocks);
    let mut iv = [0u8; 16];
    for (o, w) in iv.chunks_exact_mut(4).zip(state) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    buf.zeroize();
    state.zeroize();
    iv
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
