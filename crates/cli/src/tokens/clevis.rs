//! clevis tokens (`clevis luks bind`): a JWE whose key comes from a pin. The tang pin
//! (network-bound disk encryption) is McCallum-Relyea key exchange with the tang server
//! named in the JWE, as clevis-decrypt-tang does it: the JWE's `epk` (`c·G`, from the
//! binding) plus a fresh `e·G` is sent to `URL/rec/KID`; the server answers with its
//! exchange key `s` times that point; subtracting `e·S` (S the server's public exchange
//! key, from the advertisement kept in the JWE) leaves `c·S`, the ECDH-ES shared secret
//! the binding used. The server never sees the secret, an eavesdropper learns nothing.
//! The content key is Concat KDF (RFC 7518 §4.6) of its x coordinate; the payload,
//! AES-256-GCM, is the keyslot's passphrase. The sss pin mixes pins: a threshold of
//! nested JWEs, each opened by its own pin, give the points that determine its key.

use super::{TokenArgs, http};
use crate::error::{CliError, CliResult};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use cryptblk_crypto::SecretBytes;
use p521::elliptic_curve::PrimeField;
use p521::elliptic_curve::sec1::{FromEncodedPoint, ToEncodedPoint};
use p521::{AffinePoint, EncodedPoint, FieldBytes, ProjectivePoint, Scalar};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// P-521 coordinates and scalars: 66 bytes.
pub(super) const P521_BYTES: usize = 66;

pub(super) fn bad(what: impl std::fmt::Display) -> CliError {
    CliError::usage(format!("clevis token: {what}"))
}

pub(super) fn b64(field: &str, v: &Value) -> CliResult<Vec<u8>> {
    let s = v
        .as_str()
        .ok_or_else(|| bad(format!("'{field}' is not a string")))?;
    B64.decode(s.trim_end_matches('='))
        .map_err(|_| bad(format!("'{field}' is not base64url")))
}

/// A P-521 point from a JWK (`kty` EC, `crv` P-521).
pub(super) fn point(jwk: &Value) -> CliResult<AffinePoint> {
    if jwk["kty"] != "EC" || jwk["crv"] != "P-521" {
        return Err(bad(format!(
            "key type {} {} (the tang pin here takes P-521 keys)",
            jwk["kty"], jwk["crv"]
        )));
    }
    let (x, y) = (b64("x", &jwk["x"])?, b64("y", &jwk["y"])?);
    if x.len() != P521_BYTES || y.len() != P521_BYTES {
        return Err(bad("a P-521 coordinate is not 66 bytes"));
    }
    let ep = EncodedPoint::from_affine_coordinates(&field_bytes(&x), &field_bytes(&y), false);
    Option::from(AffinePoint::from_encoded_point(&ep)).ok_or_else(|| bad("a key is not on P-521"))
}

/// 66 bytes as p521's field element bytes. Its GenericArray (0.14) has no `From` for 66
/// elements, and the slice constructor is deprecated only in favour of generic-array 1.x,
/// which p521 0.13 does not use.
#[allow(deprecated)]
pub(super) fn field_bytes(b: &[u8]) -> FieldBytes {
    FieldBytes::clone_from_slice(b)
}

fn jwk_of(p: &AffinePoint) -> Value {
    let ep = p.to_encoded_point(false);
    json!({
        "alg": "ECMR",
        "crv": "P-521",
        "kty": "EC",
        "x": B64.encode(ep.x().expect("uncompressed")),
        "y": B64.encode(ep.y().expect("uncompressed")),
    })
}

/// RFC 7638 thumbprint of an EC JWK, with SHA-256 (clevis's default) or SHA-1.
pub(super) fn thumbprint(jwk: &Value, sha1: bool) -> String {
    let canon = format!(
        r#"{{"crv":{},"kty":{},"x":{},"y":{}}}"#,
        jwk["crv"], jwk["kty"], jwk["x"], jwk["y"]
    );
    if sha1 {
        use sha1::Digest as _;
        B64.encode(sha1::Sha1::digest(canon.as_bytes()))
    } else {
        use sha2::Digest as _;
        B64.encode(sha2::Sha256::digest(canon.as_bytes()))
    }
}

/// A random non-zero P-521 scalar.
pub(super) fn random_scalar() -> CliResult<Scalar> {
    loop {
        let mut b = SecretBytes::zeroed(P521_BYTES);
        cryptblk_crypto::random_bytes(&mut b)
            .map_err(|e| bad(format!("no random numbers: {e}")))?;
        b[0] &= 0x01; // below 2^521
        if let Some(s) = Option::<Scalar>::from(Scalar::from_repr(field_bytes(&b)))
            && !bool::from(s.is_zero())
        {
            return Ok(s);
        }
    }
}

/// RFC 7518 §4.6.2 Concat KDF, one SHA-256 round: a key of `bits` (at most 256) for `enc`.
pub(super) fn concat_kdf(z: &[u8], enc: &str, apu: &[u8], apv: &[u8], bits: u32) -> SecretBytes {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(1u32.to_be_bytes());
    h.update(z);
    for part in [enc.as_bytes(), apu, apv] {
        h.update((part.len() as u32).to_be_bytes());
        h.update(part);
    }
    h.update(bits.to_be_bytes());
    SecretBytes::from_slice(&h.finalize()[..bits as usize / 8])
}

/// A JWE's parts, base64url as stored (the flattened JSON clevis puts in a LUKS2 token,
/// or a compact one nested in an sss pin).
struct Jwe<'a> {
    protected: &'a str,
    iv: &'a str,
    ciphertext: &'a str,
    tag: &'a str,
}

impl<'a> Jwe<'a> {
    fn flattened(jwe: &'a Value) -> CliResult<Jwe<'a>> {
        let field = |f: &str| {
            jwe[f]
                .as_str()
                .ok_or_else(|| bad(format!("the JWE has no '{f}'")))
        };
        Ok(Jwe {
            protected: field("protected")?,
            iv: field("iv")?,
            ciphertext: field("ciphertext")?,
            tag: field("tag")?,
        })
    }

    /// `protected.encrypted_key.iv.ciphertext.tag` (clevis pins leave the key empty).
    fn compact(jwe: &'a str) -> CliResult<Jwe<'a>> {
        let parts: Vec<&str> = jwe.trim().split('.').collect();
        let [protected, _key, iv, ciphertext, tag] = parts[..] else {
            return Err(bad("a nested JWE is not in compact form"));
        };
        Ok(Jwe {
            protected,
            iv,
            ciphertext,
            tag,
        })
    }
}

/// What the pins need besides the JWE: when to give up on servers, which TPM to ask.
#[derive(Debug, Clone)]
struct Reach {
    deadline: Instant,
    tpm2_device: Option<String>,
}

/// The passphrase a clevis token's JWE holds, its key recovered from its pin, servers
/// given `--token-timeout` in all.
pub(crate) fn passphrase(token: &Value, args: &TokenArgs) -> CliResult<SecretBytes> {
    let reach = Reach {
        deadline: Instant::now() + Duration::from_secs(args.token_timeout.max(1)),
        tpm2_device: args.tpm2_device.clone(),
    };
    decrypt(&Jwe::flattened(&token["jwe"])?, &reach)
}

/// Decrypts a clevis JWE: the pin its header names gives the content key.
fn decrypt(jwe: &Jwe, reach: &Reach) -> CliResult<SecretBytes> {
    let header: Value = serde_json::from_slice(&b64("protected", &json!(jwe.protected))?)
        .map_err(|_| bad("the JWE header is not JSON"))?;
    if header["enc"] != "A256GCM" {
        return Err(bad(format!(
            "JWE encryption {} (clevis writes A256GCM)",
            header["enc"]
        )));
    }
    let cek = match header["clevis"]["pin"].as_str().unwrap_or("") {
        "tang" => tang_key(&header, reach.deadline)?,
        "sss" => sss_key(&header, reach)?,
        "tpm2" => tpm2_key(&header, reach)?,
        pin => {
            return Err(bad(format!(
                "pin '{pin}' is not supported yet (tang, sss and tpm2 are)"
            )));
        }
    };
    let iv = b64("iv", &json!(jwe.iv))?;
    let mut sealed = b64("ciphertext", &json!(jwe.ciphertext))?;
    sealed.extend_from_slice(&b64("tag", &json!(jwe.tag))?);
    let iv: [u8; 12] = iv
        .try_into()
        .map_err(|_| bad("the JWE IV is not 96 bits"))?;
    use aes_gcm::aead::{Aead, Payload};
    use aes_gcm::{Aes256Gcm, KeyInit, Nonce};
    let aead = Aes256Gcm::new_from_slice(&cek).map_err(|_| bad("content key"))?;
    let plain = aead
        .decrypt(
            &Nonce::from(iv),
            Payload {
                msg: &sealed,
                aad: jwe.protected.as_bytes(),
            },
        )
        .map_err(|_| bad("the JWE does not decrypt (a wrong or rotated key?)"))?;
    Ok(SecretBytes::from_vec(plain))
}

/// The tang pin's content key: McCallum-Relyea exchange with the server the header names.
fn tang_key(header: &Value, deadline: Instant) -> CliResult<SecretBytes> {
    if header["alg"] != "ECDH-ES" {
        return Err(bad(format!(
            "JWE key management {} (the tang pin writes ECDH-ES)",
            header["alg"]
        )));
    }
    let tang = &header["clevis"]["tang"];
    let url = tang["url"].as_str().ok_or_else(|| bad("no tang URL"))?;
    let kid = header["kid"].as_str().ok_or_else(|| bad("no kid"))?;
    let keys = tang["adv"]["keys"]
        .as_array()
        .ok_or_else(|| bad("no advertisement in the token"))?;
    // The server's exchange key: the advertised one the kid names.
    let server = keys
        .iter()
        .find(|k| {
            k["key_ops"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o == "deriveKey"))
                && (thumbprint(k, false) == kid || thumbprint(k, true) == kid)
        })
        .ok_or_else(|| bad(format!("no advertised exchange key has the kid {kid}")))?;
    let s_pub = point(server)?;
    let c_pub = point(&header["epk"])?;
    let e = random_scalar()?;
    let x = (ProjectivePoint::from(c_pub) + ProjectivePoint::GENERATOR * e).to_affine();
    let body = serde_json::to_vec(&jwk_of(&x)).expect("JSON serializes");
    let timeout = deadline.saturating_duration_since(Instant::now());
    let answer = http::post(
        url,
        &format!("/rec/{kid}"),
        "application/jwk+json",
        &body,
        timeout,
    )
    .map_err(|e| bad(format!("tang server: {e}")))?;
    let y: Value =
        serde_json::from_slice(&answer).map_err(|_| bad("the tang server's answer is not JSON"))?;
    let y = point(&y)?;
    let z = (ProjectivePoint::from(y) - ProjectivePoint::from(s_pub) * e).to_affine();
    let z = z.to_encoded_point(false);
    let zx = SecretBytes::from_slice(z.x().ok_or_else(|| bad("the exchange gave the identity"))?);
    let apu = header.get("apu").map(|v| b64("apu", v)).transpose()?;
    let apv = header.get("apv").map(|v| b64("apv", v)).transpose()?;
    Ok(concat_kdf(
        &zx,
        "A256GCM",
        apu.as_deref().unwrap_or(&[]),
        apv.as_deref().unwrap_or(&[]),
        256,
    ))
}

/// The tpm2 pin's content key: a JWK sealed to the TPM (`tpm2_create` under a primary
/// key `tpm2_createprimary -C o -g HASH -G KEY` makes again from its template), under a
/// PCR policy when the binding named PCRs.
fn tpm2_key(header: &Value, reach: &Reach) -> CliResult<SecretBytes> {
    use cryptblk_tpm2::{Parent, Policy, alg};
    if header["alg"] != "dir" {
        return Err(bad(format!(
            "JWE key management {} (the tpm2 pin writes dir)",
            header["alg"]
        )));
    }
    let tpm2 = &header["clevis"]["tpm2"];
    for signed in ["policy_pubkey_path", "policy_ref", "policy_path"] {
        if tpm2.get(signed).is_some() {
            return Err(bad(format!(
                "tpm2 '{signed}' (signed policies) is not supported yet"
            )));
        }
    }
    let field = |f: &str, default: &'static str| match &tpm2[f] {
        Value::Null => Ok(default.to_owned()),
        Value::String(s) => Ok(s.clone()),
        _ => Err(bad(format!("tpm2 '{f}' is not a string"))),
    };
    let hash_name = field("hash", "sha256")?;
    let hash = alg::hash_by_name(&hash_name).ok_or_else(|| bad(format!("hash '{hash_name}'")))?;
    let key_alg = match field("key", "ecc")?.as_str() {
        "ecc" => alg::ECC,
        "rsa" => alg::RSA,
        other => return Err(bad(format!("tpm2 primary key '{other}' (ecc or rsa)"))),
    };
    let pcrs = field("pcr_ids", "")?
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>()
                .ok()
                .filter(|&p| p < 24)
                .ok_or_else(|| bad(format!("PCR '{p}'")))
        })
        .collect::<CliResult<Vec<u32>>>()?;
    let bank_name = field("pcr_bank", "sha256")?;
    let bank = alg::hash_by_name(&bank_name).ok_or_else(|| bad(format!("bank '{bank_name}'")))?;
    let public = b64("jwk_pub", &tpm2["jwk_pub"])?;
    let private = b64("jwk_priv", &tpm2["jwk_priv"])?;
    let tcti = cryptblk_tpm2::tcti_for(reach.tpm2_device.as_deref()).map_err(bad)?;
    let tpm = cryptblk_tpm2::Tpm::open(&tcti).map_err(bad)?;
    let sealed = cryptblk_tpm2::unseal(
        &tpm,
        &Parent::Primary {
            key_alg,
            name_hash: hash,
        },
        &private,
        &public,
        &Policy {
            pcr_bank: bank,
            pcrs: &pcrs,
            auth: None,
            authorized: None,
        },
    )
    .map_err(|e| bad(format!("tpm2: {e}")))?;
    // The sealed JWK's text (an oct key, base64url `k`), as `jose jwk gen` wrote it.
    let mut jwk: Value = serde_json::from_slice(sealed.trim_ascii())
        .map_err(|_| bad("the TPM's sealed key is not a JWK"))?;
    // Taken out of the JSON value so that its text is wiped, not just freed.
    let Value::String(k) = jwk["k"].take() else {
        return Err(bad("the TPM's sealed JWK has no 'k'"));
    };
    let k = zeroize::Zeroizing::new(k);
    let key = SecretBytes::from_vec(
        B64.decode(k.trim_end_matches('='))
            .map_err(|_| bad("the sealed 'k' is not base64url"))?,
    );
    if key.len() != 32 {
        return Err(bad("the TPM's sealed key is not 256 bits"));
    }
    Ok(key)
}

/// The sss pin's content key: Shamir's secret sharing over the prime `p` the header
/// holds. Each nested JWE (any pin, sss included) decrypts to one point `x || y` of a
/// polynomial of degree `t - 1` whose value at 0 is the key. They are opened at once, each
/// on its thread, as clevis does, so servers that are down cost one timeout, not one each;
/// the first `t` points give the key.
fn sss_key(header: &Value, reach: &Reach) -> CliResult<SecretBytes> {
    let deadline = reach.deadline;
    if header["alg"] != "dir" {
        return Err(bad(format!(
            "JWE key management {} (the sss pin writes dir)",
            header["alg"]
        )));
    }
    let sss = &header["clevis"]["sss"];
    let t = sss["t"]
        .as_u64()
        .filter(|&t| t >= 1)
        .ok_or_else(|| bad("the sss threshold is not a positive number"))? as usize;
    let prime = b64("p", &sss["p"])?;
    let children: Vec<String> = sss["jwe"]
        .as_array()
        .ok_or_else(|| bad("the sss pin lists no JWEs"))?
        .iter()
        .map(|j| {
            j.as_str()
                .map(str::to_owned)
                .ok_or_else(|| bad("an sss share is not a compact JWE"))
        })
        .collect::<CliResult<_>>()?;
    if children.len() < t {
        return Err(bad(format!(
            "the sss pin needs {t} shares and holds {}",
            children.len()
        )));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    for child in children {
        let tx = tx.clone();
        let reach = reach.clone();
        // Detached: a share still waiting on a server once enough have answered is left
        // to its deadline; its answer goes nowhere.
        std::thread::spawn(move || {
            let share = Jwe::compact(&child).and_then(|j| decrypt(&j, &reach));
            let _ = tx.send(share);
        });
    }
    drop(tx);
    let (mut points, mut errors) = (Vec::new(), Vec::new());
    while points.len() < t {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(p)) => points.push(p),
            Ok(Err(e)) => errors.push(e.to_string()),
            Err(_) => break,
        }
    }
    if points.len() < t {
        return Err(bad(format!(
            "{} of the {t} sss shares needed were recovered ({})",
            points.len(),
            if errors.is_empty() {
                "the others gave no answer in time".to_string()
            } else {
                errors.join("; ")
            }
        )));
    }
    shamir_secret(&prime, &points)
}

/// The value at 0 of the polynomial through `points` (each `x || y`, both as long as
/// `prime`), modulo `prime`, as long as `prime`: Lagrange interpolation.
fn shamir_secret(prime: &[u8], points: &[SecretBytes]) -> CliResult<SecretBytes> {
    use crypto_bigint::U512;
    use crypto_bigint::modular::runtime_mod::{DynResidue, DynResidueParams};
    let n = prime.len();
    if n == 0 || n > 64 {
        return Err(bad("the sss prime is not 1 to 64 bytes"));
    }
    let wide = |b: &[u8]| {
        let mut w = SecretBytes::zeroed(64);
        w[64 - b.len()..].copy_from_slice(b);
        U512::from_be_slice(&w)
    };
    let modulus = wide(prime);
    // Montgomery form needs an odd modulus (any prime but 2).
    if prime[n - 1] & 1 == 0 {
        return Err(bad("the sss prime is even"));
    }
    let params = DynResidueParams::<8>::new(&modulus);
    let mut xy = Vec::with_capacity(points.len());
    for p in points {
        if p.len() != 2 * n {
            return Err(bad(format!(
                "an sss share is {} bytes, not {}",
                p.len(),
                2 * n
            )));
        }
        let (x, y) = (wide(&p[..n]), wide(&p[n..]));
        if x >= modulus || y >= modulus {
            return Err(bad("an sss share is out of range"));
        }
        xy.push((DynResidue::new(&x, params), DynResidue::new(&y, params)));
    }
    let zero = DynResidue::zero(params);
    let mut k = zero;
    for (i, (xi, yi)) in xy.iter().enumerate() {
        // acc = y_i * prod_{j != i} (0 - x_j) / (x_i - x_j)
        let mut acc = *yi;
        for (j, (xj, _)) in xy.iter().enumerate() {
            if i == j {
                continue;
            }
            let (inv, ok) = xi.sub(xj).invert();
            if !bool::from(ok) {
                return Err(bad("two sss shares have the same x"));
            }
            acc = acc.mul(&zero.sub(xj)).mul(&inv);
        }
        k = k.add(&acc);
    }
    let mut be = SecretBytes::zeroed(64);
    let words = k.retrieve();
    let width = std::mem::size_of::<crypto_bigint::Word>();
    for (chunk, w) in be.rchunks_mut(width).zip(words.as_words()) {
        chunk.copy_from_slice(&w.to_be_bytes());
    }
    Ok(SecretBytes::from_slice(&be[64 - n..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7518 appendix C: ECDH-ES key agreement's Concat KDF (the shared secret Z, "Alice"
    /// and "Bob", A128GCM) gives "VqqN6vgjbSBcIijNcacQGg".
    #[test]
    fn concat_kdf_matches_rfc7518s_example() {
        let z = [
            158, 86, 217, 29, 129, 113, 53, 211, 114, 131, 66, 131, 191, 132, 38, 156, 251, 49,
            110, 163, 218, 128, 106, 72, 246, 218, 167, 121, 140, 254, 144, 196,
        ];
        let k = concat_kdf(&z, "A128GCM", b"Alice", b"Bob", 128);
        assert_eq!(B64.encode(&k[..]), "VqqN6vgjbSBcIijNcacQGg");
    }

    /// The exchange recovers the binding's secret: c·S = (c·G + e·G)·s - e·S.
    #[test]
    fn mccallum_relyea_recovers_the_shared_point() {
        let (c, s, e) = (
            random_scalar().unwrap(),
            random_scalar().unwrap(),
            random_scalar().unwrap(),
        );
        let g = ProjectivePoint::GENERATOR;
        let (c_pub, s_pub) = (g * c, g * s);
        let x = c_pub + g * e;
        let y = x * s;
        assert_eq!((y - s_pub * e).to_affine(), (s_pub * c).to_affine());
        // And through the JWK encoding.
        let back = point(&jwk_of(&x.to_affine())).unwrap();
        assert_eq!(back, x.to_affine());
    }

    /// f(x) = 7 + 3x + 5x^2 mod 251: any three points give f(0) = 7; two give a wrong one.
    #[test]
    fn shamir_secret_interpolates_at_zero() {
        let f = |x: u32| ((7 + 3 * x + 5 * x * x) % 251) as u8;
        let pt = |x: u8| SecretBytes::from_slice(&[x, f(x as u32)]);
        let key = shamir_secret(&[251], &[pt(1), pt(9), pt(200)]).unwrap();
        assert_eq!(&key[..], &[7]);
        let key = shamir_secret(&[251], &[pt(4), pt(2), pt(3)]).unwrap();
        assert_eq!(&key[..], &[7]);
        assert_ne!(&shamir_secret(&[251], &[pt(1), pt(2)]).unwrap()[..], &[7]);
        assert!(shamir_secret(&[251], &[pt(1), pt(1)]).is_err(), "same x");
        assert!(shamir_secret(&[250], &[pt(1)]).is_err(), "even");
        assert!(shamir_secret(&[251], &[SecretBytes::from_slice(&[252, 0])]).is_err());
        assert!(shamir_secret(&[251], &[SecretBytes::from_slice(&[1])]).is_err());
    }

    #[test]
    fn thumbprints_are_rfc7638s() {
        // RFC 7638 §3.1's example is RSA; an EC key's canonical form is checked instead.
        let jwk = json!({"kty": "EC", "crv": "P-521", "x": "AA", "y": "AQ", "alg": "ECMR"});
        use sha2::Digest as _;
        let want = B64.encode(sha2::Sha256::digest(
            br#"{"crv":"P-521","kty":"EC","x":"AA","y":"AQ"}"#,
        ));
        assert_eq!(thumbprint(&jwk, false), want);
    }
}
