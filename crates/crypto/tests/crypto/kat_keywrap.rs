//! AES key wrap known answers (`data/keywrap.txt`: RFC 3394's vectors and cases from
//! Python `cryptography`/OpenSSL): every AES key size, keys of 16 to 128 bytes. Each
//! case wraps to the expected bytes and unwraps back; a flipped bit is refused.

use cryptblk_crypto::{aes_key_unwrap, aes_key_wrap};

#[test]
fn keywrap_known_answers() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/keywrap.txt"
    ))
    .expect("tests/data/keywrap.txt");
    let mut n = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<Vec<u8>> = line
            .split_whitespace()
            .map(|h| hex::decode(h).expect("hex"))
            .collect();
        let [kek, key, wrapped] = &f[..] else {
            panic!("bad line {line}")
        };
        assert_eq!(&aes_key_wrap(kek, key).unwrap(), wrapped, "wrap: {line}");
        let mut back = vec![0u8; key.len()];
        aes_key_unwrap(kek, wrapped, &mut back).unwrap();
        assert_eq!(&back, key, "unwrap: {line}");
        for at in [0, wrapped.len() / 2, wrapped.len() - 1] {
            let mut bad = wrapped.clone();
            bad[at] ^= 0x10;
            assert!(aes_key_unwrap(kek, &bad, &mut back).is_err(), "{line}");
        }
        n += 1;
    }
    assert_eq!(n, 24, "cases in keywrap.txt");
}
