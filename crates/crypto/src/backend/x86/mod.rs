//! Hand-written AES-NI, VAES-256 (AVX2) and VAES-512 (AVX-512) sector code, one module
//! per backend.
//!
//! The point of these paths is batching: every sector of a request goes through one call,
//! tweaks are computed in vector registers, and several blocks (and, for CBC encryption,
//! several sectors) are in flight at once so the AES units never wait on one chain.
//! Only 128- and 256-bit AES keys have fast paths; AES-192 uses the generic backend.

// Vector code indexes parallel register arrays (blocks, tweaks, keys) by position.
#![allow(clippy::needless_range_loop)]

use crate::Backend;
use crate::secret::LockedBox;

/// Calls `$f::<NR, ENC>(args)` with the round count of `$keys` (10 for AES-128, else 14)
/// and the direction `$enc` as constants, so each combination is compiled on its own.
#[cfg(target_arch = "x86_64")]
macro_rules! by_rounds_and_direction {
    ($keys:expr, $enc:expr, $f:ident($($arg:expr),*)) => {
        match ($keys.rounds, $enc) {
            (10, true) => $f::<10, true>($($arg),*),
            (10, false) => $f::<10, false>($($arg),*),
            (_, true) => $f::<14, true>($($arg),*),
            (_, false) => $f::<14, false>($($arg),*),
        }
    };
}

/// The text of one AES round (`$op`) on the registers `{b0}`.. named in the list: the
/// round key at byte `$off` of `{k}` is loaded once into `{t}` and used from there (one
/// load per round, not one per register: a memory operand per register saturated the
/// load ports), in the VEX three-operand form (`vex`) or the legacy SSE two-operand form
/// (`sse`; its aligned load wants `{k}` 16-byte aligned).
#[cfg(target_arch = "x86_64")]
macro_rules! aes_round {
    (vex $op:literal, $off:literal, [$($r:ident => $i:literal),*]) => {
        concat!(
            "vmovdqu {t}, [{k} + ", $off, "]\n",
            $($op, " {", stringify!($r), "}, {", stringify!($r), "}, {t}\n",)*
        )
    };
    (sse $op:literal, $off:literal, [$($r:ident => $i:literal),*]) => {
        concat!(
            "movdqa {t}, [{k} + ", $off, "]\n",
            $($op, " {", stringify!($r), "}, {t}\n",)*
        )
    };
}

/// Rounds 1..NR-1 of AES (`$op`: aesenc/aesdec or their VEX forms) on the registers of the
/// array `$b` (register class `$class`; `[b0 => 0, ...]` names each element), round keys
/// `$rk` (an array of 15 keys of `$size` bytes, 16 or 32) read from memory; `$nr` is 10 or
/// 14. Unsafe: the caller states that `$rk` is readable and the CPU has the instructions.
///
/// Written in assembly, round by round across the registers: left to itself the compiler
/// orders the rounds register by register (one AES chain at a time, to save registers),
/// and the out-of-order window then cannot keep the AES units busy: the 128-bit path ran
/// at 0.6x the kernel's `aesni-avx` for that reason.
#[cfg(target_arch = "x86_64")]
macro_rules! middle_rounds {
    ($form:ident $op:literal, $class:ident, $b:ident $regs:tt, $rk:ident, $nr:expr, 32) => {
        middle_rounds!(@asm $form $op, $class, $b, $regs, $regs, $rk, $nr,
            ["32", "64", "96", "128", "160", "192", "224", "256", "288"],
            ["320", "352", "384", "416"])
    };
    ($form:ident $op:literal, $class:ident, $b:ident $regs:tt, $rk:ident, $nr:expr, 16) => {
        middle_rounds!(@asm $form $op, $class, $b, $regs, $regs, $rk, $nr,
            ["16", "32", "48", "64", "80", "96", "112", "128", "144"],
            ["160", "176", "192", "208"])
    };
    (@asm $form:ident $op:literal, $class:ident, $b:ident, $regs:tt,
        [$($r:ident => $i:literal),*], $rk:ident, $nr:expr,
        [$($o:literal),*], [$($o14:literal),*]) => {{
        core::arch::asm!(
            $(aes_round!($form $op, $o, $regs),)*
            k = in(reg) $rk.as_ptr(),
            $($r = inout($class) $b[$i],)*
            t = out($class) _,
            options(nostack, readonly, preserves_flags),
        );
        if $nr == 14 {
            core::arch::asm!(
                $(aes_round!($form $op, $o14, $regs),)*
                k = in(reg) $rk.as_ptr(),
                $($r = inout($class) $b[$i],)*
                t = out($class) _,
                options(nostack, readonly, preserves_flags),
            );
        }
    }};
}

/// The next pass's tweak of one 128-bit lane at byte `$lo` of `{tw}` (`$hi` = `$lo` + 8),
/// times α^`$k` (`$k` = 8 or 16 bits; `$r` = 64 - `$k`), written to `{twn}`, computed in
/// general-purpose registers `{ga}`..`{ge}`: the integer units are idle during the AES
/// rounds, while vector tweak arithmetic competes with the AES units for the same pipes
/// (on Zen 3 this made the 256-bit path's pass 4 % and the 128-bit path's chunk 16 %
/// faster). hi:lo shifted left by `$k`, the bits shifted out (c) reduced as c·0x87 =
/// c ^ c<<1 ^ c<<2 ^ c<<7 (carry-less: c has at most 16 bits, so no term's bits pass 23).
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
macro_rules! tweak_lane {
    ($k:literal, $r:literal, $lo:literal, $hi:literal) => {
        concat!(
            "mov {ga}, [{tw} + ", $lo, "]\n",
            "mov {gb}, [{tw} + ", $hi, "]\n",
            "mov {gc}, {gb}\n", "shr {gc}, ", $r, "\n",
            "mov {gd}, {ga}\n", "shr {gd}, ", $r, "\n",
            "shl {gb}, ", $k, "\n", "or {gb}, {gd}\n",
            "shl {ga}, ", $k, "\n",
            "lea {gd}, [{gc} + {gc}]\n", "xor {gd}, {gc}\n",
            "lea {ge}, [{gc} * 4]\n", "xor {gd}, {ge}\n",
            "shl {gc}, 7\n", "xor {gd}, {gc}\n",
            "xor {ga}, {gd}\n",
            "mov [{twn} + ", $lo, "], {ga}\n",
            "mov [{twn} + ", $hi, "], {gb}\n",
        )
    };
}

#[cfg(target_arch = "x86_64")]
mod aegis;

/// AEGIS-128 on AES-NI (`crate::aegis128`'s fast path): the tag, or `None` where the CPU
/// lacks AES-NI.
#[cfg(target_arch = "x86_64")]
pub(crate) fn aegis128_ni(
    key: &[u8; 16],
    nonce: &[u8; 16],
    aad: &[u8],
    data: &mut [u8],
    encrypt: bool,
) -> Option<[u8; 16]> {
    if !std::arch::is_x86_feature_detected!("aes") {
        return None;
    }
    // SAFETY: the CPU has AES-NI (and SSE2, which every x86_64 CPU has).
    Some(unsafe { aegis::aegis128(key, nonce, aad, data, encrypt) })
}

/// `N` (four or eight) AEGIS-128 sectors at once on VAES-512 (see
/// `aegis::aegis128_lanes`): their tags, or `None` where the CPU lacks AVX-512F or VAES or
/// the sectors are not whole 64-byte pieces.
#[cfg(target_arch = "x86_64")]
pub(crate) fn aegis128_lanes<const N: usize>(
    key: &[u8; 16],
    nonces: &[[u8; 16]; N],
    aad: &[&[u8]; N],
    data: &mut [u8],
    encrypt: bool,
) -> Option<[[u8; 16]; N]> {
    let len = data.len() / N;
    let cpu = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("vaes")
        && std::arch::is_x86_feature_detected!("aes");
    let shapes = len.is_multiple_of(64)
        && data.len() == N * len
        && aad.iter().all(|a| a.len() == aad[0].len());
    if !(cpu && shapes) {
        return None;
    }
    macro_rules! lanes {
        ($g:literal, $n:literal) => {{
            let n: &[[u8; 16]; $n] = nonces.as_slice().try_into().ok()?;
            let a: &[&[u8]; $n] = aad.as_slice().try_into().ok()?;
            // SAFETY: the CPU has the features; the sizes are as the function requires
            // (N = 4 G).
            let tags = unsafe {
                if encrypt {
                    aegis::aegis128_lanes::<$g, $n, true>(key, n, a, data, len)
                } else {
                    aegis::aegis128_lanes::<$g, $n, false>(key, n, a, data, len)
                }
            };
            tags.as_slice().try_into().ok()
        }};
    }
    match N {
        4 => lanes!(1, 4),
        8 => lanes!(2, 8),
        _ => None,
    }
}
#[cfg(target_arch = "x86_64")]
mod gcm512;
#[cfg(target_arch = "x86_64")]
mod keys;
#[cfg(target_arch = "x86_64")]
mod ni;
#[cfg(target_arch = "x86_64")]
mod sha256x16;
#[cfg(target_arch = "x86_64")]
mod vaes256;
#[cfg(target_arch = "x86_64")]
mod vaes512;

#[cfg(target_arch = "x86_64")]
pub(crate) use gcm512::GcmKeys;
#[cfg(target_arch = "x86_64")]
use keys::RoundKeys;
#[cfg(target_arch = "x86_64")]
pub(crate) use sha256x16::{
    IV as SHA256_IV, MAX_PREFIX as SHA256_MAX_PREFIX, MESSAGES as SHA256_MESSAGES,
};

/// Whether this CPU has what [`sha256_lanes`] needs (AVX-512F and BW).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_sha256_lanes() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// SHA-256 of up to 32 messages of one shape at once (see `sha256x16::digests`:
/// `start` having absorbed `done` bytes, HMAC's outer hash with `outer`). Panics where the
/// CPU lacks AVX-512F or BW ([`has_sha256_lanes`]) or the shapes are not as it says.
#[cfg(target_arch = "x86_64")]
pub(crate) fn sha256_lanes(
    start: &[u32; 8],
    done: u64,
    outer: Option<&[u32; 8]>,
    prefixes: &[&[u8]],
    bodies: &[&[u8]],
    out: &mut [[u8; 32]],
) {
    assert!(has_sha256_lanes(), "SHA-256 lanes need AVX-512F and BW");
    // SAFETY: the CPU has AVX-512F and AVX-512BW (checked just above); the function checks
    // the shapes itself.
    unsafe { sha256x16::digests(start, done, outer, prefixes, bodies, out) }
}

/// The CPU vendor string of CPUID leaf 0 ("GenuineIntel", "AuthenticAMD"...): where the
/// same instructions cost differently by vendor, the vector paths pick their schedule by it.
#[cfg(target_arch = "x86_64")]
fn cpu_vendor() -> [u8; 12] {
    // SAFETY: CPUID exists on every x86_64 CPU and leaf 0 is always valid.
    #[allow(unused_unsafe)]
    let r = unsafe { core::arch::x86_64::__cpuid(0) };
    let mut v = [0u8; 12];
    v[..4].copy_from_slice(&r.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&r.edx.to_le_bytes());
    v[8..].copy_from_slice(&r.ecx.to_le_bytes());
    v
}

/// `n` little-endian in the first eight bytes of `block`, zeros after, written as one
/// 16-byte store: the vector paths load the IV whole right after this, and a load that
/// spans two stores is not forwarded from them (on AMD Zen 4 the wait cost about 7 % of a
/// 4 KiB request on the vaes512 path).
#[inline]
pub(crate) fn store_u64_le_block(block: &mut [u8; 16], n: u64) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_cvtsi64_si128, _mm_storeu_si128};
        // SAFETY: SSE2 is part of the x86_64 baseline; `block` is 16 writable bytes and
        // the store is unaligned.
        unsafe { _mm_storeu_si128(block.as_mut_ptr().cast(), _mm_cvtsi64_si128(n as i64)) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        *block = u128::from(n).to_le_bytes();
    }
}

/// Round keys of both XTS halves for the vector paths.
pub(crate) struct XtsKeys {
    #[cfg(target_arch = "x86_64")]
    data: RoundKeys,
    #[cfg(target_arch = "x86_64")]
    tweak: RoundKeys,
}

/// Round keys of one AES key (CBC) for the vector paths.
pub(crate) struct AesKeys {
    #[cfg(target_arch = "x86_64")]
    key: RoundKeys,
}

#[cfg(target_arch = "x86_64")]
impl XtsKeys {
    /// `None` when the CPU lacks AES-NI or the key size has no fast path. Expanded in place
    /// on locked pages of their own.
    pub(crate) fn new(k1: &[u8], k2: &[u8]) -> Option<LockedBox<Self>> {
        let blank = XtsKeys {
            data: RoundKeys::blank(),
            tweak: RoundKeys::blank(),
        };
        LockedBox::new_with(blank, |k| {
            k.data.expand(k1)?;
            k.tweak.expand(k2)
        })
        .ok()
    }

    /// XTS over whole data units of `unit` bytes; `ivs` holds one IV per unit and is
    /// overwritten with the encrypted tweaks.
    pub(crate) fn xts(
        &self,
        backend: Backend,
        ivs: &mut [[u8; 16]],
        data: &mut [u8],
        unit: usize,
        enc: bool,
    ) {
        debug_assert_eq!(data.len(), ivs.len() * unit);
        match backend {
            // SAFETY: SectorCipher only passes a backend whose CPU features it has checked
            // (`Backend::is_supported`), and RoundKeys exist only on CPUs with AES-NI.
            Backend::Vaes512 => unsafe {
                vaes512::xts(&self.data, &self.tweak, ivs, data, unit, enc)
            },
            // SAFETY: as above.
            Backend::Vaes256 => unsafe {
                vaes256::xts(&self.data, &self.tweak, ivs, data, unit, enc)
            },
            // SAFETY: as above; AES-NI presence was checked when the keys were expanded.
            _ => unsafe { ni::xts(&self.data, &self.tweak, ivs, data, unit, enc) },
        }
    }

    /// [`XtsKeys::xts`] from `src` into `dst` (same length): in one pass on the VAES
    /// paths, a copy and the cipher in place on the others.
    pub(crate) fn xts_from(
        &self,
        backend: Backend,
        ivs: &mut [[u8; 16]],
        src: &[u8],
        dst: &mut [u8],
        unit: usize,
        enc: bool,
    ) {
        debug_assert_eq!(dst.len(), ivs.len() * unit);
        match backend {
            // SAFETY: as in `xts`.
            Backend::Vaes512 => unsafe {
                vaes512::xts_from(&self.data, &self.tweak, ivs, src, dst, unit, enc)
            },
            // SAFETY: as in `xts`.
            Backend::Vaes256 => unsafe {
                vaes256::xts_from(&self.data, &self.tweak, ivs, src, dst, unit, enc)
            },
            _ => {
                dst.copy_from_slice(src);
                self.xts(backend, ivs, dst, unit, enc)
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl AesKeys {
    pub(crate) fn new(k: &[u8]) -> Option<LockedBox<Self>> {
        let blank = AesKeys {
            key: RoundKeys::blank(),
        };
        LockedBox::new_with(blank, |x| x.key.expand(k)).ok()
    }

    /// CBC over whole data units, one IV each.
    pub(crate) fn cbc(
        &self,
        backend: Backend,
        ivs: &[[u8; 16]],
        data: &mut [u8],
        unit: usize,
        enc: bool,
    ) {
        debug_assert_eq!(data.len(), ivs.len() * unit);
        match backend {
            // Decryption is parallel within a unit: both VAES paths take it on 256-bit
            // registers (the vaes512 path has no CBC code of its own). Encryption is one
            // chain per unit, interleaved across units on the AES-NI path.
            // SAFETY: SectorCipher only passes a backend whose CPU features it has checked,
            // and both VAES backends require AVX2, VAES and AES-NI.
            Backend::Vaes512 | Backend::Vaes256 if !enc => unsafe {
                vaes256::cbc_decrypt(&self.key, ivs, data, unit)
            },
            // SAFETY: RoundKeys exist only on CPUs with AES-NI (checked in RoundKeys::new).
            _ => unsafe { ni::cbc(&self.key, ivs, data, unit, enc) },
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl XtsKeys {
    pub(crate) fn new(_k1: &[u8], _k2: &[u8]) -> Option<LockedBox<Self>> {
        None
    }
    pub(crate) fn xts(&self, _: Backend, _: &mut [[u8; 16]], _: &mut [u8], _: usize, _: bool) {
        unreachable!("never constructed off x86_64")
    }
    pub(crate) fn xts_from(
        &self,
        _: Backend,
        _: &mut [[u8; 16]],
        _: &[u8],
        _: &mut [u8],
        _: usize,
        _: bool,
    ) {
        unreachable!("never constructed off x86_64")
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl AesKeys {
    pub(crate) fn new(_k: &[u8]) -> Option<LockedBox<Self>> {
        None
    }
    pub(crate) fn cbc(&self, _: Backend, _: &[[u8; 16]], _: &mut [u8], _: usize, _: bool) {
        unreachable!("never constructed off x86_64")
    }
}

#[cfg(target_arch = "x86_64")]
impl GcmKeys {
    /// `None` unless the CPU runs the vaes512 path (the only GCM code here) and the key
    /// is 16 or 32 bytes. Expanded in place on locked pages of their own.
    pub(crate) fn new(key: &[u8]) -> Option<LockedBox<Self>> {
        if !Backend::Vaes512.is_supported() {
            return None;
        }
        let blank = GcmKeys {
            aes: RoundKeys::blank(),
            powers: [[0; 16]; 32],
            wide: [[0; 16]; 32],
            folded: [[0; 16]; 32],
        };
        LockedBox::new_with(blank, |k| {
            k.aes.expand(key)?;
            // SAFETY: the vaes512 features were checked above.
            unsafe { gcm512::init(k) };
            Ok::<(), ()>(())
        })
        .ok()
    }

    /// E(K, block) in place.
    pub(crate) fn encrypt_block(&self, block: &mut [u8; 16]) {
        // SAFETY: GcmKeys exist only on CPUs with the vaes512 features (`new`).
        unsafe { gcm512::encrypt_block(&self.aes, block) }
    }

    /// Hashes `data`, zero-padded to whole blocks, into the GHASH state `y`.
    pub(crate) fn ghash(&self, y: &mut [u8; 16], data: &[u8]) {
        // SAFETY: as in `encrypt_block`.
        unsafe { gcm512::ghash(self, y, data) }
    }

    /// The hash after the length block, in the normal byte order.
    pub(crate) fn ghash_finish(&self, y: &[u8; 16], aad_bits: u64, text_bits: u64) -> [u8; 16] {
        // SAFETY: as in `encrypt_block`.
        unsafe { gcm512::ghash_finish(self, y, aad_bits, text_bits) }
    }

    /// A whole message in place (`aad` at most 256 bytes): encrypts or decrypts `buf` and
    /// returns the tag (to store, or to compare with).
    pub(crate) fn message(
        &self,
        enc: bool,
        nonce: &[u8; 12],
        aad: &[u8],
        buf: &mut [u8],
    ) -> [u8; 16] {
        assert!(
            aad.len() <= 256,
            "GCM: more than 256 bytes of additional data in one call"
        );
        let (at, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is readable and writable for `len` bytes, `aad` short enough; the
        // CPU has the vaes512 features (`new`).
        unsafe {
            use gcm512::message;
            by_rounds_and_direction!(self.aes, enc, message(self, nonce, aad, at, len))
        }
    }

    /// Messages of `buf.len() / nonces.len()` bytes each (a multiple of 512) in place, one
    /// after another, message `i` under `nonces[i]` with `aads[i]` (at most 256 bytes);
    /// their tags into `tags`.
    pub(crate) fn sectors(
        &self,
        enc: bool,
        nonces: &[[u8; 12]],
        aads: &[&[u8]],
        buf: &mut [u8],
        tags: &mut [[u8; 16]],
    ) {
        let n = nonces.len();
        assert!(
            n > 0 && aads.len() == n && tags.len() == n,
            "GCM: one nonce, AAD and tag a message"
        );
        assert!(
            aads.iter().all(|a| a.len() <= 256),
            "GCM: more than 256 bytes of additional data"
        );
        let len = buf.len() / n;
        assert!(
            len > 0 && len.is_multiple_of(512) && len * n == buf.len(),
            "GCM: messages of whole 512-byte pieces"
        );
        let at = buf.as_mut_ptr();
        // SAFETY: `buf` is readable and writable for n * len bytes, the slices as long as
        // the function requires; the CPU has the vaes512 features (`new`).
        unsafe {
            use gcm512::sectors;
            by_rounds_and_direction!(self.aes, enc, sectors(self, nonces, aads, at, len, tags))
        }
    }

    /// Counter mode from `src` to `dst` (same length, or `src` = None: in place), hashing
    /// the ciphertext: the output when encrypting, the input when decrypting.
    pub(crate) fn crypt(
        &self,
        enc: bool,
        ctr: &mut [u8; 16],
        y: &mut [u8; 16],
        src: Option<&[u8]>,
        dst: &mut [u8],
    ) {
        let len = dst.len();
        if let Some(s) = src {
            assert_eq!(s.len(), len, "GCM input and output differ in length");
        }
        // In place, both pointers come from the one exclusive borrow (a shared reborrow
        // taken first would be invalidated by the exclusive one).
        let to = dst.as_mut_ptr();
        let from = src.map_or(to.cast_const(), <[u8]>::as_ptr);
        // SAFETY: `from` is readable and `to` writable for `len` bytes: the same exclusive
        // buffer (in place), or two that a shared and an exclusive borrow keep apart; the
        // CPU has the vaes512 features (`new`).
        unsafe {
            use gcm512::crypt;
            by_rounds_and_direction!(self.aes, enc, crypt(self, ctr, y, from, to, len))
        }
    }
}

// The SHA-256 lanes off x86_64: never available, so never called.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const SHA256_MESSAGES: usize = 32;
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const SHA256_MAX_PREFIX: usize = 52;
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const SHA256_IV: [u32; 8] = [0; 8];
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn has_sha256_lanes() -> bool {
    false
}
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn sha256_lanes(
    _: &[u32; 8],
    _: u64,
    _: Option<&[u32; 8]>,
    _: &[&[u8]],
    _: &[&[u8]],
    _: &mut [[u8; 32]],
) {
    unreachable!("never available off x86_64")
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) struct GcmKeys;

#[cfg(not(target_arch = "x86_64"))]
impl GcmKeys {
    pub(crate) fn new(_key: &[u8]) -> Option<LockedBox<Self>> {
        None
    }
    pub(crate) fn encrypt_block(&self, _: &mut [u8; 16]) {
        unreachable!("never constructed off x86_64")
    }
    pub(crate) fn ghash(&self, _: &mut [u8; 16], _: &[u8]) {
        unreachable!("never constructed off x86_64")
    }
    pub(crate) fn ghash_finish(&self, _: &[u8; 16], _: u64, _: u64) -> [u8; 16] {
        unreachable!("never constructed off x86_64")
    }
    pub(crate) fn crypt(
        &self,
        _: bool,
        _: &mut [u8; 16],
        _: &mut [u8; 16],
        _: Option<&[u8]>,
        _: &mut [u8],
    ) {
        unreachable!("never constructed off x86_64")
    }
    pub(crate) fn message(&self, _: bool, _: &[u8; 12], _: &[u8], _: &mut [u8]) -> [u8; 16] {
        unreachable!("never constructed off x86_64")
    }
    pub(crate) fn sectors(
        &self,
        _: bool,
        _: &[[u8; 12]],
        _: &[&[u8]],
        _: &mut [u8],
        _: &mut [[u8; 16]],
    ) {
        unreachable!("never constructed off x86_64")
    }
}
