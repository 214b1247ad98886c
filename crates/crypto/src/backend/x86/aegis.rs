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

/// The 4x4 transpose of 128-bit lanes: register `i` lane `j` goes to register `j` lane `i`
/// (four blocks of four sectors in, each sector's block `j` side by side out; its own
/// inverse).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose(r: [__m512i; 4]) -> [__m512i; 4] {
    let t0 = _mm512_shuffle_i64x2::<0x44>(r[0], r[1]);
    let t1 = _mm512_shuffle_i64x2::<0xee>(r[0], r[1]);
    let t2 = _mm512_shuffle_i64x2::<0x44>(r[2], r[3]);
    let t3 = _mm512_shuffle_i64x2::<0xee>(r[2], r[3]);
    [
        _mm512_shuffle_i64x2::<0x88>(t0, t2),
        _mm512_shuffle_i64x2::<0xdd>(t0, t2),
        _mm512_shuffle_i64x2::<0x88>(t1, t3),
        _mm512_shuffle_i64x2::<0xdd>(t1, t3),
    ]
}

/// `4 G` AEGIS-128 messages at once, one per 128-bit lane of `G` sets of ZMM state
/// registers (VAES on AVX-512): sectors are independent, so their states step together
/// where one state's steps must wait on each other, and with two sets (eight sectors) a
/// step's AES rounds are twice as many as the latency of the one before them leaves room
/// for. The text moves 64 bytes of each sector at a time, transposed into place (four
/// loads and eight shuffles per four blocks, where one 16-byte load and insert per block
/// and sector cost more). Message `i` is `aad[i]` then `data[i * len..][..len]` (`len` a
/// multiple of 64, `data` 4 G × `len` bytes, in place) under `nonces[i]`, encrypted or
/// decrypted (`ENCRYPT`); returns the tags (on decryption, the ones to compare).
///
/// # Safety
/// The CPU must have AVX-512F and VAES; `N` = 4 `G`.
#[target_feature(enable = "avx512f,vaes,aes,sse2")]
pub(crate) unsafe fn aegis128_lanes<const G: usize, const N: usize, const ENCRYPT: bool>(
    key: &[u8; 16],
    nonces: &[[u8; 16]; N],
    aad: &[&[u8]; N],
    data: &mut [u8],
    len: usize,
) -> [[u8; 16]; N] {
    debug_assert!(N == 4 * G);
    debug_assert!(len.is_multiple_of(64) && data.len() == N * len);
    debug_assert!(aad.iter().all(|a| a.len() == aad[0].len()));
    // SAFETY: every load and store below is of 64 bytes inside `data` (offsets below `len`
    // in each of its N parts, `len` a multiple of 64), or of 16 bytes inside a 16-byte
    // array; the intrinsics need only the features this function is compiled for.
    unsafe {
        let load = |b: &[u8; 16]| _mm_loadu_si128(b.as_ptr().cast());
        let lanes = |b: [&[u8; 16]; 4]| {
            let v = _mm512_castsi128_si512(load(b[0]));
            let v = _mm512_inserti32x4::<1>(v, load(b[1]));
            let v = _mm512_inserti32x4::<2>(v, load(b[2]));
            _mm512_inserti32x4::<3>(v, load(b[3]))
        };
        let all = |b: &[u8; 16]| _mm512_broadcast_i32x4(load(b));
        let k = all(key);
        let c0 = all(&super::super::super::aegis128::C0);
        let c1 = all(&super::super::super::aegis128::C1);
        let kn: [__m512i; G] = std::array::from_fn(|g| {
            let n = &nonces[4 * g..];
            _mm512_xor_si512(k, lanes([&n[0], &n[1], &n[2], &n[3]]))
        });
        let mut s: [[__m512i; 5]; G] = std::array::from_fn(|g| {
            [
                kn[g],
                c1,
                c0,
                _mm512_xor_si512(k, c0),
                _mm512_xor_si512(k, c1),
            ]
        });
        let update = |s: &mut [__m512i; 5], m: __m512i| {
            let t = s[4];
            s[4] = _mm512_aesenc_epi128(s[3], s[4]);
            s[3] = _mm512_aesenc_epi128(s[2], s[3]);
            s[2] = _mm512_aesenc_epi128(s[1], s[2]);
            s[1] = _mm512_aesenc_epi128(s[0], s[1]);
            s[0] = _mm512_xor_si512(_mm512_aesenc_epi128(t, s[0]), m);
        };
        for _ in 0..5 {
            for g in 0..G {
                update(&mut s[g], k);
            }
            for g in 0..G {
                update(&mut s[g], kn[g]);
            }
        }
        let alen = aad[0].len();
        for at in (0..alen).step_by(16) {
            let n = (alen - at).min(16);
            for g in 0..G {
                let mut b = [[0u8; 16]; 4];
                for (l, a) in b.iter_mut().zip(&aad[4 * g..]) {
                    l[..n].copy_from_slice(&a[at..at + n]);
                }
                update(&mut s[g], lanes([&b[0], &b[1], &b[2], &b[3]]));
            }
        }
        let p = data.as_mut_ptr();
        for at in (0..len).step_by(64) {
            let row = |i: usize| p.add(i * len + at);
            let blocks: [[__m512i; 4]; G] = std::array::from_fn(|g| {
                transpose(std::array::from_fn(|i| {
                    _mm512_loadu_si512(row(4 * g + i).cast())
                }))
            });
            let mut out = [[_mm512_setzero_si512(); 4]; G];
            for j in 0..4 {
                for g in 0..G {
                    let st = &mut s[g];
                    let ks = _mm512_xor_si512(
                        _mm512_xor_si512(st[1], st[4]),
                        _mm512_and_si512(st[2], st[3]),
                    );
                    let x = blocks[g][j];
                    let o = _mm512_xor_si512(x, ks);
                    update(st, if ENCRYPT { x } else { o });
                    out[g][j] = o;
                }
            }
            for (g, o) in out.into_iter().enumerate() {
                for (i, r) in transpose(o).into_iter().enumerate() {
                    _mm512_storeu_si512(row(4 * g + i).cast(), r);
                }
            }
        }
        let mut lens = [0u8; 16];
        lens[..8].copy_from_slice(&(alen as u64 * 8).to_le_bytes());
        lens[8..].copy_from_slice(&(len as u64 * 8).to_le_bytes());
        let mut tags = [[0u8; 16]; N];
        for g in 0..G {
            let st = &mut s[g];
            let t = _mm512_xor_si512(all(&lens), st[3]);
            for _ in 0..7 {
                update(st, t);
            }
            let tag = _mm512_xor_si512(
                _mm512_xor_si512(
                    _mm512_xor_si512(st[0], st[1]),
                    _mm512_xor_si512(st[2], st[3]),
                ),
                st[4],
            );
            let mut out = [0u8; 64];
            _mm512_storeu_si512(out.as_mut_ptr().cast(), tag);
            for (i, t) in tags[4 * g..4 * g + 4].iter_mut().enumerate() {
                t.copy_from_slice(&out[i * 16..][..16]);
            }
        }
        tags
    }
}
