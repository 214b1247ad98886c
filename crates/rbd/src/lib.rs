//! Ceph RBD images as [`Storage`]: a volume's ciphertext on a Ceph cluster, encrypted and
//! decrypted on this host, so the cluster only ever sees ciphertext.
//!
//! librbd and librados are loaded when the first image is opened (`dlopen`), not linked:
//! cryptblk builds and runs without Ceph's libraries, and says which package to install
//! when an `rbd:` device is used without them. Every request goes through librbd's
//! asynchronous API (`rbd_aio_*`) from the thread that made it, so as many requests are in
//! flight as frontend threads wait on them.
//!
//! A read-write open takes the image's exclusive lock (`rbd_lock_acquire`) when the image
//! has the exclusive-lock feature, and keeps it until closed: a second writer (another
//! cryptblk, a QEMU with the image attached) is refused instead of taking the lock over.

// FFI to librbd/librados: every block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io;
use std::path::PathBuf;
use std::sync::{OnceLock, RwLock};

use cryptblk_device::Storage;
use cryptblk_dl::{Library, Scope};

/// `rbd:POOL/IMAGE[@SNAP]`: an image (or a snapshot of one, read-only) in a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    /// The pool.
    pub pool: String,
    /// The image.
    pub image: String,
    /// A snapshot, opened read-only.
    pub snap: Option<String>,
}

impl RbdSpec {
    /// Whether `s` is meant as an RBD image (`rbd:...`): never taken as a file name.
    pub fn is_spec(s: &str) -> bool {
        s.starts_with("rbd:")
    }

    /// Parses `rbd:POOL/IMAGE[@SNAP]`.
    pub fn parse(s: &str) -> io::Result<RbdSpec> {
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{s}: not a usable RBD image name ({why}; rbd:POOL/IMAGE[@SNAP])"),
            )
        };
        let rest = s
            .strip_prefix("rbd:")
            .ok_or_else(|| bad("no rbd: prefix"))?;
        let (pool, image) = rest.split_once('/').ok_or_else(|| bad("no pool"))?;
        let (image, snap) = match image.split_once('@') {
            Some((i, sn)) => (i, Some(sn.to_string())),
            None => (image, None),
        };
        let ok = |x: &str| !x.is_empty() && !x.contains(['/', '@', '\0']);
        if !ok(pool) || !ok(image) || snap.as_deref().is_some_and(|sn| !ok(sn)) {
            return Err(bad("empty or malformed part"));
        }
        Ok(RbdSpec {
            pool: pool.into(),
            image: image.into(),
            snap,
        })
    }
}

impl std::fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rbd:{}/{}", self.pool, self.image)?;
        if let Some(s) = &self.snap {
            write!(f, "@{s}")?;
        }
        Ok(())
    }
}

/// Which cluster, as whom, and how.
#[derive(Debug, Clone, Default)]
pub struct RbdOptions {
    /// The cluster's configuration file (default: librados' search, `CEPH_CONF` first).
    pub conf: Option<PathBuf>,
    /// The client id (`admin` when not given), as `rbd --id`.
    pub id: Option<String>,
    /// Open read-only (no lock taken).
    pub read_only: bool,
}

/// How long connecting to the cluster may take before it is reported unreachable (librados
/// waits 300 s by default).
const CONNECT_TIMEOUT_S: &str = "20";

type RadosCreate = unsafe extern "C" fn(*mut *mut c_void, *const c_char) -> c_int;
type RadosConfReadFile = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;
type RadosConfSet = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> c_int;
type RadosConnect = unsafe extern "C" fn(*mut c_void) -> c_int;
type RadosShutdown = unsafe extern "C" fn(*mut c_void);
type RadosIoctxCreate = unsafe extern "C" fn(*mut c_void, *const c_char, *mut *mut c_void) -> c_int;
type RadosIoctxDestroy = unsafe extern "C" fn(*mut c_void);
type RbdOpen =
    unsafe extern "C" fn(*mut c_void, *const c_char, *mut *mut c_void, *const c_char) -> c_int;
type RbdClose = unsafe extern "C" fn(*mut c_void) -> c_int;
type RbdStat = unsafe extern "C" fn(*mut c_void, *mut RbdImageInfo, usize) -> c_int;
type RbdGetFeatures = unsafe extern "C" fn(*mut c_void, *mut u64) -> c_int;
type RbdLockAcquire = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
type RbdCallback = Option<unsafe extern "C" fn(*mut c_void, *mut c_void)>;
type RbdAioCreateCompletion =
    unsafe extern "C" fn(*mut c_void, RbdCallback, *mut *mut c_void) -> c_int;
type RbdAioRead = unsafe extern "C" fn(*mut c_void, u64, usize, *mut c_char, *mut c_void) -> c_int;
type RbdAioWrite =
    unsafe extern "C" fn(*mut c_void, u64, usize, *const c_char, *mut c_void) -> c_int;
type RbdAioWriteZeroes =
    unsafe extern "C" fn(*mut c_void, u64, usize, *mut c_void, c_int, c_int) -> c_int;
type RbdAioFlush = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type RbdAioWait = unsafe extern "C" fn(*mut c_void) -> c_int;
type RbdAioReturn = unsafe extern "C" fn(*mut c_void) -> isize;
type RbdAioRelease = unsafe extern "C" fn(*mut c_void);
type RbdEncryption = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, usize) -> c_int;

/// `rbd_encryption_luks1_format_options_t` and `..._luks2_...` (the same layout).
#[repr(C)]
struct RbdLuksOptions {
    alg: c_int,
    passphrase: *const c_char,
    passphrase_size: usize,
}

/// `RBD_ENCRYPTION_ALGORITHM_AES256`.
const ENCRYPTION_AES256: c_int = 1;

/// librbd's own client-side encryption (`rbd encryption format`, Ceph 16+): images it
/// formats are LUKS volumes that cryptblk opens itself. Reaching an image through it is
/// for comparing with it and for checking that the two agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibrbdLuks {
    /// `RBD_ENCRYPTION_FORMAT_LUKS1`.
    Luks1,
    /// `RBD_ENCRYPTION_FORMAT_LUKS2`.
    Luks2,
}

impl LibrbdLuks {
    fn format(self) -> c_int {
        match self {
            LibrbdLuks::Luks1 => 0,
            LibrbdLuks::Luks2 => 1,
        }
    }
}

/// `rbd_image_info_t` (librbd.h).
#[repr(C)]
struct RbdImageInfo {
    size: u64,
    obj_size: u64,
    num_objs: u64,
    order: c_int,
    block_name_prefix: [c_char; 24],
    parent_pool: i64,
    parent_name: [c_char; 96],
}

/// `RBD_FEATURE_EXCLUSIVE_LOCK`.
const FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;
/// `RBD_LOCK_MODE_EXCLUSIVE`.
const LOCK_MODE_EXCLUSIVE: c_int = 0;

/// The functions of librados and librbd this crate calls.
struct Lib {
    rados_create: RadosCreate,
    rados_conf_read_file: RadosConfReadFile,
    rados_conf_set: RadosConfSet,
    rados_connect: RadosConnect,
    rados_shutdown: RadosShutdown,
    rados_ioctx_create: RadosIoctxCreate,
    rados_ioctx_destroy: RadosIoctxDestroy,
    rbd_open: RbdOpen,
    rbd_open_read_only: RbdOpen,
    rbd_close: RbdClose,
    rbd_stat: RbdStat,
    rbd_get_features: RbdGetFeatures,
    rbd_lock_acquire: RbdLockAcquire,
    rbd_aio_create_completion: RbdAioCreateCompletion,
    rbd_aio_read: RbdAioRead,
    rbd_aio_write: RbdAioWrite,
    rbd_aio_write_zeroes: RbdAioWriteZeroes,
    rbd_aio_flush: RbdAioFlush,
    rbd_aio_wait_for_complete: RbdAioWait,
    rbd_aio_get_return_value: RbdAioReturn,
    rbd_aio_release: RbdAioRelease,
    /// Client-side encryption: Ceph 16 and later only, so optional (looked up with the
    /// rest; only a call that needs them fails without them).
    rbd_encryption_format: Option<RbdEncryption>,
    rbd_encryption_load: Option<RbdEncryption>,
}

fn open_lib(name: &CStr) -> Result<Library, String> {
    // Global: librados loads plugins of its own that look up its symbols.
    Library::open(name, Scope::Global).map_err(|e| {
        format!("{e}: install Ceph's client libraries (Debian: apt-get install librbd1)")
    })
}

impl Lib {
    fn load() -> Result<Lib, String> {
        let rados = open_lib(c"librados.so.2")?;
        let rbd = open_lib(c"librbd.so.1")?;
        macro_rules! optional_sym {
            ($h:expr, $name:literal, $t:ty) => {{
                let name = CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes())
                    .expect("a NUL-terminated name");
                let p = $h.symbol(name);
                // SAFETY: the symbol is the C function of that name, whose prototype in
                // librados.h / librbd.h (Ceph 16+) the target type spells out.
                p.map(|p| unsafe { std::mem::transmute::<*mut c_void, $t>(p) })
            }};
        }
        macro_rules! sym {
            ($h:expr, $name:literal, $t:ty) => {{
                match optional_sym!($h, $name, $t) {
                    Some(f) => f,
                    None => {
                        return Err(format!(
                            "{} has no {}: too old a Ceph",
                            stringify!($h),
                            $name
                        ));
                    }
                }
            }};
        }
        Ok(Lib {
            rados_create: sym!(rados, "rados_create", RadosCreate),
            rados_conf_read_file: sym!(rados, "rados_conf_read_file", RadosConfReadFile),
            rados_conf_set: sym!(rados, "rados_conf_set", RadosConfSet),
            rados_connect: sym!(rados, "rados_connect", RadosConnect),
            rados_shutdown: sym!(rados, "rados_shutdown", RadosShutdown),
            rados_ioctx_create: sym!(rados, "rados_ioctx_create", RadosIoctxCreate),
            rados_ioctx_destroy: sym!(rados, "rados_ioctx_destroy", RadosIoctxDestroy),
            rbd_open: sym!(rbd, "rbd_open", RbdOpen),
            rbd_open_read_only: sym!(rbd, "rbd_open_read_only", RbdOpen),
            rbd_close: sym!(rbd, "rbd_close", RbdClose),
            rbd_stat: sym!(rbd, "rbd_stat", RbdStat),
            rbd_get_features: sym!(rbd, "rbd_get_features", RbdGetFeatures),
            rbd_lock_acquire: sym!(rbd, "rbd_lock_acquire", RbdLockAcquire),
            rbd_aio_create_completion: sym!(
                rbd,
                "rbd_aio_create_completion",
                RbdAioCreateCompletion
            ),
            rbd_aio_read: sym!(rbd, "rbd_aio_read", RbdAioRead),
            rbd_aio_write: sym!(rbd, "rbd_aio_write", RbdAioWrite),
            rbd_aio_write_zeroes: sym!(rbd, "rbd_aio_write_zeroes", RbdAioWriteZeroes),
            rbd_aio_flush: sym!(rbd, "rbd_aio_flush", RbdAioFlush),
            rbd_aio_wait_for_complete: sym!(rbd, "rbd_aio_wait_for_complete", RbdAioWait),
            rbd_aio_get_return_value: sym!(rbd, "rbd_aio_get_return_value", RbdAioReturn),
            rbd_aio_release: sym!(rbd, "rbd_aio_release", RbdAioRelease),
            rbd_encryption_format: optional_sym!(rbd, "rbd_encryption_format", RbdEncryption),
            rbd_encryption_load: optional_sym!(rbd, "rbd_encryption_load", RbdEncryption),
        })
    }
}

fn lib() -> io::Result<&'static Lib> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(Lib::load)
        .as_ref()
        .map_err(|e| io::Error::new(io::ErrorKind::Unsupported, e.clone()))
}

/// A negative errno from librados/librbd as an `io::Error` saying what failed.
fn errno(r: c_int, what: impl std::fmt::Display) -> io::Error {
    let e = io::Error::from_raw_os_error(-r);
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

/// An open RBD image.
pub struct RbdStorage {
    lib: &'static Lib,
    cluster: *mut c_void,
    ioctx: *mut c_void,
    image: *mut c_void,
    spec: RbdSpec,
    size: u64,
    object_size: u64,
    read_only: bool,
    /// True until [`Storage::close`] closes the handles: each operation holds it shared
    /// while it uses them, so they are never closed under one.
    live: RwLock<bool>,
}

// SAFETY: librados cluster and io-context handles and librbd image handles may be used from
// any thread, and concurrently (librbd serialises what needs it internally); the handles
// are closed once, by `close` (or Drop), with `live` held alone: no operation uses them then
// or after.
unsafe impl Send for RbdStorage {}
// SAFETY: as above: every method takes &self and calls librbd's thread-safe entry points.
unsafe impl Sync for RbdStorage {}

/// Closes what was opened so far if `open` fails midway.
struct Partial<'a> {
    lib: &'a Lib,
    cluster: *mut c_void,
    ioctx: *mut c_void,
    image: *mut c_void,
}

impl Drop for Partial<'_> {
    fn drop(&mut self) {
        // SAFETY: each handle is null or was returned by the matching create/open call and
        // is closed once, in the reverse order of opening.
        unsafe {
            if !self.image.is_null() {
                (self.lib.rbd_close)(self.image);
            }
            if !self.ioctx.is_null() {
                (self.lib.rados_ioctx_destroy)(self.ioctx);
            }
            if !self.cluster.is_null() {
                (self.lib.rados_shutdown)(self.cluster);
            }
        }
    }
}

impl RbdStorage {
    /// Connects to the cluster and opens the image (read-write under its exclusive lock,
    /// unless `options.read_only` or a snapshot is named).
    pub fn open(spec: &RbdSpec, options: &RbdOptions) -> io::Result<RbdStorage> {
        Self::open_as(spec, options, None)
    }

    /// Opens an image formatted with librbd's own encryption through it
    /// (`rbd_encryption_load`): librbd decrypts what is read and encrypts what is
    /// written, and the size is what its LUKS header leaves for data. cryptblk serves
    /// such images with its own engine (open them with [`RbdStorage::open`]); this is
    /// how librbd's encryption is measured beside it, and checked against it.
    pub fn open_through_librbd_encryption(
        spec: &RbdSpec,
        options: &RbdOptions,
        luks: LibrbdLuks,
        passphrase: &[u8],
    ) -> io::Result<RbdStorage> {
        Self::open_as(spec, options, Some((luks, passphrase)))
    }

    /// Formats an image with librbd's own encryption (AES-256), as `rbd encryption
    /// format` does (which Ceph 16's `rbd` tool lacks).
    pub fn librbd_encryption_format(
        spec: &RbdSpec,
        options: &RbdOptions,
        luks: LibrbdLuks,
        passphrase: &[u8],
    ) -> io::Result<()> {
        let st = Self::open(spec, options)?;
        st.librbd_encryption(st.lib.rbd_encryption_format, "format", luks, passphrase)?;
        st.close()
    }

    /// Calls `rbd_encryption_format` or `rbd_encryption_load` (`f`) on the open image.
    fn librbd_encryption(
        &self,
        f: Option<RbdEncryption>,
        what: &str,
        luks: LibrbdLuks,
        passphrase: &[u8],
    ) -> io::Result<()> {
        let f = f.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "this librbd has no client-side encryption (Ceph 16 or later has)",
            )
        })?;
        let mut o = RbdLuksOptions {
            alg: ENCRYPTION_AES256,
            passphrase: passphrase.as_ptr().cast(),
            passphrase_size: passphrase.len(),
        };
        // SAFETY: an open image; `o` is the options struct of that format, its passphrase
        // `passphrase_size` readable bytes, all borrowed for the call only.
        let r = unsafe {
            f(
                self.image,
                luks.format(),
                (&raw mut o).cast(),
                std::mem::size_of::<RbdLuksOptions>(),
            )
        };
        if r < 0 {
            return Err(errno(
                r,
                format_args!("librbd encryption {what} on {}", self.spec),
            ));
        }
        Ok(())
    }

    fn open_as(
        spec: &RbdSpec,
        options: &RbdOptions,
        load: Option<(LibrbdLuks, &[u8])>,
    ) -> io::Result<RbdStorage> {
        let lib = lib()?;
        let read_only = options.read_only || spec.snap.is_some();
        let mut p = Partial {
            lib,
            cluster: std::ptr::null_mut(),
            ioctx: std::ptr::null_mut(),
            image: std::ptr::null_mut(),
        };
        let id = options.id.as_deref().map(cstring).transpose()?;
        // SAFETY: `p.cluster` is written by rados_create; `id` is NUL-terminated or null.
        let r = unsafe {
            (lib.rados_create)(
                &mut p.cluster,
                id.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            return Err(errno(r, "creating a Ceph client"));
        }
        let conf = match &options.conf {
            Some(c) => Some(cstring(&c.to_string_lossy())?),
            None => None,
        };
        // SAFETY: a created, unconnected cluster handle; the path is NUL-terminated or null
        // (librados then searches CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf).
        let r = unsafe {
            (lib.rados_conf_read_file)(
                p.cluster,
                conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            let what = match &options.conf {
                Some(c) => format!("reading the Ceph configuration {}", c.display()),
                None => "no Ceph configuration found (set CEPH_CONF or --ceph-conf)".into(),
            };
            return Err(errno(r, what));
        }
        for (k, v) in [
            (c"client_mount_timeout", CONNECT_TIMEOUT_S),
            (c"rados_mon_op_timeout", CONNECT_TIMEOUT_S),
        ] {
            let v = cstring(v)?;
            // SAFETY: as above; both strings NUL-terminated. A failure leaves the default.
            unsafe { (lib.rados_conf_set)(p.cluster, k.as_ptr(), v.as_ptr()) };
        }
        // SAFETY: a configured cluster handle.
        let r = unsafe { (lib.rados_connect)(p.cluster) };
        if r < 0 {
            let e = errno(r, "connecting to the Ceph cluster");
            // Unreachable monitors come back as a timeout; say so plainly.
            return Err(io::Error::new(
                if r == -libc::ETIMEDOUT {
                    io::ErrorKind::TimedOut
                } else {
                    e.kind()
                },
                e.to_string(),
            ));
        }
        let pool = cstring(&spec.pool)?;
        // SAFETY: a connected cluster; `p.ioctx` is written on success.
        let r = unsafe { (lib.rados_ioctx_create)(p.cluster, pool.as_ptr(), &mut p.ioctx) };
        if r < 0 {
            return Err(errno(r, format_args!("pool {}", spec.pool)));
        }
        let image = cstring(&spec.image)?;
        let snap = spec.snap.as_deref().map(cstring).transpose()?;
        let open = if read_only {
            lib.rbd_open_read_only
        } else {
            lib.rbd_open
        };
        // SAFETY: a valid io context; names NUL-terminated (the snapshot or null);
        // `p.image` is written on success.
        let r = unsafe {
            open(
                p.ioctx,
                image.as_ptr(),
                &mut p.image,
                snap.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            )
        };
        if r < 0 {
            return Err(errno(r, format_args!("image {spec}")));
        }
        let mut features = 0u64;
        // SAFETY: an open image; `features` is written.
        let r = unsafe { (lib.rbd_get_features)(p.image, &mut features) };
        if r < 0 {
            return Err(errno(r, format_args!("features of {spec}")));
        }
        if !read_only && features & FEATURE_EXCLUSIVE_LOCK != 0 {
            // SAFETY: an open image.
            let r = unsafe { (lib.rbd_lock_acquire)(p.image, LOCK_MODE_EXCLUSIVE) };
            if r < 0 {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "{spec} is locked by another client (its exclusive lock could not be taken: {})",
                        io::Error::from_raw_os_error(-r)
                    ),
                ));
            }
        }
        let mut st = RbdStorage {
            lib,
            cluster: p.cluster,
            ioctx: p.ioctx,
            image: p.image,
            spec: spec.clone(),
            size: 0,
            object_size: 512,
            read_only,
            live: RwLock::new(true),
        };
        // Owned by `st` now (closed when it drops).
        std::mem::forget(p);
        if let Some((luks, passphrase)) = load {
            st.librbd_encryption(lib.rbd_encryption_load, "load", luks, passphrase)?;
        }
        // SAFETY: all-zero is a valid rbd_image_info_t (integers and char arrays).
        let mut info: RbdImageInfo = unsafe { std::mem::zeroed() };
        // SAFETY: an open image; `info` is a writable rbd_image_info_t of the size given.
        let r = unsafe { (lib.rbd_stat)(st.image, &mut info, std::mem::size_of::<RbdImageInfo>()) };
        if r < 0 {
            return Err(errno(r, format_args!("size of {spec}")));
        }
        st.size = info.size;
        st.object_size = info.obj_size.max(512);
        Ok(st)
    }

    /// The image's object size (4 MiB by default): formats align the data to it, as
    /// librbd's own encryption does.
    pub fn object_size(&self) -> u64 {
        self.object_size
    }

    /// Runs one asynchronous librbd operation that `submit` starts on a fresh completion,
    /// and waits for it; its return value (bytes for reads) or the error.
    fn aio(
        &self,
        what: &str,
        offset: u64,
        submit: impl FnOnce(*mut c_void) -> c_int,
    ) -> io::Result<isize> {
        // Held until librbd is done: `close` waits for it.
        let live = self.live.read().unwrap_or_else(|e| e.into_inner());
        if !*live {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("{}: {what} after the image was closed", self.spec),
            ));
        }
        let mut c: *mut c_void = std::ptr::null_mut();
        // SAFETY: no argument and no callback; `c` is written on success.
        let r = unsafe { (self.lib.rbd_aio_create_completion)(std::ptr::null_mut(), None, &mut c) };
        if r < 0 {
            return Err(errno(r, "librbd completion"));
        }
        let r = submit(c);
        let ret = if r < 0 {
            r as isize
        } else {
            // SAFETY: `c` was submitted; waiting for it is what keeps the caller's buffer
            // borrowed until librbd is done with it.
            unsafe {
                (self.lib.rbd_aio_wait_for_complete)(c);
                (self.lib.rbd_aio_get_return_value)(c)
            }
        };
        // SAFETY: `c` is complete (or was never submitted) and released once.
        unsafe { (self.lib.rbd_aio_release)(c) };
        if ret < 0 {
            return Err(errno(
                ret as c_int,
                format_args!("{} {what} at {offset}", self.spec),
            ));
        }
        Ok(ret)
    }

    fn check(&self, offset: u64, len: u64) -> io::Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: {len} bytes at {offset} are past the image's end ({})",
                    self.spec, self.size
                ),
            ));
        }
        Ok(())
    }

    fn writable(&self) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        Ok(())
    }
}

impl Drop for RbdStorage {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Storage for RbdStorage {
    fn size(&self) -> io::Result<u64> {
        Ok(self.size)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len() as u64)?;
        let (img, len, ptr) = (self.image, buf.len(), buf.as_mut_ptr());
        // SAFETY: `ptr` is `len` writable bytes that stay borrowed until `aio` returns,
        // which is after the read completed.
        let n = self.aio("read", offset, |c| unsafe {
            (self.lib.rbd_aio_read)(img, offset, len, ptr.cast(), c)
        })?;
        if n as usize != len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: short read at {offset}", self.spec),
            ));
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writable()?;
        self.check(offset, buf.len() as u64)?;
        let (img, len, ptr) = (self.image, buf.len(), buf.as_ptr());
        // SAFETY: `ptr` is `len` readable bytes borrowed until the write completed.
        self.aio("write", offset, |c| unsafe {
            (self.lib.rbd_aio_write)(img, offset, len, ptr.cast(), c)
        })?;
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.read_only {
            return Ok(());
        }
        let img = self.image;
        // SAFETY: an open image and a fresh completion.
        self.aio("flush", 0, |c| unsafe { (self.lib.rbd_aio_flush)(img, c) })?;
        Ok(())
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writable()?;
        self.check(offset, len)?;
        let img = self.image;
        let mut off = offset;
        while off < offset + len {
            let n = (offset + len - off).min(1 << 30) as usize;
            // Zeros, deallocating whole objects where it can (no THICK_PROVISION flag).
            // SAFETY: an open image and a fresh completion; no buffer.
            self.aio("write-zeroes", off, |c| unsafe {
                (self.lib.rbd_aio_write_zeroes)(img, off, n, c, 0, 0)
            })?;
            off += n as u64;
        }
        Ok(())
    }

    fn alignment(&self) -> Option<u64> {
        Some(self.object_size)
    }

    fn close(&self) -> io::Result<()> {
        let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
        if !std::mem::replace(&mut *live, false) {
            return Ok(());
        }
        // Closing the image flushes it and releases its lock and watch; then the io context
        // and the cluster handle go. No operation runs (each holds `live` shared) and none
        // starts after this (each checks it), so each handle is closed once, unused.
        // SAFETY: an open image handle, closed here only.
        let r = unsafe { (self.lib.rbd_close)(self.image) };
        drop(Partial {
            lib: self.lib,
            cluster: self.cluster,
            ioctx: self.ioctx,
            image: std::ptr::null_mut(),
        });
        if r < 0 {
            return Err(errno(r, format_args!("closing {}", self.spec)));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "rbd, {}, {} KiB objects{}",
            self.spec,
            self.object_size >> 10,
            if self.read_only {
                ", read-only"
            } else {
                ", exclusive lock"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let s = RbdSpec::parse("rbd:rbd/disk1").unwrap();
        assert_eq!(
            (s.pool.as_str(), s.image.as_str(), s.snap),
            ("rbd", "disk1", None)
        );
        let s = RbdSpec::parse("rbd:pool/img@snap1").unwrap();
        assert_eq!(s.snap.as_deref(), Some("snap1"));
        assert_eq!(s.to_string(), "rbd:pool/img@snap1");
        for bad in [
            "rbd:",
            "rbd:pool",
            "rbd:/img",
            "rbd:pool/",
            "rbd:p/i@",
            "rbd:p/i/j",
            "rbd:p/i@a@b",
        ] {
            assert!(RbdSpec::parse(bad).is_err(), "{bad}");
        }
        assert!(RbdSpec::is_spec("rbd:p/i"));
        assert!(!RbdSpec::is_spec("rbd.img"));
    }
}
