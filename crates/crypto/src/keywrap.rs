//! AES key wrap (NIST SP 800-38F KW, RFC 3394): FileVault 2 wraps its key-encrypting key
//! and volume key this way (AES-128, one 64-bit integrity block ahead of the key).

use crate::block::BlockKey;
use crate::{Error, Result};
use zeroize::Zeroize;

/// The initial value RFC 3394 fixes (ICV1).
const ICV: [u8; 8] = [0xa6; 8];

fn check(len: usize, what: &str) -> Result<usize> {
    if len < 16 || !len.is_multiple_of(8) {
        return Err(Error::KeyWrap(format!(
            "{what} must be a multiple of 8 bytes, at least 16"
        )));
    }
    Ok(len / 8)
}

/// Wraps `key` (a multiple of 8 bytes, at least 16) under the AES key `kek`; the result
/// is 8 bytes longer.
pub fn aes_key_wrap(kek: &[u8], key: &[u8]) -> Result<Vec<u8>> {
    let n = check(key.len(), "a wrapped key")?;
    let k = BlockKey::aes_scrubbed(kek)?;
    let mut out = vec![0u8; key.len() + 8];
    out[..8].copy_from_slice(&ICV);
    out[8..].copy_from_slice(key);
    let mut b = [0u8; 16];
    for j in 0..6u64 {
        for i in 1..=n {
            b[..8].copy_from_slice(&out[..8]);
            b[8..].copy_from_slice(&out[8 * i..8 * i + 8]);
            k.encrypt_blocks(&mut b);
            let t = (n as u64 * j + i as u64).to_be_bytes();
            for (x, y) in b[..8].iter_mut().zip(t) {
                *x ^= y;
            }
            out[..8].copy_from_slice(&b[..8]);
            out[8 * i..8 * i + 8].copy_from_slice(&b[8..]);
        }
    }
    b.zeroize();
    Ok(out)
}

/// Unwraps `wrapped` under the AES key `kek` into `key` (8 bytes shorter). A wrong key
/// or damaged input fails the integrity check: [`Error::KeyWrap`], and `key` is wiped.
pub fn aes_key_unwrap(kek: &[u8], wrapped: &[u8], key: &mut [u8]) -> Result<()> {
    let n = check(wrapped.len(), "a wrapped key")? - 1;
    if key.len() != wrapped.len() - 8 {
        return Err(Error::KeyWrap(
            "the unwrapped key is 8 bytes shorter than the wrapped one".into(),
        ));
    }
    let k = BlockKey::aes_scrubbed(kek)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(&wrapped[..8]);
    key.copy_from_slice(&wrapped[8..]);
    let mut b = [0u8; 16];
    for j in (0..6u64).rev() {
        for i in (1..=n).rev() {
            let t = (n as u64 * j + i as u64).to_be_bytes();
            for ((x, y), z) in b[..8].iter_mut().zip(a).zip(t) {
                *x = y ^ z;
            }
            b[8..].copy_from_slice(&key[8 * (i - 1)..8 * i]);
            k.decrypt_blocks(&mut b);
            a.copy_from_slice(&b[..8]);
            key[8 * (i - 1)..8 * i].copy_from_slice(&b[8..]);
        }
    }
    b.zeroize();
    if crate::constant_time_eq(&a, &ICV) {
        Ok(())
    } else {
        key.zeroize();
        Err(Error::KeyWrap("integrity check failed (wrong key)".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_tamper() {
        let kek = [7u8; 16];
        let key: Vec<u8> = (0u8..32).collect();
        let w = aes_key_wrap(&kek, &key).unwrap();
        assert_eq!(w.len(), 40);
        let mut back = vec![0u8; 32];
        aes_key_unwrap(&kek, &w, &mut back).unwrap();
        assert_eq!(back, key);
        let mut bad = w.clone();
        bad[20] ^= 1;
        assert!(aes_key_unwrap(&kek, &bad, &mut back).is_err());
        assert!(back.iter().all(|&b| b == 0));
        assert!(aes_key_unwrap(&kek, &w[..12], &mut [0u8; 4]).is_err());
        assert!(aes_key_wrap(&kek, &key[..8]).is_err());
    }
}
