//! VAES + AVX-512 XTS: four blocks per instruction, eight registers in flight (32 blocks,
//! one 512-byte pass).
//!
//! Tweaks live in vector registers: lane j of a register holds T·α^j, and the other
//! registers' tweaks are derived by multiplying every lane by a power of α (independent,
//! so no serial chain). Per-sector starting tweaks are encrypted together up front. The
//! pass loop is one assembly block with every value in a register of its own (see
//! `xts_passes`).

use super::keys::{RoundKeys, load128, source_unit};
use super::ni;
use core::arch::x86_64::*;

/// a ^ b ^ c in one instruction.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) fn xor3(a: __m512i, b: __m512i, c: __m512i) -> __m512i {
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

/// Registers per pass: 8 × 4 blocks = 512 bytes, one whole small sector, so that enough
/// independent AES chains are in flight to cover the instruction latency.
const W: usize = 8;
/// Bytes per pass.
const PASS: usize = 64 * W;

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

/// Tweaks for W registers from the first: register i = register 0 × α^(4i), each at most
/// two multiplications away from it (this is on the path from the IV to the first round).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vpclmulqdq")]
fn tweaks_from(z0: __m512i) -> [__m512i; W] {
    let z1 = mul_xk::<4, 60>(z0);
    [
        z0,
        z1,
        mul_x8m::<1, 15>(z0),
        mul_x8m::<1, 15>(z1),
        mul_x8m::<2, 14>(z0),
        mul_x8m::<2, 14>(z1),
        mul_x8m::<3, 13>(z0),
        mul_x8m::<3, 13>(z1),
    ]
}

/// Whitening of zmm`$r` (tweak in zmm`$t`, round key 0 in zmm25): data read at `{$src}`
/// (`{s}` out of place, `{d}` in place).
#[rustfmt::skip]
macro_rules! whiten {
    ($src:tt, $r:literal, $t:literal, $off:literal) => {
        concat!(
            "vpxorq zmm", $r, ", zmm25, zmm", $t, "\n",
            "vpxorq zmm", $r, ", zmm", $r, ", [{", $src, "} + ", $off, "]\n",
        )
    };
}

/// One AES round (`$op`) on zmm0..zmm7; the round key at byte `$off` of `{k}` broadcast
/// once into zmm24.
#[rustfmt::skip]
macro_rules! round8 {
    ($op:literal, $off:literal) => {
        concat!(
            "vbroadcasti32x4 zmm24, [{k} + ", $off, "]\n",
            $op, " zmm0, zmm0, zmm24\n", $op, " zmm1, zmm1, zmm24\n",
            $op, " zmm2, zmm2, zmm24\n", $op, " zmm3, zmm3, zmm24\n",
            $op, " zmm4, zmm4, zmm24\n", $op, " zmm5, zmm5, zmm24\n",
            $op, " zmm6, zmm6, zmm24\n", $op, " zmm7, zmm7, zmm24\n",
        )
    };
}

/// The next pass's tweaks of one register: zmm`$n` = zmm`$t` · α^32 (a four-byte shift
/// and the four bytes shifted out times 0x87 carry-less; zmm27 holds 0x87 per lane,
/// zmm29 is scratch).
#[rustfmt::skip]
macro_rules! tweak_step {
    ($t:literal, $n:literal) => {
        concat!(
            "vpsrldq zmm29, zmm", $t, ", 12\n",
            "vpclmulqdq zmm29, zmm29, zmm27, 0\n",
            "vpslldq zmm", $n, ", zmm", $t, ", 4\n",
            "vpxorq zmm", $n, ", zmm", $n, ", zmm29\n",
        )
    };
}

/// Rounds 1..8 of a pass, with (`step`) or without (`none`: a unit's last pass) the next
/// pass's tweaks computed in between, one register per round, from the tweak registers
/// of bank `$bank` into the other (see `xts_pass`).
#[rustfmt::skip]
macro_rules! first_rounds {
    (none, $bank:ident, $op:literal) => {
        concat!(
            round8!($op, "16"), round8!($op, "32"), round8!($op, "48"), round8!($op, "64"),
            round8!($op, "80"), round8!($op, "96"), round8!($op, "112"), round8!($op, "128"),
        )
    };
    (step, a, $op:literal) => {
        concat!(
            round8!($op, "16"), tweak_step!("8", "16"),
            round8!($op, "32"), tweak_step!("9", "17"),
            round8!($op, "48"), tweak_step!("10", "18"),
            round8!($op, "64"), tweak_step!("11", "19"),
            round8!($op, "80"), tweak_step!("12", "20"),
            round8!($op, "96"), tweak_step!("13", "21"),
            round8!($op, "112"), tweak_step!("14", "22"),
            round8!($op, "128"), tweak_step!("15", "23"),
        )
    };
    (step, b, $op:literal) => {
        concat!(
            round8!($op, "16"), tweak_step!("16", "8"),
            round8!($op, "32"), tweak_step!("17", "9"),
            round8!($op, "48"), tweak_step!("18", "10"),
            round8!($op, "64"), tweak_step!("19", "11"),
            round8!($op, "80"), tweak_step!("20", "12"),
            round8!($op, "96"), tweak_step!("21", "13"),
            round8!($op, "112"), tweak_step!("22", "14"),
            round8!($op, "128"), tweak_step!("23", "15"),
        )
    };
}

/// Last round of zmm`$r` with round key NR (zmm26) ^ its tweak (zmm`$t`), stored at `{d}`.
#[rustfmt::skip]
macro_rules! finish {
    ($op:literal, $r:literal, $t:literal, $off:literal) => {
        concat!(
            "vpxorq zmm28, zmm26, zmm", $t, "\n",
            $op, " zmm", $r, ", zmm", $r, ", zmm28\n",
            "vmovdqu64 [{d} + ", $off, "], zmm", $r, "\n",
        )
    };
}

/// One 512-byte pass: whitening, rounds (`$sched`: see `first_rounds`), last round, stores.
/// Its tweaks are in bank `a` (zmm8..zmm15; the next pass's go to zmm16..zmm23) or `b`
/// (the other way round): the loop alternates the two, so no register moves.
#[rustfmt::skip]
macro_rules! xts_pass {
    ($src:tt, $sched:ident, a, $op:literal, $oplast:literal, [$($more:literal),*]) => {
        xts_pass!(@ $src, $sched, a, $op, $oplast, [$($more),*],
                  ["8", "9", "10", "11", "12", "13", "14", "15"])
    };
    ($src:tt, $sched:ident, b, $op:literal, $oplast:literal, [$($more:literal),*]) => {
        xts_pass!(@ $src, $sched, b, $op, $oplast, [$($more),*],
                  ["16", "17", "18", "19", "20", "21", "22", "23"])
    };
    (@ $src:tt, $sched:ident, $bank:ident, $op:literal, $oplast:literal, [$($more:literal),*],
     [$t0:literal, $t1:literal, $t2:literal, $t3:literal,
      $t4:literal, $t5:literal, $t6:literal, $t7:literal]) => {
        concat!(
            whiten!($src, "0", $t0, "0"), whiten!($src, "1", $t1, "64"),
            whiten!($src, "2", $t2, "128"), whiten!($src, "3", $t3, "192"),
            whiten!($src, "4", $t4, "256"), whiten!($src, "5", $t5, "320"),
            whiten!($src, "6", $t6, "384"), whiten!($src, "7", $t7, "448"),
            first_rounds!($sched, $bank, $op),
            $(round8!($op, $more),)*
            finish!($oplast, "0", $t0, "0"), finish!($oplast, "1", $t1, "64"),
            finish!($oplast, "2", $t2, "128"), finish!($oplast, "3", $t3, "192"),
            finish!($oplast, "4", $t4, "256"), finish!($oplast, "5", $t5, "320"),
            finish!($oplast, "6", $t6, "384"), finish!($oplast, "7", $t7, "448"),
            advance_src!($src),
            "add {d}, 512\n",
        )
    };
}

/// Moves the source pointer to the next pass; in place (`{d}` is the source) nothing.
macro_rules! advance_src {
    ("s") => {
        "add {s}, 512\n"
    };
    ("d") => {
        ""
    };
}

/// The pass loop: `{n}` passes read at `{$src}` and written at `{d}`; the first pass's
/// tweaks in zmm8..zmm15 (bank `a`), the next pass's computed into zmm16..zmm23 (bank `b`)
/// and so on, alternating; a unit's last pass computes none. `$last_off` is the byte
/// offset of round key NR; `$more` the rounds after the eighth.
#[rustfmt::skip]
macro_rules! xts_loop {
    ($src:tt, $op:literal, $oplast:literal, $last_off:literal, [$($more:literal),*]) => {
        concat!(
            "vbroadcasti32x4 zmm25, [{k}]\n",
            "vbroadcasti32x4 zmm26, [{k} + ", $last_off, "]\n",
            "vmovdqu64 zmm27, [{c}]\n",
            "2:\n",
            "dec {n}\n",
            "jz 3f\n",
            xts_pass!($src, step, a, $op, $oplast, [$($more),*]),
            "dec {n}\n",
            "jz 4f\n",
            xts_pass!($src, step, b, $op, $oplast, [$($more),*]),
            "jmp 2b\n",
            "3:\n",
            xts_pass!($src, none, a, $op, $oplast, [$($more),*]),
            "jmp 5f\n",
            "4:\n",
            xts_pass!($src, none, b, $op, $oplast, [$($more),*]),
            "5:\n",
        )
    };
}

/// The four loops of a pass-loop text macro (`xts_loop`, `single_pass_loop`): AES-128/256,
/// encrypt/decrypt, reading at `$src` (`"s"` or `"d"`), each passed to the caller's `$run`
/// (its `asm!` with the operands) with `$operand` (the source register, if any).
macro_rules! by_key_and_direction {
    ($run:ident, $loop:ident, $src:tt, [$($operand:tt)*]) => {
        match (NR, ENC) {
            (10, true) => $run!(
                $loop!($src, "vaesenc", "vaesenclast", "160", ["144"]),
                [$($operand)*]
            ),
            (10, false) => $run!(
                $loop!($src, "vaesdec", "vaesdeclast", "160", ["144"]),
                [$($operand)*]
            ),
            (_, true) => $run!(
                $loop!($src, "vaesenc", "vaesenclast", "224", ["144", "160", "176", "192", "208"]),
                [$($operand)*]
            ),
            (_, false) => $run!(
                $loop!($src, "vaesdec", "vaesdeclast", "224", ["144", "160", "176", "192", "208"]),
                [$($operand)*]
            ),
        }
    };
}

/// 0x87 in the low qword of each 128-bit lane: the reduction constant of the tweak step.
#[repr(C, align(64))]
struct Reduction([u64; 8]);
static REDUCTION: Reduction = Reduction([0x87, 0, 0x87, 0, 0x87, 0, 0x87, 0]);

/// XTS over `passes` passes of 512 bytes of one data unit, its first tweaks in `z`
/// (register i holds T·α^(4i) .. T·α^(4i+3)); read from `src` when given, else in place.
///
/// One assembly block with every value in a register of its own: eight data registers,
/// eight tweak registers and eight for the next pass's tweaks (the two banks alternate), round keys 0 and NR, the
/// current round key, the reduction constant and scratch (29 of the 32). Compiled from
/// intrinsics the same loop kept round keys, last-round keys and tweaks live at once,
/// spilled, and ran at 0.84x the kernel's AVX10/512 driver on AMD Zen 4.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vaes,vpclmulqdq")]
fn xts_passes<const NR: usize, const ENC: bool>(
    rk: &[[u8; 16]; 15],
    z: [__m512i; W],
    src: Option<&[[u8; PASS]]>,
    data: &mut [[u8; PASS]],
) {
    const { assert!(W == 8 && (NR == 10 || NR == 14)) };
    if data.is_empty() {
        return;
    }
    debug_assert!(src.is_none_or(|s| s.len() == data.len()));
    let (k, d, n) = (rk.as_ptr(), data.as_mut_ptr(), data.len());
    // SAFETY: `{s}` (out of place only) covers `n` passes of 512 bytes, read; `{d}` as
    // many, read when in place and written (`src` and `data` cannot overlap); `{k}` is 15
    // round keys of 16 bytes, read; `{c}` is 64 readable bytes. Every vector register used
    // is declared clobbered or an input, as are the pointer and counter registers; EVEX
    // memory operands need no alignment. The caller enables AVX-512F/BW, VAES and
    // VPCLMULQDQ.
    unsafe {
        // The source register exists only out of place (`asm!` rejects an unused operand).
        macro_rules! run {
            ($text:expr, [$($src:tt)*]) => {
                core::arch::asm!(
                    $text,
                    k = in(reg) k,
                    c = in(reg) REDUCTION.0.as_ptr(),
                    $($src)*
                    d = inout(reg) d => _,
                    n = inout(reg) n => _,
                    inout("zmm8") z[0] => _, inout("zmm9") z[1] => _,
                    inout("zmm10") z[2] => _, inout("zmm11") z[3] => _,
                    inout("zmm12") z[4] => _, inout("zmm13") z[5] => _,
                    inout("zmm14") z[6] => _, inout("zmm15") z[7] => _,
                    out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                    out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                    out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                    out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
                    out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _,
                    out("zmm28") _, out("zmm29") _,
                    options(nostack),
                )
            };
        }
        match src {
            Some(src) => {
                let s = src.as_ptr();
                by_key_and_direction!(run, xts_loop, "s", [s = inout(reg) s => _,])
            }
            None => by_key_and_direction!(run, xts_loop, "d", []),
        }
    }
}

/// Whitening of zmm`$r` with its tweak read from the table at `{t}`.
#[rustfmt::skip]
macro_rules! whiten_mem {
    ($src:tt, $r:literal, $off:literal) => {
        concat!(
            "vpxorq zmm", $r, ", zmm25, [{t} + ", $off, "]\n",
            "vpxorq zmm", $r, ", zmm", $r, ", [{", $src, "} + ", $off, "]\n",
        )
    };
}

/// Last round of zmm`$r` with round key NR ^ its tweak from the table, stored at `{d}`;
/// the tweak, used for the last time, is then zeroed in the table (zmm29 is zero): the
/// store port is idle in this AES-bound loop, where wiping the table after the loop cost
/// 5 % at 4 KiB requests.
#[rustfmt::skip]
macro_rules! finish_mem {
    ($op:literal, $r:literal, $off:literal) => {
        concat!(
            "vpxorq zmm28, zmm26, [{t} + ", $off, "]\n",
            $op, " zmm", $r, ", zmm", $r, ", zmm28\n",
            "vmovdqu64 [{d} + ", $off, "], zmm", $r, "\n",
            "vmovdqa64 [{t} + ", $off, "], zmm29\n",
        )
    };
}

/// `{n}` passes of one pass per data unit (512-byte sectors), each pass's eight tweak
/// registers read from the table at `{t}` (512 bytes a pass).
#[rustfmt::skip]
macro_rules! single_pass_loop {
    ($src:tt, $op:literal, $oplast:literal, $last_off:literal, [$($more:literal),*]) => {
        concat!(
            "vbroadcasti32x4 zmm25, [{k}]\n",
            "vbroadcasti32x4 zmm26, [{k} + ", $last_off, "]\n",
            "vpxord zmm29, zmm29, zmm29\n",
            "2:\n",
            whiten_mem!($src, "0", "0"), whiten_mem!($src, "1", "64"),
            whiten_mem!($src, "2", "128"), whiten_mem!($src, "3", "192"),
            whiten_mem!($src, "4", "256"), whiten_mem!($src, "5", "320"),
            whiten_mem!($src, "6", "384"), whiten_mem!($src, "7", "448"),
            first_rounds!(none, a, $op),
            $(round8!($op, $more),)*
            finish_mem!($oplast, "0", "0"), finish_mem!($oplast, "1", "64"),
            finish_mem!($oplast, "2", "128"), finish_mem!($oplast, "3", "192"),
            finish_mem!($oplast, "4", "256"), finish_mem!($oplast, "5", "320"),
            finish_mem!($oplast, "6", "384"), finish_mem!($oplast, "7", "448"),
            advance_src!($src),
            "add {d}, 512\n",
            "add {t}, 512\n",
            "dec {n}\n",
            "jnz 2b\n",
        )
    };
}

/// Units per tweak table of [`single_pass_units`]: 4 KiB of tweaks on the stack.
const TABLE_UNITS: usize = 8;

/// XTS over data units of exactly one pass (512-byte sectors), their encrypted IVs in
/// `ivs`: every unit's tweaks are derived into a table first, then one assembly loop runs
/// all the passes, reading tweaks from the table. Calling [`xts_passes`] once per unit
/// put the tweak derivation and the loop's set-up between every two passes. `table` is
/// scratch space (the caller's, so that a test can look at what is left in it).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vaes,vpclmulqdq")]
fn single_pass_units<const NR: usize, const ENC: bool>(
    rk: &[[u8; 16]; 15],
    ivs: &[[u8; 16]],
    src: Option<&[[u8; PASS]]>,
    data: &mut [[u8; PASS]],
    table: &mut TweakTable,
) {
    const { assert!(W == 8 && (NR == 10 || NR == 14)) };
    // Rows set (one per IV) must be the rows the loop reads and zeroes (one per unit).
    assert_eq!(ivs.len(), data.len());
    debug_assert!(src.is_none_or(|s| s.len() == data.len()));
    for (i, (ivs, data)) in ivs
        .chunks(TABLE_UNITS)
        .zip(data.chunks_mut(TABLE_UNITS))
        .enumerate()
    {
        for (row, iv) in ivs.iter().enumerate() {
            table.set_row(row, tweaks_from(first_tweaks(load128(iv))));
        }
        let (k, t, d, n) = (
            rk.as_ptr(),
            table.as_mut_ptr(),
            data.as_mut_ptr(),
            data.len(),
        );
        // SAFETY: `{s}` (out of place only) covers `n` passes of 512 bytes, read; `{d}` as
        // many, read when in place and written (`src` and `data` cannot overlap); `{t}` is
        // `n` ≤ TABLE_UNITS rows of 512 bytes, all just set (one per IV, as many IVs as
        // units), read and then zeroed, from a pointer of the `&mut` table; its aligned
        // stores (`vmovdqa64`) are 64-aligned: the table is `align(64)`, `{t}` advances by
        // 512 a pass and the offsets are multiples of 64; other EVEX memory operands need
        // no alignment. `{k}` is 15 round keys of 16 bytes, read; `n` ≥ 1 (chunks are never
        // empty). Every vector register used is declared clobbered, as are the pointer and
        // counter registers. The caller enables AVX-512F/BW and VAES.
        unsafe {
            macro_rules! run {
                ($text:expr, [$($src:tt)*]) => {
                    core::arch::asm!(
                        $text,
                        k = in(reg) k,
                        $($src)*
                        t = inout(reg) t => _,
                        d = inout(reg) d => _,
                        n = inout(reg) n => _,
                        out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                        out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                        out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm28") _,
                        out("zmm29") _,
                        options(nostack),
                    )
                };
            }
            match src {
                Some(src) => {
                    let s = src[i * TABLE_UNITS..].as_ptr();
                    by_key_and_direction!(run, single_pass_loop, "s", [s = inout(reg) s => _,])
                }
                None => by_key_and_direction!(run, single_pass_loop, "d", []),
            }
        }
    }
    // Tweaks are derived from the key: the loop zeroes each row after its pass
    // (`finish_mem`), so none stays on the stack.
}

/// The tweak table of [`single_pass_units`]: rows of one unit's eight tweak registers,
/// 64-byte aligned, never initialised as a whole (a 4 KiB memset per call cost more than
/// a 512-byte sector's encryption); only rows set are read, and the loop zeroes them.
#[repr(C, align(64))]
struct TweakTable(core::mem::MaybeUninit<[[u8; PASS]; TABLE_UNITS]>);

impl TweakTable {
    fn new() -> Self {
        Self(core::mem::MaybeUninit::uninit())
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }

    /// Row `row`'s eight registers.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn set_row(&mut self, row: usize, z: [__m512i; W]) {
        assert!(row < TABLE_UNITS);
        let base = self.0.as_mut_ptr().cast::<__m512i>();
        for (j, reg) in z.into_iter().enumerate() {
            // SAFETY: row < TABLE_UNITS and j < W, so the 64 bytes at `row * W + j`
            // registers from the 64-aligned start are inside the table, and aligned.
            unsafe { _mm512_store_si512(base.add(row * W + j), reg) }
        }
    }
}

/// Encrypts XTS tweaks (IVs) in place with the tweak key `k`, four to a register: the
/// eight IVs of a 4 KiB request of 512-byte sectors then take 28 AES instructions instead
/// of 112 one-block ones, which issue on the same port as the 512-bit rounds on Intel
/// cores. Fewer than four (a request of large sectors) go one at a time (`ni`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,vaes,aes,pclmulqdq,sse2")]
fn encrypt_tweaks<const NR: usize>(k: &RoundKeys, ivs: &mut [[u8; 16]]) {
    let (quads, rest) = ivs.as_chunks_mut::<4>();
    let rk = &k.enc;
    let key = |i: usize| _mm512_broadcast_i32x4(load128(&rk[i]));
    for pair in quads.chunks_mut(2) {
        let mut b = [_mm512_setzero_si512(); 2];
        for (x, q) in b.iter_mut().zip(pair.iter()) {
            *x = _mm512_xor_si512(load512(q.as_flattened()), key(0));
        }
        for i in 1..NR {
            let ki = key(i);
            for x in b.iter_mut() {
                *x = _mm512_aesenc_epi128(*x, ki);
            }
        }
        let last = key(NR);
        for (x, q) in b.iter().zip(pair.iter_mut()) {
            store512(q.as_flattened_mut(), _mm512_aesenclast_epi128(*x, last));
        }
    }
    ni::encrypt_tweaks::<NR>(k, rest);
}

#[inline]
#[target_feature(enable = "avx512f")]
fn load512(b: &[u8]) -> __m512i {
    assert!(b.len() >= 64);
    // SAFETY: `b` has at least 64 readable bytes (checked); unaligned load.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn store512(b: &mut [u8], v: __m512i) {
    assert!(b.len() >= 64);
    // SAFETY: `b` has at least 64 writable bytes (checked); unaligned store.
    unsafe { _mm512_storeu_si512(b.as_mut_ptr().cast(), v) }
}

#[target_feature(enable = "avx512f,avx512bw,vaes,vpclmulqdq,aes,pclmulqdq,sse2")]
fn xts_nr<const NR: usize, const ENC: bool>(
    k1: &RoundKeys,
    k2: &RoundKeys,
    ivs: &mut [[u8; 16]],
    src: Option<&[u8]>,
    data: &mut [u8],
    unit: usize,
) {
    encrypt_tweaks::<NR>(k2, ivs);
    let rk = if ENC { &k1.enc } else { &k1.dec };
    if unit == PASS {
        let from = src.map(|s| s.as_chunks::<PASS>().0);
        let data = data.as_chunks_mut::<PASS>().0;
        return single_pass_units::<NR, ENC>(rk, ivs, from, data, &mut TweakTable::new());
    }
    for (i, (iv, sector)) in ivs.iter().zip(data.chunks_exact_mut(unit)).enumerate() {
        let z = tweaks_from(first_tweaks(load128(iv)));
        let (from, from_rest) = source_unit::<PASS>(src, i, unit);
        let (passes, rest) = sector.as_chunks_mut::<PASS>();
        xts_passes::<NR, ENC>(rk, z, from, passes);
        if !rest.is_empty() {
            if let Some(f) = from_rest {
                rest.copy_from_slice(f);
            }
            unit_tail::<NR, ENC>(k1, iv, passes.len(), rest);
        }
    }
}

/// The blocks of a data unit after its last whole pass (no sector size has any), with
/// the tweak T · α^(32·passes). Derived again from the IV, in a function of its own:
/// otherwise the unit's first tweaks stay live across the pass loop, which clobbers every
/// vector register, and they go to the stack and back before the first round.
#[cold]
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,vaes,vpclmulqdq,aes,pclmulqdq,sse2")]
fn unit_tail<const NR: usize, const ENC: bool>(
    k1: &RoundKeys,
    iv: &[u8; 16],
    passes: usize,
    rest: &mut [u8],
) {
    let mut t = first_tweaks(load128(iv));
    for _ in 0..passes {
        t = mul_x8m::<4, 12>(t);
    }
    ni::xts_unit::<NR, ENC>(k1, _mm512_castsi512_si128(t), rest);
}

/// XTS over `ivs.len()` data units of `unit` bytes (any multiple of 16); `ivs` is
/// overwritten with the encrypted tweaks.
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
    by_rounds_and_direction!(k1, enc, xts_nr(k1, k2, ivs, None, data, unit))
}

/// [`xts`] reading `src` and writing `dst` (same length) in one pass over memory.
///
/// # Safety
/// As [`xts`].
#[target_feature(enable = "avx512f,avx512bw,vaes,vpclmulqdq,aes,pclmulqdq,sse2")]
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
    by_rounds_and_direction!(k1, enc, xts_nr(k1, k2, ivs, Some(src), dst, unit))
}

#[cfg(test)]
mod tests {
    /// Data units that are not whole 512-byte passes (sector sizes never are, so the property
    /// tests cannot reach this): the tail after the last pass continues the tweak sequence,
    /// in place and out of place, and units of one to four passes take both tweak banks.
    #[test]
    fn units_with_a_tail_match_the_aes_ni_path() {
        if !crate::Backend::Vaes512.is_supported() {
            eprintln!(
                "SKIPPED: this CPU has no AVX-512 with VAES/VPCLMULQDQ (vaes512 path); \
                 run the crypto tests on such a CPU"
            );
            return;
        }
        for key_len in [16usize, 32] {
            let k1: Vec<u8> = (0..key_len).map(|i| (i * 7 + 3) as u8).collect();
            let k2: Vec<u8> = (0..key_len).map(|i| (i * 11 + 5) as u8).collect();
            let keys = crate::backend::x86::XtsKeys::new(&k1, &k2).expect("AES-NI present");
            for unit in [16usize, 48, 512, 560, 1024, 1536, 1552, 2048, 2096] {
                for enc in [true, false] {
                    let data: Vec<u8> = (0..3 * unit).map(|i| (i * 31 + unit) as u8).collect();
                    let ivs: Vec<[u8; 16]> = (0..3u8).map(|n| [n + 1; 16]).collect();
                    let (mut a, mut b) = (data.clone(), data.clone());
                    let (mut ia, mut ib, mut ic) = (ivs.clone(), ivs.clone(), ivs);
                    keys.xts(crate::Backend::Vaes512, &mut ia, &mut a, unit, enc);
                    keys.xts(crate::Backend::AesNi, &mut ib, &mut b, unit, enc);
                    assert_eq!(a, b, "key {key_len} unit {unit} enc {enc}");
                    let mut c = vec![0u8; data.len()];
                    keys.xts_from(crate::Backend::Vaes512, &mut ic, &data, &mut c, unit, enc);
                    assert_eq!(c, b, "from: key {key_len} unit {unit} enc {enc}");
                }
            }
        }
    }

    /// The pass loop of 512-byte units leaves no tweak in its table: every row it used is
    /// zero afterwards (rows it did not use keep what they held), and the output is still
    /// the AES-NI path's.
    #[test]
    fn single_pass_units_leave_no_tweak_in_the_table() {
        if !crate::Backend::Vaes512.is_supported() {
            eprintln!("SKIPPED: this CPU has no AVX-512 (vaes512 path); run on such a CPU");
            return;
        }
        use super::{PASS, TABLE_UNITS, TweakTable, W, single_pass_units};
        use core::arch::x86_64::_mm512_set1_epi8;
        let k1: Vec<u8> = (0..32u8).collect();
        let k2: Vec<u8> = (32..64u8).collect();
        let keys = crate::backend::x86::XtsKeys::new(&k1, &k2).expect("AES-NI present");
        let mut rk = [[0u8; 16]; 15];
        for (i, r) in rk.iter_mut().enumerate() {
            *r = [i as u8 * 17 + 1; 16];
        }
        // In place (AES-256, encrypt) and out of place (AES-128, decrypt).
        for (units, out_of_place) in [(1usize, false), (3, true), (8, false), (11, true)] {
            let mut t = TweakTable::new();
            let mut data = vec![[7u8; PASS]; units];
            let src = vec![[8u8; PASS]; units];
            let ivs: Vec<[u8; 16]> = (0..units as u8).map(|n| [n + 1; 16]).collect();
            // SAFETY: the CPU has AVX-512F/BW, VAES and VPCLMULQDQ (checked above).
            unsafe {
                for row in 0..TABLE_UNITS {
                    t.set_row(row, [_mm512_set1_epi8(0x5a); W]);
                }
                if out_of_place {
                    single_pass_units::<10, false>(&rk, &ivs, Some(&src), &mut data, &mut t);
                } else {
                    single_pass_units::<14, true>(&rk, &ivs, None, &mut data, &mut t);
                }
            }
            // SAFETY: every row was set above, so the whole table is initialised.
            let bytes = unsafe { core::slice::from_raw_parts(t.as_mut_ptr(), TABLE_UNITS * PASS) };
            let used = units.min(TABLE_UNITS) * PASS;
            assert!(
                bytes[..used].iter().all(|&b| b == 0),
                "{units} units: rows used"
            );
            assert!(
                bytes[used..].iter().all(|&b| b == 0x5a),
                "{units} units: rows not used"
            );
        }
        // And through the public path, the same bytes as AES-NI.
        let mut a = vec![9u8; 5 * PASS];
        let mut b = a.clone();
        let mut ia: Vec<[u8; 16]> = (0..5u8).map(|n| [n; 16]).collect();
        let mut ib = ia.clone();
        keys.xts(crate::Backend::Vaes512, &mut ia, &mut a, PASS, true);
        keys.xts(crate::Backend::AesNi, &mut ib, &mut b, PASS, true);
        assert_eq!(a, b);
    }
}
