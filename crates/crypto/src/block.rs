//! Block ciphers behind the sector modes: AES (own backends) and the RustCrypto crates for
//! the families dm-crypt, TrueCrypt/VeraCrypt and loop-AES volumes use.
//!
//! Every key schedule lives on locked pages of its own (the crates zeroize on drop).

use aes::cipher::array::Array;
use aes::cipher::consts::{U8, U16};
use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt};

use crate::backend::generic::{AesKey, locked};
use crate::secret::LockedBox;
use crate::spec::BlockCipherAlg;
use crate::{Error, Result};

/// A keyed block cipher of any supported family.
pub(crate) enum BlockKey {
    Aes(AesKey),
    Serpent(LockedBox<serpent::Serpent>),
    Twofish(LockedBox<crate::twofish::Twofish>),
    Camellia128(LockedBox<camellia::Camellia128>),
    Camellia192(LockedBox<camellia::Camellia192>),
    Camellia256(LockedBox<camellia::Camellia256>),
    Kuznyechik(LockedBox<kuznyechik::Kuznyechik>),
    Blowfish(LockedBox<blowfish::Blowfish>),
    BlowfishLe(LockedBox<blowfish::BlowfishLE>),
    Cast5(LockedBox<cast5::Cast5>),
    Des3Ede(LockedBox<des::TdesEde3>),
    /// Ciphers applied one after the other to each block (TrueCrypt's legacy "inner"
    /// cascades in CBC); the block is the largest member's, smaller ones run in ECB over it.
    Chain(Vec<BlockKey>),
}

fn enc16<C: BlockCipherEncrypt<BlockSize = U16>>(c: &C, data: &mut [u8]) {
    let (blocks, rest) = data.as_chunks_mut::<16>();
    debug_assert!(rest.is_empty());
    c.encrypt_blocks(Array::cast_slice_from_core_mut(blocks));
}

fn dec16<C: BlockCipherDecrypt<BlockSize = U16>>(c: &C, data: &mut [u8]) {
    let (blocks, rest) = data.as_chunks_mut::<16>();
    debug_assert!(rest.is_empty());
    c.decrypt_blocks(Array::cast_slice_from_core_mut(blocks));
}

fn enc8<C: BlockCipherEncrypt<BlockSize = U8>>(c: &C, data: &mut [u8]) {
    let (blocks, rest) = data.as_chunks_mut::<8>();
    debug_assert!(rest.is_empty());
    c.encrypt_blocks(Array::cast_slice_from_core_mut(blocks));
}

fn dec8<C: BlockCipherDecrypt<BlockSize = U8>>(c: &C, data: &mut [u8]) {
    let (blocks, rest) = data.as_chunks_mut::<8>();
    debug_assert!(rest.is_empty());
    c.decrypt_blocks(Array::cast_slice_from_core_mut(blocks));
}

/// Calls `$f16(cipher, $data)` or `$f8(cipher, $data)`, by the key's block size.
macro_rules! dispatch {
    ($key:expr, $data:expr, $f16:ident, $f8:ident) => {
        match $key {
            BlockKey::Aes(_) | BlockKey::Twofish(_) | BlockKey::Chain(_) => {
                unreachable!("dispatched by the caller")
            }
            BlockKey::Serpent(c) => $f16(&**c, $data),
            BlockKey::Camellia128(c) => $f16(&**c, $data),
            BlockKey::Camellia192(c) => $f16(&**c, $data),
            BlockKey::Camellia256(c) => $f16(&**c, $data),
            BlockKey::Kuznyechik(c) => $f16(&**c, $data),
            BlockKey::Blowfish(c) => $f8(&**c, $data),
            BlockKey::BlowfishLe(c) => $f8(&**c, $data),
            BlockKey::Cast5(c) => $f8(&**c, $data),
            BlockKey::Des3Ede(c) => $f8(&**c, $data),
        }
    };
}

impl BlockKey {
    /// AES keyed with `key` on its own (AES-CCM, AES key wrap): the expansion runs in
    /// frames of its own, wiped after ([`crate::secret::scrubbed`]).
    pub(crate) fn aes_scrubbed(key: &[u8]) -> Result<Self> {
        crate::secret::scrubbed(|| Self::new(BlockCipherAlg::Aes, key))
    }

    /// `alg` keyed with `key`; the length must be one the cipher takes.
    pub(crate) fn new(alg: BlockCipherAlg, key: &[u8]) -> Result<Self> {
        let bad = || Error::InvalidKeyLength {
            cipher: alg.name().into(),
            len: key.len(),
        };
        if !alg.valid_key_len(key.len()) {
            return Err(bad());
        }
        let k = match alg {
            BlockCipherAlg::Aes => return AesKey::new(key).map(BlockKey::Aes),
            BlockCipherAlg::Null => return Err(bad()),
            BlockCipherAlg::Serpent => locked(key).map(BlockKey::Serpent),
            BlockCipherAlg::Twofish => LockedBox::new_with(crate::twofish::Twofish::blank(), |t| {
                t.set_key(key);
                Ok::<_, ()>(())
            })
            .map(BlockKey::Twofish),
            BlockCipherAlg::Camellia => match key.len() {
                16 => locked(key).map(BlockKey::Camellia128),
                24 => locked(key).map(BlockKey::Camellia192),
                _ => locked(key).map(BlockKey::Camellia256),
            },
            BlockCipherAlg::Kuznyechik => locked(key).map(BlockKey::Kuznyechik),
            BlockCipherAlg::Blowfish => locked(key).map(BlockKey::Blowfish),
            BlockCipherAlg::BlowfishLe => locked(key).map(BlockKey::BlowfishLe),
            BlockCipherAlg::Cast5 => locked(key).map(BlockKey::Cast5),
            BlockCipherAlg::Des3Ede => locked(key).map(BlockKey::Des3Ede),
        };
        k.map_err(|_| bad())
    }

    /// Block size in bytes (16, or 8 for Blowfish, CAST5 and 3DES).
    pub(crate) fn block_size(&self) -> usize {
        match self {
            BlockKey::Blowfish(_)
            | BlockKey::BlowfishLe(_)
            | BlockKey::Cast5(_)
            | BlockKey::Des3Ede(_) => 8,
            BlockKey::Chain(c) => c.iter().map(|k| k.block_size()).max().unwrap_or(16),
            _ => 16,
        }
    }

    /// Encrypts whole blocks in place (`data.len()` a multiple of the block size).
    pub(crate) fn encrypt_blocks(&self, data: &mut [u8]) {
        match self {
            BlockKey::Aes(k) => return k.encrypt_blocks(data),
            BlockKey::Twofish(k) => return k.encrypt_blocks(data),
            BlockKey::Chain(c) => return c.iter().for_each(|k| k.encrypt_blocks(data)),
            _ => {}
        }
        dispatch!(self, data, enc16, enc8)
    }

    /// Decrypts whole blocks in place (`data.len()` a multiple of the block size).
    pub(crate) fn decrypt_blocks(&self, data: &mut [u8]) {
        match self {
            BlockKey::Aes(k) => return k.decrypt_blocks(data),
            BlockKey::Twofish(k) => return k.decrypt_blocks(data),
            BlockKey::Chain(c) => return c.iter().rev().for_each(|k| k.decrypt_blocks(data)),
            _ => {}
        }
        dispatch!(self, data, dec16, dec8)
    }
}
