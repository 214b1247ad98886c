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

/// Encrypts XTS tweaks (IVs) in place with the tweak key `k`.
///
/// Fewer than eight (a 4 KiB request): one at a time, the round keys read from memory.
/// Loading the schedule into registers first, as for eight, spilled it to the stack, and
/// the reloads (not forwarded from the wider stores) held up the tweak's dependent rounds,
/// whose latency nothing else in a one-unit request hides: about 6 % of a 4 KiB request on
/// the vaes512 path on AMD Zen 4.
#[inline]
#[target_feature(enable = "aes,sse2,pclmulqdq")]
pub(super) fn encrypt_tweaks<const NR: usize>(k: &RoundKeys, ivs: &mut [[u8; 16]]) {
    if ivs.len() >= 8 {
        return encrypt_blocks::<NR>(&k.load(true), ivs);
    }
    let rk = &k.enc;
    for iv in ivs.iter_mut() {
        let mut b = _mm_xor_si128(load128(iv), load128(&rk[0]));
        for key in &rk[1..NR] {
            b = _mm_aesenc_si128(b, load128(key));
        }
        store128(iv, _mm_aesenclast_si128(b, load128(&rk[NR])));
    }
}

/// Encrypts blocks in place (ECB), eight at a time: used for XTS tweaks.
#[target_feature(enable = "aes,sse2,pclmulqdq")]
fn encrypt_blocks<const NR: usize>(rk: &[__m128i; 15], blocks: &mut [[u8; 16]]) {
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

/// One AES round (`$op`) on xmm0..xmm7, round key `$off` bytes into `{k}` loaded once into
/// xmm8 (unaligned: the schedule has no alignment of its own).
#[rustfmt::skip]
macro_rules! round8 {
    ($op:literal, $off:literal) => {
        concat!(
            "movdqu xmm8, [{k} + ", $off, "]\n",
            $op, " xmm0, xmm8\n", $op, " xmm1, xmm8\n", $op, " xmm2, xmm8\n", $op, " xmm3, xmm8\n",
            $op, " xmm4, xmm8\n", $op, " xmm5, xmm8\n", $op, " xmm6, xmm8\n", $op, " xmm7, xmm8\n",
        )
    };
}

/// The next chunk's tweak of register `$off / 16`: the current one (`{tw}`) times α^8,
/// written to `{twn}`: a byte shift and the byte shifted out multiplied by 0x87 (xmm15).
#[rustfmt::skip]
macro_rules! tweak_step {
    ($off:literal) => {
        concat!(
            "movdqa xmm11, [{tw} + ", $off, "]\n",
            "movdqa xmm12, xmm11\n",
            "psrldq xmm12, 15\n",
            "pclmulqdq xmm12, xmm15, 0\n",
            "pslldq xmm11, 1\n",
            "pxor xmm11, xmm12\n",
            "movdqa [{twn} + ", $off, "], xmm11\n",
        )
    };
}

/// Whitening (data ^ tweak ^ round key 0 in xmm9), last round (key in xmm10), tweak, store.
#[rustfmt::skip]
macro_rules! whiten {
    ($r:literal, $off:literal) => {
        concat!(
            "movdqu xmm", $r, ", [{d} + ", $off, "]\n",
            "pxor xmm", $r, ", [{tw} + ", $off, "]\n",
            "pxor xmm", $r, ", xmm9\n",
        )
    };
}
#[rustfmt::skip]
macro_rules! finish {
    ($op:literal, $r:literal, $off:literal) => {
        concat!(
            $op, " xmm", $r, ", xmm10\n",
            "pxor xmm", $r, ", [{tw} + ", $off, "]\n",
            "movdqu [{d} + ", $off, "], xmm", $r, "\n",
        )
    };
}

/// Rounds 1..8 with the next chunk's tweaks computed in between: `gpr` (all eight by
/// `tweak_lane`) or `half` (four by `tweak_step`, four by `tweak_lane`). On Zen 3 `gpr` was
/// 6 % faster with 14 rounds and 2 % slower with 10, where the shorter chunk waits on the
/// eight-byte stores that the next chunk's 16-byte loads cannot take forwarded.
#[rustfmt::skip]
macro_rules! first_rounds {
    (gpr, $op:literal) => {
        concat!(
            round8!($op, "16"), tweak_lane!("8", "56", "0", "8"),
            round8!($op, "32"), tweak_lane!("8", "56", "16", "24"),
            round8!($op, "48"), tweak_lane!("8", "56", "32", "40"),
            round8!($op, "64"), tweak_lane!("8", "56", "48", "56"),
            round8!($op, "80"), tweak_lane!("8", "56", "64", "72"),
            round8!($op, "96"), tweak_lane!("8", "56", "80", "88"),
            round8!($op, "112"), tweak_lane!("8", "56", "96", "104"),
            round8!($op, "128"), tweak_lane!("8", "56", "112", "120"),
        )
    };
    (half, $op:literal) => {
        concat!(
            round8!($op, "16"), tweak_step!("0"),
            round8!($op, "32"), tweak_step!("16"),
            round8!($op, "48"), tweak_step!("32"),
            round8!($op, "64"), tweak_step!("48"),
            round8!($op, "80"), tweak_lane!("8", "56", "64", "72"),
            round8!($op, "96"), tweak_lane!("8", "56", "80", "88"),
            round8!($op, "112"), tweak_lane!("8", "56", "96", "104"),
            round8!($op, "128"), tweak_lane!("8", "56", "112", "120"),
        )
    };
}

/// The text of the XTS chunk loop: `{n}` chunks of 128 bytes at `{d}`, tweaks at `{tw}`,
/// the next chunk's written to `{twn}` (the buffers swap every chunk).
#[rustfmt::skip]
macro_rules! xts_loop {
    ($sched:ident, $op:literal, $oplast:literal, $last_off:literal, [$($more:literal),*]) => {
        concat!(
            "movdqu xmm9, [{k}]\n",
            "movdqu xmm10, [{k} + ", $last_off, "]\n",
            "movdqa xmm15, [{c}]\n",
            "2:\n",
            whiten!("0", "0"), whiten!("1", "16"), whiten!("2", "32"), whiten!("3", "48"),
            whiten!("4", "64"), whiten!("5", "80"), whiten!("6", "96"), whiten!("7", "112"),
            first_rounds!($sched, $op),
            $(round8!($op, $more),)*
            finish!($oplast, "0", "0"), finish!($oplast, "1", "16"),
            finish!($oplast, "2", "32"), finish!($oplast, "3", "48"),
            finish!($oplast, "4", "64"), finish!($oplast, "5", "80"),
            finish!($oplast, "6", "96"), finish!($oplast, "7", "112"),
            "add {d}, 128\n",
            "xchg {tw}, {twn}\n",
            "dec {n}\n",
            "jnz 2b\n",
        )
    };
}

/// Eight blocks' tweaks, 16-byte aligned (legacy SSE memory operands require it).
#[repr(C, align(64))]
struct ChunkTweaks([[u8; 16]; 8]);

/// The reduction constant 0x87 (low qword).
static POLY: ChunkTweaks = ChunkTweaks([
    [0x87, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    [0; 16],
    [0; 16],
    [0; 16],
    [0; 16],
    [0; 16],
    [0; 16],
    [0; 16],
]);

impl ChunkTweaks {
    /// Overwrites the tweaks with zeros, one volatile 16-byte store each.
    fn wipe(&mut self) {
        crate::secret::wipe_blocks(&mut self.0);
    }
}

/// XTS over whole 128-byte chunks, the first chunk's tweaks in `tw`; `scratch` receives the
/// later chunks'. Returns the tweak after the last chunk. Both buffers are wiped.
///
/// The whole loop is one assembly block (eight block registers, a round key, round keys
/// 0 and NR, the reduction constant, two for the tweak step): compiled from intrinsics,
/// eight blocks, eight tweaks and the next chunk's eight did not fit in sixteen registers
/// and were spilled on every chunk, which held this path at 0.6x the kernel's `aesni-avx`.
#[target_feature(enable = "aes,sse2,pclmulqdq")]
fn xts_chunks<const NR: usize, const ENC: bool>(
    rk: &[[u8; 16]; 15],
    tw: &mut ChunkTweaks,
    scratch: &mut ChunkTweaks,
    chunks: &mut [[u8; 128]],
) -> __m128i {
    const { assert!(NR == 10 || NR == 14) };
    let n = chunks.len();
    if n > 0 {
        let (k, d) = (rk.as_ptr(), chunks.as_mut_ptr());
        let (t, tn) = (tw.0.as_mut_ptr(), scratch.0.as_mut_ptr());
        // SAFETY: `{d}` covers `n` chunks of 128 bytes, read and written in place (unaligned
        // moves); `{k}` is 15 round keys of 16 bytes, read unaligned; `{tw}` and `{twn}` are
        // 128 bytes each, distinct, 16-byte aligned (the only legacy-SSE memory operands),
        // read and written; `{c}` is 16 aligned readable bytes. Every vector register used
        // is declared clobbered, as are the pointer and counter registers. The caller
        // enables AES-NI, PCLMULQDQ and SSE2.
        unsafe {
            macro_rules! run {
                ($text:expr) => {
                    core::arch::asm!(
                        $text,
                        k = in(reg) k,
                        c = in(reg) POLY.0.as_ptr(),
                        d = inout(reg) d => _,
                        n = inout(reg) n => _,
                        tw = inout(reg) t => _,
                        twn = inout(reg) tn => _,
                        ga = out(reg) _,
                        gb = out(reg) _,
                        gc = out(reg) _,
                        gd = out(reg) _,
                        ge = out(reg) _,
                        out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                        out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
                        out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
                        out("xmm12") _, out("xmm15") _,
                        options(nostack),
                    )
                };
            }
            match (NR, ENC) {
                (10, true) => run!(xts_loop!(half, "aesenc", "aesenclast", "160", ["144"])),
                (10, false) => run!(xts_loop!(half, "aesdec", "aesdeclast", "160", ["144"])),
                (_, true) => run!(xts_loop!(
                    gpr,
                    "aesenc",
                    "aesenclast",
                    "224",
                    ["144", "160", "176", "192", "208"]
                )),
                (_, false) => run!(xts_loop!(
                    gpr,
                    "aesdec",
                    "aesdeclast",
                    "224",
                    ["144", "160", "176", "192", "208"]
                )),
            }
        }
    }
    // The buffers swap every chunk: after an odd count the next tweaks are in `scratch`.
    let after = if n.is_multiple_of(2) {
        &tw.0[0]
    } else {
        &scratch.0[0]
    };
    let t = load128(after);
    tw.wipe();
    scratch.wipe();
    t
}

/// XTS over one data unit starting with tweak `t`; returns the tweak after its last block.
#[target_feature(enable = "aes,sse2,pclmulqdq")]
pub(super) fn xts_unit<const NR: usize, const ENC: bool>(
    keys: &RoundKeys,
    t: __m128i,
    data: &mut [u8],
) -> __m128i {
    let (chunks, rest) = data.as_chunks_mut::<128>();
    let mut t = t;
    if !chunks.is_empty() {
        let mut tw = ChunkTweaks([[0; 16]; 8]);
        let mut scratch = ChunkTweaks([[0; 16]; 8]);
        let mut x = t;
        for b in tw.0.iter_mut() {
            store128(b, x);
            x = mulx(x);
        }
        let sched = if ENC { &keys.enc } else { &keys.dec };
        t = xts_chunks::<NR, ENC>(sched, &mut tw, &mut scratch, chunks);
    }
    let blocks = rest.as_chunks_mut::<16>().0;
    if !blocks.is_empty() {
        // A part chunk: only data units that are not whole chunks have one.
        let rk = keys.load(ENC);
        for blk in blocks {
            let mut b = [_mm_xor_si128(load128(blk), _mm_xor_si128(t, rk[0]))];
            rounds::<NR, ENC, 1>(&mut b, &rk);
            store128(blk, _mm_xor_si128(b[0], t));
            t = mulx(t);
        }
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
    encrypt_tweaks::<NR>(k2, ivs);
    for (iv, sector) in ivs.iter().zip(data.chunks_exact_mut(unit)) {
        xts_unit::<NR, ENC>(k1, load128(iv), sector);
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
