//! Shared libraries loaded at run time rather than linked: librbd, the TPM2 software
//! stack, p11-kit and libfido2 are each needed by one feature only, so cryptblk builds
//! and runs on a machine without them and says what to install when a feature needs one.
//! A library stays loaded for the life of the process (its function pointers are kept in
//! statics).

// dlopen/dlsym: every block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_void};

/// A loaded shared library.
#[derive(Debug, Clone, Copy)]
pub struct Library(*mut c_void);

// SAFETY: a dlopen handle is process-wide; dlsym may be called on it from any thread.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

/// Where a loaded library's symbols are visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// To this handle only (RTLD_LOCAL).
    Local,
    /// To libraries loaded later too (RTLD_GLOBAL: librados' plugins need it).
    Global,
}

impl Library {
    /// Loads `name` (a soname such as `libfido2.so.1`, or a path), running its
    /// initialisers as linking it would. The error names the library and says why
    /// (`dlerror`); the caller adds what to install.
    pub fn open(name: &CStr, scope: Scope) -> Result<Library, String> {
        let flags = libc::RTLD_NOW
            | match scope {
                Scope::Local => libc::RTLD_LOCAL,
                Scope::Global => libc::RTLD_GLOBAL,
            };
        // SAFETY: `name` is NUL-terminated; the library's initialisers run as they would
        // at program start had it been linked.
        let h = unsafe { libc::dlopen(name.as_ptr(), flags) };
        if h.is_null() {
            Err(format!(
                "{} cannot be loaded ({})",
                name.to_string_lossy(),
                dlerror()
            ))
        } else {
            Ok(Library(h))
        }
    }

    /// The address of `name` in this library, if it has one. Turning it into a function
    /// pointer of the right type is the caller's (unsafe) part.
    pub fn symbol(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: the handle is a loaded library (never closed) and `name` NUL-terminated.
        let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc, read at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_libc_and_finds_a_symbol_and_names_what_is_missing() {
        let c = Library::open(c"libc.so.6", Scope::Local).unwrap();
        assert!(c.symbol(c"getpid").is_some());
        assert!(c.symbol(c"no_such_function_here").is_none());
        let e = Library::open(c"libcryptblk-none.so.9", Scope::Local).unwrap_err();
        assert!(
            e.starts_with("libcryptblk-none.so.9 cannot be loaded ("),
            "{e}"
        );
    }
}
