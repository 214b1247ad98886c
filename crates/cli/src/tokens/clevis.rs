//! clevis tokens (`clevis luks bind`): a JWE whose key comes from a pin. The tang pin
//! (network-bound disk encryption) is McCallum-Relyea key exchange with the tang server
//! named in the JWE, as clevis-decrypt-tang does it: the JWE's `epk` (`c·G`, from the
//! binding) plus a fresh `e·G` is sent to `URL/rec/KID`; the server answers with its
//! exchange key `s` times that point; subtracting `e·S` (S the server's public exchange
//! key, from the advertisement kept in the JWE) leaves `c·S`, the ECDH-ES shared secret
//! the binding used. The server never sees the secret, an eavesdropper learns nothing.
//! The content key is Concat KDF (RFC 7518 §4.6) of its x coordinate; the payload,
//! AES-256-GCM, is the keyslot's passphrase.

use super::http;
use crate::error::{CliError, CliResult};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use cryptblk_crypto::SecretBytes;
use p521::elliptic_curve::PrimeField;
use p521::elliptic_curve::sec1::{FromEncodedPoint, ToEncodedPoint};
use p521::{AffinePoint, EncodedPoint, FieldBytes, ProjectivePoint, Scalar};
use serde_json::{Value, json};
use std::time::Duration;

/// P-521 coordinates and scalars: 66 bytes.
const P521_BYTES: usize = 66;

fn bad(what: impl std::fmt::Display) -> CliError {
    CliError::usage(format!("clevis token: {what}"))
}

fn b64(field: &str, v: &Value) -> CliResult<Vec<u8>> {
    let s = v
        .as_str()
        .ok_or_else(|| bad(format!("'{field}' is not a string")))?;
    B64.decode(s.trim_end_matches('='))
        .map_err(|_| bad(format!("'{field}' is not base64url")))
}

/// A P-521 point from a JWK (`kty` EC, `crv` P-521).
fn point(jwk: &Value) -> CliResult<AffinePoint> {
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
fn field_bytes(b: &[u8]) -> FieldBytes {
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
fn thumbprint(jwk: &Value, sha1: bool) -> String {
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
fn random_scalar() -> CliResult<Scalar> {
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
fn concat_kdf(z: &[u8], enc: &str, apu: &[u8], apv: &[u8], bits: u32) -> SecretBytes {
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

/// The passphrase a clevis token's JWE holds, its key recovered from its pin.
pub(crate) fn passphrase(token: &Value, timeout: Duration) -> CliResult<SecretBytes> {
    let jwe = &token["jwe"];
    let protected = jwe["protected"]
        .as_str()
        .ok_or_else(|| bad("no JWE protected header"))?;
    let header: Value = serde_json::from_slice(&b64("protected", &jwe["protected"])?)
        .map_err(|_| bad("the JWE header is not JSON"))?;
    let pin = header["clevis"]["pin"].as_str().unwrap_or("");
    if pin != "tang" {
        return Err(bad(format!(
            "pin '{pin}' is not supported yet (the tang pin is)"
        )));
    }
    if header["alg"] != "ECDH-ES" || header["enc"] != "A256GCM" {
        return Err(bad(format!(
            "JWE {} / {} (the tang pin writes ECDH-ES / A256GCM)",
            header["alg"], header["enc"]
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
    let cek = concat_kdf(
        &zx,
        "A256GCM",
        apu.as_deref().unwrap_or(&[]),
        apv.as_deref().unwrap_or(&[]),
        256,
    );
    let iv = b64("iv", &jwe["iv"])?;
    let mut sealed = b64("ciphertext", &jwe["ciphertext"])?;
    sealed.extend_from_slice(&b64("tag", &jwe["tag"])?);
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
                aad: protected.as_bytes(),
            },
        )
        .map_err(|_| bad("the JWE does not decrypt (a wrong or rotated tang key?)"))?;
    Ok(SecretBytes::from_vec(plain))
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
