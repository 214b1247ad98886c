//! AEGIS-128 on AES-NI: the five-block state in XMM registers, one AESENC per block and
//! step (the portable `crate::aegis128` is the reference it is tested against).

use core::arch::x86_64::*;

/// One AEGIS-128 message (`aad` then `data`, in place) under `key` and `nonce`; returns the
/// tag. `encrypt` false decrypts (the tag is then the one to compare).
///
/// # Safety
/// The CPU must have AES-NI and SSE2 (`is_x86_feature_detected!("aes")`).
#[target_feature(enable = "aes,sse2")]
pub(crate) unsafe fn aegis128(
    key: &[u8; 16],
    nonce: &[u8; 16],
    aad: &[u8],
    data: &mut [u8],
    encrypt: bool,
) -> [u8; 16] {
    // SAFETY: unaligned loads and stores of 16 bytes from arrays of 16 bytes; the
    // intrinsics need only the CPU features this function is compiled for.
    unsafe {
        let load = |b: &[u8; 16]| _mm_loadu_si128(b.as_ptr().cast());
        let c0 = load(&super::super::super::aegis128::C0);
        let c1 = load(&super::super::super::aegis128::C1);
        let k = load(key);
        let kn = _mm_xor_si128(k, load(nonce));
        let mut s = [kn, c1, c0, _mm_xor_si128(k, c0), _mm_xor_si128(k, c1)];
        let update = |s: &mut [__m128i; 5], m: __m128i| {
            let t = s[4];
            s[4] = _mm_aesenc_si128(s[3], s[4]);
            s[3] = _mm_aesenc_si128(s[2], s[3]);
            s[2] = _mm_aesenc_si128(s[1], s[2]);
            s[1] = _mm_aesenc_si128(s[0], s[1]);
            s[0] = _mm_xor_si128(_mm_aesenc_si128(t, s[0]), m);
        };
        for _ in 0..5 {
            update(&mut s, k);
            update(&mut s, kn);
        }
        for chunk in aad.chunks(16) {
            let mut b = [0u8; 16];
            b[..chunk.len()].copy_from_slice(chunk);
            update(&mut s, load(&b));
        }
        let mut full = data.chunks_exact_mut(16);
        for chunk in &mut full {
            let ks = _mm_xor_si128(_mm_xor_si128(s[1], s[4]), _mm_and_si128(s[2], s[3]));
            let x = _mm_loadu_si128(chunk.as_ptr().cast());
            let out = _mm_xor_si128(x, ks);
            update(&mut s, if encrypt { x } else { out });
            _mm_storeu_si128(chunk.as_mut_ptr().cast(), out);
        }
        let rest = full.into_remainder();
        if !rest.is_empty() {
            let ks = _mm_xor_si128(_mm_xor_si128(s[1], s[4]), _mm_and_si128(s[2], s[3]));
            let mut b = [0u8; 16];
            b[..rest.len()].copy_from_slice(rest);
            let mut o = [0u8; 16];
            _mm_storeu_si128(o.as_mut_ptr().cast(), _mm_xor_si128(load(&b), ks));
            rest.copy_from_slice(&o[..rest.len()]);
            // The plaintext enters the state zero-padded.
            let p = if encrypt { b } else { o };
            let mut pad = [0u8; 16];
            pad[..rest.len()].copy_from_slice(&p[..rest.len()]);
            update(&mut s, load(&pad));
        }
        let mut lens = [0u8; 16];
        lens[..8].copy_from_slice(&(aad.len() as u64 * 8).to_le_bytes());
        lens[8..].copy_from_slice(&(data.len() as u64 * 8).to_le_bytes());
        let t = _mm_xor_si128(load(&lens), s[3]);
        for _ in 0..7 {
            update(&mut s, t);
        }
        let tag = _mm_xor_si128(
            _mm_xor_si128(_mm_xor_si128(s[0], s[1]), _mm_xor_si128(s[2], s[3])),
            s[4],
        );
        let mut out = [0u8; 16];
        _mm_storeu_si128(out.as_mut_ptr().cast(), tag);
        out
    }
}
