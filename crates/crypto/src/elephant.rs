//! BitLocker's Elephant diffuser (dm-crypt's `elephant` IV generator, AES-CBC volumes of
//! Windows Vista and 7): before CBC encryption each sector is XORed with a sector key and
//! mixed by two invertible diffusers, so that a change to one bit of plaintext spreads
//! over the whole sector.
//!
//! The sector key is the AES encryption, under the diffuser key (the second half of the
//! volume key), of the sector's byte offset and of the same with byte 15 set to 0x80.

use crate::block::BlockKey;
use zeroize::Zeroize;

/// Words of the largest sector (4096 bytes).
const MAX_WORDS: usize = 1024;

/// The 32-byte sector key of the sector at byte offset `offset`.
fn sector_key(key: &BlockKey, offset: u64) -> [u8; 32] {
    let mut ks = [0u8; 32];
    ks[..8].copy_from_slice(&offset.to_le_bytes());
    ks[16..24].copy_from_slice(&offset.to_le_bytes());
    ks[31] = 0x80;
    key.encrypt_blocks(&mut ks);
    ks
}

/// Applies the Elephant layer to one plaintext sector before CBC encryption.
pub(crate) fn encrypt_sector(key: &BlockKey, offset: u64, sector: &mut [u8]) {
    let mut ks = sector_key(key, offset);
    for chunk in sector.chunks_exact_mut(32) {
        crate::modes::xor_in(chunk, &ks);
    }
    ks.zeroize();
    with_words(sector, |d| {
        diffuser_a_encrypt(d);
        diffuser_b_encrypt(d);
    });
}

/// Removes the Elephant layer from one sector after CBC decryption.
pub(crate) fn decrypt_sector(key: &BlockKey, offset: u64, sector: &mut [u8]) {
    with_words(sector, |d| {
        diffuser_b_decrypt(d);
        diffuser_a_decrypt(d);
    });
    let mut ks = sector_key(key, offset);
    for chunk in sector.chunks_exact_mut(32) {
        crate::modes::xor_in(chunk, &ks);
    }
    ks.zeroize();
}

/// Runs `f` over the sector as little-endian 32-bit words.
fn with_words(sector: &mut [u8], f: impl FnOnce(&mut [u32])) {
    let mut w = [0u32; MAX_WORDS];
    let n = sector.len() / 4;
    for (d, s) in w.iter_mut().zip(sector.chunks_exact(4)) {
        *d = u32::from_le_bytes(s.try_into().expect("4 bytes"));
    }
    f(&mut w[..n]);
    for (s, d) in sector.chunks_exact_mut(4).zip(&w) {
        s.copy_from_slice(&d.to_le_bytes());
    }
    w[..n].zeroize();
}

// The diffusers walk three indices through the words with wrap-around; Windows (and
// dm-crypt) define them by these exact loops, four steps per turn.

fn diffuser_a_decrypt(d: &mut [u32]) {
    let n = d.len();
    for _ in 0..5 {
        let (mut i1, mut i2, mut i3) = (0, n - 2, n - 5);
        while i1 < n - 1 {
            d[i1] = d[i1].wrapping_add(d[i2] ^ d[i3].rotate_left(9));
            (i1, i2, i3) = (i1 + 1, i2 + 1, i3 + 1);
            if i3 >= n {
                i3 -= n;
            }
            d[i1] = d[i1].wrapping_add(d[i2] ^ d[i3]);
            (i1, i2, i3) = (i1 + 1, i2 + 1, i3 + 1);
            if i2 >= n {
                i2 -= n;
            }
            d[i1] = d[i1].wrapping_add(d[i2] ^ d[i3].rotate_left(13));
            (i1, i2, i3) = (i1 + 1, i2 + 1, i3 + 1);
            d[i1] = d[i1].wrapping_add(d[i2] ^ d[i3]);
            (i1, i2, i3) = (i1 + 1, i2 + 1, i3 + 1);
        }
    }
}

fn diffuser_a_encrypt(d: &mut [u32]) {
    let n = d.len() as isize;
    let at = |i: isize| i as usize;
    for _ in 0..5 {
        let (mut i1, mut i2, mut i3) = (n - 1, n - 3, n - 6);
        while i1 > 0 {
            d[at(i1)] = d[at(i1)].wrapping_sub(d[at(i2)] ^ d[at(i3)]);
            (i1, i2, i3) = (i1 - 1, i2 - 1, i3 - 1);
            d[at(i1)] = d[at(i1)].wrapping_sub(d[at(i2)] ^ d[at(i3)].rotate_left(13));
            (i1, i2, i3) = (i1 - 1, i2 - 1, i3 - 1);
            if i2 < 0 {
                i2 += n;
            }
            d[at(i1)] = d[at(i1)].wrapping_sub(d[at(i2)] ^ d[at(i3)]);
            (i1, i2, i3) = (i1 - 1, i2 - 1, i3 - 1);
            if i3 < 0 {
                i3 += n;
            }
            d[at(i1)] = d[at(i1)].wrapping_sub(d[at(i2)] ^ d[at(i3)].rotate_left(9));
            (i1, i2, i3) = (i1 - 1, i2 - 1, i3 - 1);
        }
    }
}

fn diffuser_b_decrypt(d: &mut [u32]) {
    let n = d.len();
    for _ in 0..3 {
        let (mut i1, mut i2, mut i3) = (0, 2, 5);
        while i1 < n - 1 {
            d[i1] = d[i1].wrapping_add(d[i2] ^ d[i3]);
            (i1, i2, i3) = (i1 + 1, i2 + 1, i3 + 1);
            d[i1] = d[i1].wrapping_add(d[i2] ^ d[i3].rotate_left(10));
            (i1, i2, i3) = (i1 + 1, i2 + 1, i3 + 1);
            if i2 >= n {
                i2 -= n;
            }
            d[i1] = d[i1].wrapping_add(d[i2] ^ d[i3]);
            (i1, i2, i3) = (i1 + 1, i2 + 1, i3 + 1);
            if i3 >= n {
                i3 -= n;
            }
            d[i1] = d[i1].wrapping_add(d[i2] ^ d[i3].rotate_left(25));
            (i1, i2, i3) = (i1 + 1, i2 + 1, i3 + 1);
        }
    }
}

fn diffuser_b_encrypt(d: &mut [u32]) {
    let n = d.len() as isize;
    let at = |i: isize| i as usize;
    for _ in 0..3 {
        let (mut i1, mut i2, mut i3) = (n - 1, 1isize, 4isize);
        while i1 > 0 {
            d[at(i1)] = d[at(i1)].wrapping_sub(d[at(i2)] ^ d[at(i3)].rotate_left(25));
            (i1, i2, i3) = (i1 - 1, i2 - 1, i3 - 1);
            if i3 < 0 {
                i3 += n;
            }
            d[at(i1)] = d[at(i1)].wrapping_sub(d[at(i2)] ^ d[at(i3)]);
            (i1, i2, i3) = (i1 - 1, i2 - 1, i3 - 1);
            if i2 < 0 {
                i2 += n;
            }
            d[at(i1)] = d[at(i1)].wrapping_sub(d[at(i2)] ^ d[at(i3)].rotate_left(10));
            (i1, i2, i3) = (i1 - 1, i2 - 1, i3 - 1);
            d[at(i1)] = d[at(i1)].wrapping_sub(d[at(i2)] ^ d[at(i3)]);
            (i1, i2, i3) = (i1 - 1, i2 - 1, i3 - 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diffusers_invert_each_other() {
        for words in [128usize, 256, 512, 1024] {
            let orig: Vec<u32> = (0..words as u32)
                .map(|i| i.wrapping_mul(0x9e37_79b9))
                .collect();
            let mut d = orig.clone();
            diffuser_a_encrypt(&mut d);
            diffuser_b_encrypt(&mut d);
            assert_ne!(d, orig);
            diffuser_b_decrypt(&mut d);
            diffuser_a_decrypt(&mut d);
            assert_eq!(d, orig, "{words} words");
        }
    }
}
