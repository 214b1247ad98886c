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

/// The passphrase a systemd-tpm2 token's sealed secret gives (base64 of it).
pub(crate) fn passphrase(token: &Value, args: &TokenArgs) -> CliResult<SecretBytes> {
    for unsupported in ["tpm2_pubkey_pcrs", "tpm2_pcrlock_nv"] {
        if token
            .get(unsupported)
            .is_some_and(|v| !v.is_null() && v != &Value::Array(vec![]))
        {
            return Err(bad(format!(
                "'{unsupported}' (signed or pcrlock policies) is not supported yet"
            )));
        }
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
    let tcti = cryptblk_tpm2::tcti_for(args.tpm2_device.as_deref()).map_err(bad)?;
    let tpm = cryptblk_tpm2::Tpm::open(&tcti).map_err(bad)?;
    let policy = Policy {
        pcr_bank: bank,
        pcrs: &pcrs,
        auth: auth.as_deref(),
    };
    let secret = cryptblk_tpm2::unseal(&tpm, &from, private, public, &policy).map_err(|e| {
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
