//! AES-GCM (NIST SP 800-38D) on 512-bit registers: VAES for the counter mode, VPCLMULQDQ
//! for GHASH, sixteen blocks a step.
//!
//! GHASH works in the byte-reflected form: each block is byte-reversed in its lane, so the
//! coefficient of x^0 is the top bit of the 128-bit integer. Carry-less products of two
//! such integers come out one bit short of the reflected product; the hash key powers are
//! therefore kept multiplied by x^-1, which makes a product reflected exactly, and the
//! 256-bit product is reduced modulo x^128 + x^7 + x^2 + x + 1 in two folds of 64 bits by
//! the constant 0xc2000000000000000000000000000001 (x^-1 mod G, reflected; the
//! two-step reduction of Gueron and Kounavis). The sixteen blocks of a step are each
//! multiplied by the power of H they need (H^16 for the first ... H^1 for the last), the
//! products summed unreduced and reduced once.
//!
//! Counter blocks are kept byte-reflected too: the 32-bit big-endian counter is then the
//! low doubleword of each lane, and a plain 32-bit vector add is GCM's inc32.

use core::arch::x86_64::*;

use super::RoundKeys;
use super::keys::load128;
use super::vaes512::xor3;

/// Blocks a step: four registers of four.
const STEP: usize = 16;

/// Expanded AES key and the hash key powers H^16 .. H^1 (each times x^-1, reflected),
/// followed by zero rows: a step of fewer than sixteen blocks reads its powers from row
/// `16 - blocks` on, and the rows its empty lanes meet multiply by zero.
pub(crate) struct GcmKeys {
    pub(crate) aes: RoundKeys,
    pub(crate) powers: [[u8; 16]; 2 * STEP],
}

impl Drop for GcmKeys {
    fn drop(&mut self) {
        crate::secret::wipe_blocks(&mut self.powers);
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn reflect_mask() -> __m512i {
    _mm512_broadcast_i32x4(_mm_set_epi8(
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
    ))
}

#[inline]
#[target_feature(enable = "avx512f")]
fn gf_poly() -> __m512i {
    _mm512_broadcast_i32x4(_mm_set_epi64x(0xc200_0000_0000_0000_u64 as i64, 1))
}

/// The unreduced 256-bit products of each lane of `a` and `b`: low, middle, high.
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn products(a: __m512i, b: __m512i) -> [__m512i; 3] {
    let lo = _mm512_clmulepi64_epi128::<0x00>(a, b);
    let mi = _mm512_xor_si512(
        _mm512_clmulepi64_epi128::<0x01>(a, b),
        _mm512_clmulepi64_epi128::<0x10>(a, b),
    );
    let hi = _mm512_clmulepi64_epi128::<0x11>(a, b);
    [lo, mi, hi]
}

/// Each lane's 256-bit product (low, middle, high) reduced to 128 bits: the low half folded
/// into the middle, then the middle into the high.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
fn reduce([lo, mi, hi]: [__m512i; 3]) -> __m512i {
    let poly = gf_poly();
    let mi = xor3(
        mi,
        _mm512_clmulepi64_epi128::<0x10>(lo, poly),
        _mm512_shuffle_epi32::<0x4e>(lo),
    );
    xor3(
        hi,
        _mm512_clmulepi64_epi128::<0x10>(mi, poly),
        _mm512_shuffle_epi32::<0x4e>(mi),
    )
}

/// The XOR of the four lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold_lanes(v: __m512i) -> __m128i {
    let h = _mm256_xor_si256(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v));
    _mm_xor_si128(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// `x` (reflected) times `h` (a power row: times x^-1, reflected), reduced.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
fn mul1(x: __m128i, h: __m128i) -> __m128i {
    let p = reduce(products(
        _mm512_zextsi128_si512(x),
        _mm512_zextsi128_si512(h),
    ));
    _mm512_castsi512_si128(p)
}

/// AES-encrypts the four blocks of each register with the round keys `rk`.
#[inline]
#[target_feature(enable = "avx512f,vaes")]
fn aes4<const NR: usize>(rk: &[__m512i; 15], mut b: [__m512i; 4]) -> [__m512i; 4] {
    for x in b.iter_mut() {
        *x = _mm512_xor_si512(*x, rk[0]);
    }
    for k in &rk[1..NR] {
        for x in b.iter_mut() {
            *x = _mm512_aesenc_epi128(*x, *k);
        }
    }
    for x in b.iter_mut() {
        *x = _mm512_aesenclast_epi128(*x, rk[NR]);
    }
    b
}

#[inline]
#[target_feature(enable = "avx512f")]
fn round_keys(k: &RoundKeys) -> [__m512i; 15] {
    let mut rk = [_mm512_setzero_si512(); 15];
    for (r, key) in rk.iter_mut().zip(&k.enc) {
        *r = _mm512_broadcast_i32x4(load128(key));
    }
    rk
}

/// E(K, block) for one block, on the 128-bit AES instructions (a message's E(K, J0): four
/// ZMM registers of it cost a third more AES work on 512-byte sectors).
#[target_feature(enable = "aes,sse2")]
pub(super) fn encrypt_block(k: &RoundKeys, block: &mut [u8; 16]) {
    let nr = k.rounds;
    let mut b = _mm_xor_si128(load128(block), load128(&k.enc[0]));
    for key in &k.enc[1..nr] {
        b = _mm_aesenc_si128(b, load128(key));
    }
    b = _mm_aesenclast_si128(b, load128(&k.enc[nr]));
    super::keys::store128(block, b);
}

/// Fills in the hash key powers from the expanded AES key.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq")]
pub(super) fn init(k: &mut GcmKeys) {
    let mut h = [0u8; 16];
    encrypt_block(&k.aes, &mut h);
    // Reflected H, then times x^-1: a left shift of the 128-bit integer by one, and where
    // the top bit (x^0) falls out, x^-1 = x^127 + x^6 + x + 1 added back.
    let r = _mm_shuffle_epi8(load128(&h), _mm512_castsi512_si128(reflect_mask()));
    let mut words = [0u64; 2];
    // SAFETY: `words` is 16 writable bytes; unaligned store.
    unsafe { _mm_storeu_si128(words.as_mut_ptr().cast(), r) };
    let v = u128::from(words[0]) | (u128::from(words[1]) << 64);
    let mut p = v << 1;
    if v >> 127 == 1 {
        p ^= 0xc200_0000_0000_0000_0000_0000_0000_0001;
    }
    let h1 = _mm_set_epi64x((p >> 64) as u64 as i64, p as u64 as i64);
    // H^(i+1) x^-1 = (H^i x^-1) * H: the product of a row and H x^-1 as `mul1` forms it.
    // Row 15 - i holds H^(i+1).
    let mut cur = h1;
    super::keys::store128(&mut k.powers[STEP - 1], cur);
    for i in 1..STEP {
        cur = mul1(cur, h1);
        super::keys::store128(&mut k.powers[STEP - 1 - i], cur);
    }
    for row in &mut k.powers[STEP..] {
        *row = [0; 16];
    }
    crate::secret::wipe_blocks(std::slice::from_mut(&mut h));
}

/// Hashes `data` (zero-padded to whole blocks) into the state `y` (reflected), up to
/// sixteen blocks a step: a sector's 20 or 24 bytes of associated data in one
/// multiplication and reduction, not one per block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vpclmulqdq")]
pub(super) fn ghash(k: &GcmKeys, y: &mut [u8; 16], data: &[u8]) {
    let reflect = reflect_mask();
    let mut s = load128(y);
    for chunk in data.chunks(STEP * 16) {
        // SAFETY: `chunk` is readable for its length.
        let text = unsafe { load_reflected(chunk.as_ptr(), chunk.len(), reflect) };
        s = ghash_step(k, s, text, chunk.len().div_ceil(16));
    }
    super::keys::store128(y, s);
}

/// Hashes the length block (bit lengths of the additional data and the text) into `y`,
/// and returns the hash in the normal byte order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vpclmulqdq")]
pub(super) fn ghash_finish(k: &GcmKeys, y: &[u8; 16], aad_bits: u64, text_bits: u64) -> [u8; 16] {
    let h1 = load128(&k.powers[STEP - 1]);
    let len = _mm_set_epi64x(aad_bits as i64, text_bits as i64);
    let s = mul1(_mm_xor_si128(load128(y), len), h1);
    let mut out = [0u8; 16];
    super::keys::store128(
        &mut out,
        _mm_shuffle_epi8(s, _mm512_castsi512_si128(reflect_mask())),
    );
    out
}

/// Byte masks of the four 64-byte registers for the first `n` bytes of a step.
#[inline]
fn masks(n: usize) -> [u64; 4] {
    let mut m = [0u64; 4];
    for (i, x) in m.iter_mut().enumerate() {
        let bytes = n.saturating_sub(64 * i).min(64);
        *x = if bytes == 64 { !0 } else { (1u64 << bytes) - 1 };
    }
    m
}

/// One step of GHASH: the state `s` XORed into the first block of `hashed` (reflected
/// blocks, the step's `blocks` of them first), each block multiplied by its power of H,
/// summed, reduced.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vpclmulqdq")]
fn ghash_step(k: &GcmKeys, s: __m128i, mut hashed: [__m512i; 4], blocks: usize) -> __m128i {
    hashed[0] = _mm512_xor_si512(hashed[0], _mm512_zextsi128_si512(s));
    // Block j of the step is multiplied by H^(blocks - j): row 16 - blocks + j.
    let first = STEP - blocks;
    let mut acc = [_mm512_setzero_si512(); 3];
    for (i, x) in hashed.into_iter().enumerate() {
        // SAFETY: rows `first + 4 i .. + 4` lie within the 32 rows (first <= 15, i <= 3).
        let h = unsafe { _mm512_loadu_si512(k.powers.as_ptr().add(first + 4 * i).cast()) };
        for (a, p) in acc.iter_mut().zip(products(x, h)) {
            *a = _mm512_xor_si512(*a, p);
        }
    }
    fold_lanes(reduce(acc))
}

/// The `n` bytes (at most a step's) at `at`, zero-padded to the step and byte-reflected
/// per block, as GHASH takes them.
///
/// # Safety
/// `at` readable for `n` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_reflected(at: *const u8, n: usize, reflect: __m512i) -> [__m512i; 4] {
    let mut t = [_mm512_setzero_si512(); 4];
    if n == STEP * 16 {
        for (i, x) in t.iter_mut().enumerate() {
            // SAFETY: the 256 bytes at `at` are readable (the caller's `n`).
            *x = _mm512_shuffle_epi8(
                unsafe { _mm512_loadu_si512(at.add(64 * i).cast()) },
                reflect,
            );
        }
    } else {
        let m = masks(n);
        for (i, x) in t.iter_mut().enumerate() {
            // SAFETY: the masked load reads only the first `n` bytes (the mask is zero past
            // them); the address is formed with wrapping arithmetic.
            let v = unsafe { _mm512_maskz_loadu_epi8(m[i], at.wrapping_add(64 * i).cast()) };
            *x = _mm512_shuffle_epi8(v, reflect);
        }
    }
    t
}

/// `n` in the low doubleword of each lane (a counter increment).
#[inline]
#[target_feature(enable = "avx512f")]
fn lane_add(n: i32) -> __m512i {
    _mm512_broadcast_i32x4(_mm_set_epi32(0, 0, 0, n))
}

/// Counter mode and GHASH over `len` bytes from `src` to `dst` (which may be the same
/// address): encrypting (`ENC`: the output is hashed) or decrypting (the input is). `ctr`
/// is the next counter block (big-endian, as in the message) and moves on by the blocks
/// used; `y` is the hash state (reflected). Only the last call of a message may end inside
/// a block.
///
/// Encrypting, each step hashes the ciphertext of the step before while its own counter
/// blocks go through AES, so the hash never waits for the cipher.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes (equal or not overlapping); the CPU
/// has AVX-512F/BW/VL, VAES and VPCLMULQDQ.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq")]
pub(super) unsafe fn crypt<const NR: usize, const ENC: bool>(
    k: &GcmKeys,
    ctr: &mut [u8; 16],
    y: &mut [u8; 16],
    src: *const u8,
    dst: *mut u8,
    len: usize,
) {
    let rk = round_keys(&k.aes);
    let reflect = reflect_mask();
    let mut c = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(load128(ctr)), reflect);
    c = _mm512_add_epi32(
        c,
        _mm512_set_epi32(0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0),
    );
    let mut s = load128(y);
    // Encrypting: where the previous step's ciphertext went, its length and block count
    // (reloaded from there rather than kept: four fewer registers live across the AES
    // rounds, which otherwise spill).
    let mut pending: Option<(*const u8, usize, usize)> = None;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(STEP * 16);
        let blocks = n.div_ceil(16);
        let mut b = [_mm512_setzero_si512(); 4];
        for (i, x) in b.iter_mut().enumerate() {
            *x = _mm512_shuffle_epi8(_mm512_add_epi32(c, lane_add(4 * i as i32)), reflect);
        }
        let ks = aes4::<NR>(&rk, b);
        if let Some((at, pn, pb)) = pending.take() {
            // SAFETY: `at` is where the previous step stored its `pn` bytes of ciphertext
            // (within `dst`, writable hence readable); the masked load reads no byte past them.
            let text = unsafe { load_reflected(at, pn, reflect) };
            s = ghash_step(k, s, text, pb);
        }
        let mut text = [_mm512_setzero_si512(); 4];
        // The pointers may pass the buffers' ends where the masks are zero: computed with
        // wrapping arithmetic, never dereferenced there.
        let (from, to) = (src.wrapping_add(done), dst.wrapping_add(done));
        if n == STEP * 16 {
            for i in 0..4 {
                // SAFETY: bytes `done .. done + 256` lie below `len` (n == 256).
                let input = unsafe { _mm512_loadu_si512(from.add(64 * i).cast()) };
                let out = _mm512_xor_si512(input, ks[i]);
                // SAFETY: as above.
                unsafe { _mm512_storeu_si512(to.add(64 * i).cast(), out) };
                text[i] = if ENC { out } else { input };
            }
        } else {
            let m = masks(n);
            for i in 0..4 {
                // SAFETY: the masked load and store touch only the bytes below `len` (the
                // mask is zero past it), which the caller vouches for.
                let input =
                    unsafe { _mm512_maskz_loadu_epi8(m[i], from.wrapping_add(64 * i).cast()) };
                let out = _mm512_xor_si512(input, ks[i]);
                // SAFETY: as above.
                unsafe { _mm512_mask_storeu_epi8(to.wrapping_add(64 * i).cast(), m[i], out) };
                // The hash takes the last block zero-padded.
                text[i] = if ENC {
                    _mm512_maskz_mov_epi8(m[i], out)
                } else {
                    input
                };
            }
        }
        if ENC {
            pending = Some((to.cast_const(), n, blocks));
        } else {
            for t in text.iter_mut() {
                *t = _mm512_shuffle_epi8(*t, reflect);
            }
            s = ghash_step(k, s, text, blocks);
        }
        c = _mm512_add_epi32(c, lane_add(blocks as i32));
        done += n;
    }
    if let Some((at, pn, pb)) = pending {
        // SAFETY: as in the loop.
        let text = unsafe { load_reflected(at, pn, reflect) };
        s = ghash_step(k, s, text, pb);
    }
    super::keys::store128(y, s);
    super::keys::store128(ctr, _mm512_castsi512_si128(_mm512_shuffle_epi8(c, reflect)));
}
