//! loop-AES volumes (`cryptsetup open --type loopaes`): no header, the keys come from a key
//! file of 1, 64 or 65 lines, each hashed into one key (cryptsetup's `lib/loopaes`).
//!
//! One key maps as `CIPHER-cbc-plain64`; 64 keys as `CIPHER:64-cbc-lmk` (loop-AES v2,
//! sector `n` takes key `n mod 64`); a 65th key seeds lmk's IV hash (v3).

use crate::{Error, Result};
use cryptblk_crypto::{BlockCipherAlg, ChainMode, CipherSpec, HashAlg, IvMode, SecretBytes};

/// Key lines a loop-AES key file may hold.
const KEY_COUNTS: [usize; 3] = [1, 64, 65];

/// The volume key and cipher a loop-AES key file gives.
pub struct LoopAesKey {
    /// 1, 64 or 65.
    pub keys_count: usize,
    /// Every key, `key_len` bytes each, in file order.
    pub key: SecretBytes,
    /// What dm-crypt maps.
    pub cipher: CipherSpec,
}

impl std::fmt::Debug for LoopAesKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopAesKey")
            .field("keys_count", &self.keys_count)
            .field("cipher", &self.cipher.to_string())
            .finish_non_exhaustive()
    }
}

/// What can be wrong with a loop-AES key file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoopAesError {
    /// Not a loop-AES key file: empty, unterminated lines, a key count or key length
    /// loop-AES does not use (cryptsetup's "Incompatible loop-AES keyfile detected.").
    IncompatibleKeyfile,
    /// A GPG-encrypted key file, which must be decrypted first.
    GpgKeyfile,
}

impl std::fmt::Display for LoopAesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoopAesError::IncompatibleKeyfile => {
                write!(f, "Incompatible loop-AES keyfile detected.")
            }
            LoopAesError::GpgKeyfile => write!(
                f,
                "GPG-encrypted key files are not read directly: use gpg --decrypt KEYFILE | \
                 cryptblk ... --key-file -"
            ),
        }
    }
}

fn incompatible() -> Error {
    LoopAesError::IncompatibleKeyfile.into()
}

/// Parses a key file (`file`, as read) into `key_len`-byte keys of `cipher` (16, 24 or
/// 32 bytes: hashed with SHA-256/384/512 unless `hash` says otherwise).
pub fn parse_keyfile(
    file: &[u8],
    cipher: BlockCipherAlg,
    key_len: usize,
    hash: Option<HashAlg>,
) -> Result<LoopAesKey> {
    if file.is_empty() {
        return Err(incompatible());
    }
    let head = &file[..file.len().min(100)];
    if head.windows(17).any(|w| w == b"BEGIN PGP MESSAGE") {
        return Err(LoopAesError::GpgKeyfile.into());
    }
    // Lines end in \n or \r; every key, the last one too, must be terminated.
    let is_eol = |b: &u8| *b == b'\n' || *b == b'\r';
    if !file.last().is_some_and(is_eol) {
        return Err(incompatible());
    }
    let lines: Vec<&[u8]> = file.split(is_eol).filter(|l| !l.is_empty()).collect();
    let len = lines.first().map_or(0, |l| l.len());
    if !KEY_COUNTS.contains(&lines.len()) || lines.iter().any(|l| l.len() != len) {
        return Err(incompatible());
    }
    let hash = match (hash, key_len) {
        (Some(h), _) => h,
        (None, 16) => HashAlg::Sha256,
        (None, 24) => HashAlg::Sha384,
        (None, 32) => HashAlg::Sha512,
        _ => {
            return Err(Error::InvalidOption(format!(
                "loop-AES keys are 128, 192 or 256 bits, not {}",
                key_len * 8
            )));
        }
    };
    if hash.output_len() < key_len {
        return Err(Error::InvalidOption(format!(
            "hash {hash} is too short for {}-bit keys",
            key_len * 8
        )));
    }
    // loop-AES marks multi-key sets by a tweak of each key's first byte.
    let tweak = match lines.len() {
        64 => 0x55,
        65 => 0xf4,
        _ => 0,
    };
    let mut key = SecretBytes::zeroed(key_len * lines.len());
    let mut digest = SecretBytes::zeroed(hash.output_len());
    for (k, line) in key.chunks_mut(key_len).zip(&lines) {
        hash.digest_parts(&[line], &mut digest);
        k.copy_from_slice(&digest[..key_len]);
        k[0] ^= tweak;
    }
    let cipher = CipherSpec {
        cipher,
        mode: ChainMode::Cbc,
        iv: if lines.len() == 1 {
            IvMode::Plain64
        } else {
            IvMode::Lmk
        },
        key_count: if lines.len() == 1 { 1 } else { 64 },
    };
    if !cipher.valid_key_len(key.len()) {
        return Err(Error::InvalidOption(format!(
            "{} does not take {}-bit keys",
            cipher.cipher.name(),
            key_len * 8
        )));
    }
    Ok(LoopAesKey {
        keys_count: lines.len(),
        key,
        cipher,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(n: usize, len: usize) -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                let mut l: Vec<u8> = (0..len).map(|j| b'A' + ((i + j) % 26) as u8).collect();
                l.push(b'\n');
                l
            })
            .collect()
    }

    #[test]
    fn key_counts_hashes_and_tweaks() {
        let one = parse_keyfile(&file(1, 20), BlockCipherAlg::Aes, 16, None).unwrap();
        assert_eq!(one.cipher.to_string(), "aes-cbc-plain64");
        let line = &file(1, 20)[..20];
        assert_eq!(&one.key[..], &HashAlg::Sha256.digest(line)[..16]);
        let v2 = parse_keyfile(&file(64, 20), BlockCipherAlg::Aes, 32, None).unwrap();
        assert_eq!(v2.cipher.to_string(), "aes:64-cbc-lmk");
        assert_eq!(v2.key.len(), 64 * 32);
        let want0 = HashAlg::Sha512.digest(&file(64, 20)[..20]);
        assert_eq!(v2.key[0], want0[0] ^ 0x55);
        assert_eq!(&v2.key[1..32], &want0[1..32]);
        let v3 = parse_keyfile(&file(65, 20), BlockCipherAlg::Aes, 24, None).unwrap();
        assert_eq!(v3.key.len(), 65 * 24);
        assert_eq!(
            v3.key[0],
            HashAlg::Sha384.digest(&file(65, 20)[..20])[0] ^ 0xf4
        );
        // \r\n and \r line ends are line ends too.
        let crlf: Vec<u8> = file(1, 20)
            .iter()
            .flat_map(|&b| {
                if b == b'\n' {
                    vec![b'\r', b'\n']
                } else {
                    vec![b]
                }
            })
            .collect();
        assert_eq!(
            &parse_keyfile(&crlf, BlockCipherAlg::Aes, 16, None)
                .unwrap()
                .key[..],
            &one.key[..]
        );
    }

    #[test]
    fn refuses_what_cryptsetup_refuses() {
        let mut unterminated = file(1, 20);
        unterminated.pop();
        let mut uneven = file(64, 20);
        uneven.insert(5, b'x');
        use LoopAesError::{GpgKeyfile, IncompatibleKeyfile};
        for (what, f, len, want) in [
            ("empty", vec![], 16, Some(IncompatibleKeyfile)),
            ("unterminated", unterminated, 16, Some(IncompatibleKeyfile)),
            ("2 keys", file(2, 20), 16, Some(IncompatibleKeyfile)),
            ("uneven", uneven, 16, Some(IncompatibleKeyfile)),
            (
                "gpg",
                b"-----BEGIN PGP MESSAGE-----\n".to_vec(),
                16,
                Some(GpgKeyfile),
            ),
            // The key file is fine; the key size asked for is not (an option).
            ("20-byte keys", file(1, 20), 20, None),
        ] {
            match (parse_keyfile(&f, BlockCipherAlg::Aes, len, None), want) {
                (Err(Error::LoopAes(e)), Some(want)) => assert_eq!(e, want, "{what}"),
                (Err(Error::InvalidOption(_)), None) => {}
                (r, _) => panic!("{what}: {:?}", r.map(|_| ())),
            }
        }
    }
}
