//! `enroll`: binds a LUKS2 volume to a TPM2 or a PKCS#11 security token the way
//! `systemd-cryptenroll --tpm2-device` / `--pkcs11-token-uri` do, so that systemd-cryptsetup and cryptsetup's systemd-tpm2 plugin unlock what
//! cryptblk enrolled (and cryptblk what they did): 32 random bytes sealed to the TPM under
//! a PCR policy (and a PIN), their base64 the passphrase of a new keyslot (PBKDF2, 1,000
//! iterations: the secret has full entropy), a `systemd-tpm2` token naming it. For a
//! PKCS#11 token: random bytes encrypted to the RSA certificate on it (the token's private
//! key decrypts them at unlock), a `systemd-pkcs11` token.
//!
//! For a FIDO2 security key: a credential made on it with the hmac-secret extension, the
//! key's HMAC of a random salt the passphrase, a `systemd-fido2` token.
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
use std::path::{Path, PathBuf};

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
    /// A signed PCR policy: the RSA public key (PEM) whose signatures of PCR values
    /// (systemd-measure's, for a signed kernel image) the TPM accepts. Without it,
    /// tpm2-pcr-public-key.pem in /etc/systemd, /run/systemd, /usr/local/lib/systemd or
    /// /usr/lib/systemd, if there is one, as systemd-cryptenroll does.
    #[arg(long = "tpm2-public-key", value_name = "PATH")]
    pub tpm2_public_key: Option<PathBuf>,
    /// The PCRs the public key's signatures cover (default 11; empty: no signed policy).
    #[arg(long = "tpm2-public-key-pcrs", value_name = "PCR[+PCR...]")]
    pub tpm2_public_key_pcrs: Option<String>,
    /// Also require a PIN (asked twice, or $NEWPIN as systemd-cryptenroll takes it).
    #[arg(long = "tpm2-with-pin", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "yes", default_value = "no")]
    pub tpm2_with_pin: String,
    /// Enroll the security token this PKCS#11 URI names (its RSA certificate), as
    /// systemd-cryptenroll --pkcs11-token-uri; its PIN from $PIN or asked.
    #[arg(long = "pkcs11-token-uri", value_name = "URI")]
    pub pkcs11_token_uri: Option<String>,
    /// FIDO2 (with --fido2-device PATH|auto|list): whether the key's PIN is needed too
    /// (dropped, with a notice, on a key that has none set).
    #[arg(long = "fido2-with-client-pin", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "yes", default_value = "yes")]
    pub fido2_with_client_pin: String,
    /// FIDO2: whether the key must be touched.
    #[arg(long = "fido2-with-user-presence", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "yes", default_value = "yes")]
    pub fido2_with_user_presence: String,
    /// FIDO2: whether the key must verify the user itself (a fingerprint).
    #[arg(long = "fido2-with-user-verification", value_name = "BOOL", num_args = 0..=1,
          default_missing_value = "yes", default_value = "no")]
    pub fido2_with_user_verification: String,
    /// FIDO2: the credential's algorithm.
    #[arg(
        long = "fido2-credential-algorithm",
        value_name = "es256|rs256|eddsa",
        default_value = "es256"
    )]
    pub fido2_credential_algorithm: String,
    /// Bind with clevis's PIN (tang, sss, tpm2) and its JSON configuration, as
    /// `clevis luks bind -d DEVICE PIN CONFIG`; -q trusts a tang server's keys as clevis's
    /// -y does (else "thp" in the configuration, or asked on the terminal).
    #[arg(long = "clevis", num_args = 2, value_names = ["PIN", "CONFIG"])]
    pub clevis: Option<Vec<String>>,
    /// Once enrolled, wipe these keyslots (and their tokens), as systemd-cryptenroll:
    /// numbers, "password" (keyslots no token names), "tpm2" (other systemd-tpm2
    /// tokens' keyslots), "fido2", "pkcs11" (likewise), "all" (every other keyslot);
    /// comma-separated.
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
        crate::passphrase::get_tcrypt_passphrase("", false, false)?
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
            "fido2" => out.extend(token_slots(Some("systemd-fido2"))),
            "pkcs11" => out.extend(token_slots(Some("systemd-pkcs11"))),
            n => {
                let n: u32 = n.parse().map_err(|_| {
                    bad(format!(
                        "--wipe-slot '{n}': a keyslot number, password, tpm2, fido2, pkcs11 or all"
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
        a.tokens.fido2_device.is_some(),
    ) {
        (true, false, _, false) => "clevis",
        (false, true, false, false) => "PKCS#11",
        (false, false, true, false) => "TPM2",
        (false, false, false, true) => "FIDO2",
        (false, false, false, false) => {
            return Err(bad(
                "say what to enroll: --tpm2-device PATH|auto|TCTI, --fido2-device PATH|auto, \
                 --pkcs11-token-uri URI or --clevis PIN CONFIG",
            ));
        }
        _ => {
            return Err(bad(
                "one token at a time: --tpm2-device, --fido2-device, --pkcs11-token-uri or \
                 --clevis",
            ));
        }
    };
    if a.tokens.fido2_device.as_deref() == Some("list") {
        return list_fido2_keys();
    }
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
        "FIDO2" => fido2_token(&a, hdr.uuid())?,
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

/// The key of a signed PCR policy: the file named, else systemd's own if there is one.
fn policy_key(path: Option<&Path>) -> CliResult<Option<crate::tokens::Tpm2PolicyKey>> {
    let found = match path {
        Some(p) => Some(p.to_path_buf()),
        None => crate::tokens::SYSTEMD_CONF_DIRS
            .iter()
            .map(|d| Path::new(d).join("tpm2-pcr-public-key.pem"))
            .find(|p| p.exists()),
    };
    let Some(path) = found else {
        return Ok(None);
    };
    let file = std::fs::read(&path).map_err(|e| crate::error::io_err(&path, e))?;
    crate::tokens::Tpm2PolicyKey::parse(&file).map(Some)
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
    let signed_pcrs = parse_pcrs(a.tpm2_public_key_pcrs.as_deref().unwrap_or("11"))?;
    let key = if signed_pcrs.is_empty() {
        None
    } else {
        policy_key(a.tpm2_public_key.as_deref())?
    };
    let signed_pcrs = if key.is_some() {
        signed_pcrs
    } else {
        Vec::new()
    };
    let tcti = cryptblk_tpm2::tcti_for(a.tokens.tpm2_device.as_deref()).map_err(bad)?;
    let tpm = cryptblk_tpm2::Tpm::open(&tcti).map_err(bad)?;
    let policy = Policy {
        pcr_bank: alg::SHA256,
        pcrs: &pcrs,
        auth: auth.as_deref(),
        authorized: key.as_ref().map(|key| cryptblk_tpm2::Authorized {
            key: &key.tpm,
            pcrs: &signed_pcrs,
            signature: None,
        }),
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
    // With --tpm2-signature, the signed policy is tried now, as systemd-cryptenroll does:
    // an enrollment the signatures at hand cannot open is refused.
    if let (Some(key), Some(path)) = (&key, &a.tokens.tpm2_signature) {
        let sigs = crate::tokens::Tpm2Signatures::load(Some(path))?;
        let find = |approved: &[u8]| sigs.find("sha256", &signed_pcrs, key, approved);
        let check = Policy {
            authorized: Some(cryptblk_tpm2::Authorized {
                key: &key.tpm,
                pcrs: &signed_pcrs,
                signature: Some(&find),
            }),
            ..policy
        };
        let back = cryptblk_tpm2::unseal(&tpm, &from, &private, &public, &check).map_err(|e| {
            bad(format!(
                "the new token does not unseal with {}: {e}",
                path.display()
            ))
        })?;
        if back[..] != secret[..] {
            return Err(bad("the new token unsealed to another secret"));
        }
    }
    let mut blob = private;
    blob.extend_from_slice(&public);
    let mut token = json!({
        "type": "systemd-tpm2",
        "keyslots": [],
        "tpm2-blob": B64.encode(&blob),
        "tpm2-pcrs": pcrs,
        "tpm2-pcr-bank": "sha256",
        "tpm2-primary-alg": "ecc",
        "tpm2-policy-hash": hex::encode(&digest),
        "tpm2-pin": with_pin,
    });
    if let Some(key) = &key {
        token["tpm2_pubkey"] = B64.encode(&key.file).into();
        token["tpm2_pubkey_pcrs"] = json!(signed_pcrs);
    }
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
/// systemd-cryptenroll does (half the modulus' size), or with an EC certificate the
/// ECDH secret of an ephemeral key (systemd 255+): its base64 (the new keyslot's
/// passphrase) and the systemd-pkcs11 token, keyslots to be filled in.
fn pkcs11_token(uri: &str) -> CliResult<(SecretBytes, Value)> {
    let parsed = cryptblk_pkcs11::Uri::parse(uri).map_err(bad)?;
    let mut pin_error = None;
    let cert = cryptblk_pkcs11::certificate(&parsed, &mut |label| match crate::tokens::token_pin(
        &format!("PKCS#11 token '{}'", label.label),
        true,
    ) {
        Ok(p) => Some(zeroize::Zeroizing::new(p.to_vec())),
        Err(e) => {
            pin_error = Some(e);
            None
        }
    })
    .map_err(|e| pin_error.take().unwrap_or_else(|| bad(e)))?;
    let (secret, sealed) = match cryptblk_pkcs11::public_key(&cert).map_err(bad)? {
        cryptblk_pkcs11::PublicKey::Rsa { n, e } => {
            let mut secret = SecretBytes::zeroed(n.len() / 2);
            cryptblk_crypto::random_bytes(&mut secret).map_err(|e| bad(e.to_string()))?;
            let sealed = cryptblk_pkcs11::rsa_encrypt_pkcs1(&n, &e, &secret).map_err(bad)?;
            (secret, sealed)
        }
        // systemd 255+: the ECDH secret of an ephemeral key and the token's, the
        // ephemeral public point stored for the token to derive it again.
        cryptblk_pkcs11::PublicKey::Ec { curve, point } => {
            let (shared, ephemeral) =
                cryptblk_pkcs11::ecdh_ephemeral(curve, &point).map_err(bad)?;
            (SecretBytes::from_slice(&shared), ephemeral)
        }
    };
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

/// `--fido2-device list`: the keys that can be enrolled (FIDO2 with hmac-secret).
fn list_fido2_keys() -> CliResult<()> {
    use crate::tokens::systemd_fido2 as fido2;
    let keys = fido2::candidates(None)?;
    let usable: Vec<_> = keys
        .iter()
        .filter(|k| fido2::open_key(&k.path).is_ok_and(|r| r.is_ok()))
        .collect();
    if usable.is_empty() {
        return Err(bad("no FIDO2 security key with hmac-secret is plugged in"));
    }
    outln!("PATH\tMANUFACTURER\tPRODUCT");
    for k in usable {
        outln!("{}\t{}\t{}", k.path, k.manufacturer, k.product);
    }
    Ok(())
}

/// The one key `--fido2-device auto` means: refused when there is none or several.
fn auto_fido2_key() -> CliResult<String> {
    use crate::tokens::systemd_fido2 as fido2;
    let mut usable = Vec::new();
    let mut why = Vec::new();
    for k in fido2::candidates(None)? {
        match fido2::open_key(&k.path)? {
            Ok(_) => usable.push(k.path),
            Err(e) => why.push(e),
        }
    }
    match usable.len() {
        1 => Ok(usable.remove(0)),
        0 if why.is_empty() => Err(bad("no FIDO2 security key is plugged in")),
        0 => Err(bad(format!(
            "no FIDO2 security key with hmac-secret is plugged in ({})",
            why.join("; ")
        ))),
        _ => Err(bad(format!(
            "several FIDO2 security keys are plugged in ({}): name one with --fido2-device PATH",
            usable.join(", ")
        ))),
    }
}

/// A credential made on the FIDO2 key with hmac-secret, and that key's HMAC of a random
/// salt: its base64 (the new keyslot's passphrase) and the systemd-fido2 token, keyslots
/// to be filled in. What the options ask of the key and it cannot do is dropped with a
/// notice; what the key insists on is added (systemd-cryptenroll's behaviour). The PIN,
/// when the token will need it, is used for both the credential and the secret: the key
/// derives another secret without it (systemd#31443).
fn fido2_token(a: &EnrollArgs, uuid: &str) -> CliResult<(SecretBytes, Value)> {
    use crate::tokens::systemd_fido2::{self as fido2, Demand};
    use cryptblk_fido2::{Algorithm, Assertion, NewCredential, Opt, code};
    let algorithm = match a.fido2_credential_algorithm.as_str() {
        "es256" => Algorithm::Es256,
        "rs256" => Algorithm::Rs256,
        "eddsa" => Algorithm::EdDsa,
        other => {
            return Err(bad(format!(
                "--fido2-credential-algorithm '{other}': es256, rs256 or eddsa"
            )));
        }
    };
    let (want_pin, want_up, want_uv) = (
        boolean(&a.fido2_with_client_pin)?,
        boolean(&a.fido2_with_user_presence)?,
        boolean(&a.fido2_with_user_verification)?,
    );
    let path = match a.tokens.fido2_device.as_deref() {
        Some("auto") | None => auto_fido2_key()?,
        Some(p) => p.to_owned(),
    };
    let (dev, features) = fido2::open_key(&path)?.map_err(bad)?;
    let notice = |what: &str| {
        eprintln!("The FIDO2 key {path} has no {what}: the token will not require it.");
    };
    if want_pin && !features.pin {
        notice("PIN set");
    }
    if want_up && !features.up {
        notice("user presence check");
    }
    if want_uv && !features.uv {
        notice("built-in user verification");
    }
    let mut pin_demand = if want_pin && features.pin {
        Demand::Yes
    } else {
        Demand::IfNeeded
    };
    let mut up = if want_up && features.up {
        Demand::Yes
    } else {
        Demand::IfNeeded
    };
    let uv = want_uv && features.uv;
    let mut pin = None;
    if pin_demand == Demand::Yes {
        pin = Some(crate::tokens::token_pin("FIDO2 security key", true)?);
    }
    let credential = NewCredential {
        rp_id: fido2::RP_ID,
        rp_name: "Encrypted Volume",
        user_id: uuid.as_bytes(),
        user_name: uuid,
        user_display_name: a.device.to_str(),
        algorithm,
        rk: if features.rk { Opt::False } else { Opt::Omit },
        uv: if features.uv { Opt::False } else { Opt::Omit },
        client_data_hash: &fido2::CLIENT_DATA_HASH,
    };
    eprintln!("Touch the FIDO2 security key ({path}) to make the credential.");
    let mut once_pin = None;
    let made = match dev.make_credential(&credential, pin.as_deref()) {
        // A key that wants its PIN to make any credential, for a token that will not
        // need it: the PIN for this step only.
        Err(e) if e.code() == Some(code::PIN_REQUIRED) && pin.is_none() && features.pin => {
            let once = crate::tokens::token_pin("FIDO2 security key", true)?;
            let r = dev.make_credential(&credential, Some(&once));
            once_pin = Some(once);
            r
        }
        r => r,
    };
    let id = made.map_err(|e| fido2::refusal(&e))?;
    // A PIN read for the credential alone serves the secret too, should the key want it.
    if pin.is_none() {
        pin = once_pin;
    }
    let mut salt = [0u8; 32];
    cryptblk_crypto::random_bytes(&mut salt).map_err(|e| bad(e.to_string()))?;
    let mut assertion = Assertion {
        rp_id: fido2::RP_ID,
        credential: &id,
        salt: &salt,
        client_data_hash: &fido2::CLIENT_DATA_HASH,
        up: if features.up {
            Opt::from_bool(up == Demand::Yes)
        } else {
            Opt::Omit
        },
        uv: if features.uv {
            Opt::from_bool(uv)
        } else {
            Opt::Omit
        },
    };
    let secret = fido2::assert_hmac(
        &dev,
        features,
        &mut assertion,
        &mut up,
        &mut pin_demand,
        &mut pin,
        true,
    )?
    .map_err(|e| fido2::refusal(&e))?;
    let token = json!({
        "type": "systemd-fido2",
        "keyslots": [],
        "fido2-credential": B64.encode(&id),
        "fido2-salt": B64.encode(salt),
        "fido2-rp": fido2::RP_ID,
        "fido2-clientPin-required": pin_demand == Demand::Yes,
        "fido2-up-required": up == Demand::Yes,
        "fido2-uv-required": uv,
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
            "keyslots": {"0": {}, "1": {}, "2": {}, "3": {}, "4": {}, "5": {}},
            "tokens": {
                "0": {"type": "systemd-tpm2", "keyslots": ["1"]},
                "1": {"type": "clevis", "keyslots": ["2"]},
                "2": {"type": "systemd-fido2", "keyslots": ["4"]},
                "3": {"type": "systemd-pkcs11", "keyslots": ["5"]},
            },
        });
        assert_eq!(slots_to_wipe("fido2", &hdr, 3).unwrap(), [4]);
        assert_eq!(slots_to_wipe("pkcs11,tpm2", &hdr, 3).unwrap(), [1, 5]);
        assert_eq!(slots_to_wipe("password", &hdr, 3).unwrap(), [0]);
        assert_eq!(slots_to_wipe("tpm2", &hdr, 3).unwrap(), [1]);
        assert_eq!(slots_to_wipe("all", &hdr, 3).unwrap(), [0, 1, 2, 4, 5]);
        assert_eq!(slots_to_wipe("0,2", &hdr, 3).unwrap(), [0, 2]);
        assert!(slots_to_wipe("7", &hdr, 3).is_err());
        assert!(slots_to_wipe("empty-ish", &hdr, 3).is_err());
    }
}
