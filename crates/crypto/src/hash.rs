//! The hashes cryptsetup uses for PBKDF2, the AF splitter, ESSIV and plain-mode passphrases.

use crate::{Error, Result};
use sha2::Digest;

/// Hash algorithms, named as cryptsetup names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HashAlg {
    /// SHA-1 (`sha1`), 20-byte digest: LUKS1's historical default hash.
    Sha1,
    /// SHA-256 (`sha256`), 32-byte digest: cryptsetup's current default.
    Sha256,
    /// SHA-512 (`sha512`), 64-byte digest.
    Sha512,
    /// RIPEMD-160: cryptsetup's compiled-in default passphrase hash for plain mode, and a
    /// valid LUKS hash.
    Ripemd160,
}

impl HashAlg {
    /// Parses a cryptsetup hash name (`sha1`, `sha256`, `sha512`, `ripemd160`;
    /// case-insensitive).
    pub fn from_name(name: &str) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "sha1" => Ok(HashAlg::Sha1),
            "sha256" => Ok(HashAlg::Sha256),
            "sha512" => Ok(HashAlg::Sha512),
            "ripemd160" => Ok(HashAlg::Ripemd160),
            _ => Err(Error::UnknownHash(name.to_string())),
        }
    }

    /// The lower-case cryptsetup name (`sha1`, `sha256`, `sha512`, `ripemd160`), as LUKS
    /// headers store it.
    pub fn name(self) -> &'static str {
        match self {
            HashAlg::Sha1 => "sha1",
            HashAlg::Sha256 => "sha256",
            HashAlg::Sha512 => "sha512",
            HashAlg::Ripemd160 => "ripemd160",
        }
    }

    /// Digest size in bytes.
    pub fn output_len(self) -> usize {
        match self {
            HashAlg::Sha1 => 20,
            HashAlg::Sha256 => 32,
            HashAlg::Sha512 => 64,
            HashAlg::Ripemd160 => 20,
        }
    }

    /// Hashes the concatenation of `parts` into `out` (which must be `output_len()` long).
    pub fn digest_parts(self, parts: &[&[u8]], out: &mut [u8]) {
        fn run<D: Digest>(parts: &[&[u8]], out: &mut [u8]) {
            let mut h = D::new();
            for p in parts {
                h.update(p);
            }
            out.copy_from_slice(&h.finalize());
        }
        match self {
            HashAlg::Sha1 => run::<sha1::Sha1>(parts, out),
            HashAlg::Sha256 => run::<sha2::Sha256>(parts, out),
            HashAlg::Sha512 => run::<sha2::Sha512>(parts, out),
            HashAlg::Ripemd160 => run::<ripemd::Ripemd160>(parts, out),
        }
    }

    /// Hash of `data` as a vector.
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; self.output_len()];
        self.digest_parts(&[data], &mut out);
        out
    }
}

impl std::fmt::Display for HashAlg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RIPEMD-160 test vectors from its authors (Dobbertin, Bosselaers, Preneel).
    #[test]
    fn ripemd160_known_answers() {
        for (msg, want) in [
            ("", "9c1185a5c5e9fc54612808977ee8f548b2258d31"),
            ("abc", "8eb208f7e05d987a9b044a8e98c6b087f15a0bfc"),
            (
                "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
                "12a053384a9c0c88e405a06c27dcf49ada62eb2b",
            ),
        ] {
            assert_eq!(hex::encode(HashAlg::Ripemd160.digest(msg.as_bytes())), want);
        }
        let million_a = vec![b'a'; 1_000_000];
        assert_eq!(
            hex::encode(HashAlg::Ripemd160.digest(&million_a)),
            "52783243c1697bdbe16d37f97f68f08325dc1528"
        );
        assert_eq!(HashAlg::from_name("RIPEMD160").unwrap(), HashAlg::Ripemd160);
        assert_eq!(HashAlg::Ripemd160.output_len(), 20);
    }
}
