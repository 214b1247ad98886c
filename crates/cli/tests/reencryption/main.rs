//! Reencryption end to end, offline and online, against cryptsetup 2.6: key changes,
//! encryption and decryption in place, data shifts, kills at every sync and mid-step.
//! One test binary of modules (one link, `common` compiled once), as rustls groups its
//! tests.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/xts.rs"]
mod xts;

mod decrypt_shift;
mod encrypt;
mod encrypt_shift;
mod online_reencrypt;
mod reencrypt;
