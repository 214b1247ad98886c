//! `enroll`: binds a LUKS2 volume to a TPM2 or a PKCS#11 security token the way
//! `systemd-cryptenroll --tpm2-device` / `--pkcs11-token-uri` do, so that systemd-cryptsetup and cryptsetup's systemd-tpm2 plugin unlock what
//! cryptblk enrolled (and cryptblk what they did): 32 random bytes sealed to the TPM under
//! a PCR policy (and a PIN), their base64 the passphrase of a new keyslot (PBKDF2, 1,000
//! iterations: the secret has full entropy), a `systemd-tpm2` token naming it. For a
//! PKCS#11 token: random bytes encrypted to the RSA certificate on it (the token's private
//! key decrypts them at unlock), a `systemd-pkcs11` token.
//!
//! `--clevis PIN CONFIG` binds as `clevis luks bind` does (tokens/clevis_bind.rs).
//!
//! The token is written as systemd 252 writes it (no `tpm2_salt`, no `tpm2_srk`): newer
//! systemd reads that form too, and 252 (Debian 12) reads no other.

use super::{header_path, luks2_header, open_header, unlock_or_token};
use crate::args::{HeaderArgs, KeyArgs};
use crate::ctx::Ctx;
use crate::error::{CliError, CliResult};
use crate::tokens::TokenArgs;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use clap::Args;
use cryptblk_crypto::{HashAlg, KdfKind, KdfRequest, SecretBytes};
use cryptblk_format::{LuksHeader, Storage};
use cryptblk_tpm2::{Parent, Policy, alg};
use serde_json::{Value, json};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct EnrollArgs {
    pub device: PathBuf,
    #[command(flatten)]
    pub header: HeaderArgs,
    /// An existing passphrase (or --key-file) unlocks the volume key.
    #[command(flatten)]
    pub key: KeyArgs,
    /// The keyslot the existing passphrase opens.
    #[arg(short = 'S', long = "key-slot")]
    pub key_slot: Option<u32>,
    /// --tpm2-device names the TPM to enroll (and to unlock existing TPM2 tokens with).
    #[command(flatten)]
    pub tokens: TokenArgs,
    /// PCRs the secret is sealed to, at their current values, as systemd-cryptenroll
    /// takes them: "7", "0+7", "0,7"; empty for none.
    #[arg(long = "tpm2-pcrs", value_name = "PCR[+PCR...]", default_value = "7")]
    pub tpm2_pcrs: String,
    /// Also require a PIN (asked twice, or $NEWPIN as systemd-cryptenroll takes it).
    #[arg(long = "tpm2-with-pin", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "yes", default_value = "no")]
    pub tpm2_with_pin: String,
    /// Enroll the security token this PKCS#11 URI names (its RSA certificate), as
    /// systemd-cryptenroll --pkcs11-token-uri; its PIN from $PIN or asked.
    #[arg(long = "pkcs11-token-uri", value_name = "URI")]
    pub pkcs11_token_uri: Option<String>,
    /// Bind with clevis's PIN (tang, sss, tpm2) and its JSON configuration, as
    /// `clevis luks bind -d DEVICE PIN CONFIG`; -q trusts a tang server's keys as clevis's
    /// -y does (else "thp" in the configuration, or asked on the terminal).
    #[arg(long = "clevis", num_args = 2, value_names = ["PIN", "CONFIG"])]
    pub clevis: Option<Vec<String>>,
    /// Once enrolled, wipe these keyslots (and their tokens), as systemd-cryptenroll:
    /// numbers, "password" (keyslots no token names), "tpm2" (other systemd-tpm2
    /// tokens' keyslots), "all" (every other keyslot); comma-separated.
    #[arg(long = "wipe-slot", value_name = "SLOTS")]
    pub wipe_slot: Option<String>,
}

fn bad(what: impl std::fmt::Display) -> CliError {
    CliError::usage(format!("enroll: {what}"))
}

/// A yes/no option value as systemd parses booleans.
fn boolean(v: &str) -> CliResult<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "yes" | "y" | "true" | "t" | "on" => Ok(true),
        "0" | "no" | "n" | "false" | "f" | "off" => Ok(false),
        _ => Err(bad(format!("'{v}' is not a boolean"))),
    }
}

/// PCR indexes as systemd-cryptenroll takes them (`+` or `,` between them).
fn parse_pcrs(s: &str) -> CliResult<Vec<u32>> {
    let mut pcrs: Vec<u32> = s
        .split(['+', ','])
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>()
                .ok()
                .filter(|&n| n < 24)
                .ok_or_else(|| bad(format!("'{p}' is not a PCR (0-23)")))
        })
        .collect::<CliResult<_>>()?;
    pcrs.sort_unstable();
    pcrs.dedup();
    Ok(pcrs)
}

/// The new PIN: $NEWPIN, else asked twice on the terminal, else a line of stdin.
fn new_pin() -> CliResult<SecretBytes> {
    use std::io::IsTerminal;
    let pin = if let Some(p) = std::env::var_os("NEWPIN") {
        use std::os::unix::ffi::OsStringExt;
        SecretBytes::from_vec(p.into_vec())
    } else if std::io::stdin().is_terminal() {
        let a = rpassword::prompt_password("Please enter TPM2 PIN: ")
            .map_err(|e| bad(format!("cannot read the PIN: {e}")))?;
        let a = SecretBytes::from_vec(a.into_bytes());
        let b = rpassword::prompt_password("Please enter TPM2 PIN (repeat): ")
            .map_err(|e| bad(format!("cannot read the PIN: {e}")))?;
        let b = SecretBytes::from_vec(b.into_bytes());
        if a != b {
            return Err(bad("the PINs do not match"));
        }
        a
    } else {
        crate::passphrase::get_tcrypt_passphrase("", false)?
    };
    if pin.is_empty() {
        return Err(bad("an empty PIN"));
    }
    Ok(pin)
}

/// The keyslots `--wipe-slot` names, the new one and those of no kind left out.
fn slots_to_wipe(spec: &str, hdr: &Value, new_slot: u32) -> CliResult<Vec<u32>> {
    let active: Vec<u32> = hdr["keyslots"]
        .as_object()
        .map(|m| m.keys().filter_map(|k| k.parse().ok()).collect())
        .unwrap_or_default();
    let token_slots = |kind: Option<&str>| -> Vec<u32> {
        hdr["tokens"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
            .filter(|t| kind.is_none_or(|k| t["type"] == k))
            .flat_map(|t| t["keyslots"].as_array().cloned().unwrap_or_default())
            .filter_map(|s| s.as_str()?.parse().ok())
            .collect()
    };
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "all" => out.extend(&active),
            "password" => {
                let named = token_slots(None);
                out.extend(active.iter().filter(|s| !named.contains(s)));
            }
            "tpm2" => out.extend(token_slots(Some("systemd-tpm2"))),
            n => {
                let n: u32 = n.parse().map_err(|_| {
                    bad(format!(
                        "--wipe-slot '{n}': a keyslot number, password, tpm2 or all"
                    ))
                })?;
                if !active.contains(&n) {
                    return Err(bad(format!("keyslot {n} is not active")));
                }
                out.push(n);
            }
        }
    }
    out.retain(|&s| s != new_slot);
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

pub(crate) fn enroll(ctx: &Ctx, a: EnrollArgs) -> CliResult<()> {
    let kind = match (
        a.clevis.is_some(),
        a.pkcs11_token_uri.is_some(),
        a.tokens.tpm2_device.is_some(),
    ) {
        (true, false, _) => "clevis",
        (false, true, false) => "PKCS#11",
        (false, false, true) => "TPM2",
        (false, false, false) => {
            return Err(bad(
                "say what to enroll: --tpm2-device PATH|auto|TCTI, --pkcs11-token-uri URI or \
                 --clevis PIN CONFIG",
            ));
        }
        _ => {
            return Err(bad(
                "one token at a time: --tpm2-device, --pkcs11-token-uri or --clevis",
            ));
        }
    };
    let path = header_path(&a.device, &a.header).to_path_buf();
    let mut dev = open_header(ctx, &a.device, &a.header, true)?;
    let mut hdr = luks2_header(&mut dev, &path)?;
    let (_, vk) = unlock_or_token(
        &hdr,
        &mut dev,
        &a.key,
        &a.tokens,
        "Please enter current passphrase for disk: ",
        a.key_slot,
    )?;
    let (pass, mut token) = match kind {
        "TPM2" => tpm2_token(&a)?,
        "clevis" => clevis_token(ctx, &a)?,
        _ => pkcs11_token(a.pkcs11_token_uri.as_deref().unwrap_or_default())?,
    };
    // A full-entropy secret: the cheapest PBKDF (systemd-cryptenroll's and clevis's
    // choice too, with their hashes).
    let kdf = KdfRequest {
        kind: KdfKind::Pbkdf2,
        hash: if kind == "clevis" {
            HashAlg::Sha256
        } else {
            HashAlg::Sha512
        },
        iter_time_ms: 0,
        forced_iterations: Some(1000),
        memory_kib: 0,
        parallel: 0,
    };
    let slot = hdr.add_keyslot(&mut dev, &vk, &pass, None, &kdf)?;
    token["keyslots"] = json!([slot.to_string()]);
    if let Err(e) = hdr.set_token(&mut dev, None, token, false) {
        // No keyslot without its token: take it back.
        let _ = hdr.kill_keyslot(&mut dev, slot);
        return Err(e.into());
    }
    eprintln!("New {kind} token enrolled as key slot {slot}.");
    if let Some(spec) = &a.wipe_slot {
        wipe(&mut hdr, &mut dev, spec, slot)?;
    }
    Ok(())
}

/// A secret sealed to the TPM: its base64 (the new keyslot's passphrase) and the
/// systemd-tpm2 token, keyslots to be filled in.
fn tpm2_token(a: &EnrollArgs) -> CliResult<(SecretBytes, Value)> {
    let pcrs = parse_pcrs(&a.tpm2_pcrs)?;
    let with_pin = boolean(&a.tpm2_with_pin)?;
    let pin = with_pin.then(new_pin).transpose()?;
    let auth = pin
        .as_deref()
        .map(|p| crate::tokens::tpm2_pin_auth(p, None))
        .transpose()?;
    let mut secret = SecretBytes::zeroed(32);
    cryptblk_crypto::random_bytes(&mut secret).map_err(|e| bad(e.to_string()))?;
    let tcti = cryptblk_tpm2::tcti_for(a.tokens.tpm2_device.as_deref()).map_err(bad)?;
    let tpm = cryptblk_tpm2::Tpm::open(&tcti).map_err(bad)?;
    let policy = Policy {
        pcr_bank: alg::SHA256,
        pcrs: &pcrs,
        auth: auth.as_deref(),
    };
    let from = Parent::Primary {
        key_alg: alg::ECC,
        name_hash: alg::SHA256,
    };
    let (private, public, digest) = cryptblk_tpm2::seal(
        &tpm,
        &from,
        &policy,
        alg::SHA256,
        cryptblk_tpm2::template::SYSTEMD_SEALED,
        &secret,
    )
    .map_err(bad)?;
    let mut blob = private;
    blob.extend_from_slice(&public);
    let token = json!({
        "type": "systemd-tpm2",
        "keyslots": [],
        "tpm2-blob": B64.encode(&blob),
        "tpm2-pcrs": pcrs,
        "tpm2-pcr-bank": "sha256",
        "tpm2-primary-alg": "ecc",
        "tpm2-policy-hash": hex::encode(&digest),
        "tpm2-pin": with_pin,
    });
    Ok((
        SecretBytes::from_vec(B64.encode(&secret[..]).into_bytes()),
        token,
    ))
}

/// A random passphrase (base64 of 32 bytes) in a clevis JWE bound with the pin and
/// configuration given, and the clevis token holding it, as `clevis luks bind` writes it.
fn clevis_token(ctx: &Ctx, a: &EnrollArgs) -> CliResult<(SecretBytes, Value)> {
    let (pin, config) = match a.clevis.as_deref() {
        Some([pin, config]) => (pin.as_str(), config.as_str()),
        _ => return Err(bad("--clevis takes a PIN and its CONFIG")),
    };
    let mut secret = SecretBytes::zeroed(32);
    cryptblk_crypto::random_bytes(&mut secret).map_err(|e| bad(e.to_string()))?;
    let pass = SecretBytes::from_vec(B64.encode(&secret[..]).into_bytes());
    let cx = crate::tokens::BindContext {
        trust: ctx.batch,
        timeout: std::time::Duration::from_secs(a.tokens.token_timeout.max(1)),
        tpm2_device: a.tokens.tpm2_device.clone(),
    };
    let jwe = crate::tokens::clevis_bind(pin, config, &pass, &cx)?;
    Ok((pass, json!({"type": "clevis", "keyslots": [], "jwe": jwe})))
}

/// A random key encrypted to the RSA certificate on the token `uri` names, as
/// systemd-cryptenroll does (half the modulus' size): its base64 (the new keyslot's
/// passphrase) and the systemd-pkcs11 token, keyslots to be filled in.
fn pkcs11_token(uri: &str) -> CliResult<(SecretBytes, Value)> {
    let parsed = cryptblk_pkcs11::Uri::parse(uri).map_err(bad)?;
    let mut pin_error = None;
    let cert = cryptblk_pkcs11::certificate(&parsed, &mut |label| match crate::tokens::token_pin(
        &format!("PKCS#11 token '{}'", label.label),
    ) {
        Ok(p) => Some(zeroize::Zeroizing::new(p.to_vec())),
        Err(e) => {
            pin_error = Some(e);
            None
        }
    })
    .map_err(|e| pin_error.take().unwrap_or_else(|| bad(e)))?;
    let (n, e) = cryptblk_pkcs11::rsa_public_key(&cert).map_err(bad)?;
    let mut secret = SecretBytes::zeroed(n.len() / 2);
    cryptblk_crypto::random_bytes(&mut secret).map_err(|e| bad(e.to_string()))?;
    let sealed = cryptblk_pkcs11::rsa_encrypt_pkcs1(&n, &e, &secret).map_err(bad)?;
    let token = json!({
        "type": "systemd-pkcs11",
        "keyslots": [],
        "pkcs11-uri": uri,
        "pkcs11-key": B64.encode(&sealed),
    });
    Ok((
        SecretBytes::from_vec(B64.encode(&secret[..]).into_bytes()),
        token,
    ))
}

/// Wipes the keyslots `spec` names, and the tokens left with none.
fn wipe(
    hdr: &mut cryptblk_format::luks2::Luks2Header,
    dev: &mut dyn Storage,
    spec: &str,
    new_slot: u32,
) -> CliResult<()> {
    let slots = slots_to_wipe(spec, hdr.json(), new_slot)?;
    for s in &slots {
        hdr.kill_keyslot(dev, *s)?;
        eprintln!("Wiped slot {s}.");
    }
    let orphans: Vec<u32> = hdr
        .tokens()
        .iter()
        .filter(|(_, t)| t["keyslots"].as_array().is_some_and(|k| k.is_empty()))
        .map(|(id, _)| *id)
        .collect();
    for id in orphans {
        hdr.remove_token(dev, id)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_as_systemd_cryptenrolls() {
        assert_eq!(parse_pcrs("7").unwrap(), [7]);
        assert_eq!(parse_pcrs("7+0,4").unwrap(), [0, 4, 7]);
        assert!(parse_pcrs("").unwrap().is_empty());
        assert!(parse_pcrs("24").is_err());
        assert!(boolean("yes").unwrap() && !boolean("0").unwrap());
        assert!(boolean("maybe").is_err());
        let hdr = json!({
            "keyslots": {"0": {}, "1": {}, "2": {}, "3": {}},
            "tokens": {
                "0": {"type": "systemd-tpm2", "keyslots": ["1"]},
                "1": {"type": "clevis", "keyslots": ["2"]},
            },
        });
        assert_eq!(slots_to_wipe("password", &hdr, 3).unwrap(), [0]);
        assert_eq!(slots_to_wipe("tpm2", &hdr, 3).unwrap(), [1]);
        assert_eq!(slots_to_wipe("all", &hdr, 3).unwrap(), [0, 1, 2]);
        assert_eq!(slots_to_wipe("0,2", &hdr, 3).unwrap(), [0, 2]);
        assert!(slots_to_wipe("5", &hdr, 3).is_err());
        assert!(slots_to_wipe("empty-ish", &hdr, 3).is_err());
    }
}
