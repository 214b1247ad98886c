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

/// Four AEGIS-128 messages at once, one per 128-bit lane of the ZMM registers (VAES on
/// AVX-512): sectors are independent, so four states step together where one state's
/// steps must wait on each other. Message `i` is `aad[i]` then `data[i * len..][..len]`
/// (`len` a multiple of 16, `data` 4 × `len` bytes, in place) under `nonces[i]`; returns
/// the four tags (on decryption, the ones to compare).
///
/// # Safety
/// The CPU must have AVX-512F and VAES.
#[target_feature(enable = "avx512f,vaes,aes,sse2")]
pub(crate) unsafe fn aegis128_x4(
    key: &[u8; 16],
    nonces: &[[u8; 16]; 4],
    aad: &[&[u8]; 4],
    data: &mut [u8],
    len: usize,
    encrypt: bool,
) -> [[u8; 16]; 4] {
    debug_assert!(len.is_multiple_of(16) && data.len() == 4 * len);
    debug_assert!(aad.iter().all(|a| a.len() == aad[0].len()));
    // SAFETY: every load and store below is of 16 bytes inside `data` (offsets below
    // `len` in each of its four parts), inside a 16-byte array, or of 64 bytes of a 64-byte
    // array; the intrinsics need only the features this function is compiled for.
    unsafe {
        let lanes = |b: [&[u8; 16]; 4]| {
            let v = _mm512_castsi128_si512(_mm_loadu_si128(b[0].as_ptr().cast()));
            let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(b[1].as_ptr().cast()));
            let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(b[2].as_ptr().cast()));
            _mm512_inserti32x4::<3>(v, _mm_loadu_si128(b[3].as_ptr().cast()))
        };
        let all = |b: &[u8; 16]| _mm512_broadcast_i32x4(_mm_loadu_si128(b.as_ptr().cast()));
        let k = all(key);
        let kn = _mm512_xor_si512(k, lanes([&nonces[0], &nonces[1], &nonces[2], &nonces[3]]));
        let c0 = all(&super::super::super::aegis128::C0);
        let c1 = all(&super::super::super::aegis128::C1);
        let mut s = [kn, c1, c0, _mm512_xor_si512(k, c0), _mm512_xor_si512(k, c1)];
        let update = |s: &mut [__m512i; 5], m: __m512i| {
            let t = s[4];
            s[4] = _mm512_aesenc_epi128(s[3], s[4]);
            s[3] = _mm512_aesenc_epi128(s[2], s[3]);
            s[2] = _mm512_aesenc_epi128(s[1], s[2]);
            s[1] = _mm512_aesenc_epi128(s[0], s[1]);
            s[0] = _mm512_xor_si512(_mm512_aesenc_epi128(t, s[0]), m);
        };
        for _ in 0..5 {
            update(&mut s, k);
            update(&mut s, kn);
        }
        let alen = aad[0].len();
        for at in (0..alen).step_by(16) {
            let n = (alen - at).min(16);
            let mut b = [[0u8; 16]; 4];
            for (l, a) in b.iter_mut().zip(aad) {
                l[..n].copy_from_slice(&a[at..at + n]);
            }
            update(&mut s, lanes([&b[0], &b[1], &b[2], &b[3]]));
        }
        let p = data.as_mut_ptr();
        for at in (0..len).step_by(16) {
            let ks = _mm512_xor_si512(_mm512_xor_si512(s[1], s[4]), _mm512_and_si512(s[2], s[3]));
            let at = |i: usize| p.add(i * len + at);
            let x = _mm512_castsi128_si512(_mm_loadu_si128(at(0).cast()));
            let x = _mm512_inserti32x4::<1>(x, _mm_loadu_si128(at(1).cast()));
            let x = _mm512_inserti32x4::<2>(x, _mm_loadu_si128(at(2).cast()));
            let x = _mm512_inserti32x4::<3>(x, _mm_loadu_si128(at(3).cast()));
            let out = _mm512_xor_si512(x, ks);
            update(&mut s, if encrypt { x } else { out });
            _mm_storeu_si128(at(0).cast(), _mm512_castsi512_si128(out));
            _mm_storeu_si128(at(1).cast(), _mm512_extracti32x4_epi32::<1>(out));
            _mm_storeu_si128(at(2).cast(), _mm512_extracti32x4_epi32::<2>(out));
            _mm_storeu_si128(at(3).cast(), _mm512_extracti32x4_epi32::<3>(out));
        }
        let mut lens = [0u8; 16];
        lens[..8].copy_from_slice(&(alen as u64 * 8).to_le_bytes());
        lens[8..].copy_from_slice(&(len as u64 * 8).to_le_bytes());
        let t = _mm512_xor_si512(all(&lens), s[3]);
        for _ in 0..7 {
            update(&mut s, t);
        }
        let tag = _mm512_xor_si512(
            _mm512_xor_si512(_mm512_xor_si512(s[0], s[1]), _mm512_xor_si512(s[2], s[3])),
            s[4],
        );
        let mut out = [0u8; 64];
        _mm512_storeu_si512(out.as_mut_ptr().cast(), tag);
        std::array::from_fn(|i| out[i * 16..][..16].try_into().expect("16 bytes"))
    }
}
