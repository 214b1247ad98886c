//! A software FIDO2 authenticator behind a virtual HID device (Linux uhid), for the
//! token tests: systemd-cryptenroll and cryptblk talk to it through libfido2 as to a USB
//! key. Credentials live in memory for the life of the process.
//!
//! usage: fido2-authenticator [--pin PIN] [--uv] [--deny-up]
//!   --pin PIN   the device has this PIN set (else clientPin is supported, not set)
//!   --uv        the device has built-in user verification (always granted)
//!   --deny-up   user presence is refused (a key nobody touches)
//! Prints "ready" on stdout once the device exists; logs on stderr each CTAP2 command
//! ("command 0x02": getAssertion, 0x06: clientPIN...) and each request for user presence
//! or verification ("up requested", "uv requested").

use soft_fido2::{
    Authenticator, AuthenticatorCallbacks, AuthenticatorConfig, AuthenticatorOptions, Credential,
    CredentialRef, Error, Result, UpResult, UvResult,
};
use soft_fido2_transport::{CommandHandler, CtapHidHandler, Packet, UhidDevice};
use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

struct Store {
    credentials: Mutex<HashMap<Vec<u8>, Credential>>,
    deny_up: bool,
}

impl AuthenticatorCallbacks for Store {
    fn request_up(&self, _info: &str, _user: Option<&str>, _rp: &str) -> Result<UpResult> {
        eprintln!("up requested");
        Ok(if self.deny_up {
            UpResult::Denied
        } else {
            UpResult::Accepted
        })
    }

    fn request_uv(&self, _info: &str, _user: Option<&str>, _rp: &str) -> Result<UvResult> {
        eprintln!("uv requested");
        Ok(UvResult::Accepted)
    }

    fn write_credential(&self, cred: &CredentialRef) -> Result<()> {
        let mut store = self.credentials.lock().unwrap();
        let mut cred = cred.to_owned();
        // soft-fido2 protects a credential made with the PIN at "user verification
        // required" unless told otherwise, so that no assertion without the PIN sees it;
        // keys in the field (YubiKey, SoloKey, Nitrokey) default to "optional", which
        // systemd's pre-flight relies on. Neither systemd nor cryptblk asks for a level.
        if cred.extensions.cred_protect == Some(3) {
            cred.extensions.cred_protect = Some(1);
        }
        store.insert(cred.id.clone(), cred);
        Ok(())
    }

    fn read_credential(&self, cred_id: &[u8]) -> Result<Option<Credential>> {
        Ok(self.credentials.lock().unwrap().get(cred_id).cloned())
    }

    fn delete_credential(&self, cred_id: &[u8]) -> Result<()> {
        self.credentials.lock().unwrap().remove(cred_id);
        Ok(())
    }

    fn list_credentials(&self, rp_id: &str, user_id: Option<&[u8]>) -> Result<Vec<Credential>> {
        let store = self.credentials.lock().unwrap();
        Ok(store
            .values()
            .filter(|c| c.rp.id == rp_id && user_id.is_none_or(|u| c.user.id == u))
            .cloned()
            .collect())
    }

    fn enumerate_rps(&self) -> Result<Vec<(String, Option<String>, usize)>> {
        let store = self.credentials.lock().unwrap();
        let mut rps: HashMap<String, (Option<String>, usize)> = HashMap::new();
        for c in store.values() {
            rps.entry(c.rp.id.clone())
                .or_insert((c.rp.name.clone(), 0))
                .1 += 1;
        }
        Ok(rps.into_iter().map(|(id, (name, n))| (id, name, n)).collect())
    }

    fn credential_count(&self) -> Result<usize> {
        Ok(self.credentials.lock().unwrap().len())
    }

    fn get_timestamp_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64
    }
}

/// CTAPHID's CBOR messages go to the authenticator; the HID framing (INIT, PING,
/// CANCEL...) is the transport's.
struct Cbor(Authenticator<Store>);

impl CommandHandler for Cbor {
    fn handle_command(
        &mut self,
        cmd: soft_fido2_transport::Cmd,
        data: &[u8],
    ) -> soft_fido2_transport::Result<Vec<u8>> {
        if cmd != soft_fido2_transport::Cmd::Cbor {
            return Err(soft_fido2_transport::Error::InvalidCommand);
        }
        if let Some(c) = data.first() {
            eprintln!("command {c:#04x}");
        }
        let mut response = Vec::new();
        self.0
            .handle(data, &mut response)
            .map_err(|e| soft_fido2_transport::Error::Other(format!("{e:?}")))?;
        Ok(response)
    }
}

fn main() -> std::result::Result<(), Error> {
    let mut pin = None;
    let (mut uv, mut deny_up) = (false, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pin" => pin = args.next(),
            "--uv" => uv = true,
            "--deny-up" => deny_up = true,
            _ => {
                eprintln!("usage: fido2-authenticator [--pin PIN] [--uv] [--deny-up]");
                std::process::exit(2);
            }
        }
    }
    if let Some(p) = &pin {
        use sha2::Digest;
        Authenticator::<Store>::set_pin_hash(&sha2::Sha256::digest(p.as_bytes()));
    }
    let config = AuthenticatorConfig::builder()
        .aaguid(*b"cryptblk-test-ky")
        .extensions(vec!["hmac-secret".to_string(), "credProtect".to_string()])
        .options(
            AuthenticatorOptions::new()
                .with_resident_keys(true)
                .with_user_presence(true)
                .with_user_verification(uv.then_some(true))
                .with_client_pin(Some(pin.is_some()))
                .with_pin_uv_auth_token(Some(true))
                .with_make_cred_uv_not_required(Some(true)),
        )
        .device_name("cryptblk test FIDO2 key".to_string())
        .vendor_id(0x1209)
        .product_id(0x000c)
        .device_version(0x0100)
        .build();
    let store = Store {
        credentials: Mutex::new(HashMap::new()),
        deny_up,
    };
    let auth = Authenticator::with_config(store, config.clone())?;
    let device = UhidDevice::create_fido_device_with_ids(
        config.device_name.as_deref(),
        config.vendor_id,
        config.product_id,
        config.device_version,
    )
    .map_err(|e| {
        eprintln!("fido2-authenticator: no uhid device: {e:?} (modprobe uhid?)");
        Error::Other
    })?;
    let mut hid = CtapHidHandler::new(Cbor(auth));
    println!("ready");
    std::io::stdout().flush().ok();
    let mut packet = [0u8; 64];
    loop {
        match device.read_packet(&mut packet) {
            Ok(Some(_)) => match hid.process_packet(Packet::from_bytes(packet)) {
                Ok(replies) => {
                    for r in replies {
                        if let Err(e) = device.write_packet(r.as_bytes()) {
                            eprintln!("fido2-authenticator: write: {e:?}");
                        }
                    }
                }
                Err(e) => eprintln!("fido2-authenticator: {e:?}"),
            },
            Ok(None) | Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}
