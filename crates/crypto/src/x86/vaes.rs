//! VAES + AVX-512 XTS: four blocks per instruction, four registers in flight (16 blocks).
//!
//! Tweaks live in vector registers: lane j of a register holds T·α^j, and the next
//! registers' tweaks are derived by multiplying every lane by α^4, α^8, α^12 (independent,
//! so no serial chain). Per-sector starting tweaks are encrypted together up front.

use super::keys::{RoundKeys, load128};
use super::ni;
use core::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx512f")]
fn load512(b: &[u8; 64]) -> __m512i {
    // SAFETY: `b` is 64 readable bytes; unaligned load.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn store512(b: &mut [u8; 64], v: __m512i) {
    // SAFETY: `b` is 64 writable bytes; unaligned store.
    unsafe { _mm512_storeu_si512(b.as_mut_ptr().cast(), v) }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn xor3(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
    _mm512_ternarylogic_epi64(a, b, c, 0x96)
}

/// Folds the bits shifted out of each 128-bit lane back in: carries from the low qword go
/// to the high one, carries out of bit 127 are multiplied by x^7+x^2+x+1 (0x87) into the low.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn fold(shifted: __m512i, carry: __m512i) -> __m512i {
    let into_hi = _mm512_bslli_epi128(carry, 8);
    let c = _mm512_bsrli_epi128(carry, 8);
    let red = xor3(c, _mm512_slli_epi64(c, 1), _mm512_slli_epi64(c, 2));
    xor3(shifted, into_hi, _mm512_xor_si512(red, _mm512_slli_epi64(c, 7)))
}

/// Every lane times α^K (1 ≤ K ≤ 56); `R` must be 64 - K (stable Rust cannot compute it).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn mul_xk<const K: u32, const R: u32>(v: __m512i) -> __m512i {
    const { assert!(K + R == 64 && K <= 56) };
    fold(_mm512_slli_epi64::<K>(v), _mm512_srli_epi64::<R>(v))
}

/// [T, T·α, T·α², T·α³] from T.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn first_tweaks(t: __m128i) -> __m512i {
    let v = _mm512_broadcast_i32x4(t);
    let k = _mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0);
    let back = _mm512_sub_epi64(_mm512_set1_epi64(64), k);
    // A variable shift by 64 yields 0, which is exactly lane 0's (absent) carry.
    fold(_mm512_sllv_epi64(v, k), _mm512_srlv_epi64(v, back))
}

#[inline]
#[target_feature(enable = "avx512f,vaes")]
fn rounds4<const NR: usize, const ENC: bool>(b: &mut [__m512i; 4], rk: &[__m512i; 15]) {
    for r in 1..NR {
        for x in b.iter_mut() {
            *x = if ENC { _mm512_aesenc_epi128(*x, rk[r]) } else { _mm512_aesdec_epi128(*x, rk[r]) };
        }
    }
    for x in b.iter_mut() {
        *x = if ENC { _mm512_aesenclast_epi128(*x, rk[NR]) } else { _mm512_aesdeclast_epi128(*x, rk[NR]) };
    }
}

#[target_feature(enable = "avx512f,avx512bw,vaes,aes,sse2")]
fn xts_nr<const NR: usize, const ENC: bool>(
    k1: &RoundKeys,
    k2: &RoundKeys,
    ivs: &mut [[u8; 16]],
    data: &mut [u8],
    unit: usize,
) {
    ni::encrypt_blocks::<NR>(&k2.load(true), ivs);
    let rk128 = k1.load(ENC);
    let mut rk = [_mm512_setzero_si512(); 15];
    for (w, k) in rk.iter_mut().zip(rk128.iter()) {
        *w = _mm512_broadcast_i32x4(*k);
    }
    for (iv, sector) in ivs.iter().zip(data.chunks_exact_mut(unit)) {
        let mut z0 = first_tweaks(load128(iv));
        let (chunks, rest) = sector.as_chunks_mut::<256>();
        for c in chunks {
            let regs: &mut [[u8; 64]; 4] = c.as_chunks_mut::<64>().0.try_into().expect("4 registers");
            let z = [z0, mul_xk::<4, 60>(z0), mul_xk::<8, 56>(z0), mul_xk::<12, 52>(z0)];
            let mut b = [_mm512_setzero_si512(); 4];
            for i in 0..4 {
                b[i] = xor3(load512(&regs[i]), z[i], rk[0]);
            }
            rounds4::<NR, ENC>(&mut b, &rk);
            for i in 0..4 {
                store512(&mut regs[i], _mm512_xor_si512(b[i], z[i]));
            }
            z0 = mul_xk::<16, 48>(z0);
        }
        if !rest.is_empty() {
            ni::xts_unit::<NR, ENC>(&rk128, _mm512_castsi512_si128(z0), rest);
        }
    }
}

/// XTS over `ivs.len()` data units of `unit` bytes (any multiple of 16).
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW, VAES and AES-NI.
#[target_feature(enable = "avx512f,avx512bw,vaes,aes,sse2")]
pub(super) unsafe fn xts(k1: &RoundKeys, k2: &RoundKeys, ivs: &mut [[u8; 16]], data: &mut [u8], unit: usize, enc: bool) {
    match (k1.rounds, enc) {
        (10, true) => xts_nr::<10, true>(k1, k2, ivs, data, unit),
        (10, false) => xts_nr::<10, false>(k1, k2, ivs, data, unit),
        (_, true) => xts_nr::<14, true>(k1, k2, ivs, data, unit),
        (_, false) => xts_nr::<14, false>(k1, k2, ivs, data, unit),
    }
}
