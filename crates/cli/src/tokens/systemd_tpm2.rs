//! systemd-tpm2 tokens (`systemd-cryptenroll --tpm2-device`): 32 random bytes sealed to
//! the TPM under a PCR policy (and a PIN), whose base64 is the keyslot's passphrase.
//! The token holds the sealed object (`tpm2-blob`: its private then its public part), the
//! PCRs and bank, the primary key's algorithm, the policy's digest and whether a PIN is
//! needed, as systemd 252 to 256 write them.

use super::TokenArgs;
use crate::error::{CliError, CliResult};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use cryptblk_crypto::SecretBytes;
use cryptblk_tpm2::{Parent, Policy, alg, wire::split_sized};
use serde_json::Value;

fn bad(what: impl std::fmt::Display) -> CliError {
    CliError::usage(format!("systemd-tpm2 token: {what}"))
}

fn b64(field: &str, v: &Value) -> CliResult<Vec<u8>> {
    let s = v
        .as_str()
        .ok_or_else(|| bad(format!("'{field}' is not a string")))?;
    B64.decode(s)
        .map_err(|_| bad(format!("'{field}' is not base64")))
}

/// The PCR indexes of a token field (an array of numbers below 24).
fn pcrs(field: &str, v: &Value) -> CliResult<Vec<u32>> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => a
            .iter()
            .map(|p| {
                p.as_u64()
                    .filter(|&p| p < 24)
                    .map(|p| p as u32)
                    .ok_or_else(|| bad(format!("'{field}' holds {p}, not a PCR")))
            })
            .collect(),
        _ => Err(bad(format!("'{field}' is not an array"))),
    }
}

/// The TPM authorization value of a PIN as systemd derives it: SHA-256 of the PIN, or
/// with a `tpm2_salt` (systemd 253+) of the base64 of PBKDF2-HMAC-SHA256(PIN, salt,
/// 10,000 iterations); trailing zero bytes dropped, as the TPM drops them when it stores
/// an authorization value.
pub(crate) fn pin_auth(pin: &[u8], salt: Option<&[u8]>) -> CliResult<SecretBytes> {
    use sha2::Digest as _;
    let salted;
    let pin = match salt {
        Some(salt) => {
            let mut key = SecretBytes::zeroed(32);
            cryptblk_crypto::Kdf::Pbkdf2 {
                hash: cryptblk_crypto::HashAlg::Sha256,
                iterations: 10_000,
            }
            .derive(pin, salt, &mut key)
            .map_err(|e| bad(e.to_string()))?;
            salted = SecretBytes::from_vec(B64.encode(&key[..]).into_bytes());
            &salted[..]
        }
        None => pin,
    };
    let mut hash = SecretBytes::from_slice(&sha2::Sha256::digest(pin));
    let len = hash.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if len < hash.len() {
        hash = SecretBytes::from_slice(&hash[..len]);
    }
    Ok(hash)
}

/// The key that signs PCR policies (systemd's `--tpm2-public-key`, a token's
/// `tpm2_pubkey`): as the TPM loads it, and its fingerprint in signature files.
pub(crate) struct PolicyKey {
    /// The file as given (PEM), which the token keeps.
    pub file: Vec<u8>,
    /// `TPM2B_PUBLIC`, wire form.
    pub tpm: cryptblk_tpm2::wire::Wire,
    /// The same with the exponent field 0, as systemd 255.0-255.2 loaded it.
    pub tpm_exponent_zero: Option<cryptblk_tpm2::wire::Wire>,
    /// SHA-256 of the key's PKCS#1 DER (OpenSSL's i2d_PublicKey): systemd-measure's `pkfp`.
    pub fingerprint: Vec<u8>,
}

impl PolicyKey {
    /// A public key in PEM (`-----BEGIN PUBLIC KEY-----`) or DER SubjectPublicKeyInfo.
    /// systemd signs PCR policies with RSA keys only (systemd-measure).
    pub(crate) fn parse(file: &[u8]) -> CliResult<PolicyKey> {
        use der::{Decode as _, DecodePem as _, Reader as _};
        use sha2::Digest as _;
        let spki = match std::str::from_utf8(file) {
            Ok(pem) if pem.trim_start().starts_with("-----BEGIN") => {
                spki::SubjectPublicKeyInfoOwned::from_pem(pem.trim())
            }
            _ => spki::SubjectPublicKeyInfoOwned::from_der(file),
        }
        .map_err(|e| bad(format!("the PCR signing key is not a public key: {e}")))?;
        if spki.algorithm.oid != der::oid::ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1") {
            return Err(bad(format!(
                "the PCR signing key is not an RSA key (algorithm {}): systemd signs PCR                  policies with RSA",
                spki.algorithm.oid
            )));
        }
        let pkcs1 = spki.subject_public_key.raw_bytes();
        let (n, e) = der::SliceReader::new(pkcs1)
            .and_then(|mut r| {
                r.sequence(|r| {
                    let n = der::asn1::UintRef::decode(r)?;
                    let e = der::asn1::UintRef::decode(r)?;
                    Ok((n.as_bytes().to_vec(), e.as_bytes().to_vec()))
                })
            })
            .map_err(|e| bad(format!("the PCR signing key's RSA numbers: {e}")))?;
        let tpm = cryptblk_tpm2::template::rsa_public(&n, &e).ok_or_else(|| {
            bad(format!(
                "an RSA key of {} bits with a {}-byte exponent: the TPM takes up to 4096 bits \
                 and 32-bit exponents",
                n.len() * 8,
                e.len()
            ))
        })?;
        Ok(PolicyKey {
            file: file.to_vec(),
            tpm_exponent_zero: cryptblk_tpm2::template::rsa_public_with_exponent(&n, 0),
            tpm,
            fingerprint: sha2::Sha256::digest(pkcs1).to_vec(),
        })
    }
}

/// systemd's configuration directories, in its search order (Debian's /lib/systemd
/// too): where it looks for the PCR signature and the PCR signing key.
pub(crate) const SYSTEMD_CONF_DIRS: [&str; 5] = [
    "/etc/systemd",
    "/run/systemd",
    "/usr/local/lib/systemd",
    "/usr/lib/systemd",
    "/lib/systemd",
];

/// systemd-measure's signature file: per PCR bank, entries of PCRs, key fingerprint,
/// policy digest (hex) and its signature (base64).
pub(crate) struct Signatures(Value);

impl Signatures {
    /// The file named (a bare file name is looked for as below), else
    /// tpm2-pcr-signature.json in systemd's configuration directories (/etc/systemd,
    /// /run/systemd, /usr/local/lib/systemd, /usr/lib/systemd), then in /.extra (where
    /// systemd-stub hands it to the initrd), as systemd looks for it.
    pub(crate) fn load(path: Option<&std::path::Path>) -> CliResult<Signatures> {
        use std::path::Path;
        let name = path.unwrap_or(Path::new("tpm2-pcr-signature.json"));
        // Where systemd-stub hands it to the initrd, last.
        let dirs: Vec<&str> = SYSTEMD_CONF_DIRS
            .iter()
            .copied()
            .chain(["/.extra"])
            .collect();
        let path = if name.components().count() > 1 || name.is_absolute() {
            name.to_path_buf()
        } else {
            dirs.iter()
                .map(|d| Path::new(d).join(name))
                .find(|p| p.exists())
                .ok_or_else(|| {
                    bad(format!(
                        "the token's PCR policy is signed and no signature was found ({} in {}): \
                         give --tpm2-signature",
                        name.display(),
                        dirs.join(", ")
                    ))
                })?
        };
        let text = std::fs::read(&path).map_err(|e| crate::error::io_err(&path, e))?;
        let v: Value = serde_json::from_slice(&text)
            .map_err(|e| bad(format!("{}: not JSON: {e}", path.display())))?;
        if !v.is_object() {
            return Err(bad(format!("{}: not a JSON object", path.display())));
        }
        Ok(Signatures(v))
    }

    /// The signature (`TPMT_SIGNATURE`) of `policy` for these PCRs of `bank` by `key`.
    pub(crate) fn find(
        &self,
        bank: &str,
        pcrs: &[u32],
        key: &PolicyKey,
        policy: &[u8],
    ) -> Result<cryptblk_tpm2::wire::Wire, cryptblk_tpm2::Error> {
        let missing = |what: &str| {
            cryptblk_tpm2::Error::Format(format!(
                "no signature for the PCR policy the TPM is in now ({what}: PCRs {pcrs:?} of \
             {bank}, policy {}): the PCRs hold values nobody signed",
                hex::encode(policy)
            ))
        };
        let entries = self.0[bank]
            .as_array()
            .ok_or_else(|| missing("no entry for the bank"))?;
        let hex_is = |v: &Value, want: &[u8]| {
            v.as_str()
                .and_then(|s| hex::decode(s).ok())
                .is_some_and(|b| b == want)
        };
        for e in entries {
            let mut their: Vec<u32> = match pcrs_field(&e["pcrs"]) {
                Some(p) => p,
                None => continue,
            };
            their.sort_unstable();
            their.dedup();
            if their != pcrs || !hex_is(&e["pkfp"], &key.fingerprint) || !hex_is(&e["pol"], policy)
            {
                continue;
            }
            let sig = e["sig"]
                .as_str()
                .and_then(|s| B64.decode(s).ok())
                .ok_or_else(|| cryptblk_tpm2::Error::Format("a signature is not base64".into()))?;
            return Ok(cryptblk_tpm2::template::rsassa_sha256_signature(&sig));
        }
        Err(missing("no matching entry"))
    }
}

fn pcrs_field(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?
        .iter()
        .map(|p| p.as_u64().filter(|&p| p < 24).map(|p| p as u32))
        .collect()
}

/// The passphrase a systemd-tpm2 token's sealed secret gives (base64 of it).
pub(crate) fn passphrase(token: &Value, args: &TokenArgs) -> CliResult<SecretBytes> {
    if token.get("tpm2_pcrlock_nv").is_some_and(|v| !v.is_null()) {
        return Err(bad(
            "'tpm2_pcrlock_nv' (pcrlock policies) is not supported yet",
        ));
    }
    if token["tpm2_pcrlock"] == Value::Bool(true) {
        return Err(bad("pcrlock policies are not supported yet"));
    }
    let blob = b64("tpm2-blob", &token["tpm2-blob"])?;
    let (private, rest) = split_sized(&blob).ok_or_else(|| bad("'tpm2-blob' is truncated"))?;
    let (public, rest) = split_sized(rest).ok_or_else(|| bad("'tpm2-blob' is truncated"))?;
    if !rest.is_empty() {
        return Err(bad(
            "'tpm2-blob' carries an import seed (offline enrollment): not supported yet",
        ));
    }
    let signed_pcrs = pcrs("tpm2_pubkey_pcrs", &token["tpm2_pubkey_pcrs"])?;
    let pcrs = pcrs("tpm2-pcrs", &token["tpm2-pcrs"])?;
    let bank = match token["tpm2-pcr-bank"].as_str() {
        Some(name) => alg::hash_by_name(name).ok_or_else(|| bad(format!("PCR bank '{name}'")))?,
        // Written by systemd 250 on; before, SHA-256 (the bank systemd picks first).
        None => alg::SHA256,
    };
    let key_alg = match token["tpm2-primary-alg"].as_str().unwrap_or("ecc") {
        "ecc" => alg::ECC,
        "rsa" => alg::RSA,
        other => return Err(bad(format!("primary key algorithm '{other}'"))),
    };
    let srk = token
        .get("tpm2_srk")
        .filter(|v| !v.is_null())
        .map(|v| b64("tpm2_srk", v))
        .transpose()?;
    let from = match &srk {
        Some(s) => Parent::Serialized(s),
        None => Parent::Primary {
            key_alg,
            name_hash: alg::SHA256,
        },
    };
    let auth = if token["tpm2-pin"] == Value::Bool(true) {
        let salt = token
            .get("tpm2_salt")
            .filter(|v| !v.is_null())
            .map(|v| b64("tpm2_salt", v))
            .transpose()?;
        let pin = super::token_pin("TPM2", args.asked())?;
        Some(pin_auth(&pin, salt.as_deref())?)
    } else {
        None
    };
    let bank_name = token["tpm2-pcr-bank"]
        .as_str()
        .unwrap_or("sha256")
        .to_ascii_lowercase();
    // A signed PCR policy: the key, its PCRs and the signatures of the values allowed.
    let signed = match (&token["tpm2_pubkey"], signed_pcrs.is_empty()) {
        (_, true) => None,
        (Value::Null, false) => {
            return Err(bad("'tpm2_pubkey_pcrs' without 'tpm2_pubkey'"));
        }
        (key, false) => Some((
            PolicyKey::parse(&b64("tpm2_pubkey", key)?)?,
            Signatures::load(args.tpm2_signature.as_deref())?,
        )),
    };
    let find = signed.as_ref().map(|(key, sigs)| {
        let bank_name = bank_name.clone();
        let signed_pcrs = signed_pcrs.clone();
        move |approved: &[u8]| sigs.find(&bank_name, &signed_pcrs, key, approved)
    });
    let tcti = cryptblk_tpm2::tcti_for(args.tpm2_device.as_deref()).map_err(bad)?;
    let tpm = cryptblk_tpm2::Tpm::open(&tcti).map_err(bad)?;
    let policy = Policy {
        pcr_bank: bank,
        pcrs: &pcrs,
        auth: auth.as_deref(),
        authorized: signed.as_ref().map(|(key, _)| cryptblk_tpm2::Authorized {
            key: &key.tpm,
            pcrs: &signed_pcrs,
            signature: find.as_ref().map(|f| f as &dyn Fn(&[u8]) -> Result<_, _>),
        }),
    };
    let mut result = cryptblk_tpm2::unseal(&tpm, &from, private, public, &policy);
    // A token systemd 255.0-255.2 enrolled names the key with the exponent field 0.
    if let (Err(cryptblk_tpm2::Error::PolicyMismatch), Some(a), Some((key, _))) =
        (&result, &policy.authorized, &signed)
        && let Some(zero) = &key.tpm_exponent_zero
    {
        let legacy = Policy {
            authorized: Some(cryptblk_tpm2::Authorized { key: zero, ..*a }),
            ..policy
        };
        result = cryptblk_tpm2::unseal(&tpm, &from, private, public, &legacy);
    }
    let secret = result.map_err(|e| {
        if e.is_bad_auth() {
            CliError::new(
                crate::error::EXIT_PERMISSION,
                "systemd-tpm2 token: wrong PIN",
            )
        } else {
            bad(e)
        }
    })?;
    Ok(SecretBytes::from_vec(B64.encode(&secret[..]).into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_auth_values_are_systemds() {
        use sha2::Digest as _;
        let plain = pin_auth(b"1234", None).unwrap();
        assert_eq!(&plain[..], &sha2::Sha256::digest(b"1234")[..]);
        // With a salt: SHA-256 of the base64 of the PBKDF2 output.
        let salted = pin_auth(b"1234", Some(&[1u8; 32])).unwrap();
        let mut k = [0u8; 32];
        cryptblk_crypto::Kdf::Pbkdf2 {
            hash: cryptblk_crypto::HashAlg::Sha256,
            iterations: 10_000,
        }
        .derive(b"1234", &[1u8; 32], &mut k)
        .unwrap();
        let want = sha2::Sha256::digest(B64.encode(k).as_bytes());
        let want = &want[..want.iter().rposition(|&b| b != 0).unwrap() + 1];
        assert_eq!(&salted[..], want);
        assert_eq!(
            pcrs("p", &serde_json::json!([0, 7, 23])).unwrap(),
            [0, 7, 23]
        );
        assert!(pcrs("p", &serde_json::json!([24])).is_err());
    }
}
