//! Portable AES through the `aes` crate, used by the generic backend and for rare key sizes.

use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::{Aes128, Aes192, Aes256, Block};

use crate::secret::LockedBox;
use crate::{Error, Result};

/// AES with a 128, 192 or 256-bit key. The `aes` crate zeroizes its round keys on drop;
/// they live on locked pages of their own.
pub(crate) enum AesKey {
    A128(LockedBox<Aes128>),
    A192(LockedBox<Aes192>),
    A256(LockedBox<Aes256>),
}

/// `C` keyed with `key`, built over a blank (all-zero key) instance already in locked memory.
/// The keyed value passes through the stack on its way in: every key setup runs inside
/// `secret::scrubbed`, which wipes those frames after.
pub(crate) fn locked<C: KeyInit>(key: &[u8]) -> std::result::Result<LockedBox<C>, ()> {
    LockedBox::new_with(C::new(&Default::default()), |c| {
        *c = C::new_from_slice(key).map_err(|_| ())?;
        Ok(())
    })
}

fn blocks_mut(data: &mut [u8]) -> &mut [Block] {
    let (blocks, rest) = data.as_chunks_mut::<16>();
    debug_assert!(rest.is_empty());
    Block::cast_slice_from_core_mut(blocks)
}

impl AesKey {
    pub(crate) fn new(key: &[u8]) -> Result<Self> {
        let bad = || Error::InvalidKeyLength {
            cipher: "aes".into(),
            len: key.len(),
        };
        Ok(match key.len() {
            16 => AesKey::A128(locked(key).map_err(|_| bad())?),
            24 => AesKey::A192(locked(key).map_err(|_| bad())?),
            32 => AesKey::A256(locked(key).map_err(|_| bad())?),
            _ => return Err(bad()),
        })
    }

    /// Encrypts whole 16-byte blocks in place (`data.len()` is a multiple of 16).
    pub(crate) fn encrypt_blocks(&self, data: &mut [u8]) {
        let blocks = blocks_mut(data);
        match self {
            AesKey::A128(k) => k.encrypt_blocks(blocks),
            AesKey::A192(k) => k.encrypt_blocks(blocks),
            AesKey::A256(k) => k.encrypt_blocks(blocks),
        }
    }

    pub(crate) fn decrypt_blocks(&self, data: &mut [u8]) {
        let blocks = blocks_mut(data);
        match self {
            AesKey::A128(k) => k.decrypt_blocks(blocks),
            AesKey::A192(k) => k.decrypt_blocks(blocks),
            AesKey::A256(k) => k.decrypt_blocks(blocks),
        }
    }
}
