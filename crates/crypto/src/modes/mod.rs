//! The portable block-cipher modes over whole sectors (units), shared by the sector
//! cipher, the unit cipher and the other constructions: XTS, LRW, CBC. The vector
//! backends (`backend::x86`) have their own XTS and CBC; these are the reference they
//! are checked against and the path for every other cipher.

mod cbc;
mod lrw;
mod xts;

pub(crate) use cbc::{cbc_generic, cbc_generic_n};
pub(crate) use lrw::{LrwTable, lrw};
pub(crate) use xts::xts_generic;

/// Blocks handled per pass of the generic loops (a pass's tweaks or saved ciphertext
/// live on the stack).
pub(crate) const BLOCKS_PER_PASS: usize = 32;

/// Multiplies an XTS tweak by α (x) in GF(2^128), little-endian as IEEE 1619 defines.
#[inline]
pub(crate) fn gf_mul_x(t: u128) -> u128 {
    (t << 1) ^ ((t >> 127) * 0x87)
}

#[inline]
pub(crate) fn xor_in(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}
