//! VAES + VPCLMULQDQ on 256-bit registers (AVX2 encoding): two blocks per instruction, for
//! CPUs with VAES but not the AVX-512 subset of the vaes512 path (AMD Zen 3, Intel Alder
//! Lake and other client cores, any CPU with AVX-512 disabled).
//!
//! XTS: lane j of a register holds T·α^j. A pass covers W registers (2·W blocks); every
//! register's tweaks advance to the next pass by one multiplication by α^(2W), all W of
//! them independent, so the tweak computation never serialises the AES pipeline. The pass
//! loop of a sector is one assembly block (`xts_passes`): eight block registers round by
//! round, the next pass's tweaks computed in between, nothing spilled. Per-sector starting
//! tweaks are encrypted together up front.
//!
//! CBC decryption: every block is independent given the ciphertext; the previous block of
//! a register pair is one cross-lane permute of two ciphertext registers.

use super::keys::{RoundKeys, load128, source_unit};
use super::ni;
use core::arch::x86_64::*;

/// Registers per pass: 8 × 2 blocks = 256 bytes. Two VAES units with a latency of four
/// cycles need eight independent chains to stay busy.
const W: usize = 8;

/// Bytes per pass.
const PASS: usize = 32 * W;

#[inline]
#[target_feature(enable = "avx")]
fn load256(b: &[u8; 32]) -> __m256i {
    // SAFETY: `b` is 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx")]
fn store256(b: &mut [u8; 32], v: __m256i) {
    // SAFETY: `b` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(b.as_mut_ptr().cast(), v) }
}

/// Folds the bits shifted out of each 128-bit lane back in: carries from the low qword go
/// to the high one, carries out of bit 127 are multiplied by x^7+x^2+x+1 (0x87) into the low.
#[inline]
#[target_feature(enable = "avx2")]
fn fold(shifted: __m256i, carry: __m256i) -> __m256i {
    let into_hi = _mm256_bslli_epi128::<8>(carry);
    let c = _mm256_bsrli_epi128::<8>(carry);
    let red = _mm256_xor_si256(
        _mm256_xor_si256(c, _mm256_slli_epi64::<1>(c)),
        _mm256_xor_si256(_mm256_slli_epi64::<2>(c), _mm256_slli_epi64::<7>(c)),
    );
    _mm256_xor_si256(_mm256_xor_si256(shifted, into_hi), red)
}

/// [T, T·α] from T.
#[inline]
#[target_feature(enable = "avx2")]
fn first_tweaks(t: __m128i) -> __m256i {
    let v = _mm256_broadcastsi128_si256(t);
    let k = _mm256_set_epi64x(1, 1, 0, 0);
    let back = _mm256_sub_epi64(_mm256_set1_epi64x(64), k);
    // A variable shift by 64 yields 0, which is exactly lane 0's (absent) carry.
    fold(_mm256_sllv_epi64(v, k), _mm256_srlv_epi64(v, back))
}

/// Every lane times α^K (1 ≤ K ≤ 56); `R` must be 64 - K (stable Rust cannot compute it).
#[inline]
#[target_feature(enable = "avx2")]
fn mul_xk<const K: i32, const R: i32>(v: __m256i) -> __m256i {
    const { assert!(K + R == 64 && K >= 1 && K <= 56) };
    fold(_mm256_slli_epi64::<K>(v), _mm256_srli_epi64::<R>(v))
}

/// Every lane times α^(8M), for 1 ≤ M ≤ 8 (`R` = 16 - M): a byte shift plus a carry-less
/// multiply of the M bytes shifted out by 0x87, off the ports the AES rounds use.
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn mul_x8m<const M: i32, const R: i32>(v: __m256i) -> __m256i {
    const { assert!(M + R == 16 && M >= 1 && M <= 8) };
    let out = _mm256_bsrli_epi128::<R>(v);
    let red = _mm256_clmulepi64_epi128::<0x00>(out, _mm256_set1_epi64x(0x87));
    _mm256_xor_si256(_mm256_bslli_epi128::<M>(v), red)
}

/// A register's tweaks one pass later: times α^(2W), a whole number of bytes (what the
/// pass loop's tweak schedule computes; also the tail's tweak after the last whole pass).
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn next_pass(t: __m256i) -> __m256i {
    const { assert!(W == 4 || W == 8) };
    if W == 4 {
        mul_x8m::<1, 15>(t)
    } else {
        mul_x8m::<2, 14>(t)
    }
}

/// Tweaks of the first pass of a data unit whose first tweak is `t`: register i holds
/// [T·α^(2i), T·α^(2i+1)].
#[inline]
#[target_feature(enable = "avx2,vpclmulqdq")]
fn pass_tweaks(t: __m128i) -> [__m256i; W] {
    let mut z = [_mm256_setzero_si256(); W];
    z[0] = first_tweaks(t);
    z[1] = mul_xk::<2, 62>(z[0]);
    z[2] = mul_xk::<4, 60>(z[0]);
    z[3] = mul_xk::<4, 60>(z[1]);
    for i in 4..W {
        z[i] = mul_x8m::<1, 15>(z[i - 4]);
    }
    z
}

/// Round keys as 256-bit values (both lanes), in memory.
type WideKeys = [[u8; 32]; 15];

/// Rounds 1..NR of W registers; the last round key is per register (`last`: CBC folds the
/// previous ciphertext block into it).
///
/// The middle rounds are written in assembly, round by round across the eight registers:
/// left to itself the compiler orders them register by register (one AES chain at a
/// time, to save registers), and the out-of-order window then cannot keep both AES units
/// busy.
#[inline]
#[target_feature(enable = "avx2,vaes")]
fn rounds<const NR: usize, const ENC: bool>(
    b: &mut [__m256i; W],
    rk: &WideKeys,
    last: &[__m256i; W],
) {
    const { assert!(W == 8 && (NR == 10 || NR == 14)) };
    // SAFETY: `rk` is 15 round keys of 32 bytes (VEX memory operands need no
    // alignment), only read; the registers are plain values; the caller enables AVX2
    // and VAES.
    unsafe {
        if ENC {
            middle_rounds!(vex "vaesenc", ymm_reg, b [b0 => 0, b1 => 1, b2 => 2, b3 => 3, b4 => 4, b5 => 5, b6 => 6, b7 => 7], rk, NR, 32);
        } else {
            middle_rounds!(vex "vaesdec", ymm_reg, b [b0 => 0, b1 => 1, b2 => 2, b3 => 3, b4 => 4, b5 => 5, b6 => 6, b7 => 7], rk, NR, 32);
        }
    }
    for (x, l) in b.iter_mut().zip(last) {
        *x = if ENC {
            _mm256_aesenclast_epi128(*x, *l)
        } else {
            _mm256_aesdeclast_epi128(*x, *l)
        };
    }
}

/// One AES round (`$op`) on ymm0..ymm7 with round key `$off` bytes into `{k}`, loaded once
/// into ymm8.
#[rustfmt::skip]
macro_rules! round8 {
    ($op:literal, $off:literal) => {
        concat!(
            "vmovdqu ymm8, [{k} + ", $off, "]\n",
            $op, " ymm0, ymm0, ymm8\n", $op, " ymm1, ymm1, ymm8\n",
            $op, " ymm2, ymm2, ymm8\n", $op, " ymm3, ymm3, ymm8\n",
            $op, " ymm4, ymm4, ymm8\n", $op, " ymm5, ymm5, ymm8\n",
            $op, " ymm6, ymm6, ymm8\n", $op, " ymm7, ymm7, ymm8\n",
        )
    };
}

/// The next pass's tweaks of registers `$a` and `$a + 32` (byte offsets into `{tw}`): the
/// current ones times α^16, written to `{twn}`. Each is a two-byte shift left plus the two
/// bytes shifted out, multiplied by 0x87 carry-less. One carry-less multiply serves both
/// registers: the first's carry bytes sit at bits 0..16 of the operand, the second's at
/// 32..48, and their 23-bit products do not overlap. On AMD Zen 3 a 256-bit VPCLMULQDQ takes
/// about two AES slots, so halving them was worth the extra shifts. Interleaved with the
/// AES rounds, one pair per round (ymm11..ymm14 scratch; `{c}`: constants, see `TWEAK_CONSTS`).
#[rustfmt::skip]
macro_rules! tweak_step {
    ($a:literal, $b:literal) => {
        concat!(
            "vmovdqu ymm11, [{tw} + ",
            $a,
            "]\n",
            "vmovdqu ymm12, [{tw} + ",
            $b,
            "]\n",
            "vpsrldq ymm13, ymm11, 14\n",
            "vpsrldq ymm14, ymm12, 10\n",
            "vpand ymm14, ymm14, [{c} + 32]\n",
            "vpxor ymm13, ymm13, ymm14\n",
            "vpclmulqdq ymm13, ymm13, ymm15, 0\n",
            "vpslldq ymm11, ymm11, 2\n",
            "vpslldq ymm12, ymm12, 2\n",
            "vpsrlq ymm14, ymm13, 32\n",
            "vpand ymm13, ymm13, [{c} + 64]\n",
            "vpxor ymm11, ymm11, ymm13\n",
            "vpxor ymm12, ymm12, ymm14\n",
            "vmovdqu [{twn} + ",
            $a,
            "], ymm11\n",
            "vmovdqu [{twn} + ",
            $b,
            "], ymm12\n",
        )
    };
}

/// The next pass's tweaks of the register at byte `$a` of `{tw}`, written to `{twn}`: a
/// two-byte shift left and the two bytes shifted out times 0x87, carry-less (ymm15), one
/// multiply per register. Where VPCLMULQDQ runs beside the AES units (Intel) this costs
/// them one slot a register, against three for the shared multiply of `tweak_step`.
#[rustfmt::skip]
macro_rules! tweak_one {
    ($a:literal) => {
        concat!(
            "vmovdqu ymm11, [{tw} + ", $a, "]\n",
            "vpsrldq ymm12, ymm11, 14\n",
            "vpclmulqdq ymm12, ymm12, ymm15, 0\n",
            "vpslldq ymm11, ymm11, 2\n",
            "vpxor ymm11, ymm11, ymm12\n",
            "vmovdqu [{twn} + ", $a, "], ymm11\n",
        )
    };
}

/// Whitening of a register: data (read at `{$src}`: `{s}` out of place, `{d}` in place)
/// ^ tweak ^ round key 0 (ymm9).
#[rustfmt::skip]
macro_rules! whiten {
    ($src:tt, $r:literal, $off:literal) => {
        concat!(
            "vpxor ymm", $r, ", ymm9, [{tw} + ", $off, "]\n",
            "vpxor ymm", $r, ", ymm", $r, ", [{", $src, "} + ", $off, "]\n",
        )
    };
}

/// Moves the source pointer to the next pass; in place (`{d}` is the source) nothing: the
/// in-place loop keeps the register and the add it would cost (about 1 % at 4 KiB).
macro_rules! advance_src {
    ("s") => {
        "add {s}, 256\n"
    };
    ("d") => {
        ""
    };
}

/// Last round of a register (key in ymm10), the tweak XORed after it, stored at `{d}`.
#[rustfmt::skip]
macro_rules! finish {
    ($op:literal, $r:literal, $off:literal) => {
        concat!(
            $op, " ymm", $r, ", ymm", $r, ", ymm10\n",
            "vpxor ymm", $r, ", ymm", $r, ", [{tw} + ", $off, "]\n",
            "vmovdqu [{d} + ", $off, "], ymm", $r, "\n",
        )
    };
}

/// Rounds 1..8 of a pass with the next pass's tweaks computed in between (`none`: the
/// sector's last pass computes none): `vector` (four
/// register pairs by `tweak_step`) or `mixed` (three pairs, and the last two registers'
/// four lanes in general-purpose registers by `tweak_lane`). Mixed is faster with 14 rounds
/// and slower with 10 (the shorter pass then waits on the eight-byte stores that a 32-byte
/// load of the next pass cannot take forwarded), so AES-128 uses vector.
#[rustfmt::skip]
macro_rules! first_rounds {
    (none, $op:literal) => {
        concat!(
            round8!($op, "32"), round8!($op, "64"), round8!($op, "96"), round8!($op, "128"),
            round8!($op, "160"), round8!($op, "192"), round8!($op, "224"), round8!($op, "256"),
        )
    };
    (single, $op:literal) => {
        concat!(
            round8!($op, "32"), tweak_one!("0"),
            round8!($op, "64"), tweak_one!("32"),
            round8!($op, "96"), tweak_one!("64"),
            round8!($op, "128"), tweak_one!("96"),
            round8!($op, "160"), tweak_one!("128"),
            round8!($op, "192"), tweak_one!("160"),
            round8!($op, "224"), tweak_one!("192"),
            round8!($op, "256"), tweak_one!("224"),
        )
    };
    (vector, $op:literal) => {
        concat!(
            round8!($op, "32"),
            round8!($op, "64"), tweak_step!("0", "32"),
            round8!($op, "96"),
            round8!($op, "128"), tweak_step!("64", "96"),
            round8!($op, "160"),
            round8!($op, "192"), tweak_step!("128", "160"),
            round8!($op, "224"),
            round8!($op, "256"), tweak_step!("192", "224"),
        )
    };
    (mixed, $op:literal) => {
        concat!(
            round8!($op, "32"),
            round8!($op, "64"), tweak_step!("0", "32"),
            round8!($op, "96"), tweak_lane!("16", "48", "192", "200"),
            round8!($op, "128"), tweak_step!("64", "96"),
            round8!($op, "160"), tweak_lane!("16", "48", "208", "216"),
            round8!($op, "192"), tweak_step!("128", "160"),
            round8!($op, "224"), tweak_lane!("16", "48", "224", "232"),
            round8!($op, "256"), tweak_lane!("16", "48", "240", "248"),
        )
    };
}

/// The text of the XTS pass loop: `{n}` passes of 256 bytes read at `{$src}` (`s` or
/// `d`, see `whiten`) and written at `{d}`, the current pass's
/// tweaks at `{tw}` (eight registers of two), the next pass's written to `{twn}` (the two
/// buffers swap every pass). `$sched` picks the tweak schedule (`first_rounds`);
/// `$last_off` is the byte offset of round key NR; `$more` the rounds after the eighth.
#[rustfmt::skip]
macro_rules! xts_loop {
    ($src:tt, $sched:ident, $op:literal, $oplast:literal, $last_off:literal, [$($more:literal),*]) => {
        concat!(
            "vmovdqu ymm9, [{k}]\n",
            "vmovdqu ymm10, [{k} + ", $last_off, "]\n",
            "vmovdqu ymm15, [{c}]\n",
            "dec {n}\n",
            "jz 3f\n",
            "2:\n",
            xts_pass!($src, $sched, $op, $oplast, [$($more),*]),
            advance_src!($src),
            "add {d}, 256\n",
            "xchg {tw}, {twn}\n",
            "dec {n}\n",
            "jnz 2b\n",
            // The last pass computes no tweaks for a pass that never comes (with 512-byte
            // sectors that was half of all tweak work).
            "3:\n",
            xts_pass!($src, none, $op, $oplast, [$($more),*]),
        )
    };
}

/// One pass: whitening, the rounds (tweak schedule `$sched`), the last round and stores.
#[rustfmt::skip]
macro_rules! xts_pass {
    ($src:tt, $sched:ident, $op:literal, $oplast:literal, [$($more:literal),*]) => {
        concat!(
            whiten!($src, "0", "0"), whiten!($src, "1", "32"),
            whiten!($src, "2", "64"), whiten!($src, "3", "96"),
            whiten!($src, "4", "128"), whiten!($src, "5", "160"),
            whiten!($src, "6", "192"), whiten!($src, "7", "224"),
            first_rounds!($sched, $op),
            $(round8!($op, $more),)*
            finish!($oplast, "0", "0"), finish!($oplast, "1", "32"),
            finish!($oplast, "2", "64"), finish!($oplast, "3", "96"),
            finish!($oplast, "4", "128"), finish!($oplast, "5", "160"),
            finish!($oplast, "6", "192"), finish!($oplast, "7", "224"),
        )
    };
}

/// Constants of the tweak step, one 256-bit value each (both lanes alike, low qword
/// shown): at 0 the reduction polynomial 0x87; at 32 a mask of bytes 4..6 (where the second
/// register's carry bytes land); at 64 a mask of the low 32 bits (the first register's
/// product).
#[repr(C, align(32))]
struct TweakConsts([u64; 12]);
static TWEAK_CONSTS: TweakConsts = TweakConsts([
    0x87,
    0,
    0x87,
    0,
    0xffff_0000_0000,
    0,
    0xffff_0000_0000,
    0,
    0xffff_ffff,
    0,
    0xffff_ffff,
    0,
]);

/// One pass's tweaks, eight registers of two blocks, aligned so no access splits a cache
/// line.
#[repr(C, align(64))]
struct PassTweaks([[u8; 32]; W]);

impl PassTweaks {
    /// All zero.
    fn new() -> Self {
        PassTweaks([[0; 32]; W])
    }

    /// Overwrites the tweaks with zeros, 32 bytes per store (a byte-wise wipe of both
    /// buffers cost as much as encrypting a 512-byte sector).
    #[inline]
    #[target_feature(enable = "avx")]
    fn wipe(&mut self) {
        for t in self.0.iter_mut() {
            // SAFETY: `t` is 32 writable bytes; a volatile store is never elided.
            unsafe {
                core::ptr::write_volatile(t.as_mut_ptr().cast::<__m256i>(), _mm256_setzero_si256())
            };
        }
    }
}

/// XTS over `passes` passes of 256 bytes at `data`, first tweaks in `tw` (register i holds
/// [T·α^(2i), T·α^(2i+1)]); `scratch` receives the later passes' tweaks. Both tweak buffers
/// are left holding tweaks (the caller wipes them).
///
/// The whole loop is one assembly block with every value in a named register: eight
/// blocks registers, a round key, round keys 0 and NR, the reduction constant and four
/// for the tweak step. Compiled from intrinsics, eight blocks plus eight tweak registers
/// plus keys did not fit in 16 registers and were spilled on every pass; and the tweak
/// step is placed one register per round, so its carry-less multiply (which takes an AES
/// unit's slot on AMD Zen 3) spreads thin.
#[inline]
#[target_feature(enable = "avx2,vaes,vpclmulqdq")]
fn xts_passes<const NR: usize, const ENC: bool>(
    schedule: TweakSchedule,
    rk: &WideKeys,
    tw: &mut PassTweaks,
    scratch: &mut PassTweaks,
    src: Option<&[[u8; PASS]]>,
    data: &mut [[u8; PASS]],
) {
    const { assert!(W == 8 && (NR == 10 || NR == 14)) };
    if data.is_empty() {
        return;
    }
    debug_assert!(src.is_none_or(|s| s.len() == data.len()));
    let (k, d, n) = (rk.as_ptr(), data.as_mut_ptr(), data.len());
    let (tw, twn) = (tw.0.as_mut_ptr(), scratch.0.as_mut_ptr());
    // SAFETY: `{s}` (out of place only) covers `n` passes of 256 bytes, read; `{d}` as
    // many, read when in place and written (`src` and `data` cannot overlap); `{k}` is
    // 15 round keys of 32 bytes, read; `{tw}` and `{twn}` are 256 bytes each, distinct,
    // read and written; `{c}` is 96 readable bytes. Every vector register used is
    // declared clobbered, as are the pointer and counter registers; VEX memory operands
    // need no alignment. The caller enables AVX2, VAES and VPCLMULQDQ.
    unsafe {
        // `vector` uses no general-purpose scratch; `mixed` (`tweak_lane`) five. The source
        // register exists only out of place (`asm!` rejects an unused operand).
        macro_rules! run {
            ($text:expr, [$($src:tt)*] $(, $g:ident)*) => {
                core::arch::asm!(
                    $text,
                    k = in(reg) k,
                    c = in(reg) TWEAK_CONSTS.0.as_ptr(),
                    $($src)*
                    d = inout(reg) d => _,
                    n = inout(reg) n => _,
                    tw = inout(reg) tw => _,
                    twn = inout(reg) twn => _,
                    $($g = out(reg) _,)*
                    out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                    out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                    out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                    out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
                    options(nostack),
                )
            };
        }
        // The loops (AES-128/256, encrypt/decrypt, tweak schedule) reading at `$src`
        // (`"s"` or `"d"`).
        macro_rules! by_key_and_direction {
            ($src:tt, [$($operand:tt)*]) => {
                match (NR, ENC, schedule) {
                    (10, true, TweakSchedule::Single) => run!(
                        xts_loop!($src, single, "vaesenc", "vaesenclast", "320", ["288"]),
                        [$($operand)*]
                    ),
                    (10, false, TweakSchedule::Single) => run!(
                        xts_loop!($src, single, "vaesdec", "vaesdeclast", "320", ["288"]),
                        [$($operand)*]
                    ),
                    (10, true, TweakSchedule::Shared) => run!(
                        xts_loop!($src, vector, "vaesenc", "vaesenclast", "320", ["288"]),
                        [$($operand)*]
                    ),
                    (10, false, TweakSchedule::Shared) => run!(
                        xts_loop!($src, vector, "vaesdec", "vaesdeclast", "320", ["288"]),
                        [$($operand)*]
                    ),
                    (_, true, TweakSchedule::Single) => run!(
                        xts_loop!(
                            $src,
                            single,
                            "vaesenc",
                            "vaesenclast",
                            "448",
                            ["288", "320", "352", "384", "416"]
                        ),
                        [$($operand)*]
                    ),
                    (_, false, TweakSchedule::Single) => run!(
                        xts_loop!(
                            $src,
                            single,
                            "vaesdec",
                            "vaesdeclast",
                            "448",
                            ["288", "320", "352", "384", "416"]
                        ),
                        [$($operand)*]
                    ),
                    (_, true, TweakSchedule::Shared) => run!(
                        xts_loop!(
                            $src,
                            mixed,
                            "vaesenc",
                            "vaesenclast",
                            "448",
                            ["288", "320", "352", "384", "416"]
                        ),
                        [$($operand)*],
                        ga,
                        gb,
                        gc,
                        gd,
                        ge
                    ),
                    (_, false, TweakSchedule::Shared) => run!(
                        xts_loop!(
                            $src,
                            mixed,
                            "vaesdec",
                            "vaesdeclast",
                            "448",
                            ["288", "320", "352", "384", "416"]
                        ),
                        [$($operand)*],
                        ga,
                        gb,
                        gc,
                        gd,
                        ge
                    ),
                }
            };
        }
        match src {
            Some(src) => {
                let s = src.as_ptr();
                by_key_and_direction!("s", [s = inout(reg) s => _,])
            }
            None => by_key_and_direction!("d", []),
        }
    }
}

#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,pclmulqdq,sse2")]
fn xts_nr<const NR: usize, const ENC: bool>(
    schedule: TweakSchedule,
    k1: &RoundKeys,
    k2: &RoundKeys,
    ivs: &mut [[u8; 16]],
    src: Option<&[u8]>,
    data: &mut [u8],
    unit: usize,
) {
    ni::encrypt_tweaks::<NR>(k2, ivs);
    let rk = if ENC { &k1.enc_wide } else { &k1.dec_wide };
    let (mut first, mut second, mut scratch) =
        (PassTweaks::new(), PassTweaks::new(), PassTweaks::new());
    // The next sector's first-pass tweaks are computed before this sector's pass loop, so
    // their latency hides behind its rounds instead of sitting between two sectors; they
    // are written long before they are read (eight-byte stores cannot be forwarded to the
    // loop's 32-byte loads).
    let (mut tw, mut next) = (&mut first, &mut second);
    // The first sector's in vector registers: that is the shorter chain, and nothing runs
    // beside it yet. The later ones in general-purpose registers, a sector ahead.
    if let Some(iv) = ivs.first() {
        for (slot, v) in tw.0.iter_mut().zip(pass_tweaks(load128(iv))) {
            store256(slot, v);
        }
    }
    for (i, sector) in data.chunks_exact_mut(unit).enumerate() {
        if let Some(iv) = ivs.get(i + 1) {
            store_pass_tweaks(next, iv);
        }
        let (from, from_rest) = source_unit::<PASS>(src, i, unit);
        let (passes, rest) = sector.as_chunks_mut::<PASS>();
        xts_passes::<NR, ENC>(schedule, rk, tw, &mut scratch, from, passes);
        if !rest.is_empty() {
            if let Some(f) = from_rest {
                rest.copy_from_slice(f);
            }
            // The tweak after the last whole pass: the last pass's first register times
            // α^16 (the loop computes no tweaks in its last pass), its low lane. The buffers
            // swap after every pass but the last.
            let t = if passes.is_empty() {
                load128(tw.0[0][..16].try_into().expect("16 bytes"))
            } else {
                let last = if passes.len() % 2 == 1 {
                    &*tw
                } else {
                    &scratch
                };
                _mm256_castsi256_si128(next_pass(load256(&last.0[0])))
            };
            ni::xts_unit::<NR, ENC>(k1, t, rest);
        }
        core::mem::swap(&mut tw, &mut next);
    }
    // Tweaks are derived from the key: leave none on the stack.
    first.wipe();
    if ivs.len() > 1 {
        second.wipe();
    }
    scratch.wipe();
}

/// How the pass loop computes the next pass's tweaks between the rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TweakSchedule {
    /// One carry-less multiply per register (`tweak_one`): where VPCLMULQDQ issues beside
    /// the AES units (Intel: 4 KiB AES-256 +9 % over `Shared` on Emerald Rapids).
    Single,
    /// Two registers per multiply, and with AES-256 some lanes in general-purpose
    /// registers (`tweak_step`, `tweak_lane`): where a 256-bit VPCLMULQDQ takes about two
    /// AES slots (AMD Zen 3).
    Shared,
}

impl TweakSchedule {
    /// The schedule for this CPU: `Single` on Intel, `Shared` elsewhere (AMD, where the
    /// loop was tuned); decided once.
    pub(super) fn here() -> TweakSchedule {
        static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *INTEL.get_or_init(|| super::cpu_vendor() == *b"GenuineIntel") {
            TweakSchedule::Single
        } else {
            TweakSchedule::Shared
        }
    }
}

/// Stores the first pass's tweaks of a data unit whose first tweak is `t`: sixteen
/// doublings in general-purpose registers (branch-free: the carry becomes a mask), which
/// leaves the vector pipes to the AES rounds of the sector before.
#[inline]
fn store_pass_tweaks(tw: &mut PassTweaks, t: &[u8; 16]) {
    let (mut lo, mut hi) = (
        u64::from_le_bytes(t[..8].try_into().expect("8 bytes")),
        u64::from_le_bytes(t[8..].try_into().expect("8 bytes")),
    );
    for lane in tw.0.as_flattened_mut().chunks_exact_mut(16) {
        lane[..8].copy_from_slice(&lo.to_le_bytes());
        lane[8..].copy_from_slice(&hi.to_le_bytes());
        let carry = ((hi as i64) >> 63) as u64 & 0x87;
        hi = (hi << 1) | (lo >> 63);
        lo = (lo << 1) ^ carry;
    }
}

/// XTS over `ivs.len()` data units of `unit` bytes (any multiple of 16); `ivs` is
/// overwritten with the encrypted tweaks.
///
/// # Safety
/// The CPU must support AVX2, VAES, VPCLMULQDQ and AES-NI.
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,pclmulqdq,sse2")]
pub(super) unsafe fn xts(
    k1: &RoundKeys,
    k2: &RoundKeys,
    ivs: &mut [[u8; 16]],
    data: &mut [u8],
    unit: usize,
    enc: bool,
) {
    by_rounds_and_direction!(
        k1,
        enc,
        xts_nr(TweakSchedule::here(), k1, k2, ivs, None, data, unit)
    )
}

/// [`xts`] reading `src` and writing `dst` (same length): one pass over memory instead
/// of a copy and then the cipher in place (the mmap engine decrypts straight out of the
/// page cache).
///
/// # Safety
/// As [`xts`].
#[target_feature(enable = "avx2,vaes,vpclmulqdq,aes,pclmulqdq,sse2")]
pub(super) unsafe fn xts_from(
    k1: &RoundKeys,
    k2: &RoundKeys,
    ivs: &mut [[u8; 16]],
    src: &[u8],
    dst: &mut [u8],
    unit: usize,
    enc: bool,
) {
    assert_eq!(src.len(), dst.len());
    by_rounds_and_direction!(
        k1,
        enc,
        xts_nr(TweakSchedule::here(), k1, k2, ivs, Some(src), dst, unit)
    )
}

/// CBC decryption of one data unit starting from `iv`.
#[target_feature(enable = "avx2,vaes,aes,pclmulqdq,sse2")]
fn cbc_decrypt_unit<const NR: usize>(k: &RoundKeys, iv: __m128i, data: &mut [u8]) {
    let rk = &k.dec_wide;
    let (first, final_key) = (load256(&rk[0]), load256(&rk[NR]));
    let mut prev = iv;
    let (passes, rest) = data.as_chunks_mut::<PASS>();
    for p in passes {
        let regs: &mut [[u8; 32]; W] = p.as_chunks_mut::<32>().0.try_into().expect("W registers");
        let mut ct = [_mm256_setzero_si256(); W];
        let mut b = [_mm256_setzero_si256(); W];
        let mut last = [final_key; W];
        for i in 0..W {
            ct[i] = load256(&regs[i]);
            b[i] = _mm256_xor_si256(ct[i], first);
        }
        // The block before each register's pair: [previous ciphertext, first of the pair].
        // Folded into the last round key, as XTS does with its tweak.
        last[0] = _mm256_xor_si256(
            last[0],
            _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(prev),
                _mm256_castsi256_si128(ct[0]),
            ),
        );
        for i in 1..W {
            let before = _mm256_permute2x128_si256::<0x21>(ct[i - 1], ct[i]);
            last[i] = _mm256_xor_si256(last[i], before);
        }
        rounds::<NR, false>(&mut b, rk, &last);
        for i in 0..W {
            store256(&mut regs[i], b[i]);
        }
        prev = _mm256_extracti128_si256::<1>(ct[W - 1]);
    }
    if !rest.is_empty() {
        ni::cbc_decrypt_unit::<NR>(&k.load(false), prev, rest);
    }
}

/// CBC decryption over `ivs.len()` data units of `unit` bytes (encryption is one chain per
/// unit and stays on the AES-NI path, which interleaves units).
///
/// # Safety
/// The CPU must support AVX2, VAES and AES-NI.
#[target_feature(enable = "avx2,vaes,aes,pclmulqdq,sse2")]
pub(super) unsafe fn cbc_decrypt(k: &RoundKeys, ivs: &[[u8; 16]], data: &mut [u8], unit: usize) {
    for (iv, unit_data) in ivs.iter().zip(data.chunks_exact_mut(unit)) {
        if k.rounds == 10 {
            cbc_decrypt_unit::<10>(k, load128(iv), unit_data);
        } else {
            cbc_decrypt_unit::<14>(k, load128(iv), unit_data);
        }
    }
}

/// Stores a register pair's low block (tests of the lane helpers).
#[cfg(test)]
#[target_feature(enable = "avx2")]
fn lane(v: __m256i, hi: bool) -> [u8; 16] {
    use super::keys::store128;
    let mut b = [0u8; 16];
    let x = if hi {
        _mm256_extracti128_si256::<1>(v)
    } else {
        _mm256_castsi256_si128(v)
    };
    store128(&mut b, x);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supported() -> bool {
        crate::Backend::Vaes256.is_supported()
    }

    /// T·α^n computed one doubling at a time, as IEEE 1619 defines it.
    fn alpha_pow(t: [u8; 16], n: usize) -> [u8; 16] {
        let mut x = u128::from_le_bytes(t);
        for _ in 0..n {
            let carry = x >> 127;
            x = (x << 1) ^ (carry * 0x87);
        }
        x.to_le_bytes()
    }

    /// Data units that are not whole passes (sector sizes never are, so the property tests
    /// cannot reach this): the tail after the last pass continues the tweak sequence.
    #[test]
    fn units_with_a_tail_match_the_aes_ni_path() {
        if !supported() {
            eprintln!("SKIPPED: this CPU has no VAES/VPCLMULQDQ with AVX2 (vaes256 path)");
            return;
        }
        for key_len in [16usize, 32] {
            let k1: Vec<u8> = (0..key_len).map(|i| (i * 7 + 3) as u8).collect();
            let k2: Vec<u8> = (0..key_len).map(|i| (i * 11 + 5) as u8).collect();
            let keys = crate::backend::x86::XtsKeys::new(&k1, &k2).expect("AES-NI present");
            for unit in [16usize, 48, 304, 560, 784] {
                for enc in [true, false] {
                    let data: Vec<u8> = (0..3 * unit).map(|i| (i * 31 + unit) as u8).collect();
                    let ivs: Vec<[u8; 16]> = (0..3u8).map(|n| [n + 1; 16]).collect();
                    let (mut a, mut b) = (data.clone(), data);
                    let (mut ia, mut ib) = (ivs.clone(), ivs);
                    keys.xts(crate::Backend::Vaes256, &mut ia, &mut a, unit, enc);
                    keys.xts(crate::Backend::AesNi, &mut ib, &mut b, unit, enc);
                    assert_eq!(a, b, "key {key_len} unit {unit} enc {enc}");
                }
            }
        }
    }

    /// Both tweak schedules against the AES-NI path (the CPU's vendor picks one, so the
    /// property tests reach only that one here): 512- and 4096-byte sectors, 1-9 units,
    /// AES-128 and AES-256, both directions, in place and out of place.
    #[test]
    fn both_tweak_schedules_match_the_aes_ni_path() {
        if !supported() {
            eprintln!("SKIPPED: this CPU has no VAES/VPCLMULQDQ with AVX2 (vaes256 path)");
            return;
        }
        for key_len in [16usize, 32] {
            let k1: Vec<u8> = (0..key_len).map(|i| (i * 13 + 1) as u8).collect();
            let k2: Vec<u8> = (0..key_len).map(|i| (i * 29 + 7) as u8).collect();
            let keys = crate::backend::x86::XtsKeys::new(&k1, &k2).expect("AES-NI present");
            for unit in [512usize, 4096] {
                for units in [1usize, 2, 3, 8, 9] {
                    for enc in [true, false] {
                        let data: Vec<u8> =
                            (0..units * unit).map(|i| (i * 131 + units) as u8).collect();
                        let ivs: Vec<[u8; 16]> = (0..units)
                            .map(|n| core::array::from_fn(|j| (n * 17 + j) as u8))
                            .collect();
                        let (mut want, mut iw) = (data.clone(), ivs.clone());
                        keys.xts(crate::Backend::AesNi, &mut iw, &mut want, unit, enc);
                        for schedule in [TweakSchedule::Single, TweakSchedule::Shared] {
                            let what = format!(
                                "{schedule:?} key {key_len} unit {unit} x{units} enc {enc}"
                            );
                            let (mut got, mut ig) = (data.clone(), ivs.clone());
                            let (k1, k2) = (&keys.data, &keys.tweak);
                            // SAFETY: the features were checked above.
                            unsafe {
                                by_rounds_and_direction!(
                                    k1,
                                    enc,
                                    xts_nr(schedule, k1, k2, &mut ig, None, &mut got, unit)
                                )
                            };
                            assert_eq!(got, want, "in place, {what}");
                            let (mut out, mut io) = (vec![0u8; data.len()], ivs.clone());
                            // SAFETY: as above.
                            unsafe {
                                by_rounds_and_direction!(
                                    k1,
                                    enc,
                                    xts_nr(schedule, k1, k2, &mut io, Some(&data), &mut out, unit)
                                )
                            };
                            assert_eq!(out, want, "out of place, {what}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pass_tweaks_are_consecutive_powers_of_alpha() {
        if !supported() {
            eprintln!("SKIPPED: this CPU has no VAES/VPCLMULQDQ with AVX2 (vaes256 path)");
            return;
        }
        let t: [u8; 16] = core::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0x80);
        // SAFETY: the features were checked above.
        unsafe {
            let mut z = pass_tweaks(load128(&t));
            for pass in 0..3 {
                for (i, r) in z.iter().enumerate() {
                    for hi in [false, true] {
                        let n = pass * 2 * W + 2 * i + hi as usize;
                        assert_eq!(lane(*r, hi), alpha_pow(t, n), "pass {pass} reg {i} hi {hi}");
                    }
                }
                for r in z.iter_mut() {
                    *r = next_pass(*r);
                }
            }
        }
    }
}
