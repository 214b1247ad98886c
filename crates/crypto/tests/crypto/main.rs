//! The crypto layer against known answers (data/), OpenSSL and every CPU backend.
//! One test binary of modules (one link, `common` compiled once), as rustls groups its
//! tests.

#[path = "../common/mod.rs"]
mod common;

mod backends;
mod kat_cbc;
mod kat_ccm;
mod kat_dmcrypt;
mod kat_dmcrypt_aead;
mod kat_gcm;
mod kat_hash;
mod kat_kdf;
mod kat_keywrap;
mod kat_xts;
mod kat_xtsvs;
mod openssl_reference;
