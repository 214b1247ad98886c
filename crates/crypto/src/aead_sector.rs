//! dm-crypt's authenticated sectors (LUKS2 `--integrity`, issue 38): every sector sealed on
//! its own with an AEAD, or with AES-XTS and an HMAC (the kernel's `authenc`), its tag and
//! IV kept beside it by dm-integrity. The layout is the kernel's (docs/integrity-format.md
//! §4): associated data = le64(sector in 512-byte units, relative to the segment) || IV; the
//! per-sector metadata = the authentication tag, then the IV where it is random (not where
//! it is plain64, which is recomputed), then zeros up to the tag size dm-integrity keeps.
//!
//! AES-GCM runs on cryptblk's own vaes512 code where the CPU has it and on RustCrypto's
//! `aes-gcm` elsewhere; ChaCha20-Poly1305 (RFC 7539) on RustCrypto's `chacha20poly1305`;
//! AEGIS-128 on `aegis128.rs` (the AES round of RustCrypto's `aes`);
//! the HMAC modes encrypt with cryptblk's XTS (every backend) and authenticate
//! `sector || IV || ciphertext` with HMAC over the volume key's last bytes.

use crate::backend::x86::XtsKeys;
use crate::block::BlockKey;
use crate::secret::{LockedBox, SecretBytes};
use crate::sha256_lanes::Sha256Lanes;
use crate::{AesGcm, Backend, Error, HashAlg, Result};
use aead::{AeadInOut, KeyInit};
use zeroize::Zeroize;

/// How a sector's IV is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AeadIv {
    /// Random on every write and stored in the sector's metadata (`-random`).
    Random,
    /// le64(sector + IV offset), zero-padded: not stored (`-plain64`).
    Plain64,
}

/// The sector's authentication, as LUKS2's `integrity.type` names it.
enum Engine {
    /// `aes-gcm-*` with `aead`.
    Gcm(Gcm),
    /// `chacha20-*` with `poly1305` (the kernel's `rfc7539(chacha20,poly1305)`).
    ChaCha(Box<chacha20poly1305::ChaCha20Poly1305>),
    /// `aegis128-*` with `aead`.
    Aegis(Box<crate::aegis128::Aegis128>),
    /// `aes-xts-*` with `hmac(HASH)` (the kernel's `authenc(hmac(HASH),xts(aes))`).
    XtsHmac {
        xts: Xts,
        mac_key: SecretBytes,
        hash: HashAlg,
        /// The key for up to 32 sectors at once (`hmac(sha256)` where the CPU has AVX-512).
        lanes: Option<Sha256Lanes>,
    },
}

enum Gcm {
    Own(AesGcm),
    Aes128(Box<aes_gcm::Aes128Gcm>),
    Aes256(Box<aes_gcm::Aes256Gcm>),
}

/// AES-XTS with a caller-given tweak per sector.
struct Xts {
    fast: Option<LockedBox<XtsKeys>>,
    data: BlockKey,
    tweak: BlockKey,
}

/// One volume key's authenticated sector cipher: seals and opens whole sectors with their
/// per-sector metadata (dm-integrity's tags).
pub struct AeadSectorCipher {
    engine: Engine,
    iv: AeadIv,
    iv_size: usize,
    auth_size: usize,
    sector_size: u32,
    iv_offset: u64,
    name: String,
}

impl std::fmt::Debug for AeadSectorCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// The parts of `encryption` (`aes-gcm-random`) and `integrity` (`aead`, `poly1305`,
/// `hmac(sha256)`) cryptblk can serve: the engine's kind, its IV, its key bytes.
fn parse(encryption: &str, integrity: &str) -> Result<(Kind, AeadIv)> {
    let unsupported = || {
        Error::UnsupportedCipher(format!(
            "{encryption} with integrity {integrity} (cryptblk serves aes-gcm-random, \
             chacha20-random with poly1305, aegis128-random with aead, and \
             aes-xts-plain64/-random with hmac(sha1|sha256|sha512))"
        ))
    };
    let (alg, iv) = encryption.rsplit_once('-').ok_or_else(unsupported)?;
    let iv = match iv {
        "random" => AeadIv::Random,
        "plain64" => AeadIv::Plain64,
        _ => return Err(unsupported()),
    };
    let kind = match (alg, integrity) {
        ("aes-gcm", "aead") => Kind::Gcm,
        ("chacha20", "poly1305") => Kind::ChaCha,
        ("aegis128", "aead") => Kind::Aegis,
        ("aes-xts", h) => {
            // The header's name (`hmac(sha256)`) or cryptsetup's option (`hmac-sha256`).
            let hash = h
                .strip_prefix("hmac(")
                .and_then(|h| h.strip_suffix(')'))
                .or_else(|| h.strip_prefix("hmac-"))
                .ok_or_else(unsupported)?;
            match hash {
                "sha1" => Kind::XtsHmac(HashAlg::Sha1),
                "sha256" => Kind::XtsHmac(HashAlg::Sha256),
                "sha512" => Kind::XtsHmac(HashAlg::Sha512),
                _ => return Err(unsupported()),
            }
        }
        _ => return Err(unsupported()),
    };
    Ok((kind, iv))
}

#[derive(Clone, Copy)]
enum Kind {
    Gcm,
    ChaCha,
    Aegis,
    XtsHmac(HashAlg),
}

impl Kind {
    /// (IV bytes, authentication tag bytes).
    fn sizes(self) -> (usize, usize) {
        match self {
            Kind::Gcm | Kind::ChaCha => (12, 16),
            Kind::Aegis => (16, 16),
            Kind::XtsHmac(h) => (16, h.output_len()),
        }
    }
}

impl AeadSectorCipher {
    /// The bytes of metadata each sector needs for `encryption` and `integrity` (the
    /// dm-integrity tag size: cryptsetup's `INTEGRITY_tag_size`).
    pub fn tag_size_of(encryption: &str, integrity: &str) -> Result<usize> {
        let (kind, iv) = parse(encryption, integrity)?;
        let (iv_size, auth) = kind.sizes();
        Ok(auth + if iv == AeadIv::Random { iv_size } else { 0 })
    }

    /// The key for `encryption` with `integrity` over `sector_size`-byte sectors, the IV
    /// offset being the segment's `iv_tweak`. `key` is the whole volume key: for the HMAC
    /// modes the XTS key, then the HMAC key (as long as the hash's digest).
    pub fn new(
        encryption: &str,
        integrity: &str,
        key: &[u8],
        sector_size: u32,
        iv_offset: u64,
    ) -> Result<AeadSectorCipher> {
        if !(512..=4096).contains(&sector_size) || !sector_size.is_power_of_two() {
            return Err(Error::InvalidSectorSize(sector_size));
        }
        let (kind, iv) = parse(encryption, integrity)?;
        let bad_key = || Error::InvalidKeyLength {
            cipher: format!("{encryption} + {integrity}"),
            len: key.len(),
        };
        let engine = match kind {
            Kind::Gcm => Engine::Gcm(match key.len() {
                16 | 32 if AesGcm::is_available() => Gcm::Own(AesGcm::new(key)?),
                16 => Gcm::Aes128(Box::new(
                    aes_gcm::Aes128Gcm::new_from_slice(key).map_err(|_| bad_key())?,
                )),
                32 => Gcm::Aes256(Box::new(
                    aes_gcm::Aes256Gcm::new_from_slice(key).map_err(|_| bad_key())?,
                )),
                _ => return Err(bad_key()),
            }),
            Kind::ChaCha => Engine::ChaCha(Box::new(
                chacha20poly1305::ChaCha20Poly1305::new_from_slice(key).map_err(|_| bad_key())?,
            )),
            Kind::Aegis => Engine::Aegis(Box::new(
                crate::aegis128::Aegis128::new(key).ok_or_else(bad_key)?,
            )),
            Kind::XtsHmac(hash) => {
                let mac_len = hash.output_len();
                let xts_len = key.len().checked_sub(mac_len).ok_or_else(bad_key)?;
                if !matches!(xts_len, 32 | 64) {
                    return Err(bad_key());
                }
                let (xts, mac) = key.split_at(xts_len);
                let (k1, k2) = xts.split_at(xts_len / 2);
                Engine::XtsHmac {
                    xts: Xts {
                        fast: XtsKeys::new(k1, k2),
                        data: BlockKey::aes_scrubbed(k1)?,
                        tweak: BlockKey::aes_scrubbed(k2)?,
                    },
                    mac_key: SecretBytes::from_slice(mac),
                    lanes: match hash {
                        HashAlg::Sha256 if crate::sha256_lanes::fits(24, sector_size as usize) => {
                            Sha256Lanes::new(Some(mac))
                        }
                        _ => None,
                    },
                    hash,
                }
            }
        };
        let (iv_size, auth_size) = kind.sizes();
        Ok(AeadSectorCipher {
            engine,
            iv,
            iv_size,
            auth_size,
            sector_size,
            iv_offset,
            name: format!("{encryption} + {integrity}"),
        })
    }

    /// Bytes of metadata per sector (dm-integrity's tag size).
    pub fn tag_size(&self) -> usize {
        self.auth_size
            + if self.iv == AeadIv::Random {
                self.iv_size
            } else {
                0
            }
    }

    /// The sector size in bytes.
    pub fn sector_size(&self) -> u32 {
        self.sector_size
    }

    /// `encryption + integrity`, as the header names them.
    pub fn description(&self) -> &str {
        &self.name
    }

    /// Checks that `data` is whole sectors and `meta` holds their tags.
    fn check(&self, data: &[u8], meta: &[u8]) -> Result<usize> {
        let ss = self.sector_size as usize;
        if !data.len().is_multiple_of(ss) {
            return Err(Error::UnalignedLength {
                len: data.len(),
                sector_size: self.sector_size,
            });
        }
        let n = data.len() / ss;
        if meta.len() != n * self.tag_size() {
            return Err(Error::UnsupportedCipher(format!(
                "{}: {} bytes of metadata for {n} sectors",
                self.name,
                meta.len()
            )));
        }
        Ok(n)
    }

    /// Bytes of stack below `seal`/`open` that the engine's frames may have written key
    /// material into, wiped after each call.
    fn wipe_bytes(&self) -> usize {
        match self.engine {
            Engine::Gcm(Gcm::Own(_)) | Engine::Aegis(_) => WIPE_OURS,
            Engine::Gcm(_) => WIPE_RUSTCRYPTO_GCM,
            Engine::ChaCha(_) => WIPE_CHACHA,
            Engine::XtsHmac { .. } => WIPE_HMAC,
        }
    }

    /// Wipes the stack below the caller that the engine's frames may have written key
    /// material into (see [`WIPE_OURS`]).
    fn scrub(&self) {
        use crate::secret::scrub_frames;
        match self.wipe_bytes() {
            WIPE_OURS => scrub_frames::<WIPE_OURS>(),
            WIPE_CHACHA => scrub_frames::<WIPE_CHACHA>(),
            WIPE_HMAC => scrub_frames::<WIPE_HMAC>(),
            _ => scrub_frames::<WIPE_RUSTCRYPTO_GCM>(),
        }
    }

    /// Sector `i`'s IV into `iv`: read from its metadata, or computed.
    fn iv_of(&self, dm_sector: u64, meta: &[u8], iv: &mut [u8]) {
        match self.iv {
            AeadIv::Random => iv.copy_from_slice(&meta[self.auth_size..][..self.iv_size]),
            AeadIv::Plain64 => {
                iv.fill(0);
                iv[..8].copy_from_slice(&(dm_sector + self.iv_offset).to_le_bytes());
            }
        }
    }

    /// Encrypts `data` (whole sectors; `sector` the first one's index in sector-size
    /// units within the segment) in place and writes each sector's metadata into `meta`
    /// (`tag_size()` bytes per sector). Random IVs are fresh for every call.
    pub fn seal(&self, sector: u64, data: &mut [u8], meta: &mut [u8]) -> Result<()> {
        let r = self.seal_sectors(sector, data, meta);
        self.scrub();
        r
    }

    fn seal_sectors(&self, sector: u64, data: &mut [u8], meta: &mut [u8]) -> Result<()> {
        let n = self.check(data, meta)?;
        let ts = self.tag_size();
        let per = u64::from(self.sector_size / 512);
        if self.iv == AeadIv::Random {
            crate::iv_stream::fill_slots(meta, ts, self.auth_size, self.iv_size)?;
        }
        let ss = self.sector_size as usize;
        if let Engine::Aegis(a) = &self.engine {
            // Sectors side by side (eight, then four, at a time on VAES-512).
            for (g, (d, m)) in data
                .chunks_mut(AEGIS_GROUP * ss)
                .zip(meta.chunks_mut(AEGIS_GROUP * ts))
                .enumerate()
            {
                let k = d.len() / ss;
                let (ivs, aads) =
                    self.ivs_and_aads::<AEGIS_GROUP>(sector + (g * AEGIS_GROUP) as u64, m, k);
                let aad_refs: [&[u8]; AEGIS_GROUP] = std::array::from_fn(|i| &aads[i][..]);
                let mut tags = [[0u8; 16]; AEGIS_GROUP];
                a.crypt_sectors(&ivs[..k], &aad_refs[..k], d, ss, true, &mut tags[..k]);
                for (m, t) in m.chunks_exact_mut(ts).zip(&tags) {
                    m[..16].copy_from_slice(t);
                    if self.iv == AeadIv::Plain64 {
                        m[16..].fill(0);
                    }
                }
            }
            return Ok(());
        }
        if let (Engine::Gcm(Gcm::Own(g)), AeadIv::Random, 1) = (&self.engine, self.iv, n) {
            // One sector: one call, nothing to gather.
            let (nonce, aad) = gcm_random_nonce(sector * per, meta);
            meta[..16].copy_from_slice(&g.seal_in_place(&nonce, &aad, data));
            return Ok(());
        }
        if let (Engine::Gcm(Gcm::Own(g)), AeadIv::Random) = (&self.engine, self.iv) {
            // A request's sectors as one stream, up to GCM_GROUP at a time.
            for (c, (d, m)) in data
                .chunks_mut(GCM_GROUP * ss)
                .zip(meta.chunks_mut(GCM_GROUP * ts))
                .enumerate()
            {
                let k = d.len() / ss;
                let (nonces, aads) =
                    gcm_random_nonces(sector + (c * GCM_GROUP) as u64, per, m, k, ts);
                let aad_refs: [&[u8]; GCM_GROUP] = std::array::from_fn(|i| &aads[i][..]);
                let mut tags = [[0u8; 16]; GCM_GROUP];
                g.seal_sectors(&nonces[..k], &aad_refs[..k], d, &mut tags[..k]);
                for (m, t) in m.chunks_exact_mut(ts).zip(&tags) {
                    m[..16].copy_from_slice(t);
                }
            }
            return Ok(());
        }
        if let Engine::XtsHmac { xts, .. } = &self.engine {
            let mut tweaks = self.tweaks(sector, meta, n);
            xts.run(&mut tweaks, data, ss, true);
            self.seal_hmacs(sector, data, meta);
            return Ok(());
        }
        let mut iv = [0u8; 16];
        for (i, (d, m)) in data
            .chunks_exact_mut(ss)
            .zip(meta.chunks_exact_mut(ts))
            .enumerate()
        {
            let s = (sector + i as u64) * per;
            let iv = &mut iv[..self.iv_size];
            self.iv_of(s, m, iv);
            let aad = aad(s, iv);
            let (auth, rest) = m.split_at_mut(self.auth_size);
            match &self.engine {
                Engine::Gcm(g) => g.seal(iv, &aad[..8 + self.iv_size], d, auth)?,
                Engine::ChaCha(c) => {
                    let tag = c
                        .encrypt_inout_detached(
                            iv.as_ref().try_into().unwrap(),
                            &aad[..20],
                            d.into(),
                        )
                        .map_err(|_| Error::Gcm("ChaCha20-Poly1305 seal".into()))?;
                    auth.copy_from_slice(&tag);
                }
                Engine::Aegis(a) => {
                    let nonce: &[u8; 16] = iv.as_ref().try_into().expect("16-byte IVs");
                    auth.copy_from_slice(&a.seal(nonce, &aad[..24], d));
                }
                Engine::XtsHmac { .. } => unreachable!("sealed above"),
            }
            if self.iv == AeadIv::Plain64 {
                rest.fill(0);
            } else {
                rest[self.iv_size..].fill(0);
            }
        }
        Ok(())
    }

    /// Verifies and decrypts `data` in place with its metadata `meta`; see
    /// [`AeadSectorCipher::seal`]. A sector whose tag does not verify is filled with zeros
    /// (its bytes are never handed out) and its index in `data` pushed onto `bad`; the
    /// others are decrypted.
    pub fn open(
        &self,
        sector: u64,
        data: &mut [u8],
        meta: &[u8],
        bad: &mut Vec<usize>,
    ) -> Result<()> {
        let r = self.open_sectors(sector, data, meta, bad);
        self.scrub();
        r
    }

    fn open_sectors(
        &self,
        sector: u64,
        data: &mut [u8],
        meta: &[u8],
        bad: &mut Vec<usize>,
    ) -> Result<()> {
        let n = self.check(data, meta)?;
        let (ss, ts) = (self.sector_size as usize, self.tag_size());
        let per = u64::from(self.sector_size / 512);
        let first_bad = bad.len();
        if let Engine::Aegis(a) = &self.engine {
            for (g, (d, m)) in data
                .chunks_mut(AEGIS_GROUP * ss)
                .zip(meta.chunks(AEGIS_GROUP * ts))
                .enumerate()
            {
                let k = d.len() / ss;
                let (ivs, aads) =
                    self.ivs_and_aads::<AEGIS_GROUP>(sector + (g * AEGIS_GROUP) as u64, m, k);
                let aad_refs: [&[u8]; AEGIS_GROUP] = std::array::from_fn(|i| &aads[i][..]);
                let mut tags = [[0u8; 16]; AEGIS_GROUP];
                a.crypt_sectors(&ivs[..k], &aad_refs[..k], d, ss, false, &mut tags[..k]);
                for (i, (m, t)) in m.chunks_exact(ts).zip(&tags).enumerate() {
                    if !crate::constant_time_eq(&m[..16], t) {
                        d[i * ss..][..ss].fill(0);
                        bad.push(g * AEGIS_GROUP + i);
                    }
                }
            }
            return Ok(());
        }
        if let (Engine::Gcm(Gcm::Own(g)), AeadIv::Random, 1) = (&self.engine, self.iv, n) {
            let (nonce, aad) = gcm_random_nonce(sector * per, meta);
            if g.open_in_place(&nonce, &aad, data, &meta[..16]).is_err() {
                bad.push(0);
            }
            return Ok(());
        }
        if let (Engine::Gcm(Gcm::Own(g)), AeadIv::Random) = (&self.engine, self.iv) {
            for (c, (d, m)) in data
                .chunks_mut(GCM_GROUP * ss)
                .zip(meta.chunks(GCM_GROUP * ts))
                .enumerate()
            {
                let k = d.len() / ss;
                let first = sector + (c * GCM_GROUP) as u64;
                let (nonces, aads) = gcm_random_nonces(first, per, m, k, ts);
                let aad_refs: [&[u8]; GCM_GROUP] = std::array::from_fn(|i| &aads[i][..]);
                let tags: [[u8; 16]; GCM_GROUP] = std::array::from_fn(|i| {
                    m.get(i * ts..i * ts + 16)
                        .map_or([0; 16], |t| t.try_into().expect("16 bytes"))
                });
                let before = bad.len();
                g.open_sectors(&nonces[..k], &aad_refs[..k], d, &tags[..k], bad);
                for b in &mut bad[before..] {
                    *b += c * GCM_GROUP;
                }
            }
            return Ok(());
        }
        if let Engine::XtsHmac { xts, .. } = &self.engine {
            // Each sector's MAC over its ciphertext first, then decryption; a sector whose
            // MAC differs is zeroed.
            self.check_hmacs(sector, data, meta, bad);
            let mut tweaks = self.tweaks(sector, meta, n);
            xts.run(&mut tweaks, data, ss, false);
            for &i in &bad[first_bad..] {
                data[i * ss..][..ss].fill(0);
            }
            return Ok(());
        }
        let mut iv = [0u8; 16];
        for (i, (d, m)) in data
            .chunks_exact_mut(ss)
            .zip(meta.chunks_exact(ts))
            .enumerate()
        {
            let s = (sector + i as u64) * per;
            let iv = &mut iv[..self.iv_size];
            self.iv_of(s, m, iv);
            let aad = aad(s, iv);
            let auth = &m[..self.auth_size];
            let ok = match &self.engine {
                Engine::Gcm(g) => g.open(iv, &aad[..8 + self.iv_size], d, auth),
                Engine::ChaCha(c) => c
                    .decrypt_inout_detached(
                        iv.as_ref().try_into().unwrap(),
                        &aad[..20],
                        d.into(),
                        auth.try_into().unwrap(),
                    )
                    .is_ok(),
                Engine::Aegis(a) => {
                    let nonce: &[u8; 16] = iv.as_ref().try_into().expect("16-byte IVs");
                    a.open(nonce, &aad[..24], d, auth)
                }
                Engine::XtsHmac { .. } => unreachable!("opened above"),
            };
            if !ok {
                d.fill(0);
                bad.push(i);
            }
        }
        Ok(())
    }

    /// Each of `n` (at most `N`) sectors' 16-byte IV and its associated data (le64 sector
    /// || IV), on the stack.
    fn ivs_and_aads<const N: usize>(
        &self,
        sector: u64,
        meta: &[u8],
        n: usize,
    ) -> ([[u8; 16]; N], [[u8; 24]; N]) {
        let per = u64::from(self.sector_size / 512);
        let ts = self.tag_size();
        let mut ivs = [[0u8; 16]; N];
        let mut aads = [[0u8; 24]; N];
        for (i, (iv, a)) in ivs.iter_mut().zip(aads.iter_mut()).take(n).enumerate() {
            let s = (sector + i as u64) * per;
            self.iv_of(s, &meta[i * ts..][..ts], iv);
            *a = aad(s, iv);
        }
        (ivs, aads)
    }

    /// Each sector's MAC over its ciphertext (`data`, the first sector `sector`) into its
    /// metadata, a group at a time. Not inlined, like [`Self::check_hmacs`]: the groups'
    /// arrays (~5 KiB at 32 sectors) stay out of the other engines' frames, whose wipe
    /// is smaller.
    #[inline(never)]
    fn seal_hmacs(&self, sector: u64, data: &[u8], meta: &mut [u8]) {
        let (ss, ts) = (self.sector_size as usize, self.tag_size());
        for (c, (d, m)) in data
            .chunks(HMAC_GROUP * ss)
            .zip(meta.chunks_mut(HMAC_GROUP * ts))
            .enumerate()
        {
            let tags = self.hmac_group(sector + (c * HMAC_GROUP) as u64, d, m);
            for (m, t) in m.chunks_exact_mut(ts).zip(&tags) {
                m[..self.auth_size].copy_from_slice(&t[..self.auth_size]);
            }
        }
    }

    /// The index (in `data`) of each sector whose MAC in `meta` is not its ciphertext's,
    /// pushed to `bad`.
    #[inline(never)]
    fn check_hmacs(&self, sector: u64, data: &[u8], meta: &[u8], bad: &mut Vec<usize>) {
        let (ss, ts) = (self.sector_size as usize, self.tag_size());
        for (c, (d, m)) in data
            .chunks(HMAC_GROUP * ss)
            .zip(meta.chunks(HMAC_GROUP * ts))
            .enumerate()
        {
            let tags = self.hmac_group(sector + (c * HMAC_GROUP) as u64, d, m);
            for (i, (m, t)) in m.chunks_exact(ts).zip(&tags).enumerate() {
                let auth = &m[..self.auth_size];
                if !crate::constant_time_eq(auth, &t[..self.auth_size]) {
                    bad.push(c * HMAC_GROUP + i);
                }
            }
        }
    }

    /// The HMAC of each of the (at most [`HMAC_GROUP`]) sectors of `d` (ciphertext, the
    /// first being `sector`; `m` their metadata, for random IVs): side by side
    /// where the lanes run and there are enough of them, else one by one. The first
    /// `auth_size` bytes of each row are the tag.
    fn hmac_group(&self, sector: u64, d: &[u8], m: &[u8]) -> [[u8; 64]; HMAC_GROUP] {
        let Engine::XtsHmac {
            mac_key,
            hash,
            lanes,
            ..
        } = &self.engine
        else {
            unreachable!("HMAC modes only")
        };
        let ss = self.sector_size as usize;
        let k = d.len() / ss;
        let (_, aads) = self.ivs_and_aads::<HMAC_GROUP>(sector, m, k);
        let mut tags = [[0u8; 64]; HMAC_GROUP];
        match lanes {
            Some(l) if k >= crate::sha256_lanes::WORTH_FROM => {
                let pre: [&[u8]; HMAC_GROUP] = std::array::from_fn(|i| &aads[i][..]);
                for (t, o) in tags.iter_mut().zip(&l.blocks(&pre, d, ss)) {
                    t[..32].copy_from_slice(o);
                }
            }
            _ => {
                for (i, (t, body)) in tags.iter_mut().zip(d.chunks_exact(ss)).enumerate() {
                    hmac_into(
                        *hash,
                        mac_key,
                        &[&aads[i][..], body],
                        &mut t[..self.auth_size],
                    );
                }
            }
        }
        tags
    }

    /// The XTS tweak of each of `n` sectors from `sector` on.
    fn tweaks(&self, sector: u64, meta: &[u8], n: usize) -> Vec<[u8; 16]> {
        let per = u64::from(self.sector_size / 512);
        let ts = self.tag_size();
        (0..n)
            .map(|i| {
                let mut iv = [0u8; 16];
                self.iv_of((sector + i as u64) * per, &meta[i * ts..][..ts], &mut iv);
                iv
            })
            .collect()
    }
}

/// AEGIS sectors handed to the engine at once: what it runs side by side at most.
const AEGIS_GROUP: usize = 8;

/// `aes-gcm-random`'s nonce (the IV stored after the 16-byte tag) and associated data
/// (sector number LE64, then the nonce) for the one sector `dm_sector`.
fn gcm_random_nonce(dm_sector: u64, meta: &[u8]) -> ([u8; 12], [u8; 20]) {
    let nonce: [u8; 12] = meta[16..28].try_into().expect("tag then a 12-byte IV");
    let mut aad = [0u8; 20];
    aad[..8].copy_from_slice(&dm_sector.to_le_bytes());
    aad[8..].copy_from_slice(&nonce);
    (nonce, aad)
}

/// Sectors of an `aes-gcm-random` request handed to the engine at once.
const GCM_GROUP: usize = 16;

/// How deep below `seal`/`open` each engine's frames reach, with a KiB to spare: the stack
/// wiped after each call. As `every_engine_stays_within_its_wipe` measures them (Rust
/// 1.95, every backend): our AES-GCM and AEGIS 5.5 KiB; RustCrypto's AES-GCM (CPUs without
/// AVX-512) 12.3; ChaCha20-Poly1305 6.1; the HMAC modes 20.4 (two sets of SHA-256
/// lanes: their registers spilled, 32 sectors' tags and associated data).
const WIPE_OURS: usize = 7 << 10;
const WIPE_RUSTCRYPTO_GCM: usize = 15 << 10;
const WIPE_CHACHA: usize = 8 << 10;
pub(crate) const WIPE_HMAC: usize = 22 << 10;

/// Sectors whose HMACs are computed together: what the SHA-256 lanes take at once.
const HMAC_GROUP: usize = crate::sha256_lanes::MESSAGES;

/// `aes-gcm-random`'s nonces (each the IV stored after the 16-byte tag) and associated
/// data (sector number LE64, then the nonce) for `n` (at most [`GCM_GROUP`]) sectors from
/// `sector` on (`per` dm-crypt sectors each): the hot path's fixed-size copies, on the
/// stack, where [`AeadSectorCipher::iv_of`] and [`aad`] take any IV size.
fn gcm_random_nonces(
    sector: u64,
    per: u64,
    meta: &[u8],
    n: usize,
    ts: usize,
) -> ([[u8; 12]; GCM_GROUP], [[u8; 20]; GCM_GROUP]) {
    let mut nonces = [[0u8; 12]; GCM_GROUP];
    let mut aads = [[0u8; 20]; GCM_GROUP];
    for (i, (nonce, aad)) in nonces.iter_mut().zip(aads.iter_mut()).take(n).enumerate() {
        (*nonce, *aad) = gcm_random_nonce((sector + i as u64) * per, &meta[i * ts..]);
    }
    (nonces, aads)
}

/// le64(sector) || IV, in a buffer long enough for every engine's IV.
fn aad(sector: u64, iv: &[u8]) -> [u8; 24] {
    let mut a = [0u8; 24];
    a[..8].copy_from_slice(&sector.to_le_bytes());
    a[8..8 + iv.len()].copy_from_slice(iv);
    a
}

/// HMAC over the concatenation of `parts`, its first `out.len()` bytes into `out`.
pub(crate) fn hmac_into(hash: HashAlg, key: &[u8], parts: &[&[u8]], out: &mut [u8]) {
    fn run<D>(key: &[u8], parts: &[&[u8]], out: &mut [u8])
    where
        D: hmac::digest::Digest + hmac::digest::block_api::BlockSizeUser,
        hmac::SimpleHmac<D>:
            hmac::digest::KeyInit + hmac::digest::Update + hmac::digest::FixedOutput,
    {
        use hmac::digest::{FixedOutput, KeyInit, Update};
        let mut m = <hmac::SimpleHmac<D> as KeyInit>::new_from_slice(key).expect("any key length");
        for p in parts {
            m.update(p);
        }
        let mut full = m.finalize_fixed();
        out.copy_from_slice(&full[..out.len()]);
        full.as_mut_slice().zeroize();
    }
    match hash {
        HashAlg::Sha1 => run::<sha1::Sha1>(key, parts, out),
        HashAlg::Sha256 => run::<sha2::Sha256>(key, parts, out),
        HashAlg::Sha512 => run::<sha2::Sha512>(key, parts, out),
        _ => unreachable!("parse admits sha1, sha256 and sha512"),
    }
}

impl Gcm {
    fn seal(&self, iv: &[u8], aad: &[u8], data: &mut [u8], tag: &mut [u8]) -> Result<()> {
        let nonce: &[u8; 12] = iv.try_into().expect("GCM IVs are 12 bytes");
        let t = match self {
            Gcm::Own(g) => g.seal_in_place(nonce, aad, data),
            Gcm::Aes128(g) => g
                .encrypt_inout_detached(nonce.into(), aad, data.into())
                .map_err(|_| Error::Gcm("seal".into()))?
                .into(),
            Gcm::Aes256(g) => g
                .encrypt_inout_detached(nonce.into(), aad, data.into())
                .map_err(|_| Error::Gcm("seal".into()))?
                .into(),
        };
        tag.copy_from_slice(&t);
        Ok(())
    }

    /// Whether the tag verified (then `data` is decrypted).
    fn open(&self, iv: &[u8], aad: &[u8], data: &mut [u8], tag: &[u8]) -> bool {
        let nonce: &[u8; 12] = iv.try_into().expect("GCM IVs are 12 bytes");
        let tag16: &[u8; 16] = tag.try_into().expect("GCM tags are 16 bytes");
        match self {
            Gcm::Own(g) => g.open_in_place(nonce, aad, data, tag).is_ok(),
            Gcm::Aes128(g) => g
                .decrypt_inout_detached(nonce.into(), aad, data.into(), tag16.into())
                .is_ok(),
            Gcm::Aes256(g) => g
                .decrypt_inout_detached(nonce.into(), aad, data.into(), tag16.into())
                .is_ok(),
        }
    }
}

impl Xts {
    fn run(&self, tweaks: &mut [[u8; 16]], data: &mut [u8], unit: usize, enc: bool) {
        let backend = Backend::current().unwrap_or(Backend::Generic);
        match &self.fast {
            Some(f) if backend != Backend::Generic => f.xts(backend, tweaks, data, unit, enc),
            _ => crate::modes::xts_generic(&self.data, &self.tweak, tweaks, data, unit, enc),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek};

    /// Stack painted below the measuring frame.
    const PAINT: usize = 32 << 10;

    #[inline(never)]
    fn paint() -> usize {
        let mut z = [0xa5u8; PAINT];
        std::hint::black_box(&mut z);
        z.as_ptr() as usize
    }

    /// How far below this frame `f`'s frames wrote: the stack under it painted first, then
    /// read back through /proc/self/mem (reading it directly would read memory Rust
    /// considers dead).
    #[inline(never)]
    fn depth_of(f: &mut dyn FnMut()) -> usize {
        let base = paint();
        f();
        let mut mem = std::fs::File::open("/proc/self/mem").unwrap();
        mem.seek(std::io::SeekFrom::Start(base as u64)).unwrap();
        let mut b = vec![0u8; PAINT];
        mem.read_exact(&mut b).unwrap();
        PAINT - b.iter().position(|&x| x != 0xa5).unwrap_or(PAINT)
    }

    /// The wipe zeroes all the bytes it is sized for, right below its caller (its own
    /// store loop on AVX-512 CPUs; a mutation storing half as many fails this). The calls
    /// that read the stack back afterwards write over its top 2 KiB, which is not counted.
    #[test]
    fn the_wipe_zeroes_its_whole_size() {
        #[inline(never)]
        fn wipe() {
            crate::secret::scrub_frames::<WIPE_OURS>();
        }
        let mut mem = std::fs::File::open("/proc/self/mem").unwrap();
        let mut b = vec![0u8; PAINT];
        // The feature check caches its answer on first use, deeper than the wipe's frame.
        #[cfg(target_arch = "x86_64")]
        let _ = std::hint::black_box(std::arch::is_x86_feature_detected!("avx512f"));
        let base = paint();
        wipe();
        mem.seek(std::io::SeekFrom::Start(base as u64)).unwrap();
        mem.read_exact(&mut b).unwrap();
        let (below, wiped) = b[..PAINT - 2048].split_at(PAINT - WIPE_OURS - 512);
        let zeros = wiped.iter().filter(|&&x| x == 0).count();
        assert!(
            zeros >= WIPE_OURS - 2048 - 64,
            "{zeros} bytes zeroed of the wipe's lower {}",
            WIPE_OURS - 2048
        );
        assert!(below.iter().all(|&x| x == 0xa5), "the wipe went deeper");
    }

    /// Every engine, sealing and opening one, sixteen and 21 sectors of 512 and 4096
    /// bytes, writes no deeper below the call than the wipe after it reaches, with 1 KiB to
    /// spare: key material an engine spills is never left out of the wipe's reach. Also
    /// the engines other CPUs get: RustCrypto's AES-GCM, the portable XTS and HMAC one
    /// sector at a time. (Found RustCrypto's GCM, the HMAC and the ChaCha20 modes reaching
    /// past the one 6 KiB wipe there was.)
    #[test]
    fn every_engine_stays_within_its_wipe() {
        for (e, i, ks) in [
            ("aes-gcm-random", "aead", 32),
            ("aes-gcm-random", "aead", 16),
            ("chacha20-random", "poly1305", 32),
            ("aegis128-random", "aead", 16),
            ("aes-xts-plain64", "hmac(sha256)", 96),
            ("aes-xts-random", "hmac(sha256)", 64),
            ("aes-xts-plain64", "hmac(sha1)", 84),
            ("aes-xts-random", "hmac(sha512)", 128),
        ] {
            for ss in [512usize, 4096] {
                let key = vec![7u8; ks];
                let ours = AeadSectorCipher::new(e, i, &key, ss as u32, 0).unwrap();
                // What a CPU without AVX-512 (or VAES, or AES-NI) runs instead.
                let mut other = AeadSectorCipher::new(e, i, &key, ss as u32, 0).unwrap();
                match &mut other.engine {
                    Engine::Gcm(g) => {
                        *g = match ks {
                            16 => Gcm::Aes128(Box::new(
                                aes_gcm::Aes128Gcm::new_from_slice(&key).unwrap(),
                            )),
                            _ => Gcm::Aes256(Box::new(
                                aes_gcm::Aes256Gcm::new_from_slice(&key).unwrap(),
                            )),
                        }
                    }
                    Engine::XtsHmac { xts, lanes, .. } => {
                        xts.fast = None;
                        *lanes = None;
                    }
                    _ => {}
                }
                for (c, n) in [&ours, &other]
                    .into_iter()
                    .flat_map(|c| [(c, 1usize), (c, 16), (c, 21)])
                {
                    let mut data = vec![1u8; n * ss];
                    let mut meta = vec![0u8; n * c.tag_size()];
                    let sealed = depth_of(&mut || c.seal_sectors(5, &mut data, &mut meta).unwrap());
                    let mut bad = Vec::new();
                    let opened =
                        depth_of(&mut || c.open_sectors(5, &mut data, &meta, &mut bad).unwrap());
                    assert!(bad.is_empty());
                    let deepest = sealed.max(opened);
                    assert!(
                        deepest + 1024 <= c.wipe_bytes(),
                        "{e} + {i}, {ks}-byte key, {n} sectors of {ss}: frames reach {deepest} \
                         bytes, the wipe {}",
                        c.wipe_bytes()
                    );
                }
            }
        }
    }
}
