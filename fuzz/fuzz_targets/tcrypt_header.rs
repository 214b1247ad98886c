//! The TrueCrypt/VeraCrypt header parser behind a real decryption: the input is the
//! 448-byte plaintext of a header (magic, CRCs and size fields as the fuzzer likes, or
//! made valid by flag bits so the field parsing is reached), encrypted with AES-XTS under
//! a fixed passphrase's key into an image of a fuzzed size; then `TcryptHeader::open`,
//! the offsets and the data cipher must give an answer or an error, never a panic.
#![no_main]

use cryptblk_crypto::{BlockCipherAlg, ChainMode, HashAlg, Kdf, UnitCipher, crc32};
use cryptblk_format::MemStorage;
use cryptblk_format::tcrypt::{TcryptHeader, TcryptKdf, TcryptOptions};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const SALT: [u8; 64] = [0x5a; 64];
const PASS: &[u8] = b"fuzz";

/// The header key TrueCrypt derives for PASS (PBKDF2-SHA-512, 1000 iterations), once.
fn header_key() -> &'static [u8] {
    static KEY: OnceLock<Vec<u8>> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut k = vec![0u8; 192];
        Kdf::Pbkdf2 {
            hash: HashAlg::Sha512,
            iterations: 1000,
        }
        .derive(PASS, &SALT, &mut k)
        .unwrap();
        k
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let flags = data[0];
    let size = u32::from_le_bytes(data[1..5].try_into().unwrap()) as u64 % (1 << 20);
    let mut plain = [0u8; 448];
    let body = &data[5..];
    plain[..body.len().min(448)].copy_from_slice(&body[..body.len().min(448)]);
    if flags & 1 != 0 {
        plain[..4].copy_from_slice(b"TRUE");
    }
    if flags & 2 != 0 {
        let c = crc32(&plain[192..448]);
        plain[8..12].copy_from_slice(&c.to_be_bytes());
    }
    if flags & 4 != 0 {
        let c = crc32(&plain[..188]);
        plain[188..192].copy_from_slice(&c.to_be_bytes());
    }
    let key = header_key();
    let mut xts = key[..32].to_vec();
    xts.extend_from_slice(&key[32..64]);
    UnitCipher::new(BlockCipherAlg::Aes, ChainMode::Xts, &xts)
        .unwrap()
        .encrypt(&[0; 16], &mut plain)
        .unwrap();
    let mut image = vec![0u8; size.max(512) as usize];
    image[..64].copy_from_slice(&SALT);
    image[64..512].copy_from_slice(&plain);
    let opts = TcryptOptions {
        kdf: Some(TcryptKdf::Pbkdf2(HashAlg::Sha512)),
        cipher: Some("aes".into()),
        // VeraCrypt's KDFs run 500,000 iterations: far too slow per input.
        no_veracrypt: true,
        hidden: flags & 8 != 0,
        backup: flags & 16 != 0,
        system: flags & 32 != 0,
        ..Default::default()
    };
    let len = image.len() as u64;
    if let Ok(h) = TcryptHeader::open(&MemStorage::from_vec(image), len, &opts, PASS) {
        let off = h.data_offset(&opts, len);
        let iv = h.iv_offset(&opts, len);
        let _ = h.data_len(&opts, len);
        let _ = (h.dump("fuzz"), h.dump_volume_key("fuzz", off));
        let _ = h.sector_cipher(iv);
    }
});
