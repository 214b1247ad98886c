//! The hashes cryptsetup uses for PBKDF2, the AF splitter, ESSIV and plain-mode passphrases.

use crate::{Error, Result};
use sha2::Digest;

/// Hash algorithms, named as cryptsetup names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HashAlg {
    Sha1,
    Sha256,
    Sha512,
}

impl HashAlg {
    /// Parses a cryptsetup hash name (`sha1`, `sha256`, `sha512`, case-insensitive).
    pub fn from_name(name: &str) -> Result<Self> {
        match name.to_ascii_lowercase().as_str() {
            "sha1" => Ok(HashAlg::Sha1),
            "sha256" => Ok(HashAlg::Sha256),
            "sha512" => Ok(HashAlg::Sha512),
            _ => Err(Error::UnknownHash(name.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HashAlg::Sha1 => "sha1",
            HashAlg::Sha256 => "sha256",
            HashAlg::Sha512 => "sha512",
        }
    }

    /// Digest size in bytes.
    pub fn output_len(self) -> usize {
        match self {
            HashAlg::Sha1 => 20,
            HashAlg::Sha256 => 32,
            HashAlg::Sha512 => 64,
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
