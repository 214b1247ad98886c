use std::fmt;

/// Every error the crypto layer reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The cipher specification cannot be parsed or is not supported.
    UnsupportedCipher(String),
    /// The key length does not fit the cipher.
    InvalidKeyLength {
        /// The cipher specification the key was meant for.
        cipher: String,
        /// The rejected key length in bytes.
        len: usize,
    },
    /// Sector size is not a power of two between 512 and 4096.
    InvalidSectorSize(u32),
    /// A buffer handed to a sector cipher is not a whole number of sectors.
    UnalignedLength {
        /// Length of the buffer in bytes.
        len: usize,
        /// The cipher's sector size in bytes.
        sector_size: u32,
    },
    /// Hash name unknown to cryptsetup-compatible code.
    UnknownHash(String),
    /// KDF parameters rejected (cost out of range, salt too short, ...).
    Kdf(String),
    /// The operating system's random source failed.
    Random(String),
    /// The requested crypto backend is not available on this CPU.
    BackendUnavailable(String),
    /// AES-CCM: bad sizes, or the authentication tag does not match (wrong key or damaged data).
    Ccm(String),
    /// AES-GCM: the authentication tag does not match (wrong key or damaged data).
    Gcm(String),
    /// AES key wrap (RFC 3394): bad sizes or a failed integrity check.
    KeyWrap(String),
    /// Anti-forensic splitter input of the wrong size: `af_merge` got less material than
    /// `key_len × stripes` bytes or a stripe count of 0; `af_split` got a stripe count of 0.
    AfLength {
        /// Required size: bytes of material for `af_merge`, or the minimum stripe count (1)
        /// when `af_split` was asked for 0 stripes.
        expected: usize,
        /// Size actually passed, in the same unit as `expected`.
        got: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UnsupportedCipher(s) => write!(f, "unsupported cipher specification '{s}'"),
            Error::InvalidKeyLength { cipher, len } => {
                write!(f, "invalid key length {} bits for cipher {cipher}", len * 8)
            }
            Error::InvalidSectorSize(s) => {
                write!(
                    f,
                    "invalid sector size {s} (must be 512, 1024, 2048 or 4096)"
                )
            }
            Error::UnalignedLength { len, sector_size } => {
                write!(
                    f,
                    "buffer of {len} bytes is not a multiple of the {sector_size}-byte sector"
                )
            }
            Error::UnknownHash(h) => write!(f, "unknown hash '{h}'"),
            Error::Kdf(s) => write!(f, "key derivation failed: {s}"),
            Error::Random(s) => write!(f, "random number generator failed: {s}"),
            Error::BackendUnavailable(s) => write!(f, "crypto backend unavailable: {s}"),
            Error::Ccm(s) => write!(f, "AES-CCM: {s}"),
            Error::Gcm(s) => write!(f, "AES-GCM: {s}"),
            Error::KeyWrap(s) => write!(f, "AES key wrap: {s}"),
            Error::AfLength { expected, got } => {
                write!(
                    f,
                    "anti-forensic material has {got} bytes, expected {expected}"
                )
            }
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with the crypto layer's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
