//! dm-crypt cipher specifications: `cipher-chainmode-ivmode[:ivopts]`, as LUKS stores them.

use crate::{Error, HashAlg, Result};
use std::fmt;
use std::str::FromStr;

/// The block cipher part of a specification (`aes` in `aes-xts-plain64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BlockCipherAlg {
    /// AES (`aes`): 128-bit blocks, 128/192/256-bit keys.
    Aes,
    /// `cipher_null`: data passes through unchanged (for measuring everything but crypto).
    Null,
}

/// The chaining mode of a specification (`xts` in `aes-xts-plain64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChainMode {
    /// XTS (`xts`): the key is two equal halves, data key then tweak key.
    Xts,
    /// CBC (`cbc`), chained within each sector, restarting from the sector's IV.
    Cbc,
    /// ECB (`ecb`): no IV; only with IV mode [`IvMode::None`].
    Ecb,
}

/// IV generators of dm-crypt (`Documentation/admin-guide/device-mapper/dm-crypt.rst`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IvMode {
    /// No IV (ECB).
    None,
    /// 32-bit little-endian sector number, zero padded.
    Plain,
    /// 64-bit little-endian sector number, zero padded.
    Plain64,
    /// 64-bit big-endian sector number in the last 8 bytes.
    Plain64Be,
    /// Encrypted sector number, key = hash(volume key).
    Essiv(HashAlg),
    /// All-zero IV.
    Null,
}

/// A parsed cipher specification such as `aes-xts-plain64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CipherSpec {
    /// The block cipher.
    pub cipher: BlockCipherAlg,
    /// The chaining mode.
    pub mode: ChainMode,
    /// The IV generator; [`IvMode::None`] exactly when `mode` is ECB.
    pub iv: IvMode,
}

impl CipherSpec {
    /// The specifications cryptblk implements, in the order `benchmark` lists them.
    pub const SUPPORTED: [&'static str; 7] = [
        "aes-xts-plain64",
        "aes-xts-plain",
        "aes-xts-plain64be",
        "aes-cbc-essiv:sha256",
        "aes-cbc-plain64",
        "aes-cbc-plain",
        "cipher_null-ecb",
    ];

    /// Parses the joined form (`aes-xts-plain64`, `aes-cbc-essiv:sha256`, `cipher_null-ecb`).
    pub fn parse(spec: &str) -> Result<Self> {
        let unsupported = || Error::UnsupportedCipher(spec.to_string());
        let (cipher, rest) = match spec.split_once('-') {
            Some((c, r)) => (c, Some(r)),
            None => (spec, None),
        };
        Self::from_parts(
            cipher,
            rest.unwrap_or(if cipher == "cipher_null" { "ecb" } else { "" }),
        )
        .map_err(|_| unsupported())
    }

    /// Builds from LUKS1's separate fields (`cipher_name` = `aes`, `cipher_mode` = `xts-plain64`).
    pub fn from_parts(cipher: &str, mode: &str) -> Result<Self> {
        let unsupported = || Error::UnsupportedCipher(format!("{cipher}-{mode}"));
        let cipher_alg = match cipher.to_ascii_lowercase().as_str() {
            "aes" => BlockCipherAlg::Aes,
            "cipher_null" => BlockCipherAlg::Null,
            _ => return Err(unsupported()),
        };
        let (chain, iv) = match mode.split_once('-') {
            Some((c, i)) => (c, Some(i)),
            None => (mode, None),
        };
        let chain = match chain {
            "xts" => ChainMode::Xts,
            "cbc" => ChainMode::Cbc,
            "ecb" => ChainMode::Ecb,
            _ => return Err(unsupported()),
        };
        let iv = match iv {
            None => IvMode::None,
            Some("plain") => IvMode::Plain,
            Some("plain64") => IvMode::Plain64,
            Some("plain64be") => IvMode::Plain64Be,
            Some("null") => IvMode::Null,
            Some(s) => match s.strip_prefix("essiv:") {
                Some(h) => IvMode::Essiv(HashAlg::from_name(h).map_err(|_| unsupported())?),
                None => return Err(unsupported()),
            },
        };
        // ECB takes no IV; every other mode needs one.
        match (chain, iv) {
            (ChainMode::Ecb, IvMode::None) => {}
            (ChainMode::Ecb, _) | (_, IvMode::None) => return Err(unsupported()),
            _ => {}
        }
        if cipher_alg == BlockCipherAlg::Null && chain != ChainMode::Ecb {
            return Err(unsupported());
        }
        Ok(CipherSpec {
            cipher: cipher_alg,
            mode: chain,
            iv,
        })
    }

    /// LUKS1's `cipher_name` field.
    pub fn cipher_name(&self) -> &'static str {
        match self.cipher {
            BlockCipherAlg::Aes => "aes",
            BlockCipherAlg::Null => "cipher_null",
        }
    }

    /// LUKS1's `cipher_mode` field.
    pub fn cipher_mode(&self) -> String {
        let chain = match self.mode {
            ChainMode::Xts => "xts",
            ChainMode::Cbc => "cbc",
            ChainMode::Ecb => "ecb",
        };
        match self.iv {
            IvMode::None => chain.to_string(),
            IvMode::Plain => format!("{chain}-plain"),
            IvMode::Plain64 => format!("{chain}-plain64"),
            IvMode::Plain64Be => format!("{chain}-plain64be"),
            IvMode::Null => format!("{chain}-null"),
            IvMode::Essiv(h) => format!("{chain}-essiv:{}", h.name()),
        }
    }

    /// Key sizes in bytes this spec accepts.
    pub fn valid_key_len(&self, len: usize) -> bool {
        match (self.cipher, self.mode) {
            (BlockCipherAlg::Null, _) => true,
            (BlockCipherAlg::Aes, ChainMode::Xts) => matches!(len, 32 | 48 | 64),
            (BlockCipherAlg::Aes, _) => matches!(len, 16 | 24 | 32),
        }
    }

    /// cryptsetup's default key size for the mode (bytes): 512 bits for XTS, 256 otherwise.
    pub fn default_key_len(&self) -> usize {
        match (self.cipher, self.mode) {
            (BlockCipherAlg::Null, _) => 0,
            (BlockCipherAlg::Aes, ChainMode::Xts) => 64,
            (BlockCipherAlg::Aes, _) => 32,
        }
    }

    /// Bytes of IV the mode consumes (0 for ECB).
    pub fn iv_len(&self) -> usize {
        if self.iv == IvMode::None { 0 } else { 16 }
    }
}

impl FromStr for CipherSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        CipherSpec::parse(s)
    }
}

impl fmt::Display for CipherSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.cipher_name(), self.cipher_mode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print_roundtrip() {
        for s in [
            "aes-xts-plain64",
            "aes-xts-plain",
            "aes-xts-plain64be",
            "aes-cbc-essiv:sha256",
            "aes-cbc-plain64",
            "aes-cbc-plain",
            "aes-cbc-null",
            "aes-ecb",
            "cipher_null-ecb",
        ] {
            assert_eq!(CipherSpec::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(
            CipherSpec::parse("cipher_null").unwrap().to_string(),
            "cipher_null-ecb"
        );
        let s = CipherSpec::from_parts("aes", "cbc-essiv:sha256").unwrap();
        assert_eq!(s.iv, IvMode::Essiv(HashAlg::Sha256));
        assert_eq!(
            (s.cipher_name(), s.cipher_mode().as_str()),
            ("aes", "cbc-essiv:sha256")
        );
    }

    #[test]
    fn rejects_nonsense() {
        for s in [
            "",
            "aes",
            "twofish-xts-plain64",
            "aes-xts",
            "aes-xts-bogus",
            "aes-ecb-plain64",
            "aes-cbc-essiv:md4",
            "cipher_null-xts-plain64",
            "aes-xts-essiv",
        ] {
            assert!(CipherSpec::parse(s).is_err(), "{s}");
        }
    }

    #[test]
    fn key_lengths() {
        let x = CipherSpec::parse("aes-xts-plain64").unwrap();
        assert!(x.valid_key_len(64) && x.valid_key_len(32) && !x.valid_key_len(16));
        assert_eq!(x.default_key_len(), 64);
        let c = CipherSpec::parse("aes-cbc-essiv:sha256").unwrap();
        assert!(c.valid_key_len(32) && !c.valid_key_len(64));
    }
}
