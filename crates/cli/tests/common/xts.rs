//! An independent AES-XTS decryption for checking what cryptblk wrote.

/// A textbook AES-256-XTS (RustCrypto's AES block cipher; plain64 IVs, 512-byte sectors)
/// decrypting a few sectors of `raw` into `plain`, independent of cryptblk's cipher code.
pub(crate) fn xts_decrypts(raw: &[u8], key: &[u8], plain: &[u8]) -> bool {
    use aes::cipher::{BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
    let k1 = aes::Aes256::new_from_slice(&key[..32]).unwrap();
    let k2 = aes::Aes256::new_from_slice(&key[32..]).unwrap();
    let sectors = plain.len() / 512;
    [0, 1, sectors / 2, sectors - 1].into_iter().all(|s| {
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&(s as u64).to_le_bytes());
        let mut tb = aes::Block::from(t);
        k2.encrypt_block(&mut tb);
        let mut t: [u8; 16] = tb.into();
        let mut buf = raw[s * 512..(s + 1) * 512].to_vec();
        for c in buf.chunks_mut(16) {
            let mut b = aes::Block::default();
            for i in 0..16 {
                b[i] = c[i] ^ t[i];
            }
            k1.decrypt_block(&mut b);
            for i in 0..16 {
                c[i] = b[i] ^ t[i];
            }
            let carry = t[15] >> 7;
            for i in (1..16).rev() {
                t[i] = (t[i] << 1) | (t[i - 1] >> 7);
            }
            t[0] = (t[0] << 1) ^ (carry * 0x87);
        }
        buf == plain[s * 512..(s + 1) * 512]
    })
}
