//! AES-GCM known answers (`data/gcm.txt`, from Python `cryptography`/OpenSSL): AES-128 and
//! AES-256, additional data of 0-33 bytes, texts of 0-1,100 bytes at and around block and
//! step boundaries (every length to 600 is checked against ring in `src/gcm.rs`). Each case encrypts to
//! the expected ciphertext and tag (whole, and in two pieces split at a block boundary),
//! decrypts back, and a flipped bit in the ciphertext or the tag is refused. The code runs
//! on the vaes512 backend only: elsewhere the test says loudly that it did not run.

use cryptblk_crypto::AesGcm;

#[test]
fn gcm_known_answers() {
    if !AesGcm::is_available() {
        eprintln!(
            "NOT TESTED: AES-GCM has code for the vaes512 backend only, which this CPU lacks \
             (or CRYPTBLK_CRYPTO_BACKEND forces another)"
        );
        return;
    }
    let mut n = 0;
    for (line, f) in crate::common::load_lines("gcm.txt") {
        let [key, nonce, aad, plain, cipher, tag] = &f[..] else {
            panic!("bad line {line}")
        };
        let nonce: &[u8; 12] = nonce.as_slice().try_into().expect("12-byte nonce");
        let gcm = AesGcm::new(key).unwrap();

        let mut out = vec![0u8; plain.len()];
        let mut m = gcm.begin(nonce, aad);
        m.encrypt(plain, &mut out);
        assert_eq!((&out, &m.tag().to_vec()), (cipher, tag), "encrypt: {line}");

        // In two pieces, the first a whole number of blocks, in place.
        let cut = plain.len() / 32 * 16;
        let mut buf = plain.clone();
        let mut m = gcm.begin(nonce, aad);
        let (a, b) = buf.split_at_mut(cut);
        m.encrypt_in_place(a);
        m.encrypt_in_place(b);
        assert_eq!((&buf, &m.tag().to_vec()), (cipher, tag), "pieces: {line}");

        let mut m = gcm.begin(nonce, aad);
        m.decrypt(cipher, &mut out);
        m.verify(tag).unwrap();
        assert_eq!(&out, plain, "decrypt: {line}");

        let mut bad_tag = tag.clone();
        bad_tag[0] ^= 0x80;
        let mut m = gcm.begin(nonce, aad);
        m.decrypt(cipher, &mut out);
        assert!(m.verify(&bad_tag).is_err(), "{line}");
        if !cipher.is_empty() {
            let mut c = cipher.clone();
            c[cipher.len() - 1] ^= 1;
            let mut m = gcm.begin(nonce, aad);
            m.decrypt_in_place(&mut c);
            assert!(m.verify(tag).is_err(), "{line}");
        }
        n += 1;
    }
    assert!(n >= 100, "only {n} cases");
}
