//! systemd-fido2 tokens (`systemd-cryptenroll --fido2-device`): a credential made on a
//! FIDO2 security key with the hmac-secret extension; the key's HMAC of the token's salt,
//! in base64, is the keyslot's passphrase. The key demands what the token says: a touch
//! (user presence), its PIN, built-in user verification. Read, asked for and enrolled as
//! systemd 252-256 do (src/shared/libfido2-util.c), so that each opens what the other
//! enrolled.

use super::TokenArgs;
use crate::error::{CliError, CliResult, EXIT_PERMISSION};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use cryptblk_crypto::SecretBytes;
use cryptblk_fido2::{Assertion, Device, DeviceInfo, Error, Info, Opt, code};
use serde_json::Value;

/// The relying party systemd's credentials are made for.
pub(crate) const RP_ID: &str = "io.systemd.cryptsetup";
/// No client data is signed over: systemd hashes none, and sends 32 zero bytes.
pub(crate) const CLIENT_DATA_HASH: [u8; 32] = [0; 32];

fn bad(what: impl std::fmt::Display) -> CliError {
    CliError::usage(format!("systemd-fido2 token: {what}"))
}

/// What a token demands of the key: yes, no, or (a systemd 248 token, which says nothing)
/// only if the key insists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Demand {
    Yes,
    No,
    IfNeeded,
}

impl Demand {
    fn of(v: &Value) -> Demand {
        match v.as_bool() {
            Some(true) => Demand::Yes,
            Some(false) => Demand::No,
            None => Demand::IfNeeded,
        }
    }
}

/// What the key offers, from its `getInfo` options: systemd's reading (an option the key
/// does not list: no, except user presence, which every key has unless it says not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Features {
    /// A PIN is set.
    pub(crate) pin: bool,
    pub(crate) up: bool,
    /// Built-in user verification is configured.
    pub(crate) uv: bool,
    pub(crate) rk: bool,
}

impl Features {
    pub(crate) fn of(info: &Info) -> Features {
        Features {
            pin: info.option("clientPin") == Some(true),
            up: info.option("up") != Some(false),
            uv: info.option("uv") == Some(true),
            rk: info.option("rk") == Some(true),
        }
    }
}

/// The FIDO2 keys to try: the one `--fido2-device PATH` names, else every key plugged
/// in (systemd's order: libfido2's list).
pub(crate) fn candidates(device: Option<&str>) -> CliResult<Vec<DeviceInfo>> {
    match device {
        Some(p) if p != "auto" => Ok(vec![DeviceInfo {
            path: p.to_owned(),
            product: String::new(),
            manufacturer: String::new(),
        }]),
        _ => cryptblk_fido2::devices().map_err(bad),
    }
}

/// Opens a key and checks that it can hold a systemd-fido2 credential (CTAP2 with
/// hmac-secret); the inner `Err` says why it cannot.
pub(crate) fn open_key(path: &str) -> CliResult<Result<(Device, Features), String>> {
    let dev = match Device::open(path) {
        Ok(d) => d,
        Err(e @ Error::Library(_)) => return Err(bad(e)),
        Err(e) => return Ok(Err(format!("{path}: {e}"))),
    };
    if !dev.is_fido2() {
        return Ok(Err(format!("{path} is a U2F-only key (no FIDO2)")));
    }
    let info = match dev.info() {
        Ok(i) => i,
        Err(e) => return Ok(Err(format!("{path}: {e}"))),
    };
    if !info.has_extension("hmac-secret") {
        return Ok(Err(format!("{path} has no hmac-secret extension")));
    }
    Ok(Ok((dev, Features::of(&info))))
}

/// The key's answer to an assertion, with user presence and the PIN added when a token
/// that leaves them open meets a key that insists (systemd's retries). The PIN is asked
/// for when first needed (`pin_from_stdin`: see [`super::token_pin`]) and kept for the
/// next key. The outer error is a PIN that could not be read; the inner one the key's
/// refusal.
pub(crate) fn assert_hmac(
    dev: &Device,
    features: Features,
    a: &mut Assertion<'_>,
    up: &mut Demand,
    pin_demand: &mut Demand,
    pin: &mut Option<SecretBytes>,
    pin_from_stdin: bool,
) -> CliResult<Result<zeroize::Zeroizing<Vec<u8>>, Error>> {
    loop {
        if *pin_demand == Demand::Yes && pin.is_none() {
            *pin = Some(super::token_pin("FIDO2 security key", pin_from_stdin)?);
        }
        if a.up == Opt::True {
            eprintln!("Touch the FIDO2 security key ({}) to go on.", dev.path());
        }
        let with_pin = if *pin_demand == Demand::Yes {
            pin.as_deref()
        } else {
            None
        };
        match dev.hmac_secret(a, with_pin) {
            Ok(secret) => return Ok(Ok(secret)),
            Err(e) => match e.code() {
                Some(code::UP_REQUIRED | code::UNSUPPORTED_OPTION)
                    if features.up && *up == Demand::IfNeeded =>
                {
                    *up = Demand::Yes;
                    a.up = Opt::True;
                }
                Some(code::PIN_REQUIRED) if features.pin && *pin_demand == Demand::IfNeeded => {
                    *pin_demand = Demand::Yes;
                }
                _ => return Ok(Err(e)),
            },
        }
    }
}

/// A key's refusal, said as what to do about it; a wrong PIN exits as a wrong passphrase.
pub(crate) fn refusal(e: &Error) -> CliError {
    let why = match e.code() {
        Some(code::PIN_INVALID) => {
            return CliError::new(EXIT_PERMISSION, "systemd-fido2 token: wrong PIN");
        }
        Some(code::PIN_AUTH_BLOCKED | code::UV_BLOCKED) => {
            "too many failed attempts: remove the key, plug it in again and retry".to_owned()
        }
        Some(code::PIN_BLOCKED) => "the key's PIN is blocked (the key must be reset)".to_owned(),
        Some(code::ACTION_TIMEOUT | code::USER_ACTION_TIMEOUT) => {
            "nobody touched the key in time".to_owned()
        }
        Some(code::OPERATION_DENIED) => "the key refused (user presence not given)".to_owned(),
        Some(code::UV_INVALID) => "user verification failed".to_owned(),
        Some(code::PIN_NOT_SET) => "the key has no PIN set".to_owned(),
        _ => e.to_string(),
    };
    bad(why)
}

/// The passphrase a systemd-fido2 token's key gives (base64 of its hmac-secret).
pub(crate) fn passphrase(token: &Value, args: &TokenArgs) -> CliResult<SecretBytes> {
    let b64 = |field: &str| {
        token[field]
            .as_str()
            .and_then(|s| B64.decode(s).ok())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| bad(format!("no base64 '{field}'")))
    };
    let credential = b64("fido2-credential")?;
    let salt = b64("fido2-salt")?;
    let rp = token["fido2-rp"].as_str().unwrap_or(RP_ID);
    let wants = (
        Demand::of(&token["fido2-clientPin-required"]),
        Demand::of(&token["fido2-up-required"]),
        // Left out: the uv option is not sent at all.
        token["fido2-uv-required"].as_bool(),
    );
    let keys = candidates(args.fido2_device.as_deref())?;
    if keys.is_empty() {
        return Err(bad("no FIDO2 security key is plugged in"));
    }
    let mut skipped = Vec::new();
    // One PIN for every key tried: asked for once, sent only to a key that holds the
    // credential.
    let mut pin = None;
    for key in &keys {
        let (dev, features) = match open_key(&key.path)? {
            Ok(k) => k,
            Err(why) => {
                skipped.push(why);
                continue;
            }
        };
        let (mut pin_demand, mut up, uv) = wants;
        let missing = [
            (pin_demand == Demand::Yes && !features.pin, "a PIN"),
            (up == Demand::Yes && !features.up, "user presence"),
            (uv == Some(true) && !features.uv, "user verification"),
        ];
        if let Some((_, what)) = missing.iter().find(|(m, _)| *m) {
            skipped.push(format!(
                "{}: the token needs {what}, the key has none",
                key.path
            ));
            continue;
        }
        // A key that never made the credential is passed over before it is sent a PIN
        // (it would count it as a wrong one) or asked for a touch; not asked where the
        // token needs built-in verification, which a key may demand for any assertion
        // (systemd's pre-flight, 253+).
        if !(features.uv && uv == Some(true)) {
            let quiet_up = if features.up { Opt::False } else { Opt::Omit };
            match dev.has_credential(rp, &credential, quiet_up) {
                Ok(true) => {}
                Ok(false) => {
                    skipped.push(format!(
                        "{}: not the key this token was enrolled on",
                        key.path
                    ));
                    continue;
                }
                Err(e) => return Err(refusal(&e)),
            }
        }
        let mut a = Assertion {
            rp_id: rp,
            credential: &credential,
            salt: &salt,
            client_data_hash: &CLIENT_DATA_HASH,
            up: if features.up {
                Opt::from_bool(up == Demand::Yes)
            } else {
                Opt::Omit
            },
            uv: match uv {
                Some(want) if features.uv => Opt::from_bool(want),
                _ => Opt::Omit,
            },
        };
        match assert_hmac(
            &dev,
            features,
            &mut a,
            &mut up,
            &mut pin_demand,
            &mut pin,
            args.asked(),
        )? {
            Ok(secret) => {
                return Ok(SecretBytes::from_vec(B64.encode(&secret[..]).into_bytes()));
            }
            // Another key: this one never made the credential.
            Err(e) if e.code() == Some(code::NO_CREDENTIALS) => {
                skipped.push(format!(
                    "{}: not the key this token was enrolled on",
                    key.path
                ));
            }
            Err(e) => return Err(refusal(&e)),
        }
    }
    Err(bad(format!(
        "no FIDO2 key plugged in can unlock it ({})",
        skipped.join("; ")
    )))
}
