//! AES-GCM (NIST SP 800-38D) on 512-bit registers: VAES for the counter mode, VPCLMULQDQ
//! for GHASH, 32 blocks (eight registers) a step in the main loop, sixteen elsewhere.
//!
//! GHASH works in the byte-reflected form: each block is byte-reversed in its lane, so the
//! coefficient of x^0 is the top bit of the 128-bit integer. Carry-less products of two
//! such integers come out one bit short of the reflected product; the hash key powers are
//! therefore kept multiplied by x^-1, which makes a product reflected exactly, and the
//! 256-bit product is reduced modulo x^128 + x^7 + x^2 + x + 1 in two folds of 64 bits by
//! the constant 0xc2000000000000000000000000000001 (x^-1 mod G, reflected; the
//! two-step reduction of Gueron and Kounavis). The blocks of a step are each multiplied
//! by the power of H they need (H^32 or H^16 for the first ... H^1 for the last), the
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

/// Blocks of the main loop: two steps, eight registers in flight through the AES rounds
/// (four leave the AES units idle while each round's latency passes, as in the XTS code).
const WIDE: usize = 2 * STEP;

/// Expanded AES key and the hash key powers H^16 .. H^1 (each times x^-1, reflected),
/// followed by zero rows: a step of fewer than sixteen blocks reads its powers from row
/// `16 - blocks` on, and the rows its empty lanes meet multiply by zero.
pub(crate) struct GcmKeys {
    pub(crate) aes: RoundKeys,
    pub(crate) powers: [[u8; 16]; 2 * STEP],
    /// H^32 .. H^1 (as `powers`), for the main loop's 32 blocks.
    pub(crate) wide: [[u8; 16]; WIDE],
    /// For Karatsuba's middle product: each `wide` row with its two 64-bit halves XORed
    /// together, in both halves.
    pub(crate) folded: [[u8; 16]; WIDE],
}

impl Drop for GcmKeys {
    fn drop(&mut self) {
        crate::secret::wipe_blocks(&mut self.powers);
        crate::secret::wipe_blocks(&mut self.wide);
        crate::secret::wipe_blocks(&mut self.folded);
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

/// The products of `a` and `b` as Karatsuba forms them, three multiplications where
/// [`products`] takes four: low, high, and (a.lo + a.hi)(b.lo + b.hi), `bf` holding the
/// latter sum of `b` (a `folded` row). Summed over blocks, the middle of the 256-bit
/// product is then that third sum plus the low and high ones ([`karatsuba_middle`]).
/// VPCLMULQDQ on 512-bit registers is the scarcest unit in a step (on AMD's Zen 5 a
/// step's GHASH alone took longer than its AES rounds), so the extra XORs cost less than
/// the multiplication they save.
#[inline]
#[target_feature(enable = "avx512f,vpclmulqdq")]
fn karatsuba(a: __m512i, b: __m512i, bf: __m512i) -> [__m512i; 3] {
    let af = _mm512_xor_si512(a, _mm512_shuffle_epi32::<0x4e>(a));
    [
        _mm512_clmulepi64_epi128::<0x00>(a, b),
        _mm512_clmulepi64_epi128::<0x00>(af, bf),
        _mm512_clmulepi64_epi128::<0x11>(a, b),
    ]
}

/// Karatsuba's sums (low, a+b's, high) turned into the schoolbook's (low, middle, high).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn karatsuba_middle([lo, mid, hi]: [__m512i; 3]) -> [__m512i; 3] {
    [lo, xor3(mid, lo, hi), hi]
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

/// AES-encrypts the four blocks of each of the `N` registers with the round keys `rk`
/// (four: a last step of up to sixteen blocks; eight: a main-loop step with nothing to
/// hash).
#[inline]
#[target_feature(enable = "avx512f,vaes")]
fn aes_regs<const NR: usize, const N: usize>(
    rk: &[__m512i; 15],
    mut b: [__m512i; N],
) -> [__m512i; N] {
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
    // Row 31 - i of `wide` holds H^(i+1); `powers` has the last sixteen.
    let mut cur = h1;
    super::keys::store128(&mut k.wide[WIDE - 1], cur);
    for i in 1..WIDE {
        cur = mul1(cur, h1);
        super::keys::store128(&mut k.wide[WIDE - 1 - i], cur);
    }
    k.powers[..STEP].copy_from_slice(&k.wide[STEP..]);
    for row in &mut k.powers[STEP..] {
        *row = [0; 16];
    }
    for (f, p) in k.folded.iter_mut().zip(&k.wide) {
        let v = load128(p);
        super::keys::store128(f, _mm_xor_si128(v, _mm_shuffle_epi32::<0x4e>(v)));
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

/// Keeps the compiler from moving the multiplications of `t` above the AES round that
/// produced `b` (what it computes from `t` cannot start before this point in the code).
/// Left to itself, LLVM gathered a step's 26 carry-less multiplications ahead of all its
/// AES rounds, and on AMD's Zen 5 the step then took as long as its rounds and its hash
/// each alone, one after the other (the multiplications waiting on the multiplier
/// seemingly filled the scheduler the AES instructions must enter): with the two
/// interleaved, AES-GCM went from 16-18 to 21-23 GB/s. No instruction is emitted: the
/// values pass through an empty `asm!`.
#[inline]
#[target_feature(enable = "avx512f")]
fn in_order(b: &mut [__m512i; 8], t: &mut __m512i) {
    // SAFETY: an empty assembly block; it reads and writes only the registers it is
    // given, unchanged.
    unsafe {
        core::arch::asm!(
            "/* {0} {1} {2} {3} {4} {5} {6} {7} {8} */",
            inout(zmm_reg) b[0], inout(zmm_reg) b[1], inout(zmm_reg) b[2],
            inout(zmm_reg) b[3], inout(zmm_reg) b[4], inout(zmm_reg) b[5],
            inout(zmm_reg) b[6], inout(zmm_reg) b[7], inout(zmm_reg) *t,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
}

/// The main loop's work on 32 blocks: AES rounds on the eight counter registers `b`
/// (when `AES`), with GHASH of the 32 reflected blocks `text` (the state `s` folded into
/// the first) spread between the rounds, as the kernel's assembly spreads its
/// hash: one register's products after each of rounds 1-8 (register `i`'s kept from
/// moving above round `i` by [`in_order`]; a barrier after round `i + 1` instead ran at
/// 16.5 GB/s against 21), one reduction and lane fold for all of them. Returns the key
/// stream and the new state.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq")]
fn aes8_ghash32<const NR: usize, const AES: bool>(
    rk: &[__m512i; 15],
    k: &GcmKeys,
    mut b: [__m512i; 8],
    mut text: [__m512i; 8],
    s: __m128i,
) -> ([__m512i; 8], __m128i) {
    let poly = gf_poly();
    // Four rows a register, bounds-checked: the load reads the 64 bytes of the slice.
    let rows = |t: &[[u8; 16]; WIDE], i: usize| {
        let r: &[[u8; 16]] = &t[4 * i..4 * i + 4];
        // SAFETY: `r` is four rows, 64 readable bytes; unaligned load.
        unsafe { _mm512_loadu_si512(r.as_ptr().cast()) }
    };
    let (h, hf) = (|i| rows(&k.wide, i), |i| rows(&k.folded, i));
    macro_rules! round {
        ($r:expr) => {
            if AES {
                for x in b.iter_mut() {
                    *x = _mm512_aesenc_epi128(*x, rk[$r]);
                }
            }
        };
    }
    if AES {
        for x in b.iter_mut() {
            *x = _mm512_xor_si512(*x, rk[0]);
        }
    }
    round!(1);
    let mut sums = karatsuba(
        _mm512_xor_si512(text[0], _mm512_zextsi128_si512(s)),
        h(0),
        hf(0),
    );
    for i in 1..8 {
        if AES {
            in_order(&mut b, &mut text[i]);
        }
        round!(i + 1);
        for (a, p) in sums.iter_mut().zip(karatsuba(text[i], h(i), hf(i))) {
            *a = _mm512_xor_si512(*a, p);
        }
    }
    let [lo, mut mi, hi] = karatsuba_middle(sums);
    round!(9);
    mi = xor3(
        mi,
        _mm512_clmulepi64_epi128::<0x10>(lo, poly),
        _mm512_shuffle_epi32::<0x4e>(lo),
    );
    if AES {
        for key in &rk[10..NR] {
            for x in b.iter_mut() {
                *x = _mm512_aesenc_epi128(*x, *key);
            }
        }
    }
    let out = fold_lanes(xor3(
        hi,
        _mm512_clmulepi64_epi128::<0x10>(mi, poly),
        _mm512_shuffle_epi32::<0x4e>(mi),
    ));
    if AES {
        for x in b.iter_mut() {
            *x = _mm512_aesenclast_epi128(*x, rk[NR]);
        }
    }
    (b, out)
}

/// Counter mode and GHASH over `len` bytes from `src` to `dst` (which may be the same
/// address): encrypting (`ENC`: the output is hashed) or decrypting (the input is). `ctr`
/// is the next counter block (big-endian, as in the message) and moves on by the blocks
/// used; `y` is the hash state (reflected). Only the last call of a message may end inside
/// a block.
///
/// The main loop takes 32 blocks at a time ([`aes8_ghash32`]): encrypting, it hashes the
/// previous 32 blocks' ciphertext (kept in registers from its store: reloaded from memory
/// so soon after, it waited) beside its own AES rounds, so the hash never waits for the
/// cipher; decrypting, it hashes its own input. The last fewer than
/// 32 blocks take a step of sixteen and then masked loads and stores, and are hashed
/// after (encrypting) or before (decrypting, whose input may be overwritten) their AES.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes (equal or not overlapping); the CPU
/// has AVX-512F/BW/VL, VAES and VPCLMULQDQ.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq")]
pub(super) unsafe fn crypt<const NR: usize, const ENC: bool>(
    k: &GcmKeys,
    ctr: &mut [u8; 16],
    y: &mut [u8; 16],
    src: *const u8,
    dst: *mut u8,
    len: usize,
) {
    const BYTES: usize = WIDE * 16;
    let rk = round_keys(&k.aes);
    let reflect = reflect_mask();
    let mut c = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(load128(ctr)), reflect);
    c = _mm512_add_epi32(
        c,
        _mm512_set_epi32(0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0),
    );
    let counters = |c: __m512i| {
        let mut b = [_mm512_setzero_si512(); 8];
        for (i, x) in b.iter_mut().enumerate() {
            *x = _mm512_shuffle_epi8(_mm512_add_epi32(c, lane_add(4 * i as i32)), reflect);
        }
        b
    };
    // SAFETY (both): the caller vouches for `len` bytes at `src` and `dst`; called only
    // for 32 whole blocks below `len`.
    let load = |at: *const u8| {
        let mut v = [_mm512_setzero_si512(); 8];
        for (i, x) in v.iter_mut().enumerate() {
            // SAFETY: 512 bytes below `len` at `at` (see above).
            *x = unsafe { _mm512_loadu_si512(at.add(64 * i).cast()) };
        }
        v
    };
    // Stores the text at `at` XORed with the key stream; returns what it stored,
    // reflected (encrypting, the next step hashes it from these registers: reloaded from
    // memory so soon after its store, which may straddle cache lines, it waited).
    let xor_store = |at: usize, ks: [__m512i; 8]| {
        let mut out = [_mm512_setzero_si512(); 8];
        for (i, (k, o)) in ks.into_iter().zip(out.iter_mut()).enumerate() {
            // SAFETY: bytes `at .. at + 512` lie below `len` (see above).
            let input = unsafe { _mm512_loadu_si512(src.add(at + 64 * i).cast()) };
            *o = _mm512_xor_si512(input, k);
            // SAFETY: as for the load, in `dst`.
            unsafe { _mm512_storeu_si512(dst.add(at + 64 * i).cast(), *o) };
            *o = _mm512_shuffle_epi8(*o, reflect);
        }
        out
    };
    let mut s = load128(y);
    let mut done = 0;
    // Bytes of the text hashed so far.
    let mut hashed = 0;
    // Encrypting: the last 32 blocks' ciphertext, reflected, not hashed yet.
    let mut last = None;
    while len - done >= BYTES {
        // Encrypting, the previous 32 blocks' ciphertext (none before the first);
        // decrypting, this input.
        let text = if ENC {
            last
        } else {
            Some(load(src.wrapping_add(done)).map(|x| _mm512_shuffle_epi8(x, reflect)))
        };
        let ks = match text {
            Some(text) => {
                let (ks, next) = aes8_ghash32::<NR, true>(&rk, k, counters(c), text, s);
                s = next;
                hashed += BYTES;
                ks
            }
            None => aes_regs::<NR, 8>(&rk, counters(c)),
        };
        last = Some(xor_store(done, ks));
        c = _mm512_add_epi32(c, lane_add(WIDE as i32));
        done += BYTES;
    }
    if let (true, Some(text)) = (ENC, last) {
        s = aes8_ghash32::<NR, false>(&rk, k, [c; 8], text, s).1;
        hashed += BYTES;
    }
    // The hash of what is left from `hashed` on, at `from` (the ciphertext: `dst` when
    // encrypting, `src` when decrypting).
    let hash_rest = |s: &mut __m128i, from: *const u8, mut h: usize| {
        while h < len {
            let n = (len - h).min(STEP * 16);
            // SAFETY: the masked load reads only the `n` bytes below `len`.
            let text = unsafe { load_reflected(from.wrapping_add(h), n, reflect) };
            *s = ghash_step(k, *s, text, n.div_ceil(16));
            h += n;
        }
    };
    if !ENC {
        hash_rest(&mut s, src, hashed);
    }
    while done < len {
        let n = (len - done).min(STEP * 16);
        let ks = aes_regs::<NR, 4>(&rk, counters(c)[..4].try_into().expect("four registers"));
        let m = masks(n);
        // The pointers may pass the buffers' ends where the masks are zero: computed with
        // wrapping arithmetic, never dereferenced there.
        let (from, to) = (src.wrapping_add(done), dst.wrapping_add(done));
        for i in 0..4 {
            // SAFETY: the masked load and store touch only the bytes below `len` (the mask
            // is zero past it), which the caller vouches for.
            let input = unsafe { _mm512_maskz_loadu_epi8(m[i], from.wrapping_add(64 * i).cast()) };
            // SAFETY: as above.
            unsafe {
                _mm512_mask_storeu_epi8(
                    to.wrapping_add(64 * i).cast(),
                    m[i],
                    _mm512_xor_si512(input, ks[i]),
                )
            };
        }
        c = _mm512_add_epi32(c, lane_add(n.div_ceil(16) as i32));
        done += n;
    }
    if ENC {
        hash_rest(&mut s, dst.cast_const(), hashed);
    }
    super::keys::store128(y, s);
    super::keys::store128(ctr, _mm512_castsi512_si128(_mm512_shuffle_epi8(c, reflect)));
}

/// The GHASH state after a message's associated data (at most a step of it).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vpclmulqdq")]
fn aad_hash(k: &GcmKeys, aad: &[u8]) -> __m128i {
    debug_assert!(aad.len() <= STEP * 16);
    if aad.is_empty() {
        return _mm_setzero_si128();
    }
    // SAFETY: `aad` is readable for its length (at most a step).
    let text = unsafe { load_reflected(aad.as_ptr(), aad.len(), reflect_mask()) };
    let blocks = aad.len().div_ceil(16);
    if blocks <= 4 {
        // dm-crypt's 20 or 24 bytes: one register's four products, not a step's sixteen.
        // Block j is multiplied by H^(blocks - j): row 16 - blocks + j.
        // SAFETY: rows 12 .. 19 lie within the 32 (blocks >= 1).
        let h = unsafe { _mm512_loadu_si512(k.powers.as_ptr().add(STEP - blocks).cast()) };
        fold_lanes(reduce(products(text[0], h)))
    } else {
        ghash_step(k, _mm_setzero_si128(), text, blocks)
    }
}

/// A message's tag from its final GHASH state `s`: the length block hashed in, and the
/// result masked with E(K, J0) (computed here, on the 128-bit instructions: an
/// independent chain the counter mode before it overlaps).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vpclmulqdq,aes")]
fn tag_of<const NR: usize>(
    k: &GcmKeys,
    nonce: &[u8; 12],
    s: __m128i,
    aad_len: usize,
    len: usize,
) -> [u8; 16] {
    let mut j0 = [0u8; 16];
    j0[..12].copy_from_slice(nonce);
    j0[15] = 1;
    let mut e = _mm_xor_si128(load128(&j0), load128(&k.aes.enc[0]));
    for key in &k.aes.enc[1..NR] {
        e = _mm_aesenc_si128(e, load128(key));
    }
    e = _mm_aesenclast_si128(e, load128(&k.aes.enc[NR]));
    let h1 = load128(&k.powers[STEP - 1]);
    let lens = _mm_set_epi64x((aad_len as u64 * 8) as i64, (len as u64 * 8) as i64);
    let s = mul1(_mm_xor_si128(s, lens), h1);
    let tag = _mm_xor_si128(
        _mm_shuffle_epi8(s, _mm512_castsi512_si128(reflect_mask())),
        e,
    );
    let mut out = [0u8; 16];
    super::keys::store128(&mut out, tag);
    out
}

/// A whole message in place in one call: the associated data's hash (at most a step of
/// it), the text, the length block, and the tag (returned: the one to store when
/// encrypting, the one to compare with when decrypting). One function, so the set-up's
/// short dependency chains overlap the counter mode instead of each waiting behind a
/// call: through [`crate::gcm::GcmMessage`] they cost ~50 ns a message, a fifth of a
/// 4 KiB sector.
///
/// # Safety
/// `data` readable and writable for `len` bytes; `aad` at most 256 bytes; the CPU has
/// AVX-512F/BW/VL, VAES and VPCLMULQDQ.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq")]
pub(super) unsafe fn message<const NR: usize, const ENC: bool>(
    k: &GcmKeys,
    nonce: &[u8; 12],
    aad: &[u8],
    data: *mut u8,
    len: usize,
) -> [u8; 16] {
    let mut ctr = [0u8; 16];
    ctr[..12].copy_from_slice(nonce);
    ctr[15] = 2;
    let mut y = [0u8; 16];
    super::keys::store128(&mut y, aad_hash(k, aad));
    // SAFETY: the caller's `data` and `len`, in place.
    unsafe { crypt::<NR, ENC>(k, &mut ctr, &mut y, data, data, len) };
    tag_of::<NR>(k, nonce, load128(&y), aad.len(), len)
}

/// `nonces.len()` messages of `len` bytes each, one after another at `data`, in place:
/// message `i` under `nonces[i]` with associated data `aads[i]` (at most a step), its tag
/// into `tags[i]` (the one to store, or to compare with). `len` a multiple of 512: a
/// request's sectors, as one stream of 32-block steps, so that one sector's last hash
/// overlaps the next one's first AES rounds (encrypting) instead of each sector starting
/// and ending with a step of one kind alone; 512-byte sectors, one step each, gain most.
///
/// # Safety
/// `data` readable and writable for `nonces.len() * len` bytes; `aads` and `tags` as long
/// as `nonces`; the CPU has AVX-512F/BW/VL, VAES and VPCLMULQDQ.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,vaes,vpclmulqdq")]
pub(super) unsafe fn sectors<const NR: usize, const ENC: bool>(
    k: &GcmKeys,
    nonces: &[[u8; 12]],
    aads: &[&[u8]],
    data: *mut u8,
    len: usize,
    tags: &mut [[u8; 16]],
) {
    const BYTES: usize = WIDE * 16;
    debug_assert!(len.is_multiple_of(BYTES) && len > 0);
    debug_assert!(aads.len() == nonces.len() && tags.len() == nonces.len());
    let rk = round_keys(&k.aes);
    let reflect = reflect_mask();
    // The first counter register of message `i` (counter blocks 2 .. 5).
    let first_counters = |nonce: &[u8; 12]| {
        let mut ctr = [0u8; 16];
        ctr[..12].copy_from_slice(nonce);
        ctr[15] = 2;
        _mm512_add_epi32(
            _mm512_shuffle_epi8(_mm512_broadcast_i32x4(load128(&ctr)), reflect),
            _mm512_set_epi32(0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0),
        )
    };
    let counters = |c: __m512i| {
        let mut b = [_mm512_setzero_si512(); 8];
        for (i, x) in b.iter_mut().enumerate() {
            *x = _mm512_shuffle_epi8(_mm512_add_epi32(c, lane_add(4 * i as i32)), reflect);
        }
        b
    };
    let load = |step: usize| {
        let mut v = [_mm512_setzero_si512(); 8];
        for (i, x) in v.iter_mut().enumerate() {
            // SAFETY: 512 bytes at step `step` (below `total`), within the caller's `data`.
            *x = unsafe { _mm512_loadu_si512(data.add(step * BYTES + 64 * i).cast()) };
        }
        v
    };
    // Stores the step's text XORed with the key stream; returns it reflected (the
    // ciphertext the next step hashes, when encrypting).
    let xor_store = |step: usize, ks: [__m512i; 8]| {
        let mut out = [_mm512_setzero_si512(); 8];
        for (i, (k, o)) in ks.into_iter().zip(out.iter_mut()).enumerate() {
            let at = data.wrapping_add(step * BYTES + 64 * i);
            // SAFETY: as in `load`.
            *o = _mm512_xor_si512(unsafe { _mm512_loadu_si512(at.cast()) }, k);
            // SAFETY: as in `load`; `data` is writable.
            unsafe { _mm512_storeu_si512(at.cast(), *o) };
            *o = _mm512_shuffle_epi8(*o, reflect);
        }
        out
    };
    let per = len / BYTES;
    let total = nonces.len() * per;
    let mut c = _mm512_setzero_si512();
    // The hash state of the message being hashed.
    let mut s = _mm_setzero_si128();
    // Encrypting: the last step's ciphertext, reflected, not hashed yet.
    let mut last = None;
    // Message and step within it of the step encrypted, and of the step hashed: the one
    // before (encrypting) or the same. Counted, not divided: a division a step cost a
    // sixth of a 4 KiB sector.
    let (mut i, mut w) = (0, 0);
    let (mut hi, mut hw) = (0, 0);
    for step in 0..total {
        if w == 0 {
            c = first_counters(&nonces[i]);
        }
        let b = counters(c);
        c = _mm512_add_epi32(c, lane_add(WIDE as i32));
        let text = if ENC {
            last
        } else {
            Some(load(step).map(|x| _mm512_shuffle_epi8(x, reflect)))
        };
        let ks = match text {
            Some(text) => {
                if hw == 0 {
                    s = aad_hash(k, aads[hi]);
                }
                let (ks, next) = aes8_ghash32::<NR, true>(&rk, k, b, text, s);
                s = next;
                if hw == per - 1 {
                    tags[hi] = tag_of::<NR>(k, &nonces[hi], s, aads[hi].len(), len);
                    (hi, hw) = (hi + 1, 0);
                } else {
                    hw += 1;
                }
                ks
            }
            None => aes_regs::<NR, 8>(&rk, b),
        };
        last = Some(xor_store(step, ks));
        if w == per - 1 {
            (i, w) = (i + 1, 0);
        } else {
            w += 1;
        }
    }
    if let (true, Some(text)) = (ENC, last) {
        if hw == 0 {
            s = aad_hash(k, aads[hi]);
        }
        s = aes8_ghash32::<NR, false>(&rk, k, [c; 8], text, s).1;
        tags[hi] = tag_of::<NR>(k, &nonces[hi], s, aads[hi].len(), len);
    }
}
