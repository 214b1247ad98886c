//! The hashes cryptsetup uses for PBKDF2, the AF splitter, ESSIV and plain-mode passphrases.

use crate::{Error, Result};
use sha2::Digest;

/// Hash algorithms, named as cryptsetup names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HashAlg {
    /// SHA-1 (`sha1`), 20-byte digest: LUKS1's historical default hash.
    Sha1,
    /// SHA-224 (`sha224`).
    Sha224,
    /// SHA-256 (`sha256`), 32-byte digest: cryptsetup's current default.
    Sha256,
    /// SHA-384 (`sha384`).
    Sha384,
    /// SHA-512 (`sha512`), 64-byte digest.
    Sha512,
    /// RIPEMD-160: cryptsetup's compiled-in default passphrase hash for plain mode, and a
    /// valid LUKS hash.
    Ripemd160,
    /// SHA3-224 (`sha3-224`).
    Sha3_224,
    /// SHA3-256 (`sha3-256`).
    Sha3_256,
    /// SHA3-384 (`sha3-384`).
    Sha3_384,
    /// SHA3-512 (`sha3-512`).
    Sha3_512,
    /// Whirlpool (`whirlpool`): TrueCrypt/VeraCrypt's and old LUKS volumes' hash.
    Whirlpool,
    /// BLAKE2b with a 512-bit digest (`blake2b-512`).
    Blake2b512,
    /// BLAKE2s with a 256-bit digest (`blake2s-256`): VeraCrypt's.
    Blake2s256,
    /// SM3 (`sm3`).
    Sm3,
    /// GOST R 34.11-2012 (Streebog), 256-bit digest (`stribog256`).
    Stribog256,
    /// GOST R 34.11-2012 (Streebog), 512-bit digest (`stribog512`): VeraCrypt's.
    Stribog512,
    /// Whirlpool cut to 256 bits (the kernel's `wp256`): an ESSIV hash only
    /// (`essiv:wp256`), not offered for key derivation.
    Wp256,
    /// Whirlpool cut to 384 bits (the kernel's `wp384`): an ESSIV hash only.
    Wp384,
}

/// Every hash, with its cryptsetup name and digest length.
const HASHES: [(HashAlg, &str, usize); 18] = [
    (HashAlg::Sha1, "sha1", 20),
    (HashAlg::Sha224, "sha224", 28),
    (HashAlg::Sha256, "sha256", 32),
    (HashAlg::Sha384, "sha384", 48),
    (HashAlg::Sha512, "sha512", 64),
    (HashAlg::Ripemd160, "ripemd160", 20),
    (HashAlg::Sha3_224, "sha3-224", 28),
    (HashAlg::Sha3_256, "sha3-256", 32),
    (HashAlg::Sha3_384, "sha3-384", 48),
    (HashAlg::Sha3_512, "sha3-512", 64),
    (HashAlg::Whirlpool, "whirlpool", 64),
    (HashAlg::Blake2b512, "blake2b-512", 64),
    (HashAlg::Blake2s256, "blake2s-256", 32),
    (HashAlg::Sm3, "sm3", 32),
    (HashAlg::Stribog256, "stribog256", 32),
    (HashAlg::Stribog512, "stribog512", 64),
    (HashAlg::Wp256, "wp256", 32),
    (HashAlg::Wp384, "wp384", 48),
];

/// Calls `$f::<T>($args)` with `T` the RustCrypto type of `$hash`.
macro_rules! with_hash_type {
    ($hash:expr, $f:ident ( $($args:expr),* )) => {
        match $hash {
            HashAlg::Sha1 => $f::<sha1::Sha1>($($args),*),
            HashAlg::Sha224 => $f::<sha2::Sha224>($($args),*),
            HashAlg::Sha256 => $f::<sha2::Sha256>($($args),*),
            HashAlg::Sha384 => $f::<sha2::Sha384>($($args),*),
            HashAlg::Sha512 => $f::<sha2::Sha512>($($args),*),
            HashAlg::Ripemd160 => $f::<ripemd::Ripemd160>($($args),*),
            HashAlg::Sha3_224 => $f::<sha3::Sha3_224>($($args),*),
            HashAlg::Sha3_256 => $f::<sha3::Sha3_256>($($args),*),
            HashAlg::Sha3_384 => $f::<sha3::Sha3_384>($($args),*),
            HashAlg::Sha3_512 => $f::<sha3::Sha3_512>($($args),*),
            HashAlg::Whirlpool => $f::<whirlpool::Whirlpool>($($args),*),
            HashAlg::Blake2b512 => $f::<blake2::Blake2b512>($($args),*),
            HashAlg::Blake2s256 => $f::<blake2::Blake2s256>($($args),*),
            HashAlg::Sm3 => $f::<sm3::Sm3>($($args),*),
            HashAlg::Stribog256 => $f::<streebog::Streebog256>($($args),*),
            HashAlg::Stribog512 => $f::<streebog::Streebog512>($($args),*),
            HashAlg::Wp256 | HashAlg::Wp384 => unreachable!("truncated hashes handled apart"),
        }
    };
}

impl HashAlg {
    /// Every hash cryptblk offers for key derivation and LUKS headers, in a fixed order
    /// (the ESSIV-only truncations `wp256`/`wp384` are not among them).
    pub fn all() -> impl Iterator<Item = HashAlg> {
        HASHES.iter().map(|h| h.0).filter(|h| !h.is_essiv_only())
    }

    /// Whether the hash is one of the kernel's truncated Whirlpool variants, which only
    /// ESSIV uses.
    pub fn is_essiv_only(self) -> bool {
        matches!(self, HashAlg::Wp256 | HashAlg::Wp384)
    }

    /// Parses a cryptsetup hash name (`sha256`, `ripemd160`, `whirlpool`, `sha3-256`,
    /// `blake2b-512`, `stribog512`...; case-insensitive).
    pub fn from_name(name: &str) -> Result<Self> {
        let lower = name.to_ascii_lowercase();
        HASHES
            .iter()
            .find(|h| h.1 == lower)
            .map(|h| h.0)
            .ok_or_else(|| Error::UnknownHash(name.to_string()))
    }

    fn entry(self) -> &'static (HashAlg, &'static str, usize) {
        HASHES
            .iter()
            .find(|h| h.0 == self)
            .expect("every hash is in the table")
    }

    /// The lower-case cryptsetup name (`sha256`, `whirlpool`, ...), as LUKS headers store it.
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// Digest size in bytes.
    pub fn output_len(self) -> usize {
        self.entry().2
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
        if self.is_essiv_only() {
            let mut full = [0u8; 64];
            HashAlg::Whirlpool.digest_parts(parts, &mut full);
            out.copy_from_slice(&full[..out.len()]);
            zeroize::Zeroize::zeroize(&mut full);
            return;
        }
        with_hash_type!(self, run(parts, out))
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

    /// The kernel's wp256/wp384 are Whirlpool's first 32/48 bytes (crypto/wp512.c).
    #[test]
    fn truncated_whirlpool() {
        let full = HashAlg::Whirlpool.digest(b"abc");
        assert_eq!(
            HashAlg::from_name("wp256").unwrap().digest(b"abc"),
            full[..32]
        );
        assert_eq!(HashAlg::Wp384.digest(b"abc"), full[..48]);
        assert!(HashAlg::all().all(|h| !h.is_essiv_only()));
    }
}
