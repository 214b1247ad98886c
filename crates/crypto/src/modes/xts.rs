//! XTS (IEEE 1619) over sectors, on any 16-byte block cipher.

use super::{BLOCKS_PER_PASS, gf_mul_x, xor_in};
use crate::block::BlockKey;
use zeroize::Zeroize;

/// XTS over sectors of `ss` bytes, each sector's tweak the encryption of its IV under
/// `k2`.
pub(crate) fn xts_generic(
    k1: &BlockKey,
    k2: &BlockKey,
    ivs: &mut [[u8; 16]],
    data: &mut [u8],
    ss: usize,
    enc: bool,
) {
    let mut tweaks = [[0u8; 16]; BLOCKS_PER_PASS];
    for (iv, sector) in ivs.iter_mut().zip(data.chunks_mut(ss)) {
        k2.encrypt_blocks(iv);
        let mut t = u128::from_le_bytes(*iv);
        for chunk in sector.chunks_mut(16 * BLOCKS_PER_PASS) {
            let n = chunk.len() / 16;
            for tw in tweaks[..n].iter_mut() {
                *tw = t.to_le_bytes();
                t = gf_mul_x(t);
            }
            xor_in(chunk, tweaks[..n].as_flattened());
            if enc {
                k1.encrypt_blocks(chunk)
            } else {
                k1.decrypt_blocks(chunk)
            }
            xor_in(chunk, tweaks[..n].as_flattened());
        }
    }
    tweaks.as_flattened_mut().zeroize();
}
