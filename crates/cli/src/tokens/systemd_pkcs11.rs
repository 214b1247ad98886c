//! systemd-pkcs11 tokens (`systemd-cryptenroll --pkcs11-token-uri`): a random key
//! encrypted to the RSA certificate on a security token (smart card, HSM, SoftHSM), its
//! base64 the keyslot's passphrase; the token's private key decrypts it after its PIN.
//! With an EC key (systemd 255+), the stored data is an ephemeral public point and the
//! token derives the secret by ECDH with it.

use super::TokenArgs;
use crate::error::{CliError, CliResult, EXIT_PERMISSION};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use cryptblk_crypto::SecretBytes;
use cryptblk_pkcs11::{Error, Uri};
use serde_json::Value;

fn bad(what: impl std::fmt::Display) -> CliError {
    CliError::usage(format!("systemd-pkcs11 token: {what}"))
}

/// The passphrase a systemd-pkcs11 token's encrypted key gives (base64 of it).
pub(crate) fn passphrase(token: &Value, args: &TokenArgs) -> CliResult<SecretBytes> {
    let uri = token["pkcs11-uri"]
        .as_str()
        .ok_or_else(|| bad("no 'pkcs11-uri'"))?;
    let uri = Uri::parse(uri).map_err(bad)?;
    let sealed = token["pkcs11-key"]
        .as_str()
        .and_then(|s| B64.decode(s).ok())
        .ok_or_else(|| bad("'pkcs11-key' is not base64"))?;
    let mut pin_error = None;
    let plain = cryptblk_pkcs11::unseal(
        &uri,
        &mut |label| match super::token_pin(
            &format!("PKCS#11 token '{}'", label.label),
            args.asked(),
        ) {
            Ok(p) => Some(zeroize::Zeroizing::new(p.to_vec())),
            Err(e) => {
                pin_error = Some(e);
                None
            }
        },
        &sealed,
    )
    .map_err(|e| match e {
        Error::WrongPin => CliError::new(EXIT_PERMISSION, "systemd-pkcs11 token: wrong PIN"),
        Error::NeedPin => pin_error.take().unwrap_or_else(|| bad(e)),
        e => bad(e),
    })?;
    Ok(SecretBytes::from_vec(B64.encode(&plain[..]).into_bytes()))
}
