//! TLS record protection for the transmission phase: TLS 1.3 (RFC 8446 §5.2-5.3), and
//! TLS 1.2's AEAD suites (AES-GCM, RFC 5288; ChaCha20-Poly1305, RFC 7905) for clients
//! that offer nothing newer (the kernel's nbd-client). rustls runs
//! the handshake, then hands over each direction's traffic secret (its kernel-TLS
//! interface, `rustls::kernel`); from then on the reading side opens records in place in
//! its own buffer and the writing side seals them straight into the bytes it sends, each
//! with its own key and sequence number, so neither waits for the other and the payload is
//! copied once per side.

use std::io;
use std::ops::Range;

use ring::aead;
use rustls::ConnectionTrafficSecrets;

/// Largest plaintext one record carries (2^14).
pub(super) const MAX_PLAINTEXT: usize = 1 << 14;
/// Largest record body a peer may send: 2^14 + 256 (RFC 8446 §5.2).
pub(super) const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// Content type, legacy version and length.
pub(super) const HEADER_LEN: usize = 5;
/// Every AEAD the TLS 1.3 suites use has a 16-byte tag.
const TAG_LEN: usize = 16;
/// Bytes a sealed record adds to its content, at most: header, TLS 1.2's explicit nonce
/// (or TLS 1.3's inner content type), tag.
pub(super) const OVERHEAD: usize = HEADER_LEN + EXPLICIT_NONCE_LEN + TAG_LEN;
/// TLS 1.2 AES-GCM sends the last 8 bytes of each record's nonce in the record.
const EXPLICIT_NONCE_LEN: usize = 8;

/// Record content types (RFC 8446 §5.1).
pub(super) const ALERT: u8 = 21;
/// Only ever during a handshake: refused after it.
const CHANGE_CIPHER_SPEC: u8 = 20;
pub(super) const HANDSHAKE: u8 = 22;
pub(super) const APPLICATION_DATA: u8 = 23;

/// How records are framed and their nonces and additional data made.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Framing {
    /// Outer type application_data, the real one inside; nonce = IV ^ sequence number;
    /// additional data = the record header.
    Tls13,
    /// TLS 1.2 AES-GCM: 4-byte salt + 8-byte explicit nonce sent first in the record;
    /// additional data = sequence number, type, version, plaintext length.
    Tls12Gcm,
    /// TLS 1.2 ChaCha20-Poly1305: nonce = IV ^ sequence number, no explicit part; the same
    /// additional data as GCM.
    Tls12Chacha,
}

/// One direction's AEAD key, its static IV and the next record's sequence number.
pub(super) struct RecordKey {
    key: aead::LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
    framing: Framing,
}

/// TLS 1.2's additional data: sequence number, content type, version, plaintext length.
fn tls12_aad(seq: u64, typ: u8, len: usize) -> aead::Aad<[u8; 13]> {
    let mut a = [0u8; 13];
    a[..8].copy_from_slice(&seq.to_be_bytes());
    a[8] = typ;
    a[9..11].copy_from_slice(&[3, 3]);
    a[11..].copy_from_slice(&(len as u16).to_be_bytes());
    aead::Aad::from(a)
}

fn broken(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

impl RecordKey {
    /// The key for `secrets` (as rustls hands them over), starting at sequence number `seq`,
    /// for a TLS 1.3 session or (`tls12`) a TLS 1.2 one.
    pub(super) fn new(
        seq: u64,
        secrets: ConnectionTrafficSecrets,
        tls12: bool,
    ) -> io::Result<RecordKey> {
        let framing = match (&secrets, tls12) {
            (_, false) => Framing::Tls13,
            (ConnectionTrafficSecrets::Chacha20Poly1305 { .. }, true) => Framing::Tls12Chacha,
            (_, true) => Framing::Tls12Gcm,
        };
        let (alg, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(io::Error::other("TLS: cipher suite without a record layer")),
        };
        let key = aead::UnboundKey::new(alg, key.as_ref())
            .map_err(|_| io::Error::other("TLS: traffic key of the wrong length"))?;
        let iv: [u8; aead::NONCE_LEN] = iv
            .as_ref()
            .try_into()
            .map_err(|_| io::Error::other("TLS: traffic IV of the wrong length"))?;
        Ok(RecordKey {
            key: aead::LessSafeKey::new(key),
            iv,
            seq,
            framing,
        })
    }

    /// Whether this is a TLS 1.2 session (no key updates: a key lasts the connection).
    pub(super) fn is_tls12(&self) -> bool {
        self.framing != Framing::Tls13
    }

    /// Whether a protected record may carry this outer content type: TLS 1.3 hides the
    /// real one inside; TLS 1.2 shows it (never change_cipher_spec after the handshake).
    pub(super) fn takes_outer_type(&self, typ: u8) -> bool {
        match self.framing {
            Framing::Tls13 => typ == APPLICATION_DATA,
            _ => typ != CHANGE_CIPHER_SPEC && (ALERT..=APPLICATION_DATA).contains(&typ),
        }
    }

    /// Records protected with this key so far (the sequence number).
    pub(super) fn seq(&self) -> u64 {
        self.seq
    }

    /// The per-record nonce: the IV XORed with the sequence number (RFC 8446 §5.3); the
    /// sequence number then moves on, so a nonce is never used twice with one key.
    fn next_nonce(&mut self) -> io::Result<aead::Nonce> {
        let seq = self.seq;
        self.seq = seq
            .checked_add(1)
            .ok_or_else(|| broken("record sequence number exhausted"))?;
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        Ok(aead::Nonce::assume_unique_for_key(nonce))
    }

    /// Appends one record of content type `typ` carrying `parts` one after the other (at
    /// most [`MAX_PLAINTEXT`] bytes together) to `out`.
    pub(super) fn seal(&mut self, typ: u8, parts: &[&[u8]], out: &mut Vec<u8>) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        debug_assert!(len <= MAX_PLAINTEXT);
        let seq = self.seq;
        let nonce = self.next_nonce()?;
        let start = out.len();
        out.reserve(len + OVERHEAD);
        let (outer, explicit, inner) = match self.framing {
            // The outer type of every protected record is application_data, version 1.2.
            Framing::Tls13 => (APPLICATION_DATA, 0, 1),
            Framing::Tls12Gcm => (typ, EXPLICIT_NONCE_LEN, 0),
            Framing::Tls12Chacha => (typ, 0, 0),
        };
        let body = explicit + len + inner + TAG_LEN;
        let header = [outer, 3, 3, (body >> 8) as u8, body as u8];
        out.extend_from_slice(&header);
        out.extend_from_slice(&nonce.as_ref()[aead::NONCE_LEN - explicit..]);
        for p in parts {
            out.extend_from_slice(p);
        }
        if inner == 1 {
            out.push(typ);
        }
        let sealed_at = start + HEADER_LEN + explicit;
        let sealed = match self.framing {
            Framing::Tls13 => self.key.seal_in_place_separate_tag(
                nonce,
                aead::Aad::from(header),
                &mut out[sealed_at..],
            ),
            _ => self.key.seal_in_place_separate_tag(
                nonce,
                tls12_aad(seq, typ, len),
                &mut out[sealed_at..],
            ),
        };
        match sealed {
            Ok(tag) => {
                out.extend_from_slice(tag.as_ref());
                Ok(())
            }
            Err(_) => {
                // Never leave the plaintext in what goes to the socket.
                out.truncate(start);
                Err(io::Error::other("TLS: sealing a record failed"))
            }
        }
    }

    /// Opens a record in place: `header` is its first five bytes, `body` the rest. Returns
    /// the content type and where in `body` the content now lies.
    pub(super) fn open(
        &mut self,
        header: [u8; HEADER_LEN],
        body: &mut [u8],
    ) -> io::Result<(u8, Range<usize>)> {
        let seq = self.seq;
        let nonce = self.next_nonce()?;
        let bad_mac = || broken("bad record MAC (a record that does not decrypt)");
        match self.framing {
            Framing::Tls13 => {
                let plain = self
                    .key
                    .open_in_place(nonce, aead::Aad::from(header), body)
                    .map_err(|_| bad_mac())?;
                // The content is followed by its type and then zero padding.
                match plain.iter().rposition(|&b| b != 0) {
                    Some(at) => Ok((plain[at], 0..at)),
                    None => Err(broken("record without a content type")),
                }
            }
            Framing::Tls12Gcm => {
                if body.len() < EXPLICIT_NONCE_LEN + TAG_LEN {
                    return Err(bad_mac());
                }
                let mut n = [0u8; aead::NONCE_LEN];
                n[..4].copy_from_slice(&self.iv[..4]);
                n[4..].copy_from_slice(&body[..EXPLICIT_NONCE_LEN]);
                let len = body.len() - EXPLICIT_NONCE_LEN - TAG_LEN;
                self.key
                    .open_in_place(
                        aead::Nonce::assume_unique_for_key(n),
                        tls12_aad(seq, header[0], len),
                        &mut body[EXPLICIT_NONCE_LEN..],
                    )
                    .map_err(|_| bad_mac())?;
                Ok((header[0], EXPLICIT_NONCE_LEN..EXPLICIT_NONCE_LEN + len))
            }
            Framing::Tls12Chacha => {
                let len = body.len().checked_sub(TAG_LEN).ok_or_else(bad_mac)?;
                self.key
                    .open_in_place(nonce, tls12_aad(seq, header[0], len), body)
                    .map_err(|_| bad_mac())?;
                Ok((header[0], 0..len))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    /// A TLS 1.3 record's overhead: header, inner type, tag.
    const TLS13_OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;

    fn key(secret: u8, chacha: bool, tls12: bool) -> RecordKey {
        let key = AeadKey::from([secret; 32]);
        let iv = Iv::from([secret ^ 0x5a; 12]);
        let secrets = if chacha {
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv }
        } else {
            ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        };
        RecordKey::new(7, secrets, tls12).unwrap()
    }

    fn pair(secret: u8) -> (RecordKey, RecordKey) {
        (key(secret, false, false), key(secret, false, false))
    }

    fn split(rec: &mut [u8]) -> ([u8; HEADER_LEN], &mut [u8]) {
        let (h, b) = rec.split_at_mut(HEADER_LEN);
        (h.try_into().unwrap(), b)
    }

    #[test]
    fn records_open_where_they_were_sealed_and_nowhere_else() {
        let (mut tx, mut rx) = pair(1);
        let mut wire = Vec::new();
        tx.seal(APPLICATION_DATA, &[b"hello ", b"world"], &mut wire)
            .unwrap();
        tx.seal(ALERT, &[&[1, 0]], &mut wire).unwrap();
        assert_eq!(wire.len(), 11 + 2 + 2 * TLS13_OVERHEAD);
        assert_eq!(&wire[..3], &[APPLICATION_DATA, 3, 3]);
        assert_eq!(u16::from_be_bytes([wire[3], wire[4]]) as usize, 11 + 17);
        let (first, second) = wire.split_at_mut(11 + TLS13_OVERHEAD);
        let (h, b) = split(first);
        assert_eq!(rx.open(h, b).unwrap(), (APPLICATION_DATA, 0..11));
        assert_eq!(&b[..11], b"hello world");
        let (h, b) = split(second);
        assert_eq!(rx.open(h, b).unwrap(), (ALERT, 0..2));
        assert_eq!(rx.seq(), 9);

        // Out of order (the wrong sequence number), tampered with, or under another key:
        // each fails to open.
        let mut wire = Vec::new();
        tx.seal(APPLICATION_DATA, &[b"a"], &mut wire).unwrap();
        tx.seal(APPLICATION_DATA, &[b"b"], &mut wire).unwrap();
        let (_, second) = wire.split_at_mut(1 + TLS13_OVERHEAD);
        let (h, b) = split(second);
        assert!(rx.open(h, b).is_err());
        let (mut tx, mut rx) = pair(2);
        let mut wire = Vec::new();
        tx.seal(APPLICATION_DATA, &[b"abc"], &mut wire).unwrap();
        let mut bad = wire.clone();
        bad[HEADER_LEN] ^= 1;
        let (h, b) = split(&mut bad);
        assert!(rx.open(h, b).is_err());
        let (_, mut other) = pair(3);
        let (h, b) = split(&mut wire);
        assert!(other.open(h, b).is_err());
    }

    #[test]
    fn padding_is_stripped_and_a_record_without_a_type_is_refused() {
        let (mut tx, mut rx) = pair(4);
        // Content "x", type 23, three bytes of padding: sealed by hand as "x\x17\0\0\0".
        let mut wire = Vec::new();
        tx.seal(0, &[b"x\x17\0\0"], &mut wire).unwrap();
        let (h, b) = split(&mut wire);
        assert_eq!(rx.open(h, b).unwrap(), (APPLICATION_DATA, 0..1));
        let mut wire = Vec::new();
        tx.seal(0, &[b"\0\0"], &mut wire).unwrap();
        let (h, b) = split(&mut wire);
        assert!(rx.open(h, b).is_err());
    }

    #[test]
    fn tls12_records_show_their_type_and_gcm_sends_its_explicit_nonce() {
        for chacha in [false, true] {
            let (mut tx, mut rx) = (key(5, chacha, true), key(5, chacha, true));
            assert!(tx.is_tls12() && rx.takes_outer_type(ALERT));
            assert!(!rx.takes_outer_type(CHANGE_CIPHER_SPEC));
            let mut wire = Vec::new();
            tx.seal(ALERT, &[&[2, 20]], &mut wire).unwrap();
            // GCM: the explicit nonce is the nonce's last 8 bytes, IV ^ sequence number 7.
            let explicit = if chacha { 0 } else { 8 };
            assert_eq!(
                wire.len(),
                HEADER_LEN + explicit + 2 + TAG_LEN,
                "chacha {chacha}"
            );
            assert_eq!(wire[0], ALERT);
            if !chacha {
                let mut want = [5 ^ 0x5a; 8];
                want[7] ^= 7;
                assert_eq!(wire[HEADER_LEN..HEADER_LEN + 8], want);
            }
            let (h, b) = split(&mut wire);
            let (typ, at) = rx.open(h, b).unwrap();
            assert_eq!((typ, &b[at]), (ALERT, &[2u8, 20][..]));
            // The type is in the additional data: relabelled, the record fails to open.
            let mut wire = Vec::new();
            tx.seal(APPLICATION_DATA, &[b"data"], &mut wire).unwrap();
            wire[0] = HANDSHAKE;
            let (h, b) = split(&mut wire);
            assert!(rx.open(h, b).is_err(), "chacha {chacha}");
        }
    }
}
