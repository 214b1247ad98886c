//! AEGIS-128 (Wu and Preneel; the CAESAR portfolio's, which the kernel calls `aegis128`):
//! LUKS2 `aegis128-random` with integrity. A 16-byte key, a 16-byte nonce, a 16-byte tag;
//! the state is five AES blocks, each step one AES round per block (`aes::hazmat`'s, on
//! AES-NI where the CPU has it).

use aes::hazmat::cipher_round;
use zeroize::Zeroize;

/// The Fibonacci sequence mod 256, in two blocks (the algorithm's constants).
pub(crate) const C0: [u8; 16] = [
    0x00, 0x01, 0x01, 0x02, 0x03, 0x05, 0x08, 0x0d, 0x15, 0x22, 0x37, 0x59, 0x90, 0xe9, 0x79, 0x62,
];
pub(crate) const C1: [u8; 16] = [
    0xdb, 0x3d, 0x18, 0x55, 0x6d, 0xc2, 0x2f, 0xf1, 0x20, 0x11, 0x31, 0x42, 0x73, 0xb5, 0x28, 0xdd,
];

type B = [u8; 16];

fn xor(a: &B, b: &B) -> B {
    std::array::from_fn(|i| a[i] ^ b[i])
}

fn and(a: &B, b: &B) -> B {
    std::array::from_fn(|i| a[i] & b[i])
}

/// One AES round of `block` with `key` as the round key (x86's AESENC).
fn aes_round(block: &B, key: &B) -> B {
    let mut b = aes::Block::from(*block);
    cipher_round(&mut b, &aes::Block::from(*key));
    b.into()
}

struct State([B; 5]);

impl Drop for State {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl State {
    /// The state update with message block `m`.
    fn update(&mut self, m: &B) {
        let s = &self.0;
        let next = [
            xor(&aes_round(&s[4], &s[0]), m),
            aes_round(&s[0], &s[1]),
            aes_round(&s[1], &s[2]),
            aes_round(&s[2], &s[3]),
            aes_round(&s[3], &s[4]),
        ];
        self.0 = next;
    }

    fn keystream(&self) -> B {
        let s = &self.0;
        xor(&xor(&s[1], &s[4]), &and(&s[2], &s[3]))
    }

    fn new(key: &B, nonce: &B) -> State {
        let key_nonce = xor(key, nonce);
        let mut st = State([key_nonce, C1, C0, xor(key, &C0), xor(key, &C1)]);
        for _ in 0..5 {
            st.update(key);
            st.update(&key_nonce);
        }
        st
    }

    fn absorb(&mut self, aad: &[u8]) {
        for chunk in aad.chunks(16) {
            let mut b = [0u8; 16];
            b[..chunk.len()].copy_from_slice(chunk);
            self.update(&b);
        }
    }

    fn tag(mut self, aad_len: usize, msg_len: usize) -> B {
        let mut lens = [0u8; 16];
        lens[..8].copy_from_slice(&(aad_len as u64 * 8).to_le_bytes());
        lens[8..].copy_from_slice(&(msg_len as u64 * 8).to_le_bytes());
        let t = xor(&lens, &self.0[3]);
        for _ in 0..7 {
            self.update(&t);
        }
        let s = &self.0;
        xor(&xor(&xor(&s[0], &s[1]), &xor(&s[2], &s[3])), &s[4])
    }
}

/// An AEGIS-128 key (wiped on drop).
pub(crate) struct Aegis128 {
    key: B,
}

impl Drop for Aegis128 {
    fn drop(&mut self) {
        self.key.zeroize();
    }
}

impl Aegis128 {
    /// `key`: 16 bytes.
    pub(crate) fn new(key: &[u8]) -> Option<Aegis128> {
        Some(Aegis128 {
            key: key.try_into().ok()?,
        })
    }

    /// The AES-NI path, unless the portable backend is forced (`None`: not taken).
    fn fast(&self, nonce: &B, aad: &[u8], data: &mut [u8], encrypt: bool) -> Option<B> {
        if matches!(crate::Backend::current(), Ok(crate::Backend::Generic)) {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        return crate::backend::x86::aegis128_ni(&self.key, nonce, aad, data, encrypt);
        #[cfg(not(target_arch = "x86_64"))]
        None
    }

    /// Encrypts `data` in place; the tag.
    pub(crate) fn seal(&self, nonce: &B, aad: &[u8], data: &mut [u8]) -> B {
        match self.fast(nonce, aad, data, true) {
            Some(tag) => tag,
            None => self.seal_portable(nonce, aad, data),
        }
    }

    /// Encrypts (or decrypts) the `ss`-byte sectors of `data` in place, sector `i` under
    /// `nonces[i]` with associated data `aads[i]`; writes each sector's tag into `tags`
    /// (decrypting: the one its stored tag must equal). Eight, then four, at a time on
    /// VAES-512.
    pub(crate) fn crypt_sectors(
        &self,
        nonces: &[B],
        aads: &[&[u8]],
        data: &mut [u8],
        ss: usize,
        encrypt: bool,
        tags: &mut [B],
    ) {
        let mut i = 0;
        #[cfg(target_arch = "x86_64")]
        if !matches!(crate::Backend::current(), Ok(crate::Backend::Generic)) {
            // Eight side by side, then four.
            macro_rules! lanes {
                ($n:literal) => {
                    while i + $n <= nonces.len() {
                        let n: &[B; $n] = nonces[i..i + $n].try_into().expect("a group");
                        let a: &[&[u8]; $n] = aads[i..i + $n].try_into().expect("a group");
                        let part = &mut data[i * ss..(i + $n) * ss];
                        match crate::backend::x86::aegis128_lanes(&self.key, n, a, part, encrypt) {
                            Some(t) => tags[i..i + $n].copy_from_slice(&t),
                            None => break,
                        }
                        i += $n;
                    }
                };
            }
            lanes!(8);
            lanes!(4);
        }
        for j in i..nonces.len() {
            let d = &mut data[j * ss..][..ss];
            tags[j] = if encrypt {
                self.seal(&nonces[j], aads[j], d)
            } else {
                match self.fast(&nonces[j], aads[j], d, false) {
                    Some(t) => t,
                    None => {
                        let mut st = State::new(&self.key, &nonces[j]);
                        st.absorb(aads[j]);
                        for chunk in d.chunks_mut(16) {
                            let ks = st.keystream();
                            let mut p = [0u8; 16];
                            for (k, c) in chunk.iter().enumerate() {
                                p[k] = c ^ ks[k];
                            }
                            st.update(&p);
                            chunk.copy_from_slice(&p[..chunk.len()]);
                        }
                        st.tag(aads[j].len(), ss)
                    }
                }
            };
        }
    }

    fn seal_portable(&self, nonce: &B, aad: &[u8], data: &mut [u8]) -> B {
        let mut st = State::new(&self.key, nonce);
        st.absorb(aad);
        for chunk in data.chunks_mut(16) {
            let mut p = [0u8; 16];
            p[..chunk.len()].copy_from_slice(chunk);
            let c = xor(&p, &st.keystream());
            st.update(&p);
            chunk.copy_from_slice(&c[..chunk.len()]);
        }
        st.tag(aad.len(), data.len())
    }

    /// Decrypts `data` in place; whether `tag` verified (if not, `data` is garbage the
    /// caller must not use).
    pub(crate) fn open(&self, nonce: &B, aad: &[u8], data: &mut [u8], tag: &[u8]) -> bool {
        if let Some(want) = self.fast(nonce, aad, data, false) {
            return crate::constant_time_eq(&want[..tag.len()], tag);
        }
        self.open_portable(nonce, aad, data, tag)
    }

    fn open_portable(&self, nonce: &B, aad: &[u8], data: &mut [u8], tag: &[u8]) -> bool {
        let mut st = State::new(&self.key, nonce);
        st.absorb(aad);
        for chunk in data.chunks_mut(16) {
            let ks = st.keystream();
            let mut p = [0u8; 16];
            for (i, c) in chunk.iter().enumerate() {
                p[i] = c ^ ks[i];
            }
            // A partial last block enters the state zero-padded.
            st.update(&p);
            chunk.copy_from_slice(&p[..chunk.len()]);
        }
        let want = st.tag(aad.len(), data.len());
        crate::constant_time_eq(&want[..tag.len()], tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AES-NI path gives the portable code's ciphertext and tag, every length.
    #[test]
    fn the_fast_path_matches_the_portable_code() {
        let k = Aegis128::new(&[0x3cu8; 16]).unwrap();
        if k.fast(&[0; 16], &[], &mut [], true).is_none() {
            eprintln!("NOT TESTED: no AES-NI here (or the generic backend is forced)");
            return;
        }
        for len in [0usize, 1, 15, 16, 17, 100, 512, 4096] {
            let pt: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
            let aad: Vec<u8> = (0..len % 40).map(|i| i as u8).collect();
            let (mut a, mut b) = (pt.clone(), pt.clone());
            let ta = k.seal(&[5u8; 16], &aad, &mut a);
            let tb = k.seal_portable(&[5u8; 16], &aad, &mut b);
            assert_eq!((&a, ta), (&b, tb), "length {len}");
            assert!(k.open_portable(&[5u8; 16], &aad, &mut b, &ta));
            assert!(k.open(&[5u8; 16], &aad, &mut a, &tb));
            assert_eq!(a, pt);
        }
    }

    /// Sectors side by side (four at a time on VAES-512, the rest one by one) give what
    /// the portable code gives each sector alone, both ways.
    #[test]
    fn sectors_side_by_side_match_one_at_a_time() {
        let k = Aegis128::new(&[0x5au8; 16]).unwrap();
        for ss in [512usize, 4096] {
            // Eight side by side, then four, then one alone.
            let n = 13;
            let nonces: Vec<B> = (0..n).map(|i| [i as u8 * 3 + 1; 16]).collect();
            let aads: Vec<[u8; 24]> = (0..n).map(|i| [i as u8; 24]).collect();
            let aad_refs: Vec<&[u8]> = aads.iter().map(|a| &a[..]).collect();
            let pt: Vec<u8> = (0..n * ss).map(|i| (i * 7 + i / 512) as u8).collect();
            let mut many = pt.clone();
            let mut tags = vec![[0u8; 16]; n];
            k.crypt_sectors(&nonces, &aad_refs, &mut many, ss, true, &mut tags);
            for i in 0..n {
                let mut one = pt[i * ss..][..ss].to_vec();
                let t = k.seal_portable(&nonces[i], &aads[i], &mut one);
                assert_eq!(many[i * ss..][..ss], one[..], "sector {i} of {ss}");
                assert_eq!(tags[i], t, "tag {i} of {ss}");
            }
            let mut back = vec![[0u8; 16]; n];
            k.crypt_sectors(&nonces, &aad_refs, &mut many, ss, false, &mut back);
            assert_eq!(back, tags);
            assert_eq!(many, pt);
        }
    }

    #[test]
    fn seal_then_open_and_any_change_fails() {
        let k = Aegis128::new(&[7u8; 16]).unwrap();
        let nonce = [9u8; 16];
        for len in [0usize, 5, 16, 33, 4096] {
            let pt: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut d = pt.clone();
            let tag = k.seal(&nonce, b"associated data!+8bytes", &mut d);
            if len > 0 {
                assert_ne!(d, pt);
            }
            let mut back = d.clone();
            assert!(k.open(&nonce, b"associated data!+8bytes", &mut back, &tag));
            assert_eq!(back, pt);
            let mut back = d.clone();
            assert!(!k.open(&nonce, b"associated data!+8bytez", &mut back, &tag));
            if len > 0 {
                let mut bad = d.clone();
                bad[len / 2] ^= 1;
                assert!(!k.open(&nonce, b"associated data!+8bytes", &mut bad, &tag));
            }
        }
    }
}
