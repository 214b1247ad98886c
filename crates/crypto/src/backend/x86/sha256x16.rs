//! SHA-256 (FIPS 180-4) of up to 32 messages side by side on 512-bit registers: lane `i`
//! of every register of a set belongs to one message, so each instruction does one step of
//! sixteen hashes, and a second set's rounds run interleaved with the first's. A request's
//! sectors all have one length, which is what this needs.
//!
//! Why: the SHA instructions hash one message at a time, one round after another (about
//! 2 GB/s a core on AMD Zen 5 and Intel alike), which left the HMAC modes of LUKS2 with
//! integrity at a third of plain XTS over NBD. Lanes of plain integer vector code
//! (rotates, three-input logic, adds) keep the vector units busy instead: sixteen lanes'
//! rounds are one chain of dependent steps, two sets of sixteen two chains.
//!
//! Messages are `prefix || body`: the prefix (associated data: the sector number and IV,
//! or dm-integrity's salt and sector) a whole number of 32-bit words, at most 52 bytes,
//! so that it and the padding fit the last block; the body a whole number of 64-byte
//! blocks (a sector). Blocks are read straight from each message in place: the first one
//! joins the prefix and the body's start with masked loads (a masked-off word is never
//! read, so nothing before the body is touched), the last one the body's end and the
//! padding. Sixteen rows are then transposed into sixteen words of sixteen lanes.

use core::arch::x86_64::*;

/// Messages a register set hashes at once (one a 32-bit lane).
pub(crate) const LANES: usize = 16;

/// Messages a call hashes at most: two register sets side by side. One set's rounds are a
/// single chain of dependent steps (each round waits on the last), which left the vector
/// units half idle; a second set's rounds interleaved with the first's fill them: on AMD
/// Zen 5, 32 messages cost ~1.15x what 16 do (docs/benchmarks.md, session 39).
pub(crate) const MESSAGES: usize = 2 * LANES;

/// The longest prefix (bytes): with the 0x80 byte's word and the 64-bit length, it fills
/// the last block.
pub(crate) const MAX_PREFIX: usize = 52;

/// SHA-256's initial hash value.
pub(crate) const IV: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

#[inline]
#[target_feature(enable = "avx512f")]
fn add(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(a, b)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn splat(x: u32) -> __m512i {
    _mm512_set1_epi32(x as i32)
}

/// Σ0, Σ1 (the rounds') and σ0, σ1 (the message schedule's), each three terms XORed in
/// one three-input logic instruction (0x96: a ^ b ^ c).
#[inline]
#[target_feature(enable = "avx512f")]
fn big_sigma0(a: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0x96>(
        _mm512_ror_epi32::<2>(a),
        _mm512_ror_epi32::<13>(a),
        _mm512_ror_epi32::<22>(a),
    )
}

#[inline]
#[target_feature(enable = "avx512f")]
fn big_sigma1(e: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0x96>(
        _mm512_ror_epi32::<6>(e),
        _mm512_ror_epi32::<11>(e),
        _mm512_ror_epi32::<25>(e),
    )
}

#[inline]
#[target_feature(enable = "avx512f")]
fn small_sigma0(x: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0x96>(
        _mm512_ror_epi32::<7>(x),
        _mm512_ror_epi32::<18>(x),
        _mm512_srli_epi32::<3>(x),
    )
}

#[inline]
#[target_feature(enable = "avx512f")]
fn small_sigma1(x: __m512i) -> __m512i {
    _mm512_ternarylogic_epi32::<0x96>(
        _mm512_ror_epi32::<17>(x),
        _mm512_ror_epi32::<19>(x),
        _mm512_srli_epi32::<10>(x),
    )
}

/// One round on the working variables `$v` with `$wk` (the round's word plus its
/// constant), `$j` (a constant) its place in eight: the variables rotate through `$v`
/// instead of moving (at round j, `a` is v[(0 - j) mod 8] ... `h` v[(7 - j) mod 8]; the
/// round writes the new `e` over `d` and the new `a` over `h`), so eight rounds leave
/// them where they were.
macro_rules! rotating_round {
    ($v:ident, $wk:expr, $j:expr) => {
        let at = |k: usize| (k + 8 - $j % 8) % 8;
        let (a, b, c, d) = ($v[at(0)], $v[at(1)], $v[at(2)], $v[at(3)]);
        let (e, f, g, h) = ($v[at(4)], $v[at(5)], $v[at(6)], $v[at(7)]);
        // Ch = e ? f : g (0xca); Maj = majority of a, b, c (0xe8). Summed so that the new
        // `e` is three steps from the old (Ch or Σ1's two, one add): the terms not from
        // `e` are added first, off that chain.
        let t1p = add(add(h, $wk), _mm512_ternarylogic_epi32::<0xca>(e, f, g));
        let s1 = big_sigma1(e);
        let t2 = add(big_sigma0(a), _mm512_ternarylogic_epi32::<0xe8>(a, b, c));
        $v[at(3)] = add(add(d, t1p), s1);
        $v[at(7)] = add(add(t1p, s1), t2);
    };
}

/// Round `$i` of sixteen `$c` (0-3) of one register set: `$v` its working variables, `$w`
/// its block, then its message schedule's ring (constant indices: in registers).
macro_rules! round {
    ($v:ident, $w:ident, $c:literal, $i:literal) => {
        let wi = if $c > 0 {
            schedule(&mut $w, $c * 16 + $i)
        } else {
            $w[$i]
        };
        rotating_round!($v, add(wi, splat(K[$c * 16 + $i])), $i);
    };
}

/// `$r!(c, i)` for all 64 rounds, in order: written out, so that the message schedule's
/// ring stays in registers (with a loop it was stored back every round).
macro_rules! all_rounds {
    ($r:ident) => {
        all_rounds!($r, 0 1 2 3)
    };
    ($r:ident, $($c:literal)*) => {$(
        $r!($c, 0); $r!($c, 1); $r!($c, 2); $r!($c, 3);
        $r!($c, 4); $r!($c, 5); $r!($c, 6); $r!($c, 7);
        $r!($c, 8); $r!($c, 9); $r!($c, 10); $r!($c, 11);
        $r!($c, 12); $r!($c, 13); $r!($c, 14); $r!($c, 15);
    )*};
}

/// One register set: sixteen states, and the block being hashed (word `t` of every lane in
/// `w[t]`), which the compression uses up as its message schedule's ring.
#[derive(Clone, Copy)]
struct Set {
    s: [__m512i; 8],
    w: [__m512i; 16],
}

/// One compression of one set by its block. Not inlined: it is called per block from
/// four places.
#[inline(never)]
#[target_feature(enable = "avx512f")]
fn compress1(x: &mut Set) {
    // Copies, not references: the schedule's ring then lives in registers, not in `x`.
    let (mut v, mut w) = (x.s, x.w);
    macro_rules! r {
        ($c:literal, $i:literal) => {
            round!(v, w, $c, $i);
        };
    }
    all_rounds!(r);
    for (s, v) in x.s.iter_mut().zip(v) {
        *s = add(*s, v);
    }
}

/// Word `i` (16 <= i < 64) of the message schedule, over word `i - 16` in the ring `w`
/// (with `i` a constant, as [`compress1`] has it, the ring stays in registers).
#[inline]
#[target_feature(enable = "avx512f")]
fn schedule(w: &mut [__m512i; 16], i: usize) -> __m512i {
    let x = add(
        add(small_sigma1(w[(i + 14) % 16]), w[(i + 9) % 16]),
        add(small_sigma0(w[(i + 1) % 16]), w[i % 16]),
    );
    w[i % 16] = x;
    x
}

/// One compression of each of two sets, their rounds interleaved: the second set's steps
/// run while the first's wait on their chain. Two sets' rings and states do not fit the 32
/// registers: the rounds run eight at a time in a loop, the rings in memory (a load folded
/// into an add), the sixteen states in registers. Written out like [`compress1`], LLVM
/// spilled states on the rounds' chains instead (docs/benchmarks.md, session 39).
#[inline(never)]
#[target_feature(enable = "avx512f")]
fn compress2(x: &mut Set, y: &mut Set) {
    let (mut v, mut u) = (x.s, y.s);
    macro_rules! eight {
        ($base:expr, $scheduled:expr) => {
            eight!(@ $base, $scheduled, 0 1 2 3 4 5 6 7)
        };
        (@ $base:expr, $scheduled:expr, $($j:literal)*) => {$(
            let i = $base + $j;
            let k = splat(K[i]);
            let (wx, wy) = if $scheduled {
                (schedule(&mut x.w, i), schedule(&mut y.w, i))
            } else {
                (x.w[i], y.w[i])
            };
            rotating_round!(v, add(wx, k), $j);
            rotating_round!(u, add(wy, k), $j);
        )*};
    }
    for base in [0, 8] {
        eight!(base, false);
    }
    for base in (16..64).step_by(8) {
        eight!(base, true);
    }
    for (s, v) in x.s.iter_mut().zip(v) {
        *s = add(*s, v);
    }
    for (s, u) in y.s.iter_mut().zip(u) {
        *s = add(*s, u);
    }
}

/// One compression of each of the `S` (1 or 2) sets.
#[inline]
#[target_feature(enable = "avx512f")]
fn compress<const S: usize>(sets: &mut [Set; S]) {
    match sets.as_mut_slice() {
        [x] => compress1(x),
        [x, y] => compress2(x, y),
        _ => unreachable!("one or two sets"),
    }
}

/// Sixteen 64-byte rows (one a lane) as sixteen registers of big-endian words: `w[t]`
/// holds word `t` of every row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn transpose(r: [__m512i; 16], w: &mut [__m512i; 16]) {
    // Each 32-bit word byte-swapped (SHA-256 reads big-endian words).
    let swap = _mm512_broadcast_i32x4(_mm_set_epi8(
        12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3,
    ));
    // A loop, not `map`: `map` itself lacks AVX-512 and would not inline the shuffle.
    let mut r = r;
    for x in &mut r {
        *x = _mm512_shuffle_epi8(*x, swap);
    }
    // Within each 128-bit lane: words of row pairs interleaved, then of row quadruples, so
    // that u[4j + e] holds, in its 128-bit lane L, word 4L + e of rows 4j..4j+3.
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        u[4 * j] = _mm512_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 1] = _mm512_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
        u[4 * j + 2] = _mm512_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
        u[4 * j + 3] = _mm512_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
    }
    // Then the 128-bit lanes of u[e], u[4+e], u[8+e], u[12+e] transposed: word 4L + e of
    // rows 0..15.
    for e in 0..4 {
        let v0 = _mm512_shuffle_i32x4::<0x44>(u[e], u[4 + e]);
        let v1 = _mm512_shuffle_i32x4::<0xee>(u[e], u[4 + e]);
        let v2 = _mm512_shuffle_i32x4::<0x44>(u[8 + e], u[12 + e]);
        let v3 = _mm512_shuffle_i32x4::<0xee>(u[8 + e], u[12 + e]);
        w[e] = _mm512_shuffle_i32x4::<0x88>(v0, v2);
        w[4 + e] = _mm512_shuffle_i32x4::<0xdd>(v0, v2);
        w[8 + e] = _mm512_shuffle_i32x4::<0x88>(v1, v3);
        w[12 + e] = _mm512_shuffle_i32x4::<0xdd>(v1, v3);
    }
}

/// SHA-256 of up to [`MESSAGES`] messages `prefixes[i] || bodies[i]`, continued from
/// `start` (a state that has absorbed `done` bytes, a multiple of 64: HMAC's inner key
/// block, or nothing with [`IV`]); with `outer` (HMAC's outer key block's state, having
/// absorbed 64 bytes) each digest is then hashed once more, as HMAC's outer hash. Each
/// digest into `out[i]`. Up to [`LANES`] messages take one register set, more two.
///
/// All prefixes have one length, a multiple of 4 up to [`MAX_PREFIX`]; all bodies one
/// length, a multiple of 64 (at least 64). Panics if the shapes are otherwise.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) fn digests(
    start: &[u32; 8],
    done: u64,
    outer: Option<&[u32; 8]>,
    prefixes: &[&[u8]],
    bodies: &[&[u8]],
    out: &mut [[u8; 32]],
) {
    let n = bodies.len();
    assert!((1..=MESSAGES).contains(&n) && prefixes.len() == n && out.len() == n);
    let p = prefixes[0].len();
    let len = bodies[0].len();
    assert!(p.is_multiple_of(4) && p <= MAX_PREFIX && done.is_multiple_of(64));
    assert!(len >= 64 && len.is_multiple_of(64));
    assert!(prefixes.iter().all(|x| x.len() == p) && bodies.iter().all(|b| b.len() == len));
    // SAFETY: the shapes are as `sets` needs them (the asserts above).
    unsafe {
        if n <= LANES {
            sets::<1>(start, done, outer, prefixes, bodies, out);
        } else {
            sets::<2>(start, done, outer, prefixes, bodies, out);
        }
    }
}

/// [`digests`] on `S` register sets. Lanes beyond the messages repeat message 0. Not
/// inlined: one frame or the other, not both.
///
/// # Safety
/// The shapes must be as [`digests`] asserts them (1 to 16 × S messages; one prefix length,
/// a multiple of 4 up to [`MAX_PREFIX`]; one body length, a positive multiple of 64): the
/// loads read each message in place by them. The CPU must have AVX-512F and BW.
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn sets<const S: usize>(
    start: &[u32; 8],
    done: u64,
    outer: Option<&[u32; 8]>,
    prefixes: &[&[u8]],
    bodies: &[&[u8]],
    out: &mut [[u8; 32]],
) {
    let n = bodies.len();
    let p = prefixes[0].len();
    let len = bodies[0].len();
    let lane = |i: usize| if i < n { i } else { 0 };
    // Set j's lane i is message 16j + i.
    let pre: [[*const u8; LANES]; S] =
        std::array::from_fn(|j| std::array::from_fn(|i| prefixes[lane(LANES * j + i)].as_ptr()));
    let body: [[*const u8; LANES]; S] =
        std::array::from_fn(|j| std::array::from_fn(|i| bodies[lane(LANES * j + i)].as_ptr()));
    // Words of the first block (and of the last) that come from the prefix (from the
    // body's last bytes).
    let head: __mmask16 = ((1u32 << (p / 4)) - 1) as __mmask16;
    let blocks = len / 64;

    let zero = _mm512_setzero_si512();
    let mut x = [Set {
        s: std::array::from_fn(|j| splat(start[j])),
        w: [zero; 16],
    }; S];
    // The first block: the prefix, then the body's first 64 - p bytes.
    for (x, (pre, body)) in x.iter_mut().zip(pre.iter().zip(&body)) {
        let rows = std::array::from_fn(|i| {
            // SAFETY: a masked load reads only the words whose mask bit is set (the others
            // neither read nor fault): the prefix's p bytes, and the body's bytes 0..64-p
            // (the words below the body's start are masked off). In bounds by the shapes
            // this function's contract gives (`digests` asserts them).
            unsafe {
                _mm512_or_si512(
                    _mm512_maskz_loadu_epi32(head, pre[i].cast()),
                    _mm512_maskz_loadu_epi32(!head, body[i].wrapping_sub(p).cast()),
                )
            }
        });
        transpose(rows, &mut x.w);
    }
    compress(&mut x);
    // The blocks wholly inside the body.
    for k in 1..blocks {
        for (x, body) in x.iter_mut().zip(&body) {
            let rows = std::array::from_fn(|i| {
                // SAFETY: bytes 64k - p .. 64k + 64 - p of a body of 64 * blocks bytes, k <
                // blocks, p >= 0: in bounds.
                unsafe { _mm512_loadu_si512(body[i].add(64 * k - p).cast()) }
            });
            transpose(rows, &mut x.w);
        }
        compress(&mut x);
    }
    // The last block: the body's last p bytes, 0x80, zeros, the length in bits.
    let bits = (done + (p + len) as u64) * 8;
    for (x, body) in x.iter_mut().zip(&body) {
        if p > 0 {
            let rows = std::array::from_fn(|i| {
                // SAFETY: only the words under `head` are read: the body's last p bytes.
                unsafe { _mm512_maskz_loadu_epi32(head, body[i].add(len - p).cast()) }
            });
            transpose(rows, &mut x.w);
        } else {
            x.w = [zero; 16];
        }
        x.w[p / 4] = splat(0x8000_0000);
        x.w[14] = splat((bits >> 32) as u32);
        x.w[15] = splat(bits as u32);
    }
    compress(&mut x);

    if let Some(outer) = outer {
        // HMAC's outer hash: the 32-byte inner digest, padded, after the 64-byte key block.
        for x in x.iter_mut() {
            x.w = [zero; 16];
            x.w[..8].copy_from_slice(&x.s);
            x.w[8] = splat(0x8000_0000);
            x.w[15] = splat((64 + 32) * 8);
            x.s = std::array::from_fn(|j| splat(outer[j]));
        }
        compress(&mut x);
    }

    for (j, x) in x.iter().enumerate() {
        let mut words = [[0u32; LANES]; 8];
        for (row, s) in words.iter_mut().zip(&x.s) {
            // SAFETY: `row` is 64 writable bytes.
            unsafe { _mm512_storeu_si512(row.as_mut_ptr().cast(), *s) };
        }
        for (i, o) in out.iter_mut().skip(LANES * j).take(LANES).enumerate() {
            for (t, word) in words.iter().enumerate() {
                o[4 * t..4 * t + 4].copy_from_slice(&word[i].to_be_bytes());
            }
        }
    }
}
