//! TLS record protection for the transmission phase: TLS 1.3 (RFC 8446 §5.2-5.3), and
//! TLS 1.2's AEAD suites (AES-GCM, RFC 5288; ChaCha20-Poly1305, RFC 7905) for clients
//! that offer nothing newer (the kernel's nbd-client). rustls runs
//! the handshake, then hands over each direction's traffic secret (its kernel-TLS
//! interface, `rustls::kernel`); from then on each direction has its own key and sequence
//! number, so neither waits for the other. With AES-GCM on the vaes512 path the writing
//! side encrypts the caller's bytes straight into the records it sends and the reading
//! side decrypts records straight into the caller's buffer: the cipher is the only pass
//! over the payload besides the socket's own copy. ring's AEADs (other CPUs, ChaCha20)
//! work in place: one more copy per side.

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

/// The AEAD of one direction: AES-GCM on the vaes512 path where the CPU has it (sealed
/// from the caller's bytes straight into the record, opened from the record straight into
/// the caller's buffer), ring's otherwise (in place, after a copy).
enum Aead {
    Vector(cryptblk_crypto::AesGcm),
    Ring(Box<aead::LessSafeKey>),
}

/// One direction's AEAD key, its static IV and the next record's sequence number.
pub(super) struct RecordKey {
    key: Aead,
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
    framing: Framing,
}

/// Sealed records waiting for the socket: a buffer that stays allocated and initialized,
/// so records are sealed into it without clearing it first, filled up to `len`. It only
/// ever holds sealed records (the vector path encrypts into it; ring's seals in place what
/// was copied in, and a record that fails to seal is never counted as filled).
pub(super) struct Outbox {
    bytes: Vec<u8>,
    len: usize,
}

impl Outbox {
    pub(super) fn new() -> Outbox {
        Outbox {
            bytes: Vec::new(),
            len: 0,
        }
    }

    /// The sealed records.
    pub(super) fn filled(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Forgets the records (once written, or never to be).
    pub(super) fn clear(&mut self) {
        self.len = 0;
    }

    /// `n` writable bytes after the records (zeroed the first time the buffer grows).
    fn room(&mut self, n: usize) -> &mut [u8] {
        let end = self.len + n;
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        &mut self.bytes[self.len..end]
    }
}

/// TLS 1.2's additional data: sequence number, content type, version, plaintext length.
fn tls12_aad(seq: u64, typ: u8, len: usize) -> [u8; 13] {
    let mut a = [0u8; 13];
    a[..8].copy_from_slice(&seq.to_be_bytes());
    a[8] = typ;
    a[9..11].copy_from_slice(&[3, 3]);
    a[11..].copy_from_slice(&(len as u16).to_be_bytes());
    a
}

fn broken(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

fn bad_mac() -> io::Error {
    broken("bad record MAC (a record that does not decrypt)")
}

/// Encrypts the concatenation of `parts` into `dst` (as long as they are together) as one
/// GCM message: whole blocks straight from each part, the blocks a part boundary splits
/// through a 16-byte stage.
fn encrypt_gather<'p>(
    m: &mut cryptblk_crypto::GcmMessage<'_>,
    parts: impl IntoIterator<Item = &'p [u8]>,
    dst: &mut [u8],
) {
    let mut stage = [0u8; 16];
    let (mut staged, mut at) = (0, 0);
    for mut p in parts {
        if staged > 0 {
            let take = (16 - staged).min(p.len());
            stage[staged..staged + take].copy_from_slice(&p[..take]);
            staged += take;
            p = &p[take..];
            if staged < 16 {
                continue;
            }
            m.encrypt(&stage, &mut dst[at..at + 16]);
            at += 16;
        }
        let whole = p.len() / 16 * 16;
        m.encrypt(&p[..whole], &mut dst[at..at + whole]);
        at += whole;
        staged = p.len() - whole;
        stage[..staged].copy_from_slice(&p[whole..]);
    }
    m.encrypt(&stage[..staged], &mut dst[at..at + staged]);
    // The stage held plaintext.
    zeroize::Zeroize::zeroize(&mut stage);
}

impl RecordKey {
    /// The key for `secrets` (as rustls hands them over), starting at sequence number `seq`,
    /// for a TLS 1.3 session or (`tls12`) a TLS 1.2 one.
    pub(super) fn new(
        seq: u64,
        secrets: ConnectionTrafficSecrets,
        tls12: bool,
    ) -> io::Result<RecordKey> {
        let (alg, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(io::Error::other("TLS: cipher suite without a record layer")),
        };
        let vector = cryptblk_crypto::AesGcm::is_available();
        RecordKey::with_aead(seq, alg, key.as_ref(), iv.as_ref(), tls12, vector)
    }

    /// [`RecordKey::new`] from the algorithm, key and IV, with AES-GCM from the vector path
    /// (`vector`) or from ring.
    fn with_aead(
        seq: u64,
        alg: &'static aead::Algorithm,
        key: &[u8],
        iv: &[u8],
        tls12: bool,
        vector: bool,
    ) -> io::Result<RecordKey> {
        let chacha = alg == &aead::CHACHA20_POLY1305;
        let framing = match (tls12, chacha) {
            (false, _) => Framing::Tls13,
            (true, true) => Framing::Tls12Chacha,
            (true, false) => Framing::Tls12Gcm,
        };
        if key.len() != alg.key_len() {
            return Err(io::Error::other("TLS: traffic key of the wrong length"));
        }
        let key = if vector && !chacha {
            Aead::Vector(
                cryptblk_crypto::AesGcm::new(key)
                    .map_err(|e| io::Error::other(format!("TLS: traffic key: {e}")))?,
            )
        } else {
            Aead::Ring(Box::new(aead::LessSafeKey::new(
                aead::UnboundKey::new(alg, key)
                    .map_err(|_| io::Error::other("TLS: traffic key of the wrong length"))?,
            )))
        };
        let iv: [u8; aead::NONCE_LEN] = iv
            .try_into()
            .map_err(|_| io::Error::other("TLS: traffic IV of the wrong length"))?;
        Ok(RecordKey {
            key,
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
    fn next_nonce(&mut self) -> io::Result<[u8; aead::NONCE_LEN]> {
        let seq = self.seq;
        self.seq = seq
            .checked_add(1)
            .ok_or_else(|| broken("record sequence number exhausted"))?;
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        Ok(nonce)
    }

    /// Appends one record of content type `typ` carrying `parts` one after the other (at
    /// most [`MAX_PLAINTEXT`] bytes together) to `out`.
    pub(super) fn seal(&mut self, typ: u8, parts: &[&[u8]], out: &mut Outbox) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        debug_assert!(len <= MAX_PLAINTEXT);
        let seq = self.seq;
        let nonce = self.next_nonce()?;
        let (outer, explicit, inner) = match self.framing {
            // The outer type of every protected record is application_data, version 1.2.
            Framing::Tls13 => (APPLICATION_DATA, 0, 1),
            Framing::Tls12Gcm => (typ, EXPLICIT_NONCE_LEN, 0),
            Framing::Tls12Chacha => (typ, 0, 0),
        };
        let body = explicit + len + inner + TAG_LEN;
        let header = [outer, 3, 3, (body >> 8) as u8, body as u8];
        let aad = match self.framing {
            Framing::Tls13 => &header[..],
            _ => &tls12_aad(seq, typ, len)[..],
        };
        let record = out.room(HEADER_LEN + body);
        record[..HEADER_LEN].copy_from_slice(&header);
        record[HEADER_LEN..HEADER_LEN + explicit]
            .copy_from_slice(&nonce[aead::NONCE_LEN - explicit..]);
        let text = &mut record[HEADER_LEN + explicit..HEADER_LEN + body];
        let (text, tag) = text.split_at_mut(len + inner);
        let typ_part = [typ];
        let inner_part: &[u8] = if inner == 1 { &typ_part } else { &[] };
        match &self.key {
            Aead::Vector(gcm) => {
                let mut m = gcm.begin(&nonce, aad);
                encrypt_gather(&mut m, parts.iter().copied().chain([inner_part]), text);
                tag.copy_from_slice(&m.tag());
            }
            Aead::Ring(key) => {
                let mut at = 0;
                for p in parts.iter().chain([&inner_part]) {
                    text[at..at + p.len()].copy_from_slice(p);
                    at += p.len();
                }
                match key.seal_in_place_separate_tag(
                    aead::Nonce::assume_unique_for_key(nonce),
                    aead::Aad::from(aad),
                    text,
                ) {
                    Ok(t) => tag.copy_from_slice(t.as_ref()),
                    Err(_) => {
                        // Never leave the plaintext where records go to the socket.
                        text.fill(0);
                        return Err(io::Error::other("TLS: sealing a record failed"));
                    }
                }
            }
        }
        out.len += HEADER_LEN + body;
        Ok(())
    }

    /// The longest plaintext (content, inner type, padding) a record body of `len` bytes
    /// opens to, when [`RecordKey::open`] can write it to a buffer of the caller's.
    pub(super) fn opens_out_of_place(&self, len: usize) -> Option<usize> {
        match self.key {
            Aead::Vector(_) => Some(len.saturating_sub(TAG_LEN + self.explicit_len())),
            Aead::Ring(_) => None,
        }
    }

    fn explicit_len(&self) -> usize {
        match self.framing {
            Framing::Tls12Gcm => EXPLICIT_NONCE_LEN,
            _ => 0,
        }
    }

    /// Opens a record: `header` is its first five bytes, `body` the rest. The plaintext
    /// goes to `to` where given (at least [`RecordKey::opens_out_of_place`] bytes; only
    /// where that says so), else stays in `body`. Returns the content type and where the
    /// content lies: in `to`, or in `body`.
    pub(super) fn open(
        &mut self,
        header: [u8; HEADER_LEN],
        body: &mut [u8],
        to: Option<&mut [u8]>,
    ) -> io::Result<(u8, Range<usize>)> {
        let seq = self.seq;
        let mut nonce = self.next_nonce()?;
        let explicit = self.explicit_len();
        let len = body
            .len()
            .checked_sub(explicit + TAG_LEN)
            .ok_or_else(bad_mac)?;
        if explicit > 0 {
            // TLS 1.2 AES-GCM: the salt, then the explicit part sent in the record.
            nonce[4..].copy_from_slice(&body[..EXPLICIT_NONCE_LEN]);
        }
        let aad = match self.framing {
            Framing::Tls13 => &header[..],
            _ => &tls12_aad(seq, header[0], len)[..],
        };
        let (cipher, tag) = body[explicit..].split_at_mut(len);
        // The plaintext, and where it starts in the buffer the range is given for.
        let (plain, base): (&mut [u8], usize) = match (&self.key, to) {
            (Aead::Vector(gcm), to) => {
                let mut m = gcm.begin(&nonce, aad);
                let (plain, base) = match to {
                    Some(to) => {
                        let to = &mut to[..len];
                        m.decrypt(cipher, to);
                        (to, 0)
                    }
                    None => {
                        m.decrypt_in_place(cipher);
                        (cipher, explicit)
                    }
                };
                if m.verify(tag).is_err() {
                    // Nothing of a record that fails is ever seen.
                    plain.fill(0);
                    return Err(bad_mac());
                }
                (plain, base)
            }
            (Aead::Ring(key), None) => {
                let tag = aead::Tag::try_from(&*tag).map_err(|_| bad_mac())?;
                key.open_in_place_separate_tag(
                    aead::Nonce::assume_unique_for_key(nonce),
                    aead::Aad::from(aad),
                    tag,
                    cipher,
                    0..,
                )
                .map_err(|_| bad_mac())?;
                (cipher, explicit)
            }
            (Aead::Ring(_), Some(_)) => {
                return Err(io::Error::other("TLS: ring opens records in place only"));
            }
        };
        match self.framing {
            // The content is followed by its type and then zero padding.
            Framing::Tls13 => match plain.iter().rposition(|&b| b != 0) {
                Some(end) => Ok((plain[end], base..base + end)),
                None => Err(broken("record without a content type")),
            },
            _ => Ok((header[0], base..base + len)),
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

    /// Seals one record and appends it to `wire`.
    fn seal(tx: &mut RecordKey, typ: u8, parts: &[&[u8]], wire: &mut Vec<u8>) -> io::Result<()> {
        let mut out = Outbox::new();
        tx.seal(typ, parts, &mut out)?;
        wire.extend_from_slice(out.filled());
        Ok(())
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
        seal(&mut tx, APPLICATION_DATA, &[b"hello ", b"world"], &mut wire).unwrap();
        seal(&mut tx, ALERT, &[&[1, 0]], &mut wire).unwrap();
        assert_eq!(wire.len(), 11 + 2 + 2 * TLS13_OVERHEAD);
        assert_eq!(&wire[..3], &[APPLICATION_DATA, 3, 3]);
        assert_eq!(u16::from_be_bytes([wire[3], wire[4]]) as usize, 11 + 17);
        let (first, second) = wire.split_at_mut(11 + TLS13_OVERHEAD);
        let (h, b) = split(first);
        assert_eq!(rx.open(h, b, None).unwrap(), (APPLICATION_DATA, 0..11));
        assert_eq!(&b[..11], b"hello world");
        let (h, b) = split(second);
        assert_eq!(rx.open(h, b, None).unwrap(), (ALERT, 0..2));
        assert_eq!(rx.seq(), 9);

        // Out of order (the wrong sequence number), tampered with, or under another key:
        // each fails to open.
        let mut wire = Vec::new();
        seal(&mut tx, APPLICATION_DATA, &[b"a"], &mut wire).unwrap();
        seal(&mut tx, APPLICATION_DATA, &[b"b"], &mut wire).unwrap();
        let (_, second) = wire.split_at_mut(1 + TLS13_OVERHEAD);
        let (h, b) = split(second);
        assert!(rx.open(h, b, None).is_err());
        let (mut tx, mut rx) = pair(2);
        let mut wire = Vec::new();
        seal(&mut tx, APPLICATION_DATA, &[b"abc"], &mut wire).unwrap();
        let mut bad = wire.clone();
        bad[HEADER_LEN] ^= 1;
        let (h, b) = split(&mut bad);
        assert!(rx.open(h, b, None).is_err());
        let (_, mut other) = pair(3);
        let (h, b) = split(&mut wire);
        assert!(other.open(h, b, None).is_err());
    }

    #[test]
    fn padding_is_stripped_and_a_record_without_a_type_is_refused() {
        let (mut tx, mut rx) = pair(4);
        // Content "x", type 23, three bytes of padding: sealed by hand as "x\x17\0\0\0".
        let mut wire = Vec::new();
        seal(&mut tx, 0, &[b"x\x17\0\0"], &mut wire).unwrap();
        let (h, b) = split(&mut wire);
        assert_eq!(rx.open(h, b, None).unwrap(), (APPLICATION_DATA, 0..1));
        let mut wire = Vec::new();
        seal(&mut tx, 0, &[b"\0\0"], &mut wire).unwrap();
        let (h, b) = split(&mut wire);
        assert!(rx.open(h, b, None).is_err());
    }

    #[test]
    fn tls12_records_show_their_type_and_gcm_sends_its_explicit_nonce() {
        for chacha in [false, true] {
            let (mut tx, mut rx) = (key(5, chacha, true), key(5, chacha, true));
            assert!(tx.is_tls12() && rx.takes_outer_type(ALERT));
            assert!(!rx.takes_outer_type(CHANGE_CIPHER_SPEC));
            let mut wire = Vec::new();
            seal(&mut tx, ALERT, &[&[2, 20]], &mut wire).unwrap();
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
            let (typ, at) = rx.open(h, b, None).unwrap();
            assert_eq!((typ, &b[at]), (ALERT, &[2u8, 20][..]));
            // The type is in the additional data: relabelled, the record fails to open.
            let mut wire = Vec::new();
            seal(&mut tx, APPLICATION_DATA, &[b"data"], &mut wire).unwrap();
            wire[0] = HANDSHAKE;
            let (h, b) = split(&mut wire);
            assert!(rx.open(h, b, None).is_err(), "chacha {chacha}");
        }
    }

    /// Records sealed by the vector AES-GCM open with ring's and the reverse, in place and
    /// straight into another buffer, for both framings and both key sizes; an Outbox
    /// reused after `clear` holds only the records since. Where this CPU has no vector
    /// AES-GCM both sides are ring's, and the test says so.
    #[test]
    fn vector_and_ring_aes_gcm_open_each_others_records() {
        let vector = cryptblk_crypto::AesGcm::is_available();
        if !vector {
            eprintln!(
                "NOT TESTED: the vector AES-GCM (vaes512) is not on this CPU; ring against \
                 itself only"
            );
        }
        let mut content = vec![0u8; MAX_PLAINTEXT + 40];
        for (i, b) in content.iter_mut().enumerate() {
            *b = (i * 131 % 251) as u8;
        }
        for (tls12, wide) in [(false, false), (false, true), (true, false), (true, true)] {
            for (seal_vec, open_vec) in [(vector, false), (false, vector), (vector, vector)] {
                let (alg, key) = if wide {
                    (&aead::AES_256_GCM, &[9u8; 32][..])
                } else {
                    (&aead::AES_128_GCM, &[9u8; 16][..])
                };
                let mk = |v| RecordKey::with_aead(3, alg, key, &[0x3a; 12], tls12, v).unwrap();
                let (mut tx, mut rx) = (mk(seal_vec), mk(open_vec));
                let mut out = Outbox::new();
                // Parts split at odd places: a 13-byte header and the rest of a full record,
                // then a short record; after a clear, one more.
                for (i, (head, rest)) in [(13, MAX_PLAINTEXT - 13), (5, 30), (0, 1)]
                    .into_iter()
                    .enumerate()
                {
                    if i == 2 {
                        out.clear();
                    }
                    let parts: [&[u8]; 2] = [&content[..head], &content[head..head + rest]];
                    tx.seal(APPLICATION_DATA, &parts, &mut out).unwrap();
                }
                let mut wire = out.filled().to_vec();
                let what = format!(
                    "tls12 {tls12} aes256 {wide} sealed vector {seal_vec} opened vector {open_vec}"
                );
                // Only the record after the clear is left.
                assert_eq!(wire.len(), 1 + OVERHEAD - usize::from(!tls12) * 7, "{what}");
                let (h, b) = split(&mut wire);
                // Skip the two records before the clear on the opening side too.
                rx.seq += 2;
                let mut to = vec![0u8; b.len()];
                let direct = open_vec && rx.opens_out_of_place(b.len()).is_some();
                let (typ, at) = rx.open(h, b, direct.then_some(&mut to[..])).unwrap();
                assert_eq!(typ, APPLICATION_DATA, "{what}");
                let got = if direct { &to[at] } else { &b[at] };
                assert_eq!(got, &content[..1], "{what}");

                // A full record, opened straight into a buffer where the key can, else
                // in place; a flipped tag bit fails and leaves nothing in the buffer.
                let mut out = Outbox::new();
                tx.seal(
                    APPLICATION_DATA,
                    &[&content[..7], &content[7..MAX_PLAINTEXT]],
                    &mut out,
                )
                .unwrap();
                let mut wire = out.filled().to_vec();
                let mut bad = wire.clone();
                let (h, b) = split(&mut wire);
                let mut to = vec![0u8; MAX_PLAINTEXT + 256];
                let mut rx2 = mk(open_vec);
                rx2.seq = rx.seq;
                let (typ, at) = rx.open(h, b, direct.then_some(&mut to[..])).unwrap();
                let got = if direct { &to[at] } else { &b[at] };
                assert_eq!(
                    (typ, got),
                    (APPLICATION_DATA, &content[..MAX_PLAINTEXT]),
                    "{what}"
                );
                // Not application data, or padded: the type and the content's range
                // come out the same opened straight into a buffer.
                let mut out = Outbox::new();
                tx.seal(ALERT, &[&[1, 0]], &mut out).unwrap();
                if !tls12 {
                    // Content "x", type application_data, padding (sealed by hand).
                    tx.seal(0, &[b"x\x17\0\0"], &mut out).unwrap();
                }
                let mut more = out.filled().to_vec();
                let first = HEADER_LEN
                    + usize::from(tls12) * EXPLICIT_NONCE_LEN
                    + 2
                    + usize::from(!tls12)
                    + TAG_LEN;
                let (alert, padded) = more.split_at_mut(first);
                let mut to = [0u8; 64];
                let (h, b) = split(alert);
                let (typ, at) = rx.open(h, b, direct.then_some(&mut to[..])).unwrap();
                let got = if direct { &to[at] } else { &b[at] };
                assert_eq!((typ, got), (ALERT, &[1u8, 0][..]), "{what}");
                if !tls12 {
                    let (h, b) = split(padded);
                    let (typ, at) = rx.open(h, b, direct.then_some(&mut to[..])).unwrap();
                    let got = if direct { &to[at] } else { &b[at] };
                    assert_eq!((typ, got), (APPLICATION_DATA, &b"x"[..]), "{what}");
                }
                let n = bad.len();
                bad[n - 1] ^= 0x40;
                let (h, b) = split(&mut bad);
                let mut to = vec![0u8; MAX_PLAINTEXT + 256];
                assert!(
                    rx2.open(h, b, direct.then_some(&mut to[..])).is_err(),
                    "{what}"
                );
                assert!(
                    to.iter().all(|&x| x == 0),
                    "{what}: a refused record left plaintext"
                );
            }
        }
    }
}
