//! AES-CCM known answers (`data/ccm.txt`, from Python `cryptography`/OpenSSL): every AES
//! key size, nonces of 7, 12 and 13 bytes, 8 and 16-byte tags, messages of 0-100 bytes.
//! Each case encrypts to the expected ciphertext and tag, decrypts back, and a flipped
//! bit in the ciphertext or the tag is refused.

use cryptblk_crypto::{aes_ccm_decrypt, aes_ccm_encrypt};

fn hex(s: &str) -> Vec<u8> {
    if s == "-" {
        Vec::new()
    } else {
        hex::decode(s).expect("hex")
    }
}

#[test]
fn ccm_known_answers() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ccm.txt"))
        .expect("tests/data/ccm.txt");
    let mut n = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<Vec<u8>> = line.split_whitespace().map(hex).collect();
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
