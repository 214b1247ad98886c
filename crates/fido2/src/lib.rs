//! FIDO2 security keys for cryptblk's `systemd-fido2` tokens: a credential made on the
//! key with the `hmac-secret` extension, and the secret the key derives from it and a
//! salt (HMAC-SHA-256 under a key that never leaves the device), after user presence, a
//! PIN or user verification as the token demands.
//!
//! libfido2 (`libfido2.so.1`, 1.5 or later: Debian 11+) is loaded at run time, not
//! linked, as systemd loads it: cryptblk builds and runs without it, and says what to
//! install when a FIDO2 token needs it. It reaches keys over hidraw (USB, and uhid's
//! virtual devices); only the few functions listed in [`Lib`] are called, with the
//! prototypes of libfido2's `fido.h`.

// FFI to libfido2: every block says why it is sound.
#![allow(unsafe_code)]

use cryptblk_dl::{Library, Scope};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;
use zeroize::Zeroizing;

/// libfido2's status codes (`fido/err.h`) that callers tell apart.
pub mod code {
    use std::ffi::c_int;
    /// The key refused the operation (user presence not given, a key nobody touched).
    pub const OPERATION_DENIED: c_int = 0x27;
    /// The option (up, uv) is not supported by this key.
    pub const UNSUPPORTED_OPTION: c_int = 0x2b;
    /// The key holds no credential of those allowed (not the key that was enrolled).
    pub const NO_CREDENTIALS: c_int = 0x2e;
    /// Nobody touched the key in time.
    pub const USER_ACTION_TIMEOUT: c_int = 0x2f;
    /// A wrong PIN.
    pub const PIN_INVALID: c_int = 0x31;
    /// The PIN is blocked (too many wrong ones): the key must be reset.
    pub const PIN_BLOCKED: c_int = 0x32;
    /// Too many wrong PINs since the key was plugged in: replug it.
    pub const PIN_AUTH_BLOCKED: c_int = 0x34;
    /// A PIN was asked for on a key that has none set.
    pub const PIN_NOT_SET: c_int = 0x35;
    /// The operation needs the PIN.
    pub const PIN_REQUIRED: c_int = 0x36;
    /// Nobody acted in time.
    pub const ACTION_TIMEOUT: c_int = 0x3a;
    /// The credential needs user presence and it was not asked for.
    pub const UP_REQUIRED: c_int = 0x3b;
    /// Built-in user verification is blocked.
    pub const UV_BLOCKED: c_int = 0x3c;
    /// Built-in user verification failed.
    pub const UV_INVALID: c_int = 0x3f;
    /// The credential id is not one this key made.
    pub const INVALID_CREDENTIAL: c_int = 0x22;
    /// libfido2's own failure; from `fido_dev_info_manifest`, what it says when it finds
    /// no device at all.
    pub const INTERNAL: c_int = -9;
    /// A user-presence check was needed (U2F keys).
    pub const USER_PRESENCE_REQUIRED: c_int = -8;
}

/// `fido_opt_t`: an option left to the key's default, or set explicitly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opt {
    /// `FIDO_OPT_OMIT`: not sent; the key's default applies.
    Omit,
    /// `FIDO_OPT_FALSE`.
    False,
    /// `FIDO_OPT_TRUE`.
    True,
}

impl Opt {
    /// True or false, explicitly.
    pub fn from_bool(b: bool) -> Opt {
        if b { Opt::True } else { Opt::False }
    }

    fn raw(self) -> c_int {
        match self {
            Opt::Omit => 0,
            Opt::False => 1,
            Opt::True => 2,
        }
    }
}

/// A credential's public-key algorithm (COSE identifiers, `fido/param.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// ECDSA on P-256 with SHA-256 (`COSE_ES256`): what every key supports.
    Es256,
    /// RSASSA-PKCS1-v1_5 with SHA-256 (`COSE_RS256`).
    Rs256,
    /// EdDSA on Ed25519 (`COSE_EDDSA`).
    EdDsa,
}

impl Algorithm {
    fn cose(self) -> c_int {
        match self {
            Algorithm::Es256 => -7,
            Algorithm::Rs256 => -257,
            Algorithm::EdDsa => -8,
        }
    }
}

/// `FIDO_EXT_HMAC_SECRET`.
const EXT_HMAC_SECRET: c_int = 0x01;

/// Why a key could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// libfido2 is missing (or too old).
    Library(String),
    /// A libfido2 call failed.
    Call {
        /// The function.
        call: &'static str,
        /// Its status (`FIDO_ERR_*`, [`code`]).
        code: c_int,
        /// libfido2's own words for it (`fido_strerr`).
        message: String,
    },
    /// An argument libfido2 cannot take (a NUL in a string).
    Argument(&'static str),
}

impl Error {
    /// The libfido2 status, for a failed call.
    pub fn code(&self) -> Option<c_int> {
        match self {
            Error::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Library(m) => f.write_str(m),
            Error::Call { call, message, .. } => write!(f, "{call}: {message}"),
            Error::Argument(what) => write!(f, "{what} holds a NUL byte"),
        }
    }
}

impl std::error::Error for Error {}

/// libfido2's functions, by name and `fido.h` prototype; looked up once.
macro_rules! functions {
    ($($name:ident: fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The functions of libfido2 that are called.
        struct Lib {
            $($name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        impl Lib {
            fn load() -> Result<Lib, Error> {
                let lib = Library::open(c"libfido2.so.1", Scope::Local).map_err(|e| {
                    Error::Library(format!(
                        "{e}: install libfido2 (Debian: apt-get install libfido2-1)"
                    ))
                })?;
                Ok(Lib {
                    $($name: {
                        let name = concat!(stringify!($name), "\0");
                        let c = CStr::from_bytes_with_nul(name.as_bytes())
                            .expect("a NUL-terminated name");
                        let p = lib.symbol(c).ok_or_else(|| {
                            Error::Library(format!(
                                "libfido2.so.1 has no {}: too old a libfido2 (1.5 or later needed)",
                                stringify!($name)
                            ))
                        })?;
                        // SAFETY: the symbol is libfido2's function of that name, whose
                        // prototype in fido.h (1.5 to 1.15) the field's type spells out.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(p)
                        }
                    },)*
                })
            }
        }
    };
}

functions! {
    fido_init: fn(c_int);
    fido_strerr: fn(c_int) -> *const c_char;
    fido_dev_info_new: fn(usize) -> *mut c_void;
    fido_dev_info_manifest: fn(*mut c_void, usize, *mut usize) -> c_int;
    fido_dev_info_ptr: fn(*const c_void, usize) -> *const c_void;
    fido_dev_info_path: fn(*const c_void) -> *const c_char;
    fido_dev_info_product_string: fn(*const c_void) -> *const c_char;
    fido_dev_info_manufacturer_string: fn(*const c_void) -> *const c_char;
    fido_dev_info_free: fn(*mut *mut c_void, usize);
    fido_dev_new: fn() -> *mut c_void;
    fido_dev_open: fn(*mut c_void, *const c_char) -> c_int;
    fido_dev_close: fn(*mut c_void) -> c_int;
    fido_dev_free: fn(*mut *mut c_void);
    fido_dev_is_fido2: fn(*const c_void) -> bool;
    fido_cbor_info_new: fn() -> *mut c_void;
    fido_dev_get_cbor_info: fn(*mut c_void, *mut c_void) -> c_int;
    fido_cbor_info_extensions_ptr: fn(*const c_void) -> *mut *mut c_char;
    fido_cbor_info_extensions_len: fn(*const c_void) -> usize;
    fido_cbor_info_options_name_ptr: fn(*const c_void) -> *mut *mut c_char;
    fido_cbor_info_options_value_ptr: fn(*const c_void) -> *const bool;
    fido_cbor_info_options_len: fn(*const c_void) -> usize;
    fido_cbor_info_free: fn(*mut *mut c_void);
    fido_assert_new: fn() -> *mut c_void;
    fido_assert_set_rp: fn(*mut c_void, *const c_char) -> c_int;
    fido_assert_set_clientdata_hash: fn(*mut c_void, *const u8, usize) -> c_int;
    fido_assert_allow_cred: fn(*mut c_void, *const u8, usize) -> c_int;
    fido_assert_set_extensions: fn(*mut c_void, c_int) -> c_int;
    fido_assert_set_hmac_salt: fn(*mut c_void, *const u8, usize) -> c_int;
    fido_assert_set_up: fn(*mut c_void, c_int) -> c_int;
    fido_assert_set_uv: fn(*mut c_void, c_int) -> c_int;
    fido_dev_get_assert: fn(*mut c_void, *mut c_void, *const c_char) -> c_int;
    fido_assert_hmac_secret_ptr: fn(*const c_void, usize) -> *const u8;
    fido_assert_hmac_secret_len: fn(*const c_void, usize) -> usize;
    fido_assert_free: fn(*mut *mut c_void);
    fido_cred_new: fn() -> *mut c_void;
    fido_cred_set_type: fn(*mut c_void, c_int) -> c_int;
    fido_cred_set_rp: fn(*mut c_void, *const c_char, *const c_char) -> c_int;
    fido_cred_set_user: fn(*mut c_void, *const u8, usize, *const c_char, *const c_char, *const c_char) -> c_int;
    fido_cred_set_clientdata_hash: fn(*mut c_void, *const u8, usize) -> c_int;
    fido_cred_set_extensions: fn(*mut c_void, c_int) -> c_int;
    fido_cred_set_rk: fn(*mut c_void, c_int) -> c_int;
    fido_cred_set_uv: fn(*mut c_void, c_int) -> c_int;
    fido_dev_make_cred: fn(*mut c_void, *mut c_void, *const c_char) -> c_int;
    fido_cred_id_ptr: fn(*const c_void) -> *const u8;
    fido_cred_id_len: fn(*const c_void) -> usize;
    fido_cred_free: fn(*mut *mut c_void);
}

impl Lib {
    fn get() -> Result<&'static Lib, Error> {
        static LIB: OnceLock<Result<Lib, Error>> = OnceLock::new();
        LIB.get_or_init(|| {
            let lib = Lib::load()?;
            // SAFETY: fido_init with no flags (no debug output) before any other call.
            unsafe { (lib.fido_init)(0) };
            Ok(lib)
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// `Ok` for `FIDO_OK`, else the error with libfido2's words for it.
    fn check(&self, call: &'static str, code: c_int) -> Result<(), Error> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: fido_strerr returns a static NUL-terminated string for any code.
        let message = unsafe { text((self.fido_strerr)(code)) };
        Err(Error::Call {
            call,
            code,
            message,
        })
    }
}

/// A C string libfido2 owns, copied (empty for NULL).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: per the function's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn cstring(s: &str, what: &'static str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::Argument(what))
}

/// A PIN as libfido2 takes it (NUL-terminated), wiped when dropped.
fn pin_cstr(pin: Option<&[u8]>) -> Result<Option<Zeroizing<Vec<u8>>>, Error> {
    pin.map(|p| {
        if p.contains(&0) {
            return Err(Error::Argument("the PIN"));
        }
        let mut v = Zeroizing::new(Vec::with_capacity(p.len() + 1));
        v.extend_from_slice(p);
        v.push(0);
        Ok(v)
    })
    .transpose()
}

fn pin_ptr(pin: &Option<Zeroizing<Vec<u8>>>) -> *const c_char {
    pin.as_ref()
        .map_or(std::ptr::null(), |p| p.as_ptr().cast::<c_char>())
}

/// A FIDO device libfido2 found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its path (`/dev/hidrawN`).
    pub path: String,
    /// The product name it reports.
    pub product: String,
    /// The manufacturer it reports.
    pub manufacturer: String,
}

/// The FIDO devices plugged in (at most 64), as libfido2 lists them.
pub fn devices() -> Result<Vec<DeviceInfo>, Error> {
    const MAX: usize = 64;
    let lib = Lib::get()?;
    // SAFETY: a fresh list of MAX entries, freed below with the same count.
    let mut list = unsafe { (lib.fido_dev_info_new)(MAX) };
    if list.is_null() {
        return Err(Error::Library("fido_dev_info_new: out of memory".into()));
    }
    let mut found = 0usize;
    // SAFETY: `list` holds MAX entries; `found` receives how many were filled.
    let mut rc = unsafe { (lib.fido_dev_info_manifest)(list, MAX, &mut found) };
    if rc == code::INTERNAL {
        // No hidraw device at all (libfido2 reports it so; systemd reads it so too).
        (rc, found) = (0, 0);
    }
    let out = lib.check("fido_dev_info_manifest", rc).map(|()| {
        (0..found.min(MAX))
            .map(|i| {
                // SAFETY: i < found <= MAX: an entry of the list, whose strings live as
                // long as the list and are copied at once.
                unsafe {
                    let d = (lib.fido_dev_info_ptr)(list, i);
                    DeviceInfo {
                        path: text((lib.fido_dev_info_path)(d)),
                        product: text((lib.fido_dev_info_product_string)(d)),
                        manufacturer: text((lib.fido_dev_info_manufacturer_string)(d)),
                    }
                }
            })
            .collect()
    });
    // SAFETY: the list made above, with its count; the pointer is set to NULL.
    unsafe { (lib.fido_dev_info_free)(&mut list, MAX) };
    out
}

/// What a key says it supports (`authenticatorGetInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Info {
    /// Extensions, such as `hmac-secret`.
    pub extensions: Vec<String>,
    /// Options and their values: `clientPin` true when a PIN is set (false: supported,
    /// not set), `up`, `uv` (built-in user verification configured), `rk`...
    pub options: Vec<(String, bool)>,
}

impl Info {
    /// An option's value; `None` when the key does not list it (not supported).
    pub fn option(&self, name: &str) -> Option<bool> {
        self.options
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }

    /// Whether the key lists this extension.
    pub fn has_extension(&self, name: &str) -> bool {
        self.extensions.iter().any(|e| e == name)
    }
}

/// A credential to make on a key, as a relying party asks for it.
#[derive(Debug, Clone, Copy)]
pub struct NewCredential<'a> {
    /// The relying party's id (systemd: `io.systemd.cryptsetup`).
    pub rp_id: &'a str,
    /// Its display name.
    pub rp_name: &'a str,
    /// The user handle (up to 64 bytes).
    pub user_id: &'a [u8],
    /// The user name.
    pub user_name: &'a str,
    /// The user's display name, if any.
    pub user_display_name: Option<&'a str>,
    /// The public-key algorithm.
    pub algorithm: Algorithm,
    /// A resident (discoverable) credential: `False` for one only the id names.
    pub rk: Opt,
    /// Whether the key must verify the user (built-in UV) for this.
    pub uv: Opt,
    /// The hash of the client data (32 bytes; random where nothing is signed over).
    pub client_data_hash: &'a [u8],
}

/// An assertion asking for the hmac-secret of one credential with one salt.
#[derive(Debug, Clone, Copy)]
pub struct Assertion<'a> {
    /// The relying party's id the credential was made for.
    pub rp_id: &'a str,
    /// The credential id.
    pub credential: &'a [u8],
    /// The salt (32 bytes).
    pub salt: &'a [u8],
    /// The hash of the client data (32 bytes).
    pub client_data_hash: &'a [u8],
    /// User presence (a touch).
    pub up: Opt,
    /// User verification (built-in, e.g. a fingerprint).
    pub uv: Opt,
}

/// An open FIDO device; closed when dropped.
pub struct Device {
    lib: &'static Lib,
    dev: *mut c_void,
    path: String,
}

// SAFETY: a fido_dev_t is used by one thread at a time (&mut-free API, but no call here
// shares it across threads concurrently: Device is not Sync).
unsafe impl Send for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("path", &self.path).finish()
    }
}

impl Device {
    /// Opens the device at `path` (`/dev/hidrawN`).
    pub fn open(path: &str) -> Result<Device, Error> {
        let lib = Lib::get()?;
        let c = cstring(path, "the device path")?;
        // SAFETY: fido_dev_new has no arguments; NULL on allocation failure.
        let mut dev = unsafe { (lib.fido_dev_new)() };
        if dev.is_null() {
            return Err(Error::Library("fido_dev_new: out of memory".into()));
        }
        // SAFETY: a fresh device and a NUL-terminated path.
        let rc = unsafe { (lib.fido_dev_open)(dev, c.as_ptr()) };
        if let Err(e) = lib.check("fido_dev_open", rc) {
            // SAFETY: the device made above, never opened; the pointer is set to NULL.
            unsafe { (lib.fido_dev_free)(&mut dev) };
            return Err(e);
        }
        Ok(Device {
            lib,
            dev,
            path: path.to_owned(),
        })
    }

    /// Where it was opened.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether it speaks CTAP2 (not only U2F, which has no hmac-secret).
    pub fn is_fido2(&self) -> bool {
        // SAFETY: an open device.
        unsafe { (self.lib.fido_dev_is_fido2)(self.dev) }
    }

    /// What it supports.
    pub fn info(&self) -> Result<Info, Error> {
        let lib = self.lib;
        // SAFETY: no arguments; NULL on allocation failure.
        let mut ci = unsafe { (lib.fido_cbor_info_new)() };
        if ci.is_null() {
            return Err(Error::Library("fido_cbor_info_new: out of memory".into()));
        }
        // SAFETY: an open device and a fresh info structure.
        let rc = unsafe { (lib.fido_dev_get_cbor_info)(self.dev, ci) };
        let out = lib.check("fido_dev_get_cbor_info", rc).map(|()| {
            // SAFETY: the arrays belong to `ci`, with the lengths libfido2 reports for
            // them; their strings are copied before `ci` is freed.
            unsafe {
                let strings = |p: *mut *mut c_char, n: usize| -> Vec<String> {
                    if p.is_null() {
                        return Vec::new();
                    }
                    (0..n).map(|i| text(*p.add(i))).collect()
                };
                let extensions = strings(
                    (lib.fido_cbor_info_extensions_ptr)(ci),
                    (lib.fido_cbor_info_extensions_len)(ci),
                );
                let n = (lib.fido_cbor_info_options_len)(ci);
                let names = strings((lib.fido_cbor_info_options_name_ptr)(ci), n);
                let values = (lib.fido_cbor_info_options_value_ptr)(ci);
                let options = names
                    .into_iter()
                    .enumerate()
                    .map(|(i, name)| (name, !values.is_null() && *values.add(i)))
                    .collect();
                Info {
                    extensions,
                    options,
                }
            }
        });
        // SAFETY: the structure made above; the pointer is set to NULL.
        unsafe { (lib.fido_cbor_info_free)(&mut ci) };
        out
    }

    /// Makes a credential with the hmac-secret extension (after a touch, and the PIN if
    /// given); returns its id.
    pub fn make_credential(
        &self,
        c: &NewCredential<'_>,
        pin: Option<&[u8]>,
    ) -> Result<Vec<u8>, Error> {
        let lib = self.lib;
        let rp_id = cstring(c.rp_id, "the relying party")?;
        let rp_name = cstring(c.rp_name, "the relying party's name")?;
        let user_name = cstring(c.user_name, "the user name")?;
        let display = c
            .user_display_name
            .map(|d| cstring(d, "the user's display name"))
            .transpose()?;
        let pin = pin_cstr(pin)?;
        // SAFETY: no arguments; NULL on allocation failure.
        let mut cred = unsafe { (lib.fido_cred_new)() };
        if cred.is_null() {
            return Err(Error::Library("fido_cred_new: out of memory".into()));
        }
        let result = (|| {
            // SAFETY: `cred` is a live credential; every pointer is to a NUL-terminated
            // string or a slice with its length, alive for the call (libfido2 copies).
            unsafe {
                lib.check(
                    "fido_cred_set_type",
                    (lib.fido_cred_set_type)(cred, c.algorithm.cose()),
                )?;
                lib.check(
                    "fido_cred_set_clientdata_hash",
                    (lib.fido_cred_set_clientdata_hash)(
                        cred,
                        c.client_data_hash.as_ptr(),
                        c.client_data_hash.len(),
                    ),
                )?;
                lib.check(
                    "fido_cred_set_rp",
                    (lib.fido_cred_set_rp)(cred, rp_id.as_ptr(), rp_name.as_ptr()),
                )?;
                lib.check(
                    "fido_cred_set_user",
                    (lib.fido_cred_set_user)(
                        cred,
                        c.user_id.as_ptr(),
                        c.user_id.len(),
                        user_name.as_ptr(),
                        display.as_ref().map_or(std::ptr::null(), |d| d.as_ptr()),
                        std::ptr::null(),
                    ),
                )?;
                lib.check(
                    "fido_cred_set_extensions",
                    (lib.fido_cred_set_extensions)(cred, EXT_HMAC_SECRET),
                )?;
                if c.rk != Opt::Omit {
                    lib.check("fido_cred_set_rk", (lib.fido_cred_set_rk)(cred, c.rk.raw()))?;
                }
                if c.uv != Opt::Omit {
                    lib.check("fido_cred_set_uv", (lib.fido_cred_set_uv)(cred, c.uv.raw()))?;
                }
                lib.check(
                    "fido_dev_make_cred",
                    (lib.fido_dev_make_cred)(self.dev, cred, pin_ptr(&pin)),
                )?;
                let (p, n) = ((lib.fido_cred_id_ptr)(cred), (lib.fido_cred_id_len)(cred));
                if p.is_null() || n == 0 {
                    return Err(Error::Library(
                        "the key returned a credential without an id".into(),
                    ));
                }
                Ok(std::slice::from_raw_parts(p, n).to_vec())
            }
        })();
        // SAFETY: the credential made above; the pointer is set to NULL.
        unsafe { (lib.fido_cred_free)(&mut cred) };
        result
    }

    /// Whether the key holds `credential` for `rp_id`: an assertion without the PIN, the
    /// hmac-secret extension or a touch (`up`: `False` where the key has user presence),
    /// as systemd 253+ asks each key before it sends a PIN, which a key that never saw
    /// the credential would count as a wrong one. `Ok(false)` only for "no credentials";
    /// any other answer is the key's error.
    pub fn has_credential(&self, rp_id: &str, credential: &[u8], up: Opt) -> Result<bool, Error> {
        let a = Assertion {
            rp_id,
            credential,
            salt: &[],
            client_data_hash: &[0; 32],
            up,
            uv: Opt::Omit,
        };
        match self.assert(&a, false, None) {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some(code::NO_CREDENTIALS) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The hmac-secret of the assertion's credential and salt (32 bytes), after what the
    /// assertion asks of the user, and the PIN if given.
    pub fn hmac_secret(
        &self,
        a: &Assertion<'_>,
        pin: Option<&[u8]>,
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        self.assert(a, true, pin)?.ok_or_else(|| {
            Error::Library(
                "the key returned no hmac-secret (the credential was made without it)".into(),
            )
        })
    }

    /// One assertion; with `hmac`, the hmac-secret extension with the assertion's salt,
    /// and its output returned.
    fn assert(
        &self,
        a: &Assertion<'_>,
        hmac: bool,
        pin: Option<&[u8]>,
    ) -> Result<Option<Zeroizing<Vec<u8>>>, Error> {
        let lib = self.lib;
        let rp_id = cstring(a.rp_id, "the relying party")?;
        let pin = pin_cstr(pin)?;
        // SAFETY: no arguments; NULL on allocation failure.
        let mut assert = unsafe { (lib.fido_assert_new)() };
        if assert.is_null() {
            return Err(Error::Library("fido_assert_new: out of memory".into()));
        }
        let result = (|| {
            // SAFETY: `assert` is a live assertion; every pointer is to a NUL-terminated
            // string or a slice with its length, alive for the call (libfido2 copies);
            // the secret is read with the length libfido2 gives for index 0.
            unsafe {
                lib.check(
                    "fido_assert_set_clientdata_hash",
                    (lib.fido_assert_set_clientdata_hash)(
                        assert,
                        a.client_data_hash.as_ptr(),
                        a.client_data_hash.len(),
                    ),
                )?;
                lib.check(
                    "fido_assert_set_rp",
                    (lib.fido_assert_set_rp)(assert, rp_id.as_ptr()),
                )?;
                lib.check(
                    "fido_assert_allow_cred",
                    (lib.fido_assert_allow_cred)(assert, a.credential.as_ptr(), a.credential.len()),
                )?;
                if hmac {
                    lib.check(
                        "fido_assert_set_extensions",
                        (lib.fido_assert_set_extensions)(assert, EXT_HMAC_SECRET),
                    )?;
                    lib.check(
                        "fido_assert_set_hmac_salt",
                        (lib.fido_assert_set_hmac_salt)(assert, a.salt.as_ptr(), a.salt.len()),
                    )?;
                }
                if a.up != Opt::Omit {
                    lib.check(
                        "fido_assert_set_up",
                        (lib.fido_assert_set_up)(assert, a.up.raw()),
                    )?;
                }
                if a.uv != Opt::Omit {
                    lib.check(
                        "fido_assert_set_uv",
                        (lib.fido_assert_set_uv)(assert, a.uv.raw()),
                    )?;
                }
                lib.check(
                    "fido_dev_get_assert",
                    (lib.fido_dev_get_assert)(self.dev, assert, pin_ptr(&pin)),
                )?;
                if !hmac {
                    return Ok(None);
                }
                let p = (lib.fido_assert_hmac_secret_ptr)(assert, 0);
                let n = (lib.fido_assert_hmac_secret_len)(assert, 0);
                if p.is_null() || n == 0 {
                    return Ok(None);
                }
                Ok(Some(Zeroizing::new(
                    std::slice::from_raw_parts(p, n).to_vec(),
                )))
            }
        })();
        // SAFETY: the assertion made above (libfido2 wipes the secret it holds when
        // freeing it); the pointer is set to NULL.
        unsafe { (lib.fido_assert_free)(&mut assert) };
        result
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the device opened in `open`, closed and freed once; the pointer is set
        // to NULL.
        unsafe {
            (self.lib.fido_dev_close)(self.dev);
            (self.lib.fido_dev_free)(&mut self.dev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_key_the_list_is_empty_or_libfido2_is_named() {
        // No FIDO device exists where the unit tests run (keys are tested in the VM,
        // tests/vm/tokens.sh); what matters here is that loading, listing and an open
        // of a path that is no device fail cleanly.
        match devices() {
            Ok(list) => {
                for d in &list {
                    assert!(d.path.starts_with('/'), "{d:?}");
                }
                let e = Device::open("/nonexistent/hidraw").unwrap_err();
                assert!(
                    matches!(
                        e,
                        Error::Call {
                            call: "fido_dev_open",
                            ..
                        }
                    ),
                    "{e}"
                );
            }
            Err(Error::Library(m)) => assert!(m.contains("libfido2"), "{m}"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_pin_with_a_nul_is_refused_and_options_map_to_fido_opt_t() {
        assert_eq!(
            pin_cstr(Some(b"12\x0034")).unwrap_err(),
            Error::Argument("the PIN")
        );
        assert_eq!(&pin_cstr(Some(b"1234")).unwrap().unwrap()[..], b"1234\0");
        assert!(pin_cstr(None).unwrap().is_none());
        assert_eq!(
            [Opt::Omit.raw(), Opt::False.raw(), Opt::True.raw()],
            [0, 1, 2]
        );
        assert_eq!(Algorithm::Rs256.cose(), -257);
    }
}
