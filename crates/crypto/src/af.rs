//! LUKS anti-forensic information splitter (AFsplitter, as in the LUKS1 specification §2.4).
//!
//! The key is spread over `stripes` blocks so that losing any one stripe (e.g. an
//! overwrite that reached only part of a keyslot) makes the key unrecoverable.

use crate::{Error, HashAlg, Result, SecretBytes};
use zeroize::Zeroize;

/// Diffuses `buf` in place: each hash-sized chunk i becomes H(be32(i) || chunk).
fn diffuse(hash: HashAlg, buf: &mut [u8]) {
    let dlen = hash.output_len();
    let mut out = [0u8; 64];
    for (i, chunk) in buf.chunks_mut(dlen).enumerate() {
        let iv = (i as u32).to_be_bytes();
        hash.digest_parts(&[&iv, chunk], &mut out[..dlen]);
        let n = chunk.len();
        chunk.copy_from_slice(&out[..n]);
    }
    out.zeroize();
}

/// Splits `key` into `stripes` blocks (`key.len() * stripes` bytes).
pub fn af_split(key: &[u8], stripes: u32, hash: HashAlg) -> Result<SecretBytes> {
    let n = key.len();
    let stripes = stripes as usize;
    if stripes == 0 {
        return Err(Error::AfLength {
            expected: 1,
            got: 0,
        });
    }
    let mut out = SecretBytes::zeroed(n * stripes);
    let mut block = SecretBytes::zeroed(n);
    crate::random_bytes(&mut out[..n * (stripes - 1)])?;
    for i in 0..stripes - 1 {
        for (b, s) in block.iter_mut().zip(&out[i * n..(i + 1) * n]) {
            *b ^= s;
        }
        diffuse(hash, &mut block);
    }
    for ((o, b), k) in out[(stripes - 1) * n..]
        .iter_mut()
        .zip(block.iter())
        .zip(key)
    {
        *o = b ^ k;
    }
    Ok(out)
}

/// Recovers a `key_len`-byte key from split material (at least `key_len * stripes` bytes).
pub fn af_merge(
    material: &[u8],
    key_len: usize,
    stripes: u32,
    hash: HashAlg,
) -> Result<SecretBytes> {
    let stripes = stripes as usize;
    let need = key_len * stripes;
    if stripes == 0 || material.len() < need {
        return Err(Error::AfLength {
            expected: need,
            got: material.len(),
        });
    }
    let mut block = SecretBytes::zeroed(key_len);
    for i in 0..stripes - 1 {
        for (b, s) in block
            .iter_mut()
            .zip(&material[i * key_len..(i + 1) * key_len])
        {
            *b ^= s;
        }
        diffuse(hash, &mut block);
    }
    let mut key = SecretBytes::zeroed(key_len);
    for ((k, b), s) in key
        .iter_mut()
        .zip(block.iter())
        .zip(&material[(stripes - 1) * key_len..need])
    {
        *k = b ^ s;
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_merge_roundtrip() {
        for hash in [HashAlg::Sha1, HashAlg::Sha256, HashAlg::Sha512] {
            for len in [16usize, 32, 64, 33] {
                let key: Vec<u8> = (0..len as u8).collect();
                let m = af_split(&key, 4000, hash).unwrap();
                assert_eq!(m.len(), len * 4000);
                assert_eq!(&af_merge(&m, len, 4000, hash).unwrap()[..], &key[..]);
                let mut broken = m.clone();
                broken[5] ^= 1;
                assert_ne!(&af_merge(&broken, len, 4000, hash).unwrap()[..], &key[..]);
            }
        }
    }

    #[test]
    fn short_material_is_an_error() {
        assert!(af_merge(&[0u8; 10], 32, 4000, HashAlg::Sha256).is_err());
    }
}
