use std::fmt;

/// Errors opening or setting up a volume (I/O errors of running volumes are `io::Error`s).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Opening, sizing or configuring (io_uring, O_DIRECT) the data or header file failed.
    Io(std::io::Error),
    /// The LUKS header could not be loaded or unlocked (not LUKS, corrupt, wrong
    /// passphrase, ...).
    Format(cryptblk_format::Error),
    /// The sector cipher could not be set up (unsupported specification, wrong key length,
    /// bad sector size, backend not available on this CPU).
    Crypto(cryptblk_crypto::Error),
    /// The storage is smaller than the data segment needs.
    TooSmall {
        /// Storage size in bytes the segment needs (`u64::MAX` when offset + length
        /// overflows).
        need: u64,
        /// Actual storage size in bytes.
        have: u64,
    },
    /// Another process has the volume open.
    Busy(String),
    /// The volume parameters are unusable (e.g. a data offset not aligned to 512 bytes);
    /// the message says which.
    Invalid(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Format(e) => write!(f, "{e}"),
            Error::Crypto(e) => write!(f, "{e}"),
            Error::TooSmall { need, have } => {
                write!(
                    f,
                    "backing storage too small: need {need} bytes, have {have}"
                )
            }
            Error::Busy(s) => write!(f, "{s} is in use by another process"),
            Error::Invalid(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}
impl From<cryptblk_format::Error> for Error {
    fn from(e: cryptblk_format::Error) -> Self {
        Error::Format(e)
    }
}
impl From<cryptblk_crypto::Error> for Error {
    fn from(e: cryptblk_crypto::Error) -> Self {
        Error::Crypto(e)
    }
}

/// `Result` with the volume layer's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
