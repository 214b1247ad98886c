//! AES-NI: XTS with eight blocks in flight, CBC decryption eight blocks wide, and CBC
//! encryption with up to eight sectors' chains interleaved (one chain alone is latency-bound).

use super::keys::{RoundKeys, load128, store128};
use core::arch::x86_64::*;

/// XTS tweak times α in GF(2^128): shift left one bit, fold the carry back as 0x87.
#[inline]
#[target_feature(enable = "sse2")]
pub(super) fn mulx(t: __m128i) -> __m128i {
    // Sign-extend the top bit of each dword; dword 3's top bit (bit 127) becomes 0x87 in
    // dword 0, dword 1's top bit (bit 63) becomes the carry into bit 64.
    let carries = _mm_shuffle_epi32(_mm_srai_epi32(t, 31), 0x13);
    let carries = _mm_and_si128(carries, _mm_set_epi32(0, 1, 0, 0x87));
    _mm_xor_si128(_mm_slli_epi64(t, 1), carries)
}

/// XTS tweak times α^8: a byte shift, and the byte shifted out multiplied by 0x87.
#[inline]
#[target_feature(enable = "sse2,pclmulqdq")]
fn mul_x8(t: __m128i) -> __m128i {
    let out = _mm_srli_si128::<15>(t);
    let red = _mm_clmulepi64_si128::<0x00>(out, _mm_set_epi64x(0, 0x87));
    _mm_xor_si128(_mm_slli_si128::<1>(t), red)
}

#[inline]
#[target_feature(enable = "aes,sse2,pclmulqdq")]
fn rounds<const NR: usize, const ENC: bool, const W: usize>(
    b: &mut [__m128i; W],
    rk: &[__m128i; 15],
) {
    if let Ok(b8) = <&mut [__m128i; 8]>::try_from(&mut b[..]) {
        // SAFETY: `rk` is 15 round keys of 16 bytes, 16-byte aligned (`__m128i`), only
        // read; the registers are plain values; the caller enables AES-NI.
        unsafe {
            if ENC {
                middle_rounds!(sse "aesenc", xmm_reg, b8 [b0 => 0, b1 => 1, b2 => 2, b3 => 3, b4 => 4, b5 => 5, b6 => 6, b7 => 7], rk, NR, 16);
            } else {
                middle_rounds!(sse "aesdec", xmm_reg, b8 [b0 => 0, b1 => 1, b2 => 2, b3 => 3, b4 => 4, b5 => 5, b6 => 6, b7 => 7], rk, NR, 16);
            }
        }
        last_round::<NR, ENC, W>(b, rk);
        return;
    }
    for r in 1..NR {
        for x in b.iter_mut() {
            *x = if ENC {
                _mm_aesenc_si128(*x, rk[r])
            } else {
                _mm_aesdec_si128(*x, rk[r])
            };
        }
    }
    last_round::<NR, ENC, W>(b, rk);
}

#[inline]
#[target_feature(enable = "aes,sse2,pclmulqdq")]
fn last_round<const NR: usize, const ENC: bool, const W: usize>(
    b: &mut [__m128i; W],
    rk: &[__m128i; 15],
) {
    for x in b.iter_mut() {
        *x = if ENC {
            _mm_aesenclast_si128(*x, rk[NR])
        } else {
            _mm_aesdeclast_si128(*x, rk[NR])
        };
    }
}

/// Encrypts blocks in place (ECB), eight at a time: used for XTS tweaks.
#[target_feature(enable = "aes,sse2,pclmulqdq")]
pub(super) fn encrypt_blocks<const NR: usize>(rk: &[__m128i; 15], blocks: &mut [[u8; 16]]) {
    let (chunks, rest) = blocks.as_chunks_mut::<8>();
    for c in chunks {
        let mut b = [_mm_setzero_si128(); 8];
        for (x, src) in b.iter_mut().zip(c.iter()) {
            *x = _mm_xor_si128(load128(src), rk[0]);
        }
        rounds::<NR, true, 8>(&mut b, rk);
        for (x, dst) in b.iter().zip(c.iter_mut()) {
            store128(dst, *x);
        }
    }
    for blk in rest {
        let mut b = [_mm_xor_si128(load128(blk), rk[0])];
        rounds::<NR, true, 1>(&mut b, rk);
        store128(blk, b[0]);
    }
}

/// XTS over one data unit starting with tweak `t`; returns the tweak after its last block.
#[target_feature(enable = "aes,sse2,pclmulqdq")]
pub(super) fn xts_unit<const NR: usize, const ENC: bool>(
    rk: &[__m128i; 15],
    mut t: __m128i,
    data: &mut [u8],
) -> __m128i {
    let (chunks, rest) = data.as_chunks_mut::<128>();
    // The eight tweaks of a chunk; each advances to the next chunk on its own (× α^8), so
    // no serial chain of doublings sits between the AES passes.
    let mut tw = [t; 8];
    for i in 1..8 {
        tw[i] = mulx(tw[i - 1]);
    }
    for c in chunks {
        let blocks: &mut [[u8; 16]; 8] = c.as_chunks_mut::<16>().0.try_into().expect("8 blocks");
        let mut next = tw;
        for x in next.iter_mut() {
            *x = mul_x8(*x);
        }
        t = next[0];
        let mut b = [_mm_setzero_si128(); 8];
        for i in 0..8 {
            b[i] = _mm_xor_si128(load128(&blocks[i]), _mm_xor_si128(tw[i], rk[0]));
        }
        rounds::<NR, ENC, 8>(&mut b, rk);
        for i in 0..8 {
            store128(&mut blocks[i], _mm_xor_si128(b[i], tw[i]));
        }
        tw = next;
    }
    for blk in rest.as_chunks_mut::<16>().0 {
        let mut b = [_mm_xor_si128(load128(blk), _mm_xor_si128(t, rk[0]))];
        rounds::<NR, ENC, 1>(&mut b, rk);
        store128(blk, _mm_xor_si128(b[0], t));
        t = mulx(t);
    }
    t
}

#[target_feature(enable = "aes,sse2,pclmulqdq")]
fn xts_nr<const NR: usize, const ENC: bool>(
    k1: &RoundKeys,
    k2: &RoundKeys,
    ivs: &mut [[u8; 16]],
    data: &mut [u8],
    unit: usize,
) {
    encrypt_blocks::<NR>(&k2.load(true), ivs);
    let rk = k1.load(ENC);
    for (iv, sector) in ivs.iter().zip(data.chunks_exact_mut(unit)) {
        xts_unit::<NR, ENC>(&rk, load128(iv), sector);
    }
}

/// XTS over `ivs.len()` data units of `unit` bytes (any multiple of 16).
///
/// # Safety
/// The CPU must support AES-NI, PCLMULQDQ and SSE2.
#[target_feature(enable = "aes,sse2,pclmulqdq")]
pub(super) unsafe fn xts(
    k1: &RoundKeys,
    k2: &RoundKeys,
    ivs: &mut [[u8; 16]],
    data: &mut [u8],
    unit: usize,
    enc: bool,
) {
    by_rounds_and_direction!(k1, enc, xts_nr(k1, k2, ivs, data, unit))
}

/// CBC decryption of one data unit: all blocks are independent given the ciphertext.
#[target_feature(enable = "aes,sse2,pclmulqdq")]
pub(super) fn cbc_decrypt_unit<const NR: usize>(rk: &[__m128i; 15], iv: __m128i, data: &mut [u8]) {
    let mut prev = iv;
    let (chunks, rest) = data.as_chunks_mut::<128>();
    for c in chunks {
        let blocks: &mut [[u8; 16]; 8] = c.as_chunks_mut::<16>().0.try_into().expect("8 blocks");
        let mut ct = [_mm_setzero_si128(); 8];
        let mut b = [_mm_setzero_si128(); 8];
        for i in 0..8 {
            ct[i] = load128(&blocks[i]);
            b[i] = _mm_xor_si128(ct[i], rk[0]);
        }
        rounds::<NR, false, 8>(&mut b, rk);
        store128(&mut blocks[0], _mm_xor_si128(b[0], prev));
        for i in 1..8 {
            store128(&mut blocks[i], _mm_xor_si128(b[i], ct[i - 1]));
        }
        prev = ct[7];
    }
    for blk in rest.as_chunks_mut::<16>().0 {
        let ct = load128(blk);
        let mut b = [_mm_xor_si128(ct, rk[0])];
        rounds::<NR, false, 1>(&mut b, rk);
        store128(blk, _mm_xor_si128(b[0], prev));
        prev = ct;
    }
}

/// CBC encryption of W data units side by side: block j of every unit in one pass.
#[target_feature(enable = "aes,sse2,pclmulqdq")]
fn cbc_encrypt_units<const NR: usize, const W: usize>(
    rk: &[__m128i; 15],
    ivs: &[[u8; 16]],
    data: &mut [u8],
    unit: usize,
) {
    let mut chain = [_mm_setzero_si128(); W];
    for (c, iv) in chain.iter_mut().zip(ivs) {
        *c = load128(iv);
    }
    let mut it = data.chunks_exact_mut(unit);
    let units: [&mut [u8]; W] = std::array::from_fn(|_| it.next().expect("W data units"));
    for off in (0..unit).step_by(16) {
        let mut b = [_mm_setzero_si128(); W];
        for i in 0..W {
            let blk: &[u8; 16] = units[i][off..off + 16].try_into().expect("block");
            b[i] = _mm_xor_si128(_mm_xor_si128(load128(blk), chain[i]), rk[0]);
        }
        rounds::<NR, true, W>(&mut b, rk);
        for i in 0..W {
            let blk: &mut [u8; 16] = (&mut units[i][off..off + 16]).try_into().expect("block");
            store128(blk, b[i]);
            chain[i] = b[i];
        }
    }
}

#[target_feature(enable = "aes,sse2,pclmulqdq")]
fn cbc_nr<const NR: usize>(
    k: &RoundKeys,
    ivs: &[[u8; 16]],
    data: &mut [u8],
    unit: usize,
    enc: bool,
) {
    if !enc {
        let rk = k.load(false);
        for (iv, sector) in ivs.iter().zip(data.chunks_exact_mut(unit)) {
            cbc_decrypt_unit::<NR>(&rk, load128(iv), sector);
        }
        return;
    }
    let rk = k.load(true);
    let (mut ivs, mut data) = (ivs, data);
    while !ivs.is_empty() {
        let w = match ivs.len() {
            8.. => 8,
            4..=7 => 4,
            2..=3 => 2,
            _ => 1,
        };
        let (iv_now, iv_rest) = ivs.split_at(w);
        let (d_now, d_rest) = data.split_at_mut(w * unit);
        match w {
            8 => cbc_encrypt_units::<NR, 8>(&rk, iv_now, d_now, unit),
            4 => cbc_encrypt_units::<NR, 4>(&rk, iv_now, d_now, unit),
            2 => cbc_encrypt_units::<NR, 2>(&rk, iv_now, d_now, unit),
            _ => cbc_encrypt_units::<NR, 1>(&rk, iv_now, d_now, unit),
        }
        ivs = iv_rest;
        data = d_rest;
    }
}

/// CBC over `ivs.len()` data units of `unit` bytes.
///
/// # Safety
/// The CPU must support AES-NI, PCLMULQDQ and SSE2.
#[target_feature(enable = "aes,sse2,pclmulqdq")]
pub(super) unsafe fn cbc(k: &RoundKeys, ivs: &[[u8; 16]], data: &mut [u8], unit: usize, enc: bool) {
    if k.rounds == 10 {
        cbc_nr::<10>(k, ivs, data, unit, enc)
    } else {
        cbc_nr::<14>(k, ivs, data, unit, enc)
    }
}
