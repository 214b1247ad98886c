//! PKCS#11 security tokens (smart cards, HSMs, SoftHSM) for cryptblk's `systemd-pkcs11`
//! tokens: the token a PKCS#11 URI (RFC 7512) names, logged into with its PIN, decrypts
//! a key with its RSA private key.
//!
//! The modules are found as systemd finds them: through p11-kit (`libp11-kit.so.0`,
//! loaded at run time, not linked), which loads and initialises every module registered
//! on the system (`/usr/share/p11-kit/modules/*.module`); `CRYPTBLK_PKCS11_MODULE` names
//! one module instead. Only the few functions used are called, through the module's
//! function list (PKCS#11 2.40's order, which every later version keeps).

// FFI to PKCS#11 modules and p11-kit: every block says why it is sound.
#![allow(unsafe_code)]

mod ec;
mod rsa;
mod uri;

pub use ec::{Curve, ecdh_ephemeral};
pub use rsa::{PublicKey, public_key, rsa_encrypt_pkcs1};
pub use uri::Uri;

use cryptblk_dl::{Library, Scope};
use std::ffi::{CStr, CString, c_ulong, c_void};
use std::sync::OnceLock;
use zeroize::Zeroizing;

type Rv = c_ulong;

/// `CK_FUNCTION_LIST`: the version, then the functions in the standard's order.
#[repr(C)]
struct FunctionList {
    version: [u8; 2],
    functions: [*const c_void; 68],
}

/// `CK_ATTRIBUTE`.
#[repr(C)]
struct Attribute {
    kind: c_ulong,
    value: *const c_void,
    len: c_ulong,
}

/// `CK_MECHANISM`.
#[repr(C)]
struct Mechanism {
    kind: c_ulong,
    parameter: *const c_void,
    len: c_ulong,
}

/// `CK_TOKEN_INFO`, as much as is read of it (label, manufacturer, model, serial number,
/// flags), in a buffer larger than the whole structure (208 bytes on LP64).
#[repr(C, align(8))]
struct TokenInfo([u8; 512]);

// Function indexes in CK_FUNCTION_LIST.
const C_INITIALIZE: usize = 0;
const C_FINALIZE: usize = 1;
const C_GET_SLOT_LIST: usize = 4;
const C_GET_TOKEN_INFO: usize = 6;
const C_OPEN_SESSION: usize = 12;
const C_CLOSE_SESSION: usize = 13;
const C_LOGIN: usize = 18;
const C_LOGOUT: usize = 19;
const C_DESTROY_OBJECT: usize = 22;
const C_GET_ATTRIBUTE_VALUE: usize = 24;
const C_FIND_OBJECTS_INIT: usize = 26;
const C_FIND_OBJECTS: usize = 27;
const C_FIND_OBJECTS_FINAL: usize = 28;
const C_DECRYPT_INIT: usize = 33;
const C_DECRYPT: usize = 34;
const C_DERIVE_KEY: usize = 62;

const CKF_SERIAL_SESSION: c_ulong = 0x4;
const CKF_LOGIN_REQUIRED: c_ulong = 0x4;
const CKF_PROTECTED_AUTHENTICATION_PATH: c_ulong = 0x100;
const CKU_USER: c_ulong = 1;
const CKA_CLASS: c_ulong = 0x0;
const CKA_LABEL: c_ulong = 0x3;
const CKA_ID: c_ulong = 0x102;
const CKA_VALUE: c_ulong = 0x11;
const CKA_TOKEN: c_ulong = 0x1;
const CKA_KEY_TYPE: c_ulong = 0x100;
const CKA_SENSITIVE: c_ulong = 0x103;
const CKA_EXTRACTABLE: c_ulong = 0x162;
const CKO_SECRET_KEY: c_ulong = 4;
const CKK_RSA: c_ulong = 0;
const CKK_EC: c_ulong = 3;
const CKK_GENERIC_SECRET: c_ulong = 0x10;
const CKM_ECDH1_DERIVE: c_ulong = 0x1050;
const CKD_NULL: c_ulong = 1;
const CKO_CERTIFICATE: c_ulong = 1;
const CKO_PRIVATE_KEY: c_ulong = 3;
const CKM_RSA_PKCS: c_ulong = 1;
const CKR_OK: Rv = 0;
const CKR_PIN_INCORRECT: Rv = 0xa0;
const CKR_PIN_LOCKED: Rv = 0xa4;
const CKR_USER_ALREADY_LOGGED_IN: Rv = 0x100;
const CKR_CRYPTOKI_ALREADY_INITIALIZED: Rv = 0x191;

/// Why a token could not decrypt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// p11-kit or the module is missing.
    Library(String),
    /// No token present matches the URI.
    NoToken(String),
    /// The PIN was refused.
    WrongPin,
    /// The token locked its PIN after too many wrong ones.
    PinLocked,
    /// A PIN is needed and none was given.
    NeedPin,
    /// No (or more than one) private key matches the URI.
    Key(String),
    /// A PKCS#11 call failed.
    Call {
        /// The function.
        call: &'static str,
        /// Its return value (`CKR_*`).
        rv: c_ulong,
    },
    /// A malformed URI.
    Uri(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Library(m) | Error::NoToken(m) | Error::Key(m) | Error::Uri(m) => f.write_str(m),
            Error::WrongPin => f.write_str("wrong PIN"),
            Error::PinLocked => f.write_str("the token's PIN is locked"),
            Error::NeedPin => f.write_str("the token needs a PIN"),
            Error::Call { call, rv } => write!(f, "{call} failed with CKR {rv:#x}"),
        }
    }
}

impl std::error::Error for Error {}

fn open_lib(name: &CStr, hint: &str) -> Result<Library, Error> {
    Library::open(name, Scope::Local).map_err(|e| Error::Library(format!("{e}: {hint}")))
}

fn symbol(lib: &Library, name: &CStr) -> Result<*mut c_void, Error> {
    lib.symbol(name)
        .ok_or_else(|| Error::Library(format!("no {} in it", name.to_string_lossy())))
}

type FnLoad = unsafe extern "C" fn(libc::c_int) -> *mut *mut FunctionList;
type FnRelease = unsafe extern "C" fn(*mut *mut FunctionList);
type FnGetList = unsafe extern "C" fn(*mut *mut FunctionList) -> Rv;

/// The modules to search: p11-kit's registered ones, or the one module named.
struct Modules {
    lists: Vec<*mut FunctionList>,
    /// p11-kit's array, released (modules finalised) when done; `None` for one module
    /// loaded by path, finalised directly.
    p11kit: Option<(*mut *mut FunctionList, FnRelease)>,
}

impl Modules {
    fn load() -> Result<Modules, Error> {
        if let Some(path) = std::env::var_os("CRYPTBLK_PKCS11_MODULE") {
            use std::os::unix::ffi::OsStrExt;
            let c = CString::new(path.as_bytes())
                .map_err(|_| Error::Library("a NUL in CRYPTBLK_PKCS11_MODULE".into()))?;
            let h = open_lib(&c, "CRYPTBLK_PKCS11_MODULE names a PKCS#11 module")?;
            let get = symbol(&h, c"C_GetFunctionList")?;
            // SAFETY: C_GetFunctionList has this prototype in every PKCS#11 module.
            let get: FnGetList = unsafe { std::mem::transmute(get) };
            let mut list = std::ptr::null_mut();
            // SAFETY: `list` receives the module's static function list.
            let rv = unsafe { get(&mut list) };
            if rv != CKR_OK || list.is_null() {
                return Err(Error::Call {
                    call: "C_GetFunctionList",
                    rv,
                });
            }
            // SAFETY: C_Initialize with NULL arguments: the application does no locking
            // of its own (one thread uses the module here).
            let rv = unsafe {
                call::<unsafe extern "C" fn(*mut c_void) -> Rv>(list, C_INITIALIZE)?(
                    std::ptr::null_mut(),
                )
            };
            if rv != CKR_OK && rv != CKR_CRYPTOKI_ALREADY_INITIALIZED {
                return Err(Error::Call {
                    call: "C_Initialize",
                    rv,
                });
            }
            return Ok(Modules {
                lists: vec![list],
                p11kit: None,
            });
        }
        static P11KIT: OnceLock<Result<(FnLoad, FnRelease), Error>> = OnceLock::new();
        let (load, release) = P11KIT
            .get_or_init(|| {
                let h = open_lib(
                    c"libp11-kit.so.0",
                    "install p11-kit (Debian: apt-get install libp11-kit0)",
                )?;
                let load = symbol(&h, c"p11_kit_modules_load_and_initialize")?;
                let release = symbol(&h, c"p11_kit_modules_finalize_and_release")?;
                // SAFETY: p11-kit's prototypes (p11-kit/p11-kit.h, 0.20+).
                Ok(unsafe {
                    (
                        std::mem::transmute::<*mut c_void, FnLoad>(load),
                        std::mem::transmute::<*mut c_void, FnRelease>(release),
                    )
                })
            })
            .clone()?;
        // SAFETY: loads and initialises the registered modules; flags 0.
        let array = unsafe { load(0) };
        if array.is_null() {
            return Err(Error::Library(
                "p11-kit loaded no PKCS#11 module (none registered?)".into(),
            ));
        }
        let mut lists = Vec::new();
        // SAFETY: a NULL-terminated array of function lists, live until released.
        unsafe {
            let mut p = array;
            while !(*p).is_null() {
                lists.push(*p);
                p = p.add(1);
            }
        }
        Ok(Modules {
            lists,
            p11kit: Some((array, release)),
        })
    }
}

impl Drop for Modules {
    fn drop(&mut self) {
        match self.p11kit {
            // SAFETY: the array p11-kit returned, not used after this.
            Some((array, release)) => unsafe { release(array) },
            None => {
                type F = unsafe extern "C" fn(*mut c_void) -> Rv;
                for &l in &self.lists {
                    // SAFETY: C_Finalize(NULL) on the module initialised in `load`.
                    let finalize = unsafe { call::<F>(l, C_FINALIZE) };
                    if let Ok(f) = finalize {
                        // SAFETY: as above.
                        unsafe { f(std::ptr::null_mut()) };
                    }
                }
            }
        }
    }
}

/// Function `index` of a module's list, as type `F`.
///
/// # Safety
/// `list` must be a live function list and `F` the prototype of function `index`.
unsafe fn call<F: Copy>(list: *mut FunctionList, index: usize) -> Result<F, Error> {
    // SAFETY: the caller's promise; the list holds 68 entries, `index` is below that.
    let f = unsafe { (*list).functions[index] };
    if f.is_null() {
        return Err(Error::Library(format!(
            "the module has no function {index}"
        )));
    }
    // SAFETY: a function pointer of the type the caller names.
    Ok(unsafe { std::mem::transmute_copy::<*const c_void, F>(&f) })
}

fn check(call: &'static str, rv: Rv) -> Result<(), Error> {
    match rv {
        CKR_OK => Ok(()),
        CKR_PIN_INCORRECT => Err(Error::WrongPin),
        CKR_PIN_LOCKED => Err(Error::PinLocked),
        rv => Err(Error::Call { call, rv }),
    }
}

/// A space-padded PKCS#11 string field, trimmed.
fn padded(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches([' ', '\0'])
        .to_owned()
}

/// What a token says about itself, to match a URI against and to ask for its PIN.
#[derive(Debug, Clone)]
pub struct TokenLabel {
    /// Its label (`token=` in a URI).
    pub label: String,
    /// Whether it asks for a PIN at all (`CKF_LOGIN_REQUIRED`).
    pub login_required: bool,
    /// Whether the PIN is entered on the device itself (a PIN pad).
    pub protected_path: bool,
}

/// Runs `f` on a session with the token `uri` names, logged in (with the PIN `pin` gives
/// when the token asks for one).
fn with_token<T>(
    uri: &Uri,
    pin: &mut dyn FnMut(&TokenLabel) -> Option<Zeroizing<Vec<u8>>>,
    f: impl FnOnce(&Session, &TokenLabel) -> Result<T, Error>,
) -> Result<T, Error> {
    let modules = Modules::load()?;
    for &list in &modules.lists {
        for slot in slots(list)? {
            let mut info = TokenInfo([0; 512]);
            // SAFETY: C_GetTokenInfo(slot, info) with a buffer larger than CK_TOKEN_INFO.
            let rv = unsafe {
                call::<unsafe extern "C" fn(c_ulong, *mut TokenInfo) -> Rv>(list, C_GET_TOKEN_INFO)?(
                    slot, &mut info,
                )
            };
            if rv != CKR_OK {
                continue;
            }
            let i = &info.0;
            let fields = [
                ("token", padded(&i[0..32])),
                ("manufacturer", padded(&i[32..64])),
                ("model", padded(&i[64..80])),
                ("serial", padded(&i[80..96])),
            ];
            if !fields
                .iter()
                .all(|(k, v)| uri.get(k).is_none_or(|want| want == v.as_bytes()))
            {
                continue;
            }
            let flags = c_ulong::from_ne_bytes(i[96..104].try_into().expect("8 bytes"));
            let label = TokenLabel {
                label: fields[0].1.clone(),
                login_required: flags & CKF_LOGIN_REQUIRED != 0,
                protected_path: flags & CKF_PROTECTED_AUTHENTICATION_PATH != 0,
            };
            let mut session = Session::open(list, slot)?;
            if label.protected_path {
                session.login(None)?;
            } else if label.login_required {
                let p = pin(&label).ok_or(Error::NeedPin)?;
                session.login(Some(&p))?;
            }
            let result = f(&session, &label);
            drop(session);
            drop(modules);
            return result;
        }
    }
    Err(Error::NoToken(format!(
        "no PKCS#11 token present matches {}",
        uri.as_str()
    )))
}

/// The secret a systemd-pkcs11 token's `sealed` data gives with the private key the
/// token `uri` names holds, logging in with the PIN `pin` gives for it (`None`: no PIN
/// to give): an RSA key decrypts it (PKCS#1 v1.5); an EC key takes it as the other
/// side's public point (uncompressed SEC1) and derives the ECDH secret with it (its
/// x-coordinate, no KDF), as systemd 255+ does. The key's type on the token decides.
pub fn unseal(
    uri: &Uri,
    pin: &mut dyn FnMut(&TokenLabel) -> Option<Zeroizing<Vec<u8>>>,
    sealed: &[u8],
) -> Result<Zeroizing<Vec<u8>>, Error> {
    with_token(uri, pin, |session, label| {
        let key = session.only_object(uri, CKO_PRIVATE_KEY, label, "private key")?;
        match session.ulong(key, CKA_KEY_TYPE)? {
            CKK_RSA => session.decrypt(key, sealed),
            CKK_EC => session.ecdh(key, sealed),
            other => Err(Error::Key(format!(
                "the private key on token '{}' is of PKCS#11 key type {other:#x}: systemd-pkcs11 \
                 tokens take RSA or EC keys",
                label.label
            ))),
        }
    })
}

/// The certificate (DER) the token `uri` names holds: what enrolling encrypts to.
pub fn certificate(
    uri: &Uri,
    pin: &mut dyn FnMut(&TokenLabel) -> Option<Zeroizing<Vec<u8>>>,
) -> Result<Vec<u8>, Error> {
    with_token(uri, pin, |session, label| {
        let cert = session.only_object(uri, CKO_CERTIFICATE, label, "certificate")?;
        session.value(cert)
    })
}

fn slots(list: *mut FunctionList) -> Result<Vec<c_ulong>, Error> {
    type F = unsafe extern "C" fn(u8, *mut c_ulong, *mut c_ulong) -> Rv;
    // SAFETY: C_GetSlotList(tokenPresent, list, count): first the count, then the ids.
    let f = unsafe { call::<F>(list, C_GET_SLOT_LIST)? };
    let mut n: c_ulong = 0;
    // SAFETY: as above, a NULL list asks for the count.
    check("C_GetSlotList", unsafe {
        f(1, std::ptr::null_mut(), &mut n)
    })?;
    let mut ids = vec![0 as c_ulong; n as usize];
    // SAFETY: `ids` holds `n` entries.
    check("C_GetSlotList", unsafe { f(1, ids.as_mut_ptr(), &mut n) })?;
    ids.truncate(n as usize);
    Ok(ids)
}

/// An open session, closed (and logged out) when dropped.
struct Session {
    list: *mut FunctionList,
    handle: c_ulong,
    logged_in: bool,
}

impl Session {
    fn open(list: *mut FunctionList, slot: c_ulong) -> Result<Session, Error> {
        type F =
            unsafe extern "C" fn(c_ulong, c_ulong, *mut c_void, *const c_void, *mut c_ulong) -> Rv;
        let mut handle = 0;
        // SAFETY: C_OpenSession(slot, flags, app, notify, handle), no callbacks.
        let rv = unsafe {
            call::<F>(list, C_OPEN_SESSION)?(
                slot,
                CKF_SERIAL_SESSION,
                std::ptr::null_mut(),
                std::ptr::null(),
                &mut handle,
            )
        };
        check("C_OpenSession", rv)?;
        Ok(Session {
            list,
            handle,
            logged_in: false,
        })
    }

    fn login(&mut self, pin: Option<&[u8]>) -> Result<(), Error> {
        type F = unsafe extern "C" fn(c_ulong, c_ulong, *const u8, c_ulong) -> Rv;
        let (p, n) = pin.map_or((std::ptr::null(), 0), |p| (p.as_ptr(), p.len() as c_ulong));
        // SAFETY: C_Login(session, user, pin, len); a NULL PIN for a PIN pad.
        let rv = unsafe { call::<F>(self.list, C_LOGIN)?(self.handle, CKU_USER, p, n) };
        if rv == CKR_USER_ALREADY_LOGGED_IN {
            return Ok(());
        }
        check("C_Login", rv)?;
        self.logged_in = true;
        Ok(())
    }

    /// The objects of `class` matching the URI's `object` (label) and `id`.
    fn objects(&self, uri: &Uri, class: c_ulong) -> Result<Vec<c_ulong>, Error> {
        let mut template = vec![Attribute {
            kind: CKA_CLASS,
            value: (&class as *const c_ulong).cast(),
            len: std::mem::size_of::<c_ulong>() as c_ulong,
        }];
        for (name, kind) in [("object", CKA_LABEL), ("id", CKA_ID)] {
            if let Some(v) = uri.get(name) {
                template.push(Attribute {
                    kind,
                    value: v.as_ptr().cast(),
                    len: v.len() as c_ulong,
                });
            }
        }
        type Init = unsafe extern "C" fn(c_ulong, *const Attribute, c_ulong) -> Rv;
        type Find = unsafe extern "C" fn(c_ulong, *mut c_ulong, c_ulong, *mut c_ulong) -> Rv;
        type Final = unsafe extern "C" fn(c_ulong) -> Rv;
        // SAFETY: the template's values live through the search (`class`, `uri`).
        let rv = unsafe {
            call::<Init>(self.list, C_FIND_OBJECTS_INIT)?(
                self.handle,
                template.as_ptr(),
                template.len() as c_ulong,
            )
        };
        check("C_FindObjectsInit", rv)?;
        let mut found = [0 as c_ulong; 8];
        let mut n = 0;
        // SAFETY: room for 8 handles.
        let rv = unsafe {
            call::<Find>(self.list, C_FIND_OBJECTS)?(self.handle, found.as_mut_ptr(), 8, &mut n)
        };
        // SAFETY: ends the search begun above.
        unsafe { call::<Final>(self.list, C_FIND_OBJECTS_FINAL)?(self.handle) };
        check("C_FindObjects", rv)?;
        Ok(found[..n as usize].to_vec())
    }

    /// The one object of `class` the URI names.
    fn only_object(
        &self,
        uri: &Uri,
        class: c_ulong,
        label: &TokenLabel,
        what: &str,
    ) -> Result<c_ulong, Error> {
        match self.objects(uri, class)?[..] {
            [k] => Ok(k),
            [] => Err(Error::Key(format!(
                "no {what} on token '{}' matches {}",
                label.label,
                uri.as_str()
            ))),
            _ => Err(Error::Key(format!(
                "several {what}s on token '{}' match {}: name one (object= or id=)",
                label.label,
                uri.as_str()
            ))),
        }
    }

    /// An object's attribute that holds a `CK_ULONG` (`CKA_KEY_TYPE`).
    fn ulong(&self, object: c_ulong, kind: c_ulong) -> Result<c_ulong, Error> {
        type F = unsafe extern "C" fn(c_ulong, c_ulong, *mut Attribute, c_ulong) -> Rv;
        let mut v: c_ulong = 0;
        let mut attr = Attribute {
            kind,
            value: (&mut v as *mut c_ulong).cast(),
            len: std::mem::size_of::<c_ulong>() as c_ulong,
        };
        // SAFETY: C_GetAttributeValue into a CK_ULONG of its size.
        check("C_GetAttributeValue", unsafe {
            call::<F>(self.list, C_GET_ATTRIBUTE_VALUE)?(self.handle, object, &mut attr, 1)
        })?;
        Ok(v)
    }

    /// ECDH of the private `key` with the public point `peer` (uncompressed SEC1):
    /// `C_DeriveKey(CKM_ECDH1_DERIVE, CKD_NULL)` into a session secret, read, destroyed.
    fn ecdh(&self, key: c_ulong, peer: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
        /// `CK_ECDH1_DERIVE_PARAMS`.
        #[repr(C)]
        struct Ecdh1Params {
            kdf: c_ulong,
            shared_len: c_ulong,
            shared: *const u8,
            public_len: c_ulong,
            public: *const u8,
        }
        let params = Ecdh1Params {
            kdf: CKD_NULL,
            shared_len: 0,
            shared: std::ptr::null(),
            public_len: peer.len() as c_ulong,
            public: peer.as_ptr(),
        };
        let mech = Mechanism {
            kind: CKM_ECDH1_DERIVE,
            parameter: (&params as *const Ecdh1Params).cast(),
            len: std::mem::size_of::<Ecdh1Params>() as c_ulong,
        };
        let (no, yes): (u8, u8) = (0, 1);
        let (class, kind) = (CKO_SECRET_KEY, CKK_GENERIC_SECRET);
        let attr = |kind: c_ulong, v: *const c_void, len: usize| Attribute {
            kind,
            value: v,
            len: len as c_ulong,
        };
        let ulong = std::mem::size_of::<c_ulong>();
        // systemd's template: a session object, readable.
        let template = [
            attr(CKA_TOKEN, (&no as *const u8).cast(), 1),
            attr(CKA_CLASS, (&class as *const c_ulong).cast(), ulong),
            attr(CKA_KEY_TYPE, (&kind as *const c_ulong).cast(), ulong),
            attr(CKA_SENSITIVE, (&no as *const u8).cast(), 1),
            attr(CKA_EXTRACTABLE, (&yes as *const u8).cast(), 1),
        ];
        type Derive = unsafe extern "C" fn(
            c_ulong,
            *const Mechanism,
            c_ulong,
            *const Attribute,
            c_ulong,
            *mut c_ulong,
        ) -> Rv;
        let mut secret = 0;
        // SAFETY: C_DeriveKey(session, mechanism, base key, template, count, new key);
        // the parameters, the peer point and the template's values outlive the call.
        check("C_DeriveKey", unsafe {
            call::<Derive>(self.list, C_DERIVE_KEY)?(
                self.handle,
                &mech,
                key,
                template.as_ptr(),
                template.len() as c_ulong,
                &mut secret,
            )
        })?;
        let value = self.value(secret).map(Zeroizing::new);
        type Destroy = unsafe extern "C" fn(c_ulong, c_ulong) -> Rv;
        // SAFETY: C_DestroyObject on the session object made above.
        unsafe {
            if let Ok(f) = call::<Destroy>(self.list, C_DESTROY_OBJECT) {
                f(self.handle, secret);
            }
        }
        value
    }

    /// An object's `CKA_VALUE`.
    fn value(&self, object: c_ulong) -> Result<Vec<u8>, Error> {
        type F = unsafe extern "C" fn(c_ulong, c_ulong, *mut Attribute, c_ulong) -> Rv;
        let mut attr = Attribute {
            kind: CKA_VALUE,
            value: std::ptr::null(),
            len: 0,
        };
        // SAFETY: C_GetAttributeValue with a NULL value asks for the length.
        check("C_GetAttributeValue", unsafe {
            call::<F>(self.list, C_GET_ATTRIBUTE_VALUE)?(self.handle, object, &mut attr, 1)
        })?;
        let mut buf = vec![0u8; attr.len as usize];
        attr.value = buf.as_mut_ptr().cast();
        // SAFETY: `buf` holds the length the module gave.
        check("C_GetAttributeValue", unsafe {
            call::<F>(self.list, C_GET_ATTRIBUTE_VALUE)?(self.handle, object, &mut attr, 1)
        })?;
        buf.truncate(attr.len as usize);
        Ok(buf)
    }

    fn decrypt(&self, key: c_ulong, ciphertext: &[u8]) -> Result<Zeroizing<Vec<u8>>, Error> {
        let mech = Mechanism {
            kind: CKM_RSA_PKCS,
            parameter: std::ptr::null(),
            len: 0,
        };
        type Init = unsafe extern "C" fn(c_ulong, *const Mechanism, c_ulong) -> Rv;
        type Dec = unsafe extern "C" fn(c_ulong, *const u8, c_ulong, *mut u8, *mut c_ulong) -> Rv;
        // SAFETY: C_DecryptInit(session, mechanism, key).
        check("C_DecryptInit", unsafe {
            call::<Init>(self.list, C_DECRYPT_INIT)?(self.handle, &mech, key)
        })?;
        // The plaintext is never longer than the ciphertext (RSA).
        let mut out = Zeroizing::new(vec![0u8; ciphertext.len()]);
        let mut n = out.len() as c_ulong;
        // SAFETY: C_Decrypt(session, in, len, out, out_len) with `out` of `n` bytes.
        check("C_Decrypt", unsafe {
            call::<Dec>(self.list, C_DECRYPT)?(
                self.handle,
                ciphertext.as_ptr(),
                ciphertext.len() as c_ulong,
                out.as_mut_ptr(),
                &mut n,
            )
        })?;
        out.truncate(n as usize);
        Ok(out)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        type F = unsafe extern "C" fn(c_ulong) -> Rv;
        // SAFETY: C_Logout / C_CloseSession on this live session.
        unsafe {
            if self.logged_in
                && let Ok(f) = call::<F>(self.list, C_LOGOUT)
            {
                f(self.handle);
            }
            if let Ok(f) = call::<F>(self.list, C_CLOSE_SESSION) {
                f(self.handle);
            }
        }
    }
}
