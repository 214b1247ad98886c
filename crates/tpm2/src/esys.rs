//! The ESAPI, TCTI loader and marshalling libraries, loaded at run time, and the commands
//! cryptblk sends through them.

use crate::Error;
use crate::wire::Wire;
use cryptblk_dl::{Library, Scope};
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::OnceLock;
use zeroize::Zeroizing;

type Rc = u32;
/// An ESAPI object handle (`ESYS_TR`).
type Tr = u32;
type Ctx = *mut c_void;
type Out = *mut *mut c_void;

/// No session in this slot.
const TR_NONE: Tr = 0xfff;
/// The password session (an empty or set authorization value, in the clear).
pub(crate) const TR_PASSWORD: Tr = 0x0ff;
/// The owner (storage) hierarchy.
pub(crate) const TR_RH_OWNER: Tr = 0x101;

/// A structure ESAPI reads or writes, in the layout of the TSS's headers, which only the
/// TSS's own (un)marshalling functions touch. Larger than any structure used here
/// (`TPM2B_PRIVATE`, the largest, is 1,552 bytes in tpm2-tss 3.x).
#[repr(C, align(16))]
struct Opaque([u8; 4096]);

type P = *const c_void;
type FnTctiInit = unsafe extern "C" fn(*const c_char, Out) -> Rc;
type FnFinal = unsafe extern "C" fn(Out);
type FnInit = unsafe extern "C" fn(Out, *mut c_void, *mut c_void) -> Rc;
type FnCreatePrimary =
    unsafe extern "C" fn(Ctx, Tr, Tr, Tr, Tr, P, P, P, P, *mut Tr, Out, Out, Out, Out) -> Rc;
type FnCreate =
    unsafe extern "C" fn(Ctx, Tr, Tr, Tr, Tr, P, P, P, P, Out, Out, Out, Out, Out) -> Rc;
type FnLoad = unsafe extern "C" fn(Ctx, Tr, Tr, Tr, Tr, P, P, *mut Tr) -> Rc;
type FnStartAuthSession =
    unsafe extern "C" fn(Ctx, Tr, Tr, Tr, Tr, Tr, P, u8, P, u16, *mut Tr) -> Rc;
type FnSetAttributes = unsafe extern "C" fn(Ctx, Tr, u8, u8) -> Rc;
type FnPolicyPcr = unsafe extern "C" fn(Ctx, Tr, Tr, Tr, Tr, P, P) -> Rc;
type FnPolicy = unsafe extern "C" fn(Ctx, Tr, Tr, Tr, Tr) -> Rc;
type FnGetDigest = unsafe extern "C" fn(Ctx, Tr, Tr, Tr, Tr, Out) -> Rc;
type FnSetAuth = unsafe extern "C" fn(Ctx, Tr, P) -> Rc;
type FnClose = unsafe extern "C" fn(Ctx, *mut Tr) -> Rc;
type FnDeserialize = unsafe extern "C" fn(Ctx, *const u8, usize, *mut Tr) -> Rc;
type FnUnseal = unsafe extern "C" fn(Ctx, Tr, Tr, Tr, Tr, Out) -> Rc;
type FnFlush = unsafe extern "C" fn(Ctx, Tr) -> Rc;
type FnLoadExternal = unsafe extern "C" fn(Ctx, Tr, Tr, Tr, P, P, Tr, *mut Tr) -> Rc;
type FnVerifySignature = unsafe extern "C" fn(Ctx, Tr, Tr, Tr, Tr, P, P, Out) -> Rc;
type FnPolicyAuthorize = unsafe extern "C" fn(Ctx, Tr, Tr, Tr, Tr, P, P, P, P) -> Rc;
type FnGetName = unsafe extern "C" fn(Ctx, Tr, Out) -> Rc;
type FnFree = unsafe extern "C" fn(*mut c_void);

struct Lib {
    mu: Library,
    tctildr_initialize: FnTctiInit,
    tctildr_finalize: FnFinal,
    initialize: FnInit,
    finalize: FnFinal,
    create_primary: FnCreatePrimary,
    create: FnCreate,
    load: FnLoad,
    start_auth_session: FnStartAuthSession,
    trsess_set_attributes: FnSetAttributes,
    policy_pcr: FnPolicyPcr,
    policy_auth_value: FnPolicy,
    policy_get_digest: FnGetDigest,
    tr_set_auth: FnSetAuth,
    tr_close: FnClose,
    tr_deserialize: FnDeserialize,
    unseal: FnUnseal,
    flush_context: FnFlush,
    load_external: FnLoadExternal,
    verify_signature: FnVerifySignature,
    policy_authorize: FnPolicyAuthorize,
    tr_get_name: FnGetName,
    /// `Esys_Free` (tpm2-tss 2.4+); else the C library's `free`, which it wraps.
    free: Option<FnFree>,
}

// SAFETY: the library handles and function pointers are process-wide and immutable once
// loaded; the libraries' functions are called only on a context one thread owns.
unsafe impl Send for Lib {}
// SAFETY: as above.
unsafe impl Sync for Lib {}

fn open_lib(name: &CStr) -> Result<Library, Error> {
    Library::open(name, Scope::Local).map_err(|e| {
        Error::Library(format!(
            "{e}: install the TPM2 software stack (Debian: apt-get install libtss2-esys-3.0.2-0 \
             libtss2-tctildr0 libtss2-mu0)"
        ))
    })
}

fn symbol(lib: &Library, name: &str) -> Option<*mut c_void> {
    lib.symbol(&CString::new(name).ok()?)
}

impl Lib {
    fn get() -> Result<&'static Lib, Error> {
        static LIB: OnceLock<Result<Lib, Error>> = OnceLock::new();
        LIB.get_or_init(Lib::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> Result<Lib, Error> {
        let esys = open_lib(c"libtss2-esys.so.0")?;
        let tctildr = open_lib(c"libtss2-tctildr.so.0")?;
        let mu = open_lib(c"libtss2-mu.so.0")?;
        macro_rules! sym {
            ($h:expr, $name:literal, $t:ty) => {{
                let p = symbol(&$h, $name).ok_or_else(|| {
                    Error::Library(format!("the TPM2 software stack has no {}: too old", $name))
                })?;
                // SAFETY: the symbol is the C function of that name, whose prototype in
                // tss2_esys.h / tss2_tctildr.h (tpm2-tss 2.4+) the field's type spells out.
                unsafe { std::mem::transmute::<*mut c_void, $t>(p) }
            }};
        }
        Ok(Lib {
            mu,
            tctildr_initialize: sym!(tctildr, "Tss2_TctiLdr_Initialize", FnTctiInit),
            tctildr_finalize: sym!(tctildr, "Tss2_TctiLdr_Finalize", FnFinal),
            initialize: sym!(esys, "Esys_Initialize", FnInit),
            finalize: sym!(esys, "Esys_Finalize", FnFinal),
            create_primary: sym!(esys, "Esys_CreatePrimary", FnCreatePrimary),
            create: sym!(esys, "Esys_Create", FnCreate),
            load: sym!(esys, "Esys_Load", FnLoad),
            start_auth_session: sym!(esys, "Esys_StartAuthSession", FnStartAuthSession),
            trsess_set_attributes: sym!(esys, "Esys_TRSess_SetAttributes", FnSetAttributes),
            policy_pcr: sym!(esys, "Esys_PolicyPCR", FnPolicyPcr),
            policy_auth_value: sym!(esys, "Esys_PolicyAuthValue", FnPolicy),
            policy_get_digest: sym!(esys, "Esys_PolicyGetDigest", FnGetDigest),
            tr_set_auth: sym!(esys, "Esys_TR_SetAuth", FnSetAuth),
            tr_close: sym!(esys, "Esys_TR_Close", FnClose),
            tr_deserialize: sym!(esys, "Esys_TR_Deserialize", FnDeserialize),
            unseal: sym!(esys, "Esys_Unseal", FnUnseal),
            flush_context: sym!(esys, "Esys_FlushContext", FnFlush),
            load_external: sym!(esys, "Esys_LoadExternal", FnLoadExternal),
            verify_signature: sym!(esys, "Esys_VerifySignature", FnVerifySignature),
            policy_authorize: sym!(esys, "Esys_PolicyAuthorize", FnPolicyAuthorize),
            tr_get_name: sym!(esys, "Esys_TR_GetName", FnGetName),
            free: symbol(&esys, "Esys_Free").map(|p| {
                // SAFETY: Esys_Free takes the pointer to free, as its prototype says.
                unsafe { std::mem::transmute::<*mut c_void, FnFree>(p) }
            }),
        })
    }

    /// `bytes` (the wire form of `kind`, e.g. `TPM2B_PUBLIC`) as the TSS's structure.
    fn unmarshal(&self, kind: &str, bytes: &[u8]) -> Result<Box<Opaque>, Error> {
        let name = format!("Tss2_MU_{kind}_Unmarshal");
        let p = symbol(&self.mu, &name)
            .ok_or_else(|| Error::Library(format!("libtss2-mu has no {name}")))?;
        // SAFETY: Tss2_MU_<kind>_Unmarshal(buffer, size, offset, dest), per tss2_mu.h.
        let f: unsafe extern "C" fn(*const u8, usize, *mut usize, *mut c_void) -> Rc =
            unsafe { std::mem::transmute(p) };
        let mut out = Box::new(Opaque([0; 4096]));
        let mut offset = 0usize;
        // SAFETY: the buffer is `bytes`, of its length; `out` is larger than any of the
        // structures unmarshalled here, and suitably aligned.
        let rc = unsafe {
            f(
                bytes.as_ptr(),
                bytes.len(),
                &mut offset,
                out.0.as_mut_ptr().cast(),
            )
        };
        if rc != 0 || offset != bytes.len() {
            return Err(Error::Format(format!(
                "a malformed {kind} ({} bytes, {offset} read, TSS error {rc:#x})",
                bytes.len()
            )));
        }
        Ok(out)
    }

    /// The wire form of a structure of `kind` the ESAPI allocated, which is then freed.
    fn marshal_and_free(&self, kind: &str, p: *mut c_void) -> Result<Zeroizing<Vec<u8>>, Error> {
        if p.is_null() {
            return Err(Error::Format(format!("the TSS returned no {kind}")));
        }
        let name = format!("Tss2_MU_{kind}_Marshal");
        let result = (|| {
            let f = symbol(&self.mu, &name)
                .ok_or_else(|| Error::Library(format!("libtss2-mu has no {name}")))?;
            // SAFETY: Tss2_MU_<kind>_Marshal(src, buffer, size, offset), per tss2_mu.h.
            let f: unsafe extern "C" fn(*const c_void, *mut u8, usize, *mut usize) -> Rc =
                unsafe { std::mem::transmute(f) };
            let mut buf = Zeroizing::new(vec![0u8; 8192]);
            let mut offset = 0usize;
            // SAFETY: `p` is a structure of `kind` the ESAPI returned; `buf` is writable
            // for its length, more than any such structure's wire form.
            let rc = unsafe { f(p, buf.as_mut_ptr(), buf.len(), &mut offset) };
            if rc != 0 {
                return Err(Error::Format(format!(
                    "{kind} cannot be marshalled (TSS error {rc:#x})"
                )));
            }
            buf.truncate(offset);
            Ok(buf)
        })();
        // Unsealed secrets pass through here: wipe the TSS's copy before freeing it. A
        // TPM2B_SENSITIVE_DATA is laid out as its wire form (a 16-bit size, the bytes).
        if kind == "TPM2B_SENSITIVE_DATA"
            && let Ok(w) = &result
        {
            // SAFETY: `p` is that structure, at least as large as its wire form.
            unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, w.len()) };
        }
        self.free(p);
        result
    }

    fn free(&self, p: *mut c_void) {
        // SAFETY: `p` was allocated by the ESAPI (calloc) and is not used after this.
        unsafe {
            match self.free {
                Some(f) => f(p),
                None => libc::free(p),
            }
        }
    }
}

fn check(call: &'static str, rc: Rc) -> Result<(), Error> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Command { call, rc })
    }
}

/// A connection to a TPM through the ESAPI. Not shared between threads (the ESAPI's
/// context is not thread-safe; the raw pointers keep this type `!Send` and `!Sync`).
pub struct Tpm {
    lib: &'static Lib,
    esys: Ctx,
    tcti: *mut c_void,
}

/// A transient object or session in the TPM, flushed when dropped (a TPM without a
/// resource manager, such as swtpm reached directly, holds only a few at once).
pub struct Object<'t> {
    tpm: &'t Tpm,
    tr: Tr,
    /// Persistent objects are only forgotten by the ESAPI, never flushed.
    persistent: bool,
}

/// An authorization session (HMAC or policy), flushed when dropped.
pub struct Session<'t>(Object<'t>);

impl Drop for Object<'_> {
    fn drop(&mut self) {
        let lib = self.tpm.lib;
        // SAFETY: the context is live (the Tpm outlives this) and `tr` one of its handles.
        unsafe {
            if self.persistent {
                (lib.tr_close)(self.tpm.esys, &mut self.tr);
            } else {
                (lib.flush_context)(self.tpm.esys, self.tr);
            }
        }
    }
}

impl Session<'_> {
    fn tr(&self) -> Tr {
        self.0.tr
    }
}

/// A session slot's handle: the session, or none.
fn slot(s: Option<&Session>) -> Tr {
    s.map_or(TR_NONE, Session::tr)
}

impl Tpm {
    /// Connects through the TCTI `tcti` (`device:/dev/tpmrm0`, `swtpm:host=...,port=...`;
    /// see [`crate::tcti_for`]).
    pub fn open(tcti: &str) -> Result<Tpm, Error> {
        let lib = Lib::get()?;
        let conf = CString::new(tcti).map_err(|_| Error::Format("a NUL in the TCTI".into()))?;
        let mut t: *mut c_void = std::ptr::null_mut();
        // SAFETY: `conf` is NUL-terminated; `t` receives the TCTI context.
        let rc = unsafe { (lib.tctildr_initialize)(conf.as_ptr(), &mut t) };
        if rc != 0 || t.is_null() {
            return Err(Error::Unreachable {
                tcti: tcti.to_owned(),
                rc,
            });
        }
        let mut esys: Ctx = std::ptr::null_mut();
        // SAFETY: `t` is a live TCTI context; a NULL ABI version means the library's own.
        let rc = unsafe { (lib.initialize)(&mut esys, t, std::ptr::null_mut()) };
        if rc != 0 {
            // SAFETY: `t` was initialised above and is not used after this.
            unsafe { (lib.tctildr_finalize)(&mut t) };
            return Err(Error::Command {
                call: "Esys_Initialize",
                rc,
            });
        }
        Ok(Tpm { lib, esys, tcti: t })
    }

    fn object(&self, tr: Tr) -> Object<'_> {
        Object {
            tpm: self,
            tr,
            persistent: false,
        }
    }

    /// Creates a primary key in the owner hierarchy from `template` (a `TPM2B_PUBLIC`),
    /// with an empty authorization value; `session` protects the command's parameters.
    pub fn create_primary(
        &self,
        template: &Wire,
        session: Option<&Session>,
    ) -> Result<Object<'_>, Error> {
        let public = self.lib.unmarshal("TPM2B_PUBLIC", &template.0)?;
        let sensitive = self.lib.unmarshal(
            "TPM2B_SENSITIVE_CREATE",
            &Wire::new().u16(4).u16(0).u16(0).0,
        )?;
        let outside = self.lib.unmarshal("TPM2B_DATA", &[0, 0])?;
        let creation = self.lib.unmarshal("TPML_PCR_SELECTION", &[0, 0, 0, 0])?;
        let mut tr = TR_NONE;
        let null = std::ptr::null_mut();
        // SAFETY: every input is an unmarshalled structure of the type the prototype
        // names; the optional outputs are not asked for (NULL).
        let rc = unsafe {
            (self.lib.create_primary)(
                self.esys,
                TR_RH_OWNER,
                TR_PASSWORD,
                slot(session),
                TR_NONE,
                sensitive.0.as_ptr().cast(),
                public.0.as_ptr().cast(),
                outside.0.as_ptr().cast(),
                creation.0.as_ptr().cast(),
                &mut tr,
                null,
                null,
                null,
                null,
            )
        };
        check("Esys_CreatePrimary", rc)?;
        Ok(self.object(tr))
    }

    /// A persistent key by its ESAPI serialization (`Esys_TR_Serialize`, as systemd 254+
    /// keeps its storage root key in `tpm2_srk`); the TPM checks it is still there.
    pub fn deserialize(&self, serialized: &[u8]) -> Result<Object<'_>, Error> {
        let mut tr = TR_NONE;
        // SAFETY: the buffer is `serialized`, of its length; `tr` receives the handle.
        let rc = unsafe {
            (self.lib.tr_deserialize)(self.esys, serialized.as_ptr(), serialized.len(), &mut tr)
        };
        check("Esys_TR_Deserialize", rc)?;
        Ok(Object {
            tpm: self,
            tr,
            persistent: true,
        })
    }

    /// Seals `data` under `parent` into a new object of `template` (a `TPM2B_PUBLIC`
    /// whose authPolicy holds the policy) with the authorization value `auth`. Returns
    /// the object's `TPM2B_PRIVATE` and `TPM2B_PUBLIC`, wire form.
    #[allow(clippy::type_complexity)]
    pub fn seal(
        &self,
        parent: &Object,
        template: &Wire,
        auth: &[u8],
        data: &[u8],
        session: Option<&Session>,
    ) -> Result<(Vec<u8>, Vec<u8>), Error> {
        let public = self.lib.unmarshal("TPM2B_PUBLIC", &template.0)?;
        let inner = Zeroizing::new(Wire::new().sized(auth).sized(data).0);
        let sensitive = Zeroizing::new(Wire::new().sized(&inner).0);
        let sensitive = self.lib.unmarshal("TPM2B_SENSITIVE_CREATE", &sensitive);
        let sensitive = sensitive?;
        let outside = self.lib.unmarshal("TPM2B_DATA", &[0, 0])?;
        let creation = self.lib.unmarshal("TPML_PCR_SELECTION", &[0, 0, 0, 0])?;
        let (mut private, mut out_public) = (std::ptr::null_mut(), std::ptr::null_mut());
        let null = std::ptr::null_mut();
        // SAFETY: as in `create_primary`; the two outputs asked for are allocated by the
        // ESAPI and freed by `marshal_and_free`.
        let rc = unsafe {
            (self.lib.create)(
                self.esys,
                parent.tr,
                TR_PASSWORD,
                slot(session),
                TR_NONE,
                sensitive.0.as_ptr().cast(),
                public.0.as_ptr().cast(),
                outside.0.as_ptr().cast(),
                creation.0.as_ptr().cast(),
                &mut private,
                &mut out_public,
                null,
                null,
                null,
            )
        };
        let mut wipe = sensitive;
        wipe.0.fill(0);
        check("Esys_Create", rc)?;
        let private = self.lib.marshal_and_free("TPM2B_PRIVATE", private);
        let public = self.lib.marshal_and_free("TPM2B_PUBLIC", out_public)?;
        Ok((private?.to_vec(), public.to_vec()))
    }

    /// Loads a sealed object (its `TPM2B_PRIVATE` and `TPM2B_PUBLIC`) under `parent`.
    pub fn load(
        &self,
        parent: &Object,
        private: &[u8],
        public: &[u8],
        session: Option<&Session>,
    ) -> Result<Object<'_>, Error> {
        let private = self.lib.unmarshal("TPM2B_PRIVATE", private)?;
        let public = self.lib.unmarshal("TPM2B_PUBLIC", public)?;
        let mut tr = TR_NONE;
        // SAFETY: unmarshalled inputs of the prototype's types; `tr` receives the handle.
        let rc = unsafe {
            (self.lib.load)(
                self.esys,
                parent.tr,
                TR_PASSWORD,
                slot(session),
                TR_NONE,
                private.0.as_ptr().cast(),
                public.0.as_ptr().cast(),
                &mut tr,
            )
        };
        check("Esys_Load", rc)?;
        Ok(self.object(tr))
    }

    /// Starts a session: `kind` 0 HMAC, 1 policy, 3 trial policy; salted with `salt_key`
    /// (its secret sent encrypted to that key) when given; `symmetric` a `TPMT_SYM_DEF`
    /// for parameter encryption; `hash` the session's hash. `attributes` are set on it
    /// (`TPMA_SESSION`: 0x01 continue, 0x20 decrypt, 0x40 encrypt).
    pub fn start_session(
        &self,
        salt_key: Option<&Object>,
        kind: u8,
        symmetric: &Wire,
        hash: u16,
        attributes: u8,
    ) -> Result<Session<'_>, Error> {
        let symmetric = self.lib.unmarshal("TPMT_SYM_DEF", &symmetric.0)?;
        let mut tr = TR_NONE;
        // SAFETY: an unmarshalled TPMT_SYM_DEF; a NULL caller nonce lets the ESAPI pick
        // one; `tr` receives the session.
        let rc = unsafe {
            (self.lib.start_auth_session)(
                self.esys,
                salt_key.map_or(TR_NONE, |k| k.tr),
                TR_NONE,
                TR_NONE,
                TR_NONE,
                TR_NONE,
                std::ptr::null(),
                kind,
                symmetric.0.as_ptr().cast(),
                hash,
                &mut tr,
            )
        };
        check("Esys_StartAuthSession", rc)?;
        let session = Session(self.object(tr));
        // SAFETY: a live session of this context.
        let rc = unsafe { (self.lib.trsess_set_attributes)(self.esys, tr, attributes, 0xff) };
        check("Esys_TRSess_SetAttributes", rc)?;
        Ok(session)
    }

    /// Extends the policy of `policy` with PolicyPCR over `selection` (a
    /// `TPML_PCR_SELECTION`), their current values (an empty digest) unless `digest` is
    /// given.
    pub fn policy_pcr(
        &self,
        policy: &Session,
        digest: &[u8],
        selection: &Wire,
        session: Option<&Session>,
    ) -> Result<(), Error> {
        let digest = self
            .lib
            .unmarshal("TPM2B_DIGEST", &Wire::new().sized(digest).0)?;
        let selection = self.lib.unmarshal("TPML_PCR_SELECTION", &selection.0)?;
        // SAFETY: unmarshalled inputs of the prototype's types.
        let rc = unsafe {
            (self.lib.policy_pcr)(
                self.esys,
                policy.tr(),
                slot(session),
                TR_NONE,
                TR_NONE,
                digest.0.as_ptr().cast(),
                selection.0.as_ptr().cast(),
            )
        };
        check("Esys_PolicyPCR", rc)
    }

    /// Extends the policy of `policy` with PolicyAuthValue (the object's authorization
    /// value, e.g. a PIN, must be shown).
    pub fn policy_auth_value(
        &self,
        policy: &Session,
        session: Option<&Session>,
    ) -> Result<(), Error> {
        // SAFETY: a live policy session of this context.
        let rc = unsafe {
            (self.lib.policy_auth_value)(self.esys, policy.tr(), slot(session), TR_NONE, TR_NONE)
        };
        check("Esys_PolicyAuthValue", rc)
    }

    /// The policy digest `policy` has reached.
    pub fn policy_digest(&self, policy: &Session) -> Result<Vec<u8>, Error> {
        let mut out = std::ptr::null_mut();
        // SAFETY: a live session; `out` receives an ESAPI-allocated TPM2B_DIGEST.
        let rc = unsafe {
            (self.lib.policy_get_digest)(
                self.esys,
                policy.tr(),
                TR_NONE,
                TR_NONE,
                TR_NONE,
                &mut out,
            )
        };
        check("Esys_PolicyGetDigest", rc)?;
        let w = self.lib.marshal_and_free("TPM2B_DIGEST", out)?;
        Ok(w.get(2..).unwrap_or_default().to_vec())
    }

    /// Loads the public part of a key (a `TPM2B_PUBLIC`, no private part) in the owner
    /// hierarchy, as systemd loads the key that signs its PCR policies. Returns it and its
    /// name (`TPM2B_NAME`'s bytes: the name hash's id, then the hash of the public area).
    pub fn load_external(&self, public: &Wire) -> Result<(Object<'_>, Vec<u8>), Error> {
        let public = self.lib.unmarshal("TPM2B_PUBLIC", &public.0)?;
        let mut tr = TR_NONE;
        // SAFETY: an unmarshalled TPM2B_PUBLIC; no private part (NULL); tpm2-tss 3.x takes
        // the hierarchy as an ESYS_TR; `tr` receives the handle.
        let rc = unsafe {
            (self.lib.load_external)(
                self.esys,
                TR_NONE,
                TR_NONE,
                TR_NONE,
                std::ptr::null(),
                public.0.as_ptr().cast(),
                TR_RH_OWNER,
                &mut tr,
            )
        };
        check("Esys_LoadExternal", rc)?;
        let key = self.object(tr);
        let mut name = std::ptr::null_mut();
        // SAFETY: a live handle of this context; `name` receives an ESAPI-allocated
        // TPM2B_NAME.
        let rc = unsafe { (self.lib.tr_get_name)(self.esys, key.tr, &mut name) };
        check("Esys_TR_GetName", rc)?;
        let name = self.lib.marshal_and_free("TPM2B_NAME", name)?;
        Ok((key, name.get(2..).unwrap_or_default().to_vec()))
    }

    /// Has the TPM check `signature` (a `TPMT_SIGNATURE`) of `digest` by `key`; returns
    /// the ticket that says it did (`TPMT_TK_VERIFIED`, wire form), for PolicyAuthorize.
    pub fn verify_signature(
        &self,
        key: &Object,
        digest: &[u8],
        signature: &Wire,
    ) -> Result<Vec<u8>, Error> {
        let digest = self
            .lib
            .unmarshal("TPM2B_DIGEST", &Wire::new().sized(digest).0)?;
        let signature = self.lib.unmarshal("TPMT_SIGNATURE", &signature.0)?;
        let mut ticket = std::ptr::null_mut();
        // SAFETY: unmarshalled inputs of the prototype's types; `ticket` receives an
        // ESAPI-allocated TPMT_TK_VERIFIED.
        let rc = unsafe {
            (self.lib.verify_signature)(
                self.esys,
                key.tr,
                TR_NONE,
                TR_NONE,
                TR_NONE,
                digest.0.as_ptr().cast(),
                signature.0.as_ptr().cast(),
                &mut ticket,
            )
        };
        check("Esys_VerifySignature", rc)?;
        Ok(self
            .lib
            .marshal_and_free("TPMT_TK_VERIFIED", ticket)?
            .to_vec())
    }

    /// Extends the policy of `policy` with PolicyAuthorize: the session's digest so far
    /// must be `approved`, signed by the key named `key_name` (the `ticket` from
    /// [`Tpm::verify_signature`]; in a trial session an empty ticket does), with an empty
    /// policyRef.
    pub fn policy_authorize(
        &self,
        policy: &Session,
        approved: &[u8],
        key_name: &[u8],
        ticket: &[u8],
    ) -> Result<(), Error> {
        let approved = self
            .lib
            .unmarshal("TPM2B_DIGEST", &Wire::new().sized(approved).0)?;
        let reference = self.lib.unmarshal("TPM2B_NONCE", &[0, 0])?;
        let name = self
            .lib
            .unmarshal("TPM2B_NAME", &Wire::new().sized(key_name).0)?;
        let ticket = self.lib.unmarshal("TPMT_TK_VERIFIED", ticket)?;
        // SAFETY: unmarshalled inputs of the prototype's types.
        let rc = unsafe {
            (self.lib.policy_authorize)(
                self.esys,
                policy.tr(),
                TR_NONE,
                TR_NONE,
                TR_NONE,
                approved.0.as_ptr().cast(),
                reference.0.as_ptr().cast(),
                name.0.as_ptr().cast(),
                ticket.0.as_ptr().cast(),
            )
        };
        check("Esys_PolicyAuthorize", rc)
    }

    /// The authorization value (a PIN's hash) the next commands show for `object`.
    pub fn set_auth(&self, object: &Object, auth: &[u8]) -> Result<(), Error> {
        let auth = Zeroizing::new(Wire::new().sized(auth).0);
        let mut value = self.lib.unmarshal("TPM2B_AUTH", &auth)?;
        // SAFETY: an unmarshalled TPM2B_AUTH; the ESAPI copies it.
        let rc = unsafe { (self.lib.tr_set_auth)(self.esys, object.tr, value.0.as_ptr().cast()) };
        value.0.fill(0);
        check("Esys_TR_SetAuth", rc)
    }

    /// Unseals `object`, authorised by `policy` (or its authorization value when
    /// `None`); `session` protects the result on its way (response encryption).
    pub fn unseal(
        &self,
        object: &Object,
        policy: Option<&Session>,
        session: Option<&Session>,
    ) -> Result<Zeroizing<Vec<u8>>, Error> {
        let mut out = std::ptr::null_mut();
        let auth = policy.map_or(TR_PASSWORD, Session::tr);
        // SAFETY: live handles of this context; `out` receives an ESAPI-allocated
        // TPM2B_SENSITIVE_DATA.
        let rc = unsafe {
            (self.lib.unseal)(self.esys, object.tr, auth, slot(session), TR_NONE, &mut out)
        };
        check("Esys_Unseal", rc)?;
        let w = self.lib.marshal_and_free("TPM2B_SENSITIVE_DATA", out)?;
        Ok(Zeroizing::new(w.get(2..).unwrap_or_default().to_vec()))
    }
}

impl Drop for Tpm {
    fn drop(&mut self) {
        // SAFETY: the contexts were initialised in `open`, every Object borrowing this is
        // gone, and neither is used after this.
        unsafe {
            (self.lib.finalize)(&mut self.esys);
            (self.lib.tctildr_finalize)(&mut self.tcti);
        }
    }
}
