//! The crypto layer of cryptblk: dm-crypt compatible sector ciphers with runtime CPU dispatch,
//! the KDFs LUKS uses, the LUKS anti-forensic splitter, and AES-GCM for NBD's TLS records.
//!
//! One module per AES backend (`backend/generic.rs`, `backend/x86/`), chosen at run time
//! (`CRYPTBLK_CRYPTO_BACKEND` overrides); the generic modes in `modes/`.
//! `unsafe` is confined to `backend/x86` (CPU intrinsics, assembly) and `secret` (mlock,
//! fork detection).

mod aead_sector;
mod aegis128;
mod af;
mod backend;
mod block;
mod ccm;
mod crc;
mod elephant;
mod error;
mod gcm;
mod hash;
mod integrity_hash;
mod iv_stream;
pub mod kdf;
mod keywrap;
mod modes;
#[allow(unsafe_code)] // mlock, madvise
mod secret;
mod sector;
mod sector_tags;
mod sha256_lanes;
mod spec;
#[cfg(feature = "testing")]
pub mod testing;
mod twofish;
mod unit;

pub use aead_sector::{AeadIv, AeadSectorCipher};
pub use af::{af_merge, af_split};
pub use backend::{BACKEND_ENV, Backend};
pub use ccm::{aes_ccm_decrypt, aes_ccm_encrypt};
pub use crc::{crc32, crc32_update, crc32c_update};
pub use error::{Error, Result};
pub use gcm::{AesGcm, GcmMessage};
pub use hash::HashAlg;
pub use integrity_hash::{IntegrityHash, JournalSectionCipher, integrity_journal_keystream};
pub use kdf::{Argon2Variant, Kdf, KdfKind, KdfRequest};
pub use keywrap::{aes_key_unwrap, aes_key_wrap};
pub use secret::{SecretBytes, constant_time_eq, scrub_stack};
pub use sector::{IvOptions, SectorCipher};
pub use sector_tags::SectorTags;
pub use spec::{BlockCipherAlg, ChainMode, CipherSpec, IvMode, KeyLayout};
pub use unit::UnitCipher;

/// Fills `buf` from the operating system's random source.
pub fn random_bytes(buf: &mut [u8]) -> Result<()> {
    getrandom::fill(buf).map_err(|e| Error::Random(e.to_string()))
}
