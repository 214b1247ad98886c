//! The `pbkdf2` digest that tells a right volume key from a wrong one.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use cryptblk_crypto::{HashAlg, Kdf, constant_time_eq, random_bytes};
use serde_json::{Value, json};

use super::Luks2Error;
use super::keyslot::SALT_LEN;
use super::model::Digest;
use crate::Result;

/// cryptsetup's target time for the digest iterations (`LUKS_MKD_ITERATIONS_MS`).
pub(super) const DIGEST_ITER_MS: u32 = 125;
/// ... and its floor, also used as is when PBKDF benchmarks are off (forced iterations).
pub(super) const DIGEST_MIN_ITERATIONS: u32 = 1000;

/// Whether `key` matches the digest.
pub(super) fn verify(d: &Digest, key: &[u8]) -> Result<bool> {
    let p = d
        .pbkdf2
        .as_ref()
        .map_err(|e| Luks2Error::Unsupported(e.clone()))?;
    let mut out = vec![0u8; p.digest.len()];
    Kdf::Pbkdf2 {
        hash: p.hash,
        iterations: p.iterations,
    }
    .derive(key, &p.salt, &mut out)?;
    Ok(constant_time_eq(&out, &p.digest))
}

/// Iterations as cryptsetup picks them for a new digest: 125 ms worth, at least 1000;
/// exactly 1000 when the user forced the keyslot's PBKDF cost (no benchmark is run then).
pub(super) fn iterations(hash: HashAlg, key_len: usize, forced: bool) -> Result<u32> {
    if forced {
        return Ok(DIGEST_MIN_ITERATIONS);
    }
    let it = cryptblk_crypto::kdf::pbkdf2_iterations_for(hash, key_len, DIGEST_ITER_MS)?;
    Ok(it.max(DIGEST_MIN_ITERATIONS))
}

/// A new digest object for `key`, assigned to `keyslots` and `segments`.
pub(super) fn create(
    key: &[u8],
    hash: HashAlg,
    iterations: u32,
    keyslots: &[u32],
    segments: &[u32],
) -> Result<Value> {
    let mut salt = [0u8; SALT_LEN];
    random_bytes(&mut salt)?;
    let mut out = vec![0u8; hash.output_len()];
    Kdf::Pbkdf2 { hash, iterations }.derive(key, &salt, &mut out)?;
    let ids = |v: &[u32]| {
        v.iter()
            .map(|i| Value::String(i.to_string()))
            .collect::<Vec<_>>()
    };
    Ok(json!({
        "type": "pbkdf2",
        "keyslots": ids(keyslots),
        "segments": ids(segments),
        "hash": hash.name(),
        "iterations": iterations,
        "salt": B64.encode(salt),
        "digest": B64.encode(&out),
    }))
}
