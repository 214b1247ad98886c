//! CBC over sectors, on 16- and 8-byte block ciphers.

use super::{BLOCKS_PER_PASS, xor_in};
use crate::block::BlockKey;
use zeroize::Zeroize;

/// CBC with the cipher's own block size.
pub(crate) fn cbc_generic(key: &BlockKey, ivs: &[[u8; 16]], data: &mut [u8], ss: usize, enc: bool) {
    cbc_generic_n(key, key.block_size(), ivs, data, ss, enc)
}

/// CBC over sectors of `ss` bytes with blocks of `bs` bytes (16 or 8); each sector's IV is
/// the first `bs` bytes of its entry in `ivs`.
pub(crate) fn cbc_generic_n(
    key: &BlockKey,
    bs: usize,
    ivs: &[[u8; 16]],
    data: &mut [u8],
    ss: usize,
    enc: bool,
) {
    for (iv, sector) in ivs.iter().zip(data.chunks_mut(ss)) {
        let mut prev = *iv;
        let prev = &mut prev[..bs];
        if enc {
            for b in sector.chunks_exact_mut(bs) {
                xor_in(b, prev);
                key.encrypt_blocks(b);
                prev.copy_from_slice(b);
            }
        } else {
            // Keep a copy of each chunk's ciphertext: it chains into the next block.
            let mut saved = [0u8; 16 * BLOCKS_PER_PASS];
            for chunk in sector.chunks_mut(16 * BLOCKS_PER_PASS) {
                let saved = &mut saved[..chunk.len()];
                saved.copy_from_slice(chunk);
                key.decrypt_blocks(chunk);
                xor_in(&mut chunk[..bs], prev);
                xor_in(&mut chunk[bs..], &saved[..saved.len() - bs]);
                prev.copy_from_slice(&saved[saved.len() - bs..]);
            }
            saved.zeroize();
        }
        prev.zeroize();
    }
}
