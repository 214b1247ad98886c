//! AES-GCM (NIST SP 800-38D) with 96-bit nonces and 128-bit tags, for the NBD server's TLS
//! record layer: encryption and decryption out of place (from the caller's buffer straight
//! into the record, from the record straight into the caller's buffer) or in place, a
//! message given in pieces. Only the vaes512 path has it: [`AesGcm::new`] says where it is
//! unavailable, and callers keep another AEAD for those CPUs.

use crate::backend::x86::GcmKeys;
use crate::secret::{LockedBox, constant_time_eq, wipe_blocks};
use crate::{Backend, Error, Result};

/// Longest text one nonce may protect: 2^32 - 2 blocks (SP 800-38D §5.2.1.1).
const MAX_TEXT: u64 = ((1 << 32) - 2) * 16;

/// An AES-128 or AES-256 GCM key: the expanded key and the hash key powers, on locked
/// pages, wiped on drop.
pub struct AesGcm {
    keys: LockedBox<GcmKeys>,
}

impl std::fmt::Debug for AesGcm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AesGcm(..)")
    }
}

impl AesGcm {
    /// Whether this CPU has the GCM code, and no other backend is forced with
    /// `CRYPTBLK_CRYPTO_BACKEND`.
    pub fn is_available() -> bool {
        matches!(Backend::current(), Ok(Backend::Vaes512))
    }

    /// The key for `key` (16 or 32 bytes). Fails where [`AesGcm::is_available`] is false.
    pub fn new(key: &[u8]) -> Result<AesGcm> {
        if key.len() != 16 && key.len() != 32 {
            return Err(Error::InvalidKeyLength {
                cipher: "aes-gcm".into(),
                len: key.len(),
            });
        }
        if !AesGcm::is_available() {
            return Err(Error::BackendUnavailable(
                "AES-GCM has code for the vaes512 backend only".into(),
            ));
        }
        // Key expansion and the hash key's powers leave copies in the frames they use.
        let keys = crate::secret::scrubbed(|| GcmKeys::new(key));
        let keys =
            keys.ok_or_else(|| Error::BackendUnavailable("AES-GCM: vaes512 unavailable".into()))?;
        Ok(AesGcm { keys })
    }

    /// Encrypts `buf` in place under `nonce` with the additional data `aad` (at most 256
    /// bytes) in one call, and returns the tag: what [`AesGcm::begin`] and the pieces do,
    /// with the set-up folded in (a dm-crypt sector's way).
    pub fn seal_in_place(&self, nonce: &[u8; 12], aad: &[u8], buf: &mut [u8]) -> [u8; 16] {
        assert!(
            buf.len() as u64 <= MAX_TEXT,
            "GCM: message longer than one nonce may protect"
        );
        crate::secret::guard_stack();
        self.keys.message(true, nonce, aad, buf)
    }

    /// Decrypts `buf` in place and checks `tag` (in constant time); on a mismatch `buf` is
    /// zeroed (no unauthenticated plaintext is left) and the error says why.
    pub fn open_in_place(
        &self,
        nonce: &[u8; 12],
        aad: &[u8],
        buf: &mut [u8],
        tag: &[u8],
    ) -> Result<()> {
        assert!(
            buf.len() as u64 <= MAX_TEXT,
            "GCM: message longer than one nonce may protect"
        );
        crate::secret::guard_stack();
        let mut want = self.keys.message(false, nonce, aad, buf);
        let ok = tag.len() == 16 && constant_time_eq(&want, tag);
        wipe_blocks(std::slice::from_mut(&mut want));
        if ok {
            Ok(())
        } else {
            buf.fill(0);
            Err(Error::Gcm(
                "the authentication tag does not match (wrong key or damaged data)".into(),
            ))
        }
    }

    /// Encrypts `buf` in place as `nonces.len()` messages of equal length (a multiple of 512
    /// bytes: a request's sectors), message `i` under `nonces[i]` with the additional data
    /// `aads[i]` (at most 256 bytes), its tag into `tags[i]`: what [`AesGcm::seal_in_place`]
    /// does to each, as one stream (each message's last hash overlaps the next one's
    /// first AES rounds).
    pub fn seal_sectors(
        &self,
        nonces: &[[u8; 12]],
        aads: &[&[u8]],
        buf: &mut [u8],
        tags: &mut [[u8; 16]],
    ) {
        crate::secret::guard_stack();
        check_sectors(nonces.len(), aads.len(), tags.len(), buf.len());
        self.keys.sectors(true, nonces, aads, buf, tags);
    }

    /// Decrypts what [`AesGcm::seal_sectors`] sealed and checks each message's tag (in
    /// constant time); a message whose tag does not match is zeroed and its index pushed
    /// to `bad`.
    pub fn open_sectors(
        &self,
        nonces: &[[u8; 12]],
        aads: &[&[u8]],
        buf: &mut [u8],
        tags: &[[u8; 16]],
        bad: &mut Vec<usize>,
    ) {
        crate::secret::guard_stack();
        const AT_ONCE: usize = 16;
        let n = nonces.len();
        check_sectors(n, aads.len(), tags.len(), buf.len());
        let len = buf.len() / n;
        let mut want = [[0u8; 16]; AT_ONCE];
        for (c, part) in buf.chunks_mut(AT_ONCE * len).enumerate() {
            let first = c * AT_ONCE;
            let k = part.len() / len;
            let want = &mut want[..k];
            let range = first..first + k;
            self.keys.sectors(
                false,
                &nonces[range.clone()],
                &aads[range.clone()],
                part,
                want,
            );
            for (i, (w, t)) in want.iter().zip(&tags[range]).enumerate() {
                if !constant_time_eq(w, t) {
                    part[i * len..][..len].fill(0);
                    bad.push(first + i);
                }
            }
        }
        wipe_blocks(&mut want);
    }

    /// Starts a message under `nonce` with the additional data `aad`. The caller never
    /// uses a nonce twice with one key.
    pub fn begin(&self, nonce: &[u8; 12], aad: &[u8]) -> GcmMessage<'_> {
        // Round keys spill to this thread's stack: keep it out of swap, as every cipher
        // thread's.
        crate::secret::guard_stack();
        let mut j0 = [0u8; 16];
        j0[..12].copy_from_slice(nonce);
        j0[15] = 1;
        let mut ctr = j0;
        ctr[15] = 2;
        self.keys.encrypt_block(&mut j0);
        let mut y = [0u8; 16];
        self.keys.ghash(&mut y, aad);
        GcmMessage {
            keys: &self.keys,
            blocks: [y, ctr, j0],
            aad_len: aad.len() as u64,
            text_len: 0,
            ended_mid_block: false,
        }
    }
}

/// The shapes `seal_sectors` and `open_sectors` take: at least one message, a nonce, an
/// AAD and a tag each, all of one length (whole 512-byte pieces, at most what one nonce may
/// protect).
fn check_sectors(nonces: usize, aads: usize, tags: usize, bytes: usize) {
    assert!(
        nonces > 0 && aads == nonces && tags == nonces,
        "GCM: one nonce, AAD and tag a message"
    );
    let len = bytes / nonces;
    assert!(
        len > 0 && len.is_multiple_of(512) && len * nonces == bytes && len as u64 <= MAX_TEXT,
        "GCM: messages of one length, whole 512-byte pieces"
    );
}

/// One message being encrypted or decrypted, in pieces: every piece but the last a whole
/// number of 16-byte blocks. All pieces go one way (encrypt or decrypt).
pub struct GcmMessage<'a> {
    keys: &'a GcmKeys,
    /// The GHASH state, the next counter block, and E(K, J0) (what the tag is masked with).
    blocks: [[u8; 16]; 3],
    aad_len: u64,
    text_len: u64,
    ended_mid_block: bool,
}

impl Drop for GcmMessage<'_> {
    fn drop(&mut self) {
        wipe_blocks(&mut self.blocks);
    }
}

impl GcmMessage<'_> {
    fn piece(&mut self, enc: bool, src: Option<&[u8]>, dst: &mut [u8]) {
        assert!(
            !self.ended_mid_block,
            "GCM: a piece after one that ended inside a block"
        );
        let len = dst.len() as u64;
        self.text_len = self
            .text_len
            .checked_add(len)
            .filter(|&n| n <= MAX_TEXT)
            .expect("GCM: message longer than one nonce may protect");
        self.ended_mid_block = !len.is_multiple_of(16);
        let [y, ctr, _] = &mut self.blocks;
        self.keys.crypt(enc, ctr, y, src, dst);
    }

    /// Encrypts `src` into `dst` (same length).
    pub fn encrypt(&mut self, src: &[u8], dst: &mut [u8]) {
        self.piece(true, Some(src), dst);
    }

    /// Encrypts `buf` in place.
    pub fn encrypt_in_place(&mut self, buf: &mut [u8]) {
        self.piece(true, None, buf);
    }

    /// Decrypts `src` into `dst` (same length). Nothing decrypted may be used before
    /// [`GcmMessage::verify`] accepts the tag.
    pub fn decrypt(&mut self, src: &[u8], dst: &mut [u8]) {
        self.piece(false, Some(src), dst);
    }

    /// Decrypts `buf` in place (see [`GcmMessage::decrypt`]).
    pub fn decrypt_in_place(&mut self, buf: &mut [u8]) {
        self.piece(false, None, buf);
    }

    /// The tag of the message encrypted.
    pub fn tag(self) -> [u8; 16] {
        let mut s = self
            .keys
            .ghash_finish(&self.blocks[0], self.aad_len * 8, self.text_len * 8);
        let mut t = [0u8; 16];
        for ((t, s), e) in t.iter_mut().zip(s).zip(self.blocks[2]) {
            *t = s ^ e;
        }
        // The bare hash, with known text, tells of the hash key.
        wipe_blocks(std::slice::from_mut(&mut s));
        t
    }

    /// Checks the tag of the message decrypted (in constant time).
    pub fn verify(self, tag: &[u8]) -> Result<()> {
        let mut want = self.tag();
        let ok = tag.len() == 16 && constant_time_eq(&want, tag);
        wipe_blocks(std::slice::from_mut(&mut want));
        if ok {
            Ok(())
        } else {
            Err(Error::Gcm(
                "the authentication tag does not match (wrong key or damaged data)".into(),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ring::aead;

    /// ring's AES-GCM: ciphertext and tag.
    fn reference(key: &[u8], nonce: &[u8; 12], aad: &[u8], text: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let alg = if key.len() == 16 {
            &aead::AES_128_GCM
        } else {
            &aead::AES_256_GCM
        };
        let k = aead::LessSafeKey::new(aead::UnboundKey::new(alg, key).unwrap());
        let mut c = text.to_vec();
        let tag = k
            .seal_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key(*nonce),
                aead::Aad::from(aad),
                &mut c,
            )
            .unwrap();
        (c, tag.as_ref().to_vec())
    }

    /// Cuts `len` into pieces: whole blocks of the sizes `cuts` suggests, the rest last.
    fn pieces(len: usize, cuts: &[usize]) -> Vec<std::ops::Range<usize>> {
        let mut at = 0;
        let mut out = Vec::new();
        for &c in cuts {
            let n = (c * 16).min((len - at) / 16 * 16);
            if n == 0 {
                continue;
            }
            out.push(at..at + n);
            at += n;
        }
        out.push(at..len);
        out
    }

    fn check(
        key: &[u8],
        nonce: &[u8; 12],
        aad: &[u8],
        text: &[u8],
        cuts: &[usize],
        in_place: bool,
    ) {
        let gcm = AesGcm::new(key).unwrap();
        let (want_c, want_t) = reference(key, nonce, aad, text);
        let mut c = vec![0u8; text.len()];
        let mut m = gcm.begin(nonce, aad);
        for r in pieces(text.len(), cuts) {
            if in_place {
                c[r.clone()].copy_from_slice(&text[r.clone()]);
                m.encrypt_in_place(&mut c[r]);
            } else {
                m.encrypt(&text[r.clone()], &mut c[r]);
            }
        }
        assert_eq!(c, want_c, "ciphertext, {} bytes", text.len());
        assert_eq!(m.tag().to_vec(), want_t, "tag, {} bytes", text.len());
        let mut p = vec![0u8; text.len()];
        let mut m = gcm.begin(nonce, aad);
        for r in pieces(text.len(), cuts) {
            if in_place {
                p[r.clone()].copy_from_slice(&c[r.clone()]);
                m.decrypt_in_place(&mut p[r]);
            } else {
                m.decrypt(&c[r.clone()], &mut p[r]);
            }
        }
        assert_eq!(p, text);
        m.verify(&want_t).unwrap();
        let mut bad = want_t.clone();
        bad[15] ^= 1;
        let mut m = gcm.begin(nonce, aad);
        m.decrypt(&c, &mut p);
        assert!(m.verify(&bad).is_err());
        // The whole-message calls (a sector's way), on the first 256 bytes of AAD at most.
        let aad = &aad[..aad.len().min(256)];
        let (want_c, want_t) = reference(key, nonce, aad, text);
        let mut buf = text.to_vec();
        let tag = gcm.seal_in_place(nonce, aad, &mut buf);
        assert_eq!(
            buf,
            want_c,
            "seal_in_place ciphertext, {} bytes",
            text.len()
        );
        assert_eq!(
            tag.to_vec(),
            want_t,
            "seal_in_place tag, {} bytes",
            text.len()
        );
        gcm.open_in_place(nonce, aad, &mut buf, &want_t).unwrap();
        assert_eq!(buf, text, "open_in_place, {} bytes", text.len());
        buf.copy_from_slice(&want_c);
        assert!(gcm.open_in_place(nonce, aad, &mut buf, &bad).is_err());
        assert!(buf.iter().all(|&b| b == 0), "a failed open left plaintext");
        if !buf.is_empty() {
            buf.copy_from_slice(&want_c);
            buf[0] ^= 0x80;
            assert!(gcm.open_in_place(nonce, aad, &mut buf, &want_t).is_err());
        }
    }

    fn available() -> bool {
        if AesGcm::is_available() {
            return true;
        }
        eprintln!(
            "NOT TESTED: AES-GCM needs the vaes512 backend, which this CPU lacks (or \
             CRYPTBLK_CRYPTO_BACKEND forces another); the TLS record layer uses ring here"
        );
        false
    }

    #[test]
    fn matches_ring_at_every_length_up_to_a_tls_record() {
        if !available() {
            return;
        }
        let mut text = vec![0u8; (1 << 14) + 300];
        crate::random_bytes(&mut text).unwrap();
        for key_len in [16, 32] {
            let key: Vec<u8> = (0..key_len as u8)
                .map(|i| i.wrapping_mul(37) ^ 0xa5)
                .collect();
            // Up to 600 every length; then the main loop's 512-byte steps once, twice and
            // three times with each kind of rest (none, a step of 256, part of one).
            let steps = [1024, 1040, 1279, 1280, 1296, 1536, 1552, 1791, 1792, 1808];
            for len in (0..600)
                .chain(steps)
                .chain([4096, 4111, 16384, 16385, 16401, 16384 + 300])
            {
                let nonce = [len as u8; 12];
                let aad = &text[..len % 20];
                check(&key, &nonce, aad, &text[..len], &[], false);
            }
        }
    }

    #[test]
    fn sectors_as_one_stream_match_ring_message_by_message() {
        if !available() {
            return;
        }
        for key_len in [16, 32] {
            let key = vec![0x3cu8; key_len];
            let gcm = AesGcm::new(&key).unwrap();
            for (n, len) in [
                (1, 512),
                (3, 512),
                (21, 512),
                (2, 1024),
                (5, 4096),
                (18, 1536),
            ] {
                let text: Vec<u8> = (0..n * len).map(|i| (i * 13 + i / 700) as u8).collect();
                let nonces: Vec<[u8; 12]> = (0..n).map(|i| [i as u8 + 1; 12]).collect();
                // None, dm-crypt's 20 and 24 bytes, one block short, five blocks.
                let aads: Vec<Vec<u8>> = (0..n)
                    .map(|i| vec![i as u8; [20, 0, 24, 13, 70][i % 5]])
                    .collect();
                let aad_refs: Vec<&[u8]> = aads.iter().map(|a| &a[..]).collect();
                let mut buf = text.clone();
                let mut tags = vec![[0u8; 16]; n];
                gcm.seal_sectors(&nonces, &aad_refs, &mut buf, &mut tags);
                for i in 0..n {
                    let (c, t) = reference(&key, &nonces[i], &aads[i], &text[i * len..][..len]);
                    assert_eq!(buf[i * len..][..len], c[..], "{n} x {len}: message {i}");
                    assert_eq!(tags[i].to_vec(), t, "{n} x {len}: tag {i}");
                }
                let mut bad = Vec::new();
                let mut opened = buf.clone();
                gcm.open_sectors(&nonces, &aad_refs, &mut opened, &tags, &mut bad);
                assert!(bad.is_empty(), "{n} x {len}: {bad:?}");
                assert_eq!(opened, text);
                tags[n - 1][0] ^= 1;
                let mut want_bad = vec![n - 1];
                if n > 2 {
                    // A damaged ciphertext in the middle of the first group too.
                    buf[len + 5] ^= 0x20;
                    want_bad.insert(0, 1);
                }
                gcm.open_sectors(&nonces, &aad_refs, &mut buf, &tags, &mut bad);
                assert_eq!(bad, want_bad, "{n} x {len}");
                for i in 0..n {
                    let got = &buf[i * len..][..len];
                    if want_bad.contains(&i) {
                        assert!(got.iter().all(|&b| b == 0), "{n} x {len}: message {i}");
                    } else {
                        assert_eq!(got, &text[i * len..][..len], "{n} x {len}: message {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_refused_key_says_why() {
        assert!(matches!(
            AesGcm::new(&[0u8; 24]),
            Err(Error::InvalidKeyLength { len: 24, .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn pieces_in_place_or_not_match_ring(
            key in prop::sample::select(vec![16usize, 32]).prop_flat_map(|n| prop::collection::vec(any::<u8>(), n)),
            nonce in any::<[u8; 12]>(),
            aad in prop::collection::vec(any::<u8>(), 0..70),
            text in prop::collection::vec(any::<u8>(), 0..2000),
            cuts in prop::collection::vec(0usize..40, 0..6),
            in_place in any::<bool>(),
        ) {
            if available() {
                check(&key, &nonce, &aad, &text, &cuts, in_place);
            }
        }
    }
}
