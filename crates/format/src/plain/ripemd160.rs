//! RIPEMD-160 (Dobbertin, Bosselaers, Preneel 1996), written from the published algorithm
//! description. Only cryptsetup's plain-mode default passphrase hash needs it.

const H0: [u32; 5] = [
    0x6745_2301,
    0xEFCD_AB89,
    0x98BA_DCFE,
    0x1032_5476,
    0xC3D2_E1F0,
];

const K_LEFT: [u32; 5] = [
    0x0000_0000,
    0x5A82_7999,
    0x6ED9_EBA1,
    0x8F1B_BCDC,
    0xA953_FD4E,
];
const K_RIGHT: [u32; 5] = [
    0x50A2_8BE6,
    0x5C4D_D124,
    0x6D70_3EF3,
    0x7A6D_76E9,
    0x0000_0000,
];

// Message word used in each of the 80 steps.
const R_LEFT: [usize; 80] = [
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, //
    7, 4, 13, 1, 10, 6, 15, 3, 12, 0, 9, 5, 2, 14, 11, 8, //
    3, 10, 14, 4, 9, 15, 8, 1, 2, 7, 0, 6, 13, 11, 5, 12, //
    1, 9, 11, 10, 0, 8, 12, 4, 13, 3, 7, 15, 14, 5, 6, 2, //
    4, 0, 5, 9, 7, 12, 2, 10, 14, 1, 3, 8, 11, 6, 15, 13,
];
const R_RIGHT: [usize; 80] = [
    5, 14, 7, 0, 9, 2, 11, 4, 13, 6, 15, 8, 1, 10, 3, 12, //
    6, 11, 3, 7, 0, 13, 5, 10, 14, 15, 8, 12, 4, 9, 1, 2, //
    15, 5, 1, 3, 7, 14, 6, 9, 11, 8, 12, 2, 10, 0, 4, 13, //
    8, 6, 4, 1, 3, 11, 15, 0, 5, 12, 2, 13, 9, 7, 10, 14, //
    12, 15, 10, 4, 1, 5, 8, 7, 6, 2, 13, 14, 0, 3, 9, 11,
];
// Left-rotation amounts.
const S_LEFT: [u32; 80] = [
    11, 14, 15, 12, 5, 8, 7, 9, 11, 13, 14, 15, 6, 7, 9, 8, //
    7, 6, 8, 13, 11, 9, 7, 15, 7, 12, 15, 9, 11, 7, 13, 12, //
    11, 13, 6, 7, 14, 9, 13, 15, 14, 8, 13, 6, 5, 12, 7, 5, //
    11, 12, 14, 15, 14, 15, 9, 8, 9, 14, 5, 6, 8, 6, 5, 12, //
    9, 15, 5, 11, 6, 8, 13, 12, 5, 12, 13, 14, 11, 8, 5, 6,
];
const S_RIGHT: [u32; 80] = [
    8, 9, 9, 11, 13, 15, 15, 5, 7, 7, 8, 11, 14, 14, 12, 6, //
    9, 13, 15, 7, 12, 8, 9, 11, 7, 7, 12, 7, 6, 15, 13, 11, //
    9, 7, 15, 11, 8, 6, 6, 14, 12, 13, 5, 14, 13, 13, 7, 5, //
    15, 5, 8, 11, 14, 14, 6, 14, 6, 9, 12, 9, 12, 5, 15, 8, //
    8, 5, 12, 9, 12, 5, 14, 6, 8, 13, 6, 5, 15, 13, 11, 11,
];

/// The five boolean functions, by round (0..5).
fn f(round: usize, x: u32, y: u32, z: u32) -> u32 {
    match round {
        0 => x ^ y ^ z,
        1 => (x & y) | (!x & z),
        2 => (x | !y) ^ z,
        3 => (x & z) | (y & !z),
        _ => x ^ (y | !z),
    }
}

fn compress(h: &mut [u32; 5], block: &[u8]) {
    let mut x = [0u32; 16];
    for (w, c) in x.iter_mut().zip(block.chunks_exact(4)) {
        *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    let [mut al, mut bl, mut cl, mut dl, mut el] = *h;
    let [mut ar, mut br, mut cr, mut dr, mut er] = *h;
    for j in 0..80 {
        let round = j / 16;
        let t = al
            .wrapping_add(f(round, bl, cl, dl))
            .wrapping_add(x[R_LEFT[j]])
            .wrapping_add(K_LEFT[round])
            .rotate_left(S_LEFT[j])
            .wrapping_add(el);
        (al, el, dl, cl, bl) = (el, dl, cl.rotate_left(10), bl, t);
        let t = ar
            .wrapping_add(f(4 - round, br, cr, dr))
            .wrapping_add(x[R_RIGHT[j]])
            .wrapping_add(K_RIGHT[round])
            .rotate_left(S_RIGHT[j])
            .wrapping_add(er);
        (ar, er, dr, cr, br) = (er, dr, cr.rotate_left(10), br, t);
    }
    let t = h[1].wrapping_add(cl).wrapping_add(dr);
    h[1] = h[2].wrapping_add(dl).wrapping_add(er);
    h[2] = h[3].wrapping_add(el).wrapping_add(ar);
    h[3] = h[4].wrapping_add(al).wrapping_add(br);
    h[4] = h[0].wrapping_add(bl).wrapping_add(cr);
    h[0] = t;
}

/// RIPEMD-160 of the concatenation of `parts`.
pub(crate) fn ripemd160(parts: &[&[u8]]) -> [u8; 20] {
    let mut h = H0;
    let mut block = [0u8; 64];
    let mut fill = 0usize;
    let mut total: u64 = 0;
    for part in parts {
        total = total.wrapping_add(part.len() as u64);
        let mut data = *part;
        while !data.is_empty() {
            let n = (64 - fill).min(data.len());
            block[fill..fill + n].copy_from_slice(&data[..n]);
            fill += n;
            data = &data[n..];
            if fill == 64 {
                compress(&mut h, &block);
                fill = 0;
            }
        }
    }
    // MD4-style padding: 0x80, zeros, bit length little-endian.
    block[fill] = 0x80;
    block[fill + 1..].fill(0);
    if fill >= 56 {
        compress(&mut h, &block);
        block.fill(0);
    }
    block[56..].copy_from_slice(&total.wrapping_mul(8).to_le_bytes());
    compress(&mut h, &block);
    block.fill(0);
    let mut out = [0u8; 20];
    for (o, w) in out.chunks_exact_mut(4).zip(h) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::ripemd160;

    fn hex(d: [u8; 20]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn reference_vectors() {
        // From the RIPEMD-160 paper's test suite; also checked with Python's hashlib.
        let cases: [(&[u8], &str); 6] = [
            (b"", "9c1185a5c5e9fc54612808977ee8f548b2258d31"),
            (b"a", "0bdc9d2d256b3ee9daae347be6f4dc835a467ffe"),
            (b"abc", "8eb208f7e05d987a9b044a8e98c6b087f15a0bfc"),
            (
                b"message digest",
                "5d0689ef49d2fae572b881b123a85ffa21595f36",
            ),
            (
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
                "12a053384a9c0c88e405a06c27dcf49ada62eb2b",
            ),
            (
                b"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "9b752e45573d4b39f4dbd3323cab82bf63326bfb",
            ),
        ];
        for (msg, want) in cases {
            assert_eq!(
                hex(ripemd160(&[msg])),
                want,
                "{:?}",
                String::from_utf8_lossy(msg)
            );
        }
        let million = vec![b'a'; 1_000_000];
        assert_eq!(
            hex(ripemd160(&[&million])),
            "52783243c1697bdbe16d37f97f68f08325dc1528"
        );
        // Split input gives the same digest as one piece.
        assert_eq!(
            ripemd160(&[b"mess", b"age dig", b"est"]),
            ripemd160(&[b"message digest"])
        );
    }
}
