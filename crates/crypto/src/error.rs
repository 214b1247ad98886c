use std::fmt;

/// Every error the crypto layer reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The cipher specification cannot be parsed or is not supported.
    UnsupportedCipher(String),
    /// The key length does not fit the cipher.
    InvalidKeyLength { cipher: String, len: usize },
    /// Sector size is not a power of two between 512 and 4096.
    InvalidSectorSize(u32),
    /// A buffer handed to a sector cipher is not a whole number of sectors.
    UnalignedLength { len: usize, sector_size: u32 },
    /// Hash name unknown to cryptsetup-compatible code.
    UnknownHash(String),
    /// KDF parameters rejected (cost out of range, salt too short, ...).
    Kdf(String),
    /// The operating system's random source failed.
    Random(String),
    /// The requested crypto backend is not available on this CPU.
    BackendUnavailable(String),
    /// Anti-forensic splitter input of the wrong size.
    AfLength { expected: usize, got: usize },
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

pub type Result<T> = std::result::Result<T, Error>;
