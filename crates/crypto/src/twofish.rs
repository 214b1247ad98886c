//! Twofish with its key-dependent S-boxes folded into four 256-entry tables at key setup
//! (the "full keying" of the Twofish paper, as the kernel's and libgcrypt's do it).
//!
//! RustCrypto's `twofish` crate recomputes the S-boxes and the MDS products bit by bit
//! for every byte of every block: 2 MB/s here, a thousandth of what a volume needs. This
//! module keeps the crate as the reference (the tests compare the two on random keys and
//! blocks) and does per block what the kernel does: 16 table lookups per round.

use zeroize::{Zeroize, ZeroizeOnDrop};

/// The nibble tables of the permutations q0 and q1 (Twofish paper, section 4.3.5).
const Q_NIBBLES: [[[u8; 16]; 4]; 2] = [
    [
        [8, 1, 7, 13, 6, 15, 3, 2, 0, 11, 5, 9, 14, 12, 10, 4],
        [14, 12, 11, 8, 1, 2, 3, 5, 15, 4, 10, 6, 7, 0, 9, 13],
        [11, 10, 5, 14, 6, 13, 9, 0, 12, 8, 15, 3, 2, 4, 7, 1],
        [13, 7, 15, 4, 1, 2, 6, 14, 9, 11, 3, 0, 8, 5, 12, 10],
    ],
    [
        [2, 8, 11, 13, 15, 7, 6, 14, 3, 1, 9, 4, 0, 10, 12, 5],
        [1, 14, 2, 11, 4, 12, 3, 7, 6, 13, 10, 5, 15, 9, 0, 8],
        [4, 12, 7, 5, 1, 6, 9, 10, 0, 14, 13, 8, 2, 11, 3, 15],
        [11, 9, 5, 1, 12, 3, 13, 14, 6, 4, 7, 15, 2, 0, 8, 10],
    ],
];

/// Which q each byte position passes through at each stage of g (paper, figure 2), for
/// 256-bit keys; shorter keys start further in.
const Q_ORDER: [[usize; 5]; 4] = [
    [1, 1, 0, 0, 1],
    [0, 1, 1, 0, 0],
    [0, 0, 0, 1, 1],
    [1, 0, 1, 1, 0],
];

/// The Reed-Solomon matrix that makes the S-box key from the key (paper, section 4.3).
const RS: [[u8; 8]; 4] = [
    [0x01, 0xa4, 0x55, 0x87, 0x5a, 0x58, 0xdb, 0x9e],
    [0xa4, 0x56, 0x82, 0xf3, 0x1e, 0xc6, 0x68, 0xe5],
    [0x02, 0xa1, 0xfc, 0xc1, 0x47, 0xae, 0x3d, 0x19],
    [0xa4, 0x55, 0x87, 0x5a, 0x58, 0xdb, 0x9e, 0x03],
];
/// x^8 + x^6 + x^5 + x^3 + 1 (MDS) and x^8 + x^6 + x^3 + x^2 + 1 (RS), without x^8.
const MDS_POLY: u8 = 0x69;
const RS_POLY: u8 = 0x4d;

fn gf_mul(mut a: u8, mut b: u8, poly: u8) -> u8 {
    let mut r = 0;
    while a != 0 {
        if a & 1 != 0 {
            r ^= b;
        }
        a >>= 1;
        b = (b << 1) ^ if b & 0x80 != 0 { poly } else { 0 };
    }
    r
}

/// q0 (`which` = 0) or q1 of `x`.
fn q(which: usize, x: u8) -> u8 {
    let t = &Q_NIBBLES[which];
    let ror1 = |n: u8| ((n >> 1) | (n << 3)) & 15;
    let (a0, b0) = (x >> 4, x & 15);
    let (a1, b1) = (a0 ^ b0, (a0 ^ ror1(b0) ^ (a0 << 3)) & 15);
    let (a2, b2) = (t[0][a1 as usize], t[1][b1 as usize]);
    let (a3, b3) = (a2 ^ b2, (a2 ^ ror1(b2) ^ (a2 << 3)) & 15);
    let (a4, b4) = (t[2][a3 as usize], t[3][b3 as usize]);
    (b4 << 4) | a4
}

/// Column `col` of the MDS matrix times `x`, as a little-endian word.
fn mds_column(x: u8, col: usize) -> u32 {
    let x5b = gf_mul(x, 0x5b, MDS_POLY);
    let xef = gf_mul(x, 0xef, MDS_POLY);
    u32::from_le_bytes(match col {
        0 => [x, x5b, xef, xef],
        1 => [xef, xef, x5b, x],
        2 => [x5b, xef, x, xef],
        _ => [x5b, x, xef, x5b],
    })
}

/// A keyed Twofish: round subkeys and the four key-dependent g tables.
#[derive(Zeroize, ZeroizeOnDrop)]
pub(crate) struct Twofish {
    k: [u32; 40],
    g: [[u32; 256]; 4],
}

impl Twofish {
    /// An unkeyed value to build in place (see `LockedBox::new_with`).
    pub(crate) fn blank() -> Self {
        Twofish {
            k: [0; 40],
            g: [[0; 256]; 4],
        }
    }

    /// Keys it with 16, 24 or 32 bytes (checked by the caller).
    pub(crate) fn set_key(&mut self, key: &[u8]) {
        debug_assert!(matches!(key.len(), 16 | 24 | 32));
        let words = key.len() / 8;
        let start = 4 - words;
        // h(X, L): byte i of X through the q chain, XORed with byte i of the list's
        // words from the last to the first, then the MDS matrix.
        let h = |x: u32, list: &[[u8; 4]]| -> u32 {
            let mut y = x.to_le_bytes();
            for (col, b) in y.iter_mut().enumerate() {
                let mut v = q(Q_ORDER[col][start], *b);
                for (stage, w) in list.iter().rev().enumerate() {
                    v = q(Q_ORDER[col][start + stage + 1], v ^ w[col]);
                }
                *b = v;
            }
            (0..4).fold(0, |acc, col| acc ^ mds_column(y[col], col))
        };
        let mut even = [[0u8; 4]; 4];
        let mut odd = [[0u8; 4]; 4];
        let mut sbox_key = [[0u8; 4]; 4];
        for i in 0..words {
            even[i].copy_from_slice(&key[8 * i..8 * i + 4]);
            odd[i].copy_from_slice(&key[8 * i + 4..8 * i + 8]);
            for (r, row) in RS.iter().enumerate() {
                sbox_key[i][r] =
                    (0..8).fold(0, |acc, j| acc ^ gf_mul(key[8 * i + j], row[j], RS_POLY));
            }
        }
        const RHO: u32 = 0x0101_0101;
        for i in 0..20u32 {
            let a = h(RHO.wrapping_mul(2 * i), &even[..words]);
            let b = h(RHO.wrapping_mul(2 * i + 1), &odd[..words]).rotate_left(8);
            let v = a.wrapping_add(b);
            self.k[2 * i as usize] = v;
            self.k[2 * i as usize + 1] = v.wrapping_add(b).rotate_left(9);
        }
        // g is h over the S-box key vector, which the paper lists last word first: so
        // its first XOR takes the key's first S word.
        for col in 0..4 {
            for x in 0..256usize {
                let mut v = q(Q_ORDER[col][start], x as u8);
                for (stage, w) in sbox_key[..words].iter().enumerate() {
                    v = q(Q_ORDER[col][start + stage + 1], v ^ w[col]);
                }
                self.g[col][x] = mds_column(v, col);
            }
        }
        even.zeroize();
        odd.zeroize();
        sbox_key.zeroize();
    }

    /// g(x): the four key-dependent tables, one per byte of `x`.
    #[inline(always)]
    fn g0(&self, x: u32) -> u32 {
        let b = x.to_le_bytes();
        self.g[0][b[0] as usize]
            ^ self.g[1][b[1] as usize]
            ^ self.g[2][b[2] as usize]
            ^ self.g[3][b[3] as usize]
    }

    /// g(x rotated left by 8), without the rotation: the tables take the bytes shifted.
    #[inline(always)]
    fn g1(&self, x: u32) -> u32 {
        let b = x.to_le_bytes();
        self.g[0][b[3] as usize]
            ^ self.g[1][b[0] as usize]
            ^ self.g[2][b[1] as usize]
            ^ self.g[3][b[2] as usize]
    }

    /// Encrypts whole 16-byte blocks in place, two at a time where it can: the rounds of
    /// one block are a chain of dependent table lookups, and two chains keep the load
    /// units busy where one leaves them waiting.
    pub(crate) fn encrypt_blocks(&self, data: &mut [u8]) {
        let (pairs, rest) = data.as_chunks_mut::<32>();
        for p in pairs {
            let mut v = [load(&p[..16]), load(&p[16..])];
            self.rounds_enc::<2>(&mut v);
            store(&mut p[..16], v[0]);
            store(&mut p[16..], v[1]);
        }
        for blk in rest.chunks_exact_mut(16) {
            let mut v = [load(blk)];
            self.rounds_enc::<1>(&mut v);
            store(blk, v[0]);
        }
    }

    /// Decrypts whole 16-byte blocks in place (two at a time, as encryption).
    pub(crate) fn decrypt_blocks(&self, data: &mut [u8]) {
        let (pairs, rest) = data.as_chunks_mut::<32>();
        for p in pairs {
            let mut v = [load(&p[..16]), load(&p[16..])];
            self.rounds_dec::<2>(&mut v);
            store(&mut p[..16], v[0]);
            store(&mut p[16..], v[1]);
        }
        for blk in rest.chunks_exact_mut(16) {
            let mut v = [load(blk)];
            self.rounds_dec::<1>(&mut v);
            store(blk, v[0]);
        }
    }

    /// The 16 rounds and whitening on `N` blocks in lockstep; output word order as the
    /// paper's (C, D, A, B).
    #[inline(always)]
    fn rounds_enc<const N: usize>(&self, v: &mut [[u32; 4]; N]) {
        let k = &self.k;
        for b in v.iter_mut() {
            for (w, key) in b.iter_mut().zip(&k[..4]) {
                *w ^= key;
            }
        }
        for r in 0..8 {
            let rk = &k[8 + 4 * r..12 + 4 * r];
            for [a, b, c, d] in v.iter_mut() {
                let t1 = self.g1(*b);
                let t0 = self.g0(*a).wrapping_add(t1);
                *c = (*c ^ t0.wrapping_add(rk[0])).rotate_right(1);
                *d = d.rotate_left(1) ^ t1.wrapping_add(t0).wrapping_add(rk[1]);
            }
            for [a, b, c, d] in v.iter_mut() {
                let t1 = self.g1(*d);
                let t0 = self.g0(*c).wrapping_add(t1);
                *a = (*a ^ t0.wrapping_add(rk[2])).rotate_right(1);
                *b = b.rotate_left(1) ^ t1.wrapping_add(t0).wrapping_add(rk[3]);
            }
        }
        for x in v.iter_mut() {
            let [a, b, c, d] = *x;
            *x = [c ^ k[4], d ^ k[5], a ^ k[6], b ^ k[7]];
        }
    }

    /// The inverse of [`Twofish::rounds_enc`].
    #[inline(always)]
    fn rounds_dec<const N: usize>(&self, v: &mut [[u32; 4]; N]) {
        let k = &self.k;
        for x in v.iter_mut() {
            let [c, d, a, b] = *x;
            *x = [a ^ k[6], b ^ k[7], c ^ k[4], d ^ k[5]];
        }
        for r in (0..8).rev() {
            let rk = &k[8 + 4 * r..12 + 4 * r];
            for [a, b, c, d] in v.iter_mut() {
                let t1 = self.g1(*d);
                let t0 = self.g0(*c).wrapping_add(t1);
                *a = a.rotate_left(1) ^ t0.wrapping_add(rk[2]);
                *b = (*b ^ t1.wrapping_add(t0).wrapping_add(rk[3])).rotate_right(1);
            }
            for [a, b, c, d] in v.iter_mut() {
                let t1 = self.g1(*b);
                let t0 = self.g0(*a).wrapping_add(t1);
                *c = c.rotate_left(1) ^ t0.wrapping_add(rk[0]);
                *d = (*d ^ t1.wrapping_add(t0).wrapping_add(rk[1])).rotate_right(1);
            }
        }
        for b in v.iter_mut() {
            for (w, key) in b.iter_mut().zip(&k[..4]) {
                *w ^= key;
            }
        }
    }
}

fn load(b: &[u8]) -> [u32; 4] {
    let w = |i: usize| u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    [w(0), w(1), w(2), w(3)]
}

fn store(b: &mut [u8], v: [u32; 4]) {
    for (o, w) in b.chunks_exact_mut(4).zip(v) {
        o.copy_from_slice(&w.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aes::cipher::array::Array;
    use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};

    /// Equal to RustCrypto's `twofish` (the reference) on random keys of every size and
    /// random blocks, both ways.
    #[test]
    fn matches_the_reference_crate() {
        let mut x = 0x2f15_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        };
        for len in [16usize, 24, 32] {
            for _ in 0..20 {
                let key: Vec<u8> = (0..len).map(|_| next()).collect();
                let mut ours = Twofish::blank();
                ours.set_key(&key);
                let theirs = twofish::Twofish::new_from_slice(&key).unwrap();
                let pt: Vec<u8> = (0..80).map(|_| next()).collect();
                let mut a = pt.clone();
                ours.encrypt_blocks(&mut a);
                for (i, chunk) in pt.chunks(16).enumerate() {
                    let mut b = Array::try_from(chunk).unwrap();
                    theirs.encrypt_block(&mut b);
                    assert_eq!(&a[16 * i..16 * i + 16], &b[..], "key {len} block {i}");
                    theirs.decrypt_block(&mut b);
                    assert_eq!(&b[..], chunk);
                }
                ours.decrypt_blocks(&mut a);
                assert_eq!(a, pt);
            }
        }
    }
}
