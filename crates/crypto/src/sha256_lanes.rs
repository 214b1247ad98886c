//! SHA-256 and HMAC-SHA256 of a request's sectors up to 32 at a time (AVX-512: one
//! message a 32-bit lane, two sets of sixteen lanes, `backend::x86::sha256x16`), for the
//! HMAC modes of LUKS2 with integrity and dm-integrity's own sha256 checksums. The SHA
//! instructions hash one message after another at ~2 GB/s a core; the lanes several times
//! that (docs/benchmarks.md).
//!
//! Where the CPU lacks AVX-512F/BW, or a backend other than vaes512 is forced with
//! `CRYPTBLK_CRYPTO_BACKEND` (the tests of the portable paths), [`HmacSha256Lanes::new`]
//! and [`sha256_lanes_available`] say so and callers hash sector by sector.

use crate::backend::x86::{SHA256_IV, SHA256_MAX_PREFIX, SHA256_MESSAGES, sha256_lanes};
use crate::secret::LockedBox;
use zeroize::Zeroize;

/// Messages a call hashes at most.
pub(crate) const MESSAGES: usize = SHA256_MESSAGES;

/// The fewest messages worth a pass of the lanes (which costs as much as sixteen): below
/// it the SHA instructions one message at a time are faster (on AMD Zen 5 they break even
/// at five 4 KiB sectors, four 512-byte ones).
pub(crate) const WORTH_FROM: usize = 6;

/// Whether the lanes run here: the CPU has AVX-512F and BW, and no backend other than
/// vaes512 is forced.
pub(crate) fn sha256_lanes_available() -> bool {
    let forced_other = std::env::var(crate::BACKEND_ENV)
        .is_ok_and(|b| !b.is_empty() && b != crate::Backend::Vaes512.name());
    crate::backend::x86::has_sha256_lanes() && !forced_other
}

/// Whether messages of `prefix` and `body` bytes have the shape the lanes take.
pub(crate) fn fits(prefix: usize, body: usize) -> bool {
    prefix.is_multiple_of(4) && prefix <= SHA256_MAX_PREFIX && body >= 64 && body.is_multiple_of(64)
}

/// SHA-256 of up to [`MESSAGES`] messages `prefixes[i] || bodies[i]`, each of one shape
/// ([`fits`]). Panics where [`sha256_lanes_available`] is false or the shapes differ.
pub(crate) fn sha256_digests(prefixes: &[&[u8]], bodies: &[&[u8]], out: &mut [[u8; 32]]) {
    sha256_lanes(&SHA256_IV, 0, None, prefixes, bodies, out);
}

/// What the lanes compute for dm-integrity's own checksum: SHA-256, or HMAC-SHA256.
#[derive(Debug)]
pub(crate) enum Sha256Lanes {
    Plain,
    Keyed(HmacSha256Lanes),
}

impl Sha256Lanes {
    /// `Plain` or `Keyed` by `key`, or `None` where the lanes do not run.
    pub(crate) fn new(key: Option<&[u8]>) -> Option<Sha256Lanes> {
        match key {
            None => sha256_lanes_available().then_some(Sha256Lanes::Plain),
            Some(k) => HmacSha256Lanes::new(k).map(Sha256Lanes::Keyed),
        }
    }

    /// The digests (or MACs) of up to [`MESSAGES`] messages; see [`sha256_digests`].
    pub(crate) fn digests(&self, prefixes: &[&[u8]], bodies: &[&[u8]], out: &mut [[u8; 32]]) {
        match self {
            Sha256Lanes::Plain => sha256_digests(prefixes, bodies, out),
            Sha256Lanes::Keyed(k) => k.tags(prefixes, bodies, out),
        }
    }

    /// The digests (or MACs) of the blocks of `group` (up to [`MESSAGES`] of `bs` bytes),
    /// each after its prefix in `prefixes` (one length).
    pub(crate) fn blocks(
        &self,
        prefixes: &[&[u8]],
        group: &[u8],
        bs: usize,
    ) -> [[u8; 32]; MESSAGES] {
        let k = group.len() / bs;
        let bodies: [&[u8]; MESSAGES] =
            std::array::from_fn(|i| group.get(i * bs..(i + 1) * bs).unwrap_or_default());
        let mut out = [[0u8; 32]; MESSAGES];
        self.digests(&prefixes[..k], &bodies[..k], &mut out[..k]);
        out
    }
}

/// The states of HMAC-SHA256's two key blocks (key XOR ipad, key XOR opad) after one
/// compression each: all a keyed hash needs of the key.
struct Pads {
    inner: [u32; 8],
    outer: [u32; 8],
}

impl Drop for Pads {
    fn drop(&mut self) {
        self.inner.zeroize();
        self.outer.zeroize();
    }
}

/// An HMAC-SHA256 key for the lanes: its two key-block states on locked pages, wiped on
/// drop.
pub(crate) struct HmacSha256Lanes {
    pads: LockedBox<Pads>,
}

impl std::fmt::Debug for HmacSha256Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HmacSha256Lanes(..)")
    }
}

impl HmacSha256Lanes {
    /// The key `key` (any length, as HMAC takes it), or `None` where the lanes do not run
    /// ([`sha256_lanes_available`]).
    pub(crate) fn new(key: &[u8]) -> Option<HmacSha256Lanes> {
        if !sha256_lanes_available() {
            return None;
        }
        let blank = Pads {
            inner: [0; 8],
            outer: [0; 8],
        };
        let pads = LockedBox::new_with(blank, |p| {
            // The key blocks and the states' copies stay in frames the scrub wipes.
            crate::secret::scrubbed(|| pads_of(key, p));
            Ok::<(), ()>(())
        })
        .ok()?;
        Some(HmacSha256Lanes { pads })
    }

    /// HMAC-SHA256 of up to [`MESSAGES`] messages `prefixes[i] || bodies[i]`, each of one
    /// shape ([`fits`]), into `out[i]`. Panics if the shapes differ.
    pub(crate) fn tags(&self, prefixes: &[&[u8]], bodies: &[&[u8]], out: &mut [[u8; 32]]) {
        let p = &*self.pads;
        sha256_lanes(&p.inner, 64, Some(&p.outer), prefixes, bodies, out);
    }
}

/// Fills `p` with the key blocks' states for `key` (a key longer than a block is hashed
/// first, as HMAC says).
fn pads_of(key: &[u8], p: &mut Pads) {
    use sha2::Digest;
    let mut block = [0u8; 64];
    if key.len() > 64 {
        let mut d = sha2::Sha256::digest(key);
        block[..32].copy_from_slice(&d);
        d.as_mut_slice().zeroize();
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    for (state, pad) in [(&mut p.inner, 0x36u8), (&mut p.outer, 0x5c)] {
        let mut b = block.map(|x| x ^ pad);
        *state = SHA256_IV;
        sha2::block_api::compress256(state, std::slice::from_ref(&b));
        b.zeroize();
    }
    block.zeroize();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HashAlg;

    /// Every lane count of one and of two sets, prefixes of 0-52 bytes, bodies of one to
    /// 65 blocks, against the RustCrypto digests message by message.
    #[test]
    fn lanes_match_one_message_at_a_time() {
        if !sha256_lanes_available() {
            eprintln!(
                "SKIPPED (loudly): this CPU lacks AVX-512F/BW; the SHA-256 lanes are not run"
            );
            return;
        }
        use sha2::Digest;
        let mut seed = 1u64;
        let mut byte = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u8
        };
        for (n, p, blocks) in [
            (1, 0, 1),
            (16, 24, 64),
            (5, 24, 8),
            (16, 8, 1),
            (3, 52, 2),
            (9, 4, 65),
            (16, 0, 3),
            // Two register sets: full, one lane into the second, and in between.
            (32, 24, 64),
            (17, 8, 2),
            (21, 0, 1),
            (32, 52, 3),
        ] {
            let pre: Vec<Vec<u8>> = (0..n).map(|_| (0..p).map(|_| byte()).collect()).collect();
            let body: Vec<Vec<u8>> = (0..n)
                .map(|_| (0..64 * blocks).map(|_| byte()).collect())
                .collect();
            let pre_refs: Vec<&[u8]> = pre.iter().map(|x| &x[..]).collect();
            let body_refs: Vec<&[u8]> = body.iter().map(|x| &x[..]).collect();
            let mut got = vec![[0u8; 32]; n];
            sha256_digests(&pre_refs, &body_refs, &mut got);
            let key: Vec<u8> = (0..[32, 64, 100][n % 3]).map(|_| byte()).collect();
            let mut macs = vec![[0u8; 32]; n];
            HmacSha256Lanes::new(&key)
                .unwrap()
                .tags(&pre_refs, &body_refs, &mut macs);
            for i in 0..n {
                let mut d = sha2::Sha256::new();
                d.update(&pre[i]);
                d.update(&body[i]);
                assert_eq!(
                    got[i][..],
                    d.finalize()[..],
                    "digest: {n} lanes, prefix {p}, {blocks} blocks, lane {i}"
                );
                let mut want = [0u8; 32];
                crate::aead_sector::hmac_into(
                    HashAlg::Sha256,
                    &key,
                    &[&pre[i], &body[i]],
                    &mut want,
                );
                assert_eq!(macs[i], want, "HMAC: {n} lanes, prefix {p}, lane {i}");
            }
        }
    }

    #[test]
    fn a_body_of_another_length_is_refused() {
        if !sha256_lanes_available() {
            eprintln!(
                "SKIPPED (loudly): this CPU lacks AVX-512F/BW; the SHA-256 lanes are not run"
            );
            return;
        }
        let (a, b) = ([0u8; 128], [0u8; 64]);
        let r = std::panic::catch_unwind(|| {
            let mut out = [[0u8; 32]; 2];
            sha256_digests(&[&[], &[]], &[&a, &b], &mut out);
        });
        assert!(r.is_err(), "bodies of two lengths were hashed");
    }
}
