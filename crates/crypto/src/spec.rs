//! dm-crypt cipher specifications: `cipher-chainmode-ivmode[:ivopts]`, as LUKS stores them.

use crate::{Error, HashAlg, Result};
use std::fmt;
use std::str::FromStr;

/// The block cipher part of a specification (`aes` in `aes-xts-plain64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BlockCipherAlg {
    /// AES (`aes`): 128-bit blocks, 128/192/256-bit keys.
    Aes,
    /// Serpent (`serpent`): 128-bit blocks, 128 to 256-bit keys.
    Serpent,
    /// Twofish (`twofish`): 128-bit blocks, 128/192/256-bit keys.
    Twofish,
    /// Camellia (`camellia`): 128-bit blocks, 128/192/256-bit keys.
    Camellia,
    /// Kuznyechik, GOST R 34.12-2015 (`kuznyechik`): 128-bit blocks, 256-bit keys.
    Kuznyechik,
    /// Blowfish (`blowfish`): 64-bit blocks, 32 to 448-bit keys.
    Blowfish,
    /// Blowfish reading its 32-bit halves little-endian (`blowfish_le`, cryptsetup's name):
    /// TrueCrypt 1-5 volumes. Not in the kernel, so dm-crypt cannot map it; cryptblk can.
    BlowfishLe,
    /// CAST5 (`cast5`): 64-bit blocks, 40 to 128-bit keys (TrueCrypt 1-5 volumes).
    Cast5,
    /// Triple DES, encrypt-decrypt-encrypt (`des3_ede`): 64-bit blocks, 192-bit keys.
    Des3Ede,
    /// `cipher_null`: data passes through unchanged (for measuring everything but crypto).
    Null,
}

/// Every block cipher with its kernel name.
const CIPHERS: [(BlockCipherAlg, &str); 10] = [
    (BlockCipherAlg::Aes, "aes"),
    (BlockCipherAlg::Serpent, "serpent"),
    (BlockCipherAlg::Twofish, "twofish"),
    (BlockCipherAlg::Camellia, "camellia"),
    (BlockCipherAlg::Kuznyechik, "kuznyechik"),
    (BlockCipherAlg::Blowfish, "blowfish"),
    (BlockCipherAlg::BlowfishLe, "blowfish_le"),
    (BlockCipherAlg::Cast5, "cast5"),
    (BlockCipherAlg::Des3Ede, "des3_ede"),
    (BlockCipherAlg::Null, "cipher_null"),
];

impl BlockCipherAlg {
    /// The kernel's name (`aes`, `serpent`, `des3_ede`, `cipher_null`, ...).
    pub fn name(self) -> &'static str {
        CIPHERS
            .iter()
            .find(|c| c.0 == self)
            .map(|c| c.1)
            .expect("every cipher is in the table")
    }

    /// Parses a kernel cipher name (case-insensitive).
    pub fn from_name(name: &str) -> Result<Self> {
        let lower = name.to_ascii_lowercase();
        CIPHERS
            .iter()
            .find(|c| c.1 == lower)
            .map(|c| c.0)
            .ok_or_else(|| Error::UnsupportedCipher(name.to_string()))
    }

    /// Block size in bytes: 16, or 8 for Blowfish, CAST5 and 3DES (1 for `cipher_null`).
    pub fn block_size(self) -> usize {
        match self {
            BlockCipherAlg::Blowfish
            | BlockCipherAlg::BlowfishLe
            | BlockCipherAlg::Cast5
            | BlockCipherAlg::Des3Ede => 8,
            BlockCipherAlg::Null => 1,
            _ => 16,
        }
    }

    /// Whether the cipher takes a key of `len` bytes (as the kernel's implementation does).
    pub fn valid_key_len(self, len: usize) -> bool {
        match self {
            BlockCipherAlg::Aes | BlockCipherAlg::Twofish | BlockCipherAlg::Camellia => {
                matches!(len, 16 | 24 | 32)
            }
            BlockCipherAlg::Serpent => (16..=32).contains(&len),
            BlockCipherAlg::Kuznyechik => len == 32,
            BlockCipherAlg::Blowfish | BlockCipherAlg::BlowfishLe => (4..=56).contains(&len),
            BlockCipherAlg::Cast5 => (5..=16).contains(&len),
            BlockCipherAlg::Des3Ede => len == 24,
            BlockCipherAlg::Null => true,
        }
    }

    /// The key length cryptsetup picks when none is given: 256 bits, or the nearest the
    /// cipher takes.
    pub fn default_key_len(self) -> usize {
        match self {
            BlockCipherAlg::Null => 0,
            BlockCipherAlg::Cast5 => 16,
            BlockCipherAlg::Des3Ede => 24,
            _ => 32,
        }
    }
}

/// The chaining mode of a specification (`xts` in `aes-xts-plain64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChainMode {
    /// XTS (`xts`): the key is two equal halves, data key then tweak key; 16-byte blocks.
    Xts,
    /// CBC (`cbc`), chained within each sector, restarting from the sector's IV.
    Cbc,
    /// ECB (`ecb`): no IV; only with IV mode [`IvMode::None`].
    Ecb,
    /// LRW (`lrw`, the kernel's): the key is the cipher key then a 16-byte tweak key;
    /// the IV is the big-endian index of the sector's first block; 16-byte blocks.
    Lrw,
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
    /// Big-endian count of cipher blocks from the device start, plus one, in the last
    /// 8 bytes (`benbi`, for LRW).
    Benbi,
    /// The byte offset of the sector, encrypted with the volume key (`eboiv`, BitLocker).
    Eboiv,
    /// `eboiv` plus BitLocker's Elephant diffuser over each sector (`elephant`, AES-CBC
    /// volumes of Windows Vista/7); key = CBC key, diffuser key of the same size.
    Elephant,
    /// TrueCrypt 1-4 CBC (`tcw`): IV from a seed and the sector number, and a whitening
    /// value XORed over each ciphertext sector; key = cipher key, IV seed, 16-byte whitening.
    Tcw,
    /// loop-AES (`lmk`): IV from an MD5 state over the sector's plaintext; with an extra
    /// key part at the end of the key, that part seeds the hash (loop-AES v3).
    Lmk,
}

/// A parsed cipher specification such as `aes-xts-plain64` or `aes:64-cbc-lmk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CipherSpec {
    /// The block cipher.
    pub cipher: BlockCipherAlg,
    /// The chaining mode.
    pub mode: ChainMode,
    /// The IV generator; [`IvMode::None`] exactly when `mode` is ECB.
    pub iv: IvMode,
    /// dm-crypt's key count (`aes:64-...`): sectors take keys in turn, sector `n` the key
    /// `n mod count`; a power of two, 1 for one key.
    pub key_count: u32,
}

/// How a volume key divides into the parts a [`CipherSpec`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyLayout {
    /// Bytes of each of the `key_count` keys (for XTS both halves, for LRW with the tweak key).
    pub per_key: usize,
    /// Bytes after the keys: the IV seed and whitening of `tcw`, the seed key of `lmk` v3.
    pub extra: usize,
}

impl CipherSpec {
    /// The specifications `benchmark` lists by default.
    pub const SUPPORTED: [&'static str; 7] = [
        "aes-xts-plain64",
        "aes-xts-plain",
        "aes-xts-plain64be",
        "aes-cbc-essiv:sha256",
        "aes-cbc-plain64",
        "aes-cbc-plain",
        "cipher_null-ecb",
    ];

    /// Parses the joined form (`aes-xts-plain64`, `aes-cbc-essiv:sha256`, `cipher_null-ecb`,
    /// `aes:64-cbc-lmk`), with cryptsetup's short forms: `null` for `cipher_null-ecb`, a
    /// cipher alone for its `cbc-plain` mode, `plain` for `cbc-plain`.
    pub fn parse(spec: &str) -> Result<Self> {
        let unsupported = || Error::UnsupportedCipher(spec.to_string());
        let (cipher, mode) = match spec.split_once('-') {
            Some((c, "plain")) => (c, "cbc-plain"),
            Some((c, r)) => (c, r),
            None if spec == "null" || spec == "cipher_null" => ("cipher_null", "ecb"),
            None => (spec, "cbc-plain"),
        };
        Self::from_parts(cipher, mode).map_err(|_| unsupported())
    }

    /// Builds from LUKS1's separate fields (`cipher_name` = `aes`, `cipher_mode` = `xts-plain64`).
    pub fn from_parts(cipher: &str, mode: &str) -> Result<Self> {
        let unsupported = || Error::UnsupportedCipher(format!("{cipher}-{mode}"));
        let (cipher, key_count) = match cipher.split_once(':') {
            None => (cipher, 1),
            Some((c, n)) => match n.parse::<u32>() {
                Ok(n) if n.is_power_of_two() && n <= 64 && !n.to_string().starts_with('0') => {
                    (c, n)
                }
                _ => return Err(unsupported()),
            },
        };
        let cipher_alg = BlockCipherAlg::from_name(cipher).map_err(|_| unsupported())?;
        let (chain, iv) = match mode.split_once('-') {
            Some((c, i)) => (c, Some(i)),
            None => (mode, None),
        };
        let chain = match chain {
            "xts" => ChainMode::Xts,
            "cbc" => ChainMode::Cbc,
            "ecb" => ChainMode::Ecb,
            "lrw" => ChainMode::Lrw,
            _ => return Err(unsupported()),
        };
        let iv = match iv {
            None => IvMode::None,
            Some("plain") => IvMode::Plain,
            Some("plain64") => IvMode::Plain64,
            Some("plain64be") => IvMode::Plain64Be,
            Some("null") => IvMode::Null,
            Some("benbi") => IvMode::Benbi,
            Some("eboiv") => IvMode::Eboiv,
            Some("elephant") => IvMode::Elephant,
            Some("tcw") => IvMode::Tcw,
            Some("lmk") => IvMode::Lmk,
            Some(s) => match s.strip_prefix("essiv:") {
                Some(h) => IvMode::Essiv(HashAlg::from_name(h).map_err(|_| unsupported())?),
                None => return Err(unsupported()),
            },
        };
        let spec = CipherSpec {
            cipher: cipher_alg,
            mode: chain,
            iv,
            key_count,
        };
        if spec.is_coherent() {
            Ok(spec)
        } else {
            Err(unsupported())
        }
    }

    /// The combinations dm-crypt accepts.
    fn is_coherent(&self) -> bool {
        let bs = self.cipher.block_size();
        let mode_ok = match (self.cipher, self.mode) {
            (BlockCipherAlg::Null, m) => m == ChainMode::Ecb && self.key_count == 1,
            (_, ChainMode::Xts | ChainMode::Lrw) => bs == 16,
            _ => true,
        };
        let iv_ok = match (self.mode, self.iv) {
            // ECB takes no IV; every other mode needs one.
            (ChainMode::Ecb, iv) => iv == IvMode::None,
            (_, IvMode::None) => false,
            // These IVs only make sense for (and the kernel only offers them with) CBC.
            (m, IvMode::Eboiv | IvMode::Tcw | IvMode::Lmk) => m == ChainMode::Cbc,
            // The kernel's diffuser key is always an AES key.
            (m, IvMode::Elephant) => {
                m == ChainMode::Cbc && self.cipher == BlockCipherAlg::Aes && self.key_count == 1
            }
            _ => true,
        };
        // lmk hashes 16-byte blocks 1..31 of each sector.
        mode_ok && iv_ok && (self.iv != IvMode::Lmk || bs == 16)
    }

    /// LUKS1's `cipher_name` field (with the key count, `aes:64`, when above one).
    pub fn cipher_name(&self) -> String {
        if self.key_count > 1 {
            format!("{}:{}", self.cipher.name(), self.key_count)
        } else {
            self.cipher.name().to_string()
        }
    }

    /// LUKS1's `cipher_mode` field.
    pub fn cipher_mode(&self) -> String {
        let chain = match self.mode {
            ChainMode::Xts => "xts",
            ChainMode::Cbc => "cbc",
            ChainMode::Ecb => "ecb",
            ChainMode::Lrw => "lrw",
        };
        let iv = match self.iv {
            IvMode::None => return chain.to_string(),
            IvMode::Plain => "plain".to_string(),
            IvMode::Plain64 => "plain64".to_string(),
            IvMode::Plain64Be => "plain64be".to_string(),
            IvMode::Null => "null".to_string(),
            IvMode::Benbi => "benbi".to_string(),
            IvMode::Eboiv => "eboiv".to_string(),
            IvMode::Elephant => "elephant".to_string(),
            IvMode::Tcw => "tcw".to_string(),
            IvMode::Lmk => "lmk".to_string(),
            IvMode::Essiv(h) => format!("essiv:{}", h.name()),
        };
        format!("{chain}-{iv}")
    }

    /// Bytes after the keys that `tcw` takes: its IV seed and 16 bytes of whitening.
    fn tcw_extra_len(&self) -> usize {
        if self.iv == IvMode::Tcw {
            self.iv_len() + 16
        } else {
            0
        }
    }

    /// How a key of `len` bytes divides among the spec's keys, or `None` when no division
    /// suits the cipher (dm-crypt's rules: XTS keys are two cipher keys, LRW keys a cipher
    /// key and 16 bytes; `tcw` adds IV seed and whitening; `lmk` with a length the key
    /// count does not divide has one more part, of a key's size, that seeds its hash).
    pub fn key_layout(&self, len: usize) -> Option<KeyLayout> {
        if self.cipher == BlockCipherAlg::Null {
            return Some(KeyLayout {
                per_key: len,
                extra: 0,
            });
        }
        let n = self.key_count as usize;
        let extra = match self.iv {
            IvMode::Tcw => self.tcw_extra_len(),
            IvMode::Lmk if !len.is_multiple_of(n) => len / (n + 1),
            // dm-crypt's `key_extra_size`: half the key is the diffuser's.
            IvMode::Elephant => len / 2,
            _ => 0,
        };
        let keys = len.checked_sub(extra)?;
        if keys == 0 || keys % n != 0 || (self.iv == IvMode::Elephant && keys != extra) {
            return None;
        }
        let per_key = keys / n;
        self.cipher_key_ok(per_key)
            .then_some(KeyLayout { per_key, extra })
    }

    /// Whether `per_key` bytes make one key of this spec's mode.
    fn cipher_key_ok(&self, per_key: usize) -> bool {
        match self.mode {
            ChainMode::Xts => per_key.is_multiple_of(2) && self.cipher.valid_key_len(per_key / 2),
            ChainMode::Lrw => per_key > 16 && self.cipher.valid_key_len(per_key - 16),
            _ => self.cipher.valid_key_len(per_key),
        }
    }

    /// Key sizes in bytes this spec accepts.
    pub fn valid_key_len(&self, len: usize) -> bool {
        self.key_layout(len).is_some()
    }

    /// cryptsetup's default key size for the spec (bytes): 256 bits, 512 for XTS.
    pub fn default_key_len(&self) -> usize {
        let one = self.cipher.default_key_len();
        let per_key = match self.mode {
            ChainMode::Xts => 2 * one,
            _ => one,
        };
        let keys = per_key * self.key_count as usize + self.tcw_extra_len();
        if self.iv == IvMode::Elephant {
            2 * keys
        } else {
            keys
        }
    }

    /// Bytes of IV the mode consumes (0 for ECB): the cipher's block size.
    pub fn iv_len(&self) -> usize {
        if self.iv == IvMode::None {
            0
        } else {
            self.cipher.block_size()
        }
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
    fn cryptsetups_short_forms() {
        let p = |s: &str| CipherSpec::parse(s).unwrap().to_string();
        assert_eq!(p("null"), "cipher_null-ecb");
        assert_eq!(p("cipher_null"), "cipher_null-ecb");
        assert_eq!(p("aes"), "aes-cbc-plain");
        assert_eq!(p("aes-plain"), "aes-cbc-plain");
        assert!(CipherSpec::parse("nosuch").is_err());
    }

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
            (s.cipher_name().as_str(), s.cipher_mode().as_str()),
            ("aes", "cbc-essiv:sha256")
        );
    }

    #[test]
    fn rejects_nonsense() {
        for s in [
            "",
            "rc6-xts-plain64",
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
