//! AES-CCM known answers (`data/ccm.txt`, from Python `cryptography`/OpenSSL): every AES
//! key size, nonces of 7, 12 and 13 bytes, 8 and 16-byte tags, messages of 0-100 bytes.
//! Each case encrypts to the expected ciphertext and tag, decrypts back, and a flipped
//! bit in the ciphertext or the tag is refused.

use cryptblk_crypto::{aes_ccm_decrypt, aes_ccm_encrypt};

#[test]
fn ccm_known_answers() {
    let mut n = 0;
    for (line, f) in crate::common::load_lines("ccm.txt") {
        let [key, nonce, plain, cipher, tag] = &f[..] else {
            panic!("bad line {line}")
        };
        let mut data = plain.clone();
        let mut t = vec![0u8; tag.len()];
        aes_ccm_encrypt(key, nonce, &mut data, &mut t).unwrap();
        assert_eq!((&data, &t), (cipher, tag), "encrypt: {line}");
        aes_ccm_decrypt(key, nonce, tag, &mut data).unwrap();
        assert_eq!(&data, plain, "decrypt: {line}");
        let mut bad_tag = tag.clone();
        bad_tag[0] ^= 0x80;
        let mut d = cipher.clone();
        assert!(
            aes_ccm_decrypt(key, nonce, &bad_tag, &mut d).is_err(),
            "{line}"
        );
        if !cipher.is_empty() {
            let mut d = cipher.clone();
            d[cipher.len() - 1] ^= 1;
            assert!(aes_ccm_decrypt(key, nonce, tag, &mut d).is_err(), "{line}");
            assert!(d.iter().all(|&b| b == 0), "refused plaintext is wiped");
        }
        n += 1;
    }
    assert!(n >= 100, "only {n} cases");
}
