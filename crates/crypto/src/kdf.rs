//! Password-based key derivation as LUKS uses it: PBKDF2-HMAC and Argon2i/Argon2id (v1.3),
//! with cryptsetup's defaults and time-calibrated costs.

use crate::{Error, HashAlg, Result};
use std::time::{Duration, Instant};

/// Argon2 flavours LUKS2 stores (`"argon2i"`, `"argon2id"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Argon2Variant {
    /// Argon2i: data-independent memory access (side-channel resistant).
    Argon2i,
    /// Argon2id: hybrid of Argon2i and Argon2d; cryptsetup's LUKS2 default.
    Argon2id,
}

impl Argon2Variant {
    /// The LUKS2 JSON `type` name (`argon2i`, `argon2id`).
    pub fn name(self) -> &'static str {
        match self {
            Argon2Variant::Argon2i => "argon2i",
            Argon2Variant::Argon2id => "argon2id",
        }
    }
}

/// A fully specified KDF: everything needed to derive the same bytes again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kdf {
    /// PBKDF2 with HMAC over `hash` (LUKS1 and LUKS2 `pbkdf2`).
    Pbkdf2 {
        /// The HMAC hash.
        hash: HashAlg,
        /// Iteration count; [`Kdf::derive`] rejects 0.
        iterations: u32,
    },
    /// Argon2 version 1.3 (LUKS2 `argon2i` / `argon2id`).
    Argon2 {
        /// Argon2i or Argon2id.
        variant: Argon2Variant,
        /// Time cost: number of passes over memory.
        time: u32,
        /// Memory cost in KiB.
        memory_kib: u32,
        /// Degree of parallelism (lanes).
        parallel: u32,
    },
}

/// cryptsetup's floor for PBKDF2: never fewer than 1000 iterations, calibrated or forced.
pub const PBKDF2_MIN_ITERATIONS: u32 = 1000;
/// cryptsetup's floor for the Argon2 time cost: at least 4 passes, calibrated or forced.
pub const ARGON2_MIN_TIME: u32 = 4;
/// Smallest Argon2 memory cost in KiB (32 KiB); requests below are raised to it.
pub const ARGON2_MIN_MEMORY_KIB: u32 = 32;
/// Largest Argon2 memory cost in KiB (4 GiB), as cryptsetup limits it; requests above are
/// lowered to it, and headers asking for more are rejected.
pub const ARGON2_MAX_MEMORY_KIB: u32 = 4 * 1024 * 1024;
/// cryptsetup's default memory cap for Argon2, in KiB (1 GiB).
pub const DEFAULT_ARGON2_MEMORY_KIB: u32 = 1024 * 1024;
/// cryptsetup's default unlock-time target for calibration, in milliseconds (2 s).
pub const DEFAULT_ITER_TIME_MS: u32 = 2000;

impl Kdf {
    /// Derives `out.len()` bytes from `passphrase` and `salt`.
    pub fn derive(&self, passphrase: &[u8], salt: &[u8], out: &mut [u8]) -> Result<()> {
        match *self {
            Kdf::Pbkdf2 { hash, iterations } => {
                if iterations == 0 {
                    return Err(Error::Kdf("PBKDF2 iteration count 0".into()));
                }
                pbkdf2_with(hash, passphrase, salt, iterations, out)?;
                Ok(())
            }
            Kdf::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            } => argon2_raw(
                variant,
                time,
                memory_kib,
                parallel,
                passphrase,
                salt,
                &[],
                &[],
                out,
            ),
        }
    }

    /// The LUKS2 JSON `type` name.
    pub fn type_name(&self) -> &'static str {
        match self {
            Kdf::Pbkdf2 { .. } => "pbkdf2",
            Kdf::Argon2 { variant, .. } => variant.name(),
        }
    }
}

/// Argon2 (version 1.3) with every input RFC 9106 defines, including the optional secret
/// key `K` and associated data `X`; `out.len()` is the tag length. LUKS2 uses neither
/// (`Kdf::derive` passes both empty), but the RFC's test vectors do, so tests go through
/// the same code path.
#[allow(clippy::too_many_arguments)]
pub fn argon2_raw(
    variant: Argon2Variant,
    time: u32,
    memory_kib: u32,
    parallel: u32,
    password: &[u8],
    salt: &[u8],
    secret: &[u8],
    ad: &[u8],
    out: &mut [u8],
) -> Result<()> {
    let alg = match variant {
        Argon2Variant::Argon2i => argon2::Algorithm::Argon2i,
        Argon2Variant::Argon2id => argon2::Algorithm::Argon2id,
    };
    let data = argon2::AssociatedData::new(ad)
        .map_err(|e| Error::Kdf(format!("argon2 associated data: {e}")))?;
    let params = argon2::ParamsBuilder::new()
        .m_cost(memory_kib)
        .t_cost(time)
        .p_cost(parallel)
        .output_len(out.len())
        .data(data)
        .build()
        .map_err(|e| Error::Kdf(format!("argon2 parameters: {e}")))?;
    argon2::Argon2::new_with_secret(secret, alg, argon2::Version::V0x13, params)
        .map_err(|e| Error::Kdf(format!("argon2 secret: {e}")))?
        .hash_password_into(password, salt, out)
        .map_err(|e| Error::Kdf(format!("argon2: {e}")))
}

/// Which KDF to calibrate, and how hard (cryptsetup's `--pbkdf*` and `--iter-time` options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KdfRequest {
    /// `pbkdf2`, `argon2i` or `argon2id`.
    pub kind: KdfKind,
    /// Hash for PBKDF2.
    pub hash: HashAlg,
    /// Target unlock time in milliseconds (`--iter-time`).
    pub iter_time_ms: u32,
    /// `--pbkdf-force-iterations`: iterations (PBKDF2) or time cost (Argon2); skips calibration.
    pub forced_iterations: Option<u32>,
    /// `--pbkdf-memory` in KiB (Argon2 only); the cap when calibrating.
    pub memory_kib: u32,
    /// `--pbkdf-parallel` (Argon2 lanes).
    pub parallel: u32,
}

/// A KDF algorithm without costs (cryptsetup's `--pbkdf` choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdfKind {
    /// PBKDF2 (`pbkdf2`), with the hash given in [`KdfRequest::hash`].
    Pbkdf2,
    /// Argon2 (`argon2i` or `argon2id`).
    Argon2(Argon2Variant),
}

impl KdfKind {
    /// Parses a `--pbkdf` name: `pbkdf2`, `argon2i` or `argon2id` (exact, lower case).
    ///
    /// Fails with [`Error::Kdf`] for any other name.
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "pbkdf2" => Ok(KdfKind::Pbkdf2),
            "argon2i" => Ok(KdfKind::Argon2(Argon2Variant::Argon2i)),
            "argon2id" => Ok(KdfKind::Argon2(Argon2Variant::Argon2id)),
            _ => Err(Error::Kdf(format!("unknown PBKDF '{name}'"))),
        }
    }
}

impl KdfRequest {
    /// cryptsetup's LUKS2 default: argon2id, 2 s, up to 1 GiB, min(4, CPUs) lanes.
    pub fn luks2_default() -> Self {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        KdfRequest {
            kind: KdfKind::Argon2(Argon2Variant::Argon2id),
            hash: HashAlg::Sha256,
            iter_time_ms: DEFAULT_ITER_TIME_MS,
            forced_iterations: None,
            memory_kib: DEFAULT_ARGON2_MEMORY_KIB,
            parallel: cpus.clamp(1, 4),
        }
    }

    /// cryptsetup's LUKS1 default: PBKDF2-SHA256, 2 s.
    pub fn luks1_default() -> Self {
        KdfRequest {
            kind: KdfKind::Pbkdf2,
            ..Self::luks2_default()
        }
    }

    /// Resolves the request to concrete costs, measuring this machine unless costs are forced.
    pub fn resolve(&self, key_len: usize) -> Result<Kdf> {
        match self.kind {
            KdfKind::Pbkdf2 => {
                let iterations = match self.forced_iterations {
                    Some(i) if i < PBKDF2_MIN_ITERATIONS => {
                        return Err(Error::Kdf(format!(
                            "forced PBKDF2 iterations {i} below the minimum {PBKDF2_MIN_ITERATIONS}"
                        )));
                    }
                    Some(i) => i,
                    None => pbkdf2_iterations_for(self.hash, key_len, self.iter_time_ms)?,
                };
                Ok(Kdf::Pbkdf2 {
                    hash: self.hash,
                    iterations,
                })
            }
            KdfKind::Argon2(variant) => {
                let memory_kib = self
                    .memory_kib
                    .clamp(ARGON2_MIN_MEMORY_KIB, ARGON2_MAX_MEMORY_KIB);
                let parallel = self.parallel.clamp(1, 16);
                if let Some(t) = self.forced_iterations {
                    if t < ARGON2_MIN_TIME {
                        return Err(Error::Kdf(format!(
                            "forced Argon2 time cost {t} below the minimum {ARGON2_MIN_TIME}"
                        )));
                    }
                    return Ok(Kdf::Argon2 {
                        variant,
                        time: t,
                        memory_kib,
                        parallel,
                    });
                }
                argon2_costs_for(variant, memory_kib, parallel, key_len, self.iter_time_ms)
            }
        }
    }
}

fn time_it(f: impl FnOnce() -> Result<()>) -> Result<Duration> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed())
}

/// PBKDF2-HMAC with `hash`: HMAC with its pads' states computed once (as cryptsetup's
/// crypto backends do) where the hash allows, plain HMAC over BLAKE2 (whose buffering the
/// cached-state HMAC does not take); RFC 8018's PBKDF2 either way.
fn pbkdf2_with(
    hash: HashAlg,
    pass: &[u8],
    salt: &[u8],
    iterations: u32,
    out: &mut [u8],
) -> Result<()> {
    use pbkdf2::pbkdf2_hmac as eager;
    fn simple<D>(pass: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) -> Result<()>
    where
        D: hmac::digest::Digest + hmac::digest::block_api::BlockSizeUser,
        hmac::SimpleHmac<D>:
            hmac::digest::KeyInit + hmac::digest::Update + hmac::digest::FixedOutput + Clone + Sync,
    {
        pbkdf2::pbkdf2::<hmac::SimpleHmac<D>>(pass, salt, iterations, out)
            .map_err(|_| Error::Kdf("PBKDF2 output length".into()))
    }
    match hash {
        HashAlg::Sha1 => eager::<sha1::Sha1>(pass, salt, iterations, out),
        HashAlg::Sha224 => eager::<sha2::Sha224>(pass, salt, iterations, out),
        HashAlg::Sha256 => eager::<sha2::Sha256>(pass, salt, iterations, out),
        HashAlg::Sha384 => eager::<sha2::Sha384>(pass, salt, iterations, out),
        HashAlg::Sha512 => eager::<sha2::Sha512>(pass, salt, iterations, out),
        HashAlg::Ripemd160 => eager::<ripemd::Ripemd160>(pass, salt, iterations, out),
        HashAlg::Sha3_224 => eager::<sha3::Sha3_224>(pass, salt, iterations, out),
        HashAlg::Sha3_256 => eager::<sha3::Sha3_256>(pass, salt, iterations, out),
        HashAlg::Sha3_384 => eager::<sha3::Sha3_384>(pass, salt, iterations, out),
        HashAlg::Sha3_512 => eager::<sha3::Sha3_512>(pass, salt, iterations, out),
        HashAlg::Whirlpool => eager::<whirlpool::Whirlpool>(pass, salt, iterations, out),
        HashAlg::Sm3 => eager::<sm3::Sm3>(pass, salt, iterations, out),
        HashAlg::Stribog256 => eager::<streebog::Streebog256>(pass, salt, iterations, out),
        HashAlg::Stribog512 => eager::<streebog::Streebog512>(pass, salt, iterations, out),
        HashAlg::Blake2b512 => return simple::<blake2::Blake2b512>(pass, salt, iterations, out),
        HashAlg::Blake2s256 => return simple::<blake2::Blake2s256>(pass, salt, iterations, out),
        HashAlg::Wp256 | HashAlg::Wp384 => {
            return Err(Error::UnknownHash(format!("{hash} (an ESSIV hash only)")));
        }
    }
    Ok(())
}

/// PBKDF2 iterations that take about `ms` milliseconds here (never below the floor).
pub fn pbkdf2_iterations_for(hash: HashAlg, key_len: usize, ms: u32) -> Result<u32> {
    let per_sec = pbkdf2_iterations_per_second(hash, key_len)?;
    let it = (per_sec as u128 * ms as u128 / 1000).min(u32::MAX as u128) as u32;
    Ok(it.max(PBKDF2_MIN_ITERATIONS))
}

/// Measured PBKDF2 speed, in iterations per second, for a `key_len`-byte output.
pub fn pbkdf2_iterations_per_second(hash: HashAlg, key_len: usize) -> Result<u64> {
    // Short probes grow towards one ~60 ms run, scaled by what the last one took, so the
    // measurement costs ~1.2x its final run (a fixed 4x growth costs up to 5x: reencryption
    // and every new digest pay for this).
    const ENOUGH: Duration = Duration::from_millis(50);
    let mut out = vec![0u8; key_len.max(1)];
    let mut iterations = 1u32 << 12;
    loop {
        let kdf = Kdf::Pbkdf2 { hash, iterations };
        let d = time_it(|| kdf.derive(b"cryptblk-bench-pass", &[0x5a; 32], &mut out))?;
        if d >= ENOUGH || iterations >= 1 << 28 {
            return Ok((iterations as f64 / d.as_secs_f64().max(1e-9)) as u64);
        }
        let grow = (1.2 * ENOUGH.as_secs_f64() / d.as_secs_f64().max(1e-6)).clamp(2.0, 64.0);
        iterations = (iterations as f64 * grow).min((1u32 << 28) as f64) as u32;
    }
}

fn argon2_costs_for(
    variant: Argon2Variant,
    max_memory_kib: u32,
    parallel: u32,
    key_len: usize,
    ms: u32,
) -> Result<Kdf> {
    // Cost grows linearly in time × memory: measure a small point and extrapolate, then
    // prefer the full memory (memory-hardness) and shrink it only if even the minimum
    // number of passes would be too slow, as cryptsetup's calibration does.
    let probe_mem = max_memory_kib.min(64 * 1024);
    let mut out = vec![0u8; key_len.max(4)];
    let probe = Kdf::Argon2 {
        variant,
        time: 1,
        memory_kib: probe_mem,
        parallel,
    };
    let d = time_it(|| probe.derive(b"cryptblk-bench-pass", &[0x5a; 32], &mut out))?;
    let per_kib_pass = d.as_secs_f64() / probe_mem as f64;
    let target = ms as f64 / 1000.0;
    let at_min_time = per_kib_pass * max_memory_kib as f64 * ARGON2_MIN_TIME as f64;
    let (time, memory_kib) = if at_min_time > target {
        let m = (max_memory_kib as f64 * target / at_min_time) as u32;
        (ARGON2_MIN_TIME, m.max(ARGON2_MIN_MEMORY_KIB))
    } else {
        let t = (target / (per_kib_pass * max_memory_kib as f64)) as u32;
        (t.max(ARGON2_MIN_TIME), max_memory_kib)
    };
    Ok(Kdf::Argon2 {
        variant,
        time,
        memory_kib,
        parallel,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_costs_are_kept() {
        let mut r = KdfRequest::luks2_default();
        r.forced_iterations = Some(4);
        r.memory_kib = 64;
        r.parallel = 1;
        assert_eq!(
            r.resolve(64).unwrap(),
            Kdf::Argon2 {
                variant: Argon2Variant::Argon2id,
                time: 4,
                memory_kib: 64,
                parallel: 1
            }
        );
        r.forced_iterations = Some(3);
        assert!(r.resolve(64).is_err());
    }

    #[test]
    fn calibration_scales_with_target() {
        let mut r = KdfRequest::luks1_default();
        r.iter_time_ms = 50;
        let Kdf::Pbkdf2 {
            iterations: short, ..
        } = r.resolve(32).unwrap()
        else {
            panic!()
        };
        r.iter_time_ms = 400;
        let Kdf::Pbkdf2 {
            iterations: long, ..
        } = r.resolve(32).unwrap()
        else {
            panic!()
        };
        assert!(short >= PBKDF2_MIN_ITERATIONS);
        assert!(long > short * 2, "{short} vs {long}");
    }
}

/// BitLocker's key stretching (cryptsetup's `bitlk_kdf`): 2^20 rounds of SHA-256 over
/// (last digest, `initial`, `salt`, round number as 64-bit little-endian). `initial` is
/// SHA-256(SHA-256(UTF-16LE passphrase)) or SHA-256(16-byte recovery key); the result
/// is the AES-256 key of the protector's AES-CCM-wrapped VMK.
pub fn bitlk_stretch(initial: &[u8; 32], salt: &[u8; 16]) -> crate::SecretBytes {
    use sha2::Digest;
    const ROUNDS: u64 = 0x10_0000;
    // The digests (the last one is the key) pass through the loop's frame: one of its
    // own, wiped after.
    crate::secret::scrubbed(|| {
        let mut state = crate::SecretBytes::zeroed(88);
        state[32..64].copy_from_slice(initial);
        state[64..80].copy_from_slice(salt);
        for round in 0..ROUNDS {
            state[80..88].copy_from_slice(&round.to_le_bytes());
            let d = sha2::Sha256::digest(&state[..]);
            state[..32].copy_from_slice(&d);
        }
        crate::SecretBytes::from_slice(&state[..32])
    })
}

#[cfg(test)]
mod bitlk_tests {
    /// The stretch written out with Python's hashlib (one-off, same inputs):
    /// `last = bytes(32)`, `initial = bytes(range(32))`, `salt = bytes(range(16))`, then for i in 0..2^20
    /// `last = sha256(last + initial + salt + i.to_bytes(8, 'little'))`.
    #[test]
    fn bitlk_stretch_matches_reference() {
        let initial: [u8; 32] = std::array::from_fn(|i| i as u8);
        let salt: [u8; 16] = std::array::from_fn(|i| i as u8);
        let k = super::bitlk_stretch(&initial, &salt);
        assert_eq!(hex::encode(&k[..]), BITLK_REF);
    }
    const BITLK_REF: &str = "db5949eb075b883e81cc84d3b4e4bfec54f2fbe9850dfabfe584e675d6d4ddd0";
}
