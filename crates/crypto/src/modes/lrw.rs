//! LRW (the kernel's `lrw` template), the tweak table in GF(2^128).

use super::{BLOCKS_PER_PASS, gf_mul_x, xor_in};
use crate::Result;
use crate::block::BlockKey;
use crate::secret::LockedBox;
use zeroize::{Zeroize, ZeroizeOnDrop};

/// LRW's tweak key `K` in GF(2^128), polynomial basis, elements as big-endian integers
/// (the kernel's "bbe" convention): `pow[i]` = K·x^i, `inc[i]` = K·(x^(i+1) - 1), so that
/// the tweak of block index `I + 1` is the tweak of `I` XOR `inc[trailing ones of I]`.
#[derive(Zeroize, ZeroizeOnDrop)]
pub(crate) struct LrwTable {
    pow: [u128; 128],
    inc: [u128; 128],
}

impl LrwTable {
    /// The table of tweak key `t`, on locked pages.
    pub(crate) fn locked(t: &[u8; 16]) -> Result<LockedBox<LrwTable>> {
        LockedBox::new_with(
            LrwTable {
                pow: [0; 128],
                inc: [0; 128],
            },
            |tab| {
                tab.fill(t);
                Ok(())
            },
        )
    }

    fn fill(&mut self, k: &[u8; 16]) {
        let mut p = u128::from_be_bytes(*k);
        let mut acc = 0u128;
        for i in 0..128 {
            self.pow[i] = p;
            acc ^= p;
            self.inc[i] = acc;
            p = gf_mul_x(p);
        }
    }

    /// K·i.
    fn mul(&self, i: u128) -> u128 {
        let mut t = 0u128;
        for (bit, p) in self.pow.iter().enumerate() {
            // Branch-free: the index is public (a block number), the table is not.
            t ^= p & 0u128.wrapping_sub((i >> bit) & 1);
        }
        t
    }
}

/// LRW (the kernel's `lrw` template): block `j` of a sector whose IV, read as a big-endian
/// integer, is `I` is whitened before and after the cipher with K·(I + j).
pub(crate) fn lrw(
    key: &BlockKey,
    table: &LrwTable,
    ivs: &[[u8; 16]],
    data: &mut [u8],
    ss: usize,
    enc: bool,
) {
    let mut tweaks = [[0u8; 16]; BLOCKS_PER_PASS];
    for (iv, sector) in ivs.iter().zip(data.chunks_mut(ss)) {
        let mut i = u128::from_be_bytes(*iv);
        let mut t = table.mul(i);
        for chunk in sector.chunks_mut(16 * BLOCKS_PER_PASS) {
            let n = chunk.len() / 16;
            for tw in tweaks[..n].iter_mut() {
                *tw = t.to_be_bytes();
                t ^= table.inc[(i.trailing_ones() as usize).min(127)];
                i = i.wrapping_add(1);
            }
            xor_in(chunk, tweaks[..n].as_flattened());
            if enc {
                key.encrypt_blocks(chunk)
            } else {
                key.decrypt_blocks(chunk)
            }
            xor_in(chunk, tweaks[..n].as_flattened());
        }
        t.zeroize();
    }
    tweaks.as_flattened_mut().zeroize();
}
