//! AES-CCM (NIST SP 800-38C, RFC 3610) without associated data: BitLocker wraps its keys
//! with it (12-byte nonce, 16-byte tag).

use crate::block::BlockKey;
use crate::{Error, Result};
use zeroize::Zeroize;

/// Checks the sizes CCM allows and returns L, the bytes of the length field.
fn length_bytes(nonce: &[u8], tag_len: usize, data_len: usize) -> Result<usize> {
    let bad = |what: &str| Error::Ccm(what.to_string());
    if !(7..=13).contains(&nonce.len()) {
        return Err(bad("nonce must be 7 to 13 bytes"));
    }
    if !(4..=16).contains(&tag_len) || !tag_len.is_multiple_of(2) {
        return Err(bad("tag must be 4, 6, ... or 16 bytes"));
    }
    let l = 15 - nonce.len();
    if l < 8 && (data_len as u64) >> (8 * l) != 0 {
        return Err(bad("message too long for the nonce size"));
    }
    Ok(l)
}

/// Counter block `i` (A_i).
fn counter(nonce: &[u8], l: usize, i: u64) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[0] = (l - 1) as u8;
    a[1..1 + nonce.len()].copy_from_slice(nonce);
    let be = i.to_be_bytes();
    a[16 - l..].copy_from_slice(&be[8 - l..]);
    a
}

/// XORs the keystream S_1, S_2, ... over `data`.
fn ctr(key: &BlockKey, nonce: &[u8], l: usize, data: &mut [u8]) {
    for (i, chunk) in data.chunks_mut(16).enumerate() {
        let mut s = counter(nonce, l, i as u64 + 1);
        key.encrypt_blocks(&mut s);
        crate::modes::xor_in(chunk, &s[..chunk.len()]);
        s.zeroize();
    }
}

/// The CBC-MAC of B_0 and `plain`, encrypted with S_0 (the tag before truncation).
fn mac(key: &BlockKey, nonce: &[u8], l: usize, tag_len: usize, plain: &[u8]) -> [u8; 16] {
    let mut x = [0u8; 16];
    x[0] = (((tag_len - 2) / 2) << 3) as u8 | (l - 1) as u8;
    x[1..1 + nonce.len()].copy_from_slice(nonce);
    let be = (plain.len() as u64).to_be_bytes();
    x[16 - l..].copy_from_slice(&be[8 - l..]);
    key.encrypt_blocks(&mut x);
    for chunk in plain.chunks(16) {
        crate::modes::xor_in(&mut x[..chunk.len()], chunk);
        key.encrypt_blocks(&mut x);
    }
    let mut s0 = counter(nonce, l, 0);
    key.encrypt_blocks(&mut s0);
    crate::modes::xor_in(&mut x, &s0);
    s0.zeroize();
    x
}

/// Encrypts `data` in place under AES `key` and returns the tag in `tag` (its length
/// chooses the tag size).
pub fn aes_ccm_encrypt(key: &[u8], nonce: &[u8], data: &mut [u8], tag: &mut [u8]) -> Result<()> {
    let l = length_bytes(nonce, tag.len(), data.len())?;
    let k = BlockKey::aes_scrubbed(key)?;
    let mut t = mac(&k, nonce, l, tag.len(), data);
    tag.copy_from_slice(&t[..tag.len()]);
    t.zeroize();
    ctr(&k, nonce, l, data);
    Ok(())
}

/// Decrypts `data` in place and checks `tag`; on a mismatch `data` is wiped and
/// [`Error::Ccm`] returned, so no unauthenticated plaintext escapes.
pub fn aes_ccm_decrypt(key: &[u8], nonce: &[u8], tag: &[u8], data: &mut [u8]) -> Result<()> {
    let l = length_bytes(nonce, tag.len(), data.len())?;
    let k = BlockKey::aes_scrubbed(key)?;
    ctr(&k, nonce, l, data);
    let mut t = mac(&k, nonce, l, tag.len(), data);
    let ok = crate::constant_time_eq(&t[..tag.len()], tag);
    t.zeroize();
    if ok {
        Ok(())
    } else {
        data.zeroize();
        Err(Error::Ccm("authentication tag mismatch".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    /// Round trip and tamper check; the known answers are in tests/kat_ccm.rs.
    #[test]
    fn round_trip_and_tamper() {
        let key = h("000102030405060708090a0b0c0d0e0f");
        let nonce = h("101112131415161718191a1b");
        let mut data = b"sixteen byte msg and some more".to_vec();
        let orig = data.clone();
        let mut tag = [0u8; 16];
        aes_ccm_encrypt(&key, &nonce, &mut data, &mut tag).unwrap();
        assert_ne!(data, orig);
        let mut back = data.clone();
        aes_ccm_decrypt(&key, &nonce, &tag, &mut back).unwrap();
        assert_eq!(back, orig);
        tag[3] ^= 1;
        let mut bad = data.clone();
        assert!(aes_ccm_decrypt(&key, &nonce, &tag, &mut bad).is_err());
        assert!(bad.iter().all(|&b| b == 0));
    }
}
