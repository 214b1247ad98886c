//! TLS 1.3 record protection (RFC 8446 §5.2-5.3) for the transmission phase. rustls runs
//! the handshake, then hands over each direction's traffic secret (its kernel-TLS
//! interface, `rustls::kernel`); from then on the reading side opens records in place in
//! its own buffer and the writing side seals them straight into the bytes it sends, each
//! with its own key and sequence number, so neither waits for the other and the payload is
//! copied once per side.

use std::io;

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
/// Bytes a sealed record adds to its content: header, inner content type, tag.
pub(super) const OVERHEAD: usize = HEADER_LEN + 1 + TAG_LEN;

/// Record content types (RFC 8446 §5.1).
pub(super) const ALERT: u8 = 21;
pub(super) const HANDSHAKE: u8 = 22;
pub(super) const APPLICATION_DATA: u8 = 23;

/// One direction's AEAD key, its static IV and the next record's sequence number.
pub(super) struct RecordKey {
    key: aead::LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
}

fn broken(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

impl RecordKey {
    /// The key for `secrets` (as rustls hands them over), starting at sequence number `seq`.
    pub(super) fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> io::Result<RecordKey> {
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
        })
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
        let body = len + 1 + TAG_LEN;
        let nonce = self.next_nonce()?;
        let start = out.len();
        out.reserve(len + OVERHEAD);
        // The outer type of every protected record is application_data, version 1.2.
        let header = [APPLICATION_DATA, 3, 3, (body >> 8) as u8, body as u8];
        out.extend_from_slice(&header);
        for p in parts {
            out.extend_from_slice(p);
        }
        out.push(typ);
        let sealed = self.key.seal_in_place_separate_tag(
            nonce,
            aead::Aad::from(header),
            &mut out[start + HEADER_LEN..],
        );
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
    /// the inner content type and the length of the content, which now starts `body`.
    pub(super) fn open(
        &mut self,
        header: [u8; HEADER_LEN],
        body: &mut [u8],
    ) -> io::Result<(u8, usize)> {
        let nonce = self.next_nonce()?;
        let plain = self
            .key
            .open_in_place(nonce, aead::Aad::from(header), body)
            .map_err(|_| broken("bad record MAC (a record that does not decrypt)"))?;
        // The content is followed by its type and then zero padding.
        match plain.iter().rposition(|&b| b != 0) {
            Some(at) => Ok((plain[at], at)),
            None => Err(broken("record without a content type")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    fn pair(secret: u8) -> (RecordKey, RecordKey) {
        let mk = || {
            let key = AeadKey::from([secret; 32]);
            let iv = Iv::from([secret ^ 0x5a; 12]);
            RecordKey::new(7, ConnectionTrafficSecrets::Aes256Gcm { key, iv }).unwrap()
        };
        (mk(), mk())
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
        assert_eq!(wire.len(), 11 + 2 + 2 * OVERHEAD);
        assert_eq!(&wire[..3], &[APPLICATION_DATA, 3, 3]);
        assert_eq!(u16::from_be_bytes([wire[3], wire[4]]) as usize, 11 + 17);
        let (first, second) = wire.split_at_mut(11 + OVERHEAD);
        let (h, b) = split(first);
        assert_eq!(rx.open(h, b).unwrap(), (APPLICATION_DATA, 11));
        assert_eq!(&b[..11], b"hello world");
        let (h, b) = split(second);
        assert_eq!(rx.open(h, b).unwrap(), (ALERT, 2));
        assert_eq!(rx.seq(), 9);

        // Out of order (the wrong sequence number), tampered with, or under another key:
        // each fails to open.
        let mut wire = Vec::new();
        tx.seal(APPLICATION_DATA, &[b"a"], &mut wire).unwrap();
        tx.seal(APPLICATION_DATA, &[b"b"], &mut wire).unwrap();
        let (_, second) = wire.split_at_mut(1 + OVERHEAD);
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
        assert_eq!(rx.open(h, b).unwrap(), (APPLICATION_DATA, 1));
        let mut wire = Vec::new();
        tx.seal(0, &[b"\0\0"], &mut wire).unwrap();
        let (h, b) = split(&mut wire);
        assert!(rx.open(h, b).is_err());
    }
}
