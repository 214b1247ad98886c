//! Binding as `clevis luks bind` does (`enroll --clevis PIN CONFIG`): the JWE of a new
//! keyslot's passphrase, its key from a pin, in the clevis token `clevis luks pass`,
//! `clevis luks unlock` and cryptblk read.
//!
//! - tang: the server's advertisement (`URL/adv`, a JWS) is fetched and its signatures
//!   checked against its own signing keys; it is trusted when one of them has the
//!   thumbprint `thp` the configuration gives, or `adv` is given, or with `-q` (clevis's
//!   `-y`), or when the person at the terminal says so. ECDH-ES with the exchange key:
//!   the binding's `epk`, the content key by Concat KDF (RFC 7518 §4.6).
//! - sss: a random 256-bit prime `p` and a polynomial of degree `t - 1` modulo it whose
//!   value at 0 is the content key; each nested pin encrypts one point (`x || y`).
//! - tpm2: the content key's JWK sealed to the TPM under clevis's primary key, a PCR
//!   policy when `pcr_ids` names PCRs.

use super::clevis::{b64, bad, concat_kdf, point, random_scalar, thumbprint};
use super::http;
use crate::error::CliResult;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use cryptblk_crypto::SecretBytes;
use p521::elliptic_curve::sec1::ToEncodedPoint;
use p521::{EncodedPoint, ProjectivePoint};
use serde_json::{Value, json};
use std::time::Duration;

/// What binding needs besides the pin's configuration.
#[derive(Debug, Clone)]
pub(crate) struct BindContext {
    /// Trust a tang server's keys without asking (`-q`, clevis's `-y`).
    pub trust: bool,
    /// Bound on each tang request.
    pub timeout: Duration,
    /// The TPM for the tpm2 pin.
    pub tpm2_device: Option<String>,
}

/// A JWE's parts, base64url.
struct Sealed {
    protected: String,
    iv: String,
    ciphertext: String,
    tag: String,
}

impl Sealed {
    fn compact(&self) -> String {
        format!(
            "{}..{}.{}.{}",
            self.protected, self.iv, self.ciphertext, self.tag
        )
    }
}

/// The clevis LUKS2 token's `jwe` (flattened JSON) for `plaintext` under `pin`.
pub(crate) fn bind(
    pin: &str,
    config: &str,
    plaintext: &[u8],
    cx: &BindContext,
) -> CliResult<Value> {
    let config: Value = serde_json::from_str(config)
        .map_err(|e| bad(format!("the {pin} configuration is not JSON: {e}")))?;
    let s = encrypt(pin, &config, plaintext, cx)?;
    Ok(json!({
        "ciphertext": s.ciphertext,
        "encrypted_key": "",
        "iv": s.iv,
        "protected": s.protected,
        "tag": s.tag,
    }))
}

fn encrypt(pin: &str, config: &Value, plaintext: &[u8], cx: &BindContext) -> CliResult<Sealed> {
    let (header, cek) = match pin {
        "tang" => tang(config, cx)?,
        "sss" => sss(config, cx)?,
        "tpm2" => tpm2(config, cx)?,
        other => {
            return Err(bad(format!(
                "pin '{other}' cannot bind (tang, sss and tpm2 can)"
            )));
        }
    };
    let protected = B64.encode(serde_json::to_vec(&header).expect("JSON serializes"));
    let mut iv = [0u8; 12];
    cryptblk_crypto::random_bytes(&mut iv).map_err(|e| bad(e.to_string()))?;
    use aes_gcm::aead::{Aead, Payload};
    use aes_gcm::{Aes256Gcm, KeyInit, Nonce};
    let aead = Aes256Gcm::new_from_slice(&cek).map_err(|_| bad("content key"))?;
    let mut sealed = aead
        .encrypt(
            &Nonce::from(iv),
            Payload {
                msg: plaintext,
                aad: protected.as_bytes(),
            },
        )
        .map_err(|_| bad("AES-GCM"))?;
    let tag = sealed.split_off(sealed.len() - 16);
    Ok(Sealed {
        protected,
        iv: B64.encode(iv),
        ciphertext: B64.encode(&sealed),
        tag: B64.encode(&tag),
    })
}

/// Checks an ES512 JWS signature over `input` with the P-521 key `jwk`.
fn es512_verifies(jwk: &Value, input: &[u8], signature: &[u8]) -> bool {
    use p521::ecdsa::signature::Verifier;
    let Ok(p) = point(jwk) else {
        return false;
    };
    let Ok(key) = p521::ecdsa::VerifyingKey::from_affine(p) else {
        return false;
    };
    let Ok(sig) = p521::ecdsa::Signature::from_slice(signature) else {
        return false;
    };
    key.verify(input, &sig).is_ok()
}

/// The advertisement's keys, once its signatures are checked: every signing key in it
/// signed it (as `jose jws ver -a` checks).
fn verified_keys(jws: &Value) -> CliResult<Value> {
    let payload = jws["payload"]
        .as_str()
        .ok_or_else(|| bad("the tang advertisement is not a JWS"))?;
    let keys: Value = serde_json::from_slice(&b64("payload", &json!(payload))?)
        .map_err(|_| bad("the tang advertisement's payload is not JSON"))?;
    let signatures: Vec<&Value> = match jws["signatures"].as_array() {
        Some(a) => a.iter().collect(),
        None => vec![jws],
    };
    let signers: Vec<&Value> = keys["keys"]
        .as_array()
        .ok_or_else(|| bad("the advertisement holds no keys"))?
        .iter()
        .filter(|k| {
            k["key_ops"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o == "verify"))
        })
        .collect();
    if signers.is_empty() {
        return Err(bad("the advertisement has no signing key"));
    }
    for key in &signers {
        let signed = signatures.iter().any(|s| {
            let (Some(protected), Ok(sig)) =
                (s["protected"].as_str(), b64("signature", &s["signature"]))
            else {
                return false;
            };
            es512_verifies(key, format!("{protected}.{payload}").as_bytes(), &sig)
        });
        if !signed {
            return Err(bad(format!(
                "the advertisement is not signed by its key {}",
                thumbprint(key, false)
            )));
        }
    }
    Ok(keys)
}

fn tang(config: &Value, cx: &BindContext) -> CliResult<(Value, SecretBytes)> {
    let url = config["url"]
        .as_str()
        .ok_or_else(|| bad("the tang configuration has no \"url\""))?
        .trim_end_matches('/');
    let keys = match &config["adv"] {
        Value::Null => {
            let adv = http::get(url, "/adv", cx.timeout).map_err(|e| bad(format!("tang: {e}")))?;
            let jws: Value = serde_json::from_slice(&adv)
                .map_err(|_| bad("the tang advertisement is not JSON"))?;
            let keys = verified_keys(&jws)?;
            let signers: Vec<String> = keys["keys"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|k| k["key_ops"].to_string().contains("\"verify\""))
                .map(|k| thumbprint(k, false))
                .collect();
            let trusted = match config["thp"].as_str() {
                Some(thp) => {
                    let ok = keys["keys"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|k| thumbprint(k, false) == thp || thumbprint(k, true) == thp);
                    if !ok {
                        return Err(bad(format!(
                            "no signing key of {url} has the thumbprint {thp}"
                        )));
                    }
                    true
                }
                None => cx.trust || ask_trust(url, &signers)?,
            };
            if !trusted {
                return Err(bad(format!("the keys of {url} are not trusted")));
            }
            keys
        }
        // Given with the configuration: trusted as given (a JWS is still checked).
        Value::Object(o) if o.contains_key("payload") => verified_keys(&config["adv"])?,
        Value::Object(_) => config["adv"].clone(),
        Value::String(path) => {
            let text = std::fs::read(path).map_err(|e| bad(format!("{path}: {e}")))?;
            let v: Value =
                serde_json::from_slice(&text).map_err(|_| bad(format!("{path} is not JSON")))?;
            if v.get("payload").is_some() {
                verified_keys(&v)?
            } else {
                v
            }
        }
        _ => return Err(bad("the tang \"adv\" is neither a file nor JSON")),
    };
    let exchange = keys["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|k| {
            k["alg"] == "ECMR"
                && k["key_ops"]
                    .as_array()
                    .is_some_and(|o| o.iter().any(|o| o == "deriveKey"))
        })
        .ok_or_else(|| bad("the advertisement has no exchange (deriveKey, ECMR) key"))?;
    let server = point(exchange)?;
    let c = random_scalar()?;
    let epk = (ProjectivePoint::GENERATOR * c).to_affine();
    let z = (ProjectivePoint::from(server) * c).to_affine();
    let z: EncodedPoint = z.to_encoded_point(false);
    let zx = SecretBytes::from_slice(z.x().ok_or_else(|| bad("the exchange gave the identity"))?);
    let cek = concat_kdf(&zx, "A256GCM", &[], &[], 256);
    let e = epk.to_encoded_point(false);
    let header = json!({
        "alg": "ECDH-ES",
        "clevis": {"pin": "tang", "tang": {"adv": keys, "url": url}},
        "enc": "A256GCM",
        "epk": {
            "crv": "P-521",
            "kty": "EC",
            "x": B64.encode(e.x().expect("uncompressed")),
            "y": B64.encode(e.y().expect("uncompressed")),
        },
        "kid": thumbprint(exchange, false),
    });
    Ok((header, cek))
}

/// Asks the person at the terminal whether to trust a tang server's signing keys.
fn ask_trust(url: &str, signers: &[String]) -> CliResult<bool> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Err(bad(format!(
            "the keys of {url} cannot be confirmed without a terminal: give \"thp\" (one \
             of {}) in the configuration, or -q to trust them",
            signers.join(", ")
        )));
    }
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|e| bad(format!("the terminal: {e}")))?;
    let mut w = &tty;
    let _ = write!(
        w,
        "The advertisement of {url} contains the following signing keys:\n\n{}\n\nDo you \
         wish to trust these keys? [ynYN] ",
        signers.join("\n")
    );
    let _ = w.flush();
    let mut answer = String::new();
    std::io::BufReader::new(&tty)
        .read_line(&mut answer)
        .map_err(|e| bad(e.to_string()))?;
    Ok(matches!(answer.trim(), "y" | "Y"))
}

fn random_below(p: &crypto_bigint::U256) -> CliResult<crypto_bigint::U256> {
    use crypto_bigint::U256;
    loop {
        let mut b = SecretBytes::zeroed(32);
        cryptblk_crypto::random_bytes(&mut b).map_err(|e| bad(e.to_string()))?;
        let v = U256::from_be_slice(&b);
        if &v < p && v != U256::ZERO {
            return Ok(v);
        }
    }
}

/// A random 256-bit prime (top bit set): Miller-Rabin, 64 random bases.
fn random_prime() -> CliResult<crypto_bigint::U256> {
    use crypto_bigint::modular::runtime_mod::{DynResidue, DynResidueParams};
    use crypto_bigint::{NonZero, U256};
    const SMALL: [u64; 15] = [3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53];
    'candidate: loop {
        let mut b = [0u8; 32];
        cryptblk_crypto::random_bytes(&mut b).map_err(|e| bad(e.to_string()))?;
        b[0] |= 0x80;
        b[31] |= 1;
        let n = U256::from_be_slice(&b);
        for q in SMALL {
            let q = NonZero::new(U256::from_u64(q)).expect("non-zero");
            if n.rem(&q) == U256::ZERO {
                continue 'candidate;
            }
        }
        let params = DynResidueParams::new(&n);
        let one = DynResidue::one(params);
        let n1 = n.wrapping_sub(&U256::ONE);
        let minus_one = DynResidue::new(&n1, params);
        let s = n1.trailing_zeros();
        let d = n1.shr_vartime(s);
        for _ in 0..64 {
            let a = DynResidue::new(&random_below(&n1)?, params);
            let mut x = a.pow(&d);
            if x == one || x == minus_one {
                continue;
            }
            let mut witness = true;
            for _ in 1..s {
                x = x.square();
                if x == minus_one {
                    witness = false;
                    break;
                }
            }
            if witness {
                continue 'candidate;
            }
        }
        return Ok(n);
    }
}

fn sss(config: &Value, cx: &BindContext) -> CliResult<(Value, SecretBytes)> {
    use crypto_bigint::U256;
    use crypto_bigint::modular::runtime_mod::{DynResidue, DynResidueParams};
    let t = config["t"].as_u64().filter(|&t| t >= 1).unwrap_or(1) as usize;
    let pins = config["pins"]
        .as_object()
        .ok_or_else(|| bad("the sss configuration has no \"pins\" object"))?;
    let mut children = Vec::new();
    for (pin, cfg) in pins {
        match cfg {
            Value::Array(a) => children.extend(a.iter().map(|c| (pin.as_str(), c))),
            c => children.push((pin.as_str(), c)),
        }
    }
    if children.len() < t {
        return Err(bad(format!(
            "sss: a threshold of {t} over {} pins",
            children.len()
        )));
    }
    let p = random_prime()?;
    let params = DynResidueParams::new(&p);
    let coefficients = (0..t)
        .map(|_| random_below(&p))
        .collect::<CliResult<Vec<U256>>>()?;
    let be = |v: &U256| {
        let mut out = SecretBytes::zeroed(32);
        let width = std::mem::size_of::<crypto_bigint::Word>();
        for (chunk, w) in out.rchunks_mut(width).zip(v.as_words()) {
            chunk.copy_from_slice(&w.to_be_bytes());
        }
        out
    };
    let mut jwes = Vec::new();
    for (pin, cfg) in children {
        let x = random_below(&p)?;
        let xr = DynResidue::new(&x, params);
        let (mut y, mut power) = (DynResidue::zero(params), DynResidue::one(params));
        for e in &coefficients {
            y = y.add(&DynResidue::new(e, params).mul(&power));
            power = power.mul(&xr);
        }
        let mut point = SecretBytes::zeroed(64);
        point[..32].copy_from_slice(&be(&x));
        point[32..].copy_from_slice(&be(&y.retrieve()));
        jwes.push(encrypt(pin, cfg, &point, cx)?.compact());
    }
    let header = json!({
        "alg": "dir",
        "clevis": {"pin": "sss", "sss": {"jwe": jwes, "p": B64.encode(&be(&p)[..]), "t": t}},
        "enc": "A256GCM",
    });
    Ok((header, be(&coefficients[0])))
}

fn tpm2(config: &Value, cx: &BindContext) -> CliResult<(Value, SecretBytes)> {
    use cryptblk_tpm2::{Parent, Policy, alg, template};
    let text = |f: &str, default: &str| config[f].as_str().unwrap_or(default).to_owned();
    let hash_name = text("hash", "sha256");
    let hash = alg::hash_by_name(&hash_name).ok_or_else(|| bad(format!("hash '{hash_name}'")))?;
    let key = text("key", "ecc");
    let key_alg = match key.as_str() {
        "ecc" => alg::ECC,
        "rsa" => alg::RSA,
        other => return Err(bad(format!("tpm2 key '{other}' (ecc or rsa)"))),
    };
    let bank_name = text("pcr_bank", "sha256");
    let bank = alg::hash_by_name(&bank_name).ok_or_else(|| bad(format!("bank '{bank_name}'")))?;
    let ids: Vec<String> = match &config["pcr_ids"] {
        Value::Null => Vec::new(),
        Value::String(s) => s.split(',').map(|p| p.trim().to_owned()).collect(),
        Value::Array(a) => a
            .iter()
            .map(|p| p.to_string().trim_matches('"').to_owned())
            .collect(),
        Value::Number(n) => vec![n.to_string()],
        _ => return Err(bad("tpm2 \"pcr_ids\" is not a list of PCRs")),
    };
    let pcrs = ids
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>()
                .ok()
                .filter(|&n| n < 24)
                .ok_or_else(|| bad(format!("PCR '{p}'")))
        })
        .collect::<CliResult<Vec<u32>>>()?;
    let mut cek = SecretBytes::zeroed(32);
    cryptblk_crypto::random_bytes(&mut cek).map_err(|e| bad(e.to_string()))?;
    let k = zeroize::Zeroizing::new(B64.encode(&cek[..]));
    let jwk = SecretBytes::from_vec(
        format!(
            r#"{{"alg":"A256GCM","k":"{}","key_ops":["encrypt","decrypt"],"kty":"oct"}}"#,
            k.as_str()
        )
        .into_bytes(),
    );
    let tcti = cryptblk_tpm2::tcti_for(cx.tpm2_device.as_deref()).map_err(bad)?;
    let tpm = cryptblk_tpm2::Tpm::open(&tcti).map_err(bad)?;
    let attributes = if pcrs.is_empty() {
        template::CLEVIS_SEALED | template::USER_WITH_AUTH
    } else {
        template::CLEVIS_SEALED
    };
    let (private, public, _) = cryptblk_tpm2::seal(
        &tpm,
        &Parent::Primary {
            key_alg,
            name_hash: hash,
        },
        &Policy {
            pcr_bank: bank,
            pcrs: &pcrs,
            auth: None,
            authorized: None,
        },
        hash,
        attributes,
        &jwk,
    )
    .map_err(|e| bad(format!("tpm2: {e}")))?;
    let mut tpm2 = json!({
        "hash": hash_name,
        "jwk_priv": B64.encode(&private),
        "jwk_pub": B64.encode(&public),
        "key": key,
    });
    if !pcrs.is_empty() {
        let ids: Vec<String> = pcrs.iter().map(u32::to_string).collect();
        tpm2["pcr_bank"] = json!(bank_name);
        tpm2["pcr_ids"] = json!(ids.join(","));
    }
    let header = json!({
        "alg": "dir",
        "clevis": {"pin": "tpm2", "tpm2": tpm2},
        "enc": "A256GCM",
    });
    Ok((header, cek))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_primes_are_prime_and_256_bits() {
        use crypto_bigint::U256;
        let p = random_prime().unwrap();
        assert_eq!(p.bits(), 256);
        // Fermat's little theorem for a few bases.
        use crypto_bigint::modular::runtime_mod::{DynResidue, DynResidueParams};
        let params = DynResidueParams::new(&p);
        let pm1 = p.wrapping_sub(&U256::ONE);
        for a in [2u64, 3, 5, 7] {
            let r = DynResidue::new(&U256::from_u64(a), params)
                .pow(&pm1)
                .retrieve();
            assert_eq!(r, U256::ONE);
        }
    }
}
