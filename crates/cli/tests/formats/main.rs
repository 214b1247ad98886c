//! Formats and key management end to end: LUKS1/LUKS2 verbs, hashes, cipher families,
//! conversion, luksDump, TrueCrypt/VeraCrypt, BitLocker, FileVault 2 and loop-AES, each
//! checked against the real cryptsetup.
//! One test binary of modules (one link, `common` compiled once), as rustls groups its
//! tests.

#[path = "../common/mod.rs"]
mod common;

mod bitlk;
mod cipher_families;
mod cli;
mod convert;
mod fido2;
mod fvault2;
mod hashes;
mod integritysetup;
mod loopaes;
mod luksdump;
mod pkcs11;
mod tcrypt;
mod tokens;
mod tpm2;
mod verbs;
