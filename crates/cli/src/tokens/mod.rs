//! Unlocking with LUKS2 tokens instead of a typed passphrase (issue 36): a token names
//! keyslots and a way to get their passphrase without a person; tokens are tried in
//! order before any passphrase is asked for, as cryptsetup does, and `--token-only`
//! asks for none. Each token type is a handler here: clevis (tang, sss and tpm2 pins),
//! systemd-tpm2, systemd-pkcs11 and systemd-fido2.

mod clevis;
mod clevis_bind;
mod http;
pub(crate) mod systemd_fido2;
mod systemd_pkcs11;
mod systemd_tpm2;

pub(crate) use clevis_bind::{BindContext, bind as clevis_bind};
pub(crate) use systemd_tpm2::{
    PolicyKey as Tpm2PolicyKey, SYSTEMD_CONF_DIRS, Signatures as Tpm2Signatures,
    pin_auth as tpm2_pin_auth,
};

use crate::error::{CliError, CliResult};
use clap::Args;
use cryptblk_crypto::SecretBytes;
use serde_json::Value;

/// cryptsetup's token options, on the commands that unlock.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct TokenArgs {
    /// LUKS2: unlock with tokens only; never ask for a passphrase.
    #[arg(long = "token-only")]
    pub token_only: bool,
    /// LUKS2: try only this token.
    #[arg(long = "token-id")]
    pub token_id: Option<u32>,
    /// LUKS2: try only tokens of this type (e.g. clevis).
    #[arg(long = "token-type")]
    pub token_type: Option<String>,
    /// Seconds a token may take (a tang server that does not answer) before the next one
    /// (or the passphrase) is tried.
    #[arg(long = "token-timeout", default_value_t = 5)]
    pub token_timeout: u64,
    /// The TPM for TPM2 tokens, as systemd takes it: auto (the first /dev/tpmrm*), a
    /// device path, or a TCTI such as swtpm:host=127.0.0.1,port=2321.
    #[arg(long = "tpm2-device", value_name = "PATH|auto|TCTI")]
    pub tpm2_device: Option<String>,
    /// The signatures of PCR policies for systemd-tpm2 tokens bound to a signing key
    /// (systemd-measure's JSON); by default tpm2-pcr-signature.json in /etc/systemd,
    /// /run/systemd, /usr/local/lib/systemd, /usr/lib/systemd or /.extra, as systemd
    /// looks for it.
    #[arg(long = "tpm2-signature", value_name = "PATH")]
    pub tpm2_signature: Option<std::path::PathBuf>,
    /// The FIDO2 security key for systemd-fido2 tokens: a hidraw device path, or auto
    /// (every key plugged in, in turn; the default).
    #[arg(long = "fido2-device", value_name = "PATH|auto")]
    pub fido2_device: Option<String>,
}

impl TokenArgs {
    /// Whether a token option asks for tokens (the commands that change or show the key
    /// use them only then).
    pub(crate) fn asked(&self) -> bool {
        self.token_only || self.token_id.is_some() || self.token_type.is_some()
    }
}

/// A token's PIN: `$PIN` (as systemd-cryptsetup takes it), else asked on the terminal,
/// else a line of stdin, but only where `stdin` says a line there is meant for the token
/// (a token option was given, or `enroll`): tried by default before the passphrase, a
/// token must not take the passphrase a script pipes in as its PIN (a FIDO2 key or a
/// smart card counts each wrong PIN, and blocks).
pub(crate) fn token_pin(kind: &str, stdin: bool) -> CliResult<SecretBytes> {
    use std::io::IsTerminal;
    if let Some(pin) = std::env::var_os("PIN") {
        use std::os::unix::ffi::OsStringExt;
        return Ok(SecretBytes::from_vec(pin.into_vec()));
    }
    if !stdin && !std::io::stdin().is_terminal() {
        return Err(CliError::usage(format!(
            "the {kind} needs its PIN: set $PIN, or name the token (--token-only, --token-id, \
             --token-type) to give the PIN on stdin"
        )));
    }
    crate::passphrase::get_tcrypt_passphrase(&format!("Enter {kind} token PIN: "), false, false)
}

/// The passphrase a token gives, by its type's handler; `None` for a type without one.
fn token_passphrase(token: &Value, args: &TokenArgs) -> Option<CliResult<SecretBytes>> {
    match token["type"].as_str()? {
        "clevis" => Some(clevis::passphrase(token, args)),
        "systemd-tpm2" => Some(systemd_tpm2::passphrase(token, args)),
        "systemd-pkcs11" => Some(systemd_pkcs11::passphrase(token, args)),
        "systemd-fido2" => Some(systemd_fido2::passphrase(token, args)),
        _ => None,
    }
}

/// Tries each token the options allow, in id order: its passphrase on each keyslot it
/// names, through `attempt(passphrase, keyslot, (token id, type))`, until one succeeds. A token that cannot
/// give a passphrase says why (on stderr) and the next is tried. `Ok(None)`: no token
/// unlocked, and a passphrase may be asked for; an error with `--token-only`.
pub(crate) fn try_tokens<T>(
    tokens: &[(u32, Value)],
    args: &TokenArgs,
    mut attempt: impl FnMut(&SecretBytes, u32, (u32, String)) -> Option<T>,
) -> CliResult<Option<T>> {
    let mut tried = false;
    // The exit code of the most telling failure (a wrong PIN: 2, as a wrong passphrase).
    let mut code = crate::error::EXIT_USAGE;
    for (id, token) in tokens {
        if args.token_id.is_some_and(|want| want != *id)
            || args
                .token_type
                .as_deref()
                .is_some_and(|want| token["type"].as_str() != Some(want))
        {
            continue;
        }
        let kind = token["type"].as_str().unwrap_or("?");
        let Some(pass) = token_passphrase(token, args) else {
            // A type without a handler here (a kernel keyring token) says so when asked for.
            if args.token_id.is_some() || args.token_type.is_some() {
                eprintln!("Token {id} of type {kind} is not supported yet.");
            }
            continue;
        };
        tried = true;
        let pass = match pass {
            Ok(p) => p,
            Err(e) => {
                eprintln!("Token {id} ({kind}): {e}");
                code = code.max(e.code);
                continue;
            }
        };
        let slots = token["keyslots"].as_array().cloned().unwrap_or_default();
        for s in slots.iter().filter_map(|s| s.as_str()?.parse::<u32>().ok()) {
            if let Some(done) = attempt(&pass, s, (*id, kind.to_owned())) {
                eprintln!("Token {id} ({kind}) unlocked keyslot {s}.");
                return Ok(Some(done));
            }
        }
        eprintln!("Token {id} ({kind}): its passphrase opens none of its keyslots.");
    }
    if args.token_only {
        return Err(CliError::new(
            code,
            if tried {
                "No usable token was able to unlock the volume."
            } else {
                "No usable token is available."
            },
        ));
    }
    Ok(None)
}
