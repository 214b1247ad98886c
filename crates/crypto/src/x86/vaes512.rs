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
    xor3(
        shifted,
        into_hi,
        _mm512_xor_si512(red, _mm512_slli_epi64(c, 7)),
    )
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

/// Rounds 1..NR of W registers; the last round key is per register (tweak folded in).
#[inline]
#[target_feature(enable = "avx512f,vaes")]
fn rounds<const NR: usize, const ENC: bool, const W: usize>(
    b: &mut [__m512i; W],
    rk: &[__m512i; 15],
    last: &[__m512i; W],
) {
    for r in 1..NR {
        for x in b.iter_mut() {
            *x = if ENC {
                _mm512_aesenc_epi128(*x, rk[r])
            } else {
                _mm512_aesdec_epi128(*x, rk[r])
            };
        }
    }
    for (x, l) in b.iter_mut().zip(last) {
        *x = if ENC {
            _mm512_aesenclast_epi128(*x, *l)
        } else {
            _mm512_aesdeclast_epi128(*x, *l)
        };
    }
}

/// Registers per pass: 8 × 4 blocks = 512 bytes, one whole small sector, so that enough
/// independent AES chains are in flight to cover the instruction latency.
const W: usize = 8;

/// Every lane times α^(8M), for 1 ≤ M ≤ 8 (`R` = 16 - M): a byte shift plus a carry-less
/// multiply of the M bytes shifted out by 0x87. Unlike bit shifts of 512-bit registers, which
/// compete with VAES for one port on current Intel cores, these run on another port.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
fn mul_x8m<const M: i32, const R: i32>(v: __m512i) -> __m512i {
    const { assert!(M + R == 16 && M >= 1 && M <= 8) };
    let out = _mm512_bsrli_epi128::<R>(v);
    let red = _mm512_clmulepi64_epi128::<0x00>(out, _mm512_set1_epi64(0x87));
    _mm512_xor_si512(_mm512_bslli_epi128::<M>(v), red)
}

/// Tweaks for W registers from the first two: register i+2 = register i × α^8.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
fn tweaks_from(z0: __m512i, z1: __m512i) -> [__m512i; W] {
    let mut z = [z0; W];
    z[1] = z1;
    for i in 2..W {
        z[i] = mul_x8m::<1, 15>(z[i - 2]);
    }
    z
}

#[target_feature(enable = "avx512f,avx512bw,vaes,vpclmulqdq,aes,pclmulqdq,sse2")]
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
        let mut z1 = mul_xk::<4, 60>(z0);
        let (chunks, rest) = sector.as_chunks_mut::<{ 64 * W }>();
        for c in chunks {
            let regs: &mut [[u8; 64]; W] =
                c.as_chunks_mut::<64>().0.try_into().expect("W registers");
            let z = tweaks_from(z0, z1);
            let mut b = [_mm512_setzero_si512(); W];
            let mut last = [_mm512_setzero_si512(); W];
            for i in 0..W {
                b[i] = xor3(load512(&regs[i]), z[i], rk[0]);
                last[i] = _mm512_xor_si512(rk[NR], z[i]);
            }
            rounds::<NR, ENC, W>(&mut b, &rk, &last);
            for i in 0..W {
                store512(&mut regs[i], b[i]);
            }
            z0 = mul_x8m::<4, 12>(z0);
            z1 = mul_x8m::<4, 12>(z1);
        }
        if !rest.is_empty() {
            ni::xts_unit::<NR, ENC>(k1, _mm512_castsi512_si128(z0), rest);
        }
    }
}

/// XTS over `ivs.len()` data units of `unit` bytes (any multiple of 16).
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW, VAES, VPCLMULQDQ and AES-NI.
#[target_feature(enable = "avx512f,avx512bw,vaes,vpclmulqdq,aes,pclmulqdq,sse2")]
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
