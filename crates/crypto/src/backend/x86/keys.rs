//! AES key expansion with AES-NI (AESKEYGENASSIST), encryption and decryption schedules.

use core::arch::x86_64::*;
use zeroize::Zeroize;

/// Expanded AES-128 or AES-256 key: encryption round keys and the equivalent-inverse-cipher
/// decryption round keys (AESIMC applied). Wiped on drop.
pub(crate) struct RoundKeys {
    pub(crate) enc: [[u8; 16]; 15],
    pub(crate) dec: [[u8; 16]; 15],
    /// Both schedules with every round key twice (both lanes of a 256-bit register), so
    /// the VAES paths use them as memory operands with no per-call broadcast.
    pub(crate) enc_wide: [[u8; 32]; 15],
    pub(crate) dec_wide: [[u8; 32]; 15],
    /// 10 or 14.
    pub(crate) rounds: usize,
}

impl Drop for RoundKeys {
    fn drop(&mut self) {
        self.enc.as_flattened_mut().zeroize();
        self.dec.as_flattened_mut().zeroize();
        self.enc_wide.as_flattened_mut().zeroize();
        self.dec_wide.as_flattened_mut().zeroize();
    }
}

impl RoundKeys {
    /// An empty schedule, to be filled in place by [`RoundKeys::expand`].
    pub(crate) fn blank() -> Self {
        RoundKeys {
            enc: [[0; 16]; 15],
            dec: [[0; 16]; 15],
            enc_wide: [[0; 32]; 15],
            dec_wide: [[0; 32]; 15],
            rounds: 0,
        }
    }

    /// Expands `key` into `self` in place (so the schedule is never copied around);
    /// `Err` if the CPU has no AES-NI or the key is not 16 or 32 bytes.
    pub(crate) fn expand(&mut self, key: &[u8]) -> Result<(), ()> {
        if !crate::Backend::AesNi.is_supported() {
            return Err(());
        }
        match key.len() {
            // SAFETY: AES-NI and SSE4.1 presence checked just above.
            16 => unsafe { expand128(key.try_into().map_err(|_| ())?, self) },
            // SAFETY: as above.
            32 => unsafe { expand256(key.try_into().map_err(|_| ())?, self) },
            _ => return Err(()),
        }
        Ok(())
    }

    /// Round keys as registers: encryption or decryption schedule.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(crate) fn load(&self, enc: bool) -> [__m128i; 15] {
        let src = if enc { &self.enc } else { &self.dec };
        let mut out = [_mm_setzero_si128(); 15];
        for (o, k) in out.iter_mut().zip(src) {
            *o = load128(k);
        }
        out
    }
}

/// Data unit `i` (of `unit` bytes) of `src` when out of place, as whole passes of `P`
/// bytes and the rest. A `match`: `Option::map` was left as a call in the big XTS loop
/// functions, and around a call every vector register (the unit's first tweaks) went to
/// the stack and back, on the path from the IV to the first round.
#[inline(always)]
pub(super) fn source_unit<const P: usize>(
    src: Option<&[u8]>,
    i: usize,
    unit: usize,
) -> (Option<&[[u8; P]]>, Option<&[u8]>) {
    match src {
        Some(s) => {
            let (passes, rest) = s[i * unit..(i + 1) * unit].as_chunks::<P>();
            (Some(passes), Some(rest))
        }
        None => (None, None),
    }
}

#[inline]
#[target_feature(enable = "sse2")]
pub(crate) fn load128(b: &[u8; 16]) -> __m128i {
    // SAFETY: `b` is 16 readable bytes; unaligned load.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "sse2")]
pub(crate) fn store128(b: &mut [u8; 16], v: __m128i) {
    // SAFETY: `b` is 16 writable bytes; unaligned store.
    unsafe { _mm_storeu_si128(b.as_mut_ptr().cast(), v) }
}

/// k ^ (k << 32) ^ (k << 64) ^ (k << 96): the running XOR of the key schedule's words.
#[inline]
#[target_feature(enable = "sse2")]
fn prefix_xor(k: __m128i) -> __m128i {
    let k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    let k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    _mm_xor_si128(k, _mm_slli_si128(k, 4))
}

#[target_feature(enable = "aes,sse2")]
fn finish(rk: &mut RoundKeys, regs: &[__m128i]) {
    let nr = regs.len() - 1;
    rk.rounds = nr;
    for (dst, r) in rk.enc.iter_mut().zip(regs) {
        store128(dst, *r);
    }
    store128(&mut rk.dec[0], regs[nr]);
    for i in 1..nr {
        store128(&mut rk.dec[i], _mm_aesimc_si128(regs[nr - i]));
    }
    store128(&mut rk.dec[nr], regs[0]);
    for (wide, k) in rk.enc_wide.iter_mut().zip(&rk.enc) {
        wide[..16].copy_from_slice(k);
        wide[16..].copy_from_slice(k);
    }
    for (wide, k) in rk.dec_wide.iter_mut().zip(&rk.dec) {
        wide[..16].copy_from_slice(k);
        wide[16..].copy_from_slice(k);
    }
}

macro_rules! round128 {
    ($k:expr, $rcon:literal) => {{
        let t = _mm_shuffle_epi32(_mm_aeskeygenassist_si128($k, $rcon), 0xff);
        _mm_xor_si128(prefix_xor($k), t)
    }};
}

#[target_feature(enable = "aes,sse2")]
fn expand128(key: &[u8; 16], rk: &mut RoundKeys) {
    let mut r = [_mm_setzero_si128(); 11];
    r[0] = load128(key);
    r[1] = round128!(r[0], 0x01);
    r[2] = round128!(r[1], 0x02);
    r[3] = round128!(r[2], 0x04);
    r[4] = round128!(r[3], 0x08);
    r[5] = round128!(r[4], 0x10);
    r[6] = round128!(r[5], 0x20);
    r[7] = round128!(r[6], 0x40);
    r[8] = round128!(r[7], 0x80);
    r[9] = round128!(r[8], 0x1b);
    r[10] = round128!(r[9], 0x36);
    finish(rk, &r);
    r.iter_mut().for_each(|x| *x = _mm_setzero_si128());
    // Keep the wipe of the (spilled) registers from being optimized away.
    std::hint::black_box(&mut r);
}

macro_rules! round256 {
    ($r:ident, $i:literal, $rcon:literal) => {{
        let t = _mm_shuffle_epi32(_mm_aeskeygenassist_si128($r[$i - 1], $rcon), 0xff);
        $r[$i] = _mm_xor_si128(prefix_xor($r[$i - 2]), t);
    }};
    (odd $r:ident, $i:literal) => {{
        let t = _mm_shuffle_epi32(_mm_aeskeygenassist_si128($r[$i - 1], 0), 0xaa);
        $r[$i] = _mm_xor_si128(prefix_xor($r[$i - 2]), t);
    }};
}

#[target_feature(enable = "aes,sse2")]
fn expand256(key: &[u8; 32], rk: &mut RoundKeys) {
    let mut r = [_mm_setzero_si128(); 15];
    r[0] = load128(key[..16].try_into().expect("16 bytes"));
    r[1] = load128(key[16..].try_into().expect("16 bytes"));
    round256!(r, 2, 0x01);
    round256!(odd r, 3);
    round256!(r, 4, 0x02);
    round256!(odd r, 5);
    round256!(r, 6, 0x04);
    round256!(odd r, 7);
    round256!(r, 8, 0x08);
    round256!(odd r, 9);
    round256!(r, 10, 0x10);
    round256!(odd r, 11);
    round256!(r, 12, 0x20);
    round256!(odd r, 13);
    round256!(r, 14, 0x40);
    finish(rk, &r);
    r.iter_mut().for_each(|x| *x = _mm_setzero_si128());
    // Keep the wipe of the (spilled) registers from being optimized away.
    std::hint::black_box(&mut r);
}
