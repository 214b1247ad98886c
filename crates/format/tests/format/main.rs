//! On-disk formats against cryptsetup: LUKS1/LUKS2 interop, damaged headers, crash points
//! of every header change and of reencryption.
//! One test binary of modules (one link, `common` compiled once), as rustls groups its
//! tests.

#[path = "../common/mod.rs"]
mod common;

mod corrupt_headers;
mod crash_safety;
mod luks1_interop;
mod luks2_interop;
mod reencrypt_crash;
